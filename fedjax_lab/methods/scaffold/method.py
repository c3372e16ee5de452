"""SCAFFOLD: local steps corrected by control variates, ``y <- y - eta (g_k(y) - c_k + c)``.

After its local steps client k updates its control (option II) ``c_k+ = c_k - c + (x - y_k) / (K_k eta)`` or
(option I) ``c_k+ = grad f_k(x)``, and sends ``c_k+ - c_k`` beside its model delta. The server applies its
optimiser to the mean model delta and moves ``c += sum_{k in S} (c_k+ - c_k) / N`` (``control_average='all'``,
the paper's and NIID-Bench's) or ``/ |S|`` (``'cohort'``, FedImpro's code). Controls start at zero, so the
first round is FedAvg.

``K_k eta`` is read from what the client optimiser did, not assumed: with ``correction='through_optimizer'``
the correction passes through the optimiser like the gradient, so option II divides by the optimiser's unit
step (``LocalStats.unit_step``: ``K eta`` for SGD, FedNova's ``eta a_k`` with momentum); with ``'after_step'``
the correction moves the parameters at the optimiser's plain rate, so option II divides by ``K`` times that
rate.

References:
  Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning", ICML 2020, Alg. 1.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
import optax

from fedjax_lab.engine.aggregation import cohort_mask
from fedjax_lab.engine.components import ClientView, Component, LocalResult, ServerView
from fedjax_lab.engine.local_training import gather_batch
from fedjax_lab.engine.tree_math import tree_add, tree_scale, tree_sub, tree_zeros_like
from fedjax_lab.engine.types import LossFn, Params
from fedjax_lab.engine.variables import merge_variables, split_variables


def add_correction(correction: Params) -> optax.GradientTransformation:
    """An optax transformation adding a fixed tree to its input (gradients, or updates when chained after an
    optimiser)."""
    return optax.GradientTransformation(
        lambda params: optax.EmptyState(),
        lambda updates, state, params=None: (tree_add(updates, correction), state))


def full_gradient(loss_fn: LossFn, variables: Params, client, arrays, batch_size: int,
                  key: jax.Array) -> Params:
    """The gradient of client k's mean loss over all its examples at ``variables`` (option I), in batches."""
    params, model_state = split_variables(variables)
    max_examples = client.example_ids.shape[-1]
    num_batches = -(-max_examples // batch_size)
    slots = jnp.arange(num_batches * batch_size).reshape(num_batches, batch_size)

    def one_batch(total, rows):
        mask = rows < client.num_examples
        batch = gather_batch(arrays, client.example_ids[jnp.minimum(rows, max_examples - 1)], mask)
        batch_key = jax.random.fold_in(key, rows[0])
        grads = jax.grad(
            lambda p: loss_fn(merge_variables(p, model_state, variables), batch, batch_key)[0])(params)
        return tree_add(total, tree_scale(grads, jnp.sum(mask))), None

    total, _ = jax.lax.scan(one_batch, tree_zeros_like(params), slots)
    return tree_scale(total, 1.0 / jnp.maximum(client.num_examples, 1))


def control_variates(loss_fn: LossFn | None = None, batch_size: int = 64, option: Literal["I", "II"] = "II",
                     control_average: Literal["all", "cohort"] = "all",
                     correction: Literal["after_step", "through_optimizer"] = "after_step") -> Component:
    """SCAFFOLD's change to the round (see the module docstring).

    ``correction='after_step'`` (NIID-Bench's, FedCOG's and FedImpro's code) moves the parameters by
    ``-eta (c - c_k)`` after each optimiser step; ``'through_optimizer'`` adds ``c - c_k`` to the gradient
    before the client optimiser (the paper's form). They agree without momentum. Option I needs ``loss_fn``
    and ``batch_size`` (the full-gradient pass).
    """
    if option == "I" and loss_fn is None:
        raise ValueError("SCAFFOLD option I computes grad f_k(x): pass loss_fn")

    def zeros(params):
        return tree_zeros_like(split_variables(params)[0])

    def gradient(view: ClientView):
        return add_correction(tree_sub(view.server, view.state))

    def update(view: ClientView):
        return add_correction(tree_scale(tree_sub(view.server, view.state), -view.learning_rate))

    def finish(view: ClientView, result: LocalResult):
        if option == "I":
            new_control = full_gradient(loss_fn, view.global_variables, view.client, view.arrays, batch_size,
                                        view.key)
        else:
            steps = jnp.maximum(result.stats.num_steps, 1).astype(jnp.float32)
            moved = (result.stats.unit_step if correction == "through_optimizer"
                     else steps * view.learning_rate)
            drift = tree_scale(split_variables(result.delta)[0], -1.0 / moved)
            new_control = tree_add(tree_sub(view.state, view.server), drift)
        return tree_sub(new_control, view.state), new_control

    def sums(messages, weights, cohort):
        mask = cohort_mask(cohort).astype(jnp.float32)
        return {"moved": jax.tree.map(lambda d: jnp.tensordot(mask, d, axes=1), messages["scaffold"]),
                "count": jnp.sum(mask)}

    def after_step(view: ServerView, params):
        total = view.sums["scaffold"]
        divisor = view.context.num_clients if control_average == "all" else jnp.maximum(total["count"], 1.0)
        return tree_add(view.state, tree_scale(total["moved"], 1.0 / divisor)), params, {}

    return Component("scaffold", client_init=zeros, server_init=zeros, finish=finish, after_step=after_step,
                     sums=sums, needs_unit_step=correction == "through_optimizer",
                     **({"gradient": gradient} if correction == "through_optimizer" else {"update": update}))


def build(config, context) -> tuple[Component, ...]:
    """The components of ``algorithm.name: scaffold`` (or of a ``scaffold`` plug-in)."""
    return (control_variates(context.classifier.loss, context.schedule.batch_size, config.option,
                             config.control_average, config.correction),)
