"""Key derivation: every key is a pure function of ``(seed, round, client_id, purpose)``.

Keys are derived with ``fold_in`` rather than split and threaded through the loop, so a client's
randomness does not depend on which chunk, device or position in the cohort it was processed in, nor on
whether the cohort was vmapped or looped over.
"""

from __future__ import annotations

import enum
import zlib

import jax


class Purpose(enum.IntEnum):
    """What a derived key is used for; distinct purposes give independent streams."""

    COHORT = 0
    CLIENT = 1
    SERVER = 2
    SHUFFLE = 3
    STEP = 4
    INIT = 5
    DATA = 6
    DELAY = 7


def base_key(seed: int) -> jax.Array:
    """The root key of a run."""
    return jax.random.key(seed)


def round_key(key: jax.Array, round_index: jax.Array, purpose: Purpose) -> jax.Array:
    """The key for ``purpose`` in round ``round_index``."""
    return jax.random.fold_in(jax.random.fold_in(key, round_index), purpose)


def client_key(key: jax.Array, round_index: jax.Array, client_id: jax.Array) -> jax.Array:
    """The key of client ``client_id`` in round ``round_index``; independent of cohort position."""
    return jax.random.fold_in(round_key(key, round_index, Purpose.CLIENT), client_id)


def data_key(key: jax.Array, client_id: jax.Array) -> jax.Array:
    """Client ``client_id``'s key for the whole run, the same in every round (a fixed batch order)."""
    return jax.random.fold_in(jax.random.fold_in(key, Purpose.DATA + 1_000_003), client_id)


def init_key(key: jax.Array) -> jax.Array:
    """The key that initialises the model."""
    return jax.random.fold_in(key, Purpose.INIT + 1_000_003)


def named_key(key: jax.Array, name: str) -> jax.Array:
    """A key of ``key``'s stream reserved for ``name`` (a stable hash of the name): a component's or a
    method's own stream, independent of the others' without a registry of numbers."""
    return jax.random.fold_in(key, zlib.crc32(name.encode()) & 0x7FFFFFFF)


def setup_key(key: jax.Array, name: str) -> jax.Array:
    """Method ``name``'s key for what it draws once, before the rounds (its initial state: FedImpro's initial
    statistics, VHL's virtual data, a surrogate head), from the run's root ``key``: a stream of the model's
    initialisation reserved for the method."""
    return named_key(init_key(key), name)
