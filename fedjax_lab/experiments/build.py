"""From a validated :class:`Config` to a run, not yet compiled: data, model and algorithm placed on the
device, the cohort's plan (chunks, devices, the asynchronous store), and the evaluations.

Each concern has its module: the model (:mod:`.classifiers`), the algorithm composed from the registered
methods (:mod:`.algorithms`), the evaluations (:mod:`.evaluators`) and fitting the run to the device's memory
(:mod:`.memory_fit`). This one joins them and names no method.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from fedjax_lab import models
from fedjax_lab.data import FederatedDataset
from fedjax_lab.engine import (
    Algorithm,
    CohortPlan,
    Evaluator,
    LoopState,
    RoundInputs,
    init_loop_state,
    make_run_rounds,
    randomness,
)
from fedjax_lab.engine.asynchrony import DelayModel, check_store_memory
from fedjax_lab.engine.dissimilarity import DissimilarityEvaluator
from fedjax_lab.engine.local_evaluation import LocalEvaluator
from fedjax_lab.engine.memory import device_memory_bytes
from fedjax_lab.engine.sharding import (
    StartupError,
    client_mesh,
    initialize_distributed,
    place_training_arrays,
)
from fedjax_lab.engine.simulation import message_shapes, traced_once
from fedjax_lab.experiments import hyperparams, layout, privacy
from fedjax_lab.experiments.algorithms import build_schedule, is_reference, make_algorithm_at
from fedjax_lab.experiments.classifiers import CONV_MODELS, build_classifier, default_lowering
from fedjax_lab.experiments.config import Config, ConfigError, cohort_layout_problems, distributed_settings
from fedjax_lab.experiments.datasets import build_dataset, reference_view
from fedjax_lab.experiments.evaluators import build_evaluators
from fedjax_lab.experiments.memory_fit import check_memory, fit_chunk_to_budget


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


def mesh_devices(config: Config, cohort_size: int) -> int:
    """How many devices ``parallel.devices`` splits a cohort of ``cohort_size`` over: its number, every device
    JAX sees for ``all``, and for ``auto`` on a CPU (one process) the most of the CPU's devices that the
    cohort and ``rounds.chunk_size`` divide evenly (:func:`~fedjax_lab.engine.sharding.use_cpu_cores` gives
    it one device per core), elsewhere 1."""
    devices = config.parallel.devices
    if devices == "all":
        return len(jax.devices())
    if devices != "auto":
        return devices
    if jax.default_backend() != "cpu" or jax.process_count() > 1:
        return 1
    return max(n for n in range(1, len(jax.devices()) + 1)
               if not cohort_layout_problems(cohort_size, n, config.rounds.chunk_size))


def build_mesh(config: Config, cohort_size: int) -> Mesh | None:
    """The ``clients`` mesh of ``parallel.devices`` (``None`` for one device; :func:`mesh_devices`).

    Raises:
      ConfigError: more devices than JAX sees, or a number that does not divide the cohort.
    """
    devices = config.parallel.devices
    num = mesh_devices(config, cohort_size)
    if num == 1:
        return None
    problems = cohort_layout_problems(cohort_size, num, config.rounds.chunk_size)
    if problems:
        raise ConfigError(f"{problems[0]} (parallel.devices={devices})")
    try:
        return client_mesh(num)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def build_delay(config: Config) -> DelayModel | None:
    """The :class:`~fedjax_lab.engine.asynchrony.DelayModel` of ``config.asynchrony`` (``None`` when
    unset)."""
    a = config.asynchrony
    if a is None:
        return None
    return DelayModel(a.delay, a.sigma, a.rounds, a.max_delay, a.rounding)


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
    epsilons: Mapping[int, float] = dataclasses.field(default_factory=dict)  # ε after each round
    layout: dict = dataclasses.field(default_factory=dict)  # how the layout was chosen (layout.choose_layout)
    cpu_matmul: str | None = None  # the training program's matrix-product library on a CPU (None elsewhere)
    client_update: Any = None  # the rounds' client update (simulation.traced_once), traced once for all

    def initial_state(self) -> LoopState:
        """The loop state before round 0; the model is initialised from the run's seed (a plug-in's
        ``server_init`` may move it further, as FedWalk's pre-training does)."""
        # Compiled whole: run eagerly, a model's initialisers compile one small program per operation.
        params = jax.jit(self.classifier.init)(randomness.init_key(self.inputs.key))
        state = init_loop_state(self.algorithm, params, self.dataset.num_clients, self.plan, self.inputs,
                                self.messages)
        if self.plan.mesh is not None:
            # Placed as the compiled rounds return it, replicated over the mesh: a state on one device would
            # make the second block of rounds compile the whole program again (and so would a checkpoint
            # restored into this state's shardings).
            state = jax.device_put(state, NamedSharding(self.plan.mesh, PartitionSpec()))
        return state

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


