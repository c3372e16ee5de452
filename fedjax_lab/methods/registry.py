"""Every method's config and builder, registered by name. Imports no JAX, so configs validate in milliseconds.

A method is registered once, here, with

* its config: a pydantic class holding only its own fields, with its paper's defaults;
* its builder: ``"module:function"``, imported only when a run is built. A *component* method's builder returns
  the :class:`~fedjax_lab.engine.components.Component` s it adds to the FedAvg round
  (``build(config, context) -> tuple[Component, ...]``); a *wrapper* plug-in's builder returns a function from
  one algorithm to another (``build(config, context) -> Callable[[Algorithm], Algorithm]``);
* where it may appear: as ``algorithm.name`` (a base method, which also takes the server optimiser's fields
  of :class:`AlgorithmFields`), in ``algorithm.plugins`` (added to a base), or both.

So ``algorithm: {name: scaffold, plugins: [{name: fedprox, mu: 0.01}, {name: fedwalk, tau: 1.0}]}`` is
SCAFFOLD + FedProx + FedWalk. ``docs/extending.md`` walks through adding a method.
"""

from __future__ import annotations

import dataclasses
import importlib
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, create_model, model_validator
from pydantic_core import PydanticCustomError

if typing.TYPE_CHECKING:  # for the annotations only: this module imports no JAX, so configs validate fast
    import jax
    import optax

    from fedjax_lab.data import FederatedDataset
    from fedjax_lab.engine.local_training import LocalSchedule
    from fedjax_lab.experiments.config import Config
    from fedjax_lab.models import Classifier


def _admits_bool(annotation: Any) -> bool:
    return annotation is bool or any(_admits_bool(arg) for arg in typing.get_args(annotation))


class Fields(BaseModel):
    """Config fields: unknown keys are errors, values are frozen, floats must be finite unless a field says
    otherwise, and a boolean is not taken for a number (YAML reads ``yes``, ``no``, ``on``, ``off`` as booleans)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, value in data.items():
                field = cls.model_fields.get(name)
                if isinstance(value, bool) and field is not None and not _admits_bool(field.annotation):
                    raise PydanticCustomError(
                        "bool_for_number", "{field}: expected a number or a name, got the boolean {value} (YAML "
                        "reads yes, no, on and off as booleans)", {"field": name, "value": str(value)})
        return data


class ScheduleConfig(Fields):
    """A learning rate's multiplier over rounds (``fedjax_lab/experiments/hyperparams.py``)."""

    name: Literal["constant", "step", "exponential", "cosine"] = Field("constant", description="the schedule")
    boundaries: tuple[PositiveInt, ...] = Field((), description="step: rounds from which the rate is multiplied by "
                                                                "factor once more")
    factor: PositiveFloat = Field(0.1, description="step: the multiplier at each boundary; exponential: the "
                                                   "multiplier after decay_rounds")
    decay_rounds: PositiveInt | None = Field(None, description="exponential, cosine: the decay's length "
                                                               "(default rounds.num_rounds)")
    final_fraction: float = Field(0.0, ge=0, le=1, description="cosine: the final multiplier")
    warmup_rounds: int = Field(0, ge=0, description="linear warm-up from 1/warmup_rounds to 1 first (any schedule)")


class AlgorithmFields(Fields):
    """The fields every base method takes: the server optimiser applied to the averaged delta, the weights of
    the average, and the plug-ins added to the method."""

    server_optimizer: Literal["sgd", "momentum", "momentum_fedcog", "adam", "yogi", "adagrad"] = Field(
        "sgd", description="the server's step on the averaged delta; momentum_fedcog: FedCOG's code variant of "
                           "FedAvgM (x - v / (1 + beta))")
    server_learning_rate: PositiveFloat = Field(1.0, description="the server optimiser's step size (1.0 with sgd: "
                                                                 "the model becomes the weighted mean)")
    server_momentum: float = Field(0.9, ge=0, lt=1, description="server_optimizer=momentum")
    beta1: float = Field(0.9, ge=0, lt=1, description="adam/yogi/adagrad")
    beta2: float = Field(0.99, ge=0, lt=1, description="adam/yogi")
    tau: PositiveFloat = Field(1e-3, description="adaptivity, adam/yogi/adagrad")
    weighting: Literal["num_examples", "uniform"] = Field("num_examples", description="the weights of the mean of "
                                                                                       "the clients' deltas")
    buffer_size: PositiveInt | None = Field(
        None, description="the server steps each time this many updates have arrived (FedBuff's K; runs the "
                          "asynchronous round); default once per round on that round's arrivals")
    server_schedule: ScheduleConfig = Field(ScheduleConfig(), description="server_learning_rate over rounds")
    plugins: tuple[Any, ...] = Field((), description="methods added to this one, each {name: ..., its fields}")


