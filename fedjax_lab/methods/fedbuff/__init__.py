"""FedBuff: its config, with its paper's defaults, registered by name.

The method itself, with its equations and builder, is ``method.py``. This file imports no JAX, so a config
validates in a fraction of a second; a name of ``method.py`` is also reached from here
(``from fedjax_lab.methods.fedbuff import ...``), which imports it on first use.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt

from fedjax_lab.methods.registry import AlgorithmFields, lazy_method, method_name, register


@register()
class FedBuffConfig(AlgorithmFields):
    """FedBuff (Nguyen et al. 2022): the server steps on the mean of every buffer_size arrivals."""

    name: Literal["fedbuff"] = method_name("fedbuff")
    buffer_size: PositiveInt | None = Field(
        10, description="K, arrivals per server step (Feddle's grid: 10, 20, 50)")
    weighting: Literal["num_examples", "uniform"] = "uniform"
    staleness_scaling: Literal["none", "sqrt"] = Field("none", description="sqrt: each update scaled by "
                                                                           "1/sqrt(1 + staleness)")


__getattr__ = lazy_method(__name__)
