"""GraB-FedAvg: its config, with its paper's defaults, registered by name.

The method itself, with its equations and builder, is ``method.py``. This file imports no JAX, so a config
validates in a fraction of a second; a name of ``method.py`` is also reached from here
(``from fedjax_lab.methods.grab import ...``), which imports it on first use.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedjax_lab.methods.registry import AlgorithmFields, lazy_method, method_name, register


@register(plugin=True)
class GraBConfig(AlgorithmFields):
    """GraB-FedAvg (BHerd's Alg. 4): online balancing of the local steps, no storage."""

    name: Literal["grab"] = method_name("grab")
    centering: Literal["partial_sum", "running_mean"] = Field(
        "partial_sum", description="the vector balanced is u - m: m Alg. 4's partial sum over tau_k "
                                   "(as written), or the running mean of the steps so far")


__getattr__ = lazy_method(__name__)
