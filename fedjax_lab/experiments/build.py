"""From a validated :class:`Config` to the pieces of a run: data, model, algorithm and compiled round loop."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from fedjax_lab import models
from fedjax_lab.data import FederatedDataset
from fedjax_lab.data.partitions import class_counts
from fedjax_lab.engine import (
    Algorithm,
    AlgorithmAt,
    CohortPlan,
    Evaluator,
    LocalSchedule,
    LoopState,
    RoundInputs,
    init_loop_state,
    make_run_rounds,
    memory,
    randomness,
)
from fedjax_lab.engine.asynchrony import DelayModel, check_store_memory
from fedjax_lab.engine.dissimilarity import DissimilarityEvaluator, lower_mask
from fedjax_lab.engine.local_evaluation import LocalEvaluator
from fedjax_lab.engine.memory import device_memory_bytes
from fedjax_lab.engine.round import component_round
from fedjax_lab.engine.sharding import StartupError, client_mesh, initialize_distributed
from fedjax_lab.engine.simulation import message_shapes
from fedjax_lab.engine.variables import split_variables
from fedjax_lab.experiments import hyperparams
from fedjax_lab.experiments.config import Config, ConfigError, distributed_settings
from fedjax_lab.experiments.datasets import build_dataset, reference_view
from fedjax_lab.methods import registry, server_optimizers
from fedjax_lab.models import augment


def default_lowering(backend: str) -> str:
    """The convolution lowering when ``model.lowering`` is ``auto``: ``banded`` on CPU, where XLA's convolution
    is slow for small CNNs (``im2col`` for the ResNets), and XLA's own elsewhere (docs/benchmarks.md has the
    measurements)."""
    return "banded" if backend == "cpu" else "xla"


def extra_outputs(algorithm, num_classes: int) -> int:
    """Outputs the methods add to the model beyond the dataset's classes (VHL's virtual classes): the sum of
    their configs' ``extra_outputs(num_classes)``."""
    return sum(m.extra_outputs(num_classes) for m in (algorithm, *algorithm.plugins) if hasattr(m, "extra_outputs"))


def build_module(config: Config, dataset: FederatedDataset) -> nn.Module:
    """The Flax module named by ``config.model``, sized for the dataset."""
    m, k = config.model, dataset.num_classes + extra_outputs(config.algorithm, dataset.num_classes)
    lowering = default_lowering(jax.default_backend()) if m.lowering == "auto" else m.lowering
    if m.name == "char_rnn":
        return models.CharRNN(k, m.embed_dim, m.rnn_hidden)
    if m.name in ("resnet8", "resnet18"):
        # 3x3 kernels over 32 columns: the banded matrix would multiply ~10x the FLOPs; im2col multiplies 1x.
        resnet_lowering = "im2col" if m.lowering == "auto" and lowering == "banded" else lowering
        return getattr(models, m.name)(k, m.norm, m.groups, resnet_lowering)
    if m.name == "fedavg_cnn":
        return models.FedAvgCNN(k, m.padding, lowering)
    if m.name in ("simple_cnn", "bherd_cnn", "cnn3", "feddle_cnn"):
        cls = {"simple_cnn": models.SimpleCNN, "bherd_cnn": models.BHerdCNN, "cnn3": models.CNN3,
               "feddle_cnn": models.FeddleCNN}[m.name]
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


def build_client_optimizer(config: Config, structure: Config | None = None) -> optax.GradientTransformation:
    """The clients' optax optimiser with ``config``'s values (numbers, or arrays inside the compiled round); which
    transformations it chains (a momentum buffer, weight decay) follows ``structure`` (default ``config``)."""
    c, s = config.client, (structure or config).client
    if s.optimizer == "sgd":
        opt = optax.sgd(c.learning_rate, momentum=c.momentum if s.momentum else None)
    else:
        opt = optax.adam(c.learning_rate)
    return optax.chain(optax.add_decayed_weights(c.weight_decay), opt) if s.weight_decay else opt


def build_server_optimizer(config: Config) -> optax.GradientTransformation:
    """The server optimiser of ``algorithm.server_optimizer`` (its default is what the method's name implies)."""
    a = config.algorithm
    if a.server_optimizer == "sgd":
        return server_optimizers.fedavg_server(a.server_learning_rate)
    if a.server_optimizer == "momentum":
        return server_optimizers.fedavgm_server(a.server_learning_rate, a.server_momentum)
    if a.server_optimizer == "momentum_fedcog":
        return server_optimizers.fedcog_momentum_server(a.server_momentum)
    return server_optimizers.reddi_server(a.server_optimizer, a.server_learning_rate, a.beta1, a.beta2, a.tau)


