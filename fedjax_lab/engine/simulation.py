"""The round and the run: sample a cohort, vmap its clients, aggregate, scan over rounds.

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
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_lab.engine import randomness
from fedjax_lab.engine.sampling import sample_cohort
from fedjax_lab.engine.tree_math import tree_put, tree_stack_copies, tree_take
from fedjax_lab.engine.types import Algorithm, Arrays, ClientData, Cohort, LoopState, Params, ServerContext


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
      cohort_size: clients per round m.
      chunk_size: clients trained at once; the cohort is processed in ``m / chunk_size`` sequential chunks
        (bounded memory), each vmapped. ``None`` vmaps the whole cohort. Results do not depend on it.
    """

    num_clients: int
    cohort_size: int
    chunk_size: int | None = None

    def __post_init__(self):
        if not 1 <= self.cohort_size <= self.num_clients:
            raise ValueError(f"cohort_size must be in [1, num_clients={self.num_clients}], got {self.cohort_size}")
        if self.chunk_size is not None and (self.chunk_size < 1 or self.cohort_size % self.chunk_size):
            raise ValueError(f"chunk_size must divide cohort_size={self.cohort_size}, got {self.chunk_size}")


def init_loop_state(algorithm: Algorithm, params: Params, num_clients: int) -> LoopState:
    """The state before round 0: the server's, and ``num_clients`` copies of the initial client state."""
    server_state = algorithm.server_init(params)
    client_states = tree_stack_copies(algorithm.client_init(server_state), num_clients)
    return LoopState(server_state, client_states, jnp.zeros((), jnp.int32))


def map_cohort(fn: Callable[..., Any], chunk_size: int | None, *stacked: Any) -> Any:
    """``vmap(fn)`` over the leading axis of ``stacked``, optionally ``chunk_size`` clients at a time."""
    cohort_size = jax.tree.leaves(stacked)[0].shape[0]
    if chunk_size is None or chunk_size == cohort_size:
        return jax.vmap(fn)(*stacked)
    num_chunks = cohort_size // chunk_size
    chunked = jax.tree.map(lambda x: x.reshape((num_chunks, chunk_size) + x.shape[1:]), stacked)
    out = jax.lax.map(lambda args: jax.vmap(fn)(*args), chunked)
    return jax.tree.map(lambda x: x.reshape((cohort_size,) + x.shape[2:]), out)


AlgorithmAt = Callable[[RoundInputs, jax.Array], Algorithm]
"""``algorithm_at(inputs, round) -> Algorithm``: an algorithm built inside the compiled round from the run's
hyper-parameters (``inputs.hparams``, e.g. a learning rate on its schedule) and key."""


def run_round(algorithm: Algorithm | AlgorithmAt, plan: CohortPlan, state: LoopState, inputs: RoundInputs):
    """One round: ``(state, inputs) -> (state, metrics)``. Pure; see the module docstring. ``algorithm`` is an
    :class:`Algorithm`, or a function building one for the round (:data:`AlgorithmAt`)."""
    r = state.round
    if callable(algorithm):
        algorithm = algorithm(inputs, r)
    ids = sample_cohort(randomness.round_key(inputs.key, r, randomness.Purpose.COHORT),
                        plan.num_clients, plan.cohort_size)
    clients = ClientData(ids, inputs.client_example_ids[ids], inputs.client_num_examples[ids],
                         jax.vmap(lambda i: randomness.data_key(inputs.key, i))(ids))
    keys = jax.vmap(lambda i: randomness.client_key(inputs.key, r, i))(ids)

    def client_fn(client_state, client, key):
        return algorithm.client_update(state.server_state, client_state, client, inputs.train_arrays, key)

    messages, new_client_states, client_metrics = map_cohort(
        client_fn, plan.chunk_size, tree_take(state.client_states, ids), clients, keys)
    context = ServerContext(randomness.round_key(inputs.key, r, randomness.Purpose.SERVER), r,
                            inputs.server_arrays, plan.num_clients)
    server_state, server_metrics = algorithm.server_update(
        state.server_state, messages, Cohort(ids, clients.num_examples), context)
    metrics = {name: jnp.mean(value) for name, value in client_metrics.items()}
    metrics.update(server_metrics)
    client_states = tree_put(state.client_states, ids, new_client_states)
    return LoopState(server_state, client_states, r + 1), metrics


def make_run_rounds(algorithm: Algorithm | AlgorithmAt, plan: CohortPlan):
    """A jitted ``run_rounds(state, inputs, num_rounds) -> (state, metrics)``: ``num_rounds`` rounds in one
    ``lax.scan``; each metric comes back with a leading ``num_rounds`` axis."""

    @functools.partial(jax.jit, static_argnames="num_rounds")
    def run_rounds(state: LoopState, inputs: RoundInputs, num_rounds: int):
        return jax.lax.scan(lambda s, _: run_round(algorithm, plan, s, inputs), state, None, length=num_rounds)

    return run_rounds
