"""FedSAM: FedAvg whose clients take sharpness-aware steps: the gradient is taken at
``w + rho g / ||g||`` (``g`` the batch gradient at ``w``); ``rho = 0`` is FedAvg.

References:
  Qu et al., "Generalized Federated Learning via Sharpness Aware Minimization", ICML 2022;
  Foret et al., "Sharpness-Aware Minimization for Efficiently Improving Generalization", ICLR 2021.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import optax

from fedjax_lab.engine.aggregation import Weighting
from fedjax_lab.engine.local_training import LocalSchedule
from fedjax_lab.engine.types import Algorithm, LossFn
from fedjax_lab.methods.fedavg import fedavg, local_delta


def sharpness_aware(rho: float) -> Callable:
    """A ``value_and_grad`` for :func:`~fedjax_lab.engine.local_training.train_locally` that returns the loss and
    model state at ``w`` and the gradient at ``w + rho g / ||g||``."""

    def value_and_grad(loss, has_aux=True):
        plain = jax.value_and_grad(loss, has_aux=has_aux)

        def fn(params, model_state, batch, key):
            value, grads = plain(params, model_state, batch, key)
            scale = rho / (optax.global_norm(grads) + 1e-12)
            perturbed = jax.tree.map(lambda p, g: p + scale * g, params, grads)
            return value, plain(perturbed, model_state, batch, key)[1]

        return fn

    return value_and_grad


def fedsam(loss_fn: LossFn, client_optimizer: optax.GradientTransformation,
           server_optimizer: optax.GradientTransformation, schedule: LocalSchedule, rho: float,
           weighting: Weighting = "num_examples") -> Algorithm:
    """Builds FedSAM (any server optimiser)."""
    base = fedavg(loss_fn, client_optimizer, server_optimizer, schedule, weighting)
    value_and_grad = sharpness_aware(rho)

    def client_update(server_state, client_state, client, arrays, key):
        delta, metrics = local_delta(server_state.params, loss_fn, client_optimizer, client, arrays, key, schedule,
                                     value_and_grad=value_and_grad)
        return delta, client_state, metrics

    return base._replace(client_update=client_update)
