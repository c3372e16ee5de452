"""HFCL: its config, with its paper's defaults, registered by name.

The method itself, with its equations and builder, is ``method.py``. This file imports no JAX, so a config
validates in a fraction of a second; a name of ``method.py`` is also reached from here
(``from fedjax_lab.methods.hfcl import ...``), which imports it on first use.
"""

from __future__ import annotations

from typing import Literal

from fedjax_lab.methods.registry import AlgorithmFields, lazy_method, method_name, register


@register(needs_server_data=True)
class HFCLConfig(AlgorithmFields):
    """HFCL (Elbir et al. 2021; Feddle's baseline): the server trains as a client on its data and joins the
    mean."""

    name: Literal["hfcl"] = method_name("hfcl")


__getattr__ = lazy_method(__name__)
