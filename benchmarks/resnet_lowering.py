"""The ResNets' convolution lowering on a CPU: ``banded`` against ``im2col``, in the engine's round.

Until 2026-12-01 the rules gave the ResNets ``im2col`` on a CPU and the measured layout left ``banded`` out
of their candidates, on the estimate that a banded 3x3 kernel over 32 columns multiplies about ten times the
FLOPs. The banded lowering's bands are ``layers.band_width`` columns wide (2 in the ResNets), not the whole
row, so the factor is ``(wb + kw - 1) / kw`` = 4/3; this measures what the estimate decided.

Workloads (``--workloads``), each the engine's round of ``configs/fedimpro/paper_cifar10.yaml`` (10 clients
of Dirichlet(0.1), 5 a round, one local epoch of 128) on the first 10,000 CIFAR-10 rows:

* ``resnet8_fedavg``, ``resnet8_fedimpro``: ResNet-8 with BatchNorm, FedAvg and FedImpro (split after
  layer2), the FedImpro table's model where ResNet-18 does not fit (``fedimpro_table.py --scale
  paper_resnet8``);
* ``resnet18_fedavg``: ResNet-18 with BatchNorm, FedAvg, on 2,000 rows (a round of it is minutes on a core).

Each way runs in a fresh process, the ways alternating, ``--reps`` times; a process compiles, runs a warm-up
round, then ``--calls`` rounds. Every process runs the same rounds (the seed fixes the cohorts), so the
ratio of their seconds is the speedup. Writes ``benchmarks/results/resnet-lowering-<cpu>-<date>.json`` with
the commit and the machine. This is a benchmark, not a test.

Usage::

    taskset -c 0 python benchmarks/resnet_lowering.py          # one core: about 35 minutes
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WAYS = ("banded", "im2col")
WORKLOADS = {  # name: overrides of configs/fedimpro/paper_cifar10.yaml
    "resnet8_fedavg": ["model.name=resnet8", "algorithm={name: fedavg}", "dataset.subset=10000"],
    "resnet8_fedimpro": ["model.name=resnet8", "eval.split=layer2", "dataset.subset=10000"],
    "resnet18_fedavg": ["algorithm={name: fedavg}", "dataset.subset=2000"],
}
COMMON = ["rounds.layout=rules", "parallel.devices=1", "eval.every=1000"]


def worker(workload: str, way: str, calls: int) -> dict:
    import jax
    import numpy as np

    from fedjax_lab.experiments import build_experiment, load_config

    overrides = [*WORKLOADS[workload], *COMMON, f"model.lowering={way}"]
    experiment = build_experiment(load_config(REPO / "configs" / "fedimpro" / "paper_cifar10.yaml",
                                              overrides))
    state, _ = experiment.run_rounds(experiment.initial_state(), experiment.inputs, num_rounds=1)
    jax.block_until_ready(state)
    seconds, examples = [], []
    for _ in range(calls):
        start = time.perf_counter()
        state, metrics = experiment.run_rounds(state, experiment.inputs, num_rounds=1)
        jax.block_until_ready(state)
        seconds.append(time.perf_counter() - start)
        # local_steps is the cohort's mean steps a client; each step is a batch of 128
        steps = float(np.asarray(metrics["local_steps"]).mean())
        examples.append(steps * experiment.config.rounds.clients_per_round * 128)
    return {"seconds_per_round": seconds, "examples_per_s": [e / s for e, s in zip(examples, seconds)],
            "chunk_size": experiment.plan.chunk_size, "cpu_matmul": experiment.cpu_matmul}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--reps", type=int, default=2, help="alternating rounds of processes, one a way")
    parser.add_argument("--calls", type=int, default=2)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(*args.worker, args.calls)))
        return
    from alternating import alternate, paired_ratios, save

    def show(run):
        return f"{sum(run['seconds_per_round']):.2f} s for {args.calls} rounds"

    runs, speedups = {}, {}
    for workload in args.workloads:
        runs[workload] = alternate(__file__, WAYS, args.reps, before=[workload],
                                   after=["--calls", str(args.calls)], show=show, label=f"{workload} ")
        found = runs[workload]
        pairs = paired_ratios(found["im2col"], found["banded"], "seconds_per_round", total=True)
        speedups[workload] = {"median": statistics.median(pairs), "per_repetition": pairs}
        print(f"{workload}: banded {statistics.median(pairs):.2f}x im2col; per repetition "
              + ", ".join(f"{p:.2f}" for p in pairs), flush=True)
    save("resnet-lowering", {"benchmark": "resnet_lowering", "args": vars(args),
                             "workloads": {w: WORKLOADS[w] + COMMON for w in args.workloads}, "runs": runs,
                             "speedup_of_banded": speedups}, args.out)


if __name__ == "__main__":
    main()
