"""Training on the server's data inside the compiled round: drawing its batches, and optimiser steps on them.

Fed+FT fine-tunes the aggregate, FedDF distils the clients' ensemble into it, FedWalk walks the model on its
leash task and Feddle fits its surrogate's head: each is :func:`train_on_server_batches` with its own loss and
batches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from fedjax_lab.engine.local_training import gather_batch
from fedjax_lab.engine.types import Arrays

Draw = Callable[[Arrays, jax.Array], Any]  # (arrays, key) -> the batch the loss reads


def sample_server_batch(batch_size: int) -> Callable[[Arrays, jax.Array], Arrays]:
    """``draw(arrays, key)``: ``batch_size`` rows of the server's data drawn without replacement (all of them
    when there are fewer), with a mask of ones."""

    def draw(arrays: Arrays, key: jax.Array) -> Arrays:
        total = arrays["y"].shape[0]
        rows = jax.random.choice(key, total, (min(batch_size, total),), replace=False)
        return gather_batch(arrays, rows, jnp.ones(rows.shape, bool))

    return draw


def step_key(key: jax.Array, step: jax.Array | int) -> jax.Array:
    """The key of step ``step`` of :func:`train_on_server_batches` with ``key``: its batch's and its
    loss's."""
    return jax.random.fold_in(key, step)


def train_on_server_batches(loss: Callable[[Any, Any, Arrays, jax.Array], tuple[jax.Array, Any]],
                            trainable: Any, model_state: Any, *, draw: Draw, arrays: Arrays, key: jax.Array,
                            steps: int, optimizer: optax.GradientTransformation) -> tuple[Any, Any]:
    """``steps`` steps of ``optimizer`` (started afresh) on
    ``loss(trainable, model_state, batch, key) -> (value, new_model_state)``, step ``s`` on the batch
    ``draw(arrays, step_key(key, s))`` with that key; the model state (BatchNorm statistics) follows the
    batches. Returns the trained ``(trainable, model_state)``, in one ``lax.scan``."""

    def step(carry, s):
        trainable, model_state, opt_state = carry
        key_s = step_key(key, s)
        batch = draw(arrays, key_s)
        grads, model_state = jax.grad(loss, has_aux=True)(trainable, model_state, batch, key_s)
        updates, opt_state = optimizer.update(grads, opt_state, trainable)
        return (optax.apply_updates(trainable, updates), model_state, opt_state), None

    (trainable, model_state, _), _ = jax.lax.scan(step, (trainable, model_state, optimizer.init(trainable)),
                                                  jnp.arange(steps))
    return trainable, model_state
