"""Experiment configuration: YAML files plus ``dotted.key=value`` overrides, validated before anything
compiles.

The schema is a tree of pydantic models that forbid unknown keys, so a misspelt key, a value out of range or
an unknown name fails with a message naming the field, the value given and what is allowed.
"""

from __future__ import annotations

import copy
import difflib
import os
import re
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
import yaml
from pydantic import BaseModel, Field, PositiveFloat, PositiveInt, model_validator

from fedjax_lab.methods import registry
from fedjax_lab.methods.registry import ConfigError
from fedjax_lab.privacy import PrivacyConfig


class Section(registry.Fields):
    """A config section: unknown keys are errors and floats must be finite."""


# ----------------------------------------------------------------------------------------------- datasets
class SyntheticDataset(Section):
    """Synthetic(alpha, beta) of the FedProx paper (embedded, generated from a seed)."""

    name: Literal["synthetic"]
    alpha: float = Field(1.0, ge=0, description="how much the clients' models differ (the paper's alpha)")
    beta: float = Field(1.0, ge=0, description="how much the clients' inputs differ (the paper's beta)")
    iid: bool = Field(
        False, description="Synthetic-IID: one model and one input distribution for all clients")
    num_clients: PositiveInt = Field(
        30, description="clients (their sizes follow a lognormal, as in the paper)")
    dimension: PositiveInt = Field(60, description="input features")
    num_classes: int = Field(10, ge=2, description="classes")
    train_fraction: float = Field(0.9, gt=0, lt=1, description="each client's rows kept for training; the "
                                                               "rest are its test rows, pooled for the test "
                                                               "set")
    seed: int | None = Field(None, ge=0, description="generator seed; defaults to the run's seed")


class GaussianMixtureDataset(Section):
    """A Gaussian-mixture classification task with Dirichlet label skew (embedded)."""

    name: Literal["gaussian_mixture"]
    num_clients: PositiveInt = Field(100, description="clients")
    examples_per_client: int = Field(100, ge=2, description="rows per client")
    num_classes: int = Field(10, ge=2, description="classes, one Gaussian each")
    dimension: PositiveInt = Field(20, description="input features")
    separation: PositiveFloat = Field(1.0, description="distance scale between the class means")
    label_alpha: PositiveFloat | None = Field(0.5, description="Dirichlet concentration of each client's "
                                                               "class mix; null: balanced")
    train_fraction: float = Field(0.8, gt=0, lt=1, description="each client's rows kept for training")
    seed: int | None = Field(None, ge=0, description="generator seed; defaults to the run's seed")


class PartitionConfig(Section):
    """How the training rows are dealt to clients (``fedjax_lab/data/partitions.py``)."""

    name: Literal["iid", "dirichlet", "dirichlet_client", "classes_per_client", "class_blocks", "shards",
                  "quantity_skew", "feature_skew", "bherd_case"] = Field(
        "dirichlet", description="the partitioner (dirichlet: NIID-Bench's label skew, each class split by "
                                 "Dir(alpha) over the clients)")
    num_clients: PositiveInt = Field(100, description="clients")
    alpha: PositiveFloat = Field(0.5, description="dirichlet, dirichlet_client, quantity_skew")
    min_size: int = Field(10, ge=1, description="dirichlet, quantity_skew: fewest rows a client may get")
    max_attempts: PositiveInt = Field(100, description="dirichlet, quantity_skew: redraws before giving up")
    classes: PositiveInt = Field(2, description="classes_per_client; class_blocks: classes per block")
    shards_per_client: PositiveInt = Field(2, description="shards")
    client_size: PositiveInt | None = Field(None, description="dirichlet_client; default N // num_clients")
    noise: float = Field(0.1, ge=0, description="feature_skew: client i gets noise * i / (n - 1)")
    case: Literal[1, 2, 3] = Field(1, description="bherd_case")
    by: Literal["label", "fine_label"] = Field(
        "label", description="fine_label: deal CIFAR-100's rows by its 100 fine classes while the task is "
                             "the 20 superclasses (labels: coarse; Feddle's concept drift)")
    file: str | None = Field(None, description="load a saved partition.npz instead of partitioning")
    seed: int | None = Field(None, ge=0, description="defaults to the run's seed")


class ServerDataConfig(Section):
    """Data held by the server and by no client (FedWalk, Feddle)."""

    kind: Literal["in_domain", "out_of_domain", "withheld_classes"] = Field(
        description="in_domain: rows of the same dataset; out_of_domain: rows of another; withheld_classes: "
                    "the rows of classes no client sees")
    size: PositiveInt = Field(1000, description="rows the server holds")
    dataset: str | None = Field(None, description="out_of_domain: another dataset of the same source")
    data_dir: str | None = Field(None, description="out_of_domain: where that dataset is (default "
                                                   "dataset.data_dir; for image_folder, the other dataset's "
                                                   "root)")
    classes: tuple[int | str, ...] = Field((), description="withheld_classes: classes no client sees; "
                                                           "out_of_domain: the other dataset's classes to "
                                                           "keep (relabelled 0, 1, ... in this order). Ids "
                                                           "or names")
    stratified: bool = Field(True, description="in_domain: balance the classes")
    split: Literal["train", "test"] = Field("train", description="in_domain: carve from the training rows "
                                                                 "(no client gets them), or from the test "
                                                                 "set, evaluating on the rest (Feddle)")

    @model_validator(mode="after")
    def _fields_for_kind(self):
        if self.split == "test" and self.kind != "in_domain":
            raise ValueError("dataset.server_data.split: test is for kind in_domain")
        if self.kind == "out_of_domain" and not self.dataset:
            raise ValueError("dataset.server_data.dataset is required when kind is 'out_of_domain'")
        if self.kind == "withheld_classes" and not self.classes:
            raise ValueError("dataset.server_data.classes is required when kind is 'withheld_classes'")
        return self


