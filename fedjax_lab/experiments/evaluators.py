"""What a run evaluates, from its config's ``eval`` section: the global model on the test set and on the
training rows, the clients' local models, and the gradient dissimilarity of the run's method."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from fedjax_lab import models
from fedjax_lab.data import FederatedDataset
from fedjax_lab.data.partitions import class_counts
from fedjax_lab.engine import Algorithm, AlgorithmAt, Evaluator, RoundInputs
from fedjax_lab.engine.dissimilarity import DissimilarityEvaluator, lower_mask
from fedjax_lab.engine.local_evaluation import LocalEvaluator
from fedjax_lab.engine.variables import split_variables
from fedjax_lab.experiments import hyperparams
from fedjax_lab.experiments.algorithms import build_algorithm
from fedjax_lab.experiments.config import Config, ConfigError


def measured_split(config: Config, module) -> str:
    """The stage ending the model's lower part for the dissimilarity measurement: ``eval.split``, else the
    split a method of the run declares (a ``split`` field: FedImpro's), else the middle stage."""
    declared = [m.split for m in (config.algorithm, *config.algorithm.plugins) if getattr(m, "split", None)]
    split = config.eval.split or (declared[0] if declared else None) or models.middle_stage(module)
    if split not in getattr(module, "stages", ()):
        raise ConfigError(f"eval.split must be a stage of model {config.model.name}: "
                          f"{list(getattr(module, 'stages', ()))}, got {split!r}")
    return split


def build_dissimilarity(config: Config, classifier: models.Classifier, dataset: FederatedDataset,
                        chunk_size: int | None) -> DissimilarityEvaluator:
    """The gradient-dissimilarity measurement of ``eval.dissimilarity`` (``engine/dissimilarity.py``): the
    run's method with one SGD step at rate 1 on ``eval.dissimilarity_examples`` rows as its local training."""
    if config.asynchrony is not None:
        raise ConfigError("eval.dissimilarity measures synchronous rounds; set asynchrony: null")
    unknown = sorted(set(config.eval.dissimilarity_counterfactual) - set(hyperparams.hyperparams(config)))
    if unknown:
        raise ConfigError(f"eval.dissimilarity_counterfactual: {unknown} are not hyper-parameters of this "
                          f"run; allowed: {sorted(hyperparams.hyperparams(config))}")
    client = config.client.model_copy(update={"optimizer": "sgd", "learning_rate": 1.0, "momentum": 0.0,
                                              "weight_decay": 0.0, "local_steps": 1, "local_epochs": None,
                                              "batch_size": config.eval.dissimilarity_examples})
    probe = config.model_copy(update={"client": client})
    split = measured_split(config, classifier.module)
    variables = classifier.variable_shapes
    mask = lower_mask(classifier.module, split_variables(variables)[0], classifier.model_input_shape(), split)
    ids = np.arange(min(config.eval.dissimilarity, dataset.num_clients))
    fixed = {"client.learning_rate": 1.0, "client.momentum": 0.0, "client.weight_decay": 0.0}

    def probe_at(inputs: RoundInputs, round_index, changes: dict[str, float] | None = None) -> Algorithm:
        values = hyperparams.values_at(config, inputs.hparams, round_index)
        # not the run's (scheduled) client values
        values.update({k: v for k, v in fixed.items() if k in values})
        values.update({k: jnp.asarray(v, jnp.float32) for k, v in (changes or {}).items()})
        return build_algorithm(hyperparams.with_values(probe, values), classifier, dataset, inputs.key, probe,
                               chunk_size or len(ids))

    counterfactual = config.eval.dissimilarity_counterfactual
    return DissimilarityEvaluator(probe_at, mask, ids, chunk_size,
                                  functools.partial(probe_at, changes=counterfactual)
                                  if counterfactual else None)


class Evaluators(NamedTuple):
    """What a run evaluates at its evaluation rounds, besides training."""

    test: Evaluator
    train: Evaluator | None = None
    local: LocalEvaluator | None = None
    dissimilarity: DissimilarityEvaluator | None = None


def build_evaluators(config: Config, classifier: models.Classifier, dataset: FederatedDataset,
                     algorithm_at: AlgorithmAt, chunk_size: int | None) -> Evaluators:
    """The evaluations ``eval`` asks for: the global model on the test set (per client too with
    ``eval.per_client``), on all training rows (``eval.train``), the local models of the first clients
    (``eval.local_models``) and the gradient dissimilarity (``eval.dissimilarity``)."""
    per_client = config.eval.per_client and dataset.client_test_ids is not None
    test = Evaluator(classifier.example_metrics, dataset.test, config.eval.batch_size,
                     dataset.client_test_ids if per_client else None,
                     dataset.client_test_counts if per_client else None)
    train = None
    if config.eval.train:
        rows = np.concatenate([dataset.client_train_ids[k, :n]
                               for k, n in enumerate(dataset.client_train_counts)])
        train = Evaluator(classifier.example_metrics,
                          {"x": dataset.train["x"][rows], "y": dataset.train["y"][rows]},
                          config.eval.batch_size, prefix="full_train", l2=classifier.l2)
    local = None
    if config.eval.local_models:
        ids = np.arange(min(config.eval.local_models, dataset.num_clients))
        rows = [dataset.client_train_ids[k, :dataset.client_train_counts[k]] for k in ids]
        mask = None
        if getattr(classifier.module, "stages", ()):  # the distance of the lower and upper parts too
            variables = classifier.variable_shapes
            mask = lower_mask(classifier.module, split_variables(variables)[0],
                              classifier.model_input_shape(), measured_split(config, classifier.module))
        local = LocalEvaluator(algorithm_at, classifier.example_metrics, dataset.test, dataset.num_classes,
                               ids, class_counts(dataset.train["y"], rows, dataset.num_classes),
                               config.eval.batch_size, chunk_size, mask)
    dissimilarity = (build_dissimilarity(config, classifier, dataset, chunk_size)
                     if config.eval.dissimilarity else None)

    return Evaluators(test, train, local, dissimilarity)
