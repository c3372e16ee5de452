"""The engine's round of BHerd's CNN with five of its costs as now and as they were (``--compare``).

``--compare lrn`` (FedAvg): ``fedjax_lab/models/layers.py: local_response_norm`` sums the channel window with
one ``reduce_window`` and, for ``beta = 0.75``, takes ``rsqrt(t) sqrt(rsqrt(t))`` for ``t^-3/4``. Until
2026-12-01 it summed nine shifted slices of a padded square and took a power, which on a CPU core made the two
normalisations most of the training step. Ways: ``window`` (as the model builds it) and ``slices`` (the former
form, patched into ``fedjax_lab.models.cnns``).

``--compare padding`` (BHerd-FedAvg, alpha 0.5): BHerd's per-step outputs need a scan of the population's most
steps; since 2026-12-01 the steps past the longest client of a chunk go under a ``cond`` on the chunk's most
steps (``local_training._most_in_chunk``) and are skipped, where before every client ran the scan's whole
length, masked. Ways: ``skip`` (as the engine runs it) and ``masked`` (the former scan, patched in).

``--compare gradient`` (FedAvg): the banded convolution's gradient with respect to its input. Since
2026-12-01 a layer whose band inputs' transpose would sum more than ``layers.TRANSPOSED_GRADIENT`` shifted
copies of the input (the CNN's second layer: 15) takes the transposed convolution instead
(``layers._banded_conv_backward``). Ways: ``transposed`` (as the engine runs it) and ``copies`` (the
threshold raised so that every layer sums the copies, as before).

``--compare orientation`` (FedAvg): the banded convolution's weight gradient, a product of the band inputs
and the outputs' cotangent over their rows. Since 2026-12-01 the narrower operand comes first
(``layers._narrower_first``). Ways: ``narrow`` (as the engine runs it) and ``inputs`` (the band inputs first
in every layer, as before, patched in).

``--compare matmul`` (FedAvg): the library of the CPU's matrix products under the rules for a convolutional
model. Since 2026-12-01 it is XLA's Eigen kernels (``build.cpu_matmul``), where it had been XLA's default,
YNNPACK. Ways: ``eigen`` and ``ynnpack`` (``rounds.cpu_matmul`` set).

Workload: ``configs/bherd/cnn_mnist.yaml`` (the paper's CNN, 5 clients, B = 100, one local epoch), partition
case 3 (clients of 10,198 to 17,635 rows on all of MNIST: 101 to 176 steps), on a 6,000-row subset (a tenth: a
round of all 60,000 rows takes about a minute), the rules' layout, one CPU device (the cohort of 5 does not
split over 2). Each way runs in a fresh process, the ways alternating, ``--reps`` times; a process compiles,
runs a warm-up round, then times ``--calls`` rounds. Writes
``benchmarks/results/bherd-cnn-<compare>-<cpu>-<date>.json`` with the commit and the machine. This is a
benchmark, not a test.

Usage::

    taskset -c 0 python benchmarks/bherd_cnn_round.py                     # one core: about 5 minutes
    taskset -c 0 python benchmarks/bherd_cnn_round.py --compare padding
    taskset -c 0 python benchmarks/bherd_cnn_round.py --compare gradient
    taskset -c 0 python benchmarks/bherd_cnn_round.py --compare orientation
    taskset -c 0 python benchmarks/bherd_cnn_round.py --compare matmul
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMPARES = {  # compare: ((now, before), the method's overrides)
    "lrn": (("window", "slices"), ["algorithm={name: fedavg}"]),
    "padding": (("skip", "masked"), ["algorithm={name: bherd, alpha: 0.5}", "client.batch_order=fixed"]),
    "gradient": (("transposed", "copies"), ["algorithm={name: fedavg}"]),
    "orientation": (("narrow", "inputs"), ["algorithm={name: fedavg}"]),
    "matmul": (("eigen", "ynnpack"), ["algorithm={name: fedavg}"]),
}
OVERRIDES = ["dataset.partition.case=3", "dataset.subset=6000", "rounds.layout=rules", "parallel.devices=1",
             "eval.every=1000", "rounds.num_rounds=1000"]


def slices_and_power(x, depth_radius: int = 4, bias: float = 1.0, alpha: float = 0.001 / 9,
                     beta: float = 0.75):
    """The normalisation before 2026-12-01: a power of the sum of shifted slices."""
    import jax.numpy as jnp

    squared = jnp.pad(jnp.square(x), ((0, 0),) * (x.ndim - 1) + ((depth_radius, depth_radius),))
    channels = x.shape[-1]
    window = sum(squared[..., i:i + channels] for i in range(2 * depth_radius + 1))
    return x / (bias + alpha * window) ** beta


def worker(compare: str, way: str, calls: int) -> dict:
    import jax

    from fedjax_lab.engine import local_training
    from fedjax_lab.experiments import build_experiment, load_config
    from fedjax_lab.models import cnns, layers

    if way == "slices":
        cnns.local_response_norm = slices_and_power
    if way == "masked":
        local_training._most_in_chunk = lambda num_steps: None
    if way == "copies":
        layers.TRANSPOSED_GRADIENT = sys.maxsize
    if way == "inputs":
        layers._narrower_first = lambda outputs, inputs: False
    overrides = [*COMPARES[compare][1], *OVERRIDES]
    if compare == "matmul":
        overrides.append(f"rounds.cpu_matmul={way}")
    experiment = build_experiment(load_config(REPO / "configs" / "bherd" / "cnn_mnist.yaml", overrides))
    state = jax.block_until_ready(experiment.run_rounds(experiment.initial_state(), experiment.inputs,
                                                        num_rounds=1)[0])
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        state = jax.block_until_ready(experiment.run_rounds(state, experiment.inputs, num_rounds=1)[0])
        seconds.append(time.perf_counter() - start)
    # every client a round, one epoch of whole batches (the config drops the remainder)
    rows = int(sum(n // 100 * 100 for n in experiment.dataset.client_train_counts))
    return {"examples_per_s": [rows / s for s in seconds], "seconds_per_round": seconds,
            "devices": jax.device_count(), "chunk_size": experiment.plan.chunk_size,
            "cpu_matmul": experiment.cpu_matmul}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compare", choices=list(COMPARES), default="lrn")
    parser.add_argument("--reps", type=int, default=3, help="alternating rounds of processes, one a way")
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    ways = COMPARES[args.compare][0]
    if args.worker:
        print(json.dumps(worker(args.compare, args.worker, args.calls)))
        return
    from alternating import alternate, compare_two, save

    runs = alternate(__file__, ways, args.reps, after=["--compare", args.compare, "--calls", str(args.calls)])
    save(f"bherd-cnn-{args.compare}", {"benchmark": "bherd_cnn_round", "args": vars(args),
                                       "overrides": [*COMPARES[args.compare][1], *OVERRIDES], "runs": runs,
                                       **compare_two(runs, *ways)}, args.out)


if __name__ == "__main__":
    main()