IMAGE_DATASETS = ("mnist", "fashion_mnist", "cifar10", "cifar100", "emnist", "svhn_cropped", "image_folder")


class ImageDataset(Section):
    """A centralised image dataset from local archives or tensorflow-datasets, partitioned into clients."""

    name: Literal["mnist", "fashion_mnist", "cifar10", "cifar100", "emnist", "svhn_cropped", "image_folder"]
    source: Literal["local", "tfds"] = Field("local", description="local: this project's archives "
                                                                  "(`fedjax-lab data prepare`); tfds: "
                                                                  "tensorflow-datasets")
    data_dir: str | None = Field(None, description="local: folder of the archives (default $FEDJAX_LAB_DATA "
                                                   "or ../shared/data); tfds: the tfds data dir; "
                                                   "image_folder: root")
    tfds_name: str | None = Field(None, description="tfds builder name when it differs, e.g. emnist/balanced")
    labels: Literal["fine", "coarse", "parity"] = Field("fine", description="coarse: CIFAR-100 superclasses; "
                                                                            "parity: even (1) vs odd (0)")
    partition: PartitionConfig = PartitionConfig()
    server_data: ServerDataConfig | None = None
    standardize: bool = Field(True, description="per-channel standardisation with training-set statistics")
    augment: Literal["none", "flip", "crop_flip"] = Field("none", description="training-time augmentation of "
                                                                             "the clients' batches")
    subset: PositiveInt | None = Field(None, description="keep only the first n training rows (official "
                                                         "order), for a run at a smaller scale")
    seed: int | None = Field(
        None, ge=0, description="the partition's and augmentation's seed; defaults to the run's seed")

    @property
    def num_clients(self) -> int:
        return self.partition.num_clients

    @model_validator(mode="after")
    def _source_has_it(self):
        if self.source == "local" and self.name in ("emnist", "svhn_cropped"):
            raise ValueError(f"dataset.source: {self.name!r} has no local archive; use dataset.source=tfds")
        if self.name == "image_folder" and not self.data_dir:
            raise ValueError("dataset.data_dir is required for image_folder (root of train/<class>/<image>)")
        s = self.server_data
        same_folder = s is not None and s.data_dir in (None, self.data_dir)
        if (s is not None and s.kind == "out_of_domain" and s.dataset in (self.name, self.tfds_name)
                and same_folder):
            raise ValueError("dataset.server_data.dataset: out-of-domain data must come from another "
                             f"dataset than dataset.name={self.name!r} (its rows would duplicate the "
                             "clients'); use dataset.server_data.kind=in_domain to carve server data from "
                             "the training rows, or dataset.server_data.data_dir for another copy")
        if self.partition.by == "fine_label" and (self.name != "cifar100" or self.labels != "coarse"):
            raise ValueError("dataset.partition.by: fine_label needs dataset.name=cifar100 and "
                             f"dataset.labels=coarse, got name={self.name!r}, labels={self.labels!r}")
        return self


class ShakespeareDataset(Section):
    """Federated Shakespeare: one client per role (natural partition), next-character prediction."""

    name: Literal["shakespeare"]
    data_dir: str | None = Field(
        None, description="folder of the archive (default $FEDJAX_LAB_DATA or ../shared/data)")
    sequence_length: PositiveInt = Field(80, description="characters per example")
    num_clients: PositiveInt = Field(715, le=715, description="the first num_clients roles")


DatasetConfig = Annotated[SyntheticDataset | GaussianMixtureDataset | ImageDataset | ShakespeareDataset,
                          Field(discriminator="name")]


# ------------------------------------------------------------------------------------------------- models
MODELS = ("logistic_regression", "linear_svm", "mlp", "simple_cnn", "fedavg_cnn", "bherd_cnn", "cnn3",
          "feddle_cnn", "pfl_cnn", "resnet8", "resnet18", "char_rnn")


class ModelConfig(Section):
    """A model of the zoo (``fedjax_lab/models``)."""

    name: Literal["logistic_regression", "linear_svm", "mlp", "simple_cnn", "fedavg_cnn", "bherd_cnn", "cnn3",
                  "feddle_cnn", "pfl_cnn", "resnet8", "resnet18", "char_rnn"] = Field(
        description="the model (`fedjax_lab/models/`)")
    hidden: tuple[PositiveInt, ...] = Field((200, 200), description="mlp")
    padding: Literal["SAME", "VALID"] = Field("SAME", description="fedavg_cnn")
    norm: Literal["batch", "group", "none"] = Field("batch", description="resnet8, resnet18")
    groups: PositiveInt = Field(2, description="GroupNorm groups")
    lowering: Literal["auto", "xla", "im2col", "banded"] = Field(
        "auto", description="CNN and ResNet convolutions (speed only); auto: chosen by measurement "
                            "(rounds.layout), under the rules banded on CPU, xla elsewhere")
    l2: float = Field(0.0, ge=0, description="adds l2/2 ||w||^2 to the loss (linear_svm: BHerd uses 0.1)")
    embed_dim: PositiveInt = Field(8, description="char_rnn")
    rnn_hidden: PositiveInt = Field(256, description="char_rnn")
    precision: Literal["float32", "bfloat16"] = Field(
        "float32", description="bfloat16: forward and backward passes in bfloat16 (parameters, optimiser "
        "states, messages and aggregation stay float32)")
    remat: Literal["auto", "off", "blocks"] = Field(
        "auto", description="resnet8, resnet18: blocks recomputes each residual block's activations in the "
                            "backward pass (less memory a client, about a third more compute); auto: blocks "
                            "only when the memory budget would otherwise train fewer clients at once")

    @model_validator(mode="after")
    def _remat_has_blocks(self):
        if self.remat == "blocks" and not self.name.startswith("resnet"):
            raise ValueError(f"model.remat: blocks applies to resnet8 and resnet18 (their residual blocks), "
                             f"not model.name={self.name!r}; use auto or off")
        return self


