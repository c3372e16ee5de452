"""The round and the run: sample a cohort, vmap its clients, aggregate, scan over rounds.

A plan with a delay or a server buffer runs the asynchronous round of :mod:`fedjax_lab.engine.asynchrony`
instead: the same clients' training, whose messages arrive in later rounds.

One round, as data flows through it::

    ids                  = sample_cohort(key(seed, round, COHORT))
    messages, states, m  = vmap(client_update)(server_state, client_states[ids], clients[ids], keys[ids])
    server_state, m      = server_update(server_state, messages, cohort, context)
    client_states        = client_states.at[ids].set(states)

``run_rounds`` scans that round ``num_rounds`` times inside one ``jax.jit``; the host only sees the state
between such blocks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from fedjax_lab.engine import randomness
from fedjax_lab.engine.aggregation import masked_mean
from fedjax_lab.engine.asynchrony import DelayModel, init_async_state, run_async_round, store_capacity
from fedjax_lab.engine.cohort_loop import CHUNK, CLIENTS, balanced_order, map_cohort
from fedjax_lab.engine.sampling import sample_cohort, sample_poisson_cohort
from fedjax_lab.engine.tree_math import tree_put, tree_select, tree_stack_copies, tree_take
from fedjax_lab.engine.types import (
    Algorithm,
    Arrays,
    ClientData,
    Cohort,
    LoopState,
    Params,
    Reduced,
    ServerContext,
)


class RoundInputs(NamedTuple):
    """The device-resident inputs of every round; passed to the compiled block as arguments, not baked in.

    Attributes:
      key: the run's root key (from the seed).
      train_arrays: pooled training arrays, e.g. ``{'x': [n, ...], 'y': [n]}``.
      client_example_ids: int32 ``[num_clients, max_examples]``, each client's rows into ``train_arrays``.
      client_num_examples: int32 ``[num_clients]``.
      server_arrays: data held by the server (may be empty).
      hparams: the run's hyper-parameters as arrays (``fedjax_lab/experiments/hyperparams.py``), read by an
        algorithm built inside the round; ``None`` when the algorithm was built with constants.
    """

    key: jax.Array
    train_arrays: Arrays
    client_example_ids: jax.Array
    client_num_examples: jax.Array
    server_arrays: Arrays
    hparams: Any = None


@dataclasses.dataclass(frozen=True)
class CohortPlan:
    """How the cohort is drawn and processed.

    Attributes:
      num_clients: population size N.
      cohort_size: clients per round m; with ``sampling_rate``, the cohort's slots (the most clients a round
        trains).
      chunk_size: clients trained at once; the cohort is processed in ``m / chunk_size`` sequential chunks
        (bounded memory), each vmapped. ``None`` vmaps the whole cohort. Results do not depend on it.
      delay: the asynchronous round's :class:`~fedjax_lab.engine.asynchrony.DelayModel`; ``None`` (and no
        ``buffer_size``): the synchronous round.
      buffer_size: the server steps each time this many messages have arrived (FedBuff's buffer; implies the
        asynchronous round, with zero delay unless ``delay`` says otherwise); ``None``: once per round.
      max_in_flight: at most this many jobs in flight (the store's capacity); default the most that can be.
      mesh: a device mesh with a ``clients`` axis (:func:`fedjax_lab.engine.sharding.client_mesh`): the cohort
        is split over its devices, each training its share ``chunk_size`` clients at a time; ``None``: one
        device.
      aggregation: ``'streaming'`` reduces each chunk's messages as it finishes (and across devices) when the
        algorithm's server update reads only their sums (``Algorithm.reduce``); ``'stacked'`` always keeps
        every message; ``'auto'`` streams whenever the cohort is chunked or sharded and the algorithm allows
        it.
      sampling_rate: Poisson sampling: each client joins a round independently with this probability, the
        cohort truncated to ``cohort_size`` slots (:func:`~fedjax_lab.engine.sampling.sample_poisson_cohort`;
        the unfilled slots train but are masked out of the aggregate, the metrics and the client states).
        ``None``: ``cohort_size`` clients drawn uniformly without replacement.
      cohort_order: ``'sampled'`` trains the cohort in the order drawn (ids ascending); ``'balanced'``
        trains it reordered by the clients' local work (:func:`~fedjax_lab.engine.cohort_loop.balanced_order`,
        their example counts) where that can matter (the synchronous round, several devices or several
        chunks a device): with local epochs over unequal datasets, chunks of similar clients mask fewer
        steps and the devices finish together. The messages, client states and metrics are put back in the
        order drawn, so the server update sees what it would have; only streamed sums add in another order
        (float rounding).
    """

    num_clients: int
    cohort_size: int
    chunk_size: int | None = None
    delay: DelayModel | None = None
    buffer_size: int | None = None
    max_in_flight: int | None = None
    mesh: Mesh | None = None
    aggregation: Literal["auto", "streaming", "stacked"] = "auto"
    sampling_rate: float | None = None
    cohort_order: Literal["sampled", "balanced"] = "sampled"

    def __post_init__(self):
        if not 1 <= self.cohort_size <= self.num_clients:
            raise ValueError(f"cohort_size must be in [1, num_clients={self.num_clients}], got "
                             f"{self.cohort_size}")
        if self.cohort_size % self.num_devices:
            raise ValueError(f"cohort_size must be a multiple of the mesh's {self.num_devices} devices, got "
                             f"{self.cohort_size}")
        share = self.cohort_size // self.num_devices
        if self.chunk_size is not None and (self.chunk_size < 1 or share % self.chunk_size):
            raise ValueError(f"chunk_size must divide each device's share of the cohort ({share} clients), "
                             f"got {self.chunk_size}")
        if self.aggregation not in ("auto", "streaming", "stacked"):
            raise ValueError(f"aggregation must be 'auto', 'streaming' or 'stacked', got "
                             f"{self.aggregation!r}")
        if self.buffer_size is not None and self.buffer_size < 1:
            raise ValueError(f"buffer_size must be >= 1, got {self.buffer_size}")
        if self.max_in_flight is not None and self.max_in_flight < self.cohort_size:
            raise ValueError(f"max_in_flight must be >= cohort_size={self.cohort_size}, got "
                             f"{self.max_in_flight}")
        if self.sampling_rate is not None and not 0 < self.sampling_rate <= 1:
            raise ValueError(f"sampling_rate must be in (0, 1], got {self.sampling_rate}")
        if self.cohort_order not in ("sampled", "balanced"):
            raise ValueError(f"cohort_order must be 'sampled' or 'balanced', got {self.cohort_order!r}")
        if self.sampling_rate is not None and self.asynchronous:
            raise ValueError("Poisson sampling (sampling_rate) runs in the synchronous round only")

    @property
    def num_devices(self) -> int:
        """Devices the cohort is split over."""
        return 1 if self.mesh is None else self.mesh.shape[CLIENTS]

    def streams(self, algorithm: Algorithm) -> bool:
        """Whether the synchronous round reduces messages as chunks finish instead of stacking them."""
        if algorithm.reduce is None or self.aggregation == "stacked":
            return False
        chunked = self.chunk_size is not None and self.chunk_size < self.cohort_size // self.num_devices
        return self.aggregation == "streaming" or chunked or self.num_devices > 1

    @property
    def share(self) -> int:
        """Clients of a cohort each device trains."""
        return self.cohort_size // self.num_devices

    @property
    def balances(self) -> bool:
        """Whether the synchronous round reorders its cohort (``cohort_order='balanced'`` where the order can
        change the work: several devices, or several chunks of several clients on each)."""
        split = self.num_devices > 1 or 1 < (self.chunk_size or self.share) < self.share
        return self.cohort_order == "balanced" and split and not self.asynchronous

    @property
    def asynchronous(self) -> bool:
        """Whether rounds run :func:`~fedjax_lab.engine.asynchrony.run_async_round`."""
        return self.delay is not None or self.buffer_size is not None

    @property
    def delay_model(self) -> DelayModel:
        """``delay``, or zero delay."""
        return self.delay or DelayModel()

    @property
    def capacity(self) -> int:
        """The in-flight store's slots (:func:`~fedjax_lab.engine.asynchrony.store_capacity`)."""
        return store_capacity(self.num_clients, self.cohort_size, self.delay_model, self.max_in_flight)


