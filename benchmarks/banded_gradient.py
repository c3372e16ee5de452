"""The banded convolution's gradient on CPU: three ways to take the band inputs.

The banded lowering (``fedjax_lab/models/layers.py``) builds each band's inputs from overlapping slices of the
input. Its gradient with respect to the input is the transpose of those slices: shifted copies of the input,
summed. With one slice per band that is ``kh x bands`` copies (35 for the simple-CNN's first layer, 42 for
Feddle's CNN), which XLA's CPU backend materialises one by one wherever the gradient has several uses (Adam's
two moments on FedCOG's generated inputs; the next layer down in training). Whole-width slices, ``wb`` columns
at a time, are ``kh x ceil(span / wb)`` slices (10 and 6). The constructions:

* ``per_band``: one slice per band, values and gradient (the lowering before 2026-11-26);
* ``whole_width``: whole-width slices, values and gradient (2026-11-26 to 11-27; its forward pass and its
  gradient where it saves no copy cost the simple-CNN's FedAvg round 1.2x);
* ``band_rows``: today's, one slice per band forward and the whole-width gradient wherever it has fewer
  copies (a custom VJP); since 2026-12-01 a layer whose gradient would sum more than
  ``layers.TRANSPOSED_GRADIENT`` copies (the simple-CNN's first, 12) takes the transposed convolution.

The forward values are the same; the gradients sum the same terms in other orders. For three models, the three
are timed interleaved in one process (medians of ``--repeats``):

* ``train``: one SGD-with-momentum step at batch 64 (gradients with respect to the parameters);
* ``generate``: one step of FedCOG's generation at N = 128 (Adam on the inputs against two models).

Usage::

    python benchmarks/banded_gradient.py      # about 75 s on 2 idle cores
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
import numpy as np
import optax

from fedjax_lab.methods.fedcog import generate
from fedjax_lab.models import layers
from fedjax_lab.models.cnns import CNN3, FeddleCNN, SimpleCNN

OUT = Path(__file__).parent / "results" / "banded_gradient.json"
MODELS = {"simple_cnn": (SimpleCNN, 10), "feddle_cnn": (FeddleCNN, 20), "cnn3": (CNN3, 100)}


def conv_with(rows_of):
    """The banded convolution with its band inputs from ``rows_of(x, kh, kw, wb)``, values and gradient both
    (no custom gradient), one row of outputs a band as before 2026-12-01 (``band_height`` ignored)."""

    def conv(x: jax.Array, kernel: jax.Array, band_height: int = 1,
             padding: layers.Padding = ((0, 0), (0, 0))) -> jax.Array:
        x = layers._pad(x, padding)
        b, h, w, c = x.shape
        kh, kw, _, features = kernel.shape
        out_h, out_w = h - kh + 1, w - kw + 1
        wb = layers.band_width(out_w, kw)
        span = wb + kw - 1
        rows = rows_of(x, kh, kw, wb)
        shift = np.zeros((span, wb, kw), np.float32)
        for v in range(wb):
            for j in range(kw):
                shift[v + j, v, j] = 1.0
        toeplitz = jnp.einsum("uvj,ijco->iucvo", shift, kernel)
        y = (rows.reshape(b * out_h * (out_w // wb), kh * span * c)
             @ toeplitz.reshape(kh * span * c, wb * features))
        return y.reshape(b, out_h, out_w, features)

    return conv


# The constructions compared: one slice per band both ways (before 2026-11-26), whole-width slices both ways
# (2026-11-26 to 11-27), and today's ``band_rows``: one slice per band forward, whole-width gradient.
CONSTRUCTIONS = {"per_band": conv_with(layers._bands_one_slice_each),
                 "whole_width": conv_with(layers._bands_whole_width),
                 "band_rows": layers.banded_conv}


def seconds_per_step(run, argument, steps: int, repeats: int) -> float:
    """Median seconds per step of a compiled ``steps``-step function, after one call that compiles it."""
    jax.block_until_ready(run(argument))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(run(argument))
        times.append(time.perf_counter() - start)
    return statistics.median(times) / steps


def train_step(module, classes: int, steps: int, repeats: int) -> float:
    x = jax.random.normal(jax.random.key(0), (64, 32, 32, 3))
    y = jnp.arange(64) % classes
    variables = module.init(jax.random.key(1), x[:1])
    optimizer = optax.sgd(0.01, momentum=0.9)

    def loss(v):
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(module.apply(v, x), y))

    def step(carry, _):
        v, state = carry
        updates, state = optimizer.update(jax.grad(loss)(v), state, v)
        return (optax.apply_updates(v, updates), state), None

    run = jax.jit(lambda carry: jax.lax.scan(step, carry, None, length=steps)[0])
    return seconds_per_step(run, (variables, optimizer.init(variables)), steps, repeats)


def generation_step(module, classes: int, steps: int, repeats: int) -> float:
    shape = (32, 32, 3)
    global_variables = module.init(jax.random.key(1), jnp.zeros((1, *shape)))
    local_variables = module.init(jax.random.key(2), jnp.zeros((1, *shape)))
    labels = jnp.arange(128) % classes
    def run(key):
        return generate(module.apply, global_variables, local_variables, labels, key, shape, steps)

    run = jax.jit(run)
    return seconds_per_step(run, jax.random.key(0), steps, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    current = layers.banded_conv
    results = {}
    for name in args.models:
        cls, classes = MODELS[name]
        module = cls(classes, "banded")
        for what, measure in (("train", train_step), ("generate", generation_step)):
            times = {}
            for construction, conv in CONSTRUCTIONS.items():
                layers.banded_conv = conv
                times[construction] = measure(module, classes, args.steps, args.repeats) * 1e3
            layers.banded_conv = current
            times["speedup"] = times["per_band"] / times["band_rows"]
            times["speedup_over_whole_width"] = times["whole_width"] / times["band_rows"]
            results[f"{name} {what}"] = times
            print(f"{name:<11} {what:<9} one slice a band {times['per_band']:8.1f} ms   whole width "
                  f"{times['whole_width']:8.1f} ms   band_rows {times['band_rows']:8.1f} ms", flush=True)
    from records import code_commit  # the benchmarks' own folder is on sys.path

    record = {"machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, jax {jax.__version__}",
              "commit": code_commit(), "ms_per_step": results}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
