"""The round that every component-built method runs: FedAvg's, with each method's changes as
:class:`~fedjax_lab.engine.components.Component` hooks.

Each sampled client k starts from the global model x_t, trains locally and sends ``Delta_k = y_k - x_t``; the
server forms ``Delta_t = sum_k w_k Delta_k / sum_k w_k`` (``w_k = n_k`` or 1) and steps its optimiser on the
pseudo-gradient ``-Delta_t``. Where each hook runs, in order (components in the order given):

On each client (vmapped over the cohort):
  1. ``client_views``: every component's ``prepare`` (once, before training), giving each its view;
  2. ``train_locally``: the local steps, with every ``batch``, ``loss_term``, ``grad_fn``, ``gradient``
     (before the client optimiser), ``update`` (after it), ``step_output`` and ``running`` hook inside each
     step;
  3. every ``finish`` on the real delta (its message part and the client's new state), then ``send`` (what
     goes out as the delta, BHerd's herded sum), then every ``outgoing`` on what is sent (DP clipping).
On the server, once per round:
  4. ``reduce``: the weighted sums (the deltas' and every component's ``sums``), over a stack or streamed;
  5. ``merge`` (at most one component: the deltas into the delta to step on), else the weighted mean;
  6. every ``aggregate`` on that delta, in order;
  7. the server optimiser's step (``apply_server_optimizer``);
  8. every ``after_step`` on the new model; ``reported`` (at most one) is what evaluation reads.

References:
  McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data", AISTATS 2017.
  Reddi et al., "Adaptive Federated Optimization", ICLR 2021, Algorithm 2.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_lab.engine.aggregation import Weighting, cohort_weights
from fedjax_lab.engine.components import (
    Component,
    LocalResult,
    ServerView,
    check_components,
    client_views,
    local_hooks,
    reads_only_sums,
)
from fedjax_lab.engine.local_training import LocalSchedule, first_step_rate, train_locally
from fedjax_lab.engine.tree_math import tree_add, tree_scale, tree_sub
from fedjax_lab.engine.types import Algorithm, Params, Reduced
from fedjax_lab.engine.variables import merge_variables, split_variables


class ServerState(NamedTuple):
    """The global model, the server optimiser's state and each component's server state (by name)."""

    params: Params
    opt_state: optax.OptState
    components: dict[str, Any]


def init_server_state(server_optimizer: optax.GradientTransformation, variables: Params,
                      components: dict[str, Any] | None = None) -> ServerState:
    """The global model, a fresh server optimiser state over its trainable part, and the components'
    states."""
    return ServerState(variables, server_optimizer.init(split_variables(variables)[0]), components or {})


def apply_server_optimizer(server_optimizer: optax.GradientTransformation, state: ServerState,
                           mean_delta: Params) -> ServerState:
    """Steps the server optimiser on the pseudo-gradient ``-mean_delta`` of the trainable variables; model
    state (BatchNorm statistics) moves by its mean delta, i.e. becomes the weighted mean of the clients'."""
    trainable, model_state = split_variables(state.params)
    delta_params, delta_model_state = split_variables(mean_delta)
    updates, opt_state = server_optimizer.update(tree_scale(delta_params, -1.0), state.opt_state, trainable)
    params = merge_variables(optax.apply_updates(trainable, updates),
                             tree_add(model_state, delta_model_state), state.params)
    return state._replace(params=params, opt_state=opt_state)