def message_shapes(algorithm: Algorithm, params: Params, inputs: RoundInputs,
                   client_update: Callable[..., Any] | None = None, chunk_size: int = 1) -> Any:
    """The shapes of one client's message (``jax.eval_shape`` of the client update; nothing is computed).

    ``client_update``: the :func:`traced_once` function the rounds will run (``make_run_rounds``'s argument of
    that name), traced here for round 0 with the arguments a round passes it, under a vmap named
    :data:`~fedjax_lab.engine.cohort_loop.CHUNK` of the round's ``chunk_size`` clients: JAX keeps that trace
    (its key holds the named axis and its size), and the round, which vmaps the same function over its
    chunks, reuses it instead of tracing the client's training again.
    """

    def message(params, inputs):
        server_state = algorithm.server_init(params)
        client_state = algorithm.client_init(server_state)
        client = ClientData(jnp.zeros((), jnp.int32), inputs.client_example_ids[0],
                            inputs.client_num_examples[0], randomness.data_key(inputs.key, 0))
        if client_update is not None:  # under the chunk's named vmap, as the round calls it
            r = jnp.zeros((), jnp.int32)
            key = randomness.client_key(inputs.key, r, 0)

            def one(client_state, client, key):
                return client_update(server_state, r, inputs, client_state, client, key)[0]

            stacked = jax.tree.map(lambda x: jnp.broadcast_to(x, (chunk_size, *jnp.shape(x))),
                                   (client_state, client, key))
            return jax.tree.map(lambda x: x[0], jax.vmap(one, axis_name=CHUNK)(*stacked))
        return algorithm.client_update(server_state, client_state, client, inputs.train_arrays, inputs.key)[0]

    return jax.eval_shape(message, params, inputs)


