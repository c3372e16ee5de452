"""FedReg: its config, with its paper's defaults, registered by name.

The method itself, with its equations and builder, is ``method.py``. This file imports no JAX, so a config
validates in a fraction of a second; a name of ``method.py`` is also reached from here
(``from fedjax_lab.methods.fedreg import ...``), which imports it on first use.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedjax_lab.methods.registry import AlgorithmFields, lazy_method, method_name, register


@register(plugin=True)
class FedRegConfig(AlgorithmFields):
    """FedReg (Xu et al. 2022; FedCOG's baseline): slow local updates, and the displacement projected off the
    directions that raise the loss on the global model's pseudo data and on perturbed data."""

    name: Literal["fedreg"] = method_name("fedreg")
    gamma: float = Field(0.5, gt=0, le=1, description="slow update: the gradient is taken at gamma "
                                                      "w + (1 - gamma) x_t (1: at w)")
    p_iters: int = Field(
        10, ge=0, description="signed-gradient ascent steps that make the pseudo and perturbed data")
    ps_eta: float = Field(
        0.1, ge=0, description="step of the pseudo data (model-input units; its CIFAR-10 config)")
    pt_eta: float = Field(
        0.001, ge=0, description="step of the perturbed data (its CIFAR-10 config; FedCOG: 1e-3)")


__getattr__ = lazy_method(__name__)
