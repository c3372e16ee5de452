"""FedAvg with a server optimiser: FedAvg, FedAvgM, FedAdam, FedYogi and FedAdagrad are configurations.

Each sampled client k starts from the global model x_t, runs local optimisation on its data and sends
``Delta_k = y_k - x_t``. The server forms ``Delta_t = sum_k w_k Delta_k / sum_k w_k`` (``w_k = n_k`` or 1)
and applies its optimiser to the pseudo-gradient ``-Delta_t``.

References:
  McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data", AISTATS 2017.
  Reddi et al., "Adaptive Federated Optimization", ICLR 2021, Algorithm 2.
"""

from __future__ import annotations

from typing import NamedTuple

import optax

from fedjax_lab.engine.aggregation import Weighting, cohort_weights, weighted_mean
from fedjax_lab.engine.local_training import LocalSchedule, train_locally
from fedjax_lab.engine.tree_math import tree_add, tree_scale, tree_sub
from fedjax_lab.engine.types import Algorithm, LossFn, Params
from fedjax_lab.engine.variables import merge_variables, split_variables


class ServerState(NamedTuple):
    """The global model and the server optimiser's state."""

    params: Params
    opt_state: optax.OptState


def apply_server_optimizer(server_optimizer: optax.GradientTransformation, state: ServerState,
                           mean_delta: Params) -> ServerState:
    """Steps the server optimiser on the pseudo-gradient ``-mean_delta`` of the trainable variables; model
    state (BatchNorm statistics) moves by its mean delta, i.e. becomes the weighted mean of the clients'."""
    params, model_state = split_variables(state.params)
    delta_params, delta_model_state = split_variables(mean_delta)
    updates, opt_state = server_optimizer.update(tree_scale(delta_params, -1.0), state.opt_state, params)
    new_variables = merge_variables(optax.apply_updates(params, updates), tree_add(model_state, delta_model_state),
                                    state.params)
    return ServerState(new_variables, opt_state)


def init_server_state(server_optimizer: optax.GradientTransformation, variables: Params) -> ServerState:
    """The global model and a fresh server optimiser state over its trainable part."""
    return ServerState(variables, server_optimizer.init(split_variables(variables)[0]))


def local_delta(variables: Params, loss_fn: LossFn, optimizer: optax.GradientTransformation, client, arrays,
                key, schedule: LocalSchedule, **train_kwargs) -> tuple[Params, dict]:
    """Trains one client from ``variables`` and returns ``(y_k - x_t, metrics)``; the metrics hold
    ``final_loss`` when the schedule probes the final model (see :func:`train_locally`)."""
    trained, stats = train_locally(variables, loss_fn, optimizer, client, arrays, key, schedule, **train_kwargs)
    metrics = {"train_loss": stats.mean_loss, "local_steps": stats.num_steps}
    if schedule.probe_examples:
        metrics["final_loss"] = stats.final_loss
    return tree_sub(trained, variables), metrics


def fedavg(
    loss_fn: LossFn,
    client_optimizer: optax.GradientTransformation,
    server_optimizer: optax.GradientTransformation,
    schedule: LocalSchedule,
    weighting: Weighting = "num_examples",
) -> Algorithm:
    """Builds FedAvg with a server optimiser.

    Args:
      loss_fn: ``(variables, batch, key) -> (loss, model_state)`` minimised locally.
      client_optimizer: the clients' optax optimiser (its state is reset every round).
      server_optimizer: applied to ``-Delta_t``; see :mod:`fedjax_lab.methods.server_optimizers`.
      schedule: local steps or epochs, and the batch size.
      weighting: ``'num_examples'`` (``w_k = n_k``) or ``'uniform'``.

    Example::

      algorithm = fedavg(loss_fn, optax.sgd(0.1), fedavg_server(1.0), LocalSchedule(10, local_steps=5))
    """

    def server_init(params):
        return init_server_state(server_optimizer, params)

    def client_update(server_state, client_state, client, arrays, key):
        delta, metrics = local_delta(server_state.params, loss_fn, client_optimizer, client, arrays, key, schedule)
        return delta, client_state, metrics

    def server_update(server_state, deltas, cohort, context):
        del context
        mean_delta = weighted_mean(deltas, cohort_weights(cohort, weighting))
        update_norm = optax.global_norm(mean_delta)
        return apply_server_optimizer(server_optimizer, server_state, mean_delta), {"update_norm": update_norm}

    return Algorithm(server_init=server_init, client_init=lambda server_state: (),
                     client_update=client_update, server_update=server_update,
                     model_params=lambda server_state: server_state.params)
