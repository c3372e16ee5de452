"""The max-pool's backward pass inside the engine's round: as it is, and with its two older forms put back.

``fedjax_lab/models/layers.py``'s ``_pool_corners_backward`` recomputes each 2x2 window's maxima at every
element of the layer before the pool (the simple-CNN's first: 301k a step of 64). It takes them with a
comparison and a select (``_larger``), and each corner's share of the gradient with selects of 1 and 1/2
(``_max_share``); the gradient is JAX's own, bit for bit, for any input without NaN. Before 2026-12-01 they
were ``jnp.maximum`` (which also propagates NaN, at several instructions an element on a CPU) and divisions
by 1 or 2. Ways:

* ``now``: the layers as they are;
* ``nan_max``: ``jnp.maximum`` for the maxima;
* ``divided``: the shares as divisions;
* ``both``: both older forms (the code before 2026-12-01).

Workload: ``configs/cifar10_fedavg.yaml`` (CIFAR-10 from ../shared/data, simple-CNN, batch 64) with 8 equal
local steps a client, the rules' layout (banded convolutions, one client at a time), on one CPU device
(``FEDJAX_LAB_CPU_DEVICES=1``): the step itself, without the split over cores. Each way runs in a fresh
process, the ways alternating, ``--reps`` times; a process compiles, runs a warm-up call, then times
``--calls`` calls of 3 rounds. Writes ``benchmarks/results/pool-gradient-<cpu>-<date>.json`` with the commit
and the machine. This is a benchmark, not a test.

Usage::

    taskset -c 0 python benchmarks/pool_gradient.py   # one core, as docs/benchmarks.md ran it: 4-7 minutes
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WAYS = ("now", "nan_max", "divided", "both")
ROUNDS = 3


def _older_forms(way: str) -> None:
    """Puts the older forms of ``way`` back into ``fedjax_lab.models.layers``."""
    import jax.numpy as jnp

    from fedjax_lab.models import layers

    def divided_share(x, ans, other):
        one = jnp.ones((), x.dtype)
        return jnp.where(x == ans, one, 0 * one) / jnp.where(other == ans, 2 * one, one)

    if way in ("nan_max", "both"):
        layers._larger = jnp.maximum
    if way in ("divided", "both"):
        layers._max_share = divided_share


def worker(way: str, calls: int) -> dict:
    os.environ["FEDJAX_LAB_CPU_DEVICES"] = "1"
    from fedjax_lab.engine.sharding import use_cpu_cores  # before JAX starts

    use_cpu_cores()
    import jax

    from fedjax_lab.experiments import build_experiment, load_config

    _older_forms(way)
    config = load_config(REPO / "configs" / "cifar10_fedavg.yaml",
                         ["client.local_epochs=null", "client.local_steps=8", "rounds.layout=rules"])
    experiment = build_experiment(config)
    state = jax.block_until_ready(experiment.run_rounds(experiment.initial_state(), experiment.inputs,
                                                        num_rounds=ROUNDS)[0])
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        state = jax.block_until_ready(experiment.run_rounds(state, experiment.inputs, num_rounds=ROUNDS)[0])
        seconds.append(time.perf_counter() - start)
    examples = ROUNDS * config.rounds.clients_per_round * 8 * config.client.batch_size
    return {"examples_per_s": [examples / s for s in seconds], "chunk_size": experiment.plan.chunk_size,
            "cpu_matmul": experiment.cpu_matmul}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="alternating rounds of processes, one a way")
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    parser.add_argument("--worker", choices=WAYS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.calls)))
        return
    from alternating import alternate, median_of_calls, save

    runs = alternate(__file__, WAYS, args.reps, after=["--calls", str(args.calls)])
    medians = {way: median_of_calls(runs[way]) for way in WAYS}
    for way in WAYS:
        print(f"{way:>8}: {medians[way]:,.0f} ex/s, now / {way} = {medians['now'] / medians[way]:.3f}")
    save("pool-gradient", {"benchmark": "pool_gradient", "args": vars(args), "runs": runs,
                           "median_examples_per_s": medians,
                           "speedup_of_now": {way: medians["now"] / medians[way] for way in WAYS}}, args.out)


if __name__ == "__main__":
    main()