def build_schedule(config: Config, dataset: FederatedDataset) -> LocalSchedule:
    """Local training: the budget, batch size and unroll of ``client`` and ``rounds``."""
    c = config.client
    return LocalSchedule(c.batch_size, c.local_steps, c.local_epochs, min_examples=dataset.min_examples,
                         unroll=config.rounds.unroll, drop_remainder=c.drop_remainder,
                         reshuffle=c.batch_order == "reshuffle")


CONV_MODELS = ("simple_cnn", "fedavg_cnn", "bherd_cnn", "cnn3", "feddle_cnn", "resnet8", "resnet18")


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


def build_mesh(config: Config, cohort_size: int) -> Mesh | None:
    """The ``clients`` mesh of ``parallel.devices`` (``None`` for one device).

    Raises:
      ConfigError: more devices than JAX sees, or a number that does not divide the cohort.
    """
    devices = config.parallel.devices
    num = len(jax.devices()) if devices == "all" else devices
    if num == 1:
        return None
    if cohort_size % num:
        raise ConfigError(f"parallel.devices={num} must divide rounds.clients_per_round={cohort_size}")
    try:
        return client_mesh(num)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def build_delay(config: Config) -> DelayModel | None:
    """The :class:`~fedjax_lab.engine.asynchrony.DelayModel` of ``config.asynchrony`` (``None`` when unset)."""
    a = config.asynchrony
    if a is None:
        return None
    return DelayModel(a.delay, a.sigma, a.rounds, a.max_delay, a.rounding)


def is_reference(config: Config) -> bool:
    """Whether ``algorithm.name`` is a reference run (centralised, or server data only), not FL."""
    return registry.REGISTRY[config.algorithm.name].reference


def build_algorithm(config: Config, classifier: models.Classifier, dataset: FederatedDataset,
                    key: jax.Array | None = None, structure: Config | None = None) -> Algorithm:
    """The algorithm of ``config.algorithm``: the FedAvg round with the components of the base method and of the
    component plug-ins, in the order listed, then wrapped by the wrapper plug-ins, in the order listed
    (``fedjax_lab/methods/registry.py``).

    ``config`` may hold arrays for its data fields (``hyperparams.with_values``); ``structure`` is the config that
    decides structure (default ``config``), and ``key`` the run's root key (default from ``config.seed``).
    """
    structure = structure or config
    key = randomness.base_key(structure.seed) if key is None else key
    context = registry.BuildContext(structure, classifier, dataset, build_client_optimizer(config, structure),
                                    build_schedule(structure, dataset), key, config)
    a = config.algorithm
    entries = [(registry.REGISTRY[m.name], m) for m in (a, *a.plugins)]
    components = [c for spec, m in entries if not spec.wrapper for c in spec.load_builder()(m, context)]
    algorithm = component_round(classifier, context.client_optimizer, build_server_optimizer(config),
                                context.schedule, *components, weighting=a.weighting)
    for spec, m in entries:
        if spec.wrapper:
            algorithm = spec.load_builder()(m, context)(algorithm)
    return algorithm


def make_algorithm_at(config: Config, classifier: models.Classifier, dataset: FederatedDataset) -> AlgorithmAt:
    """``algorithm_at(inputs, round)``: the algorithm built inside the compiled round from ``inputs.hparams`` on
    their schedules at ``round`` and the run's key ``inputs.key``; ``config`` gives the structure."""

    def algorithm_at(inputs: RoundInputs, round_index) -> Algorithm:
        values = hyperparams.values_at(config, inputs.hparams, round_index)
        return build_algorithm(hyperparams.with_values(config, values), classifier, dataset, inputs.key, config)

    return algorithm_at


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
    algorithm_at: Any = None
    train_evaluator: Evaluator | None = None
    local_evaluator: LocalEvaluator | None = None
    dissimilarity_evaluator: DissimilarityEvaluator | None = None
    messages: Any = None  # one client's message shapes, traced once at build (they size the memory estimates)

    def initial_state(self) -> LoopState:
        """The loop state before round 0; the model is initialised from the run's seed (a plug-in's
        ``server_init`` may move it further, as FedWalk's pre-training does)."""
        params = self.classifier.init(randomness.init_key(self.inputs.key))
        return init_loop_state(self.algorithm, params, self.dataset.num_clients, self.plan, self.inputs,
                               self.messages)

    def evaluate(self, state: LoopState) -> dict[str, float]:
        """Central test metrics (and per-client spread, and the training objective, when configured) of the
        global model."""
        metrics = self.evaluate_params(self.algorithm.evaluated_params(state.server_state))
        if self.local_evaluator is not None:
            metrics.update(self.local_evaluator(state, self.inputs))
        if self.dissimilarity_evaluator is not None:
            metrics.update(self.dissimilarity_evaluator(state, self.inputs))
        return metrics

    def evaluate_params(self, params) -> dict[str, float]:
        """:meth:`evaluate` of a model's variables."""
        metrics = self.evaluator(params)
        if self.train_evaluator is not None:
            metrics.update(self.train_evaluator(params))
        return metrics


