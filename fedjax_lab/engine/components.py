"""Components: one method's changes to a FedAvg-shaped round, composed like optax transformations.

A round of FedAvg has fixed joints: each client trains from the global model and sends its delta, the server
averages the deltas and steps its optimiser. A :class:`Component` changes what happens at some of those joints
and nothing else, and owns the state it needs:

* client side: a loss term, a gradient or update transformation, the gradient function, the batch source,
  per-step outputs, and at the end a message part and the client's new state (:class:`ClientView` is what
  these see);
* server side: a transformation of the averaged delta before the server optimiser, and a step after it
  (:class:`ServerView`).

FedProx is a loss term; SCAFFOLD a gradient correction, a message part and a server step on the control
variates; FedNova a message part and an aggregate. Components compose by listing them
(``fedavg(..., proximal(0.01), control_variates())`` is SCAFFOLD + FedProx); each keeps its state under its
own name: ``client_state[name]``, ``server_state.components[name]``, ``messages[name]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_lab.engine import randomness
from fedjax_lab.engine.local_training import GradFn, LocalHooks, LocalStats, LossTerm, StepRecord
from fedjax_lab.engine.types import Arrays, ClientData, Cohort, Metrics, Params, PyTree, ServerContext


class ClientView(NamedTuple):
    """What a component sees of one client's round.

    Attributes:
      global_variables: ``x_t``, the model the client starts from.
      server: the component's server state as broadcast this round (``()`` without one).
      state: the component's state for this client (``()`` without one).
      client: the client's rows of the index table.
      arrays: the pooled training arrays.
      key: the component's own key for this client and round.
      learning_rate: the client optimiser's learning rate this round, read from the optimiser itself
        (:func:`~fedjax_lab.engine.local_training.first_step_rate`).
      prepared: what the component's ``prepare`` hook computed for this client before its training (``()``
        without one).
    """

    global_variables: Params
    server: PyTree
    state: PyTree
    client: ClientData
    arrays: Arrays
    key: jax.Array
    learning_rate: jax.Array
    prepared: PyTree = ()


class LocalResult(NamedTuple):
    """A client's local training as the ``finish`` hook sees it: the trained variables ``y_k``, the delta
    ``y_k - x_t`` and the :class:`~fedjax_lab.engine.local_training.LocalStats`."""

    variables: Params
    delta: Params
    stats: LocalStats


class ServerView(NamedTuple):
    """What a component sees of the round on the server.

    Attributes:
      state: the component's server state (``()`` without one).
      messages: every client message stacked over the cohort: ``messages['delta']`` and one entry per
        component that sends something.
      weights: the aggregation weights of the cohort.
      cohort: the cohort's ids and sizes.
      context: key, round, server data and population size.
      global_variables: the model before this round's server step.
      sums: the cohort's sums of the messages: ``sums['delta']`` (``sum_k w_k Delta_k``), ``sums['weight']``
        (``sum_k w_k``) and ``sums[name]`` for each component with a ``sums`` hook. When the engine streamed
        the round (:class:`~fedjax_lab.engine.types.Reduced`), these are all there is and ``messages`` is
        ``None``.
    """

    state: PyTree
    messages: dict[str, PyTree] | None
    weights: jax.Array
    cohort: Cohort
    context: ServerContext
    global_variables: Params
    sums: dict[str, PyTree] | None = None


class Component(NamedTuple):
    """One method's changes to the round; every hook is optional and the identity when ``None``.

    Client side (each ``ClientView -> piece``; see :class:`~fedjax_lab.engine.local_training.LocalHooks`):
      client_init: ``(global_variables) -> state`` of one client, stacked over the population by the engine.
      prepare: ``view -> pytree``, computed once per client before its local training (FedCOG's generated
        inputs); the component's other client hooks see it as ``view.prepared``.
      shares_state_of: the name of another component whose client state this one reads as ``view.state``
        instead of keeping its own (FedCOG reads MOON's previous local models rather than storing them twice);
        that component keeps it up to date, and this one's ``client_init`` and returned state are not used.
      loss_term: ``view -> LossTerm`` added to the objective; ``needs_features`` when it reads the
        representation.
      gradient / update: ``view -> optax.GradientTransformation`` before / after the client optimiser.
      grad_fn: ``(view, grad_fn) -> grad_fn``.
      batch: ``view -> (batch, step, key) -> batch``.
      step_output: ``(view, StepRecord) -> pytree``, stacked over the steps into ``LocalStats.step_outputs``
        (a dict keyed by component name).
      running: ``view -> (init, fold)``, a value carried through the steps (``LocalHooks.running``); its final
        value is ``LocalStats.running[name]``, and each step's batch holds its value before the step as
        ``batch['running'][name]``.
      finish: ``(view, LocalResult) -> (message_part, new_state)``; a message part of ``None`` sends nothing.
      send: ``(view, LocalResult) -> (delta, message_part)``: what the client sends as ``messages['delta']``
        in place of its model delta (BHerd's herded sum of steps), and this component's message part
        (``None``: none, or ``finish``'s); every ``finish`` still sees the real delta, and every server hook
        sees the sent one. At most one component may set it.
      outgoing: ``(view, delta) -> (delta, message_part)``: a transformation of the delta as it leaves the
        client, after ``send`` (DP-FedAvg's clipping to a norm; compression would go here), and this
        component's message part (``None``: none, or ``finish``'s). Several chain in order.
      needs_unit_step: ``finish`` reads ``result.stats.unit_step``.

    Server side:
      server_init: ``(global_variables) -> state``.
      merge: ``(view: ServerView) -> (mean_delta, state, metrics)``: how the clients' deltas become the one
        the server optimiser steps on, in place of their weighted mean (Feddle's coefficient search), and this
        component's new server state. At most one component may set it.
      aggregate: ``(view: ServerView, mean_delta) -> (mean_delta, metrics)``, applied in order to the weighted
        mean of the deltas before the server optimiser steps on it.
      after_step: ``(view, new_variables) -> (state, new_variables, metrics)`` after the server optimiser.
      reported: ``(state, global_variables) -> variables`` that evaluation reports in place of the global
        model (FedExP's average of the last two iterates); training never reads it. At most one component may
        set it.
      sums: ``(messages, weights, cohort) -> pytree``: the sums over a stack of clients that this component's
        server hooks read (as ``view.sums[name]``), additive over any split of the cohort (SCAFFOLD's control
        sum). A component whose server hooks read only these, and ``view.sums['delta']``, lets the round
        stream its messages (bounded memory, :mod:`fedjax_lab.engine.cohort_loop`); one with server hooks and
        no ``sums`` reads the stacked ``view.messages``, and the round keeps them.
    """

    name: str
    client_init: Callable[[Params], PyTree] | None = None
    prepare: Callable[[ClientView], PyTree] | None = None
    shares_state_of: str | None = None
    loss_term: Callable[[ClientView], LossTerm] | None = None
    needs_features: bool = False
    gradient: Callable[[ClientView], optax.GradientTransformation] | None = None
    update: Callable[[ClientView], optax.GradientTransformation] | None = None
    grad_fn: Callable[[ClientView, GradFn], GradFn] | None = None
    batch: Callable[[ClientView], Callable[[Arrays, jax.Array, jax.Array], Arrays]] | None = None
    step_output: Callable[[ClientView, StepRecord], PyTree] | None = None
    running: Callable[[ClientView], tuple[Callable[[], PyTree],
                                          Callable[[PyTree, StepRecord], PyTree]]] | None = None
    finish: Callable[[ClientView, LocalResult], tuple[PyTree | None, PyTree]] | None = None
    send: Callable[[ClientView, LocalResult], tuple[Params, PyTree | None]] | None = None
    outgoing: Callable[[ClientView, Params], tuple[Params, PyTree | None]] | None = None
    needs_unit_step: bool = False
    server_init: Callable[[Params], PyTree] | None = None
    merge: Callable[[ServerView], tuple[Params, PyTree, Metrics]] | None = None
    aggregate: Callable[[ServerView, Params], tuple[Params, Metrics]] | None = None
    after_step: Callable[[ServerView, Params], tuple[PyTree, Params, Metrics]] | None = None
    sums: Callable[[dict[str, PyTree], jax.Array, Cohort], PyTree] | None = None
    reported: Callable[[PyTree, Params], Params] | None = None


def reads_only_sums(c: Component) -> bool:
    """Whether the component's server hooks, if any, read the messages only through their sums."""
    return c.sums is not None or (c.merge is None and c.aggregate is None and c.after_step is None)


def check_components(components: Sequence[Component]) -> None:
    """Raises ``ValueError`` on repeated names, or on two components that replace the gradient function or
    what the client sends (which do not compose)."""
    for c in components:
        if not isinstance(c, Component):
            raise TypeError(f"components must be Component records, got {type(c).__name__} {c!r} (options "
                            "such as weighting are keyword arguments)")
    names = [c.name for c in components]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"components must have distinct names; repeated: {repeated}")
    if "delta" in names:
        raise ValueError("'delta' is the name of the model delta in every message; "
                         "choose another component name")
    grad_fns = [c.name for c in components if c.grad_fn is not None]
    if len(grad_fns) > 1:
        raise ValueError(f"at most one component may replace the gradient function, got {grad_fns}")
    senders = [c.name for c in components if c.send is not None]
    if len(senders) > 1:
        raise ValueError(f"at most one component may replace the delta a client sends, got {senders}")
    owners = {c.name for c in components if c.client_init is not None and c.shares_state_of is None}
    for c in components:
        if c.shares_state_of is not None and c.shares_state_of not in owners:
            raise ValueError(f"component {c.name!r} shares the client state of {c.shares_state_of!r}, which "
                             f"is not a component with client state here (those: {sorted(owners)})")
    mergers = [c.name for c in components if c.merge is not None]
    if len(mergers) > 1:
        raise ValueError(f"at most one component may replace how the server merges the deltas, got {mergers}")
    reporters = [c.name for c in components if c.reported is not None]
    if len(reporters) > 1:
        raise ValueError(f"at most one component may replace the model evaluation reports, got {reporters}")


def component_key(key: jax.Array, name: str) -> jax.Array:
    """A key of ``key``'s stream reserved for the component ``name`` (a stable hash of the name)."""
    return randomness.named_key(key, name)


def client_views(components: Sequence[Component], global_variables: Params, server_states: dict[str, Any],
                 client_states: dict[str, Any], client: ClientData, arrays: Arrays, key: jax.Array,
                 learning_rate: jax.Array) -> list[ClientView]:
    """Each component's :class:`ClientView` of this client's round, with what its ``prepare`` hook
    computed."""
    views = [ClientView(global_variables, server_states.get(c.name, ()),
                        client_states.get(c.shares_state_of or c.name, ()), client, arrays,
                        component_key(key, c.name), learning_rate) for c in components]
    return [v._replace(prepared=c.prepare(v)) if c.prepare is not None else v
            for c, v in zip(components, views)]


def client_class_counts(view: ClientView, num_classes: int) -> jax.Array:
    """``d``: the client's number of training rows of each class (FedCOG's target labels, FedGen's label
    weights)."""
    rows = jnp.arange(view.client.example_ids.shape[0]) < view.client.num_examples
    labels = view.arrays["y"][view.client.example_ids]
    return jnp.zeros((num_classes,), jnp.int32).at[labels].add(rows.astype(jnp.int32))


def local_hooks(components: Sequence[Component], views: Sequence[ClientView]) -> LocalHooks:
    """The components' client-side hooks bound to their views and merged into one :class:`LocalHooks`."""
    pairs = list(zip(components, views))
    gradients = [c.gradient(v) for c, v in pairs if c.gradient is not None]
    updates = [c.update(v) for c, v in pairs if c.update is not None]
    batches = [c.batch(v) for c, v in pairs if c.batch is not None]
    grad_fns = [(c, v) for c, v in pairs if c.grad_fn is not None]
    outputs = [(c, v) for c, v in pairs if c.step_output is not None]
    running = [(c.name, c.running(v)) for c, v in pairs if c.running is not None]

    def batch(b, step, key):
        for source in batches:
            b = source(b, step, key)
        return b

    return LocalHooks(
        loss_terms=tuple(c.loss_term(v) for c, v in pairs if c.loss_term is not None),
        needs_features=any(c.needs_features for c in components),
        gradient=optax.chain(*gradients) if gradients else None,
        update=optax.chain(*updates) if updates else None,
        grad_fn=(lambda fn, c=grad_fns[0][0], v=grad_fns[0][1]: c.grad_fn(v, fn)) if grad_fns else None,
        batch=batch if batches else None,
        step_output=((lambda record: {c.name: c.step_output(v, record) for c, v in outputs})
                     if outputs else None),
        running=((lambda: {name: init() for name, (init, _) in running},
                  lambda carry, record: {name: fold(carry[name], record) for name, (_, fold) in running})
                 if running else None),
        unit_step=any(c.needs_unit_step for c in components),
    )
