"""Models: the zoo of Flax modules (each with named stages, a feature extractor and a head) and
:class:`Classifier`, which turns a module into the engine's loss and evaluation metrics."""

from fedjax_lab.models.classifiers import MLP, LinearSVM, LogisticRegression
from fedjax_lab.models.cnns import CNN3, BHerdCNN, FedAvgCNN, FeddleCNN, PflCNN, SimpleCNN
from fedjax_lab.models.recurrent import CharRNN
from fedjax_lab.models.resnets import ResNet, resnet8, resnet18
from fedjax_lab.models.staged import StagedModel, middle_stage
from fedjax_lab.models.tasks import (
    Classifier,
    Standardize,
    as_float,
    as_tokens,
    cross_entropy_loss,
    masked_mean,
)

__all__ = [
    "CNN3", "MLP", "BHerdCNN", "CharRNN", "Classifier", "FedAvgCNN", "FeddleCNN", "LinearSVM",
    "LogisticRegression", "PflCNN", "ResNet", "SimpleCNN", "StagedModel", "Standardize", "as_float",
    "as_tokens", "cross_entropy_loss", "masked_mean", "middle_stage", "resnet8", "resnet18",
]