# ----------------------------------------------------------------------------------------------- training
class ClientConfig(Section):
    """Local training. Exactly one of ``local_steps`` and ``local_epochs`` (see docs/semantics.md)."""

    optimizer: Literal["sgd", "adam"] = Field("sgd", description="the clients' optimiser, fresh each round")
    learning_rate: PositiveFloat = Field(0.01, description="the clients' learning rate")
    momentum: float = Field(0.0, ge=0, lt=1, description="sgd momentum, within a round")
    weight_decay: float = Field(
        0.0, ge=0, description="L2 penalty added to the gradient (coupled, as torch's SGD)")
    batch_size: PositiveInt = Field(10, description="rows per local step")
    schedule: registry.ScheduleConfig = Field(
        registry.ScheduleConfig(), description="learning_rate over rounds")
    local_steps: PositiveInt | None = Field(
        None, description="every client takes exactly this many steps a round")
    local_epochs: PositiveInt | None = Field(
        None, description="client k takes E * ceil(n_k / B) steps a round")
    drop_remainder: bool = Field(False, description="epochs of floor(n_k / B) full batches (BHerd's tau_k), "
                                                    "not ceil(n_k / B) with a partial last batch")
    batch_order: Literal["reshuffle", "fixed"] = Field(
        "reshuffle", description="reshuffle: a fresh permutation every epoch; fixed: one order per client "
                                 "for the whole run (BHerd's non-RR)")

    @model_validator(mode="after")
    def _one_budget(self):
        if (self.local_steps is None) == (self.local_epochs is None):
            raise ValueError("set exactly one of client.local_steps and client.local_epochs, got "
                             f"local_steps={self.local_steps}, local_epochs={self.local_epochs}")
        return self


AlgorithmConfig = registry.algorithm_union()
"""``algorithm``: a registered base method's config, chosen by ``name``
(``fedjax_lab/methods/registry.py``)."""


def cohort_layout_problems(clients_per_round: int, devices: int, chunk_size: int | None) -> list[str]:
    """What is wrong with training a cohort of ``clients_per_round`` over ``devices`` devices, ``chunk_size``
    clients at once on each (the rule of the engine's ``CohortPlan``, in the config's names): empty if
    nothing. The config checks it for a number of devices, the builder for ``parallel.devices: all``."""
    cohort = f"rounds.clients_per_round={clients_per_round}"
    if clients_per_round % devices:
        return [f"parallel.devices must divide {cohort}, got {devices}"]
    share = clients_per_round // devices
    if chunk_size is None or share % chunk_size == 0:
        return []
    if devices == 1:
        return [f"rounds.chunk_size must divide {cohort}, got {chunk_size}"]
    return [(f"rounds.chunk_size must divide each device's share of the cohort ({share} clients over "
             f"{devices} devices), got {chunk_size}")]


def _layout_from_environment() -> str:
    """``rounds.layout``'s default: ``$FEDJAX_LAB_LAYOUT``, else ``measure``."""
    layout = os.environ.get("FEDJAX_LAB_LAYOUT", "measure")
    if layout not in ("measure", "rules"):
        raise ValueError(f"FEDJAX_LAB_LAYOUT (the default of rounds.layout) must be 'measure' or 'rules', "
                         f"got {layout!r}")
    return layout


class RoundsConfig(Section):
    """The rounds of a run and each round's cohort."""

    num_rounds: PositiveInt = Field(100, description="rounds of the run")
    clients_per_round: PositiveInt = Field(10, description="the cohort: clients sampled (without "
                                                           "replacement) each round")
    chunk_size: PositiveInt | None = Field(None, description="clients trained at once; must divide "
                                             "clients_per_round. Unset: chosen by measurement "
                                             "(rounds.layout), under the rules on CPU 1 for CNNs and 2 "
                                             "otherwise, the whole cohort elsewhere. Never changes results "
                                             "beyond float rounding")
    cohort_order: Literal["auto", "sampled", "balanced"] = Field(
        "auto", description="the order the cohort is trained in: balanced sorts it by the clients' example "
                            "counts into chunks of similar clients and evens out the devices' work "
                            "(speed only; float rounding), sampled keeps the order drawn, auto: balanced "
                            "when clients train local epochs (unequal steps) and the cohort is split over "
                            "devices or chunks, else sampled")
    unroll: PositiveInt = Field(1, description="scan unroll of the local step loop (speed only)")
    cpu_matmul: Literal["auto", "ynnpack", "eigen"] = Field(
        "auto", description="on a CPU, the library of the training program's matrix products: ynnpack "
                            "(XLA's default), eigen (XLA's Eigen kernels), or auto: chosen by measurement "
                            "(rounds.layout); under the rules eigen for the CNNs and ResNets, ynnpack "
                            "otherwise. Ignored on other backends. Changes results at float rounding only")
    layout: Literal["measure", "rules"] = Field(
        default_factory=_layout_from_environment,
        description="measure: the unset model.lowering, chunk_size and cpu_matmul are chosen by timing the "
                    "candidates (cached per device, model and shapes; docs/scale.md); rules: the hand "
                    "rules. Default $FEDJAX_LAB_LAYOUT, else measure. Speed only")

    @model_validator(mode="after")
    def _chunk_divides(self):
        problems = cohort_layout_problems(self.clients_per_round, devices=1, chunk_size=self.chunk_size)
        if problems:
            raise ValueError(problems[0])
        return self


