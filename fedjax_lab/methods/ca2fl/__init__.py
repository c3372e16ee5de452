"""CA2FL: its config, with its paper's defaults, registered by name.

The method itself, with its equations and builder, is ``method.py``. This file imports no JAX, so a config
validates in a fraction of a second; a name of ``method.py`` is also reached from here
(``from fedjax_lab.methods.ca2fl import ...``), which imports it on first use.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt

from fedjax_lab.methods.registry import AlgorithmFields, lazy_method, method_name, register


@register()
class CA2FLConfig(AlgorithmFields):
    """CA2FL (Wang et al. 2024): FedBuff calibrated by every client's cached latest update."""

    name: Literal["ca2fl"] = method_name("ca2fl")
    buffer_size: PositiveInt | None = Field(
        10, description="arrivals per server step (Feddle's grid: 10, 20, 50)")
    weighting: Literal["num_examples", "uniform"] = "uniform"


__getattr__ = lazy_method(__name__)
