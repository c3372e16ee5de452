"""Staleness functions ``s(tau)``: how much an update that is ``tau`` rounds old counts, for FedAsync and
FedBuff.

References:
  Xie, Koyejo and Gupta, "Asynchronous Federated Optimization", 2019, Sec. 5.2 (constant, polynomial, hinge).
  Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation", AISTATS 2022
  (``1/sqrt(1+tau)``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import jax
import jax.numpy as jnp

StalenessKind = Literal["constant", "polynomial", "hinge"]


def staleness_function(kind: StalenessKind, a: float | jax.Array = 0.5,
                       b: float | jax.Array = 4.0) -> Callable[[jax.Array], jax.Array]:
    """``s(tau)`` as a function of int staleness:

    * ``constant``: ``1``;
    * ``polynomial``: ``(1 + tau)^-a`` (``a = 0.5`` is FedBuff's ``1/sqrt(1 + tau)``);
    * ``hinge``: ``1`` for ``tau <= b``, else ``1 / (a (tau - b) + 1)``.
    """
    if kind == "constant":
        return lambda tau: jnp.ones(jnp.shape(tau), jnp.float32)
    if kind == "polynomial":
        return lambda tau: jnp.power(1.0 + tau.astype(jnp.float32), -a)
    if kind == "hinge":
        return lambda tau: jnp.where(tau <= b, 1.0, 1.0 / (a * (tau.astype(jnp.float32) - b) + 1.0))
    raise ValueError(f"staleness must be constant, polynomial or hinge, got {kind!r}")
