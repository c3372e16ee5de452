"""Fed+FT: its config, with its paper's defaults, registered by name.

The method itself, with its equations and builder, is ``method.py``. This file imports no JAX, so a config
validates in a fraction of a second; a name of ``method.py`` is also reached from here
(``from fedjax_lab.methods.fedft import ...``), which imports it on first use.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt

from fedjax_lab.methods.registry import AlgorithmFields, lazy_method, method_name, register


@register(plugin=True, needs_server_data=True)
class FedFTConfig(AlgorithmFields):
    """Fed+FT (Feddle's baseline): the aggregate is fine-tuned on the server's data after every server
    step."""

    name: Literal["fedft"] = method_name("fedft")
    steps: PositiveInt = Field(20, description="Adam steps on the server's data a round")
    learning_rate: PositiveFloat = Field(1e-3, description="the paper's grid: 1e-5, 1e-4, 1e-3")
    batch_size: PositiveInt = Field(64, description="server examples a step")


__getattr__ = lazy_method(__name__)
