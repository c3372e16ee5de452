"""FedGen: its config, with its paper's defaults, registered by name.

The method itself, with its equations and builder, is ``method.py``. This file imports no JAX, so a config
validates in a fraction of a second; a name of ``method.py`` is also reached from here
(``from fedjax_lab.methods.fedgen import ...``), which imports it on first use.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt

from fedjax_lab.methods.registry import AlgorithmFields, lazy_method, method_name, register


@register(plugin=True)
class FedGenConfig(AlgorithmFields):
    """FedGen (Zhu, Hong and Zhou 2021; FedCOG's baseline): the server learns a label-conditional generator of
    features from the clients' heads; clients regularise on its features."""

    name: Literal["fedgen"] = method_name("fedgen")
    alpha: float = Field(10.0, ge=0, description="weight of the teacher term on generated features (its "
                                                 "code: 10), decayed by 0.98 a round to at least 1e-4")
    beta: float = Field(10.0, ge=0, description="weight of the latent distillation term (its code, MNIST: "
                                                "10), decayed likewise")
    noise_dim: PositiveInt = Field(32, description="the generator's noise (its code: 32 MNIST, 64 CIFAR)")
    hidden: PositiveInt = Field(
        256, description="the generator's hidden width (its code: 256 MNIST, 512 CIFAR)")
    generator_steps: int = Field(50, ge=0, description="the server's Adam steps on the generator a round")
    generator_learning_rate: PositiveFloat = Field(3e-4, description="its code: 3e-4 MNIST, 1e-4 otherwise; "
                                                                     "x0.98 a round")
    generator_batch_size: PositiveInt = Field(32, description="labels per generator step (its code: 32)")
    teacher_batch_size: PositiveInt = Field(
        32, description="generated features per client step (its code: 32)")
    diversity_weight: float = Field(1.0, ge=0, description="weight of the generator's diversity loss")


__getattr__ = lazy_method(__name__)
