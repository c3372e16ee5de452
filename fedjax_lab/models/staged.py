"""The interface every model of the zoo shares: named stages, a feature extractor and a head.

A model is a sequence of named stages followed by a head. ``features`` runs every stage (the representation
MOON, FedDecorr and FedWalk's leash head use), ``head`` maps features to outputs, and ``lower`` / ``upper``
split the network after any stage (FedImpro shares feature statistics at such a split). All take
``train`` (batch statistics vs running averages) and ``mask`` (real rows of a padded batch).
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax

from fedjax_lab.models.layers import check_stage


def middle_stage(module) -> str:
    """The middle of a model's stages: the default split of a lower and an upper part (``layer2`` of
    ResNet-18, FedImpro's 9th layer; ``conv2`` of the simple-CNN)."""
    return module.stages[len(module.stages) // 2 - 1]


class StagedModel(nn.Module):
    """Base class: subclasses set ``stages`` and implement ``stage`` and ``head``."""

    stages: ClassVar[tuple[str, ...]] = ()

    def stage(self, name: str, h: jax.Array, train: bool, mask: jax.Array | None) -> jax.Array:
        raise NotImplementedError

    def head(self, h: jax.Array) -> jax.Array:
        raise NotImplementedError

    def lower(self, x: jax.Array, split: str, train: bool = False,
              mask: jax.Array | None = None) -> jax.Array:
        """The activation after stage ``split``."""
        check_stage(split, self.stages, type(self).__name__)
        for name in self.stages[: self.stages.index(split) + 1]:
            x = self.stage(name, x, train, mask)
        return x

    def upper(self, h: jax.Array, split: str, train: bool = False,
              mask: jax.Array | None = None) -> jax.Array:
        """The outputs computed from the activation after stage ``split``."""
        check_stage(split, self.stages, type(self).__name__)
        for name in self.stages[self.stages.index(split) + 1:]:
            h = self.stage(name, h, train, mask)
        return self.head(h)

    def features(self, x: jax.Array, train: bool = False, mask: jax.Array | None = None) -> jax.Array:
        """The representation the head reads (after the last stage)."""
        return self.lower(x, self.stages[-1], train, mask)

    def __call__(self, x: jax.Array, train: bool = False, mask: jax.Array | None = None) -> jax.Array:
        return self.head(self.features(x, train, mask))
