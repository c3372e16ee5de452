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

Clients of unequal local work (local epochs over unequal datasets) make a chunk run its heaviest client's
steps (the others are masked) and a device wait for the busiest one. :func:`balanced_order` orders a cohort so
that chunks hold clients of similar work and the devices' totals are even (the round puts the outputs back in
the order drawn, so only the order of float sums changes).
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
CHUNK = "chunk"
"""The axis name of a chunk's clients, vmapped together (a client's work may reduce over it)."""


def balanced_order(work: jax.Array, num_devices: int, chunk_size: int) -> jax.Array:
    """A permutation of the cohort that evens out its chunks' and devices' work: ``stacked[order]`` is then
    split into ``num_devices`` equal shares, each processed ``chunk_size`` clients at a time.

    A chunk takes as long as its heaviest client (the vmapped clients step together), so the clients are
    sorted by ``work``, heaviest first, and cut into chunks of ``chunk_size`` (each chunk's cost:
    ``chunk_size * max(work)`` over its clients). The chunks, heaviest first, go to the device with the least
    work so far that still has room (longest processing time first, with every device taking the same number
    of chunks).

    Args:
      work: ``[m]`` each client's local work (its steps, or anything monotone in them: its examples).
      num_devices: devices the cohort is split over; must divide ``m / chunk_size``.
      chunk_size: clients trained at once on a device; must divide ``m / num_devices``.

    Returns:
      int32 ``[m]``: position ``p`` of the reordered cohort holds client ``order[p]`` of the given one.
    """
    size = work.shape[0]
    if size % (num_devices * chunk_size):
        raise ValueError(f"{num_devices} devices x chunks of {chunk_size} do not divide a cohort of {size}")
    num_chunks = size // chunk_size
    per_device = num_chunks // num_devices
    by_work = jnp.argsort(-work, stable=True)
    cost = chunk_size * work[by_work].reshape(num_chunks, chunk_size)[:, 0].astype(jnp.float32)

    def place(j, carry):
        load, taken, slot = carry
        device = jnp.argmin(jnp.where(taken < per_device, load, jnp.inf))
        slot = slot.at[j].set(device * per_device + taken[device])
        return load.at[device].add(cost[j]), taken.at[device].add(1), slot

    start = (jnp.zeros(num_devices, jnp.float32), jnp.zeros(num_devices, jnp.int32),
             jnp.zeros(num_chunks, jnp.int32))
    _, _, slot = jax.lax.fori_loop(0, num_chunks, place, start)
    positions = (slot[:, None] * chunk_size + jnp.arange(chunk_size)).reshape(-1)
    return jnp.zeros(size, jnp.int32).at[positions].set(by_work.astype(jnp.int32))


def _chunked(stacked: Any, num_chunks: int) -> Any:
    return jax.tree.map(lambda x: x.reshape((num_chunks, x.shape[0] // num_chunks) + x.shape[1:]), stacked)


def _unchunked(stacked: Any) -> Any:
    return jax.tree.map(lambda x: x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:]), stacked)


def _map_local(fn: Callable[..., Any], chunk_size: int | None, reduce: Callable[..., Any] | None,
               stacked: tuple) -> Any:
    cohort_size = jax.tree.leaves(stacked)[0].shape[0]
    chunk_size = chunk_size or cohort_size
    num_chunks = cohort_size // chunk_size
    vmapped = jax.vmap(fn, axis_name=CHUNK)
    if reduce is None:
        if num_chunks == 1:
            return vmapped(*stacked)
        return _unchunked(jax.lax.map(lambda args: vmapped(*args), _chunked(stacked, num_chunks)))

    def chunk_sums(args):
        first, *rest = vmapped(*args)
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