@dataclasses.dataclass(frozen=True)
class BuildContext:
    """What a builder receives besides its own config.

    Attributes:
      config: the whole experiment config.
      classifier: the model with its input pipeline and objective (``fedjax_lab.models.Classifier``).
      dataset: the federated dataset (``fedjax_lab.data.FederatedDataset``); ``dataset.server`` is the
        server's data, or ``None``.
      client_optimizer: the clients' optax optimiser.
      schedule: the clients' ``LocalSchedule``.
      key: the run's root key (a builder's randomness outside the rounds derives from it, never from a seed, so
        that runs vmapped over seeds differ).
      values: the config with this round's hyper-parameter values (arrays inside the compiled round); ``config``
        is the static one, for structure.
    """

    config: Config
    classifier: Classifier
    dataset: FederatedDataset
    client_optimizer: optax.GradientTransformation
    schedule: LocalSchedule
    key: jax.Array | None = None
    values: Config | None = None


@dataclasses.dataclass(frozen=True)
class MethodSpec:
    """A registered method (see the module docstring)."""

    name: str
    config: type[BaseModel]
    builder: str
    base: bool = True
    plugin: bool = False
    wrapper: bool = False
    needs_server_data: bool = False
    reference: bool = False

    def load_builder(self) -> Callable:
        """The builder function (imports its module, and with it JAX)."""
        module, _, function = self.builder.partition(":")
        return getattr(importlib.import_module(module), function)


REGISTRY: dict[str, MethodSpec] = {}


def register(builder: str, *, base: bool = True, plugin: bool = False, wrapper: bool = False,
             needs_server_data: bool = False, reference: bool = False) -> Callable[[type[BaseModel]], type[BaseModel]]:
    """A class decorator registering the method named by the config class's ``name`` literal.

    The decorated class is the method's config; its ``name: Literal['...']`` field is the method's name.

    Args:
      builder: ``"module:function"``, see the module docstring.
      base: may be ``algorithm.name`` (then ``config`` must subclass :class:`AlgorithmFields`).
      plugin: may be listed in ``algorithm.plugins`` (its fields there are those it declares itself).
      wrapper: the builder returns ``Algorithm -> Algorithm`` instead of components (plug-ins only).
      needs_server_data: a run needs ``dataset.server_data``.
      reference: a reference run (one client holding the pooled data, or only the server's data), not FL.
    """

    def decorate(config: type[BaseModel]) -> type[BaseModel]:
        name = config.model_fields["name"].default
        if name in REGISTRY:
            raise ValueError(f"method {name!r} is registered twice")
        if base and not issubclass(config, AlgorithmFields):
            raise TypeError(f"{config.__name__}: a base method's config must subclass AlgorithmFields")
        REGISTRY[name] = MethodSpec(name, config, builder, base=base, plugin=plugin, wrapper=wrapper,
                                    needs_server_data=needs_server_data, reference=reference)
        return config

    return decorate


def own_fields(config: type[BaseModel]) -> dict[str, Any]:
    """The fields a method declares itself (not the shared :class:`AlgorithmFields`)."""
    shared = AlgorithmFields.model_fields if issubclass(config, AlgorithmFields) else {}
    return {n: f for n, f in config.model_fields.items() if n not in shared or n == "name"}


