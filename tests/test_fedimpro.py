"""FedImpro: the per-class statistics and their pooling, no gradient from sampled features into the lower
part, and with the sampled features' weight at zero the round of its base exactly."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_lab.engine.components import ClientView
from fedjax_lab.experiments import validate
from fedjax_lab.experiments.build import build_experiment
from fedjax_lab.methods.fedimpro import (
    FeatureStats,
    aggregate_stats,
    batch_class_moments,
    shared_features,
    update_stats,
)
from fedjax_lab.models import Classifier, SimpleCNN


def test_pooled_statistics_equal_the_moments_of_the_union_with_empty_and_single_row_classes():
    rng = np.random.RandomState(0)
    # Three clients, three classes, D = 4. Class 2 has one row in all (client 1); client 2 lacks class 0.
    rows = [(rng.normal(size=(5, 4)), np.array([0, 0, 1, 1, 0])),
            (rng.normal(size=(4, 4)), np.array([1, 2, 0, 1])),
            (rng.normal(size=(3, 4)), np.array([1, 1, 1]))]
    moments = [batch_class_moments(jnp.asarray(h, jnp.float32), jnp.asarray(y), jnp.ones(len(y)), 3)
               for h, y in rows]
    counts, means, spreads = (jnp.stack([m[i] for m in moments]) for i in range(3))
    previous = FeatureStats(jnp.full((3, 4), 7.0), jnp.full((3, 4), 9.0))
    pooled = aggregate_stats(means, spreads, counts, jnp.ones(3, bool), previous, "pooled")
    h = np.concatenate([r[0] for r in rows])
    y = np.concatenate([r[1] for r in rows])
    for c in (0, 1):
        np.testing.assert_allclose(pooled.mean[c], h[y == c].mean(0), rtol=1e-5)
        np.testing.assert_allclose(pooled.spread[c], h[y == c].std(0, ddof=1), rtol=1e-5)
    np.testing.assert_allclose(pooled.mean[2], h[y == 2][0], rtol=1e-6)  # one row: its mean, the old spread
    np.testing.assert_array_equal(pooled.spread[2], 9.0)
    absent = aggregate_stats(means, spreads, counts, jnp.array([False, False, True]), previous, "pooled")
    np.testing.assert_array_equal(absent.mean[0], 7.0)  # no present client holds class 0
    uniform = aggregate_stats(means, spreads, counts, jnp.array([True, False, True]), previous, "uniform")
    np.testing.assert_allclose(uniform.mean, (means[0] + means[2]) / 2, rtol=1e-6)


def test_statistics_move_by_the_class_share_of_the_batch_and_spreads_are_capped():
    stats = FeatureStats(jnp.zeros((3, 2)), jnp.full((3, 2), 0.05))
    h = jnp.array([[1.0, 2.0], [3.0, 4.0], [10.0, 10.0], [5.0, 5.0]])
    y, mask = jnp.array([0, 0, 1, 2]), jnp.array([1.0, 1.0, 1.0, 0.0])
    new = update_stats(stats, h, y, mask, ema_examples=4.0, spread_cap=0.1)
    np.testing.assert_allclose(new.mean[0], 0.5 * jnp.array([2.0, 3.0]))  # 2 of 4: half way
    np.testing.assert_allclose(new.mean[1], 0.25 * jnp.array([10.0, 10.0]))
    np.testing.assert_array_equal(new.mean[2], 0.0)  # its only row is masked
    np.testing.assert_array_equal(new.spread[1], stats.spread[1])  # one row: no spread
    np.testing.assert_allclose(new.spread[0], 0.1)  # (0.05 + std 1.41) / 2, capped


def test_the_codes_moving_average_weight_is_the_feature_size_over_ema_examples_for_every_class():
    stats = FeatureStats(jnp.zeros((3, 2)), jnp.full((3, 2), 0.05))
    h = jnp.array([[1.0, 2.0], [3.0, 4.0], [10.0, 10.0], [5.0, 5.0]])
    y, mask = jnp.array([0, 0, 1, 2]), jnp.array([1.0, 1.0, 1.0, 0.0])
    new = update_stats(stats, h, y, mask, ema_examples=8.0, spread_cap=None, moving_average="feature_size")
    np.testing.assert_allclose(new.mean[0], 0.25 * jnp.array([2.0, 3.0]))  # D / 8 = 1/4 whatever n_c
    np.testing.assert_allclose(new.mean[1], 0.25 * jnp.array([10.0, 10.0]))
    np.testing.assert_array_equal(new.mean[2], 0.0)  # absent classes stay
    replaced = update_stats(stats, h, y, mask, ema_examples=2.0, spread_cap=None,
                            moving_average="feature_size")
    # D >= ema_examples: the batch replaces the estimate
    np.testing.assert_allclose(replaced.mean[0], [2.0, 3.0])


def _image_classifier():
    return Classifier(SimpleCNN(3), (16, 16, 3))


@pytest.mark.parametrize("labels", ["balanced", "batch"])
def test_sampled_features_send_no_gradient_into_the_lower_part(labels):
    classifier = _image_classifier()
    variables = classifier.init(jax.random.key(0))
    component = shared_features(classifier, 3, jax.random.key(1), 8, "conv2", weight_schedule="constant",
                                labels=labels, source="global")
    server = component.server_init(variables)
    view = ClientView(variables, server, (), None, None, jax.random.key(2), jnp.float32(0.1))
    b = {"x": jnp.zeros((8, 16, 16, 3)), "y": jnp.arange(8) % 3, "mask": jnp.ones(8)}
    b = component.batch(view)(b, 0, jax.random.key(3))
    term = component.loss_term(view)
    grads = jax.grad(lambda v: term(v, b, None))(variables)["params"]
    for name in ("conv1", "conv2"):
        assert all(float(jnp.abs(g).max()) == 0 for g in jax.tree.leaves(grads[name]))
    for name in ("fc1", "fc2", "output"):
        assert any(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads[name]))


def _run(image_root, algorithm, rounds=2):
    raw = {"dataset": {"name": "image_folder", "data_dir": str(image_root),
                       "partition": {"name": "dirichlet", "num_clients": 6, "alpha": 0.3}},
           "model": {"name": "simple_cnn"}, "algorithm": algorithm,
           "client": {"batch_size": 8, "local_steps": 3, "learning_rate": 0.05},
           "rounds": {"num_rounds": rounds, "clients_per_round": 3},
           "eval": {"every": rounds, "per_client": False}}
    experiment = build_experiment(validate(raw))
    return experiment.run_rounds(experiment.initial_state(), experiment.inputs, num_rounds=rounds)


def test_with_zero_weight_fedimpro_is_fedavg_exactly_and_otherwise_moves_it(image_root):
    expected, _ = _run(image_root, {"name": "fedavg"})
    got, metrics = _run(image_root, {"name": "fedimpro", "weight": 0.0, "noise_std": 0.01})
    for x, y in zip(jax.tree.leaves(expected.server_state.params), jax.tree.leaves(got.server_state.params)):
        np.testing.assert_array_equal(x, y)
    stats = got.server_state.components["fedimpro"].stats
    assert float(stats.spread.min()) >= 0 and float(metrics["fedimpro_feature_distance"][-1]) > 0
    moved, _ = _run(image_root, {"name": "fedimpro", "weight_schedule": "constant"})
    assert max(float(jnp.abs(a - b).max())
               for a, b in zip(jax.tree.leaves(moved.server_state.params),
                               jax.tree.leaves(expected.server_state.params))) > 1e-5