class AsynchronyConfig(Section):
    """Clients report after a random delay (``fedjax_lab/engine/asynchrony.py``, docs/asynchronous.md)."""

    delay: Literal["zero", "fixed", "half_normal"] = Field(
        "half_normal", description="a job's delay in rounds: |N(0, sigma^2)| (FedBuff's and Feddle's model), "
                                   "a fixed number, or zero (the synchronous round)")
    sigma: float = Field(5.0, ge=0, description="half_normal: the scale (Feddle: 5 and 20)")
    rounds: int = Field(0, ge=0, description="fixed: the delay")
    max_delay: int | None = Field(None, ge=0, description="delays are clipped to it; default ceil(4 sigma), "
                                                          "rounds, or 0. Sizes the in-flight store")
    rounding: Literal["round", "floor", "ceil"] = Field(
        "round", description="half_normal draw to whole rounds")
    max_in_flight: PositiveInt | None = Field(
        None, description="at most this many clients training at once (the store's slots); default "
                          "min(num_clients, clients_per_round * (max_delay + 1)), which never limits "
                          "dispatch")


class EvalConfig(Section):
    every: PositiveInt = Field(
        10, description="rounds between evaluations; also the rounds per compiled block")
    batch_size: PositiveInt = Field(1024, description="rows per evaluation batch (memory only)")
    per_client: bool = Field(True, description="also each client's accuracy on its own test rows "
                                               "(client_accuracy_mean, _min, _p10, _max, _std)")
    train: bool = Field(False, description="also evaluate the global model on all clients' training rows: "
                                           "full_train_loss (the training objective, l2 included) and "
                                           "full_train_accuracy")
    local_models: int = Field(0, ge=0, description="also train the first n clients one round from the global "
                                                   "model (not aggregated) and report their local models' "
                                                   "test accuracy, that reweighted by each client's class "
                                                   "mix, and their distance to their aggregate (FedCOG's "
                                                   "Table 9, Fig. 2); 0: off")
    dissimilarity: int = Field(0, ge=0, description="also measure the gradient dissimilarity of the first n "
                                                    "clients at the global model, split into the model's "
                                                    "lower and upper parts (FedImpro's Theorem 4.2); 0: off")
    dissimilarity_examples: PositiveInt = Field(
        256, description="rows of each client the gradients are taken on")
    dissimilarity_counterfactual: dict[str, float] = Field(
        default_factory=dict, description="hyper-parameters (dotted paths, e.g. algorithm.weight) changed "
                                          "for a second measurement at the same global model, reported with "
                                          "the suffix _counterfactual ({algorithm.weight: 0}: FedImpro's "
                                          "clients without the sampled features); needs eval.dissimilarity")
    split: str | None = Field(None, description="the model stage that ends the lower part (default: "
                                                "fedimpro's split, else the middle stage)")
    target_accuracy: float | None = Field(None, gt=0, le=1, description="the summary reports the first "
                                                                       "evaluated round reaching it "
                                                                       "(FedImpro's Table 2)")

    @model_validator(mode="after")
    def _counterfactual_needs_a_measurement(self):
        if self.dissimilarity_counterfactual and not self.dissimilarity:
            raise ValueError("eval.dissimilarity_counterfactual needs eval.dissimilarity (the clients "
                             "measured) > 0")
        return self


class ParallelConfig(Section):
    """Devices and hosts (docs/scale.md): the cohort is split over ``devices`` with ``jax.sharding``; several
    processes (hosts) join through ``jax.distributed``, each running the same config."""

    devices: PositiveInt | Literal["all", "auto"] = Field(
        "auto", description="devices the cohort is split over: a number, 'all' of every process's devices, "
                            "or 'auto': on a CPU the most of its devices that divide the cohort (the "
                            "command line gives the CPU one device per core), on an accelerator one")
    aggregation: Literal["auto", "streaming", "stacked"] = Field(
        "auto", description="streaming reduces each chunk's messages as it finishes (bounded memory) where "
                            "the method's server update is a weighted mean; auto: whenever the cohort is "
                            "chunked or sharded")
    memory_budget_gb: float | None = Field(None, gt=0, description="refuse a run whose compiled program "
                                                                   "needs more (default: half the device's "
                                                                   "memory)")
    coordinator_address: str | None = Field(None, description="host:port of process 0, for jax.distributed "
                                                              "(default: $JAX_COORDINATOR_ADDRESS; unset: "
                                                              "one process)")
    num_processes: PositiveInt | None = Field(None, description="default $JAX_NUM_PROCESSES")
    process_id: int | None = Field(None, ge=0, description="default $JAX_PROCESS_ID")
    init_timeout_s: PositiveFloat = Field(300.0, description="how long the processes wait for each other at "
                                                             "start-up before giving up with a message")

    @model_validator(mode="after")
    def _process_in_range(self):
        if (self.process_id is not None and self.num_processes is not None
                and self.process_id >= self.num_processes):
            raise ValueError(f"parallel.process_id must be < parallel.num_processes={self.num_processes}, "
                             f"got {self.process_id}")
        return self


