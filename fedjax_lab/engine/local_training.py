"""Local training: a client's optimiser steps as one ``lax.scan``, with per-client shuffling inside jit.

How a client's data is consumed (the same for every method):

* The client's ``n_k`` examples are read in *epochs*. Each epoch is a fresh permutation of them, drawn
  from the client's key, cut into ``ceil(n_k / B)`` batches; the last batch of an epoch may be partial and
  is masked, never padded with repeats.
* ``local_epochs=E``: client k takes ``E * ceil(n_k / B)`` steps, as in the FedAvg paper
  (``u_k = E n_k / B``). Clients of different sizes take different numbers of steps.
* ``local_steps=S``: every client takes exactly ``S`` steps, running through as many epochs as that needs
  (SCAFFOLD's and FedNova's analyses assume equal steps).

Under ``vmap`` all clients of a cohort run as many steps as its busiest client (``local_steps``: a
``lax.scan`` of fixed length; ``local_epochs``: a ``lax.while_loop`` until every client is done); a step past
a client's own count leaves its parameters and optimiser state untouched.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_lab.engine.randomness import Purpose
from fedjax_lab.engine.tree_math import tree_where
from fedjax_lab.engine.types import Arrays, ClientData, LossFn, Params
from fedjax_lab.engine.variables import merge_variables, split_variables


@dataclasses.dataclass(frozen=True)
class LocalSchedule:
    """How many steps a client takes and on which batches. Exactly one of the two budgets is set.

    Attributes:
      batch_size: examples per step, ``B``.
      local_steps: the same number of steps ``S`` for every client.
      local_epochs: ``E`` passes over each client's data.
      min_examples: the smallest client in the population; bounds how many epochs a client can pass through
        under ``local_steps`` (so how many permutations are drawn). 1 is always safe, only slower.
      unroll: ``lax.scan`` unroll factor of the step loop (speed only, never results).
      probe_examples: after training, also report the final model's loss on this many of the client's
        examples, drawn without replacement (all of them when the client has fewer); 0 reports nothing.
        FedWalk's clients send this loss (its Eq. 3).
    """

    batch_size: int
    local_steps: int | None = None
    local_epochs: int | None = None
    min_examples: int = 1
    unroll: int = 1
    probe_examples: int = 0

    def __post_init__(self):
        if (self.local_steps is None) == (self.local_epochs is None):
            raise ValueError("exactly one of local_steps and local_epochs must be set, got "
                             f"local_steps={self.local_steps}, local_epochs={self.local_epochs}")
        for name in ("batch_size", "min_examples", "unroll"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.probe_examples < 0:
            raise ValueError(f"probe_examples must be >= 0, got {self.probe_examples}")
        budget = self.local_steps if self.local_steps is not None else self.local_epochs
        if budget < 1:
            raise ValueError(f"the local budget must be >= 1, got {budget}")

    def batches_per_epoch(self, num_examples: jax.Array) -> jax.Array:
        """``ceil(n_k / B)``, at least 1."""
        return jnp.maximum((num_examples + self.batch_size - 1) // self.batch_size, 1)

    def client_steps(self, num_examples: jax.Array) -> jax.Array:
        """The number of steps client k takes."""
        if self.local_steps is not None:
            return jnp.asarray(self.local_steps, jnp.int32)
        return (self.local_epochs * self.batches_per_epoch(num_examples)).astype(jnp.int32)

    def num_epochs(self) -> int:
        """How many epoch permutations a client can need."""
        if self.local_epochs is not None:
            return self.local_epochs
        return math.ceil(self.local_steps / max(math.ceil(self.min_examples / self.batch_size), 1))


class LocalStats(NamedTuple):
    """What local training reports besides the new parameters (``final_loss`` is NaN without a probe)."""

    mean_loss: jax.Array
    num_steps: jax.Array
    final_loss: jax.Array


def epoch_permutations(key: jax.Array, num_examples: jax.Array, max_examples: int, num_epochs: int) -> jax.Array:
    """``[num_epochs, max_examples]`` int32: row e is a uniform permutation of ``range(n_k)`` followed by the
    padding slots, drawn from ``fold_in(key, e)``."""
    slots = jnp.arange(max_examples)

    def one_epoch(e):
        u = jax.random.uniform(jax.random.fold_in(key, e), (max_examples,))
        return jnp.argsort(jnp.where(slots < num_examples, u, 2.0)).astype(jnp.int32)

    return jax.vmap(one_epoch)(jnp.arange(num_epochs))


def batch_slots(schedule: LocalSchedule, permutations: jax.Array, step: jax.Array, num_examples: jax.Array):
    """The slots of the client's index-table row read at ``step``, and their validity mask ``[B]``."""
    per_epoch = schedule.batches_per_epoch(num_examples)
    epoch = jnp.minimum(step // per_epoch, permutations.shape[0] - 1)
    positions = (step % per_epoch) * schedule.batch_size + jnp.arange(schedule.batch_size)
    mask = positions < num_examples
    slots = permutations[epoch, jnp.minimum(positions, permutations.shape[1] - 1)]
    return slots, mask


def gather_batch(arrays: Arrays, example_ids: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
    """Rows ``example_ids`` of every array, plus the float ``mask`` under key ``'mask'``."""
    batch = {name: value[example_ids] for name, value in arrays.items()}
    batch["mask"] = mask.astype(jnp.float32)
    return batch


def probe_loss(variables: Params, loss_fn: LossFn, client: ClientData, arrays: Arrays, key: jax.Array,
               num_probe: int) -> jax.Array:
    """``loss_fn`` of ``variables`` on ``min(num_probe, n_k)`` of the client's examples drawn without
    replacement (one masked batch; the model state it returns is discarded)."""
    max_examples = client.example_ids.shape[-1]
    size = min(num_probe, max_examples)
    slots = epoch_permutations(key, client.num_examples, max_examples, 1)[0, :size]
    batch = gather_batch(arrays, client.example_ids[slots], jnp.arange(size) < client.num_examples)
    return loss_fn(variables, batch, key)[0]


def train_locally(
    variables: Params,
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    client: ClientData,
    arrays: Arrays,
    key: jax.Array,
    schedule: LocalSchedule,
    value_and_grad: Callable = jax.value_and_grad,
    task_loss: LossFn | None = None,
) -> tuple[Params, LocalStats]:
    """Runs one client's local optimisation from ``variables`` and returns the final variables.

    ``value_and_grad`` turns ``loss(params, model_state, batch, key) -> (loss, model_state)`` into a function
    returning ``((loss, model_state), grads)``; it is ``jax.value_and_grad(..., has_aux=True)`` unless a method
    computes its gradients otherwise (FedSAM's sharpness-aware gradient).

    The optimiser trains the trainable part of ``variables`` (see :mod:`.variables`) and its state starts
    fresh every round; model state such as BatchNorm statistics follows what ``loss_fn`` returns.
    ``loss_fn(variables, batch, key) -> (loss, model_state)`` receives batches ``{'x', 'y', 'mask'}`` whose
    masked-out rows must not contribute (see the module docstring). With ``schedule.probe_examples``, the final
    model's ``task_loss`` (default ``loss_fn``; methods that add a term to the objective pass the plain one) is
    measured on a sample of the client's examples (:func:`probe_loss`).
    """
    max_examples = client.example_ids.shape[-1]
    permutations = epoch_permutations(jax.random.fold_in(key, Purpose.SHUFFLE), client.num_examples,
                                      max_examples, schedule.num_epochs())
    num_steps = schedule.client_steps(client.num_examples)
    params, model_state = split_variables(variables)

    def loss_of_trainable(params, model_state, batch, step_key):
        return loss_fn(merge_variables(params, model_state, variables), batch, step_key)

    grad_fn = value_and_grad(loss_of_trainable, has_aux=True)
    step_key = jax.random.fold_in(key, Purpose.STEP)

    def step(carry, s):
        params, model_state, opt_state, loss_sum = carry
        slots, mask = batch_slots(schedule, permutations, s, client.num_examples)
        batch = gather_batch(arrays, client.example_ids[slots], mask)
        (loss, new_model_state), grads = grad_fn(params, model_state, batch, jax.random.fold_in(step_key, s))
        updates, new_opt_state = optimizer.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        active = s < num_steps
        params, model_state, opt_state = tree_where(
            active, (new_params, new_model_state, new_opt_state), (params, model_state, opt_state))
        return (params, model_state, opt_state, loss_sum + jnp.where(active, loss, 0.0)), None

    carry = (params, model_state, optimizer.init(params), jnp.zeros((), jnp.float32))
    if schedule.local_steps is not None:
        (params, model_state, _, loss_sum), _ = jax.lax.scan(step, carry, jnp.arange(schedule.local_steps),
                                                             unroll=schedule.unroll)
    else:
        # Client step counts differ: a while loop runs to this cohort's longest client (under vmap, the
        # loop continues while any client is active) instead of to the population's largest client.
        def body(loop):
            s, carry = loop
            for i in range(schedule.unroll):
                carry = step(carry, s + i)[0]
            return s + schedule.unroll, carry

        _, (params, model_state, _, loss_sum) = jax.lax.while_loop(lambda loop: loop[0] < num_steps, body,
                                                                    (jnp.zeros((), jnp.int32), carry))
    trained = merge_variables(params, model_state, variables)
    final_loss = jnp.full((), jnp.nan, jnp.float32)
    if schedule.probe_examples:
        final_loss = probe_loss(trained, task_loss or loss_fn, client, arrays, jax.random.fold_in(key, Purpose.PROBE),
                                schedule.probe_examples)
    return trained, LocalStats(loss_sum / jnp.maximum(num_steps, 1), num_steps, final_loss)