def component_round(
    task: Any,
    client_optimizer: optax.GradientTransformation,
    server_optimizer: optax.GradientTransformation,
    schedule: LocalSchedule,
    *components: Component,
    weighting: Weighting = "num_examples",
) -> Algorithm:
    """The round with ``components`` (FedProx, SCAFFOLD, ...) changing it: FedAvg with none (see the module
    docstring for where each hook runs).

    Args:
      task: the clients' objective, a ``LossFn`` or a :class:`~fedjax_lab.models.Classifier` (components that
        read the representation need the latter).
      client_optimizer: the clients' optax optimiser (its state is reset every round).
      server_optimizer: applied to ``-Delta_t``; see :mod:`fedjax_lab.methods.server_optimizers`.
      schedule: local steps or epochs, and the batch size.
      *components: the methods' changes to the round, applied in the order given.
      weighting: ``'num_examples'`` (``w_k = n_k``) or ``'uniform'``.

    Example::

      fedprox_and_moon = component_round(classifier, optax.sgd(0.01), fedavg_server(),
                                         LocalSchedule(64, local_steps=10), proximal(mu=0.01),
                                         contrastive(classifier, mu=5.0))
    """
    check_components(components)

    def server_init(params):
        return init_server_state(server_optimizer, params, {c.name: c.server_init(params) for c in components
                                                            if c.server_init is not None})

    def client_init(server_state):
        return {c.name: c.client_init(server_state.params) for c in components
                if c.client_init is not None and c.shares_state_of is None}

    def client_update(server_state, client_state, client, arrays, key):
        x = server_state.params
        views = client_views(components, x, server_state.components, client_state, client, arrays, key,
                             first_step_rate(client_optimizer))
        trained, stats = train_locally(x, task, client_optimizer, client, arrays, key, schedule,
                                       local_hooks(components, views))
        result = LocalResult(trained, tree_sub(trained, x), stats)
        message, new_state = {"delta": result.delta}, {}
        for c, view in zip(components, views):
            if c.finish is not None:
                part, state = c.finish(view, result)
                if part is not None:
                    message[c.name] = part
                if c.client_init is not None and c.shares_state_of is None:
                    new_state[c.name] = state
            if c.send is not None:
                message["delta"], part = c.send(view, result)
                if part is not None:
                    message[c.name] = part
        for c, view in zip(components, views):
            if c.outgoing is not None:
                message["delta"], part = c.outgoing(view, message["delta"])
                if part is not None:
                    message[c.name] = part
        return message, new_state, {"train_loss": stats.mean_loss, "local_steps": stats.num_steps}

    def reduce(messages, cohort):
        weights = cohort_weights(cohort, weighting)
        sums = {"delta": jax.tree.map(lambda x: jnp.tensordot(weights, x, axes=1), messages["delta"]),
                "weight": jnp.sum(weights)}
        sums.update({c.name: c.sums(messages, weights, cohort) for c in components if c.sums is not None})
        return sums

    def server_update(server_state, messages, cohort, context):
        weights = cohort_weights(cohort, weighting)
        metrics, states = {}, dict(server_state.components)
        if isinstance(messages, Reduced):
            messages, sums = None, messages.sums
        else:
            sums = reduce(messages, cohort)

        def view(c):
            return ServerView(states.get(c.name, ()), messages, weights, cohort, context, server_state.params,
                              sums)

        mergers = [c for c in components if c.merge is not None]
        if mergers:
            mean_delta, state, m = mergers[0].merge(view(mergers[0]))
            if mergers[0].server_init is not None:
                states[mergers[0].name] = state
            metrics.update(m)
        else:
            mean_delta = tree_scale(sums["delta"], 1.0 / jnp.where(sums["weight"] > 0, sums["weight"], 1.0))
        for c in components:
            if c.aggregate is not None:
                mean_delta, m = c.aggregate(view(c), mean_delta)
                metrics.update(m)
        stepped = apply_server_optimizer(server_optimizer, server_state, mean_delta)
        params = stepped.params
        for c in components:
            if c.after_step is not None:
                state, params, m = c.after_step(view(c), params)
                if c.server_init is not None:  # a component without server state returns ()
                    states[c.name] = state
                metrics.update(m)
        metrics["update_norm"] = optax.global_norm(mean_delta)
        return stepped._replace(params=params, components=states), metrics

    def with_components(*more: Component) -> Algorithm:
        return component_round(task, client_optimizer, server_optimizer, schedule, *components, *more,
                               weighting=weighting)

    reporters = [c for c in components if c.reported is not None]

    def reported_params(server_state):
        return reporters[0].reported(server_state.components[reporters[0].name], server_state.params)

    return Algorithm(server_init=server_init, client_init=client_init, client_update=client_update,
                     server_update=server_update, model_params=lambda server_state: server_state.params,
                     with_components=with_components,
                     reduce=reduce if all(reads_only_sums(c) for c in components) else None,
                     reported_params=reported_params if reporters else None)