def init_loop_state(algorithm: Algorithm, params: Params, num_clients: int, plan: CohortPlan | None = None,
                    inputs: RoundInputs | None = None, messages: Any = None) -> LoopState:
    """The state before round 0: the server's, ``num_clients`` copies of the initial client state, and for an
    asynchronous ``plan`` an empty in-flight store and buffer (shaped from a message for ``inputs``, or from
    ``messages``, one client's message shapes when already known: tracing a client update is not free)."""
    server_state = algorithm.server_init(params)
    client_states = tree_stack_copies(algorithm.client_init(server_state), num_clients)
    asynchrony = None
    if plan is not None and plan.asynchronous:
        if inputs is None:
            raise ValueError("an asynchronous plan needs the round inputs to shape its in-flight store")
        if messages is None:
            messages = message_shapes(algorithm, params, inputs)
        asynchrony = init_async_state(messages, plan.capacity, plan.buffer_size)
    return LoopState(server_state, client_states, jnp.zeros((), jnp.int32), asynchrony)


AlgorithmAt = Callable[[RoundInputs, jax.Array], Algorithm]
"""``algorithm_at(inputs, round) -> Algorithm``: an algorithm built inside the compiled round from the run's
hyper-parameters (``inputs.hparams``, e.g. a learning rate on its schedule) and key."""


def client_update_of(algorithm: Algorithm | AlgorithmAt) -> Callable[..., Any]:
    """``(server_state, round, inputs, client_state, client, key) -> (message, client_state, metrics)``:
    the method's client update with everything it reads as arguments (an algorithm built inside the round is
    built again from them), for :func:`map_cohort`'s ``shared`` inputs."""

    def client_update(server_state, r, inputs, client_state, client, key):
        built = algorithm(inputs, r) if callable(algorithm) else algorithm
        return built.client_update(server_state, client_state, client, inputs.train_arrays, key)

    return client_update


def traced_once(algorithm: Algorithm | AlgorithmAt) -> Callable[..., Any]:
    """:func:`client_update_of`, jitted: every trace of the round that calls this one function object with
    the same shapes (each block length's, the memory check's, :func:`message_shapes`') reuses JAX's trace of
    the client's training instead of tracing it again. Inside the compiled round XLA inlines the call, so the
    program computes what the plain function would."""
    return jax.jit(client_update_of(algorithm))