class Distributed(typing.NamedTuple):
    """Where and how a run joins several processes: ``parallel``'s fields, else the environment's."""

    coordinator_address: str
    host: str
    port: int
    num_processes: int | None
    process_id: int | None
    init_timeout_s: float

    @property
    def complete(self) -> bool:
        """Whether every process's place is known here; otherwise JAX reads it from the cluster (SLURM, MPI,
        Kubernetes) and there is no rendezvous of ours first."""
        return self.num_processes is not None and self.process_id is not None


_ENVIRONMENT = {"coordinator_address": "JAX_COORDINATOR_ADDRESS", "num_processes": "JAX_NUM_PROCESSES",
                "process_id": "JAX_PROCESS_ID"}


def distributed_settings(parallel: ParallelConfig, environ: typing.Mapping[str, str] | None = None
                         ) -> Distributed | None:
    """The multi-process settings of a run, or ``None`` for a single process; checked before JAX starts.

    Each of ``coordinator_address``, ``num_processes`` and ``process_id`` comes from ``parallel`` or else from
    ``$JAX_COORDINATOR_ADDRESS``, ``$JAX_NUM_PROCESSES`` and ``$JAX_PROCESS_ID``, parsed as the config field.

    A coordinator address without ``num_processes`` or ``process_id`` leaves them to JAX's cluster detection
    (SLURM, Open MPI, Kubernetes).

    Raises:
      ConfigError: a value that is not of its field's kind, several processes without a coordinator
        ``host:port``, or a process id not below ``num_processes``, naming the field and, for a value from the
        environment, the variable.
    """
    environ = os.environ if environ is None else environ
    values, origin, problems = {}, {}, []
    for field, variable in _ENVIRONMENT.items():
        value = getattr(parallel, field)
        origin[field] = f"parallel.{field}"
        if value is None and environ.get(variable, "").strip():
            value, origin[field] = environ[variable].strip(), f"parallel.{field} (from ${variable})"
            if field != "coordinator_address":
                try:
                    value = int(value)
                except ValueError:
                    problems.append(f"{origin[field]}: must be a whole number, got {environ[variable]!r}")
                    value = None
        values[field] = value
    count, index, address = values["num_processes"], values["process_id"], values["coordinator_address"]
    if count is not None and count < 1:
        problems.append(f"{origin['num_processes']}: must be >= 1, got {count}")
    if index is not None and index < 0:
        problems.append(f"{origin['process_id']}: must be >= 0, got {index}")
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))
    if address is None and (count is None or count == 1):
        return None
    if address is None:
        problems.append(f"parallel.coordinator_address: required for {count} processes (host:port of process "
                        "0); set it or $JAX_COORDINATOR_ADDRESS")
    host, _, port = (address or "").rpartition(":")
    if address is not None and not (host and port.isdigit() and 0 < int(port) < 65536):
        problems.append(f"{origin['coordinator_address']}: must be host:port with a port in 1..65535, got "
                        f"{address!r}")
    if count is not None and index is not None and index >= count:
        problems.append(f"{origin['process_id']}: must be < num_processes={count}, got {index}")
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))
    return Distributed(address, host.strip("[]"), int(port), count, index, parallel.init_timeout_s)


class CheckpointConfig(Section):
    every_blocks: int = Field(5, ge=0, description="0 checkpoints only at the end")
    keep: PositiveInt = Field(2, description="checkpoints kept (the latest ones)")


