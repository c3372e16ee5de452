"""Local training: a client's optimiser steps as one ``lax.scan``, with per-client shuffling inside jit.

How a client's data is consumed (the same for every method):

* The client's ``n_k`` examples are read in *epochs*. Each epoch is a fresh permutation of them, drawn
  from the client's key, cut into ``ceil(n_k / B)`` batches; the last batch of an epoch may be partial and
  is masked, never padded with repeats.
* ``local_epochs=E``: client k takes ``E * ceil(n_k / B)`` steps, as in the FedAvg paper
  (``u_k = E n_k / B``). Clients of different sizes take different numbers of steps.
* ``local_steps=S``: every client takes exactly ``S`` steps, running through as many epochs as that needs
  (SCAFFOLD's and FedNova's analyses assume equal steps).
* ``drop_remainder``: an epoch is ``floor(n_k / B)`` full batches (at least one), the rest of the permutation
  unused that epoch, as PyTorch's ``drop_last`` and BHerd's ``tau_k = floor(E n_k / B)``.
* ``reshuffle=False``: the client's batch order is drawn once per run (from ``ClientData.data_key``) and every
  epoch of every round reads it in the same order (BHerd's default, "non-RR").

Under ``vmap`` all clients of a cohort run as many steps as its busiest client (``local_steps``: a
``lax.scan`` of fixed length; ``local_epochs``: a ``lax.while_loop`` until every client is done); a step past
a client's own count leaves its parameters and optimiser state untouched.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_lab.engine.cohort_loop import CHUNK
from fedjax_lab.engine.randomness import Purpose
from fedjax_lab.engine.tree_math import tree_where
from fedjax_lab.engine.types import Arrays, ClientData, Forward, ForwardFn, LossFn, Params, PyTree, as_forward
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
      drop_remainder: epochs of ``floor(n_k / B)`` full batches instead of ``ceil(n_k / B)`` with a partial
        last one.
      reshuffle: a fresh permutation every epoch of every round (default), or one fixed order for the whole
        run.
    """

    batch_size: int
    local_steps: int | None = None
    local_epochs: int | None = None
    min_examples: int = 1
    unroll: int = 1
    drop_remainder: bool = False
    reshuffle: bool = True

    def __post_init__(self):
        if (self.local_steps is None) == (self.local_epochs is None):
            raise ValueError("exactly one of local_steps and local_epochs must be set, got "
                             f"local_steps={self.local_steps}, local_epochs={self.local_epochs}")
        for name in ("batch_size", "min_examples", "unroll"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        budget = self.local_steps if self.local_steps is not None else self.local_epochs
        if budget < 1:
            raise ValueError(f"the local budget must be >= 1, got {budget}")

    def batches_per_epoch(self, num_examples):
        """``ceil(n_k / B)`` (``floor`` with ``drop_remainder``), at least 1; an int for an int."""
        rounding = 0 if self.drop_remainder else self.batch_size - 1
        if isinstance(num_examples, int):
            return max((num_examples + rounding) // self.batch_size, 1)
        return jnp.maximum((num_examples + rounding) // self.batch_size, 1)

    def max_steps(self, max_examples: int) -> int:
        """The most steps any client holding at most ``max_examples`` examples takes (the length of the
        stacked per-step outputs)."""
        if self.local_steps is not None:
            return self.local_steps
        return self.local_epochs * self.batches_per_epoch(max_examples)

    def client_steps(self, num_examples: jax.Array) -> jax.Array:
        """The number of steps client k takes."""
        if self.local_steps is not None:
            return jnp.asarray(self.local_steps, jnp.int32)
        return (self.local_epochs * self.batches_per_epoch(num_examples)).astype(jnp.int32)

    def num_epochs(self) -> int:
        """How many epoch permutations a client can need."""
        if not self.reshuffle:
            return 1
        if self.local_epochs is not None:
            return self.local_epochs
        return math.ceil(self.local_steps / self.batches_per_epoch(self.min_examples))


class LocalStats(NamedTuple):
    """What local training reports besides the new variables.

    Attributes:
      mean_loss: the mean training objective (loss terms included) over the client's steps.
      num_steps: ``K_k``, the steps the client took.
      unit_step: how far the client optimiser moved a parameter whose gradient was 1 at every step, i.e.
        ``eta * a_k``: ``K eta`` for SGD, ``eta [K - rho (1 - rho^K) / (1 - rho)] / (1 - rho)`` with
        heavy-ball momentum ``rho`` (FedNova's ``a_k``), about ``K eta`` for Adam. SCAFFOLD and FedNova
        normalise by it, so they follow whatever optimiser the clients run. Measured only when
        ``LocalHooks.unit_step`` asks for it (NaN otherwise).
      step_outputs: what the hooks' ``step_output`` returned at each step, stacked ``[max_steps, ...]`` (rows
        past ``num_steps`` are zeros, ``max_steps`` is :meth:`LocalSchedule.max_steps`); ``()`` without such
        hooks.
      running: the final value of the ``running`` hook's carry; ``()`` without one.
    """

    mean_loss: jax.Array
    num_steps: jax.Array
    unit_step: jax.Array
    step_outputs: PyTree = ()
    running: PyTree = ()


class StepRecord(NamedTuple):
    """One local step as a ``step_output`` or ``running`` hook sees it: the step index, the trainable
    parameters before the step, the batch, its objective and gradient (after the ``gradient`` hooks), whether
    the step is real, and the update it applies to the parameters (after the optimiser and the ``update``
    hooks: ``-eta g`` for plain SGD)."""

    step: jax.Array
    params: Params
    batch: Arrays
    loss: jax.Array
    grads: Params
    active: jax.Array
    update: Params


GradFn = Callable[..., tuple[tuple[jax.Array, Any], Params]]
"""``grad_fn(params, model_state, batch, key) -> ((loss, model_state), grads)``."""

LossTerm = Callable[[Params, Arrays, Forward], jax.Array]
"""``term(variables, batch, forward) -> scalar`` added to the client's objective (FedProx's proximal term,
MOON's contrastive term); ``forward`` is the task's forward pass of the same batch."""


class LocalHooks(NamedTuple):
    """Changes to one client's local training, each in one place (identity when left at its default).

    Attributes:
      loss_terms: added to the task loss of every batch.
      needs_features: some term reads ``forward.features`` (the task must provide them).
      gradient: an optax transformation applied to the gradient before the client optimiser (SCAFFOLD's
        correction in the paper's form).
      update: an optax transformation applied to the optimiser's update before it moves the parameters
        (SCAFFOLD's correction as NIID-Bench applies it). Both receive the step's batch as optax's extra
        argument ``batch`` (a ``GradientTransformationExtraArgs`` reads it: FedReg's projection on its pseudo
        data; plain transformations ignore it).
      grad_fn: turns the plain ``GradFn`` into another (FedSAM's sharpness-aware gradient).
      batch: ``(batch, step, key) -> batch``, the batch source: changes or extends each batch before the step.
      step_output: ``(record: StepRecord) -> pytree`` kept for every step and returned stacked (memory: one
        output per step; BHerd's stacked updates are ``max_steps x |params|``).
      running: ``(init, fold)``: a value carried through the steps, ``init() -> carry`` and
        ``fold(carry, record) -> carry`` at each real step (an online statistic in O(1) steps of memory, as
        GraB's balancing); its final value is :attr:`LocalStats.running`. Each step's batch holds the carry
        before the step under ``'running'``, for the batch hooks and loss terms (FedImpro samples features
        from the client's running statistics).
      unit_step: measure :attr:`LocalStats.unit_step` (a scalar shadow of the optimiser, stepped with the
        model).
    """

    loss_terms: tuple[LossTerm, ...] = ()
    needs_features: bool = False
    gradient: optax.GradientTransformation | None = None
    update: optax.GradientTransformation | None = None
    grad_fn: Callable[[GradFn], GradFn] | None = None
    batch: Callable[[Arrays, jax.Array, jax.Array], Arrays] | None = None
    step_output: Callable[[StepRecord], PyTree] | None = None
    running: tuple[Callable[[], PyTree], Callable[[PyTree, StepRecord], PyTree]] | None = None
    unit_step: bool = False


def epoch_permutations(key: jax.Array, num_examples: jax.Array, max_examples: int,
                       num_epochs: int) -> jax.Array:
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


def sample_client_batch(client: ClientData, arrays: Arrays, key: jax.Array,
                        size: int) -> dict[str, jax.Array]:
    """``min(size, n_k)`` of the client's examples drawn without replacement, as one masked batch of
    ``min(size, max_examples)`` rows."""
    max_examples = client.example_ids.shape[-1]
    size = min(size, max_examples)
    slots = epoch_permutations(key, client.num_examples, max_examples, 1)[0, :size]
    return gather_batch(arrays, client.example_ids[slots], jnp.arange(size) < client.num_examples)


def objective(forward_fn: ForwardFn, hooks: LocalHooks) -> Callable:
    """``(variables, batch, key) -> (loss, model_state)``: the task loss plus every hook's loss term, from one
    forward pass."""

    def loss(variables, batch, key):
        forward = forward_fn(variables, batch, key, hooks.needs_features)
        total = forward.loss
        for term in hooks.loss_terms:
            total = total + term(variables, batch, forward)
        return total, forward.model_state

    return loss


def unit_step_tracker(optimizer: optax.GradientTransformation):
    """``(init, step)`` of a scalar shadow parameter that ``optimizer`` moves with a gradient of 1 at every
    step (its parameter stays 0, so weight decay does not act on it); ``-position`` is
    :attr:`LocalStats.unit_step`."""

    def init():
        return jnp.zeros((), jnp.float32), optimizer.init(jnp.zeros((), jnp.float32))

    def step(carry):
        position, state = carry
        update, state = optimizer.update(jnp.ones((), jnp.float32), state, jnp.zeros((), jnp.float32))
        return position + update, state

    return init, step


def first_step_rate(optimizer: optax.GradientTransformation) -> jax.Array:
    """How far ``optimizer`` moves a parameter on its first step from a fresh state with a gradient of 1: the
    learning rate for SGD with or without momentum, and (up to ``eps``) for Adam."""
    update, _ = optimizer.update(jnp.ones((), jnp.float32), optimizer.init(jnp.zeros((), jnp.float32)),
                                 jnp.zeros((), jnp.float32))
    return -update


def batch_order_key(key: jax.Array, client: ClientData, schedule: LocalSchedule) -> jax.Array:
    """The key of a client's batch order: this round's (``key``) when batches are reshuffled every round, else
    the client's key for the whole run (``client.data_key``), so that its order is the same in every round."""
    if schedule.reshuffle:
        return jax.random.fold_in(key, Purpose.SHUFFLE)
    if client.data_key is None:
        raise ValueError("a fixed batch order (reshuffle=False) needs ClientData.data_key, the client's key "
                         "for the whole run (run_round sets it)")
    return jax.random.fold_in(client.data_key, Purpose.SHUFFLE)


def _most_in_chunk(num_steps: jax.Array) -> jax.Array | None:
    """The most local steps of the clients vmapped together with this one (:data:`cohort_loop.CHUNK`), the
    same for all of them; ``None`` outside such a vmap."""
    try:
        return jax.lax.pmax(num_steps, CHUNK)
    except NameError:  # no chunk axis: a client trained on its own (a server's fine-tuning)
        return None


def _run_steps(step, carry, schedule: LocalSchedule, max_examples: int, num_steps: jax.Array, stacked: bool):
    """Runs ``step(carry, s) -> (carry, output)`` over the local steps: a ``scan`` of the population's most
    steps when outputs are stacked (they need a static length) or the budget is in steps, else a while
    loop."""
    if stacked:
        steps = jnp.arange(schedule.max_steps(max_examples))
        most = None if schedule.local_steps is not None else _most_in_chunk(num_steps)
        if most is None:
            return jax.lax.scan(step, carry, steps, unroll=schedule.unroll)
        # Steps past the chunk's longest client keep every carry and output zeros, as the masked step would:
        # on a predicate that is not batched, a cond skips them at run time (BHerd's CNN on all of MNIST,
        # case 3: 596 steps of a cohort's 5 x 176).
        zeros = jax.tree.map(lambda o: jnp.zeros(o.shape, o.dtype), jax.eval_shape(step, carry, steps[0])[1])
        return jax.lax.scan(
            lambda carry, s: jax.lax.cond(s < most, step, lambda carry, s: (carry, zeros), carry, s),
            carry, steps, unroll=schedule.unroll)

    # Client step counts differ: a while loop runs to this cohort's longest client (under vmap, the loop
    # continues while any client is active) instead of to the population's largest client.
    def body(loop):
        s, carry = loop
        for i in range(schedule.unroll):
            carry = step(carry, s + i)[0]
        return s + schedule.unroll, carry

    _, carry = jax.lax.while_loop(lambda loop: loop[0] < num_steps, body, (jnp.zeros((), jnp.int32), carry))
    return carry, ()


def train_locally(
    variables: Params,
    task: LossFn | Any,
    optimizer: optax.GradientTransformation,
    client: ClientData,
    arrays: Arrays,
    key: jax.Array,
    schedule: LocalSchedule,
    hooks: LocalHooks | None = None,
) -> tuple[Params, LocalStats]:
    """Runs one client's local optimisation from ``variables`` and returns the final variables and
    :class:`LocalStats`.

    ``task`` is a ``LossFn`` ``(variables, batch, key) -> (loss, model_state)``, or an object with a
    ``forward(variables, batch, key, with_features) -> Forward`` method (a
    :class:`~fedjax_lab.models.Classifier`), which loss terms on the representation need. Batches are
    ``{'x', 'y', 'mask'}``; masked-out rows must not contribute (see the module docstring). ``hooks`` change
    the objective, the gradient, the update, the batches, and what each step reports (:class:`LocalHooks`).

    The optimiser trains the trainable part of ``variables`` (see :mod:`.variables`) and its state starts
    fresh every round; model state such as BatchNorm statistics follows what the loss returns.
    """
    hooks = hooks or LocalHooks()
    max_examples = client.example_ids.shape[-1]
    permutations = epoch_permutations(batch_order_key(key, client, schedule), client.num_examples,
                                      max_examples, schedule.num_epochs())
    num_steps = schedule.client_steps(client.num_examples)
    params, model_state = split_variables(variables)
    loss_fn = objective(as_forward(task), hooks)

    def loss_of_trainable(params, model_state, batch, step_key):
        return loss_fn(merge_variables(params, model_state, variables), batch, step_key)

    grad_fn = jax.value_and_grad(loss_of_trainable, has_aux=True)
    if hooks.grad_fn is not None:
        grad_fn = hooks.grad_fn(grad_fn)
    full_optimizer = optax.chain(*[t for t in (hooks.gradient, optimizer, hooks.update) if t is not None])
    tracker_init, tracker_step = (unit_step_tracker(optimizer) if hooks.unit_step
                                  else (lambda: (), lambda t: t))
    running_init, running_fold = hooks.running or (lambda: (), lambda c, r: c)
    step_key = jax.random.fold_in(key, Purpose.STEP)

    def step(carry, s):
        params, model_state, opt_state, tracker, running, loss_sum = carry
        slots, mask = batch_slots(schedule, permutations, s, client.num_examples)
        batch = gather_batch(arrays, client.example_ids[slots], mask)
        key_s = jax.random.fold_in(step_key, s)
        if hooks.running is not None:  # the loss terms and batch hooks see the carry before this step
            batch = {**batch, "running": running}
        if hooks.batch is not None:
            batch = hooks.batch(batch, s, key_s)
        (loss, new_model_state), grads = grad_fn(params, model_state, batch, key_s)
        updates, new_opt_state = full_optimizer.update(grads, opt_state, params, batch=batch)
        new_params = optax.apply_updates(params, updates)
        active = s < num_steps
        record = StepRecord(s, params, batch, loss, grads, active, updates)
        output = () if hooks.step_output is None else hooks.step_output(record)
        params, model_state, opt_state, tracker, running = tree_where(
            active, (new_params, new_model_state, new_opt_state, tracker_step(tracker),
                     running_fold(running, record)),
            (params, model_state, opt_state, tracker, running))
        output = jax.tree.map(lambda x: jnp.where(active, x, jnp.zeros_like(x)), output)
        return (params, model_state, opt_state, tracker, running,
                loss_sum + jnp.where(active, loss, 0.0)), output

    carry = (params, model_state, full_optimizer.init(params), tracker_init(), running_init(),
             jnp.zeros((), jnp.float32))
    stacked = schedule.local_steps is not None or hooks.step_output is not None
    carry, outputs = _run_steps(step, carry, schedule, max_examples, num_steps, stacked)
    params, model_state, _, tracker, running, loss_sum = carry
    trained = merge_variables(params, model_state, variables)
    unit_step = -tracker[0] if hooks.unit_step else jnp.full((), jnp.nan, jnp.float32)
    return trained, LocalStats(loss_sum / jnp.maximum(num_steps, 1), num_steps, unit_step, outputs, running)
