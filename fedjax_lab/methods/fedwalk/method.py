"""FedWalk: "X + FedWalk" trains the aggregated model on the server's leash task, gated by the log loss ratio.

Round t of any base algorithm X, then (Algorithm 1 of the paper):

* clients send X's message and ``L_k``, the loss of their final local model on their own data (Eq. 3);
* the server runs X's aggregation, then updates the client-loss EMA ``Lc <- beta Lc + (1 - beta) mean_k L_k``
  (Eq. 5, ``Lc_0 = 0``, no bias correction);
* if ``log2(Lc / Ls) < tau`` (Eq. 7) it takes ``T_s`` SGD steps ``W <- W - gamma grad F(W; xi)`` on batches of
  the leash set (Eq. 6) and measures the leash loss ``Ls = F(W)`` again; otherwise the model is X's aggregate.

The leash task has its own label set, so its loss ``F`` reads the model's features through a separate leash
head, which lives only on the server: it is neither broadcast nor aggregated. X's own state (SCAFFOLD's
controls, a server optimiser's moments) is left as X made it. ``Ls`` starts at the largest float32, so the
gate opens in round 1 for every finite ``tau``; ``tau = -inf`` never opens it (FedWalk is then X exactly) and
``tau = +inf`` always does. Decisions on the paper's open points are in docs/reproductions/fedwalk.md.

References:
  Zhai et al., "The Dog Walking Theory: Rethinking Convergence in Federated Learning", Algorithm 1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_lab.engine import randomness
from fedjax_lab.engine.aggregation import cohort_mask
from fedjax_lab.engine.components import Component, component_key
from fedjax_lab.engine.local_training import sample_client_batch
from fedjax_lab.engine.server_training import sample_server_batch, train_on_server_batches
from fedjax_lab.engine.types import Algorithm, Arrays, Params, ServerState
from fedjax_lab.engine.variables import merge_variables, split_variables
from fedjax_lab.models.surrogate import FeatureHeadTask
from fedjax_lab.models.tasks import Classifier, masked_mean

UNMEASURED_LEASH_LOSS = float(np.finfo(np.float32).max)
"""``Ls`` before the first leash update: larger than any finite ``2^-tau Lc``, so the gate opens in
round 1."""


LeashTask = FeatureHeadTask
"""The server's public task (Eq. 6): the classifier's features, a leash head over the leash labels."""


def leash_steps(leash: LeashTask, variables: Params, head: Params, arrays: Arrays, key: jax.Array,
                optimizer: optax.GradientTransformation, num_steps: int,
                batch_size: int) -> tuple[Params, Params]:
    """``num_steps`` optimiser steps on the leash loss (Eq. 6), each on ``batch_size`` leash examples drawn
    without replacement; trains the model's trainable variables and the leash head together, carries the
    model state (BatchNorm statistics) the steps produce, and starts the optimiser afresh."""
    params, model_state = split_variables(variables)

    def loss_of(trainable, model_state, batch, step_key):
        params, head = trainable
        return leash.loss(merge_variables(params, model_state, variables), head, batch, step_key)

    trainable, model_state = train_on_server_batches(loss_of, (params, head), model_state,
                                                     draw=sample_server_batch(batch_size), arrays=arrays,
                                                     key=key, steps=num_steps, optimizer=optimizer)
    return merge_variables(trainable[0], model_state, variables), trainable[1]


def gate_is_open(client_loss_ema: jax.Array, leash_loss: jax.Array, tau: float) -> jax.Array:
    """``log2(Lc / Ls) < tau`` (Eq. 7), written ``Ls > 2^-tau Lc`` so that no log of zero is taken."""
    return leash_loss > (2.0 ** -tau) * client_loss_ema


class FedWalkState(NamedTuple):
    """The base algorithm's server state, the leash head, ``Lc``, ``Ls`` and the leash steps taken so far."""

    base: ServerState
    leash_head: Params
    client_loss_ema: jax.Array
    leash_loss: jax.Array
    leash_steps_taken: jax.Array


