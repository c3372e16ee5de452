"""FedBuff: the server steps on the mean of a buffer of ``K`` arrived updates, whenever it fills.

``w <- w + eta_g (1/K) sum_{j in buffer} s(tau_j) Delta_j``, with ``s = 1`` (the plain mean, as in Feddle's
proof) or FedBuff's optional ``s(tau) = 1/sqrt(1 + tau)``. The buffer is the engine's
(``algorithm.buffer_size``, :mod:`fedjax_lab.engine.asynchrony`): arrivals join it in order, and the server
steps each time it holds ``K`` of them, possibly several times in a round; a partial buffer waits. So FedBuff
is the FedAvg round with a buffer and uniform weights, plus, with staleness scaling, this component.

References:
  Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation", AISTATS 2022, Alg. 1.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from fedjax_lab.engine.aggregation import cohort_staleness
from fedjax_lab.engine.components import Component, ServerView
from fedjax_lab.methods.staleness import staleness_function


def staleness_scaled(staleness: Callable[[jax.Array], jax.Array]) -> Component:
    """The averaged delta becomes ``sum_j w_j s(tau_j) Delta_j / sum_j w_j`` (each update scaled by its
    staleness weight, still divided by the buffer's total weight)."""

    def aggregate(view: ServerView, mean_delta):
        weights = view.weights * staleness(cohort_staleness(view.cohort))
        total = jnp.maximum(jnp.sum(view.weights), 1e-30)
        scaled = jax.tree.map(lambda x: jnp.tensordot(weights, x, axes=1) / total, view.messages["delta"])
        return scaled, {"fedbuff_scale": jnp.sum(weights) / total}

    return Component("fedbuff", aggregate=aggregate)


def build(config, context) -> tuple[Component, ...]:
    """The components of ``algorithm.name: fedbuff``."""
    if config.staleness_scaling == "none":
        return ()
    return (staleness_scaled(staleness_function("polynomial", 0.5)),)
