"""SCAFFOLD: its config, with its paper's defaults, registered by name.

The method itself, with its equations and builder, is ``method.py``. This file imports no JAX, so a config
validates in a fraction of a second; a name of ``method.py`` is also reached from here
(``from fedjax_lab.methods.scaffold import ...``), which imports it on first use.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedjax_lab.methods.registry import AlgorithmFields, lazy_method, method_name, register


@register()
class ScaffoldConfig(AlgorithmFields):
    """SCAFFOLD (Karimireddy et al. 2020): control variates."""

    name: Literal["scaffold"] = method_name("scaffold")
    option: Literal["I", "II"] = Field("II", description="control update")
    control_average: Literal["all", "cohort"] = Field("all", description="divide control deltas by N or |S|")
    correction: Literal["after_step", "through_optimizer"] = Field(
        "after_step", description="apply -eta (c - c_k) after the optimiser step, or add c - c_k to the "
                                  "gradient before it (amplified by client momentum)")


__getattr__ = lazy_method(__name__)
