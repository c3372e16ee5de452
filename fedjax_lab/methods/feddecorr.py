"""FedDecorr: FedAvg whose clients penalise dimensional collapse of the representation,
``beta * ||K||_F^2 / d^2`` with ``K`` the correlation matrix of the batch's ``d``-dimensional features
(standardised over the batch). ``beta = 0`` is FedAvg.

The official code normalises differently from the paper's formula (their ``beta`` differs by about the batch
size; see ``docs/baselines.md``); this is the paper's form.

References:
  Shi et al., "Towards Understanding and Mitigating Dimensional Collapse in Heterogeneous Federated Learning",
  ICLR 2023, Eq. (5).
"""

from __future__ import annotations

import jax.numpy as jnp
import optax

from fedjax_lab.engine.aggregation import Weighting
from fedjax_lab.engine.local_training import LocalSchedule
from fedjax_lab.engine.types import Algorithm
from fedjax_lab.methods.fedavg import fedavg, local_delta
from fedjax_lab.models.tasks import Classifier


def decorrelation(features, mask) -> jnp.ndarray:
    """``||K||_F^2 / d^2`` of the masked rows' correlation matrix ``K``."""
    z = features.reshape(features.shape[0], -1)
    w = mask.astype(z.dtype)[:, None]
    n = jnp.maximum(jnp.sum(w), 1.0)
    mean = jnp.sum(z * w, 0) / n
    centred = (z - mean) * w
    std = jnp.sqrt(jnp.sum(centred**2, 0) / n + 1e-8)
    standardised = centred / std
    correlation = standardised.T @ standardised / n
    return jnp.sum(correlation**2) / z.shape[1] ** 2


def feddecorr(classifier: Classifier, client_optimizer: optax.GradientTransformation,
              server_optimizer: optax.GradientTransformation, schedule: LocalSchedule, beta: float = 0.1,
              weighting: Weighting = "num_examples") -> Algorithm:
    """Builds FedDecorr on top of FedAvg (any server optimiser)."""
    base = fedavg(classifier.loss, client_optimizer, server_optimizer, schedule, weighting)
    loss = classifier.loss_with(lambda features, inputs, mask: beta * decorrelation(features, mask))

    def client_update(server_state, client_state, client, arrays, key):
        delta, metrics = local_delta(server_state.params, loss, client_optimizer, client, arrays, key, schedule,
                                     task_loss=classifier.loss)
        return delta, client_state, metrics

    return base._replace(client_update=client_update)
