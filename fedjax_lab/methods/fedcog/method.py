"""FedCOG: each client generates inputs the global model agrees on and its own previous model does not, then
distils the global model on them while it trains on its real data.

From ``start_round`` server steps on, every client of the cohort, before its local training (Alg. 1):

1. **Generates** (Eq. 1-2) ``N`` inputs from ``N(0, 1)`` in the model's input space, with fixed target labels
   (uniform over the classes, or complementary to the client's class counts ``d``: ``max(d) - d`` scaled to
   sum to ``N``), by ``steps`` Adam steps (lr 0.01, betas 0.5 / 0.9) on
   ``mean CE(f(w_g; x), y) + lambda_dis mean(1 - JS(p(w_g; x), p(w_prev; x)))``, both models frozen. It keeps
   the iterate of lowest loss and the global model's logits there.
2. **Trains** (Eq. 3) on ``w_ce CE(real batch) + w_kd T^2 KL(softmax(z_g / T) || softmax(f(w; x_gen) / T))``,
   a batch of the generated inputs beside each real batch, the teacher logits ``z_g`` cached from step 1. The
   weights are ``(1, lambda_kd)`` (the paper's Sec. 4) or ``(n, N_gen) / (n + N_gen)`` with
   ``N_gen = sum(max(d) - d)`` (its App. A.2.2 and its code).

The server is the base method's, unchanged, so FedCOG is a plug-in on any base (FedAvg, FedAvgM, FedProx,
SCAFFOLD, MOON, ...). Each client keeps its previous local model (initialised to the initial global model, so
the disagreement term is inert until the client has trained once); beside MOON, which keeps the same model,
FedCOG reads MOON's instead of storing a second copy. Before ``start_round`` the generation is not run
(a ``cond`` on the server's step count, which every client shares) and the round is the base's exactly.

Each round reports ``fedcog_generation_loss_start`` and ``fedcog_generation_loss_best``: Eq. 1's loss at the
random start and at the kept iterate, averaged over the clients that generated (0 in rounds before
``start_round``), so a run shows whether the generation finds inputs the global model agrees on.

References:
  Ye, Du, Ni, Chen and Wang, "Fake It Till Make It: Federated Learning with Consensus-Oriented Generation",
  ICLR 2024, Eq. 1-3, Alg. 1 and App. A.2.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_lab.engine.components import ClientView, Component, client_class_counts
from fedjax_lab.engine.types import Params
from fedjax_lab.models.divergences import js_divergence, softened_kl


def label_counts(counts: jax.Array, num_samples: int, mode: str = "complement") -> jax.Array:
    """How many of the ``num_samples`` generated inputs target each class: equal shares (``uniform``), or
    shares of ``max(d) - d`` (``complement``; a balanced client, whose shares are all zero, gets equal ones).
    Rounded by largest remainder, so they sum to ``num_samples`` exactly."""
    num_classes = counts.shape[0]
    missing = (jnp.max(counts) - counts).astype(jnp.float32)
    if mode == "uniform":
        missing = jnp.zeros_like(missing)
    shares = jnp.where(jnp.sum(missing) > 0, missing / jnp.maximum(jnp.sum(missing), 1.0), 1.0 / num_classes)
    exact = shares * num_samples
    whole = jnp.floor(exact).astype(jnp.int32)
    left = num_samples - jnp.sum(whole)
    order = jnp.argsort(-(exact - whole), stable=True)  # the largest remainders get one more
    extra = jnp.zeros_like(whole).at[order].set((jnp.arange(num_classes) < left).astype(jnp.int32))
    return whole + extra


def target_labels(per_class: jax.Array, num_samples: int) -> jax.Array:
    """The ``[num_samples]`` labels: ``per_class[c]`` copies of each class ``c``, in class order."""
    return jnp.repeat(jnp.arange(per_class.shape[0]), per_class, total_repeat_length=num_samples)


def generation_loss(global_logits: jax.Array, local_logits: jax.Array, labels: jax.Array,
                    lambda_dis: float | jax.Array) -> jax.Array:
    """Eq. 1: ``mean CE(global, y) + lambda_dis mean(1 - JS(global, local))`` (Eq. 2)."""
    ce = optax.softmax_cross_entropy_with_integer_labels(global_logits, labels)
    return jnp.mean(ce) + lambda_dis * jnp.mean(1.0 - js_divergence(global_logits, local_logits))


class Generated(NamedTuple):
    """A client's generated set: inputs ``[N, ...]`` (model space), the global model's logits there, and the
    generation loss at the start and at the kept iterate."""

    inputs: jax.Array
    teacher_logits: jax.Array
    loss_start: jax.Array
    loss_best: jax.Array


def generate(apply: Callable[[Params, jax.Array], jax.Array], global_variables: Params,
             local_variables: Params, labels: jax.Array, key: jax.Array, input_shape: tuple[int, ...],
             steps: int, learning_rate: float | jax.Array = 0.01,
             lambda_dis: float | jax.Array = 0.1) -> Generated:
    """Step A: ``steps`` Adam steps (betas 0.5, 0.9) on the inputs from ``N(0, 1)``; the iterate of lowest
    loss among those evaluated (before each step, so iterates ``0 .. steps - 1``; the start with no steps) and
    the global model's logits there. ``apply(variables, model_inputs) -> logits`` in evaluation mode."""
    optimizer = optax.adam(learning_rate, b1=0.5, b2=0.9)

    def loss_fn(x):
        logits = apply(global_variables, x)
        return generation_loss(logits, apply(local_variables, x), labels, lambda_dis), logits

    def step(carry, _):
        x, opt_state, best = carry
        (loss, logits), grad = jax.value_and_grad(loss_fn, has_aux=True)(x)
        better = loss < best[0]
        best = jax.tree.map(lambda new, old: jnp.where(better, new, old), (loss, x, logits), best)
        updates, opt_state = optimizer.update(grad, opt_state, x)
        return (optax.apply_updates(x, updates), opt_state, best), loss

    x0 = jax.random.normal(key, (labels.shape[0], *input_shape))
    start_loss, start_logits = loss_fn(x0)
    best = (jnp.array(jnp.inf), x0, start_logits) if steps else (start_loss, x0, start_logits)
    (_, _, (loss, x, logits)), _ = jax.lax.scan(step, (x0, optimizer.init(x0), best), None, length=steps)
    return Generated(x, jax.lax.stop_gradient(logits), start_loss, loss)


