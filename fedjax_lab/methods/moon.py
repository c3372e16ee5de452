"""MOON: model-contrastive federated learning. Client k adds ``mu * l_con`` to its loss, with

``l_con = -log( exp(sim(z, z_glob)/tau) / (exp(sim(z, z_glob)/tau) + exp(sim(z, z_prev)/tau)) )``

where ``z``, ``z_glob`` and ``z_prev`` are the representations (``features``) of the batch under the local model
being trained, the round's global model and the client's own previous local model, and ``sim`` is cosine
similarity. The previous local model is per-client state (initialised to the initial global model), so ``mu = 0``
is FedAvg. MOON's optional projection head is the model's choice of ``features``.

References:
  Li, He and Song, "Model-Contrastive Federated Learning", CVPR 2021, Eq. (3)-(4).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fedjax_lab.engine.aggregation import Weighting
from fedjax_lab.engine.local_training import LocalSchedule
from fedjax_lab.engine.tree_math import tree_add
from fedjax_lab.engine.types import Algorithm
from fedjax_lab.methods.fedavg import fedavg, local_delta
from fedjax_lab.models.tasks import Classifier, masked_mean


def cosine(a: jax.Array, b: jax.Array) -> jax.Array:
    """Row-wise cosine similarity of ``[B, D]`` arrays."""
    a, b = a.reshape(a.shape[0], -1), b.reshape(b.shape[0], -1)
    return jnp.sum(a * b, -1) / (jnp.linalg.norm(a, axis=-1) * jnp.linalg.norm(b, axis=-1) + 1e-8)


def contrastive_term(classifier: Classifier, global_variables, previous_variables, mu: float, temperature: float):
    """``mu * l_con`` as a representation term for :meth:`Classifier.loss_with`."""

    def term(features, inputs, mask):
        z_glob = jax.lax.stop_gradient(classifier.features(global_variables, inputs))
        z_prev = jax.lax.stop_gradient(classifier.features(previous_variables, inputs))
        logits = jnp.stack([cosine(features, z_glob), cosine(features, z_prev)], -1) / temperature
        return mu * masked_mean(-jax.nn.log_softmax(logits)[:, 0], mask)

    return term


def moon(classifier: Classifier, client_optimizer: optax.GradientTransformation,
         server_optimizer: optax.GradientTransformation, schedule: LocalSchedule, mu: float = 1.0,
         temperature: float = 0.5, weighting: Weighting = "num_examples") -> Algorithm:
    """Builds MOON on top of FedAvg (any server optimiser); the client state is its previous local model."""
    base = fedavg(classifier.loss, client_optimizer, server_optimizer, schedule, weighting)

    def client_update(server_state, previous, client, arrays, key):
        loss = classifier.loss_with(contrastive_term(classifier, server_state.params, previous, mu, temperature))
        delta, metrics = local_delta(server_state.params, loss, client_optimizer, client, arrays, key, schedule,
                                     task_loss=classifier.loss)
        return delta, tree_add(server_state.params, delta), metrics

    return base._replace(client_init=lambda server_state: server_state.params, client_update=client_update)
