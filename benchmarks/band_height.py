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
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WAYS = ("two", "one")
ROUNDS = 3


def worker(way: str, calls: int, devices: int | None) -> dict:
    if devices:
        os.environ["FEDJAX_LAB_CPU_DEVICES"] = str(devices)
    from fedjax_lab.engine.sharding import use_cpu_cores  # before JAX starts

    use_cpu_cores()
    from fedjax_lab.models import layers

    if way == "one":
        layers.NARROW_BAND = 0

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
    save("band-height", {"benchmark": "band_height", "args": vars(args), "runs": runs,
                         **compare_two(runs, "two", "one", {"two": "two rows", "one": "one row"})}, args.out)


if __name__ == "__main__":
    main()
