"""The model of a run from its config: the Flax module of ``model.name`` (a table), its input pipeline,
augmentation and objective, checked against the dataset's inputs before anything compiles."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from fedjax_lab import models
from fedjax_lab.data import FederatedDataset, shakespeare
from fedjax_lab.experiments.config import Config, ConfigError
from fedjax_lab.models import augment


def default_lowering(backend: str) -> str:
    """The convolution lowering when ``model.lowering`` is ``auto``: ``banded`` on CPU, where XLA's
    convolution is slow for small CNNs and ResNets (ResNet-8's round ran 1.3x faster banded than with
    ``im2col``, ResNet-18's level: ``benchmarks/resnet_lowering.py``), and XLA's own elsewhere
    (docs/benchmarks.md has the measurements)."""
    return "banded" if backend == "cpu" else "xla"


def extra_outputs(algorithm, num_classes: int) -> int:
    """Outputs the methods add to the model beyond the dataset's classes (VHL's virtual classes): the sum of
    their configs' ``extra_outputs(num_classes)``."""
    return sum(m.extra_outputs(num_classes) for m in (algorithm, *algorithm.plugins)
               if hasattr(m, "extra_outputs"))


def _resnet(m, k: int, lowering: str) -> nn.Module:
    return getattr(models, m.name)(k, m.norm, m.groups, lowering, remat=m.remat == "blocks")


CONV_MODELS = ("simple_cnn", "fedavg_cnn", "bherd_cnn", "cnn3", "feddle_cnn", "pfl_cnn", "resnet8",
               "resnet18")
"""The convolutional models (the CPU's default cohort loop trains them one client at a time)."""


MODELS: dict[str, Callable[[Any, int, str], nn.Module]] = {
    "logistic_regression": lambda m, k, lowering: models.LogisticRegression(k),
    "linear_svm": lambda m, k, lowering: models.LinearSVM(),
    "mlp": lambda m, k, lowering: models.MLP(k, tuple(m.hidden)),
    "simple_cnn": lambda m, k, lowering: models.SimpleCNN(k, lowering),
    "bherd_cnn": lambda m, k, lowering: models.BHerdCNN(k, lowering),
    "cnn3": lambda m, k, lowering: models.CNN3(k, lowering),
    "feddle_cnn": lambda m, k, lowering: models.FeddleCNN(k, lowering),
    "pfl_cnn": lambda m, k, lowering: models.PflCNN(k, lowering),
    "fedavg_cnn": lambda m, k, lowering: models.FedAvgCNN(k, m.padding, lowering),
    "resnet8": _resnet,
    "resnet18": _resnet,
    "char_rnn": lambda m, k, lowering: models.CharRNN(k, m.embed_dim, m.rnn_hidden),
}
"""``model.name`` -> ``(model config, outputs, convolution lowering) -> Flax module``."""


def build_module(config: Config, dataset: FederatedDataset) -> nn.Module:
    """The Flax module named by ``config.model``, sized for the dataset."""
    m, k = config.model, dataset.num_classes + extra_outputs(config.algorithm, dataset.num_classes)
    if m.name == "linear_svm" and k != 2:
        raise ConfigError(f"model.name: linear_svm needs 2 classes, {dataset.name} has {k}; "
                          "set dataset.labels=parity")
    lowering = default_lowering(jax.default_backend()) if m.lowering == "auto" else m.lowering
    return MODELS[m.name](m, k, lowering)


def build_augment(config: Config, dataset: FederatedDataset):
    """The training augmentation: crop/flip from ``dataset.augment`` and feature-skew noise, chained."""
    steps = []
    if getattr(config.dataset, "augment", "none") == "crop_flip":
        steps.append(augment.crop_and_flip)
    elif getattr(config.dataset, "augment", "none") == "flip":
        steps.append(augment.random_flip)
    if "noise_std" in dataset.train:
        steps.append(augment.gaussian_noise)
    return augment.chain(*steps) if steps else None


def build_classifier(config: Config, dataset: FederatedDataset) -> models.Classifier:
    """The model of ``config.model`` with its input pipeline and objective; checks that it fits the data.

    Raises:
      ConfigError: the model cannot take the dataset's inputs (checked by shape inference, before compiling).
    """
    module = build_module(config, dataset)
    if config.dataset.name == "shakespeare":
        if config.model.name != "char_rnn":
            raise ConfigError(f"model.name: shakespeare needs char_rnn (token inputs), "
                              f"got {config.model.name!r}")
        classifier = models.Classifier(module, dataset.input_shape, models.as_tokens,
                                       pad_label=shakespeare.PAD, input_dtype="int32",
                                       precision=config.model.precision)
    else:
        if config.model.name == "char_rnn":
            raise ConfigError(f"model.name: char_rnn needs token inputs (dataset shakespeare), got "
                              f"{config.dataset.name!r}")
        standardize = getattr(config.dataset, "standardize", False) and dataset.train["x"].dtype == np.uint8
        preprocess = models.Standardize.fit(dataset.train["x"]) if standardize else models.as_float
        classifier = models.Classifier(
            module, dataset.input_shape, preprocess,
            objective="squared_hinge" if config.model.name == "linear_svm" else "cross_entropy",
            l2=config.model.l2, augment=build_augment(config, dataset), precision=config.model.precision)
    try:
        _ = classifier.variable_shapes  # traced here, so that a misfit is reported before compiling
    except Exception as exc:  # noqa: BLE001 - any failure of shape inference means the model does not fit
        raise ConfigError(f"model.name: {config.model.name} does not fit inputs of shape "
                          f"{dataset.input_shape} from dataset.name={config.dataset.name}: "
                          f"{str(exc).splitlines()[0]}") from None

    return classifier
