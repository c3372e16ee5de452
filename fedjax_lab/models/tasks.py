"""From a Flax module to the functions the engine consumes: ``predict_fn`` and ``loss_fn``."""

from __future__ import annotations

import dataclasses
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from fedjax_lab.engine.types import LossFn, Params

Preprocess = Callable[[jax.Array], jax.Array]


def as_float(x: jax.Array) -> jax.Array:
    """Identity on floating inputs; integer images are scaled to ``[0, 1]``."""
    if jnp.issubdtype(x.dtype, jnp.integer):
        return x.astype(jnp.float32) / 255.0
    return x.astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class Classifier:
    """A Flax classifier together with the preprocessing of its raw inputs.

    Attributes:
      module: a Flax module mapping a float batch ``[B, *input_shape]`` to logits.
      input_shape: the shape of one raw example.
      preprocess: raw batch -> float batch, applied inside the compiled step (data stays raw on device).
    """

    module: nn.Module
    input_shape: tuple[int, ...]
    preprocess: Preprocess = as_float

    def init(self, key: jax.Array) -> Params:
        """Initial variables of the module."""
        return self.module.init(key, jnp.zeros((1,) + tuple(self.input_shape), jnp.float32))

    def predict(self, params: Params, x: jax.Array) -> jax.Array:
        """Logits of a raw batch."""
        return self.module.apply(params, self.preprocess(x))

    def num_params(self, params: Params) -> int:
        """The number of scalars in ``params``."""
        return sum(int(p.size) for p in jax.tree.leaves(params))


def masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """``sum(values * mask) / max(sum(mask), 1)``."""
    return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def cross_entropy_loss(predict_fn: Callable[[Params, jax.Array], jax.Array]) -> LossFn:
    """The mask-weighted mean softmax cross-entropy of a batch ``{'x', 'y', 'mask'}``."""

    def loss_fn(params: Params, batch, key: jax.Array) -> jax.Array:
        del key
        logits = predict_fn(params, batch["x"])
        return masked_mean(optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]), batch["mask"])

    return loss_fn
