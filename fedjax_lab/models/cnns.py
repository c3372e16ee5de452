"""The convolutional networks of the papers, exact in shape and parameter count.

Every model takes ``lowering`` ('xla' or 'im2col', speed only; see :mod:`.layers`) and exposes named stages.

References:
  NIID-Bench simple-CNN: Li et al., "Federated Learning on Non-IID Data Silos: An Experimental Study",
  ICDE 2022.
  FedAvg CNN: McMahan et al., AISTATS 2017 (1,663,370 parameters on MNIST with SAME padding).
  BHerd CNN: the BHerd reference code (two 5x5x32 convolutions with LRN).
  FedCOG CIFAR-100 CNN: Ye et al., "Fake It Till Make It", CVPR 2024 (69,380 parameters).
  Feddle CNN: Zhu et al., "Unlocking the Value of Decentralized Data: A Federated Dual Learning Approach for
  Model Aggregation", App. D ("three convolutional layers, one pooling layer, and two fully connected
  layers").
  pfl CNN: Granqvist et al., "pfl-research: simulation framework for accelerating research in Private
  Federated Learning", NeurIPS 2024 datasets and benchmarks; its CIFAR-10 benchmark's ``simple_cnn``
  (apple/pfl-research, benchmarks/model).
"""

from __future__ import annotations

from typing import ClassVar, Literal

import flax.linen as nn
import jax

from fedjax_lab.models.layers import Conv, ConvLowering, flatten, local_response_norm, max_pool_2x2
from fedjax_lab.models.staged import StagedModel


class SimpleCNN(StagedModel):
    """NIID-Bench / MOON / FedCOG "simple-CNN": conv5x5-6, pool, conv5x5-16, pool, fc120, fc84, fc
    (VALID padding; 62,006 parameters on CIFAR-10, 44,426 on 28x28x1)."""

    num_classes: int
    lowering: ConvLowering = "xla"
    stages: ClassVar[tuple[str, ...]] = ("conv1", "conv2", "fc1", "fc2")

    def setup(self):
        self.conv1 = Conv(6, (5, 5), "VALID", lowering=self.lowering)
        self.conv2 = Conv(16, (5, 5), "VALID", lowering=self.lowering)
        self.fc1, self.fc2 = nn.Dense(120), nn.Dense(84)
        self.output = nn.Dense(self.num_classes)

    def stage(self, name, h, train, mask):
        if name in ("conv1", "conv2"):
            return max_pool_2x2(nn.relu(getattr(self, name)(h)))
        if name == "fc1":
            h = flatten(h)
        return nn.relu(getattr(self, name)(h))

    def head(self, h: jax.Array) -> jax.Array:
        return self.output(h)


class FedAvgCNN(StagedModel):
    """The CNN of the FedAvg paper: conv5x5-32, pool, conv5x5-64, pool, fc512, fc.

    ``padding='SAME'`` is the paper's (1,663,370 parameters on MNIST); ``'VALID'`` is what the PyTorch
    libraries (FL-bench, PFLlib, FedLab) build (582,026 on MNIST, 878,538 on CIFAR-10).
    """

    num_classes: int
    padding: Literal["SAME", "VALID"] = "SAME"
    lowering: ConvLowering = "xla"
    stages: ClassVar[tuple[str, ...]] = ("conv1", "conv2", "fc1")

    def setup(self):
        self.conv1 = Conv(32, (5, 5), self.padding, lowering=self.lowering)
        self.conv2 = Conv(64, (5, 5), self.padding, lowering=self.lowering)
        self.fc1 = nn.Dense(512)
        self.output = nn.Dense(self.num_classes)

    def stage(self, name, h, train, mask):
        if name == "fc1":
            return nn.relu(self.fc1(flatten(h)))
        return max_pool_2x2(nn.relu(getattr(self, name)(h)), self.padding)

    def head(self, h: jax.Array) -> jax.Array:
        return self.output(h)


_bherd_kernel_init = nn.initializers.truncated_normal(0.1)
_bherd_bias_init = nn.initializers.constant(0.1)


class BHerdCNN(StagedModel):
    """BHerd's CNN: conv5x5-32 (SAME), ReLU, pool, LRN, conv5x5-32, ReLU, LRN, pool, fc256, fc; truncated
    normal(0.1) weights and 0.1 biases (430,698 parameters on MNIST, 555,178 on CIFAR-10)."""

    num_classes: int
    lowering: ConvLowering = "xla"
    stages: ClassVar[tuple[str, ...]] = ("conv1", "conv2", "fc1")

    def setup(self):
        inits = {"kernel_init": _bherd_kernel_init, "bias_init": _bherd_bias_init}
        self.conv1 = Conv(32, (5, 5), "SAME", lowering=self.lowering, **inits)
        self.conv2 = Conv(32, (5, 5), "SAME", lowering=self.lowering, **inits)
        self.fc1 = nn.Dense(256, **inits)
        self.output = nn.Dense(self.num_classes, **inits)

    def stage(self, name, h, train, mask):
        if name == "conv1":
            return local_response_norm(max_pool_2x2(nn.relu(self.conv1(h)), "SAME"))
        if name == "conv2":
            return max_pool_2x2(local_response_norm(nn.relu(self.conv2(h))), "SAME")
        return nn.relu(self.fc1(flatten(h)))

    def head(self, h: jax.Array) -> jax.Array:
        return self.output(h)


