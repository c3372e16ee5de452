"""FedCOG's generation cost per client against its local training (Ye et al., Table 11), on this machine.

For one client of the paper's CIFAR-10 setting (the simple-CNN on 32x32x3, batch 64, SGD with momentum), with
random inputs (timing only):

The convolutions are lowered as the runs lower them (``model.lowering: auto``), or as ``--lowering`` says.

* ``local``: one round of local training, ``--local-steps`` SGD steps (the paper: 400);
* ``generate N``: FedCOG's generation of N inputs, S = ``--steps`` Adam steps on the inputs against the global
  and the previous local model (the paper: S = 100, N from 16 to 1024).

Times are medians over ``--repeats`` calls of the compiled function. The paper's GPU figures (one local round
14.81 s; generation 0.72 s at N = 16 to 1.27 s at N = 1024) are latency-bound; on a CPU the cost follows the
arithmetic: generation does ``2 S N`` example passes (two models) with a backward pass to the inputs, local
training ``tau B``. Writes ``benchmarks/results/fedcog_cost.json``.

Usage::

    python benchmarks/fedcog_cost.py           # about 5 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import optax

from fedjax_lab.engine import LocalSchedule
from fedjax_lab.engine.local_training import train_locally
from fedjax_lab.engine.types import ClientData
from fedjax_lab.experiments.classifiers import default_lowering
from fedjax_lab.methods.fedcog import generate, label_counts, target_labels
from fedjax_lab.models import Classifier, SimpleCNN

REPO = Path(__file__).resolve().parents[1]


def median_seconds(fn, repeats: int) -> float:
    jax.block_until_ready(fn())  # compile
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 32, 64, 128, 256, 512, 1024])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--local-steps", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lowering", default="auto", choices=["auto", "banded", "im2col", "xla"],
                        help="the convolution lowering (auto: the runs' default for this backend)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "fedcog_cost.json"))
    args = parser.parse_args()

    lowering = default_lowering(jax.default_backend()) if args.lowering == "auto" else args.lowering
    classifier = Classifier(SimpleCNN(10, lowering), (32, 32, 3))
    global_vars, local_vars = classifier.init(jax.random.key(0)), classifier.init(jax.random.key(1))
    n = 5000  # a NIID-2 CIFAR-10 client's size
    arrays = {"x": jax.random.randint(jax.random.key(2), (n, 32, 32, 3), 0, 256).astype(jnp.uint8),
              "y": jax.random.randint(jax.random.key(3), (n,), 0, 10)}
    client = ClientData(jnp.int32(0), jnp.arange(n, dtype=jnp.int32), jnp.int32(n))
    optimizer = optax.chain(optax.add_decayed_weights(1e-5), optax.sgd(0.01, momentum=0.9))
    schedule = LocalSchedule(64, local_steps=args.local_steps, min_examples=n)
    local = jax.jit(lambda v, key: train_locally(v, classifier, optimizer, client, arrays, key, schedule)[0])
    rows = {"local": median_seconds(lambda: local(global_vars, jax.random.key(4)), args.repeats)}
    print(f"local training, {args.local_steps} steps of 64: {rows['local']:.2f} s", flush=True)
    counts = jnp.array([2500, 2500, 0, 0, 0, 0, 0, 0, 0, 0])
    for size in args.sizes:
        labels = target_labels(label_counts(counts, size), size)
        gen = jax.jit(lambda g, p, key, labels=labels: generate(classifier.module.apply, g, p, labels, key,
                                                                 (32, 32, 3), args.steps).inputs)
        rows[f"generate {size}"] = median_seconds(lambda gen=gen: gen(global_vars, local_vars,
                                                                      jax.random.key(5)),
                                                  args.repeats)
        print(f"generate N={size}, S={args.steps}: {rows[f'generate {size}']:.2f} s "
              f"({rows[f'generate {size}'] / rows['local']:.2f} x local)", flush=True)
    result = {"machine": f"{platform.processor() or platform.machine()}, {jax.device_count()} "
                         f"{jax.default_backend()} device(s), jax {jax.__version__}",
              "local_steps": args.local_steps, "generation_steps": args.steps, "seconds": rows,
              "ratio_to_local": {k: v / rows["local"] for k, v in rows.items()},
              "paper_gpu_seconds": {"local": 14.81, "generate 16": 0.72, "generate 32": 0.78,
                                    "generate 64": 0.79, "generate 128": 0.80, "generate 256": 0.81,
                                    "generate 512": 0.83, "generate 1024": 1.27}}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
