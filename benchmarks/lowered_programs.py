"""Hashes of the round's lowered program (StableHLO text) for a few configs, to compare two checkouts.

A change that leaves these hashes equal cannot change what runs, so it cannot slow a run down: a refactor's
before/after check that does not depend on a noisy timing. Run it with each checkout on ``PYTHONPATH``::

    cd /tmp && PYTHONPATH=/path/to/old/checkout python /path/to/old/checkout/benchmarks/lowered_programs.py
    cd /tmp && PYTHONPATH=/path/to/new/checkout python /path/to/new/checkout/benchmarks/lowered_programs.py

The CIFAR-10 configs read ``../shared/data`` (or ``FEDJAX_LAB_DATA``).
"""

from __future__ import annotations

import hashlib
import re

import jax

from fedjax_lab.experiments import validate
from fedjax_lab.experiments.build import build_experiment

CIFAR = {"name": "cifar10", "partition": {"name": "dirichlet", "num_clients": 10, "alpha": 0.5}}
ROUNDS = {"num_rounds": 2, "clients_per_round": 10}
CONFIGS = {
    "mlp_fedavg": {"dataset": {"name": "synthetic", "num_clients": 20},
                   "model": {"name": "mlp", "hidden": [32]}, "algorithm": {"name": "fedavg"},
                   "client": {"local_steps": 5, "batch_size": 10}, "rounds": ROUNDS},
    "cnn_fedavg": {"dataset": CIFAR, "model": {"name": "simple_cnn"}, "algorithm": {"name": "fedavg"},
                   "client": {"local_steps": 8, "batch_size": 64}, "rounds": ROUNDS},
    "cnn_scaffold_fedprox": {"dataset": CIFAR, "model": {"name": "simple_cnn"},
                             "algorithm": {"name": "scaffold", "plugins": [{"name": "fedprox"}]},
                             "client": {"local_steps": 8, "batch_size": 64}, "rounds": ROUNDS},
}


def program_hash(raw: dict) -> tuple[int, str]:
    """The length and SHA-256 prefix of one round's lowered program, source locations removed."""
    experiment = build_experiment(validate(raw))
    lowered = experiment.run_rounds.lower(jax.eval_shape(experiment.initial_state), experiment.inputs,
                                          num_rounds=1)
    text = re.sub(r"#loc\d*[^\n]*\n", "", re.sub(r"loc\([^)]*\)", "", lowered.as_text()))
    return len(text), hashlib.sha256(text.encode()).hexdigest()[:16]


def main() -> None:
    for name, raw in CONFIGS.items():
        length, digest = program_hash(raw)
        print(f"{name:<22} {length:>8} chars  {digest}")


if __name__ == "__main__":
    main()
