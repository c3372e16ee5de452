"""BHerd's cost per round against FedAvg, in the same process:
time per round and the compiled program's memory.

BHerd trains exactly as FedAvg does and adds, per client, the stacked steps (``tau x |params|`` floats), their
Gram matrix (``O(tau^2 |params|)``) and the greedy selection (``O(tau^2)``). This measures what that costs on
the paper's two models, with the federation of ``configs/bherd/``: 5 clients, one epoch of fixed-order
batches.

* SVM on MNIST even/odd, paper scale: 60,000 rows, B = 100, tau = 120, |params| = 784.
* CNN on MNIST, tau = 120 as the paper but on 6,000 rows with B = 10 (the full 60,000 rows take about a minute
  a round on 2 CPU cores), |params| = 430,698.

Times are medians over ``--repeats`` blocks of ``--rounds`` rounds after a compiled warm-up, FedAvg and BHerd
alternating, with no evaluation. Memory is XLA's compiled memory analysis of one round (temporaries and
outputs; arguments such as the dataset are shared by both). Writes ``benchmarks/results/bherd_cost.json``.

Usage::

    python benchmarks/bherd_cost.py                  # about 5 minutes on 2 cores
    python benchmarks/bherd_cost.py --models svm --rounds 10
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
SETTINGS = {
    "svm": ("svm_mnist.yaml", []),
    "cnn": ("cnn_mnist.yaml", ["dataset.subset=6000", "client.batch_size=10"]),
}
METHODS = {"fedavg": "algorithm={name: fedavg}", "bherd": "algorithm={name: bherd, alpha: 0.5}"}


def compiled_bytes(experiment, state) -> dict[str, int]:
    """XLA's memory analysis of one compiled round (bytes)."""
    compiled = experiment.run_rounds.lower(state, experiment.inputs, num_rounds=1).compile()
    analysis = compiled.memory_analysis()
    return {"temp": int(analysis.temp_size_in_bytes), "output": int(analysis.output_size_in_bytes)}


def measure(model: str, rounds: int, repeats: int, chunk: int | None) -> dict:
    config_file, extra = SETTINGS[model]
    experiments, states = {}, {}
    for method, algorithm in METHODS.items():
        overrides = [algorithm, "client.batch_order=fixed", *extra]
        if chunk:
            overrides.append(f"rounds.chunk_size={chunk}")
        experiment = build_experiment(load_config(REPO / "configs" / "bherd" / config_file, overrides))
        state = experiment.initial_state()
        state, _ = experiment.run_rounds(state, experiment.inputs, num_rounds=rounds)  # compile and warm up
        jax.block_until_ready(state)
        experiments[method], states[method] = experiment, state
    times = {m: [] for m in METHODS}
    for _ in range(repeats):
        for method, experiment in experiments.items():
            start = time.perf_counter()
            states[method], _ = experiment.run_rounds(states[method], experiment.inputs, num_rounds=rounds)
            jax.block_until_ready(states[method])
            times[method].append((time.perf_counter() - start) / rounds)
    out = {"model": model, "chunk_size": experiments["bherd"].plan.chunk_size,
           "max_steps": (int(experiments["bherd"].dataset.client_train_counts.max())
                         // experiments["bherd"].config.client.batch_size),
           "num_params": experiments["bherd"].classifier.num_params(
               experiments["bherd"].initial_state().server_state.params)}
    for method, experiment in experiments.items():
        out[method] = {"seconds_per_round": statistics.median(times[method]), "all": times[method],
                       "memory": compiled_bytes(experiment, states[method])}
    out["time_ratio"] = out["bherd"]["seconds_per_round"] / out["fedavg"]["seconds_per_round"]
    out["temp_memory_ratio"] = out["bherd"]["memory"]["temp"] / max(out["fedavg"]["memory"]["temp"], 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--chunk", type=int, default=None, help="rounds.chunk_size (default: the runner's)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "bherd_cost.json")
    args = parser.parse_args()
    results = {"device": str(jax.devices()[0]), "backend": jax.default_backend(),
               "processor": platform.processor(), "jax": jax.__version__, "models": []}
    for model in args.models:
        r = measure(model, args.rounds, args.repeats, args.chunk)
        results["models"].append(r)
        print(f"{model}: tau {r['max_steps']}, |params| {r['num_params']:,}, chunk {r['chunk_size']}: "
              f"FedAvg {r['fedavg']['seconds_per_round'] * 1e3:.1f} ms/round, BHerd "
              f"{r['bherd']['seconds_per_round'] * 1e3:.1f} ms/round (x{r['time_ratio']:.2f}); compiled "
              f"temporaries {r['fedavg']['memory']['temp'] / 2**20:.1f} MiB vs "
              f"{r['bherd']['memory']['temp'] / 2**20:.1f} MiB (x{r['temp_memory_ratio']:.1f})", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
