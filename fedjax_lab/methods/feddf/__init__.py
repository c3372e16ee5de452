"""FedDF: its config, with its paper's defaults, registered by name.

The method itself, with its equations and builder, is ``method.py``. This file imports no JAX, so a config
validates in a fraction of a second; a name of ``method.py`` is also reached from here
(``from fedjax_lab.methods.feddf import ...``), which imports it on first use.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt

from fedjax_lab.methods.registry import AlgorithmFields, lazy_method, method_name, register


@register(plugin=True, needs_server_data=True)
class FedDFConfig(AlgorithmFields):
    """FedDF (Lin et al. 2020; Feddle's baseline): the arrived models' ensemble is distilled into the
    aggregate on the server's inputs (labels unused: in-domain or out-of-domain)."""

    name: Literal["feddf"] = method_name("feddf")
    buffer_size: PositiveInt | None = Field(10, description="arrivals per server step, the ensemble's size "
                                                            "(as FedBuff's)")
    steps: PositiveInt = Field(20, description="Adam steps of distillation a server step")
    learning_rate: PositiveFloat = Field(1e-3, description="the paper's grid: 1e-5, 1e-4, 1e-3")
    batch_size: PositiveInt = Field(64, description="server examples a step")
    temperature: PositiveFloat = Field(1.0, description="T of the softened softmax (FedDF: 1)")
    teacher: Literal["uniform", "weighted"] = Field(
        "uniform", description="the ensemble's logits: the plain mean over the arrived models (FedDF's code) "
                               "or weighted as the aggregation (by size)")


__getattr__ = lazy_method(__name__)
