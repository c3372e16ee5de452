"""FedDyn: dynamic regularisation. Client k minimises ``f_k(w) - <g_k, w> + alpha/2 ||w - x||^2`` and then
updates its state ``g_k <- g_k - alpha (y_k - x)``. The server keeps ``h <- h - alpha / N sum_{k in S} (y_k - x)``
and sets ``x+ = mean_{k in S} y_k - h / alpha``. With ``alpha = 0`` it is FedAvg.

References:
  Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021, Algorithm 1.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_lab.engine.aggregation import Weighting, cohort_weights, weighted_mean
from fedjax_lab.engine.local_training import LocalSchedule
from fedjax_lab.engine.tree_math import tree_add, tree_scale, tree_sub, tree_zeros_like
from fedjax_lab.engine.types import Algorithm, LossFn, Params
from fedjax_lab.engine.variables import merge_variables, split_variables
from fedjax_lab.methods.fedavg import local_delta
from fedjax_lab.methods.fedprox import proximal_loss


class FedDynState(NamedTuple):
    """The global model and the server's drift accumulator ``h``."""

    params: Params
    h: Params


def linear_penalty(loss_fn: LossFn, g: Params) -> LossFn:
    """``loss_fn - <g, params>`` (FedDyn's linear term)."""

    def loss(variables, batch, key):
        value, model_state = loss_fn(variables, batch, key)
        inner = sum(jnp.vdot(a, b) for a, b in zip(jax.tree.leaves(split_variables(variables)[0]), jax.tree.leaves(g)))
        return value - inner, model_state

    return loss


def feddyn(loss_fn: LossFn, client_optimizer: optax.GradientTransformation, schedule: LocalSchedule, alpha: float,
           num_clients: int, weighting: Weighting = "uniform") -> Algorithm:
    """Builds FedDyn (uniform cohort mean by default, as in the paper)."""

    def server_init(params):
        return FedDynState(params, tree_zeros_like(split_variables(params)[0]))

    def client_init(server_state):
        return tree_zeros_like(server_state.h)

    def client_update(server_state, g, client, arrays, key):
        loss = proximal_loss(linear_penalty(loss_fn, g), server_state.params, alpha)
        delta, metrics = local_delta(server_state.params, loss, client_optimizer, client, arrays, key, schedule,
                                     task_loss=loss_fn)
        return delta, tree_sub(g, tree_scale(split_variables(delta)[0], alpha)), metrics

    def server_update(server_state, deltas, cohort, context):
        mean_delta = weighted_mean(deltas, cohort_weights(cohort, weighting))
        params, model_state = split_variables(tree_add(server_state.params, mean_delta))
        h = server_state.h
        if alpha:
            drift_sum = jax.tree.map(lambda d: jnp.sum(d, 0), split_variables(deltas)[0])
            h = tree_sub(h, tree_scale(drift_sum, alpha / num_clients))
            params = tree_sub(params, tree_scale(h, 1.0 / alpha))
        return (FedDynState(merge_variables(params, model_state, server_state.params), h),
                {"update_norm": optax.global_norm(mean_delta)})

    return Algorithm(server_init, client_init, client_update, server_update, lambda s: s.params)
