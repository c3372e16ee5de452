"""The gradient-dissimilarity measurement: a NumPy computation on a hand-built cohort, the lower part of a
split model, and the measurement inside a run, with the rounds-to-target summary."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_lab.engine.dissimilarity import dissimilarity, lower_mask
from fedjax_lab.experiments import ConfigError, build_experiment, run_experiment, validate
from fedjax_lab.experiments.runner import rounds_to_target
from fedjax_lab.models import SimpleCNN


def test_dissimilarity_equals_a_numpy_computation_on_a_hand_built_cohort():
    rng = np.random.RandomState(0)
    grads = {"low": rng.normal(size=(3, 4, 2)),
             "high": {"w": rng.normal(size=(3, 5)), "b": rng.normal(size=(3,))}}
    mask = {"low": True, "high": {"w": False, "b": False}}
    weights = np.array([1.0, 2.0, 5.0])
    got = dissimilarity(jax.tree.map(jnp.asarray, grads), jnp.asarray(weights), mask)
    p = weights / weights.sum()

    def expected(parts):
        flat = np.concatenate([g.reshape(3, -1) for g in parts], 1)
        mean = p @ flat
        return p @ np.sum((flat - mean) ** 2, 1), np.sum(mean ** 2)

    for part, leaves in (("lower", [grads["low"]]),
                         ("upper", [grads["high"]["b"][:, None], grads["high"]["w"]])):
        spread, norm = expected(leaves)
        np.testing.assert_allclose(float(got[f"gradient_dissimilarity_{part}"]), spread, rtol=1e-5)
        np.testing.assert_allclose(float(got[f"gradient_dissimilarity_{part}_relative"]), spread / norm,
                                   rtol=1e-5)


def test_the_lower_part_is_what_the_model_reads_up_to_the_split():
    module = SimpleCNN(3)
    params = module.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)))["params"]
    mask = lower_mask(module, params, (16, 16, 3), "conv2")
    assert {k for k, v in mask.items() if all(jax.tree.leaves(v))} == {"conv1", "conv2"}
    assert {k for k, v in mask.items() if not any(jax.tree.leaves(v))} == {"fc1", "fc2", "output"}


def test_a_run_reports_the_dissimilarity_of_each_part_and_its_rounds_to_target(image_root, tmp_path):
    raw = {"dataset": {"name": "image_folder", "data_dir": str(image_root),
                       "partition": {"name": "dirichlet", "num_clients": 6, "alpha": 0.3}},
           "model": {"name": "simple_cnn"},
           "algorithm": {"name": "fedavg", "plugins": [{"name": "fedimpro"}]},
           "client": {"batch_size": 8, "local_steps": 3, "learning_rate": 0.05},
           "rounds": {"num_rounds": 4, "clients_per_round": 3},
           "eval": {"every": 2, "per_client": False, "dissimilarity": 4, "dissimilarity_examples": 16,
                    "target_accuracy": 0.01}}
    summary = run_experiment(validate(raw), tmp_path, progress=False)
    final = summary["final"]
    for part in ("lower", "upper"):
        assert (final[f"gradient_dissimilarity_{part}"] > 0
                and np.isfinite(final[f"gradient_dissimilarity_{part}"]))
    assert summary["rounds_to_target"] == 0  # the evaluation before training already reaches 1%
    rows = [{"round": r, "test_accuracy": a} for r, a in ((0, 0.1), (10, 0.5), (20, 0.8), (30, 0.7))]
    assert rounds_to_target(rows, 0.75) == 20 and rounds_to_target(rows, 0.9) is None


def _fedimpro_config(image_root, weight, **eval_fields):
    return validate({
        "dataset": {"name": "image_folder", "data_dir": str(image_root),
                    "partition": {"name": "dirichlet", "num_clients": 6, "alpha": 0.3}},
        "model": {"name": "simple_cnn"},
        "algorithm": {"name": "fedavg", "plugins": [{"name": "fedimpro", "weight": weight,
                                                     "weight_schedule": "constant"}]},
        "client": {"batch_size": 8, "local_steps": 2, "learning_rate": 0.05},
        "rounds": {"num_rounds": 2, "clients_per_round": 3},
        "eval": {"every": 1, "per_client": False, "dissimilarity": 4, "dissimilarity_examples": 16,
                 **eval_fields}})


def test_the_counterfactual_is_the_other_objective_at_the_same_global_model(image_root):
    changes = {"algorithm.plugins.fedimpro.weight": 0.0}
    measured = build_experiment(_fedimpro_config(image_root, 1.0, dissimilarity_counterfactual=changes))
    without = build_experiment(_fedimpro_config(image_root, 0.0))
    state, _ = measured.run_rounds(measured.initial_state(), measured.inputs, num_rounds=1)
    got = measured.dissimilarity_evaluator(state, measured.inputs)
    # the same state, FedImpro's weight at 0
    expected = without.dissimilarity_evaluator(state, without.inputs)
    for key, value in expected.items():
        np.testing.assert_allclose(got[f"{key}_counterfactual"], value, rtol=1e-6)
    # The sampled features reach only the upper part: the lower part's gradients are the same either way.
    np.testing.assert_allclose(got["gradient_dissimilarity_lower"],
                               got["gradient_dissimilarity_lower_counterfactual"], rtol=1e-6)
    assert (abs(got["gradient_dissimilarity_upper"] - got["gradient_dissimilarity_upper_counterfactual"])
            > 1e-3 * abs(got["gradient_dissimilarity_upper"]))


def test_a_counterfactual_of_an_unknown_hyper_parameter_or_without_a_measurement_is_refused(image_root):
    with pytest.raises(ConfigError, match=r"eval.dissimilarity_counterfactual: "
                                          r"\['algorithm.wieght'\].*allowed"):
        build_experiment(_fedimpro_config(image_root, 1.0,
                                          dissimilarity_counterfactual={"algorithm.wieght": 0.0}))
    with pytest.raises(ValueError, match="eval.dissimilarity_counterfactual needs eval.dissimilarity"):
        _fedimpro_config(image_root, 1.0, dissimilarity=0, dissimilarity_counterfactual={"x": 0.0})
