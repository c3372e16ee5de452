"""Experiment configuration: YAML files plus ``dotted.key=value`` overrides, validated before anything compiles.

The schema is a tree of pydantic models that forbid unknown keys, so a misspelt key, a value out of range or
an unknown name fails with a message naming the field, the value given and what is allowed.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, model_validator


class ConfigError(ValueError):
    """A configuration is invalid; the message lists every problem, one per line, by dotted field name."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ----------------------------------------------------------------------------------------------- datasets
class SyntheticDataset(Section):
    """Synthetic(alpha, beta) of the FedProx paper (embedded, generated from a seed)."""

    name: Literal["synthetic"]
    alpha: float = Field(1.0, ge=0)
    beta: float = Field(1.0, ge=0)
    iid: bool = False
    num_clients: PositiveInt = 30
    dimension: PositiveInt = 60
    num_classes: int = Field(10, ge=2)
    train_fraction: float = Field(0.9, gt=0, lt=1)
    seed: int | None = Field(None, description="generator seed; defaults to the run's seed")


class GaussianMixtureDataset(Section):
    """A Gaussian-mixture classification task with Dirichlet label skew (embedded)."""

    name: Literal["gaussian_mixture"]
    num_clients: PositiveInt = 100
    examples_per_client: int = Field(100, ge=2)
    num_classes: int = Field(10, ge=2)
    dimension: PositiveInt = 20
    separation: PositiveFloat = 1.0
    label_alpha: PositiveFloat | None = 0.5
    train_fraction: float = Field(0.8, gt=0, lt=1)
    seed: int | None = None


class PartitionConfig(Section):
    """How the training rows are dealt to clients (``fedjax_lab/data/partitions.py``)."""

    name: Literal["iid", "dirichlet", "dirichlet_client", "classes_per_client", "shards", "quantity_skew",
                  "feature_skew", "bherd_case"] = "dirichlet"
    num_clients: PositiveInt = 100
    alpha: PositiveFloat = Field(0.5, description="dirichlet, dirichlet_client, quantity_skew")
    min_size: int = Field(10, ge=1, description="dirichlet, quantity_skew: fewest rows a client may get")
    max_attempts: PositiveInt = Field(100, description="dirichlet, quantity_skew: redraws before giving up")
    classes: PositiveInt = Field(2, description="classes_per_client")
    shards_per_client: PositiveInt = Field(2, description="shards")
    client_size: PositiveInt | None = Field(None, description="dirichlet_client; default N // num_clients")
    noise: float = Field(0.1, ge=0, description="feature_skew: client i gets noise * i / (n - 1)")
    case: Literal[1, 2, 3] = Field(1, description="bherd_case")
    file: str | None = Field(None, description="load a saved partition.npz instead of partitioning")
    seed: int | None = Field(None, description="defaults to the run's seed")


class ServerDataConfig(Section):
    """Data held by the server and by no client (FedWalk, Feddle)."""

    kind: Literal["in_domain", "out_of_domain", "withheld_classes"]
    size: PositiveInt = 1000
    dataset: str | None = Field(None, description="out_of_domain: another dataset of the same source")
    classes: tuple[int | str, ...] = Field((), description="withheld_classes: classes no client sees; "
                                                           "out_of_domain: the other dataset's classes to keep "
                                                           "(relabelled 0, 1, ... in this order). Ids or names")
    stratified: bool = Field(True, description="in_domain: balance the classes")

    @model_validator(mode="after")
    def _fields_for_kind(self):
        if self.kind == "out_of_domain" and not self.dataset:
            raise ValueError("dataset.server_data.dataset is required when kind is 'out_of_domain'")
        if self.kind == "withheld_classes" and not self.classes:
            raise ValueError("dataset.server_data.classes is required when kind is 'withheld_classes'")
        return self


IMAGE_DATASETS = ("mnist", "fashion_mnist", "cifar10", "cifar100", "emnist", "svhn_cropped", "image_folder")


