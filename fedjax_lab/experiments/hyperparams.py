"""Hyper-parameters as data: the config's floats enter the compiled program as arrays, not as constants.

Every float field of ``client``, ``algorithm`` (plug-ins included) and ``privacy`` is a *data field*: the
learning rates, the server optimiser's coefficients, ``mu``, ``alpha``, ``rho``, FedWalk's ``tau``, the noise
multiplier and the like. A run carries their values as a flat dict ``{dotted.path: float32 array}``
(:func:`hyperparams`) in its ``RoundInputs``; inside the compiled round the algorithm is built from the config
with those values substituted (:func:`with_values`), after the learning-rate schedules have been applied for
the round (:func:`values_at`). So changing a value does not recompile, and many values run as one vmapped
program (``fedjax_lab/experiments/sweep.py``).

Structure is never data: which optimiser, whether it has a momentum buffer, the number of steps, the model.
Builders read values arithmetically and decide structure from the static config.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
from pydantic import BaseModel

from fedjax_lab.experiments.config import Config
from fedjax_lab.methods.registry import ScheduleConfig

DATA_SECTIONS = ("client", "algorithm", "privacy")


def _float_fields(model: BaseModel, prefix: str) -> dict[str, float]:
    return {f"{prefix}.{name}": value for name in type(model).model_fields
            if isinstance(value := getattr(model, name), float)}


def hyperparams(config: Config) -> dict[str, float]:
    """The config's data fields and their values, by dotted path (plug-ins as
    ``algorithm.plugins.NAME.field``)."""
    values: dict[str, float] = {}
    for section in DATA_SECTIONS:
        if getattr(config, section) is not None:
            values.update(_float_fields(getattr(config, section), section))
    for plugin in config.algorithm.plugins:
        values.update(_float_fields(plugin, f"algorithm.plugins.{plugin.name}"))
    return values


def as_arrays(values: dict[str, float]) -> dict[str, Any]:
    """The values as float32 arrays (what the compiled program receives)."""
    return {path: jnp.asarray(value, jnp.float32) for path, value in values.items()}


def schedule_multiplier(schedule: ScheduleConfig, round_index, num_rounds: int):
    """The factor a learning rate is multiplied by in round ``round_index`` (0-based), as a JAX scalar.

    ``constant``: 1. ``step``: ``factor`` to the power of the number of ``boundaries`` passed (FedWalk's drop
    at round 100 is ``boundaries: [100]``). ``exponential``: ``factor ** (round / decay_rounds)``. ``cosine``:
    from 1 to ``final_fraction`` over ``decay_rounds`` (default the run's rounds), after the warm-up. Any
    schedule starts with a linear warm-up from ``1 / warmup_rounds`` to 1 over ``warmup_rounds``.
    """
    r = jnp.asarray(round_index, jnp.float32)
    length = float(schedule.decay_rounds or num_rounds)
    if schedule.name == "step":
        passed = (sum((r >= b).astype(jnp.float32) for b in schedule.boundaries) if schedule.boundaries
                  else 0.0)
        factor = jnp.power(schedule.factor, passed)
    elif schedule.name == "exponential":
        factor = jnp.power(schedule.factor, r / length)
    elif schedule.name == "cosine":
        progress = jnp.clip((r - schedule.warmup_rounds) / max(length - schedule.warmup_rounds, 1.0),
                            0.0, 1.0)
        factor = (schedule.final_fraction
                  + (1 - schedule.final_fraction) * 0.5 * (1 + jnp.cos(math.pi * progress)))
    else:
        factor = jnp.ones((), jnp.float32)
    if schedule.warmup_rounds:
        factor = factor * jnp.minimum((r + 1.0) / schedule.warmup_rounds, 1.0)
    return factor


SCHEDULED = {"client.learning_rate": ("client", "schedule"),
             "algorithm.server_learning_rate": ("algorithm", "server_schedule")}
"""The learning rates that follow a schedule, and where their schedule is in the config."""


def values_at(config: Config, values: dict[str, Any], round_index) -> dict[str, Any]:
    """``values`` for round ``round_index``: the scheduled learning rates multiplied by their schedule."""
    out = dict(values)
    for path, (section, field) in SCHEDULED.items():
        schedule = getattr(getattr(config, section), field)
        if path in out and (schedule.name != "constant" or schedule.warmup_rounds):
            out[path] = out[path] * schedule_multiplier(schedule, round_index, config.rounds.num_rounds)
    return out


def _replace(model: BaseModel, updates: dict[tuple[str, ...], Any]) -> BaseModel:
    """``model`` with the fields at the given paths replaced, without validation (values may be tracers)."""
    direct = {path[0]: value for path, value in updates.items() if len(path) == 1}
    nested: dict[str, dict] = {}
    for path, value in updates.items():
        if len(path) > 1:
            nested.setdefault(path[0], {})[path[1:]] = value
    for name, inner in nested.items():
        child = getattr(model, name)
        if name == "plugins":
            by_name = {}
            for path, value in inner.items():
                by_name.setdefault(path[0], {})[path[1:]] = value
            direct[name] = tuple(_replace(p, by_name[p.name]) if p.name in by_name else p for p in child)
        else:
            direct[name] = _replace(child, inner)
    return model.model_copy(update=direct)


def with_values(config: Config, values: dict[str, Any]) -> Config:
    """``config`` with the data fields at ``values``' paths set to those values (numbers or JAX arrays)."""
    return _replace(config, {tuple(path.split(".")): value for path, value in values.items()})


def set_values(config: Config, values: dict[str, float]) -> Config:
    """``config`` with data fields set to plain numbers, validated again (a sweep member's config)."""
    return type(config).model_validate(with_values(config, values).model_dump())