def measured_split(config: Config, module) -> str:
    """The stage ending the model's lower part for the dissimilarity measurement: ``eval.split``, else the split
    a method of the run declares (a ``split`` field: FedImpro's), else the middle stage."""
    declared = [m.split for m in (config.algorithm, *config.algorithm.plugins) if getattr(m, "split", None)]
    split = config.eval.split or (declared[0] if declared else None) or models.middle_stage(module)
    if split not in getattr(module, "stages", ()):
        raise ConfigError(f"eval.split must be a stage of model {config.model.name}: "
                          f"{list(getattr(module, 'stages', ()))}, got {split!r}")
    return split


def build_dissimilarity(config: Config, classifier: models.Classifier, dataset: FederatedDataset,
                        chunk_size: int | None) -> DissimilarityEvaluator:
    """The gradient-dissimilarity measurement of ``eval.dissimilarity`` (``engine/dissimilarity.py``): the run's
    method with one SGD step at rate 1 on ``eval.dissimilarity_examples`` rows as its local training."""
    if config.asynchrony is not None:
        raise ConfigError("eval.dissimilarity measures synchronous rounds; set asynchrony: null")
    unknown = sorted(set(config.eval.dissimilarity_counterfactual) - set(hyperparams.hyperparams(config)))
    if unknown:
        raise ConfigError(f"eval.dissimilarity_counterfactual: {unknown} are not hyper-parameters of this run; "
                          f"allowed: {sorted(hyperparams.hyperparams(config))}")
    client = config.client.model_copy(update={"optimizer": "sgd", "learning_rate": 1.0, "momentum": 0.0,
                                              "weight_decay": 0.0, "local_steps": 1, "local_epochs": None,
                                              "batch_size": config.eval.dissimilarity_examples})
    probe = config.model_copy(update={"client": client})
    split = measured_split(config, classifier.module)
    variables = jax.eval_shape(classifier.init, jax.random.key(0))
    mask = lower_mask(classifier.module, split_variables(variables)[0], classifier.model_input_shape(), split)
    ids = np.arange(min(config.eval.dissimilarity, dataset.num_clients))
    fixed = {"client.learning_rate": 1.0, "client.momentum": 0.0, "client.weight_decay": 0.0}

    def probe_at(inputs: RoundInputs, round_index, changes: dict[str, float] | None = None) -> Algorithm:
        values = hyperparams.values_at(config, inputs.hparams, round_index)
        values.update({k: v for k, v in fixed.items() if k in values})  # not the run's (scheduled) client values
        values.update({k: jnp.asarray(v, jnp.float32) for k, v in (changes or {}).items()})
        return build_algorithm(hyperparams.with_values(probe, values), classifier, dataset, inputs.key, probe)

    counterfactual = config.eval.dissimilarity_counterfactual
    return DissimilarityEvaluator(probe_at, mask, ids, chunk_size,
                                  functools.partial(probe_at, changes=counterfactual) if counterfactual else None)


def join_processes(config: Config) -> bool:
    """Joins the run's other processes (``parallel``'s settings, else JAX's environment variables) before anything
    touches a device; returns whether this is one of several processes.

    Raises:
      ConfigError: the settings are incomplete or malformed, or the processes did not all meet within
        ``parallel.init_timeout_s``.
    """
    distributed = distributed_settings(config.parallel)
    if distributed is None:
        return jax.distributed.is_initialized()
    if not distributed.complete:
        if not jax.distributed.is_initialized():
            jax.distributed.initialize(coordinator_address=distributed.coordinator_address,
                                       num_processes=distributed.num_processes, process_id=distributed.process_id)
        return True
    try:
        initialize_distributed(distributed.coordinator_address, distributed.host, distributed.port,
                               distributed.num_processes, distributed.process_id, distributed.init_timeout_s)
    except StartupError as exc:
        raise ConfigError(str(exc)) from None
    return True