class ImageDataset(Section):
    """A centralised image dataset from local archives or tensorflow-datasets, partitioned into clients."""

    name: Literal["mnist", "fashion_mnist", "cifar10", "cifar100", "emnist", "svhn_cropped", "image_folder"]
    source: Literal["local", "tfds"] = "local"
    data_dir: str | None = Field(None, description="local: folder of the archives (default $FEDJAX_LAB_DATA or "
                                                   "../shared/data); tfds: the tfds data dir; image_folder: root")
    tfds_name: str | None = Field(None, description="tfds builder name when it differs, e.g. emnist/balanced")
    labels: Literal["fine", "coarse", "parity"] = Field("fine", description="coarse: CIFAR-100 superclasses; "
                                                                            "parity: even (1) vs odd (0)")
    partition: PartitionConfig = PartitionConfig()
    server_data: ServerDataConfig | None = None
    standardize: bool = Field(True, description="per-channel standardisation with training-set statistics")
    augment: Literal["none", "flip", "crop_flip"] = "none"
    seed: int | None = None

    @property
    def num_clients(self) -> int:
        return self.partition.num_clients

    @model_validator(mode="after")
    def _source_has_it(self):
        if self.source == "local" and self.name in ("emnist", "svhn_cropped"):
            raise ValueError(f"dataset.source: {self.name!r} has no local archive; use dataset.source=tfds")
        if self.name == "image_folder" and not self.data_dir:
            raise ValueError("dataset.data_dir is required for image_folder (root of train/<class>/<image>)")
        return self


class ShakespeareDataset(Section):
    """Federated Shakespeare: one client per role (natural partition), next-character prediction."""

    name: Literal["shakespeare"]
    data_dir: str | None = None
    sequence_length: PositiveInt = 80
    num_clients: PositiveInt = Field(715, le=715, description="the first num_clients roles")


DatasetConfig = Annotated[SyntheticDataset | GaussianMixtureDataset | ImageDataset | ShakespeareDataset,
                          Field(discriminator="name")]


# ------------------------------------------------------------------------------------------------- models
MODELS = ("logistic_regression", "linear_svm", "mlp", "simple_cnn", "fedavg_cnn", "bherd_cnn", "cnn3", "resnet8",
          "resnet18", "char_rnn")


class ModelConfig(Section):
    """A model of the zoo (``fedjax_lab/models``)."""

    name: Literal["logistic_regression", "linear_svm", "mlp", "simple_cnn", "fedavg_cnn", "bherd_cnn", "cnn3",
                  "resnet8", "resnet18", "char_rnn"]
    hidden: tuple[PositiveInt, ...] = Field((200, 200), description="mlp")
    padding: Literal["SAME", "VALID"] = Field("SAME", description="fedavg_cnn")
    norm: Literal["batch", "group", "none"] = Field("batch", description="resnet8, resnet18")
    groups: PositiveInt = Field(2, description="GroupNorm groups")
    lowering: Literal["auto", "xla", "im2col", "banded"] = Field("auto", description="CNN convolutions (speed only); "
                                                                   "auto: banded on CPU, xla elsewhere")
    l2: float = Field(0.0, ge=0, description="adds l2/2 ||w||^2 to the loss (linear_svm: BHerd uses 0.1)")
    embed_dim: PositiveInt = Field(8, description="char_rnn")
    rnn_hidden: PositiveInt = Field(256, description="char_rnn")


# ----------------------------------------------------------------------------------------------- training
class ClientConfig(Section):
    """Local training. Exactly one of ``local_steps`` and ``local_epochs`` (see docs/semantics.md)."""

    optimizer: Literal["sgd", "adam"] = "sgd"
    learning_rate: PositiveFloat = 0.01
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    batch_size: PositiveInt = 10
    local_steps: PositiveInt | None = None
    local_epochs: PositiveInt | None = None

    @model_validator(mode="after")
    def _one_budget(self):
        if (self.local_steps is None) == (self.local_epochs is None):
            raise ValueError("set exactly one of client.local_steps and client.local_epochs, got "
                             f"local_steps={self.local_steps}, local_epochs={self.local_epochs}")
        return self


