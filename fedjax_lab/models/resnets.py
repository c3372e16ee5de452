"""ResNets for 32x32 inputs, with BatchNorm or GroupNorm.

* ``resnet18``: the CIFAR variant of ResNet-18 used by FedImpro and FedCOG (3x3 stem with 64 channels and
  stride 1, no max-pool, BasicBlocks [2, 2, 2, 2] with 64/128/256/512 channels, 1x1 projection shortcuts;
  11,173,962 parameters with 10 classes). Stages ``stem, layer1, ..., layer4, pool``; FedImpro's "5th, 9th,
  13th, 17th layer" splits are ``layer1 .. layer4`` (the last taken after pooling, i.e. ``pool``).
* ``resnet8``: He et al.'s CIFAR ResNet with 6n+2 layers, n=1 (16/32/64 channels), as in FedDF.

``remat=True`` rematerialises each residual block (``nn.remat``): the backward pass recomputes a block's
activations from its input instead of keeping them, so a client's step can hold one block's activations and
the blocks' inputs rather than every layer's, for about one more forward pass of compute. The parameters,
their names and the function computed are the same either way.

References:
  He et al., "Deep Residual Learning for Image Recognition", CVPR 2016.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_lab.models.layers import Conv, ConvLowering, Norm, Normalization
from fedjax_lab.models.staged import StagedModel


class BasicBlock(nn.Module):
    """conv3x3-norm-ReLU-conv3x3-norm plus a shortcut (1x1 conv + norm when the shape changes), then ReLU."""

    features: int
    stride: int = 1
    norm: Norm = "batch"
    groups: int = 2
    lowering: ConvLowering = "xla"

    @nn.compact
    def __call__(self, x: jax.Array, train: bool, mask: jax.Array | None) -> jax.Array:
        conv = lambda f, k, s: Conv(f, (k, k), k // 2, use_bias=False, lowering=self.lowering, strides=(s, s))
        h = nn.relu(Normalization(self.norm, self.groups)(conv(self.features, 3, self.stride)(x),
                                                          train, mask))
        h = Normalization(self.norm, self.groups)(conv(self.features, 3, 1)(h), train, mask)
        if self.stride != 1 or x.shape[-1] != self.features:
            x = Normalization(self.norm, self.groups)(conv(self.features, 1, self.stride)(x), train, mask)
        return nn.relu(h + x)


class ResNet(StagedModel):
    """A ResNet of BasicBlocks for small images; see the module docstring for the two standard sizes."""

    num_classes: int
    widths: Sequence[int] = (64, 128, 256, 512)
    blocks_per_stage: Sequence[int] = (2, 2, 2, 2)
    norm: Norm = "batch"
    groups: int = 2
    lowering: ConvLowering = "xla"
    remat: bool = False

    @property
    def stages(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("stem",) + tuple(f"layer{i + 1}" for i in range(len(self.widths))) + ("pool",)

    def setup(self):
        self.stem_conv = Conv(self.widths[0], (3, 3), 1, use_bias=False, lowering=self.lowering)
        self.stem_norm = Normalization(self.norm, self.groups)
        # train (argument 2, after self and x) is a Python bool: static under remat. Inside the clients'
        # step loops common-subexpression elimination cannot undo the recomputation (jax.checkpoint's docs).
        block = nn.remat(BasicBlock, static_argnums=(2,), prevent_cse=False) if self.remat else BasicBlock
        self.layers = [
            [block(width, stride=(2 if i > 0 and b == 0 else 1), norm=self.norm, groups=self.groups,
                        lowering=self.lowering)
             for b in range(count)]
            for i, (width, count) in enumerate(zip(self.widths, self.blocks_per_stage))]
        self.output = nn.Dense(self.num_classes)

    def stage(self, name, h, train, mask):
        if name == "stem":
            return nn.relu(self.stem_norm(self.stem_conv(h), train, mask))
        if name == "pool":
            return jnp.mean(h, axis=(1, 2))
        for block in self.layers[int(name[len("layer"):]) - 1]:
            h = block(h, train, mask)
        return h

    def head(self, h: jax.Array) -> jax.Array:
        return self.output(h)


def resnet18(num_classes: int, norm: Norm = "batch", groups: int = 2,
             lowering: ConvLowering = "xla", remat: bool = False) -> ResNet:
    """CIFAR ResNet-18 (see the module docstring)."""
    return ResNet(num_classes, (64, 128, 256, 512), (2, 2, 2, 2), norm, groups, lowering, remat)


def resnet8(num_classes: int, norm: Norm = "batch", groups: int = 2,
            lowering: ConvLowering = "xla", remat: bool = False) -> ResNet:
    """CIFAR ResNet-8 (6n+2, n=1; 16/32/64 channels)."""
    return ResNet(num_classes, (16, 32, 64), (1, 1, 1), norm, groups, lowering, remat)