def build_experiment(config: Config) -> Experiment:
    """Builds data, model and algorithm, checks that they fit each other, and moves the data to the device.

    Raises:
      ConfigError: when the data and the config disagree (e.g. a cohort larger than the population).
    """
    join_processes(config)
    dataset = build_dataset(config)
    if is_reference(config):
        dataset = reference_view(dataset, config.algorithm.name)
    if config.rounds.clients_per_round > dataset.num_clients and not is_reference(config):
        raise ConfigError(f"rounds.clients_per_round must be <= the number of clients ({dataset.num_clients}), "
                          f"got {config.rounds.clients_per_round}")
    classifier = build_classifier(config, dataset)
    algorithm_at = make_algorithm_at(config, classifier, dataset)
    cohort = 1 if is_reference(config) else config.rounds.clients_per_round
    mesh = build_mesh(config, cohort)
    share = cohort // (1 if mesh is None else mesh.size)
    chunk_size = config.rounds.chunk_size or default_chunk_size(share, jax.default_backend(), config.model.name)
    plan = CohortPlan(dataset.num_clients, cohort, 1 if cohort == 1 else chunk_size, build_delay(config),
                      config.algorithm.buffer_size,
                      config.asynchrony.max_in_flight if config.asynchrony is not None else None,
                      mesh, config.parallel.aggregation)
    inputs = RoundInputs(
        key=randomness.base_key(config.seed),
        train_arrays=jax.device_put(dataset.train),
        client_example_ids=jnp.asarray(dataset.client_train_ids),
        client_num_examples=jnp.asarray(dataset.client_train_counts),
        server_arrays=jax.device_put(dataset.server) if dataset.server is not None else {},
        hparams=hyperparams.as_arrays(hyperparams.hyperparams(config)),
    )
    per_client = config.eval.per_client and dataset.client_test_ids is not None
    evaluator = Evaluator(classifier.example_metrics, dataset.test, config.eval.batch_size,
                          dataset.client_test_ids if per_client else None,
                          dataset.client_test_counts if per_client else None)
    train_evaluator = None
    if config.eval.train:
        rows = np.concatenate([dataset.client_train_ids[k, :n] for k, n in enumerate(dataset.client_train_counts)])
        train_evaluator = Evaluator(classifier.example_metrics, {"x": dataset.train["x"][rows],
                                                                  "y": dataset.train["y"][rows]},
                                    config.eval.batch_size, prefix="full_train", l2=classifier.l2)
    local_evaluator = None
    if config.eval.local_models:
        ids = np.arange(min(config.eval.local_models, dataset.num_clients))
        rows = [dataset.client_train_ids[k, :dataset.client_train_counts[k]] for k in ids]
        mask = None
        if getattr(classifier.module, "stages", ()):  # the distance of the lower and upper parts too
            variables = jax.eval_shape(classifier.init, jax.random.key(0))
            mask = lower_mask(classifier.module, split_variables(variables)[0], classifier.model_input_shape(),
                              measured_split(config, classifier.module))
        local_evaluator = LocalEvaluator(algorithm_at, classifier.example_metrics, dataset.test, dataset.num_classes,
                                         ids, class_counts(dataset.train["y"], rows, dataset.num_classes),
                                         config.eval.batch_size, chunk_size, mask)
    dissimilarity_evaluator = None
    if config.eval.dissimilarity:
        dissimilarity_evaluator = build_dissimilarity(config, classifier, dataset, chunk_size)
    algorithm = algorithm_at(inputs, jnp.zeros((), jnp.int32))
    messages = message_shapes(algorithm, jax.eval_shape(classifier.init, jax.random.key(0)), inputs)
    if plan.asynchronous:
        try:
            check_store_memory(messages, plan.capacity, plan.buffer_size, device_memory_bytes() // 2)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    experiment = Experiment(config, dataset, classifier, algorithm, plan, inputs, evaluator,
                            make_run_rounds(algorithm_at, plan, donate=True), algorithm_at, train_evaluator,
                            local_evaluator, dissimilarity_evaluator, messages)
    if config.rounds.chunk_size is None and cohort > 1:
        experiment = fit_chunk_to_budget(experiment)
    check_memory(experiment)
    return experiment


def memory_budget(config: Config) -> int:
    """``parallel.memory_budget_gb`` in bytes, or 90% of the device's memory."""
    if config.parallel.memory_budget_gb is not None:
        return int(config.parallel.memory_budget_gb * memory.GiB)
    return int(0.9 * device_memory_bytes())


