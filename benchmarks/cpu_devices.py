"""The cohort split over a CPU's cores (``parallel.devices: auto``, one CPU device per core) against one CPU
device, on three workloads, each way in fresh processes, alternating.

* ``mlp``: the MNIST MLP (784-200-200-10), 1000 IID clients, cohort 100, 5 local steps of 10
  (``scale_memory.py``'s ``devices`` workload);
* ``simple_cnn``: ``configs/cifar10_fedavg.yaml`` as NIID-Bench runs it (Dirichlet(0.5), 100 clients, 10 a
  round, one local epoch of batch 64);
* ``pfl_cnn``: ``configs/pfl_cifar10.yaml`` (pfl-research's benchmark: cohort 50, one epoch of batch 10).

The layout is the rules' for both ways (``rounds.layout: rules``), so that only the split differs. A process
compiles, runs a warm-up block, then times ``--blocks`` blocks of ``--rounds`` rounds (the same rounds in both
ways: the same cohorts); its seconds a round is their median. Writes
``benchmarks/results/cpu-devices-<cpu>-<date>.json`` with the commit and the machine.

Usage::

    python benchmarks/cpu_devices.py                      # about 8 minutes on 2 cores
    python benchmarks/cpu_devices.py --workloads mlp --reps 3
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
MLP = {"seed": 0, "dataset": {"name": "mnist", "partition": {"name": "iid", "num_clients": 1000}},
       "model": {"name": "mlp", "hidden": [200, 200]}, "algorithm": {"name": "fedavg"},
       "client": {"optimizer": "sgd", "learning_rate": 0.05, "batch_size": 10, "local_steps": 5},
       "rounds": {"num_rounds": 100, "clients_per_round": 100}, "eval": {"every": 100, "per_client": False}}
WORKLOADS = {
    "mlp": (MLP, [], 5),
    "simple_cnn": ("configs/cifar10_fedavg.yaml", ["client.local_steps=null", "client.local_epochs=1"], 4),
    "pfl_cnn": ("configs/pfl_cifar10.yaml", [], 2),
}


def worker(workload: str, blocks: int) -> dict:
    from fedjax_lab.engine.sharding import use_cpu_cores  # before JAX starts: the way's device count

    use_cpu_cores()
    import jax

    from fedjax_lab.experiments import build_experiment, load_config, validate

    source, overrides, rounds = WORKLOADS[workload]
    overrides = [*overrides, "rounds.layout=rules"]
    if isinstance(source, dict):
        config = validate({**source, "rounds": {**source["rounds"], "layout": "rules"}})
    else:
        config = load_config(REPO / source, overrides)
    experiment = build_experiment(config)
    state = experiment.initial_state()
    start = time.perf_counter()
    state, _ = jax.block_until_ready(experiment.run_rounds(state, experiment.inputs, num_rounds=rounds))
    first = time.perf_counter() - start
    seconds = []
    for _ in range(blocks):
        start = time.perf_counter()
        state, _ = jax.block_until_ready(experiment.run_rounds(state, experiment.inputs, num_rounds=rounds))
        seconds.append((time.perf_counter() - start) / rounds)
    return {"devices": len(jax.devices()), "cohort_devices": experiment.plan.num_devices,
            "chunk_size": experiment.plan.chunk_size, "first_block_seconds": first,
            "seconds_per_round": seconds, "compiled_programs": experiment.run_rounds._cache_size()}


def run_way(workload: str, cores: int, blocks: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["FEDJAX_LAB_CPU_DEVICES"] = str(cores)
    out = subprocess.run([sys.executable, __file__, "--worker", workload, "--blocks", str(blocks)], cwd=REPO,
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--reps", type=int, default=2, help="alternating pairs of processes")
    parser.add_argument("--blocks", type=int, default=3, help="timed blocks a process")
    parser.add_argument("--out", default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.blocks)))
        return

    sys.path.insert(0, str(REPO / "benchmarks"))
    from pfl_yardstick import commit

    from fedjax_lab.engine.sharding import available_cores
    from fedjax_lab.experiments.runner import cpu_model

    cores = available_cores()
    result = {"cores": cores, "cpu": cpu_model(), "commit": commit(),
              "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "workloads": {}}
    for workload in args.workloads:
        rows = {"one device": [], f"{cores} devices": []}
        for _ in range(args.reps):
            for label, count in (("one device", 1), (f"{cores} devices", cores)):
                rows[label].append(run_way(workload, count, args.blocks))
        medians = {label: statistics.median(s for r in runs for s in r["seconds_per_round"])
                   for label, runs in rows.items()}
        speedup = medians["one device"] / medians[f"{cores} devices"]
        result["workloads"][workload] = {"ways": rows, "median_seconds_per_round": medians,
                                         "speedup": speedup}
        print(f"{workload}: one device {medians['one device']:.3f} s/round, {cores} devices "
              f"{medians[f'{cores} devices']:.3f} s/round: {speedup:.2f}x", flush=True)
    date = datetime.date.today().strftime("%Y%m%d")
    vendor = "intel" if "Intel" in result["cpu"] else "amd" if "AMD" in result["cpu"] else "cpu"
    out = Path(args.out or REPO / "benchmarks" / "results" / f"cpu-devices-{vendor}-{cores}core-{date}.json")
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
