"""From a validated :class:`Config` to the pieces of a run: data, model, algorithm and compiled round loop."""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_lab import models
from fedjax_lab.data import FederatedDataset
from fedjax_lab.engine import (
    Algorithm,
    CohortPlan,
    Evaluator,
    LocalSchedule,
    LoopState,
    RoundInputs,
    init_loop_state,
    make_run_rounds,
    randomness,
)
from fedjax_lab.experiments.config import Config, ConfigError
from fedjax_lab.experiments.datasets import build_dataset, reference_view
from fedjax_lab.methods import server_optimizers
from fedjax_lab.methods.fedavg import fedavg
from fedjax_lab.methods.feddecorr import feddecorr
from fedjax_lab.methods.feddyn import feddyn
from fedjax_lab.methods.fedexp import fedexp
from fedjax_lab.methods.fednova import fednova
from fedjax_lab.methods.fedprox import fedprox
from fedjax_lab.methods.fedsam import fedsam
from fedjax_lab.methods.fedwalk import FedWalkState, LeashTask, fedwalk, pretrain_on_leash
from fedjax_lab.methods.moon import moon
from fedjax_lab.methods.scaffold import scaffold
from fedjax_lab.models import augment


def default_lowering(backend: str) -> str:
    """The convolution lowering when ``model.lowering`` is ``auto``: ``banded`` on CPU, where XLA's convolution
    is slow for small CNNs, and XLA's own elsewhere (docs/benchmarks.md has the measurements)."""
    return "banded" if backend == "cpu" else "xla"


def build_module(config: Config, dataset: FederatedDataset) -> nn.Module:
    """The Flax module named by ``config.model``, sized for the dataset."""
    m, k = config.model, dataset.num_classes
    lowering = default_lowering(jax.default_backend()) if m.lowering == "auto" else m.lowering
    if m.name == "char_rnn":
        return models.CharRNN(k, m.embed_dim, m.rnn_hidden)
    if m.name in ("resnet8", "resnet18"):
        return getattr(models, m.name)(k, m.norm, m.groups)
    if m.name == "fedavg_cnn":
        return models.FedAvgCNN(k, m.padding, lowering)
    if m.name in ("simple_cnn", "bherd_cnn", "cnn3"):
        cls = {"simple_cnn": models.SimpleCNN, "bherd_cnn": models.BHerdCNN, "cnn3": models.CNN3}[m.name]
        return cls(k, lowering)
    if m.name == "mlp":
        return models.MLP(k, tuple(m.hidden))
    if m.name == "linear_svm":
        if k != 2:
            raise ConfigError(f"model.name: linear_svm needs 2 classes, {dataset.name} has {k}; "
                              "set dataset.labels=parity")
        return models.LinearSVM()
    return models.LogisticRegression(k)


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
            raise ConfigError(f"model.name: shakespeare needs char_rnn (token inputs), got {config.model.name!r}")
        classifier = models.Classifier(module, dataset.input_shape, models.as_tokens, pad_label=0,
                                       input_dtype="int32")
    else:
        if config.model.name == "char_rnn":
            raise ConfigError(f"model.name: char_rnn needs token inputs (dataset shakespeare), got "
                              f"{config.dataset.name!r}")
        standardize = getattr(config.dataset, "standardize", False) and dataset.train["x"].dtype == np.uint8
        preprocess = models.Standardize.fit(dataset.train["x"]) if standardize else models.as_float
        classifier = models.Classifier(
            module, dataset.input_shape, preprocess,
            objective="squared_hinge" if config.model.name == "linear_svm" else "cross_entropy",
            l2=config.model.l2, augment=build_augment(config, dataset))
    try:
        jax.eval_shape(classifier.init, jax.random.key(0))
    except Exception as exc:  # noqa: BLE001 - any failure of shape inference means the model does not fit
        raise ConfigError(f"model.name: {config.model.name} does not fit inputs of shape {dataset.input_shape} "
                          f"from dataset.name={config.dataset.name}: {str(exc).splitlines()[0]}") from None
    return classifier


def build_client_optimizer(config: Config) -> optax.GradientTransformation:
    """The clients' optax optimiser."""
    c = config.client
    if c.optimizer == "sgd":
        opt = optax.sgd(c.learning_rate, momentum=c.momentum or None)
    else:
        opt = optax.adam(c.learning_rate)
    return optax.chain(optax.add_decayed_weights(c.weight_decay), opt) if c.weight_decay else opt


REFERENCES = ("centralized", "server_only")
"""Reference runs: FedAvg on one client holding the pooled training data, or only the server's data."""

FEDAVG_FAMILY = {"fedavg": "sgd", "fedavgm": "momentum", "fedadam": "adam", "fedyogi": "yogi",
                 "fedadagrad": "adagrad"}