def estimate_memory(experiment: Experiment) -> memory.StaticEstimate:
    """The per-device :class:`~fedjax_lab.engine.memory.StaticEstimate` of a round, from shapes only."""
    plan = experiment.plan
    params = jax.eval_shape(experiment.classifier.init, jax.random.key(0))
    state = jax.eval_shape(experiment.initial_state)
    share = plan.cohort_size // plan.num_devices
    in_flight = plan.chunk_size or share
    held = plan.capacity if plan.asynchronous else (in_flight if plan.streams(experiment.algorithm) else share)
    messages = experiment.messages
    if messages is None:
        messages = message_shapes(experiment.algorithm, params, experiment.inputs)
    return memory.static_estimate(state, experiment.inputs, messages, params, plan.num_clients, held, in_flight)


def _compiled_need(experiment: Experiment, chunk_size: int | None) -> int:
    plan = dataclasses.replace(experiment.plan, chunk_size=chunk_size)
    run_rounds = make_run_rounds(experiment.algorithm_at, plan, donate=True)
    lowered = run_rounds.lower(jax.eval_shape(experiment.initial_state), experiment.inputs, num_rounds=1)
    return memory.compiled_estimate(lowered.compile())


def fit_chunk_to_budget(experiment: Experiment, budget: int | None = None) -> Experiment:
    """The experiment with ``rounds.chunk_size`` sized from the memory budget when it was left unset: the
    default chunk (the whole share on an accelerator) if it fits, else the largest divisor of each device's share
    that does. The fit is linear in the chunk, from XLA's memory analysis of rounds compiled (not run) with chunks
    of 1 and 2; nothing is compiled when the shapes alone are well inside the budget."""
    plan = experiment.plan
    budget = memory_budget(experiment.config) if budget is None else budget
    if estimate_memory(experiment).total <= budget / 4:
        return experiment
    share = plan.cohort_size // plan.num_devices
    if _compiled_need(experiment, plan.chunk_size) <= budget or share == 1:
        return experiment
    one, two = _compiled_need(experiment, 1), _compiled_need(experiment, 2 if share % 2 == 0 else None)
    per_client = (two - one) / (1 if share % 2 == 0 else share - 1)
    fits = [c for c in range(1, share + 1) if share % c == 0 and one + (c - 1) * per_client <= budget]
    if not fits:
        return experiment  # check_memory refuses it, with the estimate
    plan = dataclasses.replace(plan, chunk_size=max(fits))
    return dataclasses.replace(experiment, plan=plan,
                               run_rounds=make_run_rounds(experiment.algorithm_at, plan, donate=True))


def check_memory(experiment: Experiment, budget: int | None = None) -> None:
    """Refuses a run that cannot fit in ``budget`` bytes a device (default :func:`memory_budget`), naming the
    setting to change and the estimate: first from shapes, before anything is compiled; then, when that comes
    within a quarter of the budget, from XLA's memory analysis of the compiled block of rounds.

    Raises:
      ConfigError: the estimate exceeds the budget.
    """
    config, plan = experiment.config, experiment.plan
    budget = memory_budget(config) if budget is None else budget
    estimate = estimate_memory(experiment)
    where = f"more than the budget of {budget / memory.GiB:.2f} GiB a device (parallel.memory_budget_gb)"
    if estimate.client_states + estimate.server_and_inputs > budget:
        raise ConfigError(
            f"dataset.num_clients={plan.num_clients}: the population's per-client state alone needs "
            f"{estimate.client_states / memory.GiB:.2f} GiB ({estimate.per_client_state / 2**20:.3f} MiB a client "
            f"for {config.algorithm.name}), {where}; fewer clients fit, or a method without per-client state. "
            f"Estimate: {memory.describe(estimate)}")
    if estimate.total > budget:
        raise ConfigError(
            f"rounds.chunk_size={plan.chunk_size}: a round needs about {estimate.total / memory.GiB:.2f} GiB, "
            f"{where}; train fewer clients at once (rounds.chunk_size), stream the aggregation "
            f"(parallel.aggregation=streaming), or split the cohort over parallel.devices. "
            f"Estimate: {memory.describe(estimate)}")
    if estimate.total > budget / 4:
        state = jax.eval_shape(experiment.initial_state)
        compiled = experiment.run_rounds.lower(state, experiment.inputs, num_rounds=config.eval.every).compile()
        need = memory.compiled_estimate(compiled)
        if need > budget:
            raise ConfigError(
                f"rounds.chunk_size={plan.chunk_size}: XLA's memory analysis of the compiled rounds needs "
                f"{need / memory.GiB:.2f} GiB, {where}; train fewer clients at once (rounds.chunk_size), stream "
                f"the aggregation (parallel.aggregation=streaming) or split the cohort over parallel.devices. "
                f"Shapes alone: {memory.describe(estimate)}")
