"""FedWalk: its config, with its paper's defaults, registered by name.

The method itself, with its equations and builder, is ``method.py``. This file imports no JAX, so a config
validates in a fraction of a second; a name of ``method.py`` is also reached from here
(``from fedjax_lab.methods.fedwalk import ...``), which imports it on first use.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from fedjax_lab.methods.registry import Fields, lazy_method, method_name, register


@register(base=False, plugin=True, wrapper=True, needs_server_data=True)
class FedWalkConfig(Fields):
    """FedWalk (Zhai et al.): the server's leash task, gated by the log loss ratio; the leash set is
    ``dataset.server_data``."""

    name: Literal["fedwalk"] = method_name("fedwalk")
    mode: Literal["leash", "pretrain"] = Field("leash", description="pretrain: the ablation's leash training "
                                                                    "before FL, then no leash during FL")
    tau: float = Field(0.5, allow_inf_nan=True,
                       description="LLR threshold: the leash trains while log2(Lc/Ls) < tau (-.inf: never)")
    beta: float = Field(0.9, ge=0, lt=1, description="momentum of the client-loss EMA Lc")
    steps: PositiveInt = Field(1, description="T_s: leash SGD steps when the gate opens")
    batch_size: PositiveInt = Field(64, description="B_s: leash batch size")
    learning_rate: PositiveFloat | None = Field(None, description="gamma; default client.learning_rate")
    momentum: float = Field(0.0, ge=0, lt=1, description="leash SGD momentum (the paper: none)")
    client_loss: Literal["final", "train"] = Field(
        "final", description="L_k: the final local model's evaluation-mode loss on client_loss_examples of "
                             "the client's data, or the mean loss of its training steps")
    client_loss_examples: PositiveInt = Field(
        256, description="sample size of L_k (all, for smaller clients)")
    leash_loss_examples: PositiveInt = Field(
        512, description="sample size of Ls (all, for a smaller leash set)")
    pretrain_steps: PositiveInt | None = Field(None, description="leash steps before FL. mode pretrain: "
                                                                 "default rounds.num_rounds * steps; mode "
                                                                 "leash: default none, else FedWalk starts "
                                                                 "from the pre-trained model and leash head")

    @model_validator(mode="after")
    def _tau_is_a_number(self):
        if self.tau != self.tau:
            raise ValueError("algorithm.plugins: fedwalk.tau must be a number (.inf and -.inf are allowed), "
                             "got nan")
        return self


__getattr__ = lazy_method(__name__)
