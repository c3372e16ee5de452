"""FedCOG: its config, with its paper's defaults, registered by name.

The method itself, with its equations and builder, is ``method.py``. This file imports no JAX, so a config
validates in a fraction of a second; a name of ``method.py`` is also reached from here
(``from fedjax_lab.methods.fedcog import ...``), which imports it on first use.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt

from fedjax_lab.methods.registry import AlgorithmFields, lazy_method, method_name, register


@register(plugin=True)
class FedCOGConfig(AlgorithmFields):
    """FedCOG (Ye et al. 2024): clients generate inputs the global model agrees on and their previous model
    does not, and distil the global model on them while training (``fedcog`` alone is FedAvg + FedCOG)."""

    name: Literal["fedcog"] = method_name("fedcog")
    start_round: int = Field(0, ge=0, description="server steps before generation starts (the paper: 50)")
    num_samples: int = Field(256, ge=0, description="N, inputs generated per client a round (0: the base)")
    steps: int = Field(100, ge=0, description="S, Adam steps on the inputs (the paper: 100; its code: 500)")
    learning_rate: PositiveFloat = Field(0.01, description="the generation's Adam rate (betas 0.5, 0.9)")
    lambda_dis: float = Field(0.1, ge=0, description="weight of 1 - JS(global, previous local) (Eq. 1)")
    labels: Literal["complement", "uniform"] = Field("complement", description="target labels: shares of "
                                                                              "max(d) - d, or equal shares")
    kd_weighting: Literal["fixed", "size"] = Field(
        "fixed", description="fixed: CE + lambda_kd KD (Sec. 4); size: (n CE + N_gen KD) / (n + N_gen) "
                             "(App. A.2.2)")
    lambda_kd: float = Field(
        0.01, ge=0, description="weight of the distillation term under kd_weighting: fixed")
    temperature: PositiveFloat = Field(1.0, description="T of the distillation (its code: 1)")
    batch_size: PositiveInt = Field(64, description="generated inputs beside each real batch")


__getattr__ = lazy_method(__name__)
