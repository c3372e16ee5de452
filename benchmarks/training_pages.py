"""The engine's round with its training arrays on transparent huge pages (the default) and on ordinary pages.

Each local step gathers a batch of rows at random from the pooled training arrays. With 4 KiB pages each row
of CIFAR-10's 150 MB training set costs a TLB miss (dearer under a virtual machine's nested paging), so
``fedjax_lab.engine.sharding.place_training_arrays`` copies arrays of 2 MiB or more onto huge pages once, and
every CPU device reads that one copy. Ways:

* ``huge``: as the engine builds it;
* ``ordinary``: ``jax.device_put`` of the dataset's arrays, then a copy on every device (the code before
  2026-12-01).

Workload: ``configs/cifar10_fedavg.yaml`` as the issue's CPU row runs it (CIFAR-10 from ../shared/data,
NIID-Bench Dirichlet(0.5), 100 clients, 10 a round, one local epoch of batch 64, simple-CNN), the rules'
layout (banded convolutions, one client at a time), the cohort split over one CPU device per core (the CPU
default; ``--devices 1`` for one). Each way runs in a fresh process, the ways alternating, ``--reps`` times; a
process compiles, runs a warm-up call, then times ``--calls`` calls of 3 rounds. Writes
``benchmarks/results/training-pages-<cpu>-<date>.json`` with the commit and the machine. This is a benchmark,
not a test.

Usage::

    python benchmarks/training_pages.py            # both cores, as docs/benchmarks.md ran it: about 8 minutes
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WAYS = ("huge", "ordinary")
ROUNDS = 3


def worker(way: str, calls: int, devices: int | None) -> dict:
    if devices:
        os.environ["FEDJAX_LAB_CPU_DEVICES"] = str(devices)
    from fedjax_lab.engine.sharding import use_cpu_cores  # before JAX starts

    use_cpu_cores()
    import jax

    from fedjax_lab.experiments import build

    if way == "ordinary":
        build.place_training_arrays = lambda arrays, mesh: jax.device_put(arrays)

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fedavg_cnn_throughput import epoch_round_rates

    return epoch_round_rates(calls, ROUNDS)


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
    from alternating import alternate, compare_two, save

    extra = ["--devices", str(args.devices)] if args.devices else []
    runs = alternate(__file__, WAYS, args.reps, after=["--calls", str(args.calls), *extra])
    save("training-pages", {"benchmark": "training_pages", "args": vars(args), "runs": runs,
                            **compare_two(runs, "huge", "ordinary")}, args.out)


if __name__ == "__main__":
    main()
