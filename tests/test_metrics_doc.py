"""docs/metrics.md lists every metric that runs of the main kinds log (synchronous and asynchronous rounds,
the evaluation options, several methods)."""

import re
from pathlib import Path

import pytest

from fedjax_lab.experiments import load_config, run_experiment
from fedjax_lab.experiments.run_directory import read_metrics

DOC = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
CONFIG = Path(__file__).resolve().parents[1] / "configs" / "synthetic_fedavg.yaml"
TINY = ["rounds.num_rounds=2", "eval.every=1", "client.local_epochs=1", "dataset.num_clients=6",
        "rounds.clients_per_round=3"]
KINDS = {
    # the synchronous round with a method's own metrics and the training-set evaluation, the asynchronous
    # round with another
    "bherd": ["algorithm={name: bherd, alpha: 0.5}", "eval.train=true"],
    "fedasync": ["algorithm.name=fedasync", "algorithm.buffer_size=2",
                 "asynchrony={delay: half_normal, sigma: 1}"],
    "privacy": ["algorithm.weighting=uniform",
                "privacy={noise_multiplier: 1.0, adaptive_quantile: 0.5, count_noise: 1.0, accountant: rdp}"],
}


@pytest.mark.parametrize("kind", KINDS)
def test_every_logged_metric_is_documented(kind, tmp_path):
    run_experiment(load_config(CONFIG, [*TINY, *KINDS[kind]]), tmp_path / kind, progress=False)
    logged = {key for row in read_metrics(tmp_path / kind) for key in row if key != "round"}
    documented = set(re.findall(r"`([a-z][a-z0-9_]*)`", DOC))
    assert logged and logged <= documented, f"not in docs/metrics.md: {sorted(logged - documented)}"
