"""FedAvg with a server optimiser: the round of :mod:`fedjax_lab.engine.round` with no component of its own.

Each sampled client k starts from the global model x_t, runs local optimisation on its data and sends
``Delta_k = y_k - x_t``. The server forms ``Delta_t = sum_k w_k Delta_k / sum_k w_k`` (``w_k = n_k`` or 1)
and applies its optimiser to the pseudo-gradient ``-Delta_t``. FedAvg, FedAvgM, FedAdam, FedYogi and
FedAdagrad are this round with different server optimisers (:mod:`fedjax_lab.methods.server_optimizers`);
FedProx, SCAFFOLD, FedNova, MOON and the rest add their :class:`~fedjax_lab.engine.components.Component` s, so
methods combine by listing them.

References:
  McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data", AISTATS 2017.
  Reddi et al., "Adaptive Federated Optimization", ICLR 2021, Algorithm 2.
"""

from __future__ import annotations

from typing import Any

import optax

from fedjax_lab.engine.aggregation import Weighting
from fedjax_lab.engine.components import Component
from fedjax_lab.engine.local_training import LocalSchedule
from fedjax_lab.engine.round import ServerState, apply_server_optimizer, component_round, init_server_state
from fedjax_lab.engine.types import Algorithm

__all__ = ["ServerState", "apply_server_optimizer", "build", "fedavg", "init_server_state"]


def fedavg(
    task: Any,
    client_optimizer: optax.GradientTransformation,
    server_optimizer: optax.GradientTransformation,
    schedule: LocalSchedule,
    *components: Component,
    weighting: Weighting = "num_examples",
) -> Algorithm:
    """FedAvg with a server optimiser, changed by ``components`` (FedProx, SCAFFOLD, ...): the round of
    :func:`fedjax_lab.engine.round.component_round`, whose arguments these are.

    Example::

      fedprox_and_moon = fedavg(classifier, optax.sgd(0.01), fedavg_server(),
                                LocalSchedule(64, local_steps=10),
                                proximal(mu=0.01), contrastive(classifier, mu=5.0))
    """
    return component_round(task, client_optimizer, server_optimizer, schedule, *components,
                           weighting=weighting)


def build(config, context) -> tuple[Component, ...]:
    """The components of ``algorithm.name: fedavg`` (or of a ``fedavg`` plug-in): none."""
    return ()
