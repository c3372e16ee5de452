"""MOON: its config, with its paper's defaults, registered by name.

The method itself, with its equations and builder, is ``method.py``. This file imports no JAX, so a config
validates in a fraction of a second; a name of ``method.py`` is also reached from here
(``from fedjax_lab.methods.moon import ...``), which imports it on first use.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveFloat

from fedjax_lab.methods.registry import AlgorithmFields, lazy_method, method_name, register


@register(plugin=True)
class MoonConfig(AlgorithmFields):
    """MOON (Li, He and Song 2021): the model-contrastive term."""

    name: Literal["moon"] = method_name("moon")
    mu: float = Field(5.0, ge=0, description="contrastive weight (the paper: 5 on CIFAR-10)")
    temperature: PositiveFloat = Field(0.5, description="tau of the contrastive softmax (the paper: 0.5)")


__getattr__ = lazy_method(__name__)
