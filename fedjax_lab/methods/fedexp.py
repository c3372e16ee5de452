"""FedExP: FedAvg with an adaptive, extrapolating server step size.

``eta_g = max(1, sum_{k in S} ||Delta_k||^2 / (2 |S| (||Delta_bar||^2 + eps)))`` with ``Delta_bar`` the uniform
mean, then ``x+ = x + eta_g Delta_bar``. The step is never below FedAvg's.

References:
  Jhunjhunwala et al., "FedExP: Speeding Up Federated Averaging via Extrapolation", ICLR 2023, Eq. (9).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fedjax_lab.engine.local_training import LocalSchedule
from fedjax_lab.engine.tree_math import tree_add, tree_scale
from fedjax_lab.engine.types import Algorithm, LossFn
from fedjax_lab.engine.variables import merge_variables, split_variables
from fedjax_lab.methods.fedavg import fedavg


def extrapolation_step(deltas, epsilon: float) -> jax.Array:
    """FedExP's ``eta_g`` from the stacked client deltas (trainable parameters only)."""
    leaves = jax.tree.leaves(split_variables(deltas)[0])
    m = leaves[0].shape[0]
    per_client = sum(jnp.sum(jnp.square(x).reshape(m, -1), 1) for x in leaves)
    mean_sq = sum(jnp.sum(jnp.square(jnp.mean(x, 0))) for x in leaves)
    return jnp.maximum(1.0, jnp.sum(per_client) / (2 * m * (mean_sq + epsilon)))


def fedexp(loss_fn: LossFn, client_optimizer: optax.GradientTransformation, schedule: LocalSchedule,
           epsilon: float = 1e-3) -> Algorithm:
    """Builds FedExP (uniform weights, as in the paper)."""
    base = fedavg(loss_fn, client_optimizer, optax.sgd(1.0), schedule, "uniform")

    def server_update(server_state, deltas, cohort, context):
        eta = extrapolation_step(deltas, epsilon)
        mean = jax.tree.map(lambda d: jnp.mean(d, 0), deltas)
        d_params, d_state = split_variables(mean)
        params, model_state = split_variables(server_state.params)
        new = merge_variables(tree_add(params, tree_scale(d_params, eta)), tree_add(model_state, d_state),
                              server_state.params)
        return server_state._replace(params=new), {"update_norm": optax.global_norm(mean), "server_step": eta}

    return base._replace(server_update=server_update)
