"""FedNova: normalised averaging, so that clients taking more local steps do not pull the model their way.

Client k sends ``Delta_k = y_k - x`` and ``a_k``, the sum of the coefficients its optimiser gave the gradients
(``tau_k`` for SGD, ``[tau_k - rho (1 - rho^tau_k) / (1 - rho)] / (1 - rho)`` with heavy-ball momentum
``rho``), read from the optimiser as ``LocalStats.unit_step / eta``. The server forms ``d_k = Delta_k / a_k``,
``tau_eff = sum_k p_k a_k`` and steps with ``tau_eff sum_k p_k d_k``. With equal ``a_k`` this is weighted
FedAvg. Only the trainable parameters are normalised: model state (BatchNorm statistics) is the plain weighted
mean.

References:
  Wang et al., "Tackling the Objective Inconsistency Problem in Heterogeneous Federated Optimization",
  NeurIPS 2020, Eq. (6)-(7) and Appendix (momentum).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_lab.engine.components import Component
from fedjax_lab.engine.variables import merge_variables, split_variables


def normalised_averaging() -> Component:
    """FedNova's change to the round: clients send ``a_k``; the server's aggregate is the normalised one,
    ``tau_eff sum_k p_k Delta_k / a_k`` from the sums ``sum_k w_k Delta_k / a_k`` and ``sum_k w_k a_k``."""

    def finish(view, result):
        return result.stats.unit_step / view.learning_rate, ()

    def sums(messages, weights, cohort):
        a = messages["fednova"]
        deltas = split_variables(messages["delta"])[0]
        return {"normalised": jax.tree.map(lambda d: jnp.tensordot(weights / a, d, axes=1), deltas),
                "weighted_a": jnp.sum(weights * a)}

    def aggregate(view, mean_delta):
        total = jnp.where(view.sums["weight"] > 0, view.sums["weight"], 1.0)
        tau_eff = view.sums["fednova"]["weighted_a"] / total
        params = jax.tree.map(lambda d: tau_eff * d / total, view.sums["fednova"]["normalised"])
        return merge_variables(params, split_variables(mean_delta)[1], mean_delta), {"tau_eff": tau_eff}

    return Component("fednova", finish=finish, aggregate=aggregate, sums=sums, needs_unit_step=True)


def build(config, context) -> tuple[Component, ...]:
    """The components of ``algorithm.name: fednova`` (or of a ``fednova`` plug-in)."""
    return (normalised_averaging(),)
