"""MOON: model-contrastive federated learning. Client k adds ``mu * l_con`` to its loss, with

``l_con = -log( exp(sim(z, z_glob)/tau) / (exp(sim(z, z_glob)/tau) + exp(sim(z, z_prev)/tau)) )``

where ``z``, ``z_glob`` and ``z_prev`` are the representations (``features``) of the batch under the local
model being trained, the round's global model and the client's own previous local model, and ``sim`` is cosine
similarity. The previous local model is per-client state (initialised to the initial global model), so
``mu = 0`` is FedAvg. MOON's optional projection head is the model's choice of ``features``.

References:
  Li, He and Song, "Model-Contrastive Federated Learning", CVPR 2021, Eq. (3)-(4).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_lab.engine.components import Component
from fedjax_lab.models.tasks import Classifier, masked_mean


def cosine(a: jax.Array, b: jax.Array) -> jax.Array:
    """Row-wise cosine similarity of ``[B, D]`` arrays."""
    a, b = a.reshape(a.shape[0], -1), b.reshape(b.shape[0], -1)
    return jnp.sum(a * b, -1) / (jnp.linalg.norm(a, axis=-1) * jnp.linalg.norm(b, axis=-1) + 1e-8)


def contrastive_loss(features, global_features, previous_features, temperature: float, mask) -> jax.Array:
    """``l_con`` (Eq. 3) averaged over the batch's real rows."""
    logits = (jnp.stack([cosine(features, global_features), cosine(features, previous_features)], -1)
              / temperature)
    return masked_mean(-jax.nn.log_softmax(logits)[:, 0], mask)


def contrastive(classifier: Classifier, mu: float = 5.0, temperature: float = 0.5) -> Component:
    """MOON's change to the round: ``mu * l_con`` in every client's loss, and the client's previous local
    model as its state."""

    def loss_term(view):
        def term(variables, batch, forward):
            z_glob = jax.lax.stop_gradient(classifier.features(view.global_variables, forward.model_inputs))
            z_prev = jax.lax.stop_gradient(classifier.features(view.state, forward.model_inputs))
            return mu * contrastive_loss(forward.features, z_glob, z_prev, temperature, batch["mask"])

        return term

    return Component("moon", client_init=lambda params: params, loss_term=loss_term, needs_features=True,
                     finish=lambda view, result: (None, result.variables))


def build(config, context) -> tuple[Component, ...]:
    """The components of ``algorithm.name: moon`` (or of a ``moon`` plug-in)."""
    return (contrastive(context.classifier, config.mu, config.temperature),)
