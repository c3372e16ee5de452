"""Aggregation of stacked client messages."""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

from fedjax_lab.engine.types import Cohort, PyTree

Weighting = Literal["num_examples", "uniform"]


def cohort_mask(cohort: Cohort) -> jax.Array:
    """Which of the cohort's messages take part: ``cohort.mask``, or all of them."""
    if cohort.mask is None:
        return jnp.ones(cohort.client_ids.shape, bool)
    return cohort.mask


def cohort_staleness(cohort: Cohort) -> jax.Array:
    """Each message's staleness in rounds: ``cohort.staleness``, or zero (the synchronous round)."""
    if cohort.staleness is None:
        return jnp.zeros(cohort.client_ids.shape, jnp.int32)
    return cohort.staleness


def cohort_weights(cohort: Cohort, weighting: Weighting) -> jax.Array:
    """Aggregation weights of the cohort's clients: their example counts ``n_k``, or all ones; zero for the
    messages outside ``cohort.mask``."""
    if weighting == "num_examples":
        weights = cohort.num_examples.astype(jnp.float32)
    elif weighting == "uniform":
        weights = jnp.ones_like(cohort.num_examples, dtype=jnp.float32)
    else:
        raise ValueError(f"weighting must be 'num_examples' or 'uniform', got {weighting!r}")
    return weights if cohort.mask is None else jnp.where(cohort.mask, weights, 0.0)


def weighted_mean(stacked: PyTree, weights: jax.Array) -> PyTree:
    """``sum_k w_k x_k / sum_k w_k`` over the leading (cohort) axis of every leaf; zero when every weight
    is."""
    total = jnp.sum(weights)
    total = jnp.where(total > 0, total, 1.0)
    return jax.tree.map(lambda x: jnp.tensordot(weights, x, axes=1) / total, stacked)


def masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """The mean of ``values`` over the leading axis where ``mask`` holds (zero where it never does)."""
    mask = mask.reshape(mask.shape + (1,) * (values.ndim - 1))
    return jnp.sum(jnp.where(mask, values, 0), 0) / jnp.maximum(jnp.sum(mask, 0), 1)