def plugin_config(spec: MethodSpec) -> type[BaseModel]:
    """The config class of ``spec`` as an entry of ``algorithm.plugins``: only its own fields."""
    if not issubclass(spec.config, AlgorithmFields):
        return spec.config
    fields = {n: (f.annotation, f) for n, f in own_fields(spec.config).items()}
    plugin = create_model(f"{spec.config.__name__}Plugin", __base__=Fields, **fields)
    for name, value in vars(spec.config).items():  # the config's own methods (VHL's extra_outputs)
        if callable(value) and not name.startswith("_") and name not in spec.config.model_fields:
            setattr(plugin, name, value)
    return plugin


def method_name(name: str):
    """The ``name`` field of a method's config: ``Literal[name]`` with that default."""
    return Field(name, description="the method")


# ------------------------------------------------------------------------------------------ the FedAvg family
FEDAVG = "fedjax_lab.methods.fedavg:build"


@register(builder=FEDAVG)
class FedAvgConfig(AlgorithmFields):
    """FedAvg (McMahan et al. 2017): SGD at ``server_learning_rate`` on the averaged delta."""

    name: Literal["fedavg"] = method_name("fedavg")


def _family(name: str, rule: str, doc: str) -> type[AlgorithmFields]:
    config = create_model(f"{name.capitalize()}Config", __base__=AlgorithmFields, __doc__=doc,
                          name=(Literal[name], method_name(name)),
                          server_optimizer=(Literal["sgd", "momentum", "momentum_fedcog", "adam", "yogi", "adagrad"],
                                            Field(rule)))
    return register(FEDAVG)(config)


FedAvgMConfig = _family("fedavgm", "momentum", "FedAvgM: server momentum (Hsu et al. 2019).")
FedAdamConfig = _family("fedadam", "adam", "FedAdam (Reddi et al. 2021, Algorithm 2).")
FedYogiConfig = _family("fedyogi", "yogi", "FedYogi (Reddi et al. 2021, Algorithm 2).")
FedAdagradConfig = _family("fedadagrad", "adagrad", "FedAdagrad (Reddi et al. 2021, Algorithm 2).")


@register(builder=FEDAVG, reference=True)
class CentralizedConfig(AlgorithmFields):
    """Reference: FedAvg on one client holding the pooled training data."""

    name: Literal["centralized"] = method_name("centralized")


@register(builder=FEDAVG, reference=True)
class ServerOnlyConfig(AlgorithmFields):
    """Reference: FedAvg on one client holding only the server's data."""

    name: Literal["server_only"] = method_name("server_only")


# ------------------------------------------------------ asynchronous methods, Feddle and its server-data baselines
@register(builder="fedjax_lab.methods.fedbuff:build")
class FedBuffConfig(AlgorithmFields):
    """FedBuff (Nguyen et al. 2022): the server steps on the mean of every buffer_size arrivals."""

    name: Literal["fedbuff"] = method_name("fedbuff")
    buffer_size: PositiveInt | None = Field(10, description="K, arrivals per server step (Feddle's grid: 10, 20, 50)")
    weighting: Literal["num_examples", "uniform"] = "uniform"
    staleness_scaling: Literal["none", "sqrt"] = Field("none", description="sqrt: each update scaled by "
                                                                           "1/sqrt(1 + staleness)")


@register(builder="fedjax_lab.methods.fedasync:build")
class FedAsyncConfig(AlgorithmFields):
    """FedAsync (Xie et al. 2019): each arrival is mixed in, w <- (1 - a_t) w + a_t w_new, a_t = alpha s(tau)."""

    name: Literal["fedasync"] = method_name("fedasync")
    buffer_size: PositiveInt | None = Field(1, description="1: one server step per arrival (the paper)")
    alpha: float = Field(0.4, gt=0, le=1, description="mixing weight (Feddle's grid: 0.2, 0.4, 0.8)")
    staleness: Literal["constant", "polynomial", "hinge"] = Field("polynomial", description="s(tau)")
    a: float = Field(0.5, ge=0, description="polynomial: (1 + tau)^-a; hinge: 1 / (a (tau - b) + 1) "
                                            "(Feddle's grid: 0.1, 0.5, 0.9)")
    b: float = Field(4.0, ge=0, description="hinge: staleness up to b counts fully")
    rho: float = Field(0.0, ge=0, description="Alg. 1's client objective f(x) + rho/2 ||x - x_tau||^2, x_tau the "
                                              "model the client was sent (0: the plain local SGD Feddle's baselines "
                                              "run)")


