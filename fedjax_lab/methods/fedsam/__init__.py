"""FedSAM: its config, with its paper's defaults, registered by name.

The method itself, with its equations and builder, is ``method.py``. This file imports no JAX, so a config
validates in a fraction of a second; a name of ``method.py`` is also reached from here
(``from fedjax_lab.methods.fedsam import ...``), which imports it on first use.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedjax_lab.methods.registry import AlgorithmFields, lazy_method, method_name, register


@register(plugin=True)
class FedSamConfig(AlgorithmFields):
    """FedSAM (Qu et al. 2022): sharpness-aware local steps."""

    name: Literal["fedsam"] = method_name("fedsam")
    rho: float = Field(0.05, ge=0, description="perturbation radius")


__getattr__ = lazy_method(__name__)
