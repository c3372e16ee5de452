"""From a validated :class:`Config` to the pieces of a run: data, model, algorithm and compiled round loop."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax

from fedjax_lab.data import FederatedDataset, fedprox_synthetic, gaussian_mixture
from fedjax_lab.engine import (Algorithm, CohortPlan, Evaluator, LocalSchedule, LoopState, RoundInputs,
                               init_loop_state, make_run_rounds, randomness)
from fedjax_lab.experiments.config import Config, ConfigError
from fedjax_lab.methods import server_optimizers
from fedjax_lab.methods.fedavg import fedavg
from fedjax_lab.models import MLP, Classifier, LogisticRegression, cross_entropy_loss


def build_dataset(config: Config) -> FederatedDataset:
    """The federated dataset named by ``config.dataset``."""
    d = config.dataset
    seed = config.seed if d.seed is None else d.seed
    if d.name == "synthetic":
        return fedprox_synthetic(d.alpha, d.beta, d.num_clients, d.iid, d.dimension, d.num_classes,
                                 d.train_fraction, seed)
    if d.name == "gaussian_mixture":
        return gaussian_mixture(d.num_clients, d.examples_per_client, d.num_classes, d.dimension, d.separation,
                                d.label_alpha, d.train_fraction, seed)
    raise ConfigError(f"dataset.name: unknown dataset {d.name!r}")


def build_classifier(config: Config, dataset: FederatedDataset) -> Classifier:
    """The model named by ``config.model``, sized for the dataset."""
    m = config.model
    if m.name == "logistic_regression":
        module = LogisticRegression(dataset.num_classes)
    elif m.name == "mlp":
        module = MLP(dataset.num_classes, tuple(m.hidden))
    else:
        raise ConfigError(f"model.name: unknown model {m.name!r}")
    return Classifier(module, dataset.input_shape)


def build_client_optimizer(config: Config) -> optax.GradientTransformation:
    """The clients' optax optimiser."""
    c = config.client
    if c.optimizer == "sgd":
        opt = optax.sgd(c.learning_rate, momentum=c.momentum or None)
    else:
        opt = optax.adam(c.learning_rate)
    return optax.chain(optax.add_decayed_weights(c.weight_decay), opt) if c.weight_decay else opt


def build_server_optimizer(config: Config) -> optax.GradientTransformation:
    """The server optimiser that makes ``config.algorithm.name`` out of FedAvg."""
    a = config.algorithm
    if a.name == "fedavg":
        return server_optimizers.fedavg_server(a.server_learning_rate)
    if a.name == "fedavgm":
        return server_optimizers.fedavgm_server(a.server_learning_rate, a.server_momentum)
    rule = {"fedadam": "adam", "fedyogi": "yogi", "fedadagrad": "adagrad"}[a.name]
    return server_optimizers.reddi_server(rule, a.server_learning_rate, a.beta1, a.beta2, a.tau)


def build_schedule(config: Config, dataset: FederatedDataset) -> LocalSchedule:
    c = config.client
    return LocalSchedule(c.batch_size, c.local_steps, c.local_epochs, min_examples=dataset.min_examples,
                         unroll=config.rounds.unroll)


def default_chunk_size(cohort_size: int, backend: str) -> int | None:
    """The execution default when ``rounds.chunk_size`` is unset: on CPU, clients two at a time (measured 1.8-4.1x
    faster than vmapping the whole cohort, docs/benchmarks.md); elsewhere the whole cohort at once."""
    if backend != "cpu":
        return None
    return 2 if cohort_size % 2 == 0 else 1


def build_algorithm(config: Config, classifier: Classifier, dataset: FederatedDataset) -> Algorithm:
    """The FL algorithm of ``config.algorithm``."""
    return fedavg(classifier.loss, build_client_optimizer(config),
                  build_server_optimizer(config), build_schedule(config, dataset), config.algorithm.weighting)


@dataclasses.dataclass
class Experiment:
    """Everything a run needs, built and placed on the device, not yet compiled."""

    config: Config
    dataset: FederatedDataset
    classifier: Classifier
    algorithm: Algorithm
    plan: CohortPlan
    inputs: RoundInputs
    evaluator: Evaluator
    run_rounds: Any

    def initial_state(self) -> LoopState:
        """The loop state before round 0; the model is initialised from the run's seed."""
        params = self.classifier.init(randomness.init_key(self.inputs.key))
        return init_loop_state(self.algorithm, params, self.dataset.num_clients)

    def evaluate(self, state: LoopState) -> dict[str, float]:
        """Central test metrics (and per-client spread, when configured) of the global model."""
        return self.evaluator(self.algorithm.model_params(state.server_state))


def build_experiment(config: Config) -> Experiment:
    """Builds data, model and algorithm, checks that they fit each other, and moves the data to the device.

    Raises:
      ConfigError: when the data and the config disagree (e.g. a cohort larger than the population).
    """
    dataset = build_dataset(config)
    if config.rounds.clients_per_round > dataset.num_clients:
        raise ConfigError(f"rounds.clients_per_round must be <= the number of clients ({dataset.num_clients}), "
                          f"got {config.rounds.clients_per_round}")
    classifier = build_classifier(config, dataset)
    algorithm = build_algorithm(config, classifier, dataset)
    chunk_size = config.rounds.chunk_size or default_chunk_size(config.rounds.clients_per_round,
                                                                 jax.default_backend())
    plan = CohortPlan(dataset.num_clients, config.rounds.clients_per_round, chunk_size)
    inputs = RoundInputs(
        key=randomness.base_key(config.seed),
        train_arrays=jax.device_put(dataset.train),
        client_example_ids=jnp.asarray(dataset.client_train_ids),
        client_num_examples=jnp.asarray(dataset.client_train_counts),
        server_arrays={},
    )
    per_client = config.eval.per_client and dataset.client_test_ids is not None
    evaluator = Evaluator(classifier.example_metrics, dataset.test, config.eval.batch_size,
                          dataset.client_test_ids if per_client else None,
                          dataset.client_test_counts if per_client else None)
    return Experiment(config, dataset, classifier, algorithm, plan, inputs, evaluator,
                      make_run_rounds(algorithm, plan))
