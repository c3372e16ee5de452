"""The mechanism that registers methods by name: their configs' common fields, ``register``, and the pydantic
type of ``algorithm``. Imports no JAX, so configs validate in milliseconds.

Each method is a package, ``fedjax_lab/methods/<name>/``:

* ``__init__.py``: its config, a pydantic class holding only its own fields with its paper's defaults,
  decorated with :func:`register`. It imports no JAX;
* ``method.py``: what its paper changes, with the equations, and its builder ``build(config, context)``,
  imported only when a run is built. A *component* method's builder returns the
  :class:`~fedjax_lab.engine.components.Component` s it adds to the round (``-> tuple[Component, ...]``); a
  *wrapper* plug-in's builder returns a function from one algorithm to another
  (``-> Callable[[Algorithm], Algorithm]``).

``register`` also says where a method may appear: as ``algorithm.name`` (a base method, which also takes the
server optimiser's fields of :class:`AlgorithmFields`), in ``algorithm.plugins`` (added to a base), or both.
So ``algorithm: {name: scaffold, plugins: [{name: fedprox, mu: 0.01}, {name: fedwalk, tau: 1.0}]}`` is
SCAFFOLD + FedProx + FedWalk. Every package under ``methods/`` is found and registered when this module is
imported; ``docs/extending.md`` walks through adding one.
"""

from __future__ import annotations

import dataclasses
import importlib
import pathlib
import pkgutil
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


class ConfigError(ValueError):
    """A configuration is invalid; the message lists every problem, one per line, by dotted field name.

    Defined here, with no JAX, so that a method's builder can refuse a config;
    ``fedjax_lab.experiments.ConfigError`` is this class."""


def _admits_bool(annotation: Any) -> bool:
    return annotation is bool or any(_admits_bool(arg) for arg in typing.get_args(annotation))


class Fields(BaseModel):
    """Config fields: unknown keys are errors, values are frozen, floats must be finite unless a field says
    otherwise, and a boolean is not taken for a number (YAML reads ``yes``, ``no``, ``on``, ``off`` as
    booleans)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, value in data.items():
                field = cls.model_fields.get(name)
                if isinstance(value, bool) and field is not None and not _admits_bool(field.annotation):
                    raise PydanticCustomError(
                        "bool_for_number", "{field}: expected a number or a name, got the boolean {value} "
                        "(YAML reads yes, no, on and off as booleans)", {"field": name, "value": str(value)})
        return data


class ScheduleConfig(Fields):
    """A learning rate's multiplier over rounds (``fedjax_lab/experiments/hyperparams.py``)."""

    name: Literal["constant", "step", "exponential", "cosine"] = Field("constant", description="the schedule")
    boundaries: tuple[PositiveInt, ...] = Field((), description="step: rounds from which the rate is "
                                                                "multiplied by factor once more")
    factor: PositiveFloat = Field(0.1, description="step: the multiplier at each boundary; exponential: the "
                                                   "multiplier after decay_rounds")
    decay_rounds: PositiveInt | None = Field(None, description="exponential, cosine: the decay's length "
                                                               "(default rounds.num_rounds)")
    final_fraction: float = Field(0.0, ge=0, le=1, description="cosine: the final multiplier")
    warmup_rounds: int = Field(
        0, ge=0, description="linear warm-up from 1/warmup_rounds to 1 first (any schedule)")


