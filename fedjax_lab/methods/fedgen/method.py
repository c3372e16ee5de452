"""FedGen: the server learns a label-conditional generator of features from the clients' heads; clients
regularise their heads and bodies on its features.

Server, after its optimiser step (Alg. 1; the generator objective as its code computes it, where the paper
takes the CE of the heads' averaged logits and ``y`` from a label prior): ``generator_steps`` Adam steps on
the generator ``G(eps, y) -> z``, with the cohort's trained heads ``h_k = head(x_t + Delta_k)`` frozen:

``L_G = sum_k mean_i w_{k,y_i} CE(h_k(z_i), y_i) + diversity_weight * exp(-mean_{i,j} D_eps[i,j] D_z[i,j])``

with ``y_i`` uniform over the labels some client of the cohort holds, ``w_{k,c} = n_{k,c} / sum_k' n_{k',c}``,
``D_z`` the mean absolute and ``D_eps`` the mean squared distance between rows. Client, from the second round
on (the code's objective; the paper's local objective has only the teacher term): on a real batch ``(x, y)``
of size ``B``,

``L = CE(f(x), y) + beta_t KL(sg(softmax(h(G(eps, y)))) || softmax(f(x)))``
``    + alpha_t (T / B) mean CE(h(sg(G(eps', yhat))), yhat)``

with ``T = teacher_batch_size`` labels ``yhat`` uniform over all classes, ``G`` frozen in evaluation mode,
``alpha_t = max(min(alpha, 1e-4), alpha 0.98^t)`` (likewise ``beta_t``; the code's floor is 1e-4, here no
floor above alpha itself, so that ``alpha = beta = 0`` is FedAvg exactly), ``t`` the server step count.

Decisions (read from ``zhuangdizhu/FedGen``; ``docs/notes/fedcog_baselines_spec.md`` section 3):

* ``G``: ``Dense(noise_dim + K -> hidden) -> BatchNorm -> ReLU -> Dense(hidden -> latent)`` on
  ``[eps; onehot(y)]``, ``eps ~ U[0, 1)`` (the code's ``torch.rand``); latent = the model's feature dimension
  (the input of ``head``). Our features may be post-ReLU (the MLP's are) while ``G``'s output is
  unconstrained; the code's latent is the output of a linear layer. Flax's default initialisers, not
  PyTorch's.
* Server state: ``G``'s variables, its Adam state (weight decay 1e-2 added to the gradient, as PyTorch's Adam;
  lr ``generator_learning_rate * 0.98^t``) and ``t``. ``G`` is trained in every round, round 0 included.
* Label counts: each client sends its dataset histogram, not the code's ``1 +`` labels seen this round;
  clients of aggregation weight 0 (padding, not arrived) do not count.
* Teacher: per-example weights ``w_{k,y_i}`` as above. The code multiplies a ``[B]`` loss by ``[B, 1]``
  weights, so its mean is ``mean(w) mean(CE)``, which this does not copy. The student KL term of the code is
  off (``ensemble_beta = 0``) and not built.
* The regulariser acts at every local step (the code's ``early_stop = 20`` is all its 20 steps).

References:
  Zhu, Hong and Zhou, "Data-Free Knowledge Distillation for Heterogeneous Federated Learning", ICML 2021,
  Sec. 3 and Alg. 1 (equation numbers unchecked here); its code
  ``FLAlgorithms/{servers/serverpFedGen,users/userpFedGen,trainmodel/generator}.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from fedjax_lab.engine.components import ClientView, Component, ServerView, client_class_counts, component_key
from fedjax_lab.engine.types import Metrics, Params
from fedjax_lab.models.divergences import softened_kl


class Generator(nn.Module):
    """``G(eps, y)``: ``Dense -> BatchNorm -> ReLU -> Dense`` on ``[eps; onehot(y)]``, outputs
    ``[B, *latent]``."""

    num_classes: int
    hidden: int
    latent: tuple[int, ...]

    @nn.compact
    def __call__(self, eps: jax.Array, y: jax.Array, train: bool = False) -> jax.Array:
        h = nn.Dense(self.hidden)(jnp.concatenate([eps, jax.nn.one_hot(y, self.num_classes)], -1))
        h = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5)(h))
        return nn.Dense(math.prod(self.latent))(h).reshape(-1, *self.latent)


class FedGenState(NamedTuple):
    """The server's: ``G``'s variables (params and batch_stats), its Adam state, and the server step count."""

    generator: Params
    opt_state: optax.OptState
    round: jax.Array


def feature_shape(classifier) -> tuple[int, ...]:
    """The shape of one example's features, the input of the model's ``head`` (``G``'s output)."""
    x = jnp.zeros((1, *classifier.input_shape), classifier.input_dtype)
    variables = classifier.variable_shapes
    features = jax.eval_shape(
        lambda v, x: classifier.apply(v, classifier.preprocess(x), method="features"), variables, x)
    return tuple(features.shape[1:])


def decayed(value: float | jax.Array, t: jax.Array) -> jax.Array:
    """``max(min(value, 1e-4), value 0.98^t)``: the code's per-round decay of alpha and beta (0 stays 0)."""
    return jnp.maximum(jnp.minimum(value, 1e-4), value * 0.98 ** jnp.asarray(t, jnp.float32))


def label_weights(counts: jax.Array, present: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``w_{k,c} = n_{k,c} / sum_k' n_{k',c}`` over the clients where ``present`` (``[M, K]``, rows of absent
    clients zero) and the qualified labels ``sum_k n_{k,c} > 0`` (``[K]`` bool)."""
    counts = jnp.where(present[:, None], counts, 0).astype(jnp.float32)
    total = jnp.sum(counts, 0)
    return counts / jnp.maximum(total, 1.0), total > 0


def sample_labels(key: jax.Array, qualified: jax.Array, size: int) -> jax.Array:
    """``size`` labels uniform over the qualified ones (over all when none is)."""
    p = jnp.where(jnp.any(qualified), qualified / jnp.maximum(jnp.sum(qualified), 1),
                  1.0 / qualified.shape[0])
    return jax.random.choice(key, qualified.shape[0], (size,), p=p)


def diversity_loss(eps: jax.Array, z: jax.Array) -> jax.Array:
    """``L_div = exp(-mean_{i,j} D_eps[i,j] D_z[i,j])`` over all pairs (diagonal included), ``D_z`` the mean
    absolute and ``D_eps`` the mean squared difference of rows; in ``(0, 1]``, 1 when the outputs collapse."""
    z = z.reshape(z.shape[0], -1)
    d_z = jnp.mean(jnp.abs(z[:, None] - z[None]), -1)
    d_eps = jnp.mean(jnp.square(eps[:, None] - eps[None]), -1)
    return jnp.exp(-jnp.mean(d_eps * d_z))


def teacher_loss(logits: jax.Array, y: jax.Array, weights: jax.Array) -> jax.Array:
    """``sum_k mean_i w_{k,y_i} CE(logits_k_i, y_i)`` of the heads' logits ``[M, B, K]`` and weights
    ``[M, K]``."""
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, y[None])
    return jnp.sum(jnp.mean(weights[:, y] * ce, -1))


def generator_optimizer(learning_rate: float | jax.Array) -> optax.GradientTransformation:
    """The code's ``Adam(lr, weight_decay=1e-2)``: the decay is added to the gradient before the moments."""
    return optax.chain(optax.add_decayed_weights(1e-2), optax.adam(learning_rate))


def train_generator(generator: Generator, state: FedGenState, heads: Callable[[jax.Array], jax.Array],
                    counts: jax.Array, present: jax.Array, key: jax.Array, steps: int,
                    learning_rate: float | jax.Array, batch_size: int, noise_dim: int,
                    diversity_weight: float | jax.Array = 1.0) -> tuple[FedGenState, Metrics]:
    """``steps`` Adam steps on ``L_G = L_teacher + diversity_weight L_div`` (the module docstring), ``G`` in
    training mode; ``heads(z) -> [M, B, K]`` are the frozen client heads. Skipped when no label qualifies.
    Metrics: both terms before and after, on the first step's noise and labels."""
    weights, qualified = label_weights(counts, present)
    optimizer = generator_optimizer(learning_rate * 0.98 ** state.round.astype(jnp.float32))

    def losses(params, batch_stats, s):
        k_eps, k_y = jax.random.split(jax.random.fold_in(key, s))
        y = sample_labels(k_y, qualified, batch_size)
        eps = jax.random.uniform(k_eps, (batch_size, noise_dim))
        z, new_stats = generator.apply({"params": params, "batch_stats": batch_stats}, eps, y, train=True,
                                       mutable=["batch_stats"])
        parts = teacher_loss(heads(z), y, weights), diversity_loss(eps, z)
        return parts[0] + diversity_weight * parts[1], (new_stats["batch_stats"], parts)

    def step(carry, s):
        params, batch_stats, opt_state = carry
        grads, (batch_stats, _) = jax.grad(losses, has_aux=True)(params, batch_stats, s)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), batch_stats, opt_state), None

    def train():
        g = state.generator
        (params, stats, opt_state), _ = jax.lax.scan(step, (g["params"], g["batch_stats"], state.opt_state),
                                                     jnp.arange(steps))
        start, end = losses(g["params"], g["batch_stats"], 0)[1][1], losses(params, stats, 0)[1][1]
        return {"params": params, "batch_stats": stats}, opt_state, jnp.stack([*start, *end])

    def skip():
        return state.generator, state.opt_state, jnp.zeros((4,), jnp.float32)

    variables, opt_state, m = jax.lax.cond(jnp.any(qualified), train, skip)
    metrics = dict(zip(("fedgen_teacher_loss_start", "fedgen_diversity_loss_start", "fedgen_teacher_loss_end",
                        "fedgen_diversity_loss_end"), m))
    return FedGenState(variables, opt_state, state.round + 1), metrics


