"""The types every algorithm and the engine agree on.

An FL algorithm is a small record of pure functions over pytrees, in the style of an optax
``GradientTransformation``::

    server_state = algorithm.server_init(model_params)
    client_state = algorithm.client_init(server_state)          # one client; the engine stacks N of them
    message, client_state, metrics = algorithm.client_update(
        server_state, client_state, client, train_arrays, key)  # vmapped over the cohort
    server_state, metrics = algorithm.server_update(
        server_state, messages, cohort, context)                # messages stacked over the cohort
    params = algorithm.model_params(server_state)               # what is evaluated

Nothing here knows about a particular method: FedAvg, SCAFFOLD, FedWalk and the rest differ only in the
functions they put into an :class:`Algorithm`, and a plug-in ("X + FedWalk") is a function from one
:class:`Algorithm` to another.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax

PyTree = Any
Params = PyTree
ServerState = PyTree
ClientState = PyTree
Message = PyTree
Metrics = Mapping[str, jax.Array]
Arrays = Mapping[str, jax.Array]


class ClientData(NamedTuple):
    """One client's rows of the federated index table (stacked along a leading axis for a cohort).

    Attributes:
      client_id: int32 scalar, the client's index in the population.
      example_ids: int32 ``[max_examples]``, indices into the pooled training arrays; entries at or past
        ``num_examples`` are padding and must be masked.
      num_examples: int32 scalar, how many entries of ``example_ids`` are real.
      data_key: the client's key for the whole run, the same every round (its fixed batch order); ``None``
        where no fixed order is needed.
    """

    client_id: jax.Array
    example_ids: jax.Array
    num_examples: jax.Array
    data_key: jax.Array | None = None


class Cohort(NamedTuple):
    """What the server knows about the clients whose messages it aggregates (leading axis = cohort).

    Attributes:
      client_ids: int32 ``[m]``.
      num_examples: int32 ``[m]``.
      mask: bool ``[m]``, which messages take part (the arrivals, when the server sees the asynchronous
        round's whole in-flight store); ``None``: all of them.
      staleness: int32 ``[m]``, rounds between the model a message was computed from and the model it is
        applied to (:mod:`fedjax_lab.engine.asynchrony`); ``None``: all zero (the synchronous round).
    """

    client_ids: jax.Array
    num_examples: jax.Array
    mask: jax.Array | None = None
    staleness: jax.Array | None = None


class ServerContext(NamedTuple):
    """What a server update needs from the run besides algorithm state.

    Attributes:
      key: PRNG key for this round's server-side randomness.
      round: int32 scalar, the index of the round being run (0-based).
      server_arrays: data held by the server (a leash set for FedWalk, a merging set for Feddle), or an
        empty dict when the experiment has none.
      num_clients: the population size ``N`` (SCAFFOLD's and FedDyn's ``1/N`` averages).
    """

    key: jax.Array
    round: jax.Array
    server_arrays: Arrays
    num_clients: int = 1


def replace_params(server_state: ServerState, params: Params) -> ServerState:
    """A NamedTuple server state with its ``params`` field replaced (the default model setter)."""
    return server_state._replace(params=params)


class Algorithm(NamedTuple):
    """An FL method as pure functions over pytree state. See the module docstring for the data flow.

    Attributes:
      server_init: ``(params) -> server_state``.
      client_init: ``(server_state) -> client_state`` for one client; the engine stacks it over the
        population. Return ``()`` for stateless clients.
      client_update: ``(server_state, client_state, client: ClientData, train_arrays, key)
        -> (message, client_state, metrics)``. ``metrics`` is a dict of scalars, averaged over the cohort.
      server_update: ``(server_state, messages, cohort: Cohort, context: ServerContext)
        -> (server_state, metrics)``; ``messages`` is the pytree of client messages stacked over the cohort.
      model_params: ``(server_state) -> params`` of the global model, for evaluation and checkpoints.
      set_model_params: ``(server_state, params) -> server_state`` with the global model replaced, for
        plug-ins that move the model on the server (FedWalk's leash). The default replaces the ``params``
        field of a NamedTuple state.
      with_components: ``(*components) -> Algorithm``, the same algorithm with more client/server components
        (:mod:`fedjax_lab.engine.components`), for plug-ins that also change what clients do; ``None`` for an
        algorithm not assembled from components.
      reported_params: ``(server_state) -> params`` of the model that evaluation reports, when it is not the
        global model itself (FedExP's average of the last two iterates); ``None``: ``model_params``. Training
        never reads it.
      reduce: ``(messages, cohort) -> sums``, for an algorithm whose server update reads only sums over the
        cohort's messages (a weighted mean, SCAFFOLD's control sum): the sums of a stack of messages, additive
        over any split of the cohort. With it the engine may reduce each chunk of clients as it finishes (and
        across devices) instead of stacking every message, and hand ``server_update`` a :class:`Reduced` in
        place of the stack. ``None``: the server update needs the stack (FedDF's ensemble, Feddle's atlas).
    """

    server_init: Callable[[Params], ServerState]
    client_init: Callable[[ServerState], ClientState]
    client_update: Callable[..., tuple[Message, ClientState, Metrics]]
    server_update: Callable[..., tuple[ServerState, Metrics]]
    model_params: Callable[[ServerState], Params]
    set_model_params: Callable[[ServerState, Params], ServerState] = replace_params
    with_components: Callable[..., Algorithm] | None = None
    reduce: Callable[..., PyTree] | None = None
    reported_params: Callable[[ServerState], Params] | None = None

    def evaluated_params(self, server_state: ServerState) -> Params:
        """The model evaluation reports: ``reported_params``, else the global model."""
        return (self.reported_params or self.model_params)(server_state)


class Reduced(NamedTuple):
    """What ``server_update`` receives in place of the stacked messages when the engine streamed them:
    ``sums``, the cohort's ``algorithm.reduce`` accumulated chunk by chunk (and device by device)."""

    sums: PyTree


class LoopState(NamedTuple):
    """Everything a run carries from one round to the next; checkpointing this is checkpointing the run.

    Attributes:
      server_state: the algorithm's server state.
      client_states: the algorithm's per-client state, stacked with a leading ``num_clients`` axis.
      round: int32 scalar, the number of rounds completed.
      asynchrony: the asynchronous round's jobs in flight and the server's buffer
        (:class:`fedjax_lab.engine.asynchrony.AsyncState`); ``None`` for the synchronous round.
    """

    server_state: ServerState
    client_states: ClientState
    round: jax.Array
    asynchrony: Any = None


LossFn = Callable[[Params, Arrays, jax.Array], tuple[jax.Array, Mapping[str, Any]]]
"""``loss_fn(variables, batch, key) -> (loss, model_state)``: the mask-weighted mean loss of a batch
``{'x', 'y', 'mask'}`` (masked rows must not contribute, to the loss or to batch statistics), and the model's
non-trainable collections after the step (``{}`` for a model without any; see :mod:`.variables`)."""


class Forward(NamedTuple):
    """A training-mode forward pass of one batch, as loss terms see it.

    Attributes:
      loss: the task's mask-weighted mean loss.
      model_state: the model's non-trainable collections after the batch (``{}`` without any).
      features: the representation of the batch (``None`` when not asked for, or not available).
      model_inputs: the preprocessed (and augmented) inputs the model saw (``None`` likewise).
    """

    loss: jax.Array
    model_state: Mapping[str, Any]
    features: jax.Array | None = None
    model_inputs: jax.Array | None = None


ForwardFn = Callable[..., Forward]
"""``forward(variables, batch, key, with_features: bool) -> Forward``."""


def as_forward(task: Any) -> ForwardFn:
    """The task's ``forward`` method, or a ``ForwardFn`` around a plain ``LossFn`` (which has no features)."""
    if hasattr(task, "forward"):
        return task.forward

    def forward(variables, batch, key, with_features=False):
        if with_features:
            raise ValueError("a loss term reads the representation, but the task is a plain loss function; "
                             "pass an object with forward(variables, batch, key, with_features), e.g. a "
                             "Classifier")
        loss, model_state = task(variables, batch, key)
        return Forward(loss, model_state)

    return forward
