"""The server's extra time per round of Feddle and of the server-data baselines (Zhu et al., Table 6), on CPU.

Every setting runs the CPU-scale Fashion-MNIST federation (``configs/feddle/cpu_fashion_mnist*.yaml``: 500
clients, 10 a round, the small CNN, 5 local Adam steps of 32) with zero delay, so that each round has the same
10 arrivals and exactly one server step for every method; what differs is the server's work:

* ``fedbuff``: the mean of the 10 buffered updates (the reference);
* ``fedft``: then 20 Adam steps of 64 on the server's data;
* ``hfcl``: the server trains as one more client (5 steps of 32);
* ``feddf``: 10 (and 20) distillation steps of 64 against the ensemble of the 10 arrived models;
* ``feddle-id``: insert, normalise, 20 coefficient steps of 64 (Eq. 17);
* ``feddle-ood``: the same on MNIST with 20 surrogate-head steps first.

Times are medians over ``--repeats`` blocks of ``--rounds`` rounds after a compiled warm-up block, the
settings interleaved, no evaluation. ``extra`` is a setting's time per round minus FedBuff's: the server's
extra time. Memory: the loop state's bytes (Feddle's atlas; FedDF's stored trained models). Writes
``benchmarks/results/feddle_cost.json``.

Usage::

    python benchmarks/feddle_cost.py           # about 5 minutes on 2 cores
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
ID = REPO / "configs" / "feddle" / "cpu_fashion_mnist.yaml"
OOD = REPO / "configs" / "feddle" / "cpu_fashion_mnist_ood.yaml"
SETTINGS = {
    "fedbuff": (ID, ["algorithm={name: fedbuff}"]),
    "fedft": (ID, ["algorithm={name: fedft}"]),
    "hfcl": (ID, ["algorithm={name: hfcl}"]),
    "feddf-10": (ID, ["algorithm={name: feddf, steps: 10}"]),
    "feddf-20": (ID, ["algorithm={name: feddf, steps: 20}"]),
    "feddle-id": (ID, []),
    "feddle-ood": (OOD, []),
}


def tree_bytes(tree) -> int:
    """Bytes of every array in ``tree``."""
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def measure(rounds: int, repeats: int) -> dict:
    experiments, states, rows = {}, {}, {}
    for name, (config, overrides) in SETTINGS.items():
        experiment = build_experiment(load_config(config, [*overrides, "asynchrony={delay: zero}"]))
        state = experiment.initial_state()
        # compile, fill the atlas
        state, _ = experiment.run_rounds(state, experiment.inputs, num_rounds=rounds)
        jax.block_until_ready(state)
        experiments[name], states[name] = experiment, state
        rows[name] = {"state_bytes": tree_bytes(state), "seconds": []}
    for _ in range(repeats):
        for name, experiment in experiments.items():
            start = time.perf_counter()
            states[name], _ = experiment.run_rounds(states[name], experiment.inputs, num_rounds=rounds)
            jax.block_until_ready(states[name])
            rows[name]["seconds"].append((time.perf_counter() - start) / rounds)
    base = statistics.median(rows["fedbuff"]["seconds"])
    for row in rows.values():
        row["seconds_per_round"] = statistics.median(row["seconds"])
        row["time_vs_fedbuff"] = row["seconds_per_round"] / base
        row["extra_seconds"] = row["seconds_per_round"] - base
        row["state_vs_fedbuff"] = row["state_bytes"] / rows["fedbuff"]["state_bytes"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "feddle_cost.json"))
    args = parser.parse_args()
    rows = measure(args.rounds, args.repeats)
    print(f"{'setting':12s} {'s/round':>8s} {'x fedbuff':>9s} {'extra s':>8s} {'state MiB':>10s}")
    for name, r in rows.items():
        print(f"{name:12s} {r['seconds_per_round']:8.3f} {r['time_vs_fedbuff']:9.2f} "
              f"{r['extra_seconds']:8.3f} {r['state_bytes'] / 2**20:10.1f}")
    result = {"rounds": args.rounds, "repeats": args.repeats, "backend": jax.default_backend(),
              "machine": f"{platform.processor() or platform.machine()}, {jax.device_count()} device(s)",
              "settings": rows}
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