def fedgen(classifier, num_classes: int, key: jax.Array, alpha: float | jax.Array = 10.0,
           beta: float | jax.Array = 10.0, noise_dim: int = 32, hidden: int = 256, generator_steps: int = 50,
           generator_learning_rate: float | jax.Array = 3e-4, generator_batch_size: int = 32,
           teacher_batch_size: int = 32, diversity_weight: float | jax.Array = 1.0) -> Component:
    """FedGen's change to the round (the module docstring): the clients' two terms on ``G``'s features and
    their class counts as message, and the generator trained after the server step; ``key`` initialises
    ``G``."""
    generator = Generator(num_classes, hidden, feature_shape(classifier))

    def server_init(variables: Params) -> FedGenState:
        g = generator.init(key, jnp.zeros((1, noise_dim)), jnp.zeros((1,), jnp.int32))
        return FedGenState(g, generator_optimizer(generator_learning_rate).init(g["params"]), jnp.int32(0))

    def batch(view: ClientView):
        def add_generated(b, step, _):
            k_eps, k_y, k_hat = jax.random.split(jax.random.fold_in(view.key, step), 3)
            g, size = view.server.generator, b["y"].shape[0]
            y_hat = jax.random.randint(k_y, (teacher_batch_size,), 0, num_classes)
            return {**b, "fedgen_z": generator.apply(g, jax.random.uniform(k_eps, (size, noise_dim)), b["y"]),
                    "fedgen_z_hat": generator.apply(
                        g, jax.random.uniform(k_hat, (teacher_batch_size, noise_dim)), y_hat),
                    "fedgen_y_hat": y_hat}

        return add_generated

    def loss_term(view: ClientView):
        t = view.server.round
        alpha_t, beta_t = decayed(alpha, t), decayed(beta, t)

        def term(variables, b, forward):
            def regulariser():
                def head(z):
                    return classifier.apply(variables, z, method="head")

                latent = softened_kl(head(forward.features), jax.lax.stop_gradient(head(b["fedgen_z"])),
                                     b["mask"])
                teach = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(
                    head(jax.lax.stop_gradient(b["fedgen_z_hat"])), b["fedgen_y_hat"]))
                return beta_t * latent + alpha_t * (teacher_batch_size / b["y"].shape[0]) * teach

            on = (t > 0) & ((alpha_t > 0) | (beta_t > 0))
            return jax.lax.cond(on, regulariser, lambda: jnp.zeros((), jnp.float32))

        return term

    def after_step(view: ServerView, variables: Params) -> tuple[FedGenState, Params, Metrics]:
        clients = jax.tree.map(lambda g, d: g[None] + d, view.global_variables, view.messages["delta"])

        def heads(z):
            return jax.vmap(lambda v: classifier.apply(v, z, method="head"))(clients)

        state, metrics = train_generator(generator, view.state, heads, counts=view.messages["fedgen"],
                                         present=view.weights > 0,
                                         key=component_key(view.context.key, "fedgen"), steps=generator_steps,
                                         learning_rate=generator_learning_rate,
                                         batch_size=generator_batch_size, noise_dim=noise_dim,
                                         diversity_weight=diversity_weight)
        return state, variables, metrics

    return Component("fedgen", loss_term=loss_term, needs_features=True, batch=batch,
                     finish=lambda view, result: (client_class_counts(view, num_classes), ()),
                     server_init=server_init, after_step=after_step)


def build(config, context) -> tuple[Component, ...]:
    """The components of ``algorithm.name: fedgen`` (FedAvg + FedGen) or of a ``fedgen`` plug-in; see
    its config in ``__init__.py``."""
    if context.classifier.objective != "cross_entropy":
        raise ValueError("fedgen needs a softmax classifier (objective: cross_entropy)")
    return (fedgen(context.classifier, context.dataset.num_classes, component_key(context.key, "fedgen"),
                   alpha=config.alpha, beta=config.beta, noise_dim=config.noise_dim, hidden=config.hidden,
                   generator_steps=config.generator_steps,
                   generator_learning_rate=config.generator_learning_rate,
                   generator_batch_size=config.generator_batch_size,
                   teacher_batch_size=config.teacher_batch_size, diversity_weight=config.diversity_weight),)
