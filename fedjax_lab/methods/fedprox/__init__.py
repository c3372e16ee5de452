"""FedProx: its config, with its paper's defaults, registered by name.

The method itself, with its equations and builder, is ``method.py``. This file imports no JAX, so a config
validates in a fraction of a second; a name of ``method.py`` is also reached from here
(``from fedjax_lab.methods.fedprox import ...``), which imports it on first use.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedjax_lab.methods.registry import AlgorithmFields, lazy_method, method_name, register


@register(plugin=True)
class FedProxConfig(AlgorithmFields):
    """FedProx (Li et al. 2020): the proximal term ``mu/2 ||w - x_t||^2``."""

    name: Literal["fedprox"] = method_name("fedprox")
    mu: float = Field(0.01, ge=0, description="proximal weight (the paper tunes it in {0.001, 0.01, 0.1, 1})")


__getattr__ = lazy_method(__name__)
