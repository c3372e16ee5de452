"""Experiments: configs, building a run from a config, the host loop, run directories, plots, the CLI."""

from fedjax_lab.experiments.build import Experiment, build_experiment
from fedjax_lab.experiments.config import Config, ConfigError, load_config, validate
from fedjax_lab.experiments.runner import run_experiment

__all__ = ["Config", "ConfigError", "Experiment", "build_experiment", "load_config", "run_experiment", "validate"]