def run_round(algorithm: Algorithm | AlgorithmAt, plan: CohortPlan, state: LoopState, inputs: RoundInputs,
              client_update: Callable[..., Any] | None = None):
    """One round: ``(state, inputs) -> (state, metrics)``. Pure; see the module docstring. ``algorithm`` is an
    :class:`Algorithm`, or a function building one for the round (:data:`AlgorithmAt`); ``client_update``, its
    :func:`client_update_of` (default) or :func:`traced_once`."""
    r, algorithm_at = state.round, algorithm
    if callable(algorithm):
        algorithm = algorithm(inputs, r)
    client_update = client_update or client_update_of(algorithm_at)
    if plan.asynchronous:
        return run_async_round(algorithm, dataclasses.replace(plan, delay=plan.delay_model), state, inputs,
                               client_update=client_update)
    cohort_key = randomness.round_key(inputs.key, r, randomness.Purpose.COHORT)
    if plan.sampling_rate is None:
        ids, mask = sample_cohort(cohort_key, plan.num_clients, plan.cohort_size), None
    else:
        ids, mask = sample_poisson_cohort(cohort_key, plan.num_clients, plan.cohort_size, plan.sampling_rate)
    clients = ClientData(ids, inputs.client_example_ids[ids], inputs.client_num_examples[ids],
                         jax.vmap(lambda i: randomness.data_key(inputs.key, i))(ids))
    keys = jax.vmap(lambda i: randomness.client_key(inputs.key, r, i))(ids)
    masks = () if mask is None else (mask,)  # travels with each client, so that chunks see their own

    def client_fn(server_state, r, inputs, client_state, client, key, *_):
        return client_update(server_state, r, inputs, client_state, client, key)

    def reduce(messages, client_states, clients, keys, *mask):
        return algorithm.reduce(messages, Cohort(clients.client_id, clients.num_examples, *mask))

    streams = plan.streams(algorithm)
    old_client_states = tree_take(state.client_states, ids)
    stacked = (old_client_states, clients, keys, *masks)
    if plan.balances:  # trained in a balanced order; the server still sees the cohort in the order drawn
        order = balanced_order(clients.num_examples, num_devices=plan.num_devices,
                               chunk_size=plan.chunk_size or plan.share)
        stacked = tree_take(stacked, order)
    messages, new_client_states, client_metrics = map_cohort(
        client_fn, plan.chunk_size, *stacked, shared=(state.server_state, r, inputs),
        reduce=reduce if streams else None, mesh=plan.mesh)
    if plan.balances:
        drawn = jnp.argsort(order)
        new_client_states, client_metrics = tree_take((new_client_states, client_metrics), drawn)
        messages = messages if streams else tree_take(messages, drawn)
    if streams:
        messages = Reduced(messages)
    context = ServerContext(randomness.round_key(inputs.key, r, randomness.Purpose.SERVER), r,
                            inputs.server_arrays, plan.num_clients)
    server_state, server_metrics = algorithm.server_update(
        state.server_state, messages, Cohort(ids, clients.num_examples, mask), context)
    if mask is None:
        metrics = {name: jnp.mean(value) for name, value in client_metrics.items()}
    else:  # the padding slots trained too, but did not take part
        metrics = {name: masked_mean(value, mask) for name, value in client_metrics.items()}
        metrics["cohort_size"] = jnp.sum(mask.astype(jnp.int32))
        new_client_states = tree_select(mask, new_client_states, old_client_states)
    metrics.update(server_metrics)
    client_states = tree_put(state.client_states, ids, new_client_states)
    return state._replace(server_state=server_state, client_states=client_states, round=r + 1), metrics


def _inside_a_trace() -> bool:
    try:
        from jax._src.core import trace_state_clean
    except ImportError:  # a JAX without it: every call is taken as a top-level one
        return False
    return not trace_state_clean()


class _OptionsAtTopLevel:
    """A function jitted twice, with XLA compiler options and without: called at the top level it runs the
    first; called inside another trace (``jax.eval_shape``, an outer ``jit``), where JAX refuses compiler
    options, the second, which the outer program compiles with its own. Attributes (``lower``, ``trace``,
    ``eval_shape``) are the first's."""

    def __init__(self, with_options, without):
        self._with_options, self._without = with_options, without

    def __call__(self, *args, **kwargs):
        return (self._without if _inside_a_trace() else self._with_options)(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._with_options, name)


def jit_with_options(fun: Callable, compiler_options: dict[str, str] | None = None, **jit_kwargs):
    """``jax.jit(fun, compiler_options=..., **jit_kwargs)`` that can also be called inside another trace:
    without options, the jitted function itself; with them, both jits behind one callable
    (:class:`_OptionsAtTopLevel`)."""
    if not compiler_options:
        return jax.jit(fun, **jit_kwargs)
    return _OptionsAtTopLevel(jax.jit(fun, compiler_options=compiler_options, **jit_kwargs),
                              jax.jit(fun, **jit_kwargs))


def make_run_rounds(algorithm: Algorithm | AlgorithmAt, plan: CohortPlan, donate: bool = False,
                    compiler_options: dict[str, str] | None = None,
                    client_update: Callable[..., Any] | None = None):
    """A jitted ``run_rounds(state, inputs, num_rounds) -> (state, metrics)``: ``num_rounds`` rounds in one
    ``lax.scan``; each metric comes back with a leading ``num_rounds`` axis. With ``donate`` the new state is
    written over the old one's buffers (the state passed in is deleted), so a large population's client states
    are held once, not twice. ``compiler_options`` go to XLA's compiler (e.g. the CPU's matrix-product
    library) where ``run_rounds`` is called at the top level (:func:`jit_with_options`). ``client_update``:
    the algorithm's :func:`traced_once` (default: made here), passed when :func:`message_shapes` traced it
    already."""
    client_update = client_update or traced_once(algorithm)

    def run_rounds(state: LoopState, inputs: RoundInputs, num_rounds: int):
        return jax.lax.scan(lambda s, _: run_round(algorithm, plan, s, inputs, client_update), state, None,
                            length=num_rounds)

    return jit_with_options(run_rounds, compiler_options, static_argnames="num_rounds",
                            donate_argnums=(0,) if donate else ())
