"""The asynchronous round's cost against the synchronous one, in the same process: time per round and memory.

The asynchronous round trains the same clients as the synchronous one and adds the in-flight store (``P``
messages), the masked server step over it (or the buffer's in-order drain) and, for CA2FL, a cache of ``N``
models. This measures what that costs on the CPU-scale Feddle federation
(``configs/async/cpu_fashion_mnist.yaml``: Fashion-MNIST, 500 clients, 10 a round, the small CNN, 10 local
Adam steps of 32) for:

* ``sync``: the synchronous FedAvg round;
* ``async-zero``: the asynchronous round with zero delay (the same arithmetic; the store and masks only);
* ``fedavg-N5`` / ``fedavg-N20``: FedAvg over arrivals with half-normal delays (store of 210 and 500 slots);
* ``fedbuff-N20`` / ``fedasync-N20`` / ``ca2fl-N20``: the buffered server steps.

Times are medians over ``--repeats`` blocks of ``--rounds`` rounds after a compiled warm-up block (which also
fills the store), the settings interleaved, no evaluation. Memory: the loop state's bytes (what a run carries
and checkpoints) and XLA's compiled memory analysis of one round (temporaries). Writes
``benchmarks/results/async_cost.json``.

Usage::

    python benchmarks/async_cost.py                  # about 6 minutes on 2 cores
    python benchmarks/async_cost.py --model mlp      # the same federation with a 2-layer MLP (dense)
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
    "sync": ["algorithm={name: fedavg}", "asynchrony=null"],
    "async-zero": ["algorithm={name: fedavg}", "asynchrony={delay: zero}"],
    "fedavg-N5": ["algorithm={name: fedavg}", "asynchrony.sigma=5"],
    "fedavg-N20": ["algorithm={name: fedavg}", "asynchrony.sigma=20"],
    "fedbuff-N20": ["algorithm={name: fedbuff}", "asynchrony.sigma=20"],
    "fedasync-N20": ["algorithm={name: fedasync}", "asynchrony.sigma=20"],
    "ca2fl-N20": ["algorithm={name: ca2fl}", "asynchrony.sigma=20"],
}


def tree_bytes(tree) -> int:
    """Bytes of every array in ``tree``."""
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def compiled_temp_bytes(experiment, state) -> int:
    """XLA's temporaries for one compiled round (bytes)."""
    compiled = experiment.run_rounds.lower(state, experiment.inputs, num_rounds=1).compile()
    return int(compiled.memory_analysis().temp_size_in_bytes)


def measure(model: str, rounds: int, repeats: int) -> dict:
    experiments, states, rows = {}, {}, {}
    for name, overrides in SETTINGS.items():
        extra = [] if model == "cnn" else ["model={name: mlp, hidden: [200, 200]}"]
        experiment = build_experiment(load_config(REPO / "configs" / "async" / "cpu_fashion_mnist.yaml",
                                                  [*overrides, *extra]))
        state = experiment.initial_state()
        # compile, fill the store
        state, _ = experiment.run_rounds(state, experiment.inputs, num_rounds=rounds)
        jax.block_until_ready(state)
        experiments[name], states[name] = experiment, state
        a = state.asynchrony
        rows[name] = {"state_bytes": tree_bytes(state), "temp_bytes": compiled_temp_bytes(experiment, state),
                      "store_slots": 0 if a is None else int(a.in_flight.occupied.shape[0]),
                      "store_bytes": 0 if a is None else tree_bytes(a), "seconds": []}
    for _ in range(repeats):
        for name, experiment in experiments.items():
            start = time.perf_counter()
            states[name], _ = experiment.run_rounds(states[name], experiment.inputs, num_rounds=rounds)
            jax.block_until_ready(states[name])
            rows[name]["seconds"].append((time.perf_counter() - start) / rounds)
    base = statistics.median(rows["sync"]["seconds"])
    for row in rows.values():
        row["seconds_per_round"] = statistics.median(row["seconds"])
        row["time_vs_sync"] = row["seconds_per_round"] / base
        row["state_vs_sync"] = row["state_bytes"] / rows["sync"]["state_bytes"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("cnn", "mlp"), default="cnn")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "async_cost.json"))
    args = parser.parse_args()
    rows = measure(args.model, args.rounds, args.repeats)
    print(f"{'setting':14s} {'s/round':>8s} {'x sync':>7s} {'slots':>6s} {'store MiB':>10s} "
          f"{'state MiB':>10s} {'temp MiB':>9s}")
    for name, r in rows.items():
        print(f"{name:14s} {r['seconds_per_round']:8.3f} {r['time_vs_sync']:7.2f} {r['store_slots']:6d} "
              f"{r['store_bytes'] / 2**20:10.1f} {r['state_bytes'] / 2**20:10.1f} "
              f"{r['temp_bytes'] / 2**20:9.1f}")
    result = {"model": args.model, "rounds": args.rounds, "repeats": args.repeats,
              "backend": jax.default_backend(),
              "machine": f"{platform.processor() or platform.machine()}, {jax.device_count()} device(s)",
              "settings": rows}
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(path.read_text()) if path.exists() else {}
    previous[args.model] = result
    path.write_text(json.dumps(previous, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
