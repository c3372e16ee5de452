"""FedImpro: clients share per-class Gaussian statistics of the features at a split of the model, and train
the part above the split on their real features and on features sampled from the shared statistics.

The model is cut after a named stage, ``f(x) = g(phi(x))``. The server holds, for each class ``c``, a diagonal
Gaussian ``H_c = N(mu_c, sigma_c^2)`` of ``h = phi(x)`` (``[C, D]`` means and spreads, ``D`` the flattened
feature size) and broadcasts it with the model. Each client:

* trains on (Eq. 6) ``CE(g(phi(x)), y) + w_r CE(g(sg(h_hat)), y_hat)``,
  ``h_hat = mu[y_hat] + sigma[y_hat] xi``, ``xi ~ N(0, I)``: the sampled features are constants, so the lower
  part ``phi`` gets no gradient from them;
* keeps a running copy of the statistics, started from the broadcast ones each round and moved after every
  step towards the class means and (unbiased) standard deviations of its batch's features (Eq. 7): class ``c``
  by ``alpha_c = min(1, n_c / ema_examples)`` of the way, ``n_c`` its rows in the batch (a spread needs two);
  spreads capped at ``spread_cap``;
* sends its final copy, with optional Gaussian noise of std ``noise_std`` on both (App. D.3, Table 7; spreads
  clipped at 0).

The server averages the cohort's copies (Eq. 8; ``aggregation: uniform``, its code's default), or pools them
per class by the clients' class counts into the moments of the union of their rows (``pooled``, its code's
option, which reveals the counts). The model's round is the base's, so FedImpro composes with any base
(FedAvg, FedProx, SCAFFOLD, ...).

Choices on what the paper leaves open (``docs/fedimpro.md`` has all of the digest's points):

* ``labels: balanced`` (its code): ``C (floor(B / C) + 1)`` sampled features a step, labels cycling over all
  classes; ``batch``: one per real row with its label (Alg. 1's ``h_hat ~ H|y``).
* ``source: local`` (its code) samples from the client's running copy; ``global`` from the broadcast
  statistics.
* ``weight_schedule: ramp`` (its code): ``w_r = weight r / ramp_rounds``, unclamped as in its code;
  ``constant``: ``w_r = weight`` (the paper's plain sum).
* Its code's moving-average weight ``min(1, D / 5000)`` (the feature size, so 1 at the default split: the last
  batch replaces the estimate) is read as a bug; the intended ``n_c / 5000`` is used, and ``moving_average:
  feature_size`` runs the code's.
* The statistics start as its code's: means ``U[0, 1)``, spreads ``init_spread`` (0.1).
* The client's features for the statistics are recomputed at the step's parameters on the un-augmented batch
  (its code reads them from the training pass), and the sampled features take their own pass through the upper
  part (its code concatenates them with the real ones, so that BatchNorm mixes both; no difference without
  normalisation layers).

References:
  "Harnessing client drift with decoupled gradient dissimilarity" (FedImpro), Eq. 6-8 and Alg. 1; its code,
  wizard1203/FedImpro (``GaussianSynthesisLabel``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_lab.engine import randomness
from fedjax_lab.engine.components import ClientView, Component, ServerView, client_class_counts, component_key
from fedjax_lab.engine.types import Metrics, Params
from fedjax_lab.engine.variables import merge_variables, split_variables
from fedjax_lab.models.staged import middle_stage
from fedjax_lab.models.tasks import Classifier, masked_mean


class FeatureStats(NamedTuple):
    """Per-class diagonal Gaussians of the split features: means and spreads (standard deviations)
    ``[C, D]``."""

    mean: jax.Array
    spread: jax.Array


class FedImproState(NamedTuple):
    """The server's: the shared statistics and its step count (the weight ramp's ``r``)."""

    stats: FeatureStats
    round: jax.Array


def batch_class_moments(h: jax.Array, y: jax.Array, mask: jax.Array, num_classes: int):
    """Per class: the count of real rows, their mean, and their unbiased standard deviation (two passes), of
    features ``h [B, D]``; classes with no row (or one, for the spread) get zeros."""
    one_hot = jax.nn.one_hot(y, num_classes) * mask[:, None]
    counts = jnp.sum(one_hot, 0)
    means = one_hot.T @ h / jnp.maximum(counts, 1.0)[:, None]
    squares = one_hot.T @ jnp.square(h - means[y]) / jnp.maximum(counts - 1.0, 1.0)[:, None]
    return counts, means, jnp.sqrt(squares)


def update_stats(stats: FeatureStats, h: jax.Array, y: jax.Array, mask: jax.Array, ema_examples: float,
                 spread_cap: float | None, moving_average: str = "class_count") -> FeatureStats:
    """Eq. 7: each class present in the batch moves ``min(1, n_c / ema_examples)`` of the way to its batch
    mean (its spread: to its batch standard deviation, given two rows or more), spreads capped at
    ``spread_cap``. ``moving_average: feature_size`` is its released code's weight,
    ``min(1, D / ema_examples)`` with ``D`` the feature size, the same for every class."""
    counts, means, spreads = batch_class_moments(h, y, mask, stats.mean.shape[0])
    if moving_average == "feature_size":
        alpha = jnp.full((counts.shape[0], 1), jnp.minimum(1.0, h.shape[-1] / ema_examples), means.dtype)
    else:
        alpha = jnp.minimum(1.0, counts / ema_examples)[:, None]
    mean = jnp.where(counts[:, None] >= 1, (1 - alpha) * stats.mean + alpha * means, stats.mean)
    spread = jnp.where(counts[:, None] >= 2, (1 - alpha) * stats.spread + alpha * spreads, stats.spread)
    return FeatureStats(mean, spread if spread_cap is None else jnp.minimum(spread, spread_cap))


def aggregate_stats(mean: jax.Array, spread: jax.Array, counts: jax.Array, present: jax.Array,
                    previous: FeatureStats, mode: str = "uniform") -> FeatureStats:
    """Eq. 8 over the clients where ``present`` (``mean``, ``spread`` ``[M, C, D]``, ``counts`` ``[M, C]``):
    ``uniform``, the plain mean of their statistics; ``pooled``, per class the mean and the unbiased standard
    deviation of the union of the clients' rows, from each one's count, mean and unbiased spread (exact when
    those are the moments of its rows). A class with no row keeps ``previous``'s mean, one with fewer than two
    its spread."""
    if mode == "uniform":
        w = present.astype(jnp.float32)[:, None, None] / jnp.maximum(jnp.sum(present), 1)
        return FeatureStats(jnp.sum(w * mean, 0), jnp.sum(w * spread, 0))
    n = (counts * present[:, None]).astype(jnp.float32)[:, :, None]
    total = jnp.sum(n, 0)
    mu = jnp.sum(n * mean, 0) / jnp.maximum(total, 1.0)
    squares = jnp.sum(jnp.maximum(n - 1.0, 0.0) * jnp.square(spread) + n * jnp.square(mean - mu[None]), 0)
    return FeatureStats(jnp.where(total >= 1, mu, previous.mean),
                        jnp.where(total >= 2, jnp.sqrt(squares / jnp.maximum(total - 1.0, 1.0)),
                                  previous.spread))


def sample_features(stats: FeatureStats, labels: jax.Array, noise: jax.Array) -> jax.Array:
    """``h_hat = mu[y_hat] + sigma[y_hat] xi`` for labels ``[F]`` and standard normal ``xi [F, D]``."""
    return stats.mean[labels] + stats.spread[labels] * noise


def default_split(module) -> str:
    """The middle of the model's stages (``layer2`` of ResNet-18, the paper's 9th layer; ``conv2`` of the
    simple-CNN)."""
    return middle_stage(module)


def feature_shape(classifier: Classifier, split: str) -> tuple[int, ...]:
    """The shape of one example's activation after stage ``split``."""
    variables = classifier.variable_shapes
    x = jax.ShapeDtypeStruct((1, *classifier.model_input_shape()), jnp.float32)
    return tuple(jax.eval_shape(lambda v, x: classifier.apply(v, x, split, method="lower"), variables,
                                x).shape[1:])


