"""FedExP: its config, with its paper's defaults, registered by name.

The method itself, with its equations and builder, is ``method.py``. This file imports no JAX, so a config
validates in a fraction of a second; a name of ``method.py`` is also reached from here
(``from fedjax_lab.methods.fedexp import ...``), which imports it on first use.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveFloat

from fedjax_lab.methods.registry import AlgorithmFields, lazy_method, method_name, register


@register()
class FedExPConfig(AlgorithmFields):
    """FedExP (Jhunjhunwala et al. 2023): the extrapolated server step; uniform mean, as in the paper."""

    name: Literal["fedexp"] = method_name("fedexp")
    epsilon: PositiveFloat = Field(1e-3, description="step-size denominator offset")
    weighting: Literal["num_examples", "uniform"] = "uniform"
    average_last_two: bool = Field(True, description="evaluate (w_t + w_{t-1})/2, the paper's remedy for the "
                                                     "period-2 oscillation; training continues from w_t")


__getattr__ = lazy_method(__name__)
