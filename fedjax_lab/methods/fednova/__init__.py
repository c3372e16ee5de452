"""FedNova: its config, with its paper's defaults, registered by name.

The method itself, with its equations and builder, is ``method.py``. This file imports no JAX, so a config
validates in a fraction of a second; a name of ``method.py`` is also reached from here
(``from fedjax_lab.methods.fednova import ...``), which imports it on first use.
"""

from __future__ import annotations

from typing import Literal

from fedjax_lab.methods.registry import AlgorithmFields, lazy_method, method_name, register


@register()
class FedNovaConfig(AlgorithmFields):
    """FedNova (Wang et al. 2020): normalised averaging; ``a_k`` is read from the client optimiser."""

    name: Literal["fednova"] = method_name("fednova")


__getattr__ = lazy_method(__name__)
