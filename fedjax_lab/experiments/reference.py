"""The field and method reference pages, generated from the config classes so that they state current facts:
``docs/configs.md`` (every section's fields, their defaults and what they do) and ``docs/methods.md`` (every
registered method, where it may appear, its paper and its own fields).
``fedjax-lab reference configs|methods`` prints them; a test checks that the committed pages are current.
"""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from fedjax_lab.experiments import config as schema
from fedjax_lab.methods import registry
from fedjax_lab.privacy import PrivacyConfig

SECTIONS: tuple[tuple[str, list[tuple[str, type[BaseModel]]]], ...] = (
    ("seed", []),
    ("dataset", [("name: synthetic", schema.SyntheticDataset),
                 ("name: gaussian_mixture", schema.GaussianMixtureDataset),
                 (f"name: {' | '.join(schema.IMAGE_DATASETS)}", schema.ImageDataset),
                 ("name: shakespeare", schema.ShakespeareDataset)]),
    ("dataset.partition", [("", schema.PartitionConfig)]),
    ("dataset.server_data", [("", schema.ServerDataConfig)]),
    ("model", [("", schema.ModelConfig)]),
    ("algorithm", [("", registry.AlgorithmFields)]),
    ("client", [("", schema.ClientConfig)]),
    ("client.schedule, algorithm.server_schedule", [("", registry.ScheduleConfig)]),
    ("rounds", [("", schema.RoundsConfig)]),
    ("asynchrony", [("", schema.AsynchronyConfig)]),
    ("eval", [("", schema.EvalConfig)]),
    ("checkpoint", [("", schema.CheckpointConfig)]),
    ("parallel", [("", schema.ParallelConfig)]),
    ("privacy", [("", PrivacyConfig)]),
)
NESTED = {"partition", "server_data", "schedule", "server_schedule", "plugins"}  # sections of their own above


def _type(annotation: Any) -> str:
    """A field's allowed values, briefly: ``a | b`` for literals, the type's name otherwise."""
    if typing.get_origin(annotation) is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(annotation))
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if args and typing.get_origin(annotation) in (typing.Union,
                                                  getattr(__import__("types"), "UnionType", None)):
        return " or ".join(_type(a) for a in args) + (" or null" if type(None) in typing.get_args(annotation)
                                                      else "")
    if typing.get_origin(annotation) is typing.Annotated:
        return _type(typing.get_args(annotation)[0])
    name = getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")
    return {"PositiveInt": "int > 0", "PositiveFloat": "float > 0"}.get(name, name)


def _default(field) -> str:
    if field.default_factory is schema._layout_from_environment:
        return "`measure` (`$FEDJAX_LAB_LAYOUT`)"
    if field.default_factory is not None:
        return f"`{field.default_factory()!r}`"
    if field.default is PydanticUndefined:
        return "required"
    value = field.default
    if isinstance(value, BaseModel):
        return "see below"
    return f"`{value!r}`" if not isinstance(value, str) else f"`{value}`"


def fields_table(model: type[BaseModel], skip: set[str] = frozenset()) -> list[str]:
    """A markdown table of ``model``'s fields: name, allowed values, default, description."""
    lines = ["| field | values | default | what it does |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        if name in skip or name in NESTED:
            continue
        description = (field.description or "").replace("|", "\\|").replace("\n", " ")
        lines.append(f"| `{name}` | {_type(field.annotation)} | {_default(field)} | {description} |")
    return lines


def config_reference() -> str:
    """``docs/configs.md``: every section of a config and its fields."""
    lines = ["# Config reference", "",
             ("Generated from the config classes by `fedjax-lab reference configs` (`fedjax_lab/experiments/"
              "reference.py`); a test keeps it current. A config is one YAML file; `extends: other.yaml` "
              "starts from another and overrides only the keys it names. On the command line, "
              "`dotted.key=value` overrides any field (the value is read as YAML), and a plug-in's field is "
              "addressed by its name: `algorithm.plugins.fedprox.mu=0.1`. Each method's own fields: "
              "[methods.md](methods.md)."), ""]
    for section, models in SECTIONS:
        lines += [f"## `{section}`", ""]
        if section == "seed":
            lines += [f"An integer >= 0, default `0`. {schema.Config.model_fields['seed'].description}.", ""]
            continue
        for kind, model in models:
            if kind:
                lines += [f"### `{kind}`", ""]
            doc = " ".join((model.__doc__ or "").strip().split("\n\n")[0].split())
            lines += [doc, "", *fields_table(model, skip={"name"} if kind else set()), ""]
    return "\n".join(lines)


def _where(spec: registry.MethodSpec) -> str:
    if spec.reference:
        return "reference run (`algorithm.name`)"
    return " and ".join(w for w, ok in (("`algorithm.name`", spec.base),
                                        ("`algorithm.plugins`", spec.plugin)) if ok)


def methods_reference() -> str:
    """``docs/methods.md``: every registered method, where it may appear, its paper and its own fields."""
    lines = ["# Methods", "",
             ("Generated from the method registry by `fedjax-lab reference methods` (each method's config is "
              "the `__init__.py` of its package under `fedjax_lab/methods/`); a test keeps it current. A "
              "base method is `algorithm.name`, and takes the server's fields of "
              "[configs.md](configs.md#algorithm) besides its own; a plug-in is an entry of "
              "`algorithm.plugins` and adds what its paper changes to any base: `algorithm: {name: scaffold, "
              "plugins: [{name: fedprox, mu: 0.01}]}` is SCAFFOLD + FedProx. How each baseline follows its "
              "paper or code: [baselines.md](baselines.md)."), "",
             "| method | where | what it is |", "|---|---|---|"]
    for name, spec in registry.REGISTRY.items():
        doc = " ".join((spec.config.__doc__ or "").strip().split("\n\n")[0].split()).replace("|", "\\|")
        lines.append(f"| [`{name}`](#{name}) | {_where(spec)} | {doc} |")
    for name, spec in registry.REGISTRY.items():
        own = registry.own_fields(spec.config)
        package = spec.config.__module__.replace(".", "/")
        lines += ["", f"## {name}", "", " ".join((spec.config.__doc__ or "").split()), "",
                  f"Its config and code: [`{package}/`](../{package}/).", ""]
        if set(own) - {"name"}:
            lines += fields_table(spec.config, skip={"name"} | (set(spec.config.model_fields) - set(own)))
        else:
            lines.append("No fields of its own.")
    return "\n".join(lines) + "\n"
