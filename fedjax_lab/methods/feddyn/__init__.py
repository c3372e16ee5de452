"""FedDyn: its config, with its paper's defaults, registered by name.

The method itself, with its equations and builder, is ``method.py``. This file imports no JAX, so a config
validates in a fraction of a second; a name of ``method.py`` is also reached from here
(``from fedjax_lab.methods.feddyn import ...``), which imports it on first use.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedjax_lab.methods.registry import AlgorithmFields, lazy_method, method_name, register


@register()
class FedDynConfig(AlgorithmFields):
    """FedDyn (Acar et al. 2021): dynamic regularisation; uniform cohort mean, as in the paper."""

    name: Literal["feddyn"] = method_name("feddyn")
    alpha: float = Field(0.01, ge=0, description="regularisation weight")
    weighting: Literal["num_examples", "uniform"] = "uniform"


__getattr__ = lazy_method(__name__)
