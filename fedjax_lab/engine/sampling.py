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
