"""FedDecorr: clients penalise dimensional collapse of the representation, ``beta * ||K||_F^2 / d^2`` with
``K`` the correlation matrix of the batch's ``d``-dimensional features (standardised over the batch).
``beta = 0`` is FedAvg.

The official code normalises differently from the paper's formula (their ``beta`` differs by about the batch
size; see ``docs/baselines.md``); this is the paper's form.

References:
  Shi et al., "Towards Understanding and Mitigating Dimensional Collapse in Heterogeneous Federated Learning",
  ICLR 2023, Eq. (5).
"""

from __future__ import annotations

import jax.numpy as jnp

from fedjax_lab.engine.components import Component


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


def decorrelated(beta: float) -> Component:
    """FedDecorr's change to the round: ``beta`` times the decorrelation penalty of each batch's features."""

    def loss_term(view):
        return lambda variables, batch, forward: beta * decorrelation(forward.features, batch["mask"])

    return Component("feddecorr", loss_term=loss_term, needs_features=True)


def build(config, context) -> tuple[Component, ...]:
    """The components of ``algorithm.name: feddecorr`` (or of a ``feddecorr`` plug-in)."""
    return (decorrelated(config.beta),)