def shared_features(classifier: Classifier, num_classes: int, key: jax.Array, batch_size: int,
                    split: str | None = None,
                    weight: float | jax.Array = 1.0, weight_schedule: str = "ramp", ramp_rounds: int = 500,
                    labels: str = "balanced", source: str = "local", ema_examples: float = 5000.0,
                    spread_cap: float | None = 0.1, init_spread: float = 0.1, aggregation: str = "uniform",
                    noise_std: float | jax.Array = 0.0, moving_average: str = "class_count") -> Component:
    """FedImpro's change to the round (see the module docstring); ``key`` draws the initial means."""
    module = classifier.module
    split = split or default_split(module)
    if split not in getattr(module, "stages", ()):
        raise ValueError(f"algorithm: fedimpro.split must be a stage of model {type(module).__name__}: "
                         f"{list(getattr(module, 'stages', ()))}, got {split!r}")
    shape = feature_shape(classifier, split)
    dim = math.prod(shape)
    num_sampled = num_classes * (batch_size // num_classes + 1) if labels == "balanced" else batch_size

    def apply_part(variables: Params, x: jax.Array, method: str, mask: jax.Array) -> jax.Array:
        names = [n for n in variables if n != "params"]
        if not names:
            return classifier.apply(variables, x, split, method=method)
        return classifier.apply(variables, x, split, True, mask, method=method, mutable=names)[0]

    def server_init(variables: Params) -> FedImproState:
        mean = jax.random.uniform(key, (num_classes, dim))
        return FedImproState(FeatureStats(mean, jnp.full((num_classes, dim), init_spread)), jnp.int32(0))

    def running(view: ClientView):
        model_state = split_variables(view.global_variables)[1]

        def fold(stats, record):
            variables = merge_variables(record.params, model_state, view.global_variables)
            x, mask = classifier.preprocess(record.batch["x"]), record.batch["mask"]
            h = jax.lax.stop_gradient(apply_part(variables, x, "lower", mask)).reshape(x.shape[0], dim)
            return update_stats(stats, h, record.batch["y"], mask=mask, ema_examples=ema_examples,
                                spread_cap=spread_cap, moving_average=moving_average)

        return (lambda: view.server.stats), fold

    def batch(view: ClientView):
        def add_noise(b, step, _):
            k = jax.random.fold_in(view.key, step)
            if labels == "balanced":
                y_hat, m = jnp.arange(num_sampled) % num_classes, jnp.ones((num_sampled,))
            else:
                y_hat, m = b["y"], b["mask"]
            return {**b, "fedimpro_y": y_hat, "fedimpro_mask": m,
                    "fedimpro_noise": jax.random.normal(k, (num_sampled, dim))}

        return add_noise

    def loss_term(view: ClientView):
        r = view.server.round.astype(jnp.float32)
        w = weight * (r / ramp_rounds if weight_schedule == "ramp" else 1.0)

        def term(variables, b, forward):
            stats = b["running"]["fedimpro"] if source == "local" else view.server.stats

            def synthetic_loss():
                h_hat = jax.lax.stop_gradient(sample_features(stats, b["fedimpro_y"], b["fedimpro_noise"]))
                logits = apply_part(variables, h_hat.reshape(num_sampled, *shape), "upper",
                                    b["fedimpro_mask"])
                ce = optax.softmax_cross_entropy_with_integer_labels(logits, b["fedimpro_y"])
                return w * masked_mean(ce, b["fedimpro_mask"])

            return jax.lax.cond(w != 0, synthetic_loss, lambda: jnp.zeros((), jnp.float32))

        return term

    def finish(view: ClientView, result):
        stats: FeatureStats = result.stats.running["fedimpro"]
        k_mean, k_spread = jax.random.split(component_key(view.key, "noise"))
        mean = stats.mean + noise_std * jax.random.normal(k_mean, stats.mean.shape)
        spread = jnp.maximum(stats.spread + noise_std * jax.random.normal(k_spread, stats.spread.shape), 0.0)
        return {"mean": mean, "spread": spread, "counts": client_class_counts(view, num_classes)}, ()

    def after_step(view: ServerView, variables: Params) -> tuple[FedImproState, Params, Metrics]:
        m, present = view.messages["fedimpro"], view.weights > 0
        stats = aggregate_stats(m["mean"], m["spread"], m["counts"], present, view.state.stats, aggregation)
        # Per class the clients hold: the squared W2 distance of their Gaussians to the shared one, per
        # element.
        w2 = (jnp.sum(jnp.square(m["mean"] - stats.mean[None]), -1)
              + jnp.sum(jnp.square(m["spread"] - stats.spread[None]), -1)) / dim
        held = (m["counts"] > 0) & present[:, None]
        metrics = {"fedimpro_feature_distance": jnp.sum(w2 * held) / jnp.maximum(jnp.sum(held), 1),
                   "fedimpro_weight": weight * (view.state.round / ramp_rounds if weight_schedule == "ramp"
                                                else 1.0)}
        return FedImproState(stats, view.state.round + 1), variables, metrics

    return Component("fedimpro", server_init=server_init, running=running, batch=batch, loss_term=loss_term,
                     finish=finish, after_step=after_step)


def build(config, context) -> tuple[Component, ...]:
    """The components of ``algorithm.name: fedimpro`` (FedAvg + FedImpro) or of a ``fedimpro`` plug-in; see
    its config in ``__init__.py``."""
    return (shared_features(context.classifier, context.dataset.num_classes,
                            randomness.setup_key(context.key, "fedimpro"),
                            batch_size=context.config.client.batch_size, split=config.split,
                            weight=config.weight, weight_schedule=config.weight_schedule,
                            ramp_rounds=config.ramp_rounds, labels=config.labels, source=config.source,
                            ema_examples=config.ema_examples, spread_cap=config.spread_cap,
                            init_spread=config.init_spread, aggregation=config.aggregation,
                            noise_std=config.noise_std, moving_average=config.moving_average),)
