"""FedDyn: dynamic regularisation. Client k minimises ``f_k(w) - <g_k, w> + alpha/2 ||w - x||^2`` and then
updates its state ``g_k <- g_k - alpha (y_k - x)``. The server keeps
``h <- h - alpha / N sum_{k in S} (y_k - x)`` and sets ``x+ = mean_{k in S} y_k - h / alpha`` (with the
default server step, ``x + mean Delta_k``). With ``alpha = 0`` it is FedAvg. The paper averages the cohort
uniformly (``weighting: uniform``, the default).

References:
  Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021, Algorithm 1.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_lab.engine.aggregation import cohort_mask
from fedjax_lab.engine.components import Component
from fedjax_lab.engine.tree_math import tree_scale, tree_sub, tree_zeros_like
from fedjax_lab.engine.variables import merge_variables, split_variables
from fedjax_lab.methods.fedprox import proximal_term


def linear_term(g):
    """``-<g, w>`` over the trainable parameters ``w`` (FedDyn's linear term)."""

    def term(variables, batch, forward):
        leaves = zip(jax.tree.leaves(split_variables(variables)[0]), jax.tree.leaves(g))
        return -sum(jnp.vdot(a, b) for a, b in leaves)

    return term


def dynamic_regularization(alpha: float) -> Component:
    """FedDyn's change to the round: the linear and proximal terms, the clients' ``g_k`` and the server's
    ``h``."""
    def zeros(params):
        return tree_zeros_like(split_variables(params)[0])

    def loss_term(view):
        linear, proximal = linear_term(view.state), proximal_term(view.global_variables, alpha)
        return lambda variables, batch, forward: (linear(variables, batch, forward)
                                                  + proximal(variables, batch, forward))

    def finish(view, result):
        return None, tree_sub(view.state, tree_scale(split_variables(result.delta)[0], alpha))

    def sums(messages, weights, cohort):
        mask = cohort_mask(cohort).astype(jnp.float32)
        return jax.tree.map(lambda d: jnp.tensordot(mask, d, axes=1), split_variables(messages["delta"])[0])

    def after_step(view, variables):
        drift_sum = view.sums["feddyn"]
        h = tree_sub(view.state, tree_scale(drift_sum, alpha / view.context.num_clients))
        params, model_state = split_variables(variables)
        # alpha = 0 is FedAvg: h stays 0 and the correction h / alpha is dropped rather than 0 / 0.
        shift = tree_scale(h, jnp.where(alpha > 0, 1.0 / jnp.maximum(alpha, 1e-30), 0.0))
        return h, merge_variables(tree_sub(params, shift), model_state, variables), {}

    return Component("feddyn", client_init=zeros, loss_term=loss_term, finish=finish, server_init=zeros,
                     after_step=after_step, sums=sums)


def build(config, context) -> tuple[Component, ...]:
    """The components of ``algorithm.name: feddyn`` (or of a ``feddyn`` plug-in)."""
    return (dynamic_regularization(config.alpha),)