class CNN3(StagedModel):
    """FedCOG's CIFAR-100 CNN: three conv3x3 (16, 32, 64; VALID) each with ReLU and pool, fc128, fc
    (69,380 parameters with 100 classes)."""

    num_classes: int
    lowering: ConvLowering = "xla"
    stages: ClassVar[tuple[str, ...]] = ("conv1", "conv2", "conv3", "fc1")

    def setup(self):
        self.conv1 = Conv(16, (3, 3), "VALID", lowering=self.lowering)
        self.conv2 = Conv(32, (3, 3), "VALID", lowering=self.lowering)
        self.conv3 = Conv(64, (3, 3), "VALID", lowering=self.lowering)
        self.fc1 = nn.Dense(128)
        self.output = nn.Dense(self.num_classes)

    def stage(self, name, h, train, mask):
        if name == "fc1":
            return nn.relu(self.fc1(flatten(h)))
        return max_pool_2x2(nn.relu(getattr(self, name)(h)))

    def head(self, h: jax.Array) -> jax.Array:
        return self.output(h)


class FeddleCNN(StagedModel):
    """Feddle's small CNN trained from scratch (its Table 5): three conv3x3 (16, 32, 32; VALID) with ReLU, one
    2x2 max pool, fc64, fc. The paper gives only the layer counts; the widths are ours (docs/asynchronous.md).
    361,162 parameters on 32x32x3 with 10 classes, 262,570 on 28x28x1."""

    num_classes: int
    lowering: ConvLowering = "xla"
    stages: ClassVar[tuple[str, ...]] = ("conv1", "conv2", "conv3", "fc1")

    def setup(self):
        self.conv1 = Conv(16, (3, 3), "VALID", lowering=self.lowering)
        self.conv2 = Conv(32, (3, 3), "VALID", lowering=self.lowering)
        self.conv3 = Conv(32, (3, 3), "VALID", lowering=self.lowering)
        self.fc1 = nn.Dense(64)
        self.output = nn.Dense(self.num_classes)

    def stage(self, name, h, train, mask):
        if name == "fc1":
            return nn.relu(self.fc1(flatten(h)))
        h = nn.relu(getattr(self, name)(h))
        return max_pool_2x2(h) if name == "conv3" else h

    def head(self, h: jax.Array) -> jax.Array:
        return self.output(h)


class PflCNN(StagedModel):
    """pfl-research's CIFAR-10 benchmark CNN: conv3x3-32, conv3x3-64 (VALID, ReLU), 2x2 max pool, dropout
    0.25, fc128 (ReLU), dropout 0.5, fc; Glorot-uniform kernels as its code (zero biases, Flax's default).
    1,626,442 parameters on 32x32x3 with 10 classes.

    Dropout acts in training passes that carry a ``'dropout'`` key (the training loss's,
    :meth:`~fedjax_lab.models.Classifier.apply_train`); every other pass (evaluation, and the methods'
    own passes in training mode) is deterministic.
    """

    num_classes: int
    lowering: ConvLowering = "xla"
    stages: ClassVar[tuple[str, ...]] = ("conv1", "conv2", "fc1")
    uses_dropout: ClassVar[bool] = True

    def setup(self):
        glorot = nn.initializers.glorot_uniform()
        self.conv1 = Conv(32, (3, 3), "VALID", lowering=self.lowering, kernel_init=glorot)
        self.conv2 = Conv(64, (3, 3), "VALID", lowering=self.lowering, kernel_init=glorot)
        self.fc1 = nn.Dense(128, kernel_init=glorot)
        self.output = nn.Dense(self.num_classes, kernel_init=glorot)
        self.dropout_conv, self.dropout_fc = nn.Dropout(0.25), nn.Dropout(0.5)

    def stage(self, name, h, train, mask):
        deterministic = not (train and self.has_rng("dropout"))
        if name == "conv1":
            return nn.relu(self.conv1(h))
        if name == "conv2":
            return self.dropout_conv(max_pool_2x2(nn.relu(self.conv2(h))), deterministic=deterministic)
        return self.dropout_fc(nn.relu(self.fc1(flatten(h))), deterministic=deterministic)

    def head(self, h: jax.Array) -> jax.Array:
        return self.output(h)