@register(builder="fedjax_lab.methods.ca2fl:build")
class CA2FLConfig(AlgorithmFields):
    """CA2FL (Wang et al. 2024): FedBuff calibrated by every client's cached latest update."""

    name: Literal["ca2fl"] = method_name("ca2fl")
    buffer_size: PositiveInt | None = Field(10, description="arrivals per server step (Feddle's grid: 10, 20, 50)")
    weighting: Literal["num_examples", "uniform"] = "uniform"


@register(builder="fedjax_lab.methods.feddle:build", needs_server_data=True)
class FeddleConfig(AlgorithmFields):
    """Feddle (Zhu et al.): coefficients over an atlas of client updates, searched on the server's data."""

    name: Literal["feddle"] = method_name("feddle")
    atlas_size: PositiveInt = Field(20, description="M, anchors kept (the paper: twice the clients per round)")
    search_steps: int = Field(20, ge=0, description="T, optimiser steps on the coefficients a round (0: FedBuff)")
    search_learning_rate: PositiveFloat = Field(1e-3, description="Adam's rate on c (the paper's grid: 1e-5 to 1e-3)")
    search_batch_size: PositiveInt = Field(64, description="server examples per search step")
    regularization: float = Field(0.0, ge=0, description="lambda of the pull towards the fallback (Eq. 11; the "
                                                        "paper: 0 in-domain, 0.01 out-of-domain)")
    fallback_learning_rate: PositiveFloat = Field(1.0, description="eta_g of the FedBuff fallback")
    fallback_init: bool = Field(True, description="start the search at the fallback (false: at 0, the ablation)")
    normalize: bool = Field(True, description="rescale anchors to their median norm (Eq. 5)")
    eviction: Literal["importance", "fifo"] = Field("importance", description="which anchor a full atlas drops")
    head_steps: int = Field(20, ge=0, description="out-of-domain: Adam steps on the surrogate head a round (Eq. 9)")
    head_learning_rate: PositiveFloat = Field(1e-3, description="out-of-domain: the surrogate head's rate")
    probe_examples: int = Field(0, ge=0, description="diagnostic (Fig. 7): the cosine of the search's coefficient "
                                                     "gradient with that of the task's loss on this many test rows, "
                                                     "never searched on (0: off)")


@register(builder="fedjax_lab.methods.hfcl:build", needs_server_data=True)
class HFCLConfig(AlgorithmFields):
    """HFCL (Elbir et al. 2021; Feddle's baseline): the server trains as a client on its data and joins the mean."""

    name: Literal["hfcl"] = method_name("hfcl")


# --------------------------------------------------------------------------------------------- baselines
@register(builder="fedjax_lab.methods.fedprox:build", plugin=True)
class FedProxConfig(AlgorithmFields):
    """FedProx (Li et al. 2020): the proximal term ``mu/2 ||w - x_t||^2``."""

    name: Literal["fedprox"] = method_name("fedprox")
    mu: float = Field(0.01, ge=0, description="proximal weight (the paper tunes it in {0.001, 0.01, 0.1, 1})")


@register(builder="fedjax_lab.methods.moon:build", plugin=True)
class MoonConfig(AlgorithmFields):
    """MOON (Li, He and Song 2021): the model-contrastive term."""

    name: Literal["moon"] = method_name("moon")
    mu: float = Field(5.0, ge=0, description="contrastive weight (the paper: 5 on CIFAR-10)")
    temperature: PositiveFloat = Field(0.5, description="tau of the contrastive softmax (the paper: 0.5)")


@register(builder="fedjax_lab.methods.feddecorr:build", plugin=True)
class FedDecorrConfig(AlgorithmFields):
    """FedDecorr (Shi et al. 2023): the decorrelation penalty on the representation."""

    name: Literal["feddecorr"] = method_name("feddecorr")
    beta: float = Field(0.1, ge=0, description="decorrelation weight (the paper's form, Eq. 5)")


