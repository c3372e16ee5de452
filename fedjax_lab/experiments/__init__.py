"""Experiments: configs, building a run from a config, the host loop, run directories, plots, the CLI.

The names below are imported on first use, so that ``fedjax_lab.experiments.config`` (and the CLI's config
check) loads without JAX.
"""

import importlib

_EXPORTS = {"Config": "config", "ConfigError": "config", "load_config": "config", "validate": "config",
            "Experiment": "build", "build_experiment": "build", "run_experiment": "runner"}

__all__ = ["Config", "ConfigError", "Experiment", "build_experiment", "load_config", "run_experiment",
           "validate"]


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"fedjax_lab.experiments.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'fedjax_lab.experiments' has no attribute {name!r}")
