"""FedDF: distil the ensemble of the arrived client models into the aggregate, on the server's unlabelled
data.

Feddle's distillation baseline (Lin et al. 2020). After the base method's server step (FedBuff's mean of the
buffered updates, by default), the new global model is the student: ``steps`` Adam steps on
``T^2 KL(softmax(z_bar / T) || softmax(z_student / T))`` over batches of the server's inputs, with
``z_bar`` the ensemble's logits, the mean of the arrived models' logits (``teacher: uniform``, as FedDF's code
averages them; ``weighted``: by the round's aggregation weights). Under asynchrony the ensemble
members are the arrived models themselves, ``w^{k_j} + Delta_j`` (each trained from the model it was
dispatched with), so clients send their trained model beside their delta. Labels are never read: the same
method runs on in-domain rows (FedDF-ID) and on another dataset (FedDF-OOD).

References:
  Lin, Kong, Stich and Jaggi, "Ensemble Distillation for Robust Model Fusion in Federated Learning", NeurIPS
  2020, Alg. 1.
  Zhu et al., "Unlocking the Value of Decentralized Data", Sec. 5 (baselines) and App. D (its grid).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from fedjax_lab.engine.components import Component, LocalResult, ServerView
from fedjax_lab.engine.server_training import sample_server_batch, step_key, train_on_server_batches
from fedjax_lab.engine.tree_math import tree_squared_norm, tree_sub
from fedjax_lab.engine.types import Arrays, Params
from fedjax_lab.engine.variables import merge_variables, split_variables
from fedjax_lab.models.divergences import mean_entropy, softened_kl


def member_logits(predict: Callable[[Params, jax.Array], jax.Array], members: Params,
                  x: jax.Array) -> jax.Array:
    """Each of the stacked ``members``' logits on ``x``, ``[members, rows, classes]``."""
    return jax.vmap(lambda v: predict(v, x))(members)


def ensemble_logits(predict: Callable[[Params, jax.Array], jax.Array], members: Params, weights: jax.Array,
                    x: jax.Array) -> jax.Array:
    """The ensemble's logits on ``x``: the ``weights``-weighted mean over the stacked ``members`` (weight 0
    for a member that is not there)."""
    return _weighted_mean(member_logits(predict, members, x), weights)


def _weighted_mean(values: jax.Array, weights: jax.Array) -> jax.Array:
    return jnp.tensordot(weights / jnp.maximum(jnp.sum(weights), 1e-30), values, axes=1)


def teacher_weights(weights: jax.Array, teacher: str) -> jax.Array:
    """The ensemble's weights over the cohort: every arrived member alike (``'uniform'``, FedDF's code: the
    mean of the members' logits) or the round's aggregation weights (``'weighted'``, the size-weighted mean);
    a member of weight 0 (not an arrival) counts in neither."""
    return (weights > 0).astype(weights.dtype) if teacher == "uniform" else weights


def ensemble_distillation(classifier, steps: int, learning_rate: float | jax.Array, batch_size: int,
                          temperature: float = 1.0, teacher: str = "uniform") -> Component:
    """FedDF's change to the round: after the server step, ``steps`` Adam steps distilling the arrived models'
    ensemble (:func:`teacher_weights`) into the new global model on the server's inputs (the optimiser starts
    afresh every server step). Teacher and student see the same inputs: the clients' augmentation is not
    applied."""
    if teacher not in ("uniform", "weighted"):
        raise ValueError(f"algorithm.teacher must be uniform or weighted, got {teacher!r}")
    draw = sample_server_batch(batch_size)
    classifier = dataclasses.replace(classifier, augment=None)

    def finish(view, result: LocalResult):
        return result.variables, ()

    def after_step(view: ServerView, variables):
        teachers, weights = view.messages["feddf"], teacher_weights(view.weights, teacher)
        params, model_state = split_variables(variables)

        def with_target(arrays: Arrays, key: jax.Array) -> tuple[Arrays, jax.Array]:
            batch = draw(arrays, key)  # the ensemble's logits are the target, computed outside the gradient
            return batch, ensemble_logits(classifier.predict, teachers, weights, batch["x"])

        def loss(params, model_state, batch_and_target, key):
            batch, target = batch_and_target
            logits, new_state = classifier.apply_train(merge_variables(params, model_state, variables),
                                                       batch, key)
            return softened_kl(logits, target, batch["mask"], temperature), new_state

        start = params, model_state
        params, model_state = train_on_server_batches(loss, params, model_state, draw=with_target,
                                                      arrays=view.context.server_arrays, key=view.context.key,
                                                      steps=steps, optimizer=optax.adam(learning_rate))
        # The distillation loss on the first batch, before and after (is the student nearer the ensemble?);
        # how sure the ensemble and its average member are there (members sure of different classes average to
        # a flat target); and how far distillation moved the model (a fresh Adam takes steps of about the
        # learning rate in every parameter even where the loss is already near 0).
        key = step_key(view.context.key, 0)  # the first step's batch
        batch = draw(view.context.server_arrays, key)
        members = member_logits(classifier.predict, teachers, batch["x"])
        target = _weighted_mean(members, weights)
        student = classifier.predict(merge_variables(params, model_state, variables), batch["x"])
        entropy = lambda logits: mean_entropy(logits, batch["mask"], temperature)
        metrics = {"feddf_loss_start": loss(*start, (batch, target), key)[0],
                   "feddf_loss_end": loss(params, model_state, (batch, target), key)[0],
                   "feddf_ensemble_entropy": entropy(target),
                   "feddf_member_entropy": _weighted_mean(jax.vmap(entropy)(members), weights),
                   "feddf_student_entropy": entropy(student),
                   "feddf_step_norm": jnp.sqrt(tree_squared_norm(tree_sub(params, start[0])))}
        return (), merge_variables(params, model_state, variables), metrics

    return Component("feddf", finish=finish, after_step=after_step)


def build(config, context) -> tuple[Component, ...]:
    """The components of ``algorithm.name: feddf`` (or of a ``feddf`` plug-in)."""
    return (ensemble_distillation(context.classifier, config.steps, config.learning_rate, config.batch_size,
                                  config.temperature, config.teacher),)
