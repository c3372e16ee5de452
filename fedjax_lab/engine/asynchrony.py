"""The asynchronous round: clients report after a random delay, inside the same pure, scanned round.

Each round ``r``, in this order:

1. **dispatch**: up to ``m`` clients are drawn uniformly from the idle ones (a client whose job is in flight
   is never drawn); fewer when fewer are idle or the store is full, the rest masked;
2. **train**: each dispatched client trains from ``w^r``, exactly as in the synchronous round (same keys), and
   its message, with a delay ``tau`` drawn from the :class:`DelayModel`, goes into the in-flight store;
3. **arrive**: every job with ``dispatch_round + tau == r`` arrives (``tau = 0``: in the round it was sent),
   in the order (dispatch round, position in its cohort), with staleness ``r - dispatch_round = tau``;
4. **server**: with ``buffer_size`` unset the server steps once on the round's arrivals (none: no step);
   with ``buffer_size = B`` each arrival joins a buffer and the server steps on it each time it holds ``B``
   messages, possibly several times in a round (FedBuff); a partial buffer waits for later rounds.

Computing a client's update at dispatch and holding it until arrival is exact: it depends only on the model
it was sent, its data and its key. Per-client state (SCAFFOLD's control variate) is written back at dispatch,
which is also exact, since a busy client is not drawn again before it arrives.

The store has a fixed capacity ``P`` (:func:`store_capacity`): at most ``m`` jobs a round each stay at most
``max_delay`` rounds, so ``P = min(N, m (max_delay + 1))`` never overflows; a smaller ``max_in_flight`` limits
how many clients train at once (FedBuff's concurrency), reported as ``not_dispatched``. docs/asynchronous.md
states the semantics and the memory cost.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_lab.engine import randomness
from fedjax_lab.engine.aggregation import masked_mean
from fedjax_lab.engine.cohort_loop import map_cohort
from fedjax_lab.engine.tree_math import tree_put, tree_take, tree_where
from fedjax_lab.engine.types import Algorithm, ClientData, Cohort, PyTree, ServerContext

DelayKind = Literal["zero", "fixed", "half_normal"]
Rounding = Literal["round", "floor", "ceil"]


@dataclasses.dataclass(frozen=True)
class DelayModel:
    """How many rounds a job takes to arrive, drawn per job.

    Attributes:
      kind: ``zero`` (every job arrives in the round it was sent: the synchronous round), ``fixed`` (always
        ``rounds``) or ``half_normal`` (``|N(0, sigma^2)|``, FedBuff's and Feddle's delay model).
      sigma: the half-normal's scale (Feddle's N(5), N(20)).
      rounds: the fixed delay.
      max_delay: delays are clipped to it; default ``ceil(4 sigma)`` (``P(|N| > 4 sigma) = 6e-5``), ``rounds``
        or 0. It sizes the in-flight store.
      rounding: how a half-normal draw becomes whole rounds.
    """

    kind: DelayKind = "zero"
    sigma: float = 0.0
    rounds: int = 0
    max_delay: int | None = None
    rounding: Rounding = "round"

    def __post_init__(self):
        if self.kind not in ("zero", "fixed", "half_normal"):
            raise ValueError(f"delay kind must be zero, fixed or half_normal, got {self.kind!r}")
        if self.rounding not in ("round", "floor", "ceil"):
            raise ValueError(f"delay rounding must be round, floor or ceil, got {self.rounding!r}")
        if self.sigma < 0 or self.rounds < 0 or (self.max_delay is not None and self.max_delay < 0):
            raise ValueError("delay sigma, rounds and max_delay must be >= 0")

    @property
    def cap(self) -> int:
        """The longest delay a job can get, in rounds."""
        if self.max_delay is not None:
            return self.max_delay
        return {"zero": 0, "fixed": self.rounds, "half_normal": math.ceil(4 * self.sigma)}[self.kind]

    def sample(self, key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
        """int32 delays of ``shape``, in ``[0, cap]``."""
        if self.kind == "zero":
            delays = jnp.zeros(shape, jnp.int32)
        elif self.kind == "fixed":
            delays = jnp.full(shape, self.rounds, jnp.int32)
        else:
            draw = jnp.abs(self.sigma * jax.random.normal(key, shape))
            delays = {"round": jnp.round, "floor": jnp.floor,
                      "ceil": jnp.ceil}[self.rounding](draw).astype(jnp.int32)
        return jnp.minimum(delays, self.cap)


def store_capacity(num_clients: int, cohort_size: int, delay: DelayModel,
                   max_in_flight: int | None = None) -> int:
    """``P``: the in-flight store's slots, ``min(N, m (cap + 1), max_in_flight)``. Jobs of the last ``cap``
    rounds and this round's are the most that can be in flight at once, and no more than ``N`` clients can be
    busy."""
    bound = min(num_clients, cohort_size * (delay.cap + 1))
    return bound if max_in_flight is None else min(bound, max_in_flight)


class InFlight(NamedTuple):
    """The jobs in flight, ``P`` slots (leading axis of every field); a free slot has ``occupied`` false."""

    messages: PyTree
    client_id: jax.Array
    num_examples: jax.Array
    dispatch_round: jax.Array
    arrival_round: jax.Array
    position: jax.Array
    occupied: jax.Array


class Buffer(NamedTuple):
    """The server's buffer of arrived messages, ``B`` slots; the first ``fill`` are taken."""

    messages: PyTree
    client_id: jax.Array
    num_examples: jax.Array
    staleness: jax.Array
    fill: jax.Array


