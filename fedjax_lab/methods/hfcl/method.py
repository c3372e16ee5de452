"""HFCL: the server trains on its own data exactly as a client would, and its update joins the aggregate.

Feddle's in-domain baseline (Elbir et al. 2021): each server step the server runs the clients' local recipe
(their optimiser and schedule) from the global model on its in-domain data, and its delta is averaged with the
clients' with the weight of a client of that size (``weighting: num_examples``) or of one client
(``uniform``).

References:
  Elbir, Coleri and Mishra, "Hybrid Federated and Centralized Learning", EUSIPCO 2021.
  Zhu et al., "Unlocking the Value of Decentralized Data", Sec. 5 (baselines).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from fedjax_lab.engine.components import Component, ServerView, component_key
from fedjax_lab.engine.local_training import LocalSchedule, train_locally
from fedjax_lab.engine.types import ClientData


def server_as_client(task: Any, optimizer: optax.GradientTransformation, schedule: LocalSchedule,
                     num_server_examples: int, weight: float) -> Component:
    """The averaged delta becomes ``(W mean_delta + weight Delta_server) / (W + weight)``, ``W`` the clients'
    total weight and ``Delta_server`` the server's local training on its ``num_server_examples`` rows."""

    def aggregate(view: ServerView, mean_delta):
        key = component_key(view.context.key, "hfcl")
        server = ClientData(jnp.int32(-1), jnp.arange(num_server_examples, dtype=jnp.int32),
                            jnp.int32(num_server_examples), key)
        trained, _ = train_locally(view.global_variables, task, optimizer, client=server,
                                   arrays=view.context.server_arrays, key=key, schedule=schedule)
        total = jnp.sum(view.weights)
        combined = jax.tree.map(lambda m, y, w: (total * m + weight * (y - w)) / (total + weight), mean_delta,
                                trained, view.global_variables)
        return combined, {}

    return Component("hfcl", aggregate=aggregate)


def build(config, context) -> tuple[Component, ...]:
    """The components of ``algorithm.name: hfcl``."""
    n = int(context.dataset.server["y"].shape[0])
    return (server_as_client(context.classifier, context.client_optimizer, context.schedule, n,
                             float(n) if context.config.algorithm.weighting == "num_examples" else 1.0),)
