"""FedProx: FedAvg whose clients minimise ``f_k(w) + mu/2 ||w - x_t||^2`` (the proximal term anchors them to the
global model ``x_t``; mu = 0 is FedAvg).

References:
  Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020, Eq. (2).
"""

from __future__ import annotations

import optax

from fedjax_lab.engine.aggregation import Weighting
from fedjax_lab.engine.local_training import LocalSchedule
from fedjax_lab.engine.tree_math import tree_squared_norm, tree_sub
from fedjax_lab.engine.types import Algorithm, LossFn, Params
from fedjax_lab.engine.variables import split_variables
from fedjax_lab.methods.fedavg import fedavg, local_delta


def proximal_loss(loss_fn: LossFn, anchor: Params, mu: float) -> LossFn:
    """``loss_fn`` plus ``mu/2 ||params - anchor||^2`` over the trainable parameters (a client-loss term)."""
    anchor_params = split_variables(anchor)[0]

    def loss(variables, batch, key):
        value, model_state = loss_fn(variables, batch, key)
        drift = tree_sub(split_variables(variables)[0], anchor_params)
        return value + 0.5 * mu * tree_squared_norm(drift), model_state

    return loss


def fedprox(loss_fn: LossFn, client_optimizer: optax.GradientTransformation,
            server_optimizer: optax.GradientTransformation, schedule: LocalSchedule, mu: float,
            weighting: Weighting = "num_examples") -> Algorithm:
    """FedAvg (with any server optimiser) whose clients add the proximal term ``mu/2 ||w - x_t||^2``."""
    base = fedavg(loss_fn, client_optimizer, server_optimizer, schedule, weighting)

    def client_update(server_state, client_state, client, arrays, key):
        loss = proximal_loss(loss_fn, server_state.params, mu)
        delta, metrics = local_delta(server_state.params, loss, client_optimizer, client, arrays, key, schedule,
                                     task_loss=loss_fn)
        return delta, client_state, metrics

    return base._replace(client_update=client_update)
