"""Feddle: the server learns one coefficient per stored client update by gradient descent on its own data.

The server keeps an atlas of at most ``M`` raw client updates (anchors). Each round it inserts the arrivals,
rescales every anchor to the anchors' median norm (Eq. 5), and searches the coefficients ``c`` of
``w + sum_m c_m a_bar_m`` on its in-domain data (Eq. 6-7), starting from the fallback ``c'`` that reproduces
FedBuff on this round's arrivals and pulled towards it by ``lambda/2 ||c - c'||^2`` (Eq. 11). The coefficient
gradient is the chain rule of App. E (Eq. 16-17): one backward pass at the merged model, then its inner
product with each anchor. The new model is ``w + sum_m c_m a_bar_m``, and ``|c_m|`` becomes anchor ``m``'s
importance: when the atlas is full the least important anchor is evicted.

Rules the paper leaves open (docs/asynchronous.md, "Feddle"):

* An anchor inserted this round has infinite importance until it has been searched, so two arrivals of one
  round never take the same slot; with more than ``M`` arrivals in a round the oldest of them is replaced.
* An update of zero norm never enters the atlas (it would divide by zero in Eq. 5).
* The median is numpy's (the mean of the two middle norms).
* ``c'_m = eta_g ||a_m|| / (n_new med)`` on the slots filled this round, 0 elsewhere: ``w + sum c'_m a_bar_m``
  is FedBuff's step ``w + eta_g mean(new updates)``.
* Anchors hold the trainable parameters; model state (BatchNorm statistics) moves by the arrivals' mean.

References:
  Zhu et al., "Unlocking the Value of Decentralized Data: A Federated Dual Learning Approach for Model
  Aggregation", Alg. 1, Eq. 5-7, 11, 16-17.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_lab.engine import randomness
from fedjax_lab.engine.aggregation import cohort_mask, weighted_mean
from fedjax_lab.engine.components import Component, ServerView, component_key
from fedjax_lab.engine.server_training import sample_server_batch, train_on_server_batches
from fedjax_lab.engine.tree_math import tree_stack_copies, tree_zeros_like
from fedjax_lab.engine.types import Arrays, LossFn, Params
from fedjax_lab.engine.variables import merge_variables, split_variables
from fedjax_lab.models.surrogate import FeatureHeadTask


class Atlas(NamedTuple):
    """The server's anchors: ``anchors`` (every leaf ``[M, ...]``, raw updates), which slots hold one, their
    importance ``|c|`` from the last search (``inf`` until searched), and when each was filled."""

    anchors: Params
    valid: jax.Array
    scores: jax.Array
    filled_at: jax.Array


def init_atlas(params: Params, size: int) -> Atlas:
    """An empty atlas of ``size`` slots for updates shaped like ``params``."""
    return Atlas(tree_stack_copies(tree_zeros_like(params), size), jnp.zeros((size,), bool),
                 jnp.zeros((size,), jnp.float32), jnp.zeros((size,), jnp.int32))


def stacked_norms(stacked: Params) -> jax.Array:
    """The global L2 norm of each entry along the leading axis."""
    leaves = jax.tree.leaves(stacked)
    return jnp.sqrt(sum(jnp.sum(jnp.square(x).reshape(x.shape[0], -1), 1) for x in leaves))


def insert(atlas: Atlas, updates: Params, take: jax.Array, clock: jax.Array) -> tuple[Atlas, jax.Array]:
    """Inserts ``updates[i]`` where ``take[i]`` (in order): into a free slot, else over the least important
    searched anchor, else over the oldest anchor of this round. Returns the atlas and the slots filled."""
    size = atlas.valid.shape[0]

    def one(carry, i):
        atlas, filled = carry
        fresh = jnp.isinf(atlas.scores) & atlas.valid
        searched = atlas.valid & ~fresh
        least_important = jnp.argmin(jnp.where(searched, atlas.scores, jnp.inf))
        oldest_fresh = jnp.argmin(jnp.where(fresh, atlas.filled_at, jnp.iinfo(jnp.int32).max))
        slot = jnp.where(jnp.any(~atlas.valid), jnp.argmax(~atlas.valid),
                         jnp.where(jnp.any(searched), least_important, oldest_fresh))
        slot = jnp.where(take[i], slot, size)  # out of range: dropped
        anchors = jax.tree.map(lambda a, u: a.at[slot].set(u[i], mode="drop"), atlas.anchors, updates)
        atlas = Atlas(anchors, atlas.valid.at[slot].set(True, mode="drop"),
                      atlas.scores.at[slot].set(jnp.inf, mode="drop"),
                      atlas.filled_at.at[slot].set(clock + i, mode="drop"))
        return (atlas, filled.at[slot].set(True, mode="drop")), None

    (atlas, filled), _ = jax.lax.scan(one, (atlas, jnp.zeros((size,), bool)), jnp.arange(take.shape[0]))
    return atlas, filled


def masked_median(values: jax.Array, mask: jax.Array) -> jax.Array:
    """numpy's median of ``values[mask]`` (mean of the two middle ones); 1 when ``mask`` is empty."""
    count = jnp.sum(mask)
    ordered = jnp.sort(jnp.where(mask, values, jnp.inf))
    low, high = ordered[jnp.maximum((count - 1) // 2, 0)], ordered[jnp.maximum(count // 2, 0)]
    return jnp.where(count > 0, (low + high) / 2, 1.0)


def normalized(atlas: Atlas, normalize: bool = True) -> tuple[Params, jax.Array, jax.Array]:
    """``a_bar_m = med a_m / ||a_m||`` (Eq. 5) on the valid slots, 0 elsewhere; also the norms and ``med``."""
    norms = stacked_norms(atlas.anchors)
    med = masked_median(norms, atlas.valid)
    scale = jnp.where(atlas.valid, med / jnp.where(norms > 0, norms, 1.0), 0.0) if normalize else \
        atlas.valid.astype(jnp.float32)
    return jax.tree.map(lambda a: a * scale.reshape((-1,) + (1,) * (a.ndim - 1)), atlas.anchors), norms, med


def combine(coefficients: jax.Array, anchors: Params) -> Params:
    """``sum_m c_m a_m``."""
    return jax.tree.map(lambda a: jnp.tensordot(coefficients, a, axes=1), anchors)


def coefficient_gradient(loss_fn: Callable[[Params], jax.Array], params: Params, anchors: Params,
                         coefficients: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(loss, dL/dc)`` of ``L(c) = loss_fn(params + sum_m c_m a_m)`` by the chain rule (Eq. 16-17): one
    backward pass at the merged model, then ``<g, a_m>`` for every anchor."""
    merged = jax.tree.map(jnp.add, params, combine(coefficients, anchors))
    loss, g = jax.value_and_grad(loss_fn)(merged)
    products = jax.tree.map(lambda a, x: jnp.tensordot(a.reshape(a.shape[0], -1), x.reshape(-1), axes=1),
                            anchors, g)
    return loss, sum(jax.tree.leaves(products))


def search(loss_at: Callable[[Params, jax.Array], jax.Array], params: Params, anchors: Params,
           valid: jax.Array, start: jax.Array, anchor: jax.Array, regularization: float | jax.Array,
           steps: int, optimizer: optax.GradientTransformation,
           key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``steps`` optimiser steps on ``L(c) + lambda/2 ||c - c'||^2`` from ``start`` (Eq. 7 and 11), with
    ``loss_at(variables, key)`` the server loss of a batch drawn from ``key``; coefficients of invalid slots
    stay 0. Returns the coefficients and the server loss at ``start`` and at them, on one more batch."""

    def step(carry, s):
        c, opt_state = carry
        loss, grad = coefficient_gradient(lambda p: loss_at(p, jax.random.fold_in(key, s)),
                                          params, anchors, c)
        grad = jnp.where(valid, grad + regularization * (c - anchor), 0.0)
        updates, opt_state = optimizer.update(grad, opt_state, c)
        return (jnp.where(valid, optax.apply_updates(c, updates), 0.0), opt_state), loss

    (c, _), _ = jax.lax.scan(step, (start, optimizer.init(start)), jnp.arange(steps))
    held_out = jax.random.fold_in(key, steps)  # one more batch, for the loss before and after the search
    merged = lambda c: jax.tree.map(jnp.add, params, combine(c, anchors))
    return c, loss_at(merged(start), held_out), loss_at(merged(c), held_out)


class FeddleState(NamedTuple):
    """The atlas, and the out-of-domain surrogate's head (``None`` in-domain), kept across rounds."""

    atlas: Atlas
    head: Params | None


def train_head(surrogate: FeatureHeadTask, variables: Params, head: Params, draw: Callable, arrays: Arrays,
               key: jax.Array, steps: int, learning_rate: float | jax.Array) -> Params:
    """Eq. 9: ``steps`` Adam steps on the surrogate loss over the head alone, the model held fixed."""
    head, _ = train_on_server_batches(
        lambda h, fixed, batch, k: (surrogate.loss(variables, h, batch, k)[0], fixed),
        head, (), draw=draw, arrays=arrays, key=key, steps=steps,
        optimizer=optax.adam(learning_rate))
    return head


def coefficient_search(loss_fn: LossFn, server_batch: Callable[[Arrays, jax.Array], Arrays], atlas_size: int,
                       steps: int, learning_rate: float | jax.Array, regularization: float | jax.Array = 0.0,
                       fallback_rate: float | jax.Array = 1.0, fallback_init: bool = True,
                       normalize: bool = True, eviction: str = "importance",
                       surrogate: FeatureHeadTask | None = None, head_steps: int = 20,
                       head_learning_rate: float | jax.Array = 1e-3, head_key: jax.Array | None = None,
                       probe: Callable[[Params, jax.Array], jax.Array] | None = None) -> Component:
    """Feddle's merge: see the module docstring. ``loss_fn(variables, batch, key)`` is the task's loss;
    ``server_batch(arrays, key)`` draws a batch of the server's data.

    With a ``surrogate`` (out-of-domain server data, Eq. 9-10) the search minimises the surrogate's loss: a
    new linear head on the model's features, first trained ``head_steps`` steps at the fallback model (Eq. 9)
    and kept across rounds. Only the body's anchors move that loss, and the coefficients are applied to the
    whole anchors, head included; the surrogate's head never enters the global model.

    ``probe(variables, key)``, a loss on data the search never sees (Fig. 7: in-domain rows beside an
    out-of-domain search), adds the metric ``feddle_probe_cosine``: the cosine between the search's
    coefficient gradient and the probe's, both at the search's start and drawn with the same key. ``head_key``
    initialises the surrogate's head (required with one)."""
    if surrogate is not None and head_key is None:
        raise ValueError("coefficient_search: a surrogate needs head_key, the key of its head's "
                         "initialisation")

    def server_init(variables):
        head = None
        if surrogate is not None:
            head = surrogate.init_head(head_key, variables)
        return FeddleState(init_atlas(split_variables(variables)[0], atlas_size), head)

    def merge(view: ServerView):
        atlas, head = view.state
        variables = view.global_variables
        params, _ = split_variables(variables)
        deltas, state_deltas = split_variables(view.messages["delta"])
        take = cohort_mask(view.cohort) & (stacked_norms(deltas) > 0)
        if eviction == "fifo":  # the ablation's base: the oldest anchor goes
            atlas = atlas._replace(scores=jnp.where(atlas.valid, atlas.filled_at.astype(jnp.float32), 0.0))
        clock = jnp.max(atlas.filled_at) + 1
        atlas, filled = insert(atlas, deltas, take, clock)
        anchors, norms, med = normalized(atlas, normalize)
        new = jnp.sum(filled)
        fallback = jnp.where(filled,
                             fallback_rate * (norms / med if normalize else 1.0) / jnp.maximum(new, 1), 0.0)
        start = fallback if fallback_init else jnp.zeros_like(fallback)

        model_state = split_variables(variables)[1]
        if surrogate is None:
            def loss_at(p, key):
                return loss_fn(merge_variables(p, model_state, variables),
                               server_batch(view.context.server_arrays, key), key)[0]
        else:
            at_fallback = merge_variables(jax.tree.map(jnp.add, params, combine(fallback, anchors)),
                                          model_state, variables)
            head = train_head(surrogate, at_fallback, head, draw=server_batch,
                              arrays=view.context.server_arrays,
                              key=component_key(view.context.key, "feddle.head"), steps=head_steps,
                              learning_rate=head_learning_rate)

            def loss_at(p, key):
                return surrogate.loss(merge_variables(p, model_state, variables), head,
                                      server_batch(view.context.server_arrays, key), key)[0]

        metrics = {}
        if probe is not None:
            merged = lambda p: merge_variables(p, model_state, variables)
            _, g_search = coefficient_gradient(lambda p: loss_at(p, view.context.key), params, anchors, start)
            _, g_probe = coefficient_gradient(lambda p: probe(merged(p), view.context.key),
                                              params, anchors, start)
            g_search, g_probe = jnp.where(atlas.valid, g_search, 0.0), jnp.where(atlas.valid, g_probe, 0.0)
            metrics["feddle_probe_cosine"] = jnp.vdot(g_search, g_probe) / jnp.maximum(
                jnp.linalg.norm(g_search) * jnp.linalg.norm(g_probe), 1e-30)
        c, loss_before, loss_after = search(loss_at, params, anchors, valid=atlas.valid, start=start,
                                            anchor=fallback, regularization=regularization, steps=steps,
                                            optimizer=optax.adam(learning_rate), key=view.context.key)
        scores = jnp.where(atlas.valid, jnp.abs(c), 0.0)
        if eviction == "fifo":
            scores = jnp.where(atlas.valid, atlas.filled_at.astype(jnp.float32), 0.0)
        atlas = atlas._replace(scores=scores)
        mean_state = weighted_mean(state_deltas, view.weights)
        metrics |= {"feddle_atlas_size": jnp.sum(atlas.valid),
                   "feddle_negative_fraction": (jnp.sum(atlas.valid & (c < 0))
                                                / jnp.maximum(jnp.sum(atlas.valid), 1)),
                   "feddle_anchor_norm_median": med, "feddle_search_loss_start": loss_before,
                   "feddle_search_loss_end": loss_after, "feddle_coefficients": c}
        return merge_variables(combine(c, anchors), mean_state, variables), FeddleState(atlas, head), metrics

    return Component("feddle", server_init=server_init, merge=merge)


def build(config, context) -> tuple[Component, ...]:
    """The components of ``algorithm.name: feddle``. Out-of-domain server data
    (``dataset.server_data.kind`` other than ``in_domain``) selects the surrogate search, with a head over the
    server data's own labels."""
    surrogate = None
    if context.config.dataset.server_data.kind != "in_domain":
        surrogate = FeatureHeadTask(context.classifier, int(context.dataset.server["y"].max()) + 1)
    return (coefficient_search(context.classifier.loss, sample_server_batch(config.search_batch_size),
                               config.atlas_size, steps=config.search_steps,
                               learning_rate=config.search_learning_rate,
                               regularization=config.regularization,
                               fallback_rate=config.fallback_learning_rate,
                               fallback_init=config.fallback_init, normalize=config.normalize,
                               eviction=config.eviction, surrogate=surrogate, head_steps=config.head_steps,
                               head_learning_rate=config.head_learning_rate,
                               head_key=randomness.setup_key(context.key, "feddle"),
                               probe=test_probe(context, config.probe_examples)),)


def test_probe(context, num_examples: int) -> Callable[[Params, jax.Array], jax.Array] | None:
    """The task's loss on the first ``num_examples`` test rows (``None`` for 0): a diagnostic only, never
    searched on."""
    if not num_examples:
        return None
    test = context.dataset.test
    n = min(num_examples, len(test["y"]))
    batch = {"x": jnp.asarray(test["x"][:n]), "y": jnp.asarray(test["y"][:n]),
             "mask": jnp.ones((n,), jnp.float32)}
    return lambda variables, key: context.classifier.loss(variables, batch, key)[0]