class Config(Section):
    """A whole experiment."""

    seed: int = Field(
        0, ge=0, description="fixes everything: data, partition, initialisation, cohorts, shuffles")
    dataset: DatasetConfig
    model: ModelConfig
    algorithm: AlgorithmConfig
    client: ClientConfig
    rounds: RoundsConfig = RoundsConfig()
    asynchrony: AsynchronyConfig | None = Field(None, description="clients report after a delay; unset: the "
                                                                   "synchronous round")
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    parallel: ParallelConfig = ParallelConfig()
    privacy: PrivacyConfig | None = Field(None, description="user-level differential privacy (DP-FedAvg, "
                                                            "docs/privacy.md); unset: none")

    @model_validator(mode="after")
    def _consistent(self):
        """Every check across sections, each problem reported (one message, a line each): the checks are
        independent of one another."""
        problems = [*self._cohort_problems(), *self._arrival_problems(), *self._method_problems(),
                    *self._privacy_problems()]
        if problems:
            raise ValueError("\n  ".join(problems))
        return self

    def _cohort_problems(self) -> list[str]:
        population = self.dataset.num_clients
        if self.rounds.clients_per_round > population:
            return [(f"rounds.clients_per_round must be <= dataset.num_clients={population}, "
                    f"got {self.rounds.clients_per_round}")]
        devices = self.parallel.devices
        if isinstance(devices, int) and devices > 1:  # "all" is checked by the builder, which counts them
            return cohort_layout_problems(self.rounds.clients_per_round, devices, self.rounds.chunk_size)
        return []

    def _arrival_problems(self) -> list[str]:
        a = self.asynchrony
        if a is None or a.delay != "fixed":
            return []
        delay = a.rounds if a.max_delay is None else min(a.rounds, a.max_delay)
        total = self.rounds.num_rounds
        if delay >= total:
            return [(f"asynchrony.rounds: a job sent in round r arrives in round r + {delay}, after the last "
                    f"of rounds.num_rounds={total}, so no update would ever arrive; use a delay < {total}")]
        arrivals = self.rounds.clients_per_round * (total - delay)
        buffer = self.algorithm.buffer_size
        if buffer is not None and arrivals < buffer:
            return [(f"algorithm.buffer_size: at most {arrivals} updates arrive in {total} rounds with "
                    f"asynchrony.rounds={delay}, fewer than the {buffer} the server waits for, so it would "
                    f"never step; use a buffer_size <= {arrivals}")]
        return []

    def _method_problems(self) -> list[str]:
        a, problems = self.algorithm, []
        names = [a.name] + [p.name for p in a.plugins]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            problems.append(f"algorithm.plugins: each method may appear once, got {repeated} more than once")
        if registry.REGISTRY[a.name].reference and a.plugins:
            problems.append(f"algorithm.plugins: the reference run {a.name!r} takes no plug-ins")
        if registry.REGISTRY[a.name].reference and (self.asynchrony is not None or a.buffer_size is not None):
            problems.append(f"asynchrony: the reference run {a.name!r} has no clients to wait for; remove "
                            "asynchrony and algorithm.buffer_size")
        if self.asynchrony is not None and self.asynchrony.max_in_flight is not None and \
                self.asynchrony.max_in_flight < self.rounds.clients_per_round:
            problems.append(f"asynchrony.max_in_flight must be >= rounds.clients_per_round="
                            f"{self.rounds.clients_per_round}, got {self.asynchrony.max_in_flight}")
        for name in dict.fromkeys(names):
            if (registry.REGISTRY[name].needs_server_data
                    and getattr(self.dataset, "server_data", None) is None):
                problems.append(f"algorithm: {name} needs data held by the server: set dataset.server_data "
                                "(an image dataset's data held by the server)")
        return problems


    def _privacy_problems(self) -> list[str]:
        p, problems = self.privacy, []
        if p is None:
            return []
        population, expected = self.dataset.num_clients, self.rounds.clients_per_round
        if registry.REGISTRY[self.algorithm.name].reference:
            problems.append(f"privacy: the reference run {self.algorithm.name!r} has no clients to protect")
        if self.asynchrony is not None or self.algorithm.buffer_size is not None:
            problems.append("privacy: DP-FedAvg runs in the synchronous round; remove asynchrony and "
                            "algorithm.buffer_size")
        if self.algorithm.weighting != "uniform":
            problems.append(f"algorithm.weighting: privacy bounds each client's influence with uniform "
                            f"weights; set algorithm.weighting: uniform (got {self.algorithm.weighting!r})")
        if p.max_clients is not None and not expected <= p.max_clients <= population:
            problems.append(f"privacy.max_clients must be in [rounds.clients_per_round={expected}, "
                            f"dataset.num_clients={population}], got {p.max_clients}")
        if p.accountant == "rdp" and p.sampling == "poisson" and (p.max_clients or population) < population:
            problems.append(f"privacy.max_clients: the rdp accountant counts untruncated Poisson sampling, "
                            f"so the cohort needs a slot for every client ({population}); use accountant: "
                            f"pld, which counts the truncation, or leave max_clients unset")
        count_noise = p.count_noise or expected / 20
        if p.adaptive and p.noise_multiplier is not None and 0 < p.noise_multiplier and \
                2 * count_noise <= p.noise_multiplier:
            problems.append(f"privacy.count_noise: adaptive clipping splits the noise multiplier z between "
                            f"the update and the count, which needs 2 sigma_b > z={p.noise_multiplier}; got "
                            f"sigma_b={count_noise:g}")
        return problems


# ------------------------------------------------------------------------------------------- loading
_DATASETS = {"synthetic": SyntheticDataset, "gaussian_mixture": GaussianMixtureDataset,
             "shakespeare": ShakespeareDataset, **{name: ImageDataset for name in IMAGE_DATASETS}}


def _allowed_keys(model: type[BaseModel] | None) -> list[str]:
    return sorted(model.model_fields) if model is not None else []


def _is_tag(part: Any) -> bool:
    """Whether a location part is the tag of a tagged union (a dataset or method name), not a field."""
    return isinstance(part, str) and (part in _DATASETS or part in registry.REGISTRY)


def _section_model(loc: tuple) -> type[BaseModel] | None:
    """The pydantic model that owns the field at ``loc`` (for suggestions on misspelt keys)."""
    model: Any = config_model()
    for i, part in enumerate(loc[:-1]):
        if part in _DATASETS:
            model = _DATASETS[part]
            continue
        if isinstance(part, str) and part in registry.REGISTRY:
            spec = registry.REGISTRY[part]
            model = registry.plugin_config(spec) if "plugins" in loc[:i] else spec.config
            continue
        field = model.model_fields.get(part) if model is not None and isinstance(part, str) else None
        model = _section_of(field.annotation) if field is not None else None
    return model