@register(builder="fedjax_lab.methods.fedsam:build", plugin=True)
class FedSamConfig(AlgorithmFields):
    """FedSAM (Qu et al. 2022): sharpness-aware local steps."""

    name: Literal["fedsam"] = method_name("fedsam")
    rho: float = Field(0.05, ge=0, description="perturbation radius")


@register(builder="fedjax_lab.methods.scaffold:build")
class ScaffoldConfig(AlgorithmFields):
    """SCAFFOLD (Karimireddy et al. 2020): control variates."""

    name: Literal["scaffold"] = method_name("scaffold")
    option: Literal["I", "II"] = Field("II", description="control update")
    control_average: Literal["all", "cohort"] = Field("all", description="divide control deltas by N or |S|")
    correction: Literal["after_step", "through_optimizer"] = Field(
        "after_step", description="apply -eta (c - c_k) after the optimiser step, or add c - c_k to the gradient "
                                  "before it (amplified by client momentum)")


@register(builder="fedjax_lab.methods.fednova:build")
class FedNovaConfig(AlgorithmFields):
    """FedNova (Wang et al. 2020): normalised averaging; ``a_k`` is read from the client optimiser."""

    name: Literal["fednova"] = method_name("fednova")


@register(builder="fedjax_lab.methods.feddyn:build")
class FedDynConfig(AlgorithmFields):
    """FedDyn (Acar et al. 2021): dynamic regularisation; uniform cohort mean, as in the paper."""

    name: Literal["feddyn"] = method_name("feddyn")
    alpha: float = Field(0.01, ge=0, description="regularisation weight")
    weighting: Literal["num_examples", "uniform"] = "uniform"


@register(builder="fedjax_lab.methods.fedexp:build")
class FedExPConfig(AlgorithmFields):
    """FedExP (Jhunjhunwala et al. 2023): the extrapolated server step; uniform mean, as in the paper."""

    name: Literal["fedexp"] = method_name("fedexp")
    epsilon: PositiveFloat = Field(1e-3, description="step-size denominator offset")
    weighting: Literal["num_examples", "uniform"] = "uniform"
    average_last_two: bool = Field(True, description="evaluate (w_t + w_{t-1})/2, the paper's remedy for the "
                                                     "period-2 oscillation; training continues from w_t")


@register(builder="fedjax_lab.methods.bherd:build", plugin=True)
class BHerdConfig(AlgorithmFields):
    """BHerd (Luo et al. 2024): clients send the herded sum of alpha of their local steps, rescaled by 1/alpha."""

    name: Literal["bherd"] = method_name("bherd")
    alpha: float = Field(0.5, gt=0, le=1, description="fraction of local steps kept, k = round(alpha tau) (the "
                                                      "paper: 0.5; 1 is FedAvg)")
    selection: Literal["herding", "topk_nearest"] = Field(
        "herding", description="herding: Alg. 2 (BHerd); topk_nearest: the ablation keeping the k steps nearest "
                               "the mean")
    rescale: Literal["nominal", "exact"] = Field("nominal", description="scale the kept sum by 1/alpha (Eq. 7) or "
                                                                        "by tau/k")
    diagnostics: bool = Field(True, description="record each client's selected steps and the Fig. 4d distance "
                                                "(array metrics in RUN_DIR/arrays)")


@register(builder="fedjax_lab.methods.grab:build", plugin=True)
class GraBConfig(AlgorithmFields):
    """GraB-FedAvg (BHerd's Alg. 4): online balancing of the local steps, no storage."""

    name: Literal["grab"] = method_name("grab")
    centering: Literal["partial_sum", "running_mean"] = Field(
        "partial_sum", description="the vector balanced is u - m: m Alg. 4's partial sum over tau_k (as written), "
                                   "or the running mean of the steps so far")


@register(builder="fedjax_lab.methods.fedft:build", plugin=True, needs_server_data=True)
class FedFTConfig(AlgorithmFields):
    """Fed+FT (Feddle's baseline): the aggregate is fine-tuned on the server's data after every server step."""

    name: Literal["fedft"] = method_name("fedft")
    steps: PositiveInt = Field(20, description="Adam steps on the server's data a round")
    learning_rate: PositiveFloat = Field(1e-3, description="the paper's grid: 1e-5, 1e-4, 1e-3")
    batch_size: PositiveInt = Field(64, description="server examples a step")


