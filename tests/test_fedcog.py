"""FedCOG: the label shares, the generation, the distillation's start at zero, and the plug-in on five bases,
which before its start round (or with nothing generated) is its base exactly."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_lab.experiments import validate
from fedjax_lab.experiments.build import build_experiment
from fedjax_lab.methods.fedcog import generate, label_counts, target_labels
from fedjax_lab.models.divergences import js_divergence, softened_kl

BASES = [{"name": "fedavg"}, {"name": "fedavgm"}, {"name": "fedprox", "mu": 0.1}, {"name": "scaffold"},
         {"name": "moon", "mu": 1.0}]


def test_complementary_labels_follow_max_minus_counts_and_sum_to_n():
    d = jnp.array([500, 0, 400, 200, 400])  # the paper's worked example (App. A.1.1)
    np.testing.assert_array_equal(label_counts(d, 10), [0, 5, 1, 3, 1])
    for n in (7, 64, 256):
        counts = label_counts(jnp.array([3, 0, 9, 1]), n)
        assert int(counts.sum()) == n and int(counts[2]) == 0  # the client's largest class gets none
    np.testing.assert_array_equal(label_counts(jnp.array([4, 4, 4]), 7), [3, 2, 2])  # balanced: equal shares
    np.testing.assert_array_equal(label_counts(d, 10, "uniform"), [2, 2, 2, 2, 2])
    np.testing.assert_array_equal(target_labels(jnp.array([0, 2, 1]), 3), [1, 1, 2])


def test_js_divergence_is_symmetric_bounded_and_zero_on_equal_predictions():
    p, q = jax.random.normal(jax.random.key(0), (2, 50, 6)) * 3
    np.testing.assert_allclose(js_divergence(p, q), js_divergence(q, p), rtol=1e-5)
    assert float(js_divergence(p, q).max()) <= np.log(2) + 1e-6
    np.testing.assert_allclose(js_divergence(p, p), 0.0, atol=1e-6)


def test_generation_lowers_its_loss_and_the_distillation_starts_at_zero(tiny_classifier):
    global_vars = tiny_classifier.init(jax.random.key(0))
    local_vars = tiny_classifier.init(jax.random.key(1))
    labels = target_labels(label_counts(jnp.array([5, 0, 1, 2]), 32), 32)
    apply = tiny_classifier.module.apply
    generated = generate(apply, global_vars, local_vars, labels, jax.random.key(2), (5,), steps=50)
    assert float(generated.loss_best) < float(generated.loss_start) - 0.2
    # Lemma 5.5: at the first local step the student is the global model, whose logits are the cached teacher.
    np.testing.assert_allclose(generated.teacher_logits, apply(global_vars, generated.inputs), rtol=1e-5,
                               atol=1e-6)
    kd = lambda v: softened_kl(apply(v, generated.inputs), generated.teacher_logits, jnp.ones(32))
    assert abs(float(kd(global_vars))) < 1e-6
    assert float(optax_norm(jax.grad(kd)(global_vars))) < 1e-5
    none = generate(apply, global_vars, local_vars, labels, jax.random.key(2), (5,), steps=0)
    assert float(none.loss_best) == float(none.loss_start)


def optax_norm(tree):
    return jnp.sqrt(sum(jnp.sum(x ** 2) for x in jax.tree.leaves(tree)))


def assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)


def _run(algorithm, rounds=3):
    raw = {"dataset": {"name": "gaussian_mixture", "num_clients": 6, "examples_per_client": 12,
                       "dimension": 4, "num_classes": 3, "label_alpha": 0.3},
           "model": {"name": "mlp", "hidden": [8]}, "algorithm": algorithm,
           "client": {"local_steps": 3, "batch_size": 4, "learning_rate": 0.1},
           "rounds": {"num_rounds": rounds, "clients_per_round": 3}}
    experiment = build_experiment(validate(raw))
    state, metrics = experiment.run_rounds(experiment.initial_state(), experiment.inputs, num_rounds=rounds)
    return state, metrics


def _plugged(base, **fedcog):
    return {**base, "plugins": [{"name": "fedcog", "num_samples": 16, "steps": 5, "batch_size": 8, **fedcog}]}


@pytest.mark.parametrize("base", BASES, ids=[b["name"] for b in BASES])
def test_before_its_start_round_or_with_no_samples_fedcog_is_its_base_exactly(base):
    expected, _ = _run(base)
    for fedcog in ({"start_round": 100}, {"num_samples": 0}):
        got, _ = _run(_plugged(base, **fedcog))
        assert_trees_equal(got.server_state.params, expected.server_state.params)
        # The base's own state (SCAFFOLD's controls, MOON's previous models, the server momentum) as the base
        # has it.
        for name, state in expected.server_state.components.items():
            assert_trees_equal(got.server_state.components[name], state)
        for name, state in expected.client_states.items():
            assert_trees_equal(got.client_states[name], state)
        assert_trees_equal(got.server_state.opt_state, expected.server_state.opt_state)


@pytest.mark.parametrize("kd_weighting", ["fixed", "size"])
def test_from_start_round_fedcog_changes_the_round_keeps_previous_models_reports_generation(
        kd_weighting):
    base, _ = _run({"name": "fedavg"}, rounds=1)
    first, _ = _run(_plugged({"name": "fedavg"}, start_round=1, kd_weighting=kd_weighting, lambda_kd=1.0),
                    rounds=1)
    assert_trees_equal(first.server_state.params, base.server_state.params)
    later, metrics = _run(_plugged({"name": "fedavg"}, start_round=1, kd_weighting=kd_weighting,
                                   lambda_kd=1.0))
    plain, _ = _run({"name": "fedavg"})
    moved = [float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(later.server_state.params),
                                                          jax.tree.leaves(plain.server_state.params))]
    assert max(moved) > 1e-4 and np.all(np.isfinite(metrics["train_loss"]))
    assert int(later.server_state.components["fedcog"]) == 3  # server steps so far
    start, best = (np.asarray(metrics[f"fedcog_generation_loss_{k}"]) for k in ("start", "best"))
    assert start[0] == best[0] == 0.0  # round 0: nobody generated
    assert np.all(best[1:] > 0.0) and np.all(best[1:] < start[1:])  # the kept iterate beats the random start


def test_beside_moon_fedcog_reads_moons_previous_models_instead_of_storing_its_own():
    state, _ = _run(_plugged({"name": "moon", "mu": 1.0}, start_round=1))
    assert set(state.client_states) == {"moon"}
    alone, _ = _run(_plugged({"name": "fedavg"}, start_round=1))
    assert set(alone.client_states) == {"fedcog"}