def _section_of(annotation: Any) -> type[BaseModel] | None:
    """The section model of a field's annotation, optional sections (``AsynchronyConfig | None``) included."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    sections = [a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
    return sections[0] if len(sections) == 1 else None


def _unknown_key(error: dict, path: str, key: str) -> str:
    allowed = _allowed_keys(_section_model(error["loc"]))
    method = next((p for p in reversed(error["loc"][:-1]) if isinstance(p, str) and p in registry.REGISTRY),
                  None)
    if method is not None:
        others = [m for m in registry.owners(key) if m != method]
        whose = f" (it is a field of {', '.join(others)})" if others else ""
        close = difflib.get_close_matches(key, allowed, n=1)
        hint = f"; did you mean {close[0]!r}?" if close and not others else ""
        return f"{path}: {method} has no field {key!r}{whose}{hint}; {method}'s fields: {', '.join(allowed)}"
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{path}: unknown key{hint} (allowed: {', '.join(allowed)})" if allowed else f"{path}: unknown key"


def _format_error(error: dict) -> str:
    loc = tuple(p for p in error["loc"] if not _is_tag(p))
    path = ".".join(str(p) for p in loc) or "<config>"
    kind = error["type"]
    if kind == "extra_forbidden":
        return _unknown_key(error, path, str(loc[-1]))
    if kind == "bool_for_number":
        return f"{path + '.' if loc else ''}{error['msg']}"
    if kind == "finite_number":
        return f"{path}: must be a finite number, got {error.get('input')!r}"
    if kind == "union_tag_invalid":
        tag, expected = str(error["ctx"]["tag"]), error["ctx"]["expected_tags"]
        close = difflib.get_close_matches(tag, re.findall(r"'([^']+)'", expected), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        if tag in registry.REGISTRY and "plugins" in error["loc"]:
            hint = f"{tag} is a method but not a plug-in; "
        return f"{path}.name: unknown name {tag!r}; {hint}allowed: {expected}"
    if kind == "union_tag_not_found":
        return f"{path}.name: missing; it selects the kind of {path}"
    if kind == "missing":
        return f"{path}: required field is missing"
    if kind == "value_error":
        return str(error["ctx"]["error"])
    return f"{path}: {error['msg']}, got {error.get('input')!r}"


_MODELS: dict[tuple[str, ...], type[Config]] = {tuple(registry.REGISTRY): Config}


def config_model() -> type[Config]:
    """:class:`Config`, with ``algorithm`` covering every method registered so far (methods registered after
    this module was imported, as in ``docs/extending.md``, included)."""
    names = tuple(registry.REGISTRY)
    if names not in _MODELS:
        _MODELS[names] = pydantic.create_model("Config", __base__=Config, __doc__=Config.__doc__,
                                               algorithm=(registry.algorithm_union(), ...))
    return _MODELS[names]


def validate(raw: dict) -> Config:
    """Validates a nested dict into a :class:`Config`, or raises :class:`ConfigError` listing every problem:
    each field's, and the problems across sections that do not involve a field already wrong."""
    try:
        return config_model().model_validate(raw)
    except pydantic.ValidationError as exc:
        lines = sorted({_format_error(e) for e in exc.errors()})
        lines += [line for line in _independent_problems(raw, exc.errors()) if line not in lines]
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines)) from None


def _independent_problems(raw: dict, errors: list[dict]) -> list[str]:
    """The checks across sections (``Config._consistent``), which pydantic runs only once every field is
    valid, run on ``raw`` with the wrong fields (or sections) dropped; a problem that names a dropped field is
    left out, since it may come from the default that replaced it."""
    if any(e["type"] in ("missing", "union_tag_invalid", "union_tag_not_found") for e in errors):
        return []  # a section whose kind is unknown or a required field: nothing to check against
    repaired, dropped = copy.deepcopy(raw), []
    for error in errors:
        loc = [p for p in error["loc"] if not _is_tag(p)]
        if not loc:
            return []  # the cross-section checks themselves failed: they are already reported
        if error["type"] == "value_error" or isinstance(loc[-1], int):
            loc = loc[:-1] if isinstance(loc[-1], int) else loc  # a section's own check: drop the section
        if not _drop(repaired, loc):
            return []
        dropped.append(".".join(str(p) for p in loc))
    try:
        config_model().model_validate(repaired)
    except pydantic.ValidationError as again:
        found = [line for e in again.errors() if e["type"] == "value_error" and not e["loc"]
                 for line in _format_error(e).split("\n  ")]
        return [line for line in found if not any(d in line for d in dropped)]
    return []


def _drop(raw: Any, loc: list) -> bool:
    """Deletes ``raw[loc[0]][loc[1]]...`` (dicts and lists); whether it was there."""
    for part in loc[:-1]:
        try:
            raw = raw[part]
        except (KeyError, IndexError, TypeError):
            return False
    try:
        del raw[loc[-1]]
    except (KeyError, IndexError, TypeError):
        return False
    return True


def apply_override(raw: dict, override: str) -> dict:
    """Sets ``a.b.c=value`` in a nested dict; ``value`` is parsed as YAML (``1e-3``, ``true``, ``[1, 2]``). In
    a list, a key is an index or the ``name`` of an entry: ``algorithm.plugins.fedwalk.tau=1``."""
    if "=" not in override:
        raise ConfigError(f"override {override!r} must look like dotted.key=value")
    path, _, text = override.partition("=")
    keys = path.strip().split(".")
    node: Any = raw
    for key in keys[:-1]:
        if isinstance(node, list):
            node = _list_entry(node, key, override)
            continue
        child = node.setdefault(key, {})
        if not isinstance(child, (dict, list)):
            raise ConfigError(f"override {override!r}: {key!r} is a value, not a section")
        node = child
    if isinstance(node, list):
        raise ConfigError(f"override {override!r}: set a whole list as {'.'.join(keys[:-1])}=[...]")
    try:
        node[keys[-1]] = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {override!r}: the value is not valid YAML "
                          f"({_yaml_problem(exc)})") from None
    return raw