@register(builder="fedjax_lab.methods.feddf:build", plugin=True, needs_server_data=True)
class FedDFConfig(AlgorithmFields):
    """FedDF (Lin et al. 2020; Feddle's baseline): the arrived models' ensemble is distilled into the aggregate on
    the server's inputs (labels unused: in-domain or out-of-domain)."""

    name: Literal["feddf"] = method_name("feddf")
    buffer_size: PositiveInt | None = Field(10, description="arrivals per server step, the ensemble's size (as "
                                                            "FedBuff's)")
    steps: PositiveInt = Field(20, description="Adam steps of distillation a server step")
    learning_rate: PositiveFloat = Field(1e-3, description="the paper's grid: 1e-5, 1e-4, 1e-3")
    batch_size: PositiveInt = Field(64, description="server examples a step")
    temperature: PositiveFloat = Field(1.0, description="T of the softened softmax (FedDF: 1)")
    teacher: Literal["uniform", "weighted"] = Field(
        "uniform", description="the ensemble's logits: the plain mean over the arrived models (FedDF's code) or "
                               "weighted as the aggregation (by size)")


@register(builder="fedjax_lab.methods.fedcog:build", plugin=True)
class FedCOGConfig(AlgorithmFields):
    """FedCOG (Ye et al. 2024): clients generate inputs the global model agrees on and their previous model does
    not, and distil the global model on them while training (``fedcog`` alone is FedAvg + FedCOG)."""

    name: Literal["fedcog"] = method_name("fedcog")
    start_round: int = Field(0, ge=0, description="server steps before generation starts (the paper: 50)")
    num_samples: int = Field(256, ge=0, description="N, inputs generated per client a round (0: the base)")
    steps: int = Field(100, ge=0, description="S, Adam steps on the inputs (the paper: 100; its code: 500)")
    learning_rate: PositiveFloat = Field(0.01, description="the generation's Adam rate (betas 0.5, 0.9)")
    lambda_dis: float = Field(0.1, ge=0, description="weight of 1 - JS(global, previous local) (Eq. 1)")
    labels: Literal["complement", "uniform"] = Field("complement", description="target labels: shares of "
                                                                              "max(d) - d, or equal shares")
    kd_weighting: Literal["fixed", "size"] = Field("fixed", description="fixed: CE + lambda_kd KD (Sec. 4); size: "
                                                                        "(n CE + N_gen KD) / (n + N_gen) (App. A.2.2)")
    lambda_kd: float = Field(0.01, ge=0, description="weight of the distillation term under kd_weighting: fixed")
    temperature: PositiveFloat = Field(1.0, description="T of the distillation (its code: 1)")
    batch_size: PositiveInt = Field(64, description="generated inputs beside each real batch")


@register(builder="fedjax_lab.methods.vhl:build", plugin=True)
class VHLConfig(AlgorithmFields):
    """VHL (Tang et al. 2022; FedCOG's baseline): clients also fit a fixed virtual dataset of noise images shared by
    all, and align their classes' features with the virtual classes'."""

    name: Literal["vhl"] = method_name("vhl")
    alpha: float = Field(1.0, ge=0, description="weight of the virtual data's cross-entropy (its code's script: 1)")
    align_weight: float = Field(1.0, ge=0, description="weight of the supervised-contrastive alignment of natural "
                                                       "features with the (detached) virtual ones")
    virtual_weight: float = Field(0.1, ge=0, description="weight of the contrastive term among the virtual features")
    temperature: PositiveFloat = Field(0.07, description="SupCon's temperature")
    virtual_classes: PositiveInt | None = Field(None, description="V, classes of the virtual dataset (default: the "
                                                                  "dataset's number of classes)")
    per_class: PositiveInt = Field(200, description="virtual images per class (its code's generate.sh: 200)")
    batch_size: PositiveInt | None = Field(None, description="virtual images beside each real batch (default: "
                                                             "client.batch_size, as its code's equal 128s)")
    labels: Literal["extra", "shared"] = Field("extra", description="extra: virtual class c is label K + c of a "
                                                                    "head widened to K + V outputs (its code); "
                                                                    "shared: label c of the K-way head")

    def extra_outputs(self, num_classes: int) -> int:
        """The model's outputs beyond the dataset's classes: V under ``labels: extra``."""
        return (self.virtual_classes or num_classes) if self.labels == "extra" else 0


