"""bfloat16 compute (``model.precision``): the passes run in bfloat16, everything kept stays float32, a small
task's accuracy tracks float32's, and the methods that call the model in their own ways run with it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_lab.experiments import build_experiment, run_experiment, validate
from fedjax_lab.experiments.run_directory import read_metrics
from fedjax_lab.methods import registry

MIXTURE = {
    "seed": 0,
    "dataset": {"name": "gaussian_mixture", "num_clients": 10, "examples_per_client": 60, "dimension": 10,
                "num_classes": 4, "separation": 0.6},
    "model": {"name": "mlp", "hidden": [32]},
    "algorithm": {"name": "fedavg"},
    "client": {"learning_rate": 0.1, "batch_size": 10, "local_steps": 5},
    "rounds": {"num_rounds": 30, "clients_per_round": 5},
    "eval": {"every": 10, "per_client": False},
}


def _mixture(precision):
    return validate({**MIXTURE, "model": {**MIXTURE["model"], "precision": precision}})


def test_the_pass_computes_in_bfloat16_and_returns_float32_outputs_and_gradients():
    experiment = build_experiment(_mixture("bfloat16"))
    classifier = experiment.classifier
    variables = experiment.initial_state().server_state.params
    batch = {"x": experiment.dataset.train["x"][:8], "y": experiment.dataset.train["y"][:8],
             "mask": jnp.ones(8, jnp.float32)}
    jaxpr = str(jax.make_jaxpr(classifier.loss)(variables, batch, jax.random.key(0)))
    assert "bf16" in jaxpr and "dot_general" in jaxpr
    grads = jax.grad(lambda v: classifier.loss(v, batch, jax.random.key(0))[0])(variables)
    assert {leaf.dtype for leaf in jax.tree.leaves(grads)} == {jnp.dtype(jnp.float32)}
    assert classifier.predict(variables, batch["x"]).dtype == jnp.float32
    float32 = build_experiment(_mixture("float32")).classifier
    assert "bf16" not in str(jax.make_jaxpr(float32.loss)(variables, batch, jax.random.key(0)))


def test_bfloat16_tracks_float32_accuracy_on_a_small_task(tmp_path):
    finals = {}
    for precision in ("float32", "bfloat16"):
        summary = run_experiment(_mixture(precision), tmp_path / precision, progress=False)
        finals[precision] = summary["final"]["test_accuracy"]
    assert finals["float32"] > 0.6  # the task is learnt, far above chance (0.25)
    assert abs(finals["bfloat16"] - finals["float32"]) < 0.03
    losses = [[r["train_loss"] for r in read_metrics(tmp_path / p) if "train_loss" in r] for p in finals]
    assert not np.allclose(losses[0], losses[1], rtol=1e-6)  # bfloat16 did compute differently


# The methods that call the model in their own ways: a part of the model (FedImpro), its head on generated
# features (FedGen), a virtual batch through it (VHL), its features (MOON). Every registered method ran one
# round in bfloat16 with `python benchmarks/bfloat16_methods.py` (its record: benchmarks/results/); running
# all of them here would add two minutes to the suite.
METHODS = ["fedimpro", "fedgen", "vhl", "moon"]


@pytest.mark.parametrize("name", METHODS)
def test_a_method_runs_in_bfloat16(name, image_root, tmp_path):
    raw = {"dataset": {"name": "image_folder", "data_dir": str(image_root),
                       "partition": {"name": "iid", "num_clients": 6},
                       "server_data": {"kind": "in_domain", "size": 20}},
           "model": {"name": "simple_cnn", "precision": "bfloat16"}, "algorithm": {"name": name},
           "client": {"batch_size": 8, "local_steps": 2, "learning_rate": 0.05},
           "rounds": {"num_rounds": 1, "clients_per_round": 3}, "eval": {"every": 1, "per_client": False}}
    summary = run_experiment(validate(raw), tmp_path / name, progress=False)
    assert np.isfinite(summary["final"]["test_loss"]) and not summary["diverged"]


def test_the_methods_tested_in_bfloat16_are_registered():
    assert set(METHODS) <= set(registry.REGISTRY)