def client_loss_report(classifier: Classifier, client_loss: Literal["final", "train"] = "final",
                       num_examples: int = 256) -> Component:
    """The clients' side of FedWalk: each sends ``L_k``, the evaluation-mode loss of its final local model on
    ``min(num_examples, n_k)`` of its examples (``'final'``, Eq. 3), or the mean loss of its training steps
    (``'train'``)."""

    def finish(view, result):
        if client_loss == "train":
            return result.stats.mean_loss, ()
        batch = sample_client_batch(view.client, view.arrays, view.key, num_examples)
        return classifier.eval_loss(result.variables, batch), ()

    return Component("fedwalk", finish=finish)


def fedwalk(base: Algorithm, leash: LeashTask, head_key: jax.Array, tau: float, beta: float = 0.9,
            learning_rate: float = 0.01, momentum: float = 0.0, num_steps: int = 1, batch_size: int = 64,
            leash_loss_examples: int = 512, client_loss: Literal["final", "train"] = "final",
            client_loss_examples: int = 256) -> Algorithm:
    """Wraps ``base`` into "base + FedWalk"; see the module docstring.

    Args:
      base: the algorithm X whose rounds FedWalk follows, built from components (it gains
        :func:`client_loss_report`).
      leash: the server's task; its data arrives as ``context.server_arrays`` (``{'x', 'y'}``).
      head_key: initialises the leash head.
      tau: the LLR threshold; higher trains the leash more.
      beta: the momentum of the client-loss EMA (not given in the paper).
      learning_rate, momentum: the leash optimiser (the paper: SGD with ``gamma = eta``, the clients' rate).
      num_steps: ``T_s``, leash steps when the gate is open (the paper: 1). batch_size: ``B_s``
        (the paper: 64).
      leash_loss_examples: how many leash examples ``Ls`` is measured on (all of them when there are fewer).
      client_loss, client_loss_examples: how clients measure ``L_k`` (:func:`client_loss_report`).
    """
    if base.with_components is None:
        raise ValueError("FedWalk adds its client-loss report to the base algorithm's clients; build the "
                         "base from components (fedjax_lab.engine.round.component_round)")
    inner = base.with_components(client_loss_report(leash.classifier, client_loss, client_loss_examples))
    optimizer = optax.sgd(learning_rate, momentum=momentum)

    def server_init(params):
        return FedWalkState(inner.server_init(params), leash.init_head(head_key, params),
                            jnp.zeros((), jnp.float32), jnp.full((), UNMEASURED_LEASH_LOSS, jnp.float32),
                            jnp.zeros((), jnp.int32))

    def client_init(server_state):
        return inner.client_init(server_state.base)

    def client_update(server_state, client_state, client, arrays, key):
        return inner.client_update(server_state.base, client_state, client, arrays, key)

    def server_update(server_state, messages, cohort, context):
        base_state, metrics = inner.server_update(server_state.base, messages, cohort, context)
        client_loss = masked_mean(messages["fedwalk"], cohort_mask(cohort))
        ema = beta * server_state.client_loss_ema + (1.0 - beta) * client_loss
        is_open = gate_is_open(ema, server_state.leash_loss, tau)
        key = component_key(context.key, "fedwalk")

        def walk(operand):
            variables, head, _ = operand
            variables, head = leash_steps(leash, variables, head, arrays=context.server_arrays,
                                          key=jax.random.fold_in(key, 0), optimizer=optimizer,
                                          num_steps=num_steps, batch_size=batch_size)
            measured = leash.evaluate(variables, head, context.server_arrays, jax.random.fold_in(key, 1),
                                      leash_loss_examples)
            return variables, head, measured

        variables, head, leash_loss = jax.lax.cond(
            is_open, walk, lambda operand: operand,
            (inner.model_params(base_state), server_state.leash_head, server_state.leash_loss))
        taken = server_state.leash_steps_taken + jnp.where(is_open, num_steps, 0)
        state = FedWalkState(inner.set_model_params(base_state, variables), head, ema, leash_loss, taken)
        return state, {**metrics, "leash_open": is_open.astype(jnp.float32), "client_loss": client_loss,
                       "client_loss_ema": ema,
                       "leash_loss": leash_loss,
                       "log_loss_ratio": jnp.log2(jnp.maximum(ema, 1e-30) / leash_loss),
                       "leash_steps_taken": taken.astype(jnp.float32)}

    def set_model_params(server_state, params):
        return server_state._replace(base=inner.set_model_params(server_state.base, params))

    def with_components(*more):
        return fedwalk(base.with_components(*more), leash, head_key, tau=tau, beta=beta,
                       learning_rate=learning_rate, momentum=momentum, num_steps=num_steps,
                       batch_size=batch_size, leash_loss_examples=leash_loss_examples,
                       client_loss=client_loss, client_loss_examples=client_loss_examples)

    reported = None if inner.reported_params is None else (
        lambda server_state: inner.reported_params(server_state.base))
    return Algorithm(server_init=server_init, client_init=client_init, client_update=client_update,
                     server_update=server_update,
                     model_params=lambda server_state: inner.model_params(server_state.base),
                     set_model_params=set_model_params, with_components=with_components,
                     reported_params=reported)