@register(builder="fedjax_lab.methods.fedreg:build", plugin=True)
class FedRegConfig(AlgorithmFields):
    """FedReg (Xu et al. 2022; FedCOG's baseline): slow local updates, and the displacement projected off the
    directions that raise the loss on the global model's pseudo data and on perturbed data."""

    name: Literal["fedreg"] = method_name("fedreg")
    gamma: float = Field(0.5, gt=0, le=1, description="slow update: the gradient is taken at gamma w + (1 - gamma) "
                                                      "x_t (1: at w)")
    p_iters: int = Field(10, ge=0, description="signed-gradient ascent steps that make the pseudo and perturbed data")
    ps_eta: float = Field(0.1, ge=0, description="step of the pseudo data (model-input units; its CIFAR-10 config)")
    pt_eta: float = Field(0.001, ge=0, description="step of the perturbed data (its CIFAR-10 config; FedCOG: 1e-3)")


@register(builder="fedjax_lab.methods.fedgen:build", plugin=True)
class FedGenConfig(AlgorithmFields):
    """FedGen (Zhu, Hong and Zhou 2021; FedCOG's baseline): the server learns a label-conditional generator of
    features from the clients' heads; clients regularise on its features."""

    name: Literal["fedgen"] = method_name("fedgen")
    alpha: float = Field(10.0, ge=0, description="weight of the teacher term on generated features (its code: 10), "
                                                 "decayed by 0.98 a round to at least 1e-4")
    beta: float = Field(10.0, ge=0, description="weight of the latent distillation term (its code, MNIST: 10), "
                                                "decayed likewise")
    noise_dim: PositiveInt = Field(32, description="the generator's noise (its code: 32 MNIST, 64 CIFAR)")
    hidden: PositiveInt = Field(256, description="the generator's hidden width (its code: 256 MNIST, 512 CIFAR)")
    generator_steps: int = Field(50, ge=0, description="the server's Adam steps on the generator a round")
    generator_learning_rate: PositiveFloat = Field(3e-4, description="its code: 3e-4 MNIST, 1e-4 otherwise; "
                                                                     "x0.98 a round")
    generator_batch_size: PositiveInt = Field(32, description="labels per generator step (its code: 32)")
    teacher_batch_size: PositiveInt = Field(32, description="generated features per client step (its code: 32)")
    diversity_weight: float = Field(1.0, ge=0, description="weight of the generator's diversity loss")


@register(builder="fedjax_lab.methods.fedimpro:build", plugin=True)
class FedImproConfig(AlgorithmFields):
    """FedImpro: clients share per-class Gaussian statistics of the features at a split of the model and train
    the upper part on features sampled from them too (``fedimpro`` alone is FedAvg + FedImpro)."""

    name: Literal["fedimpro"] = method_name("fedimpro")
    split: str | None = Field(None, description="the model stage after which features are shared (default: the "
                                                "middle stage; resnet18: layer2, the paper's 9th layer)")
    weight: float = Field(1.0, ge=0, description="weight of the sampled features' cross-entropy (0: the base)")
    weight_schedule: Literal["ramp", "constant"] = Field("ramp", description="ramp: weight * r / ramp_rounds, "
                                                                             "unclamped (its code); constant (the "
                                                                             "paper)")
    ramp_rounds: PositiveInt = Field(500, description="ramp: the server step where the weight reaches 'weight'")
    labels: Literal["balanced", "batch"] = Field("balanced", description="balanced: C (B // C + 1) features a step "
                                                                         "over all classes (its code); batch: the "
                                                                         "real batch's labels (Alg. 1)")
    source: Literal["local", "global"] = Field("local", description="sample from the client's running copy (its "
                                                                    "code) or the broadcast statistics")
    ema_examples: PositiveFloat = Field(5000.0, description="a class moves n_c / ema_examples of the way to its "
                                                            "batch statistics each step (its code's intent)")
    moving_average: Literal["class_count", "feature_size"] = Field(
        "class_count", description="each class's step to its batch statistics: min(1, n_c / ema_examples) (the "
                                   "intent), or its released code's min(1, D / ema_examples), D the feature size "
                                   "(1 at the default split: the last batch replaces the estimate)")
    spread_cap: PositiveFloat | None = Field(0.1, description="spreads are capped here (its code: 0.1; null: none)")
    init_spread: PositiveFloat = Field(0.1, description="the initial spreads (the initial means are U[0, 1))")
    aggregation: Literal["uniform", "pooled"] = Field("uniform", description="uniform mean of the cohort's "
                                                                             "statistics (Eq. 8), or pooled by "
                                                                             "class counts")
    noise_std: float = Field(0.0, ge=0, description="Gaussian noise on the uploaded statistics (Table 7)")


