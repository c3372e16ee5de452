"""Aggregation of stacked client messages."""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

from fedjax_lab.engine.types import Cohort, PyTree

Weighting = Literal["num_examples", "uniform"]


def cohort_weights(cohort: Cohort, weighting: Weighting) -> jax.Array:
    """Aggregation weights of the cohort's clients: their example counts ``n_k``, or all ones."""
    if weighting == "num_examples":
        return cohort.num_examples.astype(jnp.float32)
    if weighting == "uniform":
        return jnp.ones_like(cohort.num_examples, dtype=jnp.float32)
    raise ValueError(f"weighting must be 'num_examples' or 'uniform', got {weighting!r}")


def weighted_mean(stacked: PyTree, weights: jax.Array) -> PyTree:
    """``sum_k w_k x_k / sum_k w_k`` over the leading (cohort) axis of every leaf."""
    total = jnp.sum(weights)
    return jax.tree.map(lambda x: jnp.tensordot(weights, x, axes=1) / total, stacked)
