"""Dense classifiers in Flax. Each exposes ``features`` (everything below the last layer) and ``head`` (the last
layer) by name, so that methods which treat the two apart (FedImpro, FedWalk's leash head, MOON) can."""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax


class LogisticRegression(nn.Module):
    """Multinomial logistic regression: ``logits = W flatten(x) + b``."""

    num_classes: int

    def setup(self):
        self.output = nn.Dense(self.num_classes, name="output")

    def features(self, x: jax.Array) -> jax.Array:
        return x.reshape((x.shape[0], -1))

    def head(self, h: jax.Array) -> jax.Array:
        return self.output(h)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.head(self.features(x))


class MLP(nn.Module):
    """Fully connected ReLU network, e.g. the 784-200-200-10 "2NN" of the FedAvg paper."""

    num_classes: int
    hidden: Sequence[int] = (200, 200)

    def setup(self):
        self.hidden_layers = [nn.Dense(width, name=f"hidden_{i}") for i, width in enumerate(self.hidden)]
        self.output = nn.Dense(self.num_classes, name="output")

    def features(self, x: jax.Array) -> jax.Array:
        h = x.reshape((x.shape[0], -1))
        for layer in self.hidden_layers:
            h = nn.relu(layer(h))
        return h

    def head(self, h: jax.Array) -> jax.Array:
        return self.output(h)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.head(self.features(x))