def build_server_optimizer(config: Config) -> optax.GradientTransformation:
    """The server optimiser: named by ``algorithm.server_optimizer``, or implied by ``algorithm.name``."""
    a = config.algorithm
    rule = FEDAVG_FAMILY.get(a.name, "sgd") if a.server_optimizer == "default" else a.server_optimizer
    if rule == "sgd":
        return server_optimizers.fedavg_server(a.server_learning_rate)
    if rule == "momentum":
        return server_optimizers.fedavgm_server(a.server_learning_rate, a.server_momentum)
    if rule == "momentum_fedcog":
        return server_optimizers.fedcog_momentum_server(a.server_momentum)
    return server_optimizers.reddi_server(rule, a.server_learning_rate, a.beta1, a.beta2, a.tau)


def build_schedule(config: Config, dataset: FederatedDataset) -> LocalSchedule:
    """Local training; FedWalk's clients also measure their final model's loss (``probe_examples``)."""
    c, walk = config.client, config.algorithm.fedwalk
    probe = walk.client_loss_examples if walk and walk.mode == "leash" and walk.client_loss == "final" else 0
    return LocalSchedule(c.batch_size, c.local_steps, c.local_epochs, min_examples=dataset.min_examples,
                         unroll=config.rounds.unroll, probe_examples=probe)


CONV_MODELS = ("simple_cnn", "fedavg_cnn", "bherd_cnn", "cnn3", "resnet8", "resnet18")


def default_chunk_size(cohort_size: int, backend: str, model: str = "mlp") -> int | None:
    """The cohort loop when ``rounds.chunk_size`` is unset (results never depend on it; docs/benchmarks.md):

    * GPU/TPU: the whole cohort vmapped at once;
    * CPU, convolutional models: one client at a time (``lax.map``); vmapped per-client convolutions lower to
      grouped convolutions or wider matrix products that run slower per example here;
    * CPU, dense models: two clients at a time (measured 1.8-4.1x faster than the whole cohort vmapped).
    """
    if backend != "cpu":
        return None
    if model in CONV_MODELS:
        return 1
    return 2 if cohort_size % 2 == 0 else 1


def leash_task(classifier: models.Classifier, dataset: FederatedDataset) -> LeashTask:
    """FedWalk's leash task on the server's data (``dataset.server``): a head with one output per leash label."""
    return LeashTask(classifier, int(dataset.server["y"].max()) + 1)


def leash_key(seed: int) -> jax.Array:
    """The key of FedWalk's set-up outside the rounds: it initialises the leash head, and ``fold_in(key, 1)``
    draws the pre-training batches."""
    return jax.random.fold_in(randomness.init_key(randomness.base_key(seed)), randomness.Purpose.LEASH)


def build_algorithm(config: Config, classifier: models.Classifier, dataset: FederatedDataset) -> Algorithm:
    """The FL algorithm of ``config.algorithm``, with FedWalk's leash when ``algorithm.fedwalk`` asks for it."""
    algorithm = build_base_algorithm(config, classifier, dataset)
    walk = config.algorithm.fedwalk
    if walk is None or walk.mode != "leash":
        return algorithm
    return fedwalk(algorithm, leash_task(classifier, dataset), leash_key(config.seed), walk.tau, walk.beta,
                   walk.learning_rate or config.client.learning_rate, walk.momentum, walk.steps, walk.batch_size,
                   walk.leash_loss_examples, walk.client_loss)


def build_pretraining(config: Config, classifier: models.Classifier, dataset: FederatedDataset):
    """``prepare(params, inputs) -> (params, leash_head)``: leash steps before FL (FedWalk's pre-training ablation,
    or a pre-trained start for FedWalk itself), or ``None`` when the config asks for none."""
    walk = config.algorithm.fedwalk
    if walk is None or (walk.mode == "leash" and walk.pretrain_steps is None):
        return None
    leash = leash_task(classifier, dataset)
    steps = walk.pretrain_steps or config.rounds.num_rounds * walk.steps
    rate = walk.learning_rate or config.client.learning_rate

    @jax.jit
    def prepare(params, inputs: RoundInputs):
        return pretrain_on_leash(leash, params, leash_key(config.seed), inputs.server_arrays,
                                 jax.random.fold_in(leash_key(config.seed), 1), steps, rate, walk.momentum,
                                 walk.batch_size)

    return prepare