class AsyncState(NamedTuple):
    """What the asynchronous round carries besides the server and client states."""

    in_flight: InFlight
    buffer: Buffer | None


def _zeros(shapes: PyTree, n: int) -> PyTree:
    return jax.tree.map(lambda s: jnp.zeros((n,) + tuple(s.shape), s.dtype), shapes)


def init_async_state(message_shapes: PyTree, capacity: int, buffer_size: int | None) -> AsyncState:
    """An empty store of ``capacity`` slots and an empty buffer of ``buffer_size`` (``None``: no buffer), for
    messages shaped like ``message_shapes`` (one client's, e.g. from ``jax.eval_shape``)."""
    ints = lambda n: jnp.zeros((n,), jnp.int32)
    store = InFlight(_zeros(message_shapes, capacity), ints(capacity), ints(capacity), ints(capacity),
                     ints(capacity), ints(capacity), jnp.zeros((capacity,), bool))
    buffer = None
    if buffer_size is not None:
        buffer = Buffer(_zeros(message_shapes, buffer_size), ints(buffer_size), ints(buffer_size),
                        ints(buffer_size), jnp.zeros((), jnp.int32))
    return AsyncState(store, buffer)


def message_bytes(message_shapes: PyTree) -> int:
    """Bytes of one message."""
    return sum(math.prod(s.shape) * jnp.dtype(s.dtype).itemsize for s in jax.tree.leaves(message_shapes))


def store_bytes(message_shapes: PyTree, capacity: int, buffer_size: int | None) -> int:
    """Bytes the asynchronous round needs: ``capacity`` messages in flight, and ``buffer_size`` buffered or,
    without a buffer, one more copy of the store (the arrivals, the rest zeroed) while the server steps on
    it."""
    return message_bytes(message_shapes) * (capacity + (buffer_size or capacity))


def check_store_memory(message_shapes: PyTree, capacity: int, buffer_size: int | None, budget: int) -> None:
    """Raises ``ValueError`` (before compiling) when the in-flight store and buffer need more than ``budget``
    bytes, naming what to lower."""
    need = store_bytes(message_shapes, capacity, buffer_size)
    if need > budget:
        per = message_bytes(message_shapes)
        raise ValueError(f"the asynchronous round's in-flight store needs {need / 2**30:.2f} GiB ({capacity} "
                         f"jobs + {buffer_size or capacity} more, {per / 2**20:.1f} MiB a message), more "
                         f"than the {budget / 2**30:.2f} GiB budget (half the device's memory); lower "
                         f"asynchrony.max_delay or asynchrony.max_in_flight (or rounds.clients_per_round)")


