"""The engine's round with the simple-CNN's first layer in bands of two output rows (the default) and of one.

``fedjax_lab/models/layers.py``'s banded convolution takes ``wb`` output columns a band, and since
2026-12-01 two output rows where the band's product would be narrow (``wb x F`` under 32 outputs: the
simple-CNN's first layer, 4 columns x 6 filters). Its band inputs shrink from 10x the input to 6x, for a
product with 144 instead of 120 multiply-adds an output. Ways:

* ``two``: as the engine builds it;
* ``one``: one output row a band everywhere (``layers.NARROW_BAND = 0``; the code before 2026-12-01).

Workload: ``configs/cifar10_fedavg.yaml`` as the issue's CPU row runs it (CIFAR-10 from ../shared/data,
NIID-Bench Dirichlet(0.5), 100 clients, 10 a round, one local epoch of batch 64, simple-CNN), the rules'
layout (banded convolutions, one client at a time, YNNPACK's products), the cohort split over one CPU device
per core (the CPU default; ``--devices 1`` for one). Each way runs in a fresh process, the ways alternating,
``--reps`` times; a process compiles, runs a warm-up call, then times ``--calls`` calls of 3 rounds. Writes
``benchmarks/results/band-height-<cpu>-<date>.json`` with the commit and the machine. This is a benchmark,
not a test.

Usage::

    python benchmarks/band_height.py            # both cores, as docs/benchmarks.md ran it: about 6 minutes
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
WAYS = ("two", "one")
ROUNDS = 3


def worker(way: str, calls: int, devices: int | None) -> dict:
    if devices:
        os.environ["FEDJAX_LAB_CPU_DEVICES"] = str(devices)
    from fedjax_lab.engine.sharding import use_cpu_cores  # before JAX starts

    use_cpu_cores()
    import jax

    from fedjax_lab.experiments import build_experiment, load_config
    from fedjax_lab.models import layers

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fedavg_cnn_throughput import Budget, examples_per_call

    if way == "one":
        layers.NARROW_BAND = 0
    budget = Budget(epochs=1)
    config = load_config(REPO / "configs" / "cifar10_fedavg.yaml",
                         [*budget.overrides(), "rounds.layout=rules"])
    experiment = build_experiment(config)
    state = jax.block_until_ready(experiment.run_rounds(experiment.initial_state(), experiment.inputs,
                                                        num_rounds=ROUNDS)[0])
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        state = jax.block_until_ready(experiment.run_rounds(state, experiment.inputs, num_rounds=ROUNDS)[0])
        seconds.append(time.perf_counter() - start)
    examples = examples_per_call(experiment, budget, ROUNDS, calls + 1)[1:]  # the first call was the warm-up
    return {"examples_per_s": [n / s for n, s in zip(examples, seconds)], "devices": jax.device_count(),
            "chunk_size": experiment.plan.chunk_size, "cpu_matmul": experiment.cpu_matmul}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="alternating rounds of processes, one a way")
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--devices", type=int, default=None, help="CPU devices (default one a core)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    parser.add_argument("--worker", choices=WAYS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.calls, args.devices)))
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fedavg_mlp_throughput import machine_info, machine_kind

    runs = {way: [] for way in WAYS}
    extra = ["--devices", str(args.devices)] if args.devices else []
    for rep in range(args.reps):
        for way in WAYS:
            command = [sys.executable, __file__, "--worker", way, "--calls", str(args.calls), *extra]
            out = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True)
            runs[way].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"rep {rep} {way:>8}: {statistics.median(runs[way][-1]['examples_per_s']):,.0f} ex/s",
                  flush=True)
    medians = {way: statistics.median(r for run in runs[way] for r in run["examples_per_s"]) for way in WAYS}
    pairs = [statistics.median(h["examples_per_s"]) / statistics.median(o["examples_per_s"])
             for h, o in zip(runs["two"], runs["one"])]
    print(f"two rows {medians['two']:,.0f} ex/s, one row {medians['one']:,.0f}: "
          f"{medians['two'] / medians['one']:.3f}x; per repetition "
          + ", ".join(f"{p:.3f}" for p in pairs))
    info = machine_info()
    date = datetime.date.today().isoformat()
    record = {"benchmark": "band_height", "date": date, "machine": info, "args": vars(args),
              "runs": runs, "median_examples_per_s": medians,
              "speedup_of_two": medians["two"] / medians["one"], "speedup_per_repetition": pairs}
    path = Path(args.out) / f"band-height-{machine_kind(info)}-{date.replace('-', '')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))
    print(f"saved {path}")


if __name__ == "__main__":
    main()