class Prepared(NamedTuple):
    """What a client takes into its local training: the generated set, the loss weights, and whether FedCOG is
    on this round."""

    generated: Generated
    weight_ce: jax.Array
    weight_kd: jax.Array
    active: jax.Array


def consensus_generation(classifier, num_classes: int, num_samples: int = 256, steps: int = 100,
                         learning_rate: float | jax.Array = 0.01, lambda_dis: float | jax.Array = 0.1,
                         labels: str = "complement", kd_weighting: str = "fixed",
                         lambda_kd: float | jax.Array = 0.01, temperature: float = 1.0, batch_size: int = 64,
                         start_round: int = 0, shares_state_of: str | None = None) -> Component:
    """FedCOG's change to the round (see the module docstring): generation before local training, distillation
    during it, the previous local model as client state (or the one ``shares_state_of`` keeps, MOON's), the
    server's step count as server state, and each client's generation losses as its message (for the round's
    metrics)."""
    keep_previous = {"client_init": lambda variables: variables,
                     "finish": lambda view, result: (None, result.variables),
                     "shares_state_of": shares_state_of}
    if num_samples == 0:
        # nothing to generate or distil on: the base's round, keeping the previous local model
        return Component("fedcog", **keep_previous)

    def apply(variables, x):
        return classifier.apply(variables, x)

    def prepare(view: ClientView) -> Prepared:
        d = client_class_counts(view, num_classes)
        n, n_gen = jnp.sum(d).astype(jnp.float32), jnp.sum(jnp.max(d) - d).astype(jnp.float32)
        if kd_weighting == "fixed":
            w_ce, w_kd = jnp.float32(1.0), jnp.asarray(lambda_kd, jnp.float32)
        else:  # App. A.2.2: the real and the missing rows' shares of a balanced client
            w_ce, w_kd = n / jnp.maximum(n + n_gen, 1.0), n_gen / jnp.maximum(n + n_gen, 1.0)
        shape = classifier.model_input_shape()
        targets = target_labels(label_counts(d, num_samples, labels), num_samples)
        active = view.server >= start_round

        def off():
            zeros = jnp.zeros((num_samples, *shape))
            return Generated(zeros, jnp.zeros((num_samples, num_classes)), jnp.float32(0.0), jnp.float32(0.0))

        generated = jax.lax.cond(active, lambda: generate(apply, view.global_variables, view.state,
                                                          labels=targets, key=view.key, input_shape=shape,
                                                          steps=steps, learning_rate=learning_rate,
                                                          lambda_dis=lambda_dis), off)
        return Prepared(generated, jnp.where(active, w_ce, 1.0), jnp.where(active, w_kd, 0.0), active)

    def batch(view: ClientView):
        def add_generated(b, step, key):
            rows = jax.random.choice(jax.random.fold_in(view.key, step), num_samples,
                                     (min(batch_size, num_samples),), replace=False)
            g = view.prepared.generated
            return {**b, "fedcog_x": g.inputs[rows], "fedcog_logits": g.teacher_logits[rows]}

        return add_generated

    def loss_term(view: ClientView):
        p: Prepared = view.prepared

        def term(variables, b, forward):
            kd = jax.lax.cond(p.active,
                              lambda: softened_kl(apply(variables, b["fedcog_x"]), b["fedcog_logits"],
                                                  jnp.ones(b["fedcog_x"].shape[0]), temperature),
                              lambda: jnp.float32(0.0))
            return (p.weight_ce - 1.0) * forward.loss + p.weight_kd * kd

        return term

    def finish(view: ClientView, result):
        p: Prepared = view.prepared
        report = {"active": p.active.astype(jnp.float32), "loss_start": p.generated.loss_start,
                  "loss_best": p.generated.loss_best}
        return report, result.variables

    def sums(messages, weights, cohort):
        active = jnp.where(weights > 0, messages["fedcog"]["active"], 0.0)
        return {"active": jnp.sum(active), "loss_start": jnp.sum(active * messages["fedcog"]["loss_start"]),
                "loss_best": jnp.sum(active * messages["fedcog"]["loss_best"])}

    def after_step(view, variables):
        s = view.sums["fedcog"]
        count = jnp.maximum(s["active"], 1.0)
        metrics = {"fedcog_generation_loss_start": s["loss_start"] / count,
                   "fedcog_generation_loss_best": s["loss_best"] / count}
        return view.state + 1, variables, metrics

    return Component("fedcog", **(keep_previous | {"finish": finish}), prepare=prepare, batch=batch,
                     loss_term=loss_term, server_init=lambda variables: jnp.int32(0), after_step=after_step,
                     sums=sums)


def build(config, context) -> tuple[Component, ...]:
    """The components of a ``fedcog`` plug-in (or of ``algorithm.name: fedcog``, FedAvg + FedCOG); see
    its config in ``__init__.py``."""
    algorithm = context.config.algorithm
    with_moon = "moon" in [algorithm.name, *(p.name for p in algorithm.plugins)]
    return (consensus_generation(context.classifier, context.dataset.num_classes, config.num_samples,
                                 steps=config.steps, learning_rate=config.learning_rate,
                                 lambda_dis=config.lambda_dis, labels=config.labels,
                                 kd_weighting=config.kd_weighting, lambda_kd=config.lambda_kd,
                                 temperature=config.temperature, batch_size=config.batch_size,
                                 start_round=config.start_round,
                                 shares_state_of="moon" if with_moon else None),)