class AlgorithmFields(Fields):
    """The fields every base method takes: the server optimiser applied to the averaged delta, the weights of
    the average, and the plug-ins added to the method."""

    server_optimizer: Literal["sgd", "momentum", "momentum_fedcog", "adam", "yogi", "adagrad"] = Field(
        "sgd", description="the server's step on the averaged delta; momentum_fedcog: FedCOG's code variant "
                           "of FedAvgM (x - v / (1 + beta))")
    server_learning_rate: PositiveFloat = Field(1.0, description="the server optimiser's step size (1.0 with "
                                                                 "sgd: the model becomes the weighted mean)")
    server_momentum: float = Field(0.9, ge=0, lt=1, description="server_optimizer=momentum")
    beta1: float = Field(0.9, ge=0, lt=1, description="adam/yogi/adagrad")
    beta2: float = Field(0.99, ge=0, lt=1, description="adam/yogi")
    tau: PositiveFloat = Field(1e-3, description="adaptivity, adam/yogi/adagrad")
    weighting: Literal["num_examples", "uniform"] = Field(
        "num_examples", description="the weights of the mean of the clients' deltas")
    buffer_size: PositiveInt | None = Field(
        None, description="the server steps each time this many updates have arrived (FedBuff's K; runs the "
                          "asynchronous round); default once per round on that round's arrivals")
    server_schedule: ScheduleConfig = Field(ScheduleConfig(), description="server_learning_rate over rounds")
    plugins: tuple[Any, ...] = Field(
        (), description="methods added to this one, each {name: ..., its fields}")


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
      key: the run's root key (a builder's randomness outside the rounds derives from it, never from a seed,
        so that runs vmapped over seeds differ).
      values: the config with this round's hyper-parameter values (arrays inside the compiled round);
        ``config`` is the static one, for structure.
      clients_at_once: how many clients a device trains at once (the cohort loop's chunk, else its share of
        the cohort), for a builder that sizes per-client memory; ``None`` when not known.
    """

    config: Config
    classifier: Classifier
    dataset: FederatedDataset
    client_optimizer: optax.GradientTransformation
    schedule: LocalSchedule
    key: jax.Array | None = None
    values: Config | None = None
    clients_at_once: int | None = None


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
_ORDER: dict[str, int] = {}  # the order of registration


def _place(spec: MethodSpec) -> tuple:
    """The registry's order, whatever the order of import: FedAvg's package first, then the packages by name,
    each in the order it registers its methods (the reference pages and error messages list methods in this
    order)."""
    package = spec.config.__module__
    return package != f"{__package__}.fedavg", package, _ORDER[spec.name]


def register(builder: str | None = None, *, base: bool = True, plugin: bool = False, wrapper: bool = False,
             needs_server_data: bool = False,
             reference: bool = False) -> Callable[[type[BaseModel]], type[BaseModel]]:
    """A class decorator registering the method named by the config class's ``name`` literal.

    The decorated class is the method's config; its ``name: Literal['...']`` field is the method's name.

    Args:
      builder: ``"module:function"``, see the module docstring; default: ``build`` in the ``method`` module of
        the config's package (``fedjax_lab.methods.fedcog.method:build`` for a config in ``methods/fedcog``).
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
        REGISTRY[name] = MethodSpec(name, config, builder or f"{config.__module__}.method:build", base=base,
                                    plugin=plugin, wrapper=wrapper, needs_server_data=needs_server_data,
                                    reference=reference)
        _ORDER[name] = len(_ORDER)
        ordered = sorted(REGISTRY.values(), key=_place)
        REGISTRY.clear()
        REGISTRY.update((spec.name, spec) for spec in ordered)
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


def lazy_method(package: str) -> Callable[[str], Any]:
    """A method package's module ``__getattr__`` (PEP 562): a name the package's ``__init__`` (its config)
    lacks is looked up in its ``method`` module, which is imported, and JAX with it, on first use. So
    ``from fedjax_lab.methods.fedcog import generate`` works, while importing the package for its config stays
    light. Names starting with ``_`` are not forwarded. A test that patches a method's function patches it in
    ``method`` (``fedjax_lab.methods.fedcog.method.generate``), where the method's code looks it up."""

    def __getattr__(name: str) -> Any:
        if name.startswith("_"):  # private and dunder names: a probe (hasattr, copy, inspect) imports no JAX
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        method = importlib.import_module(f"{package}.method")
        return method if name == "method" else getattr(method, name)

    return __getattr__


def _register_packages() -> None:
    """Imports every method package under ``fedjax_lab/methods/`` (a folder with an ``__init__.py``, which
    holds the method's config and registers it; its code is the folder's ``method.py``). Imports no JAX."""
    for module in pkgutil.iter_modules([str(pathlib.Path(__file__).parent)]):
        if module.ispkg:
            importlib.import_module(f"{__package__}.{module.name}")


_register_packages()
