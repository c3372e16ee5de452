"""DP-FedAvg's cost per round against plain FedAvg, in the same process.

The mechanism itself is one norm and one scale per client and one Gaussian draw per parameter on the server;
Poisson sampling adds the padding slots, which train and are masked out. Four programs on the federation of
``configs/privacy/synthetic_dp_fedavg.yaml`` (1,000 clients, 50 expected a round), each timed over blocks of
``--rounds`` rounds after a compiled warm-up, alternating, medians over ``--repeats`` blocks:

* ``fedavg``: plain FedAvg, 50 clients drawn without replacement, uniform weights;
* ``dp_fixed``: DP-FedAvg with the same cohort (fixed-size sampling, RDP);
* ``dp_poisson``: DP-FedAvg with Poisson sampling, the default slots (PLD);
* ``dp_adaptive``: as ``dp_poisson``, with adaptive clipping.

Writes ``benchmarks/results/privacy_cost_MODEL.json``.

Usage::

    python benchmarks/privacy_cost.py                 # about 2 minutes on 2 cores
    python benchmarks/privacy_cost.py --model mlp     # a 2-layer MLP instead of logistic regression
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import jax

from fedjax_lab.experiments import load_config
from fedjax_lab.experiments.build import build_experiment

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "privacy" / "synthetic_dp_fedavg.yaml"
VARIANTS = {
    "fedavg": ["privacy=null"],
    "dp_fixed": ["privacy.sampling=fixed", "privacy.accountant=rdp"],
    "dp_poisson": [],
    "dp_adaptive": ["privacy.adaptive_quantile=0.5"],
}


def measure(model: str, rounds: int, repeats: int) -> dict:
    """Seconds per round of each variant, alternating; the programs' cohorts (slots) beside them."""
    extra = ["model.name=mlp", "model.hidden=[200, 200]"] if model == "mlp" else []
    experiments, states = {}, {}
    for name, overrides in VARIANTS.items():
        experiment = build_experiment(load_config(CONFIG, [*extra, *overrides]))
        state = experiment.initial_state()
        state, _ = experiment.run_rounds(state, experiment.inputs, num_rounds=rounds)  # compile, warm up
        jax.block_until_ready(state)
        experiments[name], states[name] = experiment, state
    times = {name: [] for name in VARIANTS}
    for _ in range(repeats):
        for name, experiment in experiments.items():
            start = time.perf_counter()
            states[name], _ = experiment.run_rounds(states[name], experiment.inputs, num_rounds=rounds)
            jax.block_until_ready(states[name])
            times[name].append((time.perf_counter() - start) / rounds)
    base = statistics.median(times["fedavg"])
    return {name: {"slots": experiments[name].plan.cohort_size,
                   "chunk_size": experiments[name].plan.chunk_size,
                   "seconds_per_round": statistics.median(times[name]), "all": times[name],
                   "ratio_to_fedavg": statistics.median(times[name]) / base} for name in VARIANTS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("logistic_regression", "mlp"), default="logistic_regression")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    results = {"model": args.model, "rounds_per_block": args.rounds, "repeats": args.repeats,
               "machine": platform.processor() or platform.machine(), "backend": jax.default_backend(),
               "jax": jax.__version__, "variants": measure(args.model, args.rounds, args.repeats)}
    out = REPO / "benchmarks" / "results" / f"privacy_cost_{args.model}.json"
    out.write_text(json.dumps(results, indent=1) + "\n")
    for name, row in results["variants"].items():
        print(f"{name:<12} slots {row['slots']:>3}  {row['seconds_per_round'] * 1000:8.2f} ms/round  "
              f"x{row['ratio_to_fedavg']:.2f}")


if __name__ == "__main__":
    main()
