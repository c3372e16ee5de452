"""SCAFFOLD: local steps corrected by control variates, ``y <- y - eta (g_k(y) - c_k + c)``.

After ``K_k`` steps client k updates its control (option II) ``c_k+ = c_k - c + (x - y_k) / (K_k eta)`` or
(option I) ``c_k+ = grad f_k(x)``, and sends ``(y_k - x, c_k+ - c_k)``. The server applies its optimiser to the
mean model delta and moves ``c += sum_{k in S} (c_k+ - c_k) / N`` (``control_average='all'``, the paper's and
NIID-Bench's) or ``/ |S|`` (``'cohort'``, FedImpro's code). Controls start at zero, so the first round is FedAvg.

References:
  Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning", ICML 2020, Alg. 1.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_lab.engine.aggregation import Weighting, cohort_weights, weighted_mean
from fedjax_lab.engine.local_training import LocalSchedule, gather_batch
from fedjax_lab.engine.tree_math import tree_add, tree_scale, tree_sub, tree_zeros_like
from fedjax_lab.engine.types import Algorithm, LossFn, Params
from fedjax_lab.engine.variables import merge_variables, split_variables
from fedjax_lab.methods.fedavg import ServerState, apply_server_optimizer, init_server_state, local_delta


class ScaffoldState(NamedTuple):
    """The global model, the server optimiser's state and the server control ``c``."""

    params: Params
    opt_state: optax.OptState
    control: Params


def add_correction(correction: Params) -> optax.GradientTransformation:
    """An optax transformation adding a fixed tree to its input (gradients, or updates when chained after an
    optimiser)."""
    return optax.GradientTransformation(lambda params: optax.EmptyState(),
                                        lambda updates, state, params=None: (tree_add(updates, correction), state))


def full_gradient(loss_fn: LossFn, variables: Params, client, arrays, batch_size: int) -> Params:
    """The gradient of client k's mean loss over all its examples at ``variables`` (option I), in batches."""
    params, model_state = split_variables(variables)
    max_examples = client.example_ids.shape[-1]
    num_batches = -(-max_examples // batch_size)
    slots = jnp.arange(num_batches * batch_size).reshape(num_batches, batch_size)

    def one_batch(total, rows):
        mask = rows < client.num_examples
        batch = gather_batch(arrays, client.example_ids[jnp.minimum(rows, max_examples - 1)], mask)
        grads = jax.grad(lambda p: loss_fn(merge_variables(p, model_state, variables), batch, None)[0])(params)
        return tree_add(total, tree_scale(grads, jnp.sum(mask))), None

    total, _ = jax.lax.scan(one_batch, tree_zeros_like(params), slots)
    return tree_scale(total, 1.0 / jnp.maximum(client.num_examples, 1))


def scaffold(loss_fn: LossFn, client_optimizer: optax.GradientTransformation,
             server_optimizer: optax.GradientTransformation, schedule: LocalSchedule, learning_rate: float,
             num_clients: int, option: Literal["I", "II"] = "II",
             control_average: Literal["all", "cohort"] = "all", weighting: Weighting = "num_examples",
             correction: Literal["after_step", "through_optimizer"] = "after_step") -> Algorithm:
    """Builds SCAFFOLD (see the module docstring); ``learning_rate`` is the clients' ``eta``.

    ``correction='after_step'`` (NIID-Bench's, FedCOG's and FedImpro's code) moves the parameters by
    ``-eta (c - c_k)`` after each optimiser step; ``'through_optimizer'`` adds ``c - c_k`` to the gradient before
    the client optimiser (the paper's form). They agree without momentum; with momentum ``rho`` the second
    amplifies the correction by ``1 / (1 - rho)`` on top of option II's own overestimate (measured: it diverged
    on CIFAR-10 Dir(0.1) with momentum 0.9, docs/baselines.md).
    """

    def server_init(params):
        state = init_server_state(server_optimizer, params)
        return ScaffoldState(state.params, state.opt_state, tree_zeros_like(split_variables(params)[0]))

    def client_init(server_state):
        return tree_zeros_like(server_state.control)

    def client_update(server_state, client_control, client, arrays, key):
        drift_correction = tree_sub(server_state.control, client_control)
        if correction == "after_step":
            optimizer = optax.chain(client_optimizer, add_correction(tree_scale(drift_correction, -learning_rate)))
        else:
            optimizer = optax.chain(add_correction(drift_correction), client_optimizer)
        delta, metrics = local_delta(server_state.params, loss_fn, optimizer, client, arrays, key, schedule)
        if option == "I":
            new_control = full_gradient(loss_fn, server_state.params, client, arrays, schedule.batch_size)
        else:
            steps = jnp.maximum(metrics["local_steps"], 1).astype(jnp.float32)
            drift = tree_scale(split_variables(delta)[0], -1.0 / (steps * learning_rate))
            new_control = tree_add(tree_sub(client_control, server_state.control), drift)
        return (delta, tree_sub(new_control, client_control)), new_control, metrics

    def server_update(server_state, messages, cohort, context):
        deltas, control_deltas = messages
        mean_delta = weighted_mean(deltas, cohort_weights(cohort, weighting))
        stepped = apply_server_optimizer(server_optimizer, ServerState(server_state.params, server_state.opt_state),
                                         mean_delta)
        divisor = num_clients if control_average == "all" else cohort.client_ids.shape[0]
        control = tree_add(server_state.control, jax.tree.map(lambda d: jnp.sum(d, 0) / divisor, control_deltas))
        return ScaffoldState(stepped.params, stepped.opt_state, control), {"update_norm": optax.global_norm(mean_delta)}

    return Algorithm(server_init, client_init, client_update, server_update, lambda s: s.params)