def join_processes(config: Config) -> bool:
    """Joins the run's other processes (``parallel``'s settings, else JAX's environment variables) before
    anything touches a device; returns whether this is one of several processes.

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
                                       num_processes=distributed.num_processes,
                                       process_id=distributed.process_id)
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
        raise ConfigError(f"rounds.clients_per_round must be <= the number of clients "
                          f"({dataset.num_clients}), got {config.rounds.clients_per_round}")
    if config.rounds.layout == "measure" and not is_reference(config):
        return _measured_layout(config, dataset)
    return _assemble(config, dataset)


def rules_layout(config: Config, share: int) -> layout.Layout:
    """The layout the hand rules give a cohort share: ``default_lowering``, ``default_chunk_size`` and
    :func:`cpu_matmul`, or the explicit settings."""
    lowering = None
    if config.model.name in CONV_MODELS:
        lowering = config.model.lowering
        if lowering == "auto":
            lowering = default_lowering(jax.default_backend())
    chunk = config.rounds.chunk_size or default_chunk_size(share, jax.default_backend(), config.model.name)
    return layout.Layout(lowering, chunk or share, cpu_matmul(config))


def cohort_order(config: Config) -> str:
    """``rounds.cohort_order`` resolved: ``auto`` is ``balanced`` when the clients' local work is unequal
    (local epochs over datasets of unequal size), else ``sampled`` (the plan applies it only where the
    cohort is split over devices or chunks: :attr:`~fedjax_lab.engine.simulation.CohortPlan.balances`)."""
    if config.rounds.cohort_order != "auto":
        return config.rounds.cohort_order
    return "balanced" if config.client.local_epochs is not None else "sampled"


def cpu_matmul(config: Config) -> str | None:
    """``rounds.cpu_matmul`` resolved by the rules, for ``auto`` on a CPU: XLA's Eigen kernels for the
    convolutional models (``CONV_MODELS``; on a CPU core BHerd's CNN's round ran 1.08x faster,
    ``benchmarks/bherd_cnn_round.py --compare matmul``, the simple-CNN's epoch rounds a median 1.10x), else
    XLA's default, YNNPACK (the MLP ran 11 % slower with Eigen's); ``None`` on other backends, where it does
    not apply."""
    if jax.default_backend() != "cpu":
        return None
    if config.rounds.cpu_matmul != "auto":
        return config.rounds.cpu_matmul
    return "eigen" if config.model.name in CONV_MODELS else "ynnpack"


def _measured_layout(config: Config, dataset: FederatedDataset) -> Experiment:
    """:func:`_assemble` with the unset lowering and chunk chosen by measurement (:mod:`.layout`)."""
    cohort = config.rounds.clients_per_round
    if config.privacy is not None:
        mechanism = privacy.mechanism_of(privacy.resolve(config, dataset.num_clients), dataset.num_clients)
        cohort = mechanism.slots if mechanism.sampling == "poisson" else cohort
    num = mesh_devices(config, cohort)
    share = cohort // num if num > 1 and cohort % num == 0 else cohort
    rules = rules_layout(config, share)
    chosen, info = layout.choose_layout(
        config, rules=rules, conv_model=config.model.name in CONV_MODELS, share=share,
        input_shape=tuple(dataset.input_shape), build=lambda c: _assemble(c, dataset),
        work=unequal_work(config, dataset, cohort, num))
    if info["how"] == "explicit" or chosen == rules:
        # The rules' layout, built as the rules build it (an unset chunk is still fitted to the memory budget)
        experiment = _assemble(config, dataset)
        return dataclasses.replace(experiment, layout={**info, **experiment.layout})
    experiment = _assemble(layout.with_layout(config, chosen), dataset)
    return dataclasses.replace(experiment, config=config, layout={**info, **experiment.layout})


def unequal_work(config: Config, dataset: FederatedDataset, cohort: int,
                 num_devices: int) -> layout.UnequalWork | None:
    """The clients' local steps when they differ (local epochs over clients of unequal size), for the layout
    measurement; ``None`` when every client takes the same number."""
    if config.client.local_epochs is None:
        return None
    steps = np.asarray(build_schedule(config, dataset).client_steps(np.asarray(dataset.client_train_counts)))
    if steps.min() == steps.max():
        return None
    synchronous = config.asynchrony is None and config.algorithm.buffer_size is None
    return layout.UnequalWork(steps, cohort, num_devices if cohort % num_devices == 0 else 1,
                              balanced=cohort_order(config) == "balanced" and synchronous)


def _assemble(config: Config, dataset: FederatedDataset) -> Experiment:
    """:func:`build_experiment` from the dataset on."""
    classifier = build_classifier(config, dataset)
    cohort, sampling_rate = 1 if is_reference(config) else config.rounds.clients_per_round, None
    if config.privacy is not None:
        config = privacy.resolve(config, dataset.num_clients)
        mechanism = privacy.mechanism_of(config, dataset.num_clients)
        if mechanism.sampling == "poisson":
            cohort, sampling_rate = mechanism.slots, mechanism.sampling_rate
            chunk = config.rounds.chunk_size
            if chunk is not None and cohort % chunk:
                raise ConfigError(f"rounds.chunk_size={chunk} must divide the Poisson cohort's {cohort} "
                                  "slots (privacy.max_clients, default the count exceeded with probability "
                                  "below 1e-6); set privacy.max_clients to a multiple of it")
    mesh = build_mesh(config, cohort)
    share = cohort // (1 if mesh is None else mesh.size)
    chunk_size = config.rounds.chunk_size or default_chunk_size(share, jax.default_backend(),
                                                                config.model.name)

    algorithm_at = make_algorithm_at(config, classifier, dataset, clients_at_once=chunk_size or share)
    plan = CohortPlan(dataset.num_clients, cohort, 1 if cohort == 1 else chunk_size, build_delay(config),
                      config.algorithm.buffer_size,
                      config.asynchrony.max_in_flight if config.asynchrony is not None else None,
                      mesh, config.parallel.aggregation, sampling_rate, cohort_order(config))
    inputs = RoundInputs(
        key=randomness.base_key(config.seed),
        train_arrays=place_training_arrays(dataset.train, mesh),
        client_example_ids=jnp.asarray(dataset.client_train_ids),
        client_num_examples=jnp.asarray(dataset.client_train_counts),
        server_arrays=jax.device_put(dataset.server) if dataset.server is not None else {},
        hparams=hyperparams.as_arrays(hyperparams.hyperparams(config)),
    )
    if mesh is not None and jax.process_count() == 1:
        # Every device reads the round's inputs: left on one device, each call of the rounds (a block)
        # would copy them to the others again (the training arrays are placed on every device already).
        # Several processes pass their own host-local copies.
        inputs = jax.device_put(inputs, NamedSharding(mesh, PartitionSpec()))
    evaluators = build_evaluators(config, classifier, dataset, algorithm_at, chunk_size)
    algorithm = algorithm_at(inputs, jnp.zeros((), jnp.int32))
    client_update = traced_once(algorithm_at)
    messages = message_shapes(algorithm, classifier.variable_shapes, inputs, client_update,
                              chunk_size=plan.chunk_size or plan.share)
    if plan.asynchronous:
        try:
            check_store_memory(messages, plan.capacity, plan.buffer_size, device_memory_bytes() // 2)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    matmul = cpu_matmul(config)
    run_rounds = make_run_rounds(algorithm_at, plan, donate=True,
                                 compiler_options=layout.compiler_options(matmul),
                                 client_update=client_update)
    experiment = Experiment(config, dataset, classifier, algorithm, plan, inputs, evaluators.test, run_rounds,
                            algorithm_at, evaluators.train, evaluators.local, evaluators.dissimilarity,
                            messages, privacy.epsilons(config, dataset.num_clients), cpu_matmul=matmul,
                            client_update=client_update)
    if config.rounds.chunk_size is None and cohort > 1:
        experiment = _rematerialised_if_more_fit(fit_chunk_to_budget(experiment), dataset,
                                                 wanted=chunk_size or share)
    if config.parallel.devices == "auto" and len(jax.devices()) > 1:  # the run directory says how it split
        on_cpu = jax.default_backend() == "cpu" and jax.process_count() == 1
        rule = "the most that divide the cohort" if on_cpu else "one off a CPU"
        split = (f"{plan.num_devices} of {len(jax.devices())} {jax.default_backend()} devices "
                 f"(parallel.devices: auto, {rule})")
        experiment = dataclasses.replace(experiment, layout={**experiment.layout, "devices": split})
    if experiment.plan.balances:
        plan = experiment.plan
        order = (f"balanced: the cohort sorted by the clients' example counts into chunks of "
                 f"{plan.chunk_size or plan.share}, spread evenly over {plan.num_devices} device(s) "
                 f"(rounds.cohort_order: {config.rounds.cohort_order}; local epochs over clients of unequal "
                 "size)")
        experiment = dataclasses.replace(experiment, layout={**experiment.layout, "cohort_order": order})
    check_memory(experiment)
    return experiment


def _rematerialised_if_more_fit(experiment: Experiment, dataset: FederatedDataset, wanted: int) -> Experiment:
    """``model.remat: auto``: a ResNet whose memory budget cut its cohort chunk below ``wanted`` clients is
    built again with its residual blocks rematerialised, and runs so when that fits more clients at once.
    XLA's memory analysis of the compiled rounds decides, on the backend that runs them (on CPU, where the
    recomputed activations were measured to save nothing, the blocks stay stored). ``layout["remat"]`` says
    which ran and why."""
    config, plain = experiment.config, experiment.plan.chunk_size
    if (config.model.remat != "auto" or not config.model.name.startswith("resnet") or plain is None
            or plain >= wanted):
        return experiment
    blocks = config.model_copy(update={"model": config.model.model_copy(update={"remat": "blocks"})})
    try:
        remat = _assemble(blocks, dataset)
    except ConfigError:  # not even one client fits with the blocks rematerialised
        remat = None
    clients = lambda n: f"{n} client{'s' if n > 1 else ''}"
    if remat is None or (remat.plan.chunk_size or wanted) <= plain:
        why = f"off: rematerialising the residual blocks fits no more than {clients(plain)} at once"
        return dataclasses.replace(experiment, layout={**experiment.layout, "remat": why})
    why = (f"blocks: the memory budget fits {clients(remat.plan.chunk_size or wanted)} at once with the "
           f"residual blocks rematerialised, {plain} with them stored")
    return dataclasses.replace(remat, config=config, layout={**remat.layout, "remat": why})