# ----------------------------------------------------------------------------------------------- plug-ins
@register(builder="fedjax_lab.methods.fedwalk:build", base=False, plugin=True, wrapper=True,
          needs_server_data=True)
class FedWalkConfig(Fields):
    """FedWalk (Zhai et al.): the server's leash task, gated by the log loss ratio; the leash set is
    ``dataset.server_data``."""

    name: Literal["fedwalk"] = method_name("fedwalk")
    mode: Literal["leash", "pretrain"] = Field("leash", description="pretrain: the ablation's leash training "
                                                                    "before FL, then no leash during FL")
    tau: float = Field(0.5, allow_inf_nan=True,
                       description="LLR threshold: the leash trains while log2(Lc/Ls) < tau (-.inf: never)")
    beta: float = Field(0.9, ge=0, lt=1, description="momentum of the client-loss EMA Lc")
    steps: PositiveInt = Field(1, description="T_s: leash SGD steps when the gate opens")
    batch_size: PositiveInt = Field(64, description="B_s: leash batch size")
    learning_rate: PositiveFloat | None = Field(None, description="gamma; default client.learning_rate")
    momentum: float = Field(0.0, ge=0, lt=1, description="leash SGD momentum (the paper: none)")
    client_loss: Literal["final", "train"] = Field(
        "final", description="L_k: the final local model's evaluation-mode loss on client_loss_examples of the "
                             "client's data, or the mean loss of its training steps")
    client_loss_examples: PositiveInt = Field(256, description="sample size of L_k (all, for smaller clients)")
    leash_loss_examples: PositiveInt = Field(512, description="sample size of Ls (all, for a smaller leash set)")
    pretrain_steps: PositiveInt | None = Field(None, description="leash steps before FL. mode pretrain: default "
                                                                 "rounds.num_rounds * steps; mode leash: default "
                                                                 "none, else FedWalk starts from the pre-trained "
                                                                 "model and leash head")

    @model_validator(mode="after")
    def _tau_is_a_number(self):
        if self.tau != self.tau:
            raise ValueError("algorithm.plugins: fedwalk.tau must be a number (.inf and -.inf are allowed), got nan")
        return self


# --------------------------------------------------------------------------------------------- the unions
def _union(configs: list[type[BaseModel]]):
    return Annotated[Union[tuple(configs)], Field(discriminator="name")]  # noqa: UP007 - a runtime tuple


def algorithm_union():
    """The pydantic type of ``algorithm``: one of the base methods' configs, chosen by ``name``, whose
    ``plugins`` are the plug-ins' configs chosen by ``name``."""
    plugin = _union([plugin_config(s) for s in REGISTRY.values() if s.plugin])
    bases = [create_model(s.config.__name__, __base__=s.config, __doc__=s.config.__doc__,
                          plugins=(tuple[plugin, ...], Field((), description=AlgorithmFields.model_fields[
                              "plugins"].description)))
             for s in REGISTRY.values() if s.base]
    return _union(bases)


def owners(field: str) -> list[str]:
    """The methods that declare a field of this name themselves."""
    return [s.name for s in REGISTRY.values() if field in own_fields(s.config) and field != "name"]
