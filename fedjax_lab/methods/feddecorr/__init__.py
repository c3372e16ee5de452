"""FedDecorr: its config, with its paper's defaults, registered by name.

The method itself, with its equations and builder, is ``method.py``. This file imports no JAX, so a config
validates in a fraction of a second; a name of ``method.py`` is also reached from here
(``from fedjax_lab.methods.feddecorr import ...``), which imports it on first use.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedjax_lab.methods.registry import AlgorithmFields, lazy_method, method_name, register


@register(plugin=True)
class FedDecorrConfig(AlgorithmFields):
    """FedDecorr (Shi et al. 2023): the decorrelation penalty on the representation."""

    name: Literal["feddecorr"] = method_name("feddecorr")
    beta: float = Field(0.1, ge=0, description="decorrelation weight (the paper's form, Eq. 5)")


__getattr__ = lazy_method(__name__)
