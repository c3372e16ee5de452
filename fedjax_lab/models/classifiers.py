"""Dense models: logistic regression, the linear SVM and the MLP, with the stage interface of
:mod:`.staged`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import flax.linen as nn
import jax

from fedjax_lab.models.layers import flatten
from fedjax_lab.models.staged import StagedModel


class LogisticRegression(StagedModel):
    """Multinomial logistic regression: ``logits = W flatten(x) + b``."""

    num_classes: int
    stages: ClassVar[tuple[str, ...]] = ("flatten",)

    def setup(self):
        self.output = nn.Dense(self.num_classes, name="output")

    def stage(self, name, h, train, mask):
        return flatten(h)

    def head(self, h: jax.Array) -> jax.Array:
        return self.output(h)


class LinearSVM(StagedModel):
    """The linear score ``w^T flatten(x)`` (no bias, zero init) of BHerd's squared-hinge SVM; train it with
    the ``squared_hinge`` objective of :class:`~fedjax_lab.models.tasks.Classifier`."""

    stages: ClassVar[tuple[str, ...]] = ("flatten",)

    def setup(self):
        self.output = nn.Dense(1, use_bias=False, kernel_init=nn.initializers.zeros, name="output")

    def stage(self, name, h, train, mask):
        return flatten(h)

    def head(self, h: jax.Array) -> jax.Array:
        return self.output(h)[:, 0]


class MLP(StagedModel):
    """Fully connected ReLU network, e.g. the 784-200-200-10 "2NN" of the FedAvg paper; stages
    ``hidden_0, hidden_1, ...``."""

    num_classes: int
    hidden: Sequence[int] = (200, 200)

    @property
    def stages(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(f"hidden_{i}" for i in range(len(self.hidden)))

    def setup(self):
        self.hidden_layers = [nn.Dense(width, name=f"hidden_{i}") for i, width in enumerate(self.hidden)]
        self.output = nn.Dense(self.num_classes, name="output")

    def stage(self, name, h, train, mask):
        i = int(name.rsplit("_", 1)[1])
        return nn.relu(self.hidden_layers[i](flatten(h)))

    def head(self, h: jax.Array) -> jax.Array:
        return self.output(h)