def build_base_algorithm(config: Config, classifier: models.Classifier, dataset: FederatedDataset) -> Algorithm:
    """The FL algorithm of ``config.algorithm.name``.

    Raises:
      ConfigError: a server optimiser given to a method with its own server step (feddyn, fedexp).
    """
    a, loss = config.algorithm, classifier.loss
    client_opt, schedule = build_client_optimizer(config), build_schedule(config, dataset)
    if a.name in ("feddyn", "fedexp") and a.server_optimizer != "default":
        raise ConfigError(f"algorithm.server_optimizer: {a.name} has its own server step; leave it 'default'")
    server_opt = build_server_optimizer(config)
    if a.name == "fedprox":
        return fedprox(loss, client_opt, server_opt, schedule, a.mu, a.weighting)
    if a.name == "scaffold":
        return scaffold(loss, client_opt, server_opt, schedule, config.client.learning_rate, dataset.num_clients,
                        a.option, a.control_average, a.weighting, a.correction)
    if a.name == "fednova":
        return fednova(loss, client_opt, server_opt, schedule, config.client.momentum, a.weighting)
    if a.name == "feddyn":
        return feddyn(loss, client_opt, schedule, a.alpha, dataset.num_clients, a.weighting)
    if a.name == "fedexp":
        return fedexp(loss, client_opt, schedule, a.epsilon)
    if a.name == "fedsam":
        return fedsam(loss, client_opt, server_opt, schedule, a.rho, a.weighting)
    if a.name == "moon":
        return moon(classifier, client_opt, server_opt, schedule, a.mu, a.temperature, a.weighting)
    if a.name == "feddecorr":
        return feddecorr(classifier, client_opt, server_opt, schedule, a.beta, a.weighting)
    return fedavg(loss, client_opt, server_opt, schedule, a.weighting)


@dataclasses.dataclass
class Experiment:
    """Everything a run needs, built and placed on the device, not yet compiled."""

    config: Config
    dataset: FederatedDataset
    classifier: models.Classifier
    algorithm: Algorithm
    plan: CohortPlan
    inputs: RoundInputs
    evaluator: Evaluator
    run_rounds: Any
    prepare: Any = None

    def initial_state(self) -> LoopState:
        """The loop state before round 0; the model is initialised from the run's seed (and pre-trained on the
        leash, for FedWalk's pre-training ablation)."""
        params = self.classifier.init(randomness.init_key(self.inputs.key))
        if self.prepare is None:
            return init_loop_state(self.algorithm, params, self.dataset.num_clients)
        params, leash_head = self.prepare(params, self.inputs)
        state = init_loop_state(self.algorithm, params, self.dataset.num_clients)
        if isinstance(state.server_state, FedWalkState):  # FedWalk goes on with the pre-trained leash head
            state = state._replace(server_state=state.server_state._replace(leash_head=leash_head))
        return state

    def evaluate(self, state: LoopState) -> dict[str, float]:
        """Central test metrics (and per-client spread, when configured) of the global model."""
        return self.evaluator(self.algorithm.model_params(state.server_state))


def build_experiment(config: Config) -> Experiment:
    """Builds data, model and algorithm, checks that they fit each other, and moves the data to the device.

    Raises:
      ConfigError: when the data and the config disagree (e.g. a cohort larger than the population).
    """
    dataset = build_dataset(config)
    if config.algorithm.name in REFERENCES:
        dataset = reference_view(dataset, config.algorithm.name)
    if config.rounds.clients_per_round > dataset.num_clients and config.algorithm.name not in REFERENCES:
        raise ConfigError(f"rounds.clients_per_round must be <= the number of clients ({dataset.num_clients}), "
                          f"got {config.rounds.clients_per_round}")
    classifier = build_classifier(config, dataset)
    algorithm = build_algorithm(config, classifier, dataset)
    chunk_size = config.rounds.chunk_size or default_chunk_size(config.rounds.clients_per_round,
                                                                 jax.default_backend(), config.model.name)
    cohort = 1 if config.algorithm.name in REFERENCES else config.rounds.clients_per_round
    plan = CohortPlan(dataset.num_clients, cohort, 1 if cohort == 1 else chunk_size)
    inputs = RoundInputs(
        key=randomness.base_key(config.seed),
        train_arrays=jax.device_put(dataset.train),
        client_example_ids=jnp.asarray(dataset.client_train_ids),
        client_num_examples=jnp.asarray(dataset.client_train_counts),
        server_arrays=jax.device_put(dataset.server) if dataset.server is not None else {},
    )
    per_client = config.eval.per_client and dataset.client_test_ids is not None
    evaluator = Evaluator(classifier.example_metrics, dataset.test, config.eval.batch_size,
                          dataset.client_test_ids if per_client else None,
                          dataset.client_test_counts if per_client else None)
    return Experiment(config, dataset, classifier, algorithm, plan, inputs, evaluator,
                      make_run_rounds(algorithm, plan), build_pretraining(config, classifier, dataset))
