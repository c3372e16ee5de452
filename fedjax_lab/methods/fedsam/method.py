"""FedSAM: clients take sharpness-aware steps: the gradient is taken at ``w + rho g / ||g||`` (``g`` the batch
gradient at ``w``); ``rho = 0`` is FedAvg.

References:
  Qu et al., "Generalized Federated Learning via Sharpness Aware Minimization", ICML 2022;
  Foret et al., "Sharpness-Aware Minimization for Efficiently Improving Generalization", ICLR 2021.
"""

from __future__ import annotations

import jax
import optax

from fedjax_lab.engine.components import Component
from fedjax_lab.engine.local_training import GradFn


def sharpness_aware_grad(grad_fn: GradFn, rho: float) -> GradFn:
    """A ``GradFn`` returning the loss and model state at ``w`` and ``grad_fn``'s gradient at
    ``w + rho g / ||g||``."""

    def fn(params, model_state, batch, key):
        value, grads = grad_fn(params, model_state, batch, key)
        scale = rho / (optax.global_norm(grads) + 1e-12)
        perturbed = jax.tree.map(lambda p, g: p + scale * g, params, grads)
        return value, grad_fn(perturbed, model_state, batch, key)[1]

    return fn


def sharpness_aware(rho: float) -> Component:
    """FedSAM's change to the round: every local gradient is the sharpness-aware one."""
    return Component("fedsam", grad_fn=lambda view, grad_fn: sharpness_aware_grad(grad_fn, rho))


def build(config, context) -> tuple[Component, ...]:
    """The components of ``algorithm.name: fedsam`` (or of a ``fedsam`` plug-in)."""
    return (sharpness_aware(config.rho),)
