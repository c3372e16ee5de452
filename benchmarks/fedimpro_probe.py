"""How hard FedImpro's sampled features are for the model they train:
at a run's last checkpoint, the upper part's cross-entropy and accuracy on real split features of test rows
and on features sampled from the shared statistics, and how the shared per-class Gaussians sit against the
real ones.

The sampled features' gradient is what FedImpro adds to a client's update (Eq. 6). When their cross-entropy is
near zero, they add almost nothing, and the method reduces to its base; when it is far above the real one,
they pull the upper part towards features the lower part no longer produces.

Usage::

    python benchmarks/fedimpro_probe.py runs/fedimpro/cifar10/a0.1_E1_M10/fedimpro/seed0 [more run dirs]
    python benchmarks/fedimpro_probe.py RUN_DIR --rows 2000 --json out.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_lab.experiments import load_config
from fedjax_lab.experiments.build import build_experiment
from fedjax_lab.experiments.evaluators import measured_split
from fedjax_lab.experiments.run_directory import RunDirectory
from fedjax_lab.methods.fedimpro import batch_class_moments, sample_features


def probe(run_dir: Path, rows: int = 2000, seed: int = 0) -> dict[str, float]:
    """The measurements of the module docstring at ``run_dir``'s last checkpoint, on its first ``rows`` test
    rows and as many sampled features, class-balanced."""
    config = load_config(run_dir / "config.yaml")
    experiment = build_experiment(config)
    state = RunDirectory(run_dir).restore_checkpoint(experiment.initial_state())
    fedimpro = next((m for m in (config.algorithm, *config.algorithm.plugins) if m.name == "fedimpro"), None)
    classifier, module = experiment.classifier, experiment.classifier.module
    split = measured_split(config, module)  # FedImpro's split, or eval.split for a run without it
    variables = experiment.algorithm.model_params(state.server_state)
    test = experiment.dataset.test
    x = classifier.preprocess(jnp.asarray(test["x"][:rows]))
    y = jnp.asarray(test["y"][:rows])
    num_classes = experiment.dataset.num_classes

    lower = jax.jit(lambda v, x: module.apply(v, x, split, method="lower"))
    upper = jax.jit(lambda v, h: module.apply(v, h, split, method="upper"))
    h = lower(variables, x)
    shape, dim = h.shape[1:], int(np.prod(h.shape[1:]))
    flat = h.reshape(len(h), dim)

    def measure(logits, labels, name):
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
        return {f"{name}_ce": float(jnp.mean(ce)),
                f"{name}_accuracy": float(jnp.mean(jnp.argmax(logits, -1) == labels)),
                f"{name}_logit_norm": float(jnp.mean(jnp.linalg.norm(logits, axis=-1)))}

    counts, means, spreads = batch_class_moments(flat, y, jnp.ones(len(y)), num_classes)
    held = counts > 1
    out = {"round": int(state.round), **measure(upper(variables, h), y, "real"),
           "real_spread": float(jnp.mean(spreads[held])),  # per element, over the classes in the test rows
           "real_feature_norm": float(jnp.mean(jnp.linalg.norm(flat, axis=-1)))}
    if fedimpro is None:
        return out
    stats = state.server_state.components["fedimpro"].stats
    y_hat = jnp.arange(len(y)) % num_classes
    h_hat = sample_features(stats, y_hat, jax.random.normal(jax.random.key(seed), (len(y), dim)))
    ramp = int(state.round) / fedimpro.ramp_rounds if fedimpro.weight_schedule == "ramp" else 1.0
    return {**out, "weight": float(fedimpro.weight * ramp),
            **measure(upper(variables, h_hat.reshape(len(y), *shape)), y_hat, "sampled"),
            "shared_spread": float(jnp.mean(stats.spread[held])),
            "mean_gap_over_real_spread": float(jnp.mean(jnp.abs(stats.mean - means)[held])
                                               / jnp.mean(spreads[held])),
            "sampled_feature_norm": float(jnp.mean(jnp.linalg.norm(h_hat, axis=-1)))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    args = parser.parse_args()
    results = {str(run): probe(run, args.rows) for run in args.runs}
    keys = list(dict.fromkeys(k for r in results.values() for k in r))
    print("| run | " + " | ".join(keys) + " |\n|---|" + "---:|" * len(keys))
    for run, r in results.items():
        print(f"| {run} | " + " | ".join(f"{r[k]:.4g}" if k in r else "-" for k in keys) + " |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
