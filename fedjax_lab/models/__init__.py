"""Models: Flax modules with a named feature extractor / head split, and the task functions built on them."""

from fedjax_lab.models.classifiers import MLP, LogisticRegression
from fedjax_lab.models.tasks import Classifier, as_float, cross_entropy_loss, masked_mean

__all__ = ["MLP", "Classifier", "LogisticRegression", "as_float", "cross_entropy_loss", "masked_mean"]