class AlgorithmConfig(Section):
    """The method. The FedAvg family is FedAvg with a server optimiser (Reddi et al. 2021); the baselines of
    ``fedjax_lab/methods`` take their own fields, and ``server_optimizer`` composes a client-side method with a
    server optimiser (e.g. ``name: fedprox, server_optimizer: adam`` is FedProx + FedAdam)."""

    name: Literal["fedavg", "fedavgm", "fedadam", "fedyogi", "fedadagrad", "fedprox", "scaffold", "fednova",
                  "feddyn", "fedexp", "fedsam", "moon", "feddecorr", "centralized", "server_only"]
    server_optimizer: Literal["default", "sgd", "momentum", "momentum_fedcog", "adam", "yogi", "adagrad"] = Field(
        "default", description="default: what the name implies (sgd for the baselines); momentum_fedcog: FedCOG's "
                               "code variant of FedAvgM (x - v / (1 + beta))")
    server_learning_rate: PositiveFloat = 1.0
    server_momentum: float = Field(0.9, ge=0, lt=1, description="fedavgm / server_optimizer=momentum")
    beta1: float = Field(0.9, ge=0, lt=1, description="adam/yogi/adagrad")
    beta2: float = Field(0.99, ge=0, lt=1, description="adam/yogi")
    tau: PositiveFloat = Field(1e-3, description="adaptivity, adam/yogi/adagrad")
    weighting: Literal["num_examples", "uniform"] = "num_examples"
    mu: float = Field(0.01, ge=0, description="fedprox: proximal weight; moon: contrastive weight (MOON's paper "
                                                   "uses 5 on CIFAR-10, FedCOG's baseline 0.01)")
    temperature: PositiveFloat = Field(0.5, description="moon")
    beta: float = Field(0.1, ge=0, description="feddecorr: decorrelation weight")
    option: Literal["I", "II"] = Field("II", description="scaffold: control update")
    control_average: Literal["all", "cohort"] = Field("all", description="scaffold: divide control deltas by N or |S|")
    correction: Literal["after_step", "through_optimizer"] = Field(
        "after_step", description="scaffold: apply -eta (c - c_k) after the optimiser step, or add c - c_k to the "
                                  "gradient before it (amplified by client momentum)")
    alpha: float = Field(0.01, ge=0, description="feddyn: regularisation weight")
    epsilon: PositiveFloat = Field(1e-3, description="fedexp: step-size denominator offset")
    rho: float = Field(0.05, ge=0, description="fedsam: perturbation radius")
    fedwalk: FedWalkConfig | None = Field(None, description="adds FedWalk's leash to the method ('X + FedWalk')")


class FedWalkConfig(Section):
    """FedWalk's leash on top of ``algorithm.name`` (``fedjax_lab/methods/fedwalk.py``); the leash set is
    ``dataset.server_data``."""

    mode: Literal["leash", "pretrain"] = Field("leash", description="pretrain: the ablation's leash training "
                                                                    "before FL, then no leash during FL")
    tau: float = Field(0.5, description="LLR threshold: the leash trains while log2(Lc/Ls) < tau (-.inf: never)")
    beta: float = Field(0.9, ge=0, lt=1, description="momentum of the client-loss EMA Lc")
    steps: PositiveInt = Field(1, description="T_s: leash SGD steps when the gate opens")
    batch_size: PositiveInt = Field(64, description="B_s: leash batch size")
    learning_rate: PositiveFloat | None = Field(None, description="gamma; default client.learning_rate")
    momentum: float = Field(0.0, ge=0, lt=1, description="leash SGD momentum (the paper: none)")
    client_loss: Literal["final", "train"] = Field(
        "final", description="L_k: the final local model's loss on client_loss_examples of the client's data, "
                             "or the mean loss of its training steps")
    client_loss_examples: PositiveInt = Field(256, description="sample size of L_k (all, for smaller clients)")
    leash_loss_examples: PositiveInt = Field(512, description="sample size of Ls (all, for a smaller leash set)")
    pretrain_steps: PositiveInt | None = Field(None, description="leash steps before FL. mode pretrain: default "
                                                                 "rounds.num_rounds * steps; mode leash: default "
                                                                 "none, else FedWalk starts from the pre-trained "
                                                                 "model and leash head")

    @model_validator(mode="after")
    def _tau_is_a_number(self):
        if self.tau != self.tau:
            raise ValueError("algorithm.fedwalk.tau must be a number (.inf and -.inf are allowed), got nan")
        return self


class RoundsConfig(Section):
    num_rounds: PositiveInt = 100
    clients_per_round: PositiveInt = 10
    chunk_size: PositiveInt | None = Field(None, description="clients trained at once; must divide clients_per_round. "
                                             "Unset: on CPU 1 for CNNs and 2 otherwise, the whole cohort elsewhere. Never changes "
                                             "results beyond float rounding")
    unroll: PositiveInt = Field(1, description="scan unroll of the local step loop (speed only)")

    @model_validator(mode="after")
    def _chunk_divides(self):
        if self.chunk_size is not None and self.clients_per_round % self.chunk_size:
            raise ValueError(f"rounds.chunk_size must divide rounds.clients_per_round={self.clients_per_round}, "
                             f"got {self.chunk_size}")
        return self


class EvalConfig(Section):
    every: PositiveInt = Field(10, description="rounds between evaluations; also the rounds per compiled block")
    batch_size: PositiveInt = 1024
    per_client: bool = True


class CheckpointConfig(Section):
    every_blocks: int = Field(5, ge=0, description="0 checkpoints only at the end")
    keep: PositiveInt = 2