def pretrain_on_leash(leash: LeashTask, variables: Params, head_key: jax.Array, arrays: Arrays,
                      key: jax.Array, num_steps: int, learning_rate: float, momentum: float = 0.0,
                      batch_size: int = 64) -> tuple[Params, Params]:
    """The ablation's "pre-training" (Fig. 4): ``num_steps`` leash steps on the initial model before FL, which
    then runs without a leash; returns the model and the leash head (which FL does not use)."""
    head = leash.init_head(head_key, variables)
    optimizer = optax.sgd(learning_rate, momentum=momentum)
    return leash_steps(leash, variables, head, arrays=arrays, key=key, optimizer=optimizer,
                       num_steps=num_steps, batch_size=batch_size)


def build(config, context) -> Callable[[Algorithm], Algorithm]:
    """The ``fedwalk`` plug-in of ``algorithm.plugins``: "X + FedWalk" on the leash set
    ``dataset.server_data``, optionally from a model and leash head pre-trained on it, or (``mode: pretrain``)
    the ablation's pre-training followed by X without a leash. The leash head and the pre-training batches are
    drawn from the run's seed."""
    leash = LeashTask(context.classifier, int(context.dataset.server["y"].max()) + 1)
    head_key = component_key(randomness.init_key(context.key), "fedwalk")
    rate = context.values.client.learning_rate if config.learning_rate is None else config.learning_rate
    pretrain_steps = config.pretrain_steps or 0
    if config.mode == "pretrain" and not pretrain_steps:
        pretrain_steps = context.config.rounds.num_rounds * config.steps
    leash_arrays = context.dataset.server

    @jax.jit
    def pretrain(params, arrays):
        return pretrain_on_leash(leash, params, head_key, arrays=arrays, key=jax.random.fold_in(head_key, 1),
                                 num_steps=pretrain_steps, learning_rate=rate, momentum=config.momentum,
                                 batch_size=config.batch_size)

    def wrap(base: Algorithm) -> Algorithm:
        if config.mode == "pretrain":
            return base._replace(
                server_init=lambda params: base.server_init(pretrain(params, leash_arrays)[0]))
        walked = fedwalk(base, leash, head_key, tau=config.tau, beta=config.beta, learning_rate=rate,
                         momentum=config.momentum, num_steps=config.steps, batch_size=config.batch_size,
                         leash_loss_examples=config.leash_loss_examples, client_loss=config.client_loss,
                         client_loss_examples=config.client_loss_examples)
        if not pretrain_steps:
            return walked

        def server_init(params):
            params, head = pretrain(params, leash_arrays)
            return walked.server_init(params)._replace(leash_head=head)

        return walked._replace(server_init=server_init)

    return wrap
