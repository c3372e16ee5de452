"""The cohort loop: one client function over the cohort, vmapped, a chunk at a time, over a device mesh.

Three ways to bound or spread the work, which compose and never change a result beyond float tolerance:

* ``chunk_size``: clients trained at once; the rest wait in a ``lax.map`` / ``lax.scan`` over chunks.
* ``reduce``: instead of stacking every client's message ``[m, |params|]``, each chunk's messages are reduced
  to their sums as the chunk finishes and added to a running total (streaming aggregation).
* ``mesh``: the cohort is split over the mesh's ``clients`` axis with ``jax.shard_map``; each device runs its
  share (chunked as above), per-client outputs stay sharded by client, and the sums are added across devices
  with ``psum`` (the aggregation collective). What every client reads (the server state, the training
  arrays) is replicated: pass it as ``shared``, not in the client function's closure. JAX's ``shard_map``
  rejects a closed-over array that carries its own sharding over the mesh, which every output of an earlier
  sharded call does (the state carried from one block of rounds to the next): ``jnp.zeros_like`` of such a
  value inside the map, as optax's momentum does, fails with "Context mesh ... should match the mesh of
  sharding".
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

CLIENTS = "clients"
"""The name of the mesh axis the cohort is split over."""


def _chunked(stacked: Any, num_chunks: int) -> Any:
    return jax.tree.map(lambda x: x.reshape((num_chunks, x.shape[0] // num_chunks) + x.shape[1:]), stacked)


def _unchunked(stacked: Any) -> Any:
    return jax.tree.map(lambda x: x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:]), stacked)


def _map_local(fn: Callable[..., Any], chunk_size: int | None, reduce: Callable[..., Any] | None,
               stacked: tuple) -> Any:
    cohort_size = jax.tree.leaves(stacked)[0].shape[0]
    chunk_size = chunk_size or cohort_size
    num_chunks = cohort_size // chunk_size
    if reduce is None:
        if num_chunks == 1:
            return jax.vmap(fn)(*stacked)
        return _unchunked(jax.lax.map(lambda args: jax.vmap(fn)(*args), _chunked(stacked, num_chunks)))

    def chunk_sums(args):
        first, *rest = jax.vmap(fn)(*args)
        return reduce(first, *args), tuple(rest)

    if num_chunks == 1:
        total, rest = chunk_sums(stacked)
        return (total, *rest)
    chunks = _chunked(stacked, num_chunks)
    # Tracing the clients' work is most of a build's time: jitted, the chunk is traced once, for the shapes of
    # the running total, and the scan's body reuses that trace from JAX's cache (XLA inlines the call).
    chunk_sums = jax.jit(chunk_sums)
    first_chunk = jax.tree.map(lambda x: x[0], chunks)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(chunk_sums, first_chunk)[0])

    def one_chunk(total, args):
        sums, rest = chunk_sums(args)
        return jax.tree.map(jnp.add, total, sums), rest

    total, rest = jax.lax.scan(one_chunk, zeros, chunks)
    return (total, *_unchunked(rest))


def map_cohort(fn: Callable[..., Any], chunk_size: int | None, *stacked: Any,
               shared: tuple = (), reduce: Callable[..., Any] | None = None, mesh: Mesh | None = None) -> Any:
    """``vmap(fn)`` over the leading (cohort) axis of ``stacked``, ``chunk_size`` clients at a time.

    Args:
      fn: one client's work, ``fn(*shared, *one_client's_inputs)``, returning a tuple (``(message, state,
        metrics)``).
      chunk_size: clients at once on each device; ``None``: all of a device's share. Must divide the share.
      *stacked: per-client inputs with a leading cohort axis.
      shared: inputs every client reads whole (the server state, the round), replicated on every device.
      reduce: ``(first_outputs, *stacked_inputs) -> sums`` of a chunk, additive over chunks. When given, the
        first output comes back as its sums over the whole cohort instead of stacked.
      mesh: a mesh with a ``clients`` axis to split the cohort over; ``None``: the default device.

    Returns:
      ``fn``'s outputs stacked over the cohort (the first one reduced, when ``reduce`` is given).
    """
    if mesh is None or mesh.shape[CLIENTS] == 1:
        return _map_local(functools.partial(fn, *shared), chunk_size, reduce, stacked)

    def local(replicated, *share):
        out = _map_local(functools.partial(fn, *replicated), chunk_size, reduce, share)
        if reduce is None:
            return out
        return jax.lax.psum(out[0], CLIENTS), tuple(out[1:])

    in_specs = (P(), *(P(CLIENTS) for _ in stacked))
    sharded = functools.partial(jax.shard_map, local, mesh=mesh, in_specs=in_specs, axis_names={CLIENTS},
                                check_vma=False)
    if reduce is None:
        return sharded(out_specs=P(CLIENTS))(tuple(shared), *stacked)
    total, rest = sharded(out_specs=(P(), P(CLIENTS)))(tuple(shared), *stacked)
    return (total, *rest)
