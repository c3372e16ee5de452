"""Divergences between a model's predictive distributions, for distillation (FedDF, FedCOG) and disagreement
(FedCOG), computed from logits through ``log_softmax`` so that they stay finite."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def softened_kl(student: jax.Array, teacher: jax.Array, mask: jax.Array,
                temperature: float = 1.0) -> jax.Array:
    """``T^2 KL(softmax(teacher / T) || softmax(student / T))`` of logits ``[B, C]``, averaged over the rows
    where ``mask`` is set (Hinton et al.'s distillation loss; FedDF's and FedCOG's)."""
    log_teacher = jax.nn.log_softmax(teacher / temperature)
    kl = jnp.sum(jnp.exp(log_teacher) * (log_teacher - jax.nn.log_softmax(student / temperature)), -1)
    weights = mask.astype(jnp.float32)
    return temperature ** 2 * jnp.sum(kl * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def mean_entropy(logits: jax.Array, mask: jax.Array, temperature: float = 1.0) -> jax.Array:
    """The entropy of ``softmax(logits / T)`` in nats (``ln C`` is uniform), averaged over the rows where
    ``mask`` is set."""
    log_p = jax.nn.log_softmax(logits / temperature)
    weights = mask.astype(jnp.float32)
    return -jnp.sum(jnp.sum(jnp.exp(log_p) * log_p, -1) * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def js_divergence(logits_p: jax.Array, logits_q: jax.Array) -> jax.Array:
    """Row-wise Jensen-Shannon divergence ``(KL(p || m) + KL(q || m)) / 2``, ``m = (p + q) / 2``, in nats (at
    most ``ln 2``), of the softmax distributions of logits ``[..., C]``."""
    log_p, log_q = jax.nn.log_softmax(logits_p), jax.nn.log_softmax(logits_q)
    log_m = jnp.logaddexp(log_p, log_q) - jnp.log(2.0)
    return 0.5 * (jnp.sum(jnp.exp(log_p) * (log_p - log_m), -1)
                  + jnp.sum(jnp.exp(log_q) * (log_q - log_m), -1))
