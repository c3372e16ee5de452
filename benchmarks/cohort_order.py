"""Clients of unequal local work, laid out three ways, each in fresh processes, alternating: the cohort in its
sampled order or balanced over the devices and chunks (``rounds.cohort_order``), and chunk sizes.

* ``simple_cnn``: ``configs/cifar10_fedavg.yaml`` as NIID-Bench runs it (Dirichlet(0.5), 100 clients, 10 a
  round, one local epoch of batch 64: 3 to 16 steps a client), one client at a time on each device (the
  rules' layout), ways ``sampled`` and ``balanced``;
* ``synthetic``: the README's main job (``configs/synthetic_fedavg.yaml``: logistic regression, 10 clients a
  round, 20 local epochs of batch 10 over clients of 45 to 4,645 examples), ways ``chunk 5`` (the
  whole share of each of 2 devices, which a measured round of equal steps favours) and ``chunk 1`` (what the
  measurement chooses when it counts the clients' unequal steps).

With ``--baseline PATH`` each workload also runs as it is by default in another checkout of fedjax_lab (a git
worktree of an older commit, put first on ``PYTHONPATH``; the README's job in the layout that checkout's
measurement, or its cache, gives). Every process splits the cohort over the CPU's
cores (``parallel.devices: auto``), compiles, runs a warm-up block, then times ``--blocks`` blocks of the
config's ``eval.every`` rounds (the runner's blocks; the same rounds, so the same cohorts, in every way).
Writes ``benchmarks/results/cohort-order-<cpu>-<date>.json`` with the commit and the machine.

Usage::

    python benchmarks/cohort_order.py                        # about 5 minutes on 2 cores
    python benchmarks/cohort_order.py --baseline /tmp/old    # and an older checkout beside
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EPOCHS = ["client.local_steps=null", "client.local_epochs=1"]
WORKLOADS = {  # name: (config, overrides of every way, {way: overrides})
    "simple_cnn": ("configs/cifar10_fedavg.yaml", [*EPOCHS, "rounds.layout=rules"],
                   {"sampled": ["rounds.cohort_order=sampled"],
                    "balanced": ["rounds.cohort_order=balanced"]}),
    "synthetic": ("configs/synthetic_fedavg.yaml", [],
                  {"chunk 5": ["rounds.chunk_size=5", "rounds.cpu_matmul=ynnpack"],
                   "chunk 1": ["rounds.chunk_size=1", "rounds.cpu_matmul=ynnpack"]}),
}
BASELINE = "baseline (default layout)"


def worker(workload: str, way: str, blocks: int) -> dict:
    from fedjax_lab.engine.sharding import use_cpu_cores  # before JAX starts

    use_cpu_cores()
    import jax

    import fedjax_lab
    from fedjax_lab.experiments import build_experiment, load_config

    source, common, ways = WORKLOADS[workload]
    overrides = common + ways.get(way, [])  # (rounds.cohort_order is newer than a baseline)
    experiment = build_experiment(load_config(REPO / source, overrides))
    rounds = experiment.config.eval.every
    state = experiment.initial_state()
    start = time.perf_counter()
    state, _ = jax.block_until_ready(experiment.run_rounds(state, experiment.inputs, num_rounds=rounds))
    first = time.perf_counter() - start
    seconds = []
    for _ in range(blocks):
        start = time.perf_counter()
        state, _ = jax.block_until_ready(experiment.run_rounds(state, experiment.inputs, num_rounds=rounds))
        seconds.append((time.perf_counter() - start) / rounds)
    plan = experiment.plan
    return {"fedjax_lab": str(Path(fedjax_lab.__file__).parent), "cohort_devices": plan.num_devices,
            "chunk_size": plan.chunk_size, "balanced": bool(getattr(plan, "balances", False)),
            "first_block_seconds": first, "rounds_per_block": rounds, "seconds_per_round": seconds}


def run_way(workload: str, way: str, blocks: int, pythonpath: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run([sys.executable, __file__, "--worker", workload, way, "--blocks", str(blocks)],
                         cwd=REPO, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--reps", type=int, default=2, help="alternating rounds of processes, one a way")
    parser.add_argument("--blocks", type=int, default=3, help="timed blocks a process")
    parser.add_argument("--baseline", default=None, help="another checkout's root, run as it is by default")
    parser.add_argument("--out", default=None)
    parser.add_argument("--worker", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker, args.blocks)))
        return

    sys.path.insert(0, str(REPO / "benchmarks"))
    from pfl_yardstick import commit

    from fedjax_lab.engine.sharding import available_cores
    from fedjax_lab.experiments.runner import cpu_model

    result = {"cores": available_cores(), "cpu": cpu_model(), "commit": commit(),
              "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "workloads": {}}
    if args.baseline:
        base = subprocess.run(["git", "-C", args.baseline, "rev-parse", "--short", "HEAD"], check=False,
                              capture_output=True, text=True)
        result["baseline"] = {"path": args.baseline, "commit": base.stdout.strip() or None}
    for workload in args.workloads:
        ways = [*WORKLOADS[workload][2], *([BASELINE] if args.baseline else [])]
        rows = {way: [] for way in ways}
        for _ in range(args.reps):
            for way in ways:
                path = args.baseline if way == BASELINE else None
                rows[way].append(run_way(workload, way, args.blocks, path))
        medians = {way: statistics.median(s for r in runs for s in r["seconds_per_round"])
                   for way, runs in rows.items()}
        slowest = max(medians.values())
        speeds = {way: slowest / median for way, median in medians.items()}
        result["workloads"][workload] = {"ways": rows, "median_seconds_per_round": medians,
                                         "speed_against_slowest": speeds}
        print(f"{workload}: " + ", ".join(f"{w} {m:.3f} s/round" for w, m in medians.items()), flush=True)
    date = datetime.date.today().strftime("%Y%m%d")
    vendor = "intel" if "Intel" in result["cpu"] else "amd" if "AMD" in result["cpu"] else "cpu"
    out = Path(args.out or REPO / "benchmarks" / "results"
               / f"cohort-order-{vendor}-{result['cores']}core-{date}.json")
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
