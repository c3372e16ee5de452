"""Cohort sampling."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def sample_cohort(key: jax.Array, num_clients: int, cohort_size: int) -> jax.Array:
    """Draws ``cohort_size`` distinct client ids uniformly from ``range(num_clients)``.

    Args:
      key: the round's cohort key (see :func:`fedjax_lab.engine.randomness.round_key`).
      num_clients: population size N.
      cohort_size: clients per round m, ``1 <= m <= N``.

    Returns:
      int32 ``[m]`` client ids, sorted so that the cohort's order carries no information.
    """
    if cohort_size == num_clients:
        return jnp.arange(num_clients, dtype=jnp.int32)
    ids = jax.random.choice(key, num_clients, (cohort_size,), replace=False)
    return jnp.sort(ids).astype(jnp.int32)


def sample_poisson_cohort(key: jax.Array, num_clients: int, slots: int,
                          rate: float) -> tuple[jax.Array, jax.Array]:
    """Poisson sampling truncated to ``slots``: each client joins independently with probability ``rate``;
    when more than ``slots`` join, a uniformly random subset of ``slots`` of them is kept (the truncated
    Poisson sampling that ``dp_accounting.TruncatedSubsampledGaussianDpEvent`` accounts for).

    The cohort keeps a fixed shape for ``vmap``: the sampled clients fill the first slots (sorted by id) and
    distinct unsampled clients pad the rest, with ``mask`` false there, so that no client appears twice.

    Args:
      key: the round's cohort key.
      num_clients: population size N.
      slots: the cohort's fixed size (the truncation), ``1 <= slots <= N``.
      rate: each client's probability of joining, ``q``.

    Returns:
      int32 ``[slots]`` client ids and bool ``[slots]`` mask (which slots hold a sampled client).
    """
    joins_key, order_key = jax.random.split(key)
    joined = jax.random.uniform(joins_key, (num_clients,)) < rate
    # Sampled clients first, in random order (so that truncation keeps a uniform subset), then the others.
    priority = jnp.where(joined, 0.0, 1.0) + jax.random.uniform(order_key, (num_clients,), maxval=0.5)
    chosen = jnp.argsort(priority)[:slots]
    mask = joined[chosen]
    # The cohort's order carries no information: sampled ids ascending, then the padding ascending.
    order = jnp.argsort(jnp.where(mask, 0, num_clients) + chosen)
    return chosen[order].astype(jnp.int32), mask[order]