def sample_idle(key: jax.Array, busy: jax.Array, cohort_size: int,
                room: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Up to ``cohort_size`` distinct clients drawn uniformly from those not ``busy``, at most ``room`` of
    them.

    Returns ``(ids, dispatched)``: int32 ``[m]`` ids, the dispatched ones first and sorted (padded with busy
    clients, masked), and the bool mask. With no client busy and room for all, ``ids`` equals
    :func:`~fedjax_lab.engine.sampling.sample_cohort` of the same key: the asynchronous round with zero delay
    is the synchronous round.
    """
    num_clients = busy.shape[0]
    perm = (jnp.arange(num_clients) if cohort_size == num_clients
            else jax.random.permutation(key, num_clients))
    candidates = perm[jnp.argsort(busy[perm], stable=True)][:cohort_size]  # idle ones first, in random order
    count = jnp.minimum(jnp.sum(~busy), room)
    dispatched = jnp.arange(cohort_size) < count
    ids = jnp.sort(jnp.where(dispatched, candidates, candidates + num_clients))
    return jnp.where(ids >= num_clients, ids - num_clients, ids).astype(jnp.int32), dispatched


def _busy(store: InFlight, num_clients: int) -> jax.Array:
    return jnp.zeros((num_clients,), bool).at[store.client_id].max(store.occupied)


def _insert(store: InFlight, dispatched: jax.Array, messages: PyTree, ids: jax.Array, num_examples: jax.Array,
            round_index: jax.Array, delays: jax.Array) -> InFlight:
    """``store`` with the dispatched jobs in its first free slots."""
    capacity, m = store.occupied.shape[0], ids.shape[0]
    slots = jnp.nonzero(~store.occupied, size=m, fill_value=capacity)[0]
    slots = jnp.where(dispatched, slots, capacity)  # out of range: dropped
    put = lambda a, rows: a.at[slots].set(rows, mode="drop")
    return InFlight(jax.tree.map(put, store.messages, messages), put(store.client_id, ids),
                    put(store.num_examples, num_examples),
                    put(store.dispatch_round, jnp.full((m,), round_index)),
                    put(store.arrival_round, round_index + delays), put(store.position, jnp.arange(m)),
                    put(store.occupied, jnp.ones((m,), bool)))


def _skip_metrics(step, *args):
    """Zeros shaped like the metrics of ``step(*args)`` (the branch of a ``cond`` that does not step)."""
    shapes = jax.eval_shape(step, *args)[-1]
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def arrival_order(store: InFlight, arrived: jax.Array, cohort_size: int) -> jax.Array:
    """The store's slots with the round's arrivals first, in arrival order (dispatch round, then position in
    its cohort), then the other slots."""
    rank = store.dispatch_round * cohort_size + store.position
    return jnp.argsort(jnp.where(arrived, rank, jnp.iinfo(jnp.int32).max), stable=True)


def _step_on_arrivals(algorithm: Algorithm, server_state: PyTree, store: InFlight, arrived: jax.Array,
                      staleness: jax.Array, context: ServerContext, cohort_size: int):
    """One server step on the round's arrivals (the whole store, masked, arrivals first in arrival order: a
    method that keeps some of them, as Feddle's atlas, keeps the newest); none when nothing arrived."""
    order = arrival_order(store, arrived, cohort_size)
    arrived, staleness = arrived[order], staleness[order]
    messages = jax.tree.map(lambda x: jnp.where(arrived.reshape((-1,) + (1,) * (x.ndim - 1)), x[order], 0),
                            store.messages)
    cohort = Cohort(store.client_id[order], store.num_examples[order], arrived, staleness)

    def step(s):
        return algorithm.server_update(s, messages, cohort, context)

    return jax.lax.cond(jnp.any(arrived), step, lambda s: (s, _skip_metrics(step, s)), server_state)


def _drain_into_buffer(algorithm: Algorithm, server_state: PyTree, buffer: Buffer, store: InFlight,
                       arrived: jax.Array, staleness: jax.Array, context: ServerContext, cohort_size: int):
    """Appends the arrivals, in order, to the buffer; the server steps on each ``K`` consecutive messages of
    (buffer, arrivals), and the remainder is the new buffer. Returns the server state, the buffer, the mean
    metrics of this round's steps and their number.

    The loop runs once per server step, not per arrival, so the server state (CA2FL's cache of ``N`` models)
    is carried through as few iterations as there are steps."""
    size = buffer.client_id.shape[0]
    order = arrival_order(store, arrived, cohort_size)
    waiting, total = buffer.fill, buffer.fill + jnp.sum(arrived)
    num_steps = total // size

    def gather(first):
        """Messages ``first .. first + K - 1`` of the sequence (buffered ones, then the arrivals in order)."""
        q = first + jnp.arange(size)
        from_buffer = q < waiting
        b, slot = jnp.clip(q, 0, size - 1), order[jnp.clip(q - waiting, 0, order.shape[0] - 1)]

        def pick(in_buffer, in_store):
            mask = from_buffer.reshape((-1,) + (1,) * (in_buffer.ndim - 1))
            return jnp.where(mask, in_buffer[b], in_store[slot])

        return Buffer(jax.tree.map(pick, buffer.messages, store.messages),
                      pick(buffer.client_id, store.client_id), pick(buffer.num_examples, store.num_examples),
                      pick(buffer.staleness, staleness), buffer.fill)

    def step(s, j):
        b = gather(j * size)
        cohort = Cohort(b.client_id, b.num_examples, None, b.staleness)
        return algorithm.server_update(s, b.messages, cohort,
                                       context._replace(key=jax.random.fold_in(context.key, j)))

    zero_metrics = _skip_metrics(step, server_state, jnp.zeros((), jnp.int32))

    def body(carry):
        j, s, summed = carry
        s, metrics = step(s, j)
        return j + 1, s, jax.tree.map(jnp.add, summed, metrics)

    _, server_state, summed = jax.lax.while_loop(lambda c: c[0] < num_steps, body,
                                                 (jnp.zeros((), jnp.int32), server_state, zero_metrics))
    mean = jax.tree.map(lambda t: t / jnp.maximum(num_steps, 1).astype(t.dtype)
                        if jnp.issubdtype(t.dtype, jnp.floating) else t, summed)
    return server_state, gather(num_steps * size)._replace(fill=total - num_steps * size), mean, num_steps


def run_async_round(algorithm: Algorithm, plan: Any, state: Any, inputs: Any,
                    client_update: Callable[..., Any] | None = None):
    """One asynchronous round ``(state, inputs) -> (state, metrics)``; see the module docstring. ``plan`` is a
    :class:`~fedjax_lab.engine.simulation.CohortPlan` with a ``delay``; ``state.asynchrony`` an
    :class:`AsyncState`. ``client_update``: ``algorithm``'s, taking the server state, the round and the
    inputs as arguments (:func:`~fedjax_lab.engine.simulation.client_update_of`); default: ``algorithm``'s
    own."""
    r, store, buffer = state.round, state.asynchrony.in_flight, state.asynchrony.buffer
    capacity, m = store.occupied.shape[0], plan.cohort_size
    ids, dispatched = sample_idle(randomness.round_key(inputs.key, r, randomness.Purpose.COHORT),
                                  _busy(store, plan.num_clients), m, capacity - jnp.sum(store.occupied))
    clients = ClientData(ids, inputs.client_example_ids[ids], inputs.client_num_examples[ids],
                         jax.vmap(lambda i: randomness.data_key(inputs.key, i))(ids))
    keys = jax.vmap(lambda i: randomness.client_key(inputs.key, r, i))(ids)

    def own_client_update(server_state, r, inputs, client_state, client, key):
        return algorithm.client_update(server_state, client_state, client, inputs.train_arrays, key)

    old_states = tree_take(state.client_states, ids)
    messages, new_states, client_metrics = map_cohort(
        client_update or own_client_update, plan.chunk_size, old_states, clients, keys,
        shared=(state.server_state, r, inputs), mesh=plan.mesh)
    new_states = jax.vmap(tree_where)(dispatched, new_states, old_states)
    client_states = tree_put(state.client_states, ids, new_states)

    delays = plan.delay.sample(randomness.round_key(inputs.key, r, randomness.Purpose.DELAY), (m,))
    store = _insert(store, dispatched, messages, ids, clients.num_examples, r, delays)
    arrived = store.occupied & (store.arrival_round == r)
    staleness = jnp.where(arrived, r - store.dispatch_round, 0)
    context = ServerContext(randomness.round_key(inputs.key, r, randomness.Purpose.SERVER), r,
                            inputs.server_arrays, plan.num_clients)
    if buffer is None:
        server_state, server_metrics = _step_on_arrivals(algorithm, state.server_state, store, arrived,
                                                         staleness, context, m)
        flushes = jnp.any(arrived).astype(jnp.int32)
    else:
        server_state, buffer, server_metrics, flushes = _drain_into_buffer(
            algorithm, state.server_state, buffer, store, arrived, staleness, context, m)
    store = store._replace(occupied=store.occupied & ~arrived)

    metrics = {name: masked_mean(value, dispatched) for name, value in client_metrics.items()}
    metrics.update(server_metrics)
    num_arrivals = jnp.sum(arrived)
    metrics.update({
        "dispatched": jnp.sum(dispatched), "not_dispatched": m - jnp.sum(dispatched),
        "arrivals": num_arrivals, "in_flight": jnp.sum(store.occupied), "server_steps": flushes,
        "staleness_mean": jnp.sum(staleness) / jnp.maximum(num_arrivals, 1),
        "staleness_max": jnp.max(staleness),
        "staleness_counts": jnp.zeros((plan.delay.cap + 1,), jnp.int32).at[staleness].add(arrived),
    })
    if buffer is not None:
        metrics["buffer_fill"] = buffer.fill
    return state._replace(server_state=server_state, client_states=client_states, round=r + 1,
                          asynchrony=AsyncState(store, buffer)), metrics
