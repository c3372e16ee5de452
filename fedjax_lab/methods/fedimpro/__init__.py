"""FedImpro: its config, with its paper's defaults, registered by name.

The method itself, with its equations and builder, is ``method.py``. This file imports no JAX, so a config
validates in a fraction of a second; a name of ``method.py`` is also reached from here
(``from fedjax_lab.methods.fedimpro import ...``), which imports it on first use.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt

from fedjax_lab.methods.registry import AlgorithmFields, lazy_method, method_name, register


@register(plugin=True)
class FedImproConfig(AlgorithmFields):
    """FedImpro: clients share per-class Gaussian statistics of the features at a split of the model and train
    the upper part on features sampled from them too (``fedimpro`` alone is FedAvg + FedImpro)."""

    name: Literal["fedimpro"] = method_name("fedimpro")
    split: str | None = Field(None, description="the model stage after which features are shared (default: "
                                                "the middle stage; resnet18: layer2, the paper's 9th layer)")
    weight: float = Field(
        1.0, ge=0, description="weight of the sampled features' cross-entropy (0: the base)")
    weight_schedule: Literal["ramp", "constant"] = Field(
        "ramp", description="ramp: weight * r / ramp_rounds, unclamped (its code); constant (the paper)")
    ramp_rounds: PositiveInt = Field(
        500, description="ramp: the server step where the weight reaches 'weight'")
    labels: Literal["balanced", "batch"] = Field(
        "balanced", description="balanced: C (B // C + 1) features a step over all classes (its code); "
                                "batch: the real batch's labels (Alg. 1)")
    source: Literal["local", "global"] = Field("local", description="sample from the client's running copy "
                                                                    "(its code) or the broadcast statistics")
    ema_examples: PositiveFloat = Field(5000.0, description="a class moves n_c / ema_examples of the way to "
                                                            "its batch statistics each step (its code's "
                                                            "intent)")
    moving_average: Literal["class_count", "feature_size"] = Field(
        "class_count", description="each class's step to its batch statistics: min(1, n_c / ema_examples) "
                                   "(the intent), or its released code's min(1, D / ema_examples), D the "
                                   "feature size (1 at the default split: the last batch replaces the "
                                   "estimate)")
    spread_cap: PositiveFloat | None = Field(
        0.1, description="spreads are capped here (its code: 0.1; null: none)")
    init_spread: PositiveFloat = Field(0.1, description="the initial spreads (the initial means are U[0, 1))")
    aggregation: Literal["uniform", "pooled"] = Field("uniform", description="uniform mean of the cohort's "
                                                                             "statistics (Eq. 8), or pooled "
                                                                             "by class counts")
    noise_std: float = Field(0.0, ge=0, description="Gaussian noise on the uploaded statistics (Table 7)")


__getattr__ = lazy_method(__name__)