class Config(Section):
    """A whole experiment."""

    seed: int = 0
    dataset: DatasetConfig
    model: ModelConfig
    algorithm: AlgorithmConfig
    client: ClientConfig
    rounds: RoundsConfig = RoundsConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()

    @model_validator(mode="after")
    def _cohort_fits(self):
        population = self.dataset.num_clients
        if self.rounds.clients_per_round > population:
            raise ValueError(f"rounds.clients_per_round must be <= dataset.num_clients={population}, "
                             f"got {self.rounds.clients_per_round}")
        return self

    @model_validator(mode="after")
    def _leash_has_data(self):
        if self.algorithm.fedwalk is None:
            return self
        if getattr(self.dataset, "server_data", None) is None:
            raise ValueError("algorithm.fedwalk needs a leash set: set dataset.server_data (an image dataset's "
                             "data held by the server)")
        if self.algorithm.name in ("centralized", "server_only"):
            raise ValueError(f"algorithm.fedwalk cannot wrap the reference run {self.algorithm.name!r}")
        return self


# ------------------------------------------------------------------------------------------- loading
_DATASETS = {"synthetic": SyntheticDataset, "gaussian_mixture": GaussianMixtureDataset, "shakespeare": ShakespeareDataset,
             **{name: ImageDataset for name in IMAGE_DATASETS}}


def _allowed_keys(model: type[BaseModel] | None) -> list[str]:
    return sorted(model.model_fields) if model is not None else []


def _section_model(loc: tuple) -> type[BaseModel] | None:
    """The pydantic model that owns the field at ``loc`` (for suggestions on misspelt keys)."""
    model: Any = Config
    for part in loc[:-1]:
        if part in _DATASETS:
            model = _DATASETS[part]
            continue
        field = model.model_fields.get(part) if model is not None else None
        annotation = field.annotation if field is not None else None
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return model


def _format_error(error: dict) -> str:
    loc = tuple(p for p in error["loc"] if p not in _DATASETS)
    path = ".".join(str(p) for p in loc) or "<config>"
    kind = error["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(_section_model(error["loc"]))
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"{path}: unknown key{hint} (allowed: {', '.join(allowed)})" if allowed else f"{path}: unknown key"
    if kind == "union_tag_invalid":
        return f"{path}.name: unknown name {error['ctx']['tag']!r}; allowed: {error['ctx']['expected_tags']}"
    if kind == "union_tag_not_found":
        return f"{path}.name: missing; it selects the kind of {path}"
    if kind == "missing":
        return f"{path}: required field is missing"
    if kind == "value_error":
        return str(error["ctx"]["error"])
    return f"{path}: {error['msg']}, got {error.get('input')!r}"


def validate(raw: dict) -> Config:
    """Validates a nested dict into a :class:`Config`, or raises :class:`ConfigError` listing every problem."""
    try:
        return Config.model_validate(raw)
    except pydantic.ValidationError as exc:
        lines = sorted({_format_error(e) for e in exc.errors()})
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines)) from None


def apply_override(raw: dict, override: str) -> dict:
    """Sets ``a.b.c=value`` in a nested dict; ``value`` is parsed as YAML (``1e-3``, ``true``, ``[1, 2]``)."""
    if "=" not in override:
        raise ConfigError(f"override {override!r} must look like dotted.key=value")
    path, _, text = override.partition("=")
    keys = path.strip().split(".")
    node = raw
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {override!r}: {key!r} is a value, not a section")
        node = child
    node[keys[-1]] = yaml.safe_load(text)
    return raw


def deep_merge(base: dict, changes: dict) -> dict:
    """``base`` with ``changes`` applied: nested mappings merge key by key, anything else is replaced."""
    merged = dict(base)
    for key, value in changes.items():
        merged[key] = deep_merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key),
                                                                                                 dict) else value
    return merged


def read_raw(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    """A YAML config as a dict, with ``extends: other.yaml`` (relative to this file) resolved: this file's keys
    are merged over the other's."""
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    if path.resolve() in seen:
        raise ConfigError(f"config file {str(path)!r} extends itself (through {[str(p) for p in seen]})")
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping at the top level")
    parent = raw.pop("extends", None)
    if parent is None:
        return raw
    if not isinstance(parent, str):
        raise ConfigError(f"{path}: extends must be the path of another config file, got {parent!r}")
    return deep_merge(read_raw(path.parent / parent, seen + (path.resolve(),)), raw)


def load_config(path: str | Path, overrides: list[str] = ()) -> Config:
    """Reads a YAML config (resolving ``extends``), applies ``dotted.key=value`` overrides, and validates it."""
    raw = read_raw(Path(path))
    for override in overrides:
        apply_override(raw, override)
    return validate(raw)


def to_yaml(config: Config) -> str:
    """The fully resolved config, defaults included, as YAML."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
