"""FedExP: an adaptive, extrapolating server step size.

``eta_g = max(1, sum_{k in S} ||Delta_k||^2 / (2 |S| (||Delta_bar||^2 + eps)))`` with ``Delta_bar`` the
uniform mean, then ``x+ = x + eta_g Delta_bar`` (the server optimiser steps on ``eta_g Delta_bar``; with the
default ``sgd(1)`` exactly this). The step is never below FedAvg's. The paper averages uniformly
(``weighting: uniform``, the default); model state (BatchNorm statistics) is averaged, not extrapolated.
Extrapolated steps overshoot and oscillate with period 2, so the paper reports the average of the last two
iterates (``average_last_two``, on by default); the training itself continues from the last iterate.

References:
  Jhunjhunwala et al., "FedExP: Speeding Up Federated Averaging via Extrapolation", ICLR 2023, Eq. (9).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_lab.engine.aggregation import cohort_mask
from fedjax_lab.engine.components import Component
from fedjax_lab.engine.tree_math import tree_scale
from fedjax_lab.engine.variables import merge_variables, split_variables


def extrapolation_sums(deltas, mask: jax.Array | None = None) -> dict[str, jax.Array]:
    """The sums ``eta_g`` is made of, over the stacked deltas' trainable parameters of the clients in ``mask``
    (default all): ``sum_k ||Delta_k||^2``, ``sum_k Delta_k`` and the count; additive over any split of the
    cohort, so the round can stream them."""
    params = split_variables(deltas)[0]
    leaves = jax.tree.leaves(params)
    mask = jnp.ones(leaves[0].shape[0], bool) if mask is None else mask
    weight = mask.astype(jnp.float32)
    squares = sum(jnp.sum(jnp.square(x).reshape(x.shape[0], -1), 1) for x in leaves)
    return {"squares": jnp.sum(weight * squares), "count": jnp.sum(weight),
            "total": jax.tree.map(lambda x: jnp.tensordot(weight, x, axes=1), params)}


def step_from_sums(sums: dict[str, jax.Array], epsilon: float) -> jax.Array:
    """FedExP's ``eta_g`` (Eq. 9) from :func:`extrapolation_sums`."""
    m = jnp.maximum(sums["count"], 1.0)
    mean_sq = sum(jnp.sum(jnp.square(x / m)) for x in jax.tree.leaves(sums["total"]))
    return jnp.maximum(1.0, sums["squares"] / (2 * m * (mean_sq + epsilon)))


def extrapolation_step(deltas, epsilon: float, mask: jax.Array | None = None) -> jax.Array:
    """FedExP's ``eta_g`` from the stacked client deltas (trainable parameters only) of the clients in
    ``mask`` (default all)."""
    return step_from_sums(extrapolation_sums(deltas, mask), epsilon)


def extrapolation(epsilon: float = 1e-3, average_last_two: bool = True) -> Component:
    """FedExP's change to the round: the averaged delta's trainable part is scaled by ``eta_g``; with
    ``average_last_two`` the model evaluation reports is ``(w_t + w_{t-1}) / 2`` (the paper's remedy for the
    period-2 oscillation of extrapolated steps, Sec. 5; training continues from ``w_t``)."""

    def sums(messages, weights, cohort):
        return extrapolation_sums(messages["delta"], cohort_mask(cohort))

    def aggregate(view, mean_delta):
        eta = step_from_sums(view.sums["fedexp"], epsilon)
        params, model_state = split_variables(mean_delta)
        return merge_variables(tree_scale(params, eta), model_state, mean_delta), {"server_step": eta}

    if not average_last_two:
        return Component("fedexp", aggregate=aggregate, sums=sums)

    def after_step(view, new_variables):
        return view.global_variables, new_variables, {}  # w_{t-1}, kept for the report

    def reported(previous, variables):
        return jax.tree.map(lambda a, b: (a + b) / 2 if jnp.issubdtype(a.dtype, jnp.floating) else a,
                            variables, previous)

    def server_init(variables):
        return jax.tree.map(jnp.copy, variables)  # its own buffers: the loop state is donated to each block

    return Component("fedexp", server_init=server_init, aggregate=aggregate, after_step=after_step, sums=sums,
                     reported=reported)


def build(config, context) -> tuple[Component, ...]:
    """The components of ``algorithm.name: fedexp`` (or of a ``fedexp`` plug-in)."""
    return (extrapolation(config.epsilon, config.average_last_two),)
