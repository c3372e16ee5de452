"""FedNova: normalised averaging, so that clients taking more local steps do not pull the model their way.

Client k sends ``Delta_k = y_k - x`` and ``a_k = [tau_k - rho (1 - rho^tau_k) / (1 - rho)] / (1 - rho)`` (the sum
of the heavy-ball coefficients of ``tau_k`` SGD steps with momentum ``rho``; ``a_k = tau_k`` without momentum).
The server forms ``d_k = Delta_k / a_k``, ``tau_eff = sum_k p_k a_k`` and steps with ``tau_eff sum_k p_k d_k``.
With equal ``tau_k`` this is weighted FedAvg.

References:
  Wang et al., "Tackling the Objective Inconsistency Problem in Heterogeneous Federated Optimization",
  NeurIPS 2020, Eq. (6)-(7) and Appendix (momentum).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fedjax_lab.engine.aggregation import Weighting, cohort_weights, weighted_mean
from fedjax_lab.engine.local_training import LocalSchedule
from fedjax_lab.engine.types import Algorithm, LossFn
from fedjax_lab.methods.fedavg import apply_server_optimizer, fedavg, local_delta


def momentum_normaliser(num_steps: jax.Array, momentum: float) -> jax.Array:
    """``a_k`` for ``num_steps`` steps of SGD with heavy-ball ``momentum`` (``num_steps`` when it is 0)."""
    tau = num_steps.astype(jnp.float32)
    if momentum == 0:
        return tau
    rho = momentum
    return (tau - rho * (1 - rho**tau) / (1 - rho)) / (1 - rho)


def fednova(loss_fn: LossFn, client_optimizer: optax.GradientTransformation,
            server_optimizer: optax.GradientTransformation, schedule: LocalSchedule, momentum: float = 0.0,
            weighting: Weighting = "num_examples") -> Algorithm:
    """Builds FedNova; ``momentum`` must be the client optimiser's (it enters ``a_k``)."""
    base = fedavg(loss_fn, client_optimizer, server_optimizer, schedule, weighting)

    def client_update(server_state, client_state, client, arrays, key):
        delta, metrics = local_delta(server_state.params, loss_fn, client_optimizer, client, arrays, key, schedule)
        return (delta, momentum_normaliser(metrics["local_steps"], momentum)), client_state, metrics

    def server_update(server_state, messages, cohort, context):
        deltas, a = messages
        weights = cohort_weights(cohort, weighting)
        normalised = jax.tree.map(lambda d: d / a.reshape((-1,) + (1,) * (d.ndim - 1)), deltas)
        tau_eff = jnp.sum(weights * a) / jnp.sum(weights)
        step = jax.tree.map(lambda d: tau_eff * d, weighted_mean(normalised, weights))
        return (apply_server_optimizer(server_optimizer, server_state, step),
                {"update_norm": optax.global_norm(step), "tau_eff": tau_eff})

    return base._replace(client_update=client_update, server_update=server_update)
