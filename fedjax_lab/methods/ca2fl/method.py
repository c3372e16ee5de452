"""CA2FL: cached update calibration. The server keeps every client's latest update and corrects each buffer
with them.

The server holds ``h_i``, the latest update of every client ``i`` (zero until it first reports), and their
mean ``h_bar`` over all ``N`` clients. When the buffer ``S`` is full it steps on
``v = h_bar + (1/|S|) sum_{i in S} (Delta_i - h_i)`` (``w <- w + eta v`` with SGD), then sets
``h_i <- Delta_i`` for ``i in S`` and recomputes ``h_bar``. A client that arrives twice in one buffer is
calibrated both times against its cache as of the last step, and its later update is the one kept. The cache
is ``N`` models: the memory the paper's Table 6 charges CA2FL.

References:
  Wang et al., "Tackling the Data Heterogeneity in Asynchronous Federated Learning with Cached Update
  Calibration", ICLR 2024, Alg. 2.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_lab.engine.aggregation import weighted_mean
from fedjax_lab.engine.components import Component, ServerView
from fedjax_lab.engine.tree_math import tree_add, tree_stack_copies, tree_sub, tree_take, tree_zeros_like


class CacheState(NamedTuple):
    """``cache[i] = h_i`` (leading axis ``N``) and ``mean = h_bar``."""

    cache: dict
    mean: dict


def latest_of_each_client(client_ids: jax.Array, mask: jax.Array) -> jax.Array:
    """Which messages are their client's last among those in ``mask`` (messages are in arrival order)."""
    later = jnp.triu(client_ids[:, None] == client_ids[None, :], k=1) & mask[None, :]
    return mask & ~jnp.any(later, axis=1)


def cached_calibration(num_clients: int) -> Component:
    """CA2FL's change to the round: the averaged delta becomes ``h_bar + mean(Delta_i - h_i)``; after the
    server step the cache takes the buffer's updates."""

    def server_init(variables):
        zeros = tree_zeros_like(variables)
        return CacheState(tree_stack_copies(zeros, num_clients), zeros)

    def aggregate(view: ServerView, mean_delta):
        cached = tree_take(view.state.cache, view.cohort.client_ids)
        correction = weighted_mean(tree_sub(view.messages["delta"], cached), view.weights)
        return tree_add(view.state.mean, correction), {}

    def after_step(view: ServerView, variables):
        keep = latest_of_each_client(view.cohort.client_ids, view.weights > 0)
        rows = jnp.where(keep, view.cohort.client_ids, num_clients)  # out of range: not written
        cache = jax.tree.map(lambda c, d: c.at[rows].set(d, mode="drop"), view.state.cache,
                             view.messages["delta"])
        # h_bar recomputed (no drift); a product with ones, since XLA's CPU column reduction is 30x slower.
        mean = jax.tree.map(
            lambda c: jnp.tensordot(jnp.full((num_clients,), 1.0 / num_clients, c.dtype), c, 1), cache)
        return CacheState(cache, mean), variables, {}

    return Component("ca2fl", server_init=server_init, aggregate=aggregate, after_step=after_step)


def build(config, context) -> tuple[Component, ...]:
    """The components of ``algorithm.name: ca2fl``."""
    return (cached_calibration(context.dataset.num_clients),)