def _list_entry(entries: list, key: str, override: str) -> dict:
    """The entry of a list named by an override's key: an index, or the entry whose ``name`` is ``key``."""
    if key.isdigit() and int(key) < len(entries):
        return entries[int(key)]
    named = [e for e in entries if isinstance(e, dict) and e.get("name") == key]
    if not named:
        names = [e.get("name") for e in entries if isinstance(e, dict)]
        raise ConfigError(f"override {override!r}: no entry {key!r} in the list (its entries: {names}; add "
                          f"one with the whole list, e.g. ...=[{{name: {key}}}])")
    return named[0]


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error in one line: what is wrong, and where (1-based line and column)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark is not None else problem


def deep_merge(base: dict, changes: dict) -> dict:
    """``base`` with ``changes`` applied: nested mappings merge key by key, anything else is replaced."""
    merged = dict(base)
    for key, value in changes.items():
        merged[key] = (deep_merge(merged[key], value)
                       if isinstance(value, dict) and isinstance(merged.get(key), dict) else value)
    return merged


def read_raw(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    """A YAML config as a dict, with ``extends: other.yaml`` (relative to this file) resolved: this file's
    keys are merged over the other's."""
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    if path.resolve() in seen:
        raise ConfigError(f"config file {str(path)!r} extends itself (through {[str(p) for p in seen]})")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {_yaml_problem(exc)}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping at the top level")
    parent = raw.pop("extends", None)
    if parent is None:
        return raw
    if not isinstance(parent, str):
        raise ConfigError(f"{path}: extends must be the path of another config file, got {parent!r}")
    return deep_merge(read_raw(path.parent / parent, seen + (path.resolve(),)), raw)


def load_config(path: str | Path, overrides: list[str] = ()) -> Config:
    """Reads a YAML config (resolving ``extends``), applies ``dotted.key=value`` overrides, and validates
    it."""
    raw = read_raw(Path(path))
    for override in overrides:
        apply_override(raw, override)
    return validate(raw)


def to_yaml(config: Config) -> str:
    """The fully resolved config, defaults included, as YAML."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


RESULT_FREE = ("parallel.coordinator_address", "parallel.process_id", "parallel.init_timeout_s",
               "parallel.memory_budget_gb", "checkpoint.keep", "checkpoint.every_blocks")
"""Fields that never change a run's results: a resume may change them (a resumed run equals an
uninterrupted one wherever its checkpoints fall: a run that checkpoints too rarely may resume with more)."""


def config_differences(stored: dict, given: dict, prefix: str = "") -> list[str]:
    """The dotted keys where two configs (as ``model_dump(mode='json')`` dicts, or read back from
    ``config.yaml``) differ, each with both values: ``client.learning_rate: 0.01 stored, 0.05 given``. Keys of
    :data:`RESULT_FREE` are left out."""
    lines = []
    for key in list(stored) + [k for k in given if k not in stored]:
        path = f"{prefix}{key}"
        a, b = stored.get(key, "<absent>"), given.get(key, "<absent>")
        if path in RESULT_FREE or a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            lines += config_differences(a, b, f"{path}.")
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and all(
                isinstance(x, dict) and isinstance(y, dict) for x, y in zip(a, b)):
            for i, (x, y) in enumerate(zip(a, b)):
                lines += config_differences(x, y, f"{path}.{x.get('name', i)}.")
        else:
            lines.append(f"{path}: {a!r} stored, {b!r} given")
    return lines


def check_resumable(stored_yaml: str, config: Config, where: str) -> None:
    """Raises :class:`ConfigError` naming every differing key when ``config`` is not the one ``stored_yaml``
    (a run's ``config.yaml``) was run with."""
    try:
        stored = yaml.safe_load(stored_yaml)
    except yaml.YAMLError as exc:
        raise ConfigError(f"cannot resume {where}: its config.yaml is not valid YAML ({_yaml_problem(exc)}); "
                          "restore it, or start again with --overwrite") from None
    stored = stored if isinstance(stored, dict) else {}
    try:  # with the defaults of today's fields filled in, as the config given has them
        stored = validate(stored).model_dump(mode="json")
    except ConfigError:
        pass  # a field that no longer exists: compared as written, and named
    differences = config_differences(stored, config.model_dump(mode="json"))
    if differences:
        raise ConfigError(f"cannot resume {where}: the config given differs from its config.yaml in\n  "
                          + "\n  ".join(differences) + "\nresume with the same config (or its config.yaml), "
                          "or start a new run directory")


Grid = dict[str, list[Any]]
"""A sweep's grid: ``{dotted.path: [values]}``."""


def split_grid_args(args: list[str]) -> tuple[Grid, list[str]]:
    """Command-line ``key=v1,v2,...`` items (a comma outside brackets) into grid axes, the others into
    overrides."""
    grid, overrides, seen = {}, [], {}
    for arg in args:
        key, sep, text = arg.partition("=")
        key = key.strip()
        if sep and key in seen:
            raise ConfigError(f"{key} is given twice ({seen[key]!r} and {arg!r}); give each key once (a grid "
                              f"axis lists all its values: {key}=v1,v2,...)")
        seen[key] = arg
        parts = _top_level_split(text)
        if sep and len(parts) > 1:
            try:
                grid[key] = [yaml.safe_load(p) for p in parts]
            except yaml.YAMLError as exc:
                raise ConfigError(f"grid {arg!r}: a value is not valid YAML ({_yaml_problem(exc)})") from None
        else:
            overrides.append(arg)
    return grid, overrides


def _top_level_split(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    return [*parts, text[start:].strip()]
