"""Each baseline's defining property, on the tiny embedded data."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_lab.engine import CohortPlan, LocalSchedule, init_loop_state, make_run_rounds
from fedjax_lab.methods.fedavg import fedavg
from fedjax_lab.methods.feddyn import feddyn
from fedjax_lab.methods.fedexp import extrapolation_step, fedexp
from fedjax_lab.methods.fednova import fednova, momentum_normaliser
from fedjax_lab.methods.fedprox import fedprox
from fedjax_lab.methods.fedsam import fedsam
from fedjax_lab.methods.scaffold import scaffold
from fedjax_lab.methods.server_optimizers import fedavg_server, reddi_server
from tests.conftest import assert_trees_close, make_inputs

STEPS = LocalSchedule(4, local_steps=3)
EPOCHS = LocalSchedule(4, local_epochs=2)


def _run(algorithm, data, classifier, rounds=2, cohort=6):
    params = classifier.init(jax.random.key(0))
    state = init_loop_state(algorithm, params, data.num_clients)
    state, metrics = make_run_rounds(algorithm, CohortPlan(data.num_clients, cohort))(state, make_inputs(data),
                                                                                    num_rounds=rounds)
    return state, metrics


def _fedavg_params(data, classifier, schedule=STEPS, weighting="num_examples", server=None, rounds=2):
    algorithm = fedavg(classifier.loss, optax.sgd(0.1), server or fedavg_server(1.0), schedule, weighting)
    return _run(algorithm, data, classifier, rounds)[0].server_state.params


def test_fedprox_with_zero_mu_equals_fedavg(tiny_data, tiny_classifier):
    algorithm = fedprox(tiny_classifier.loss, optax.sgd(0.1), fedavg_server(1.0), STEPS, mu=0.0)
    state, _ = _run(algorithm, tiny_data, tiny_classifier)
    assert_trees_close(state.server_state.params, _fedavg_params(tiny_data, tiny_classifier), rtol=1e-6)


def test_fedprox_large_mu_keeps_clients_at_the_global_model(tiny_data, tiny_classifier):
    small = _run(fedprox(tiny_classifier.loss, optax.sgd(0.1), fedavg_server(1.0), STEPS, mu=0.0),
                 tiny_data, tiny_classifier, rounds=1)[1]["update_norm"]
    large = _run(fedprox(tiny_classifier.loss, optax.sgd(0.1), fedavg_server(1.0), STEPS, mu=9.0),
                 tiny_data, tiny_classifier, rounds=1)[1]["update_norm"]
    assert float(large[0]) < 0.5 * float(small[0])


def test_fedprox_composes_with_fedadam(tiny_data, tiny_classifier):
    server = reddi_server("adam", 0.03)
    algorithm = fedprox(tiny_classifier.loss, optax.sgd(0.1), server, STEPS, mu=0.0)
    state, _ = _run(algorithm, tiny_data, tiny_classifier)
    assert_trees_close(state.server_state.params, _fedavg_params(tiny_data, tiny_classifier, server=server))


def _scaffold(classifier, num_clients, **kwargs):
    return scaffold(classifier.loss, optax.sgd(0.1), fedavg_server(1.0), STEPS, learning_rate=0.1,
                    num_clients=num_clients, **kwargs)


def test_scaffold_first_round_is_fedavg_and_controls_follow_option_ii(tiny_data, tiny_classifier):
    n = tiny_data.num_clients
    state, _ = _run(_scaffold(tiny_classifier, n), tiny_data, tiny_classifier, rounds=1)
    assert_trees_close(state.server_state.params, _fedavg_params(tiny_data, tiny_classifier, rounds=1), rtol=1e-6)
    # With c = c_k = 0, option II gives the cohort's clients c_k = (x - y_k) / (K eta); the others stay at zero.
    controls = state.client_states
    touched = [k for k in range(n) if float(optax.global_norm(jax.tree.map(lambda c, k=k: c[k], controls))) > 0]
    assert len(touched) == 6
    # The server control is the mean of all N client controls (control_average='all').
    mean_control = jax.tree.map(lambda c: jnp.mean(c, 0), controls)
    assert_trees_close(state.server_state.control, mean_control, rtol=1e-5, atol=1e-7)


def test_scaffold_server_control_stays_the_mean_of_all_client_controls(tiny_data, tiny_classifier):
    state, _ = _run(_scaffold(tiny_classifier, tiny_data.num_clients), tiny_data, tiny_classifier, rounds=4)
    assert_trees_close(state.server_state.control, jax.tree.map(lambda c: jnp.mean(c, 0), state.client_states),
                       rtol=1e-4, atol=1e-6)


def test_scaffold_option_ii_with_one_full_batch_step_equals_option_i(tiny_data, tiny_classifier):
    schedule = LocalSchedule(64, local_steps=1)
    kwargs = {"num_clients": tiny_data.num_clients}
    one = scaffold(tiny_classifier.loss, optax.sgd(0.1), fedavg_server(1.0), schedule, 0.1, option="I", **kwargs)
    two = scaffold(tiny_classifier.loss, optax.sgd(0.1), fedavg_server(1.0), schedule, 0.1, option="II", **kwargs)
    s1, _ = _run(one, tiny_data, tiny_classifier, rounds=1)
    s2, _ = _run(two, tiny_data, tiny_classifier, rounds=1)
    assert_trees_close(s1.client_states, s2.client_states, rtol=1e-3, atol=1e-5)


def test_fednova_with_equal_steps_equals_weighted_fedavg(tiny_data, tiny_classifier):
    algorithm = fednova(tiny_classifier.loss, optax.sgd(0.1), fedavg_server(1.0), STEPS)
    state, _ = _run(algorithm, tiny_data, tiny_classifier)
    assert_trees_close(state.server_state.params, _fedavg_params(tiny_data, tiny_classifier), rtol=1e-5)


def test_fednova_differs_from_fedavg_when_steps_differ(tiny_data, tiny_classifier):
    state, _ = _run(fednova(tiny_classifier.loss, optax.sgd(0.1), fedavg_server(1.0), EPOCHS), tiny_data,
                    tiny_classifier)
    base = _fedavg_params(tiny_data, tiny_classifier, schedule=EPOCHS)
    diff = optax.global_norm(jax.tree.map(jnp.subtract, state.server_state.params, base))
    assert float(diff) > 1e-3


def test_fednova_momentum_normaliser_is_the_sum_of_heavy_ball_coefficients():
    rho, tau = 0.9, 7
    series = sum((1 - rho**r) / (1 - rho) for r in range(1, tau + 1))
    np.testing.assert_allclose(momentum_normaliser(jnp.int32(tau), rho), series, rtol=1e-5)
    assert float(momentum_normaliser(jnp.int32(tau), 0.0)) == tau


def test_feddyn_with_zero_alpha_equals_uniform_fedavg(tiny_data, tiny_classifier):
    algorithm = feddyn(tiny_classifier.loss, optax.sgd(0.1), STEPS, alpha=0.0, num_clients=tiny_data.num_clients)
    state, _ = _run(algorithm, tiny_data, tiny_classifier)
    assert_trees_close(state.server_state.params,
                       _fedavg_params(tiny_data, tiny_classifier, weighting="uniform"), rtol=1e-5)


def test_feddyn_state_follows_its_update_rule(tiny_data, tiny_classifier):
    alpha, n = 0.1, tiny_data.num_clients
    state, _ = _run(feddyn(tiny_classifier.loss, optax.sgd(0.1), STEPS, alpha=alpha, num_clients=n),
                    tiny_data, tiny_classifier, rounds=1)
    # h = -alpha/N sum_S (y_k - x) and g_k = -alpha (y_k - x): so h = (1/N) sum_k g_k over all clients.
    assert_trees_close(state.server_state.h, jax.tree.map(lambda g: jnp.sum(g, 0) / n, state.client_states),
                       rtol=1e-5, atol=1e-7)


def test_fedexp_step_is_never_below_one_and_extrapolates_disagreeing_clients():
    same = {"w": jnp.ones((4, 3))}
    assert float(extrapolation_step(same, 1e-3)) == 1.0
    opposite = {"w": jnp.array([[1.0, 0.0], [-1.0, 0.1], [0.9, 0.0], [-1.0, 0.0]])}
    assert float(extrapolation_step(opposite, 1e-3)) > 1.0


def test_fedexp_runs_and_reports_its_step(tiny_data, tiny_classifier):
    _, metrics = _run(fedexp(tiny_classifier.loss, optax.sgd(0.1), STEPS), tiny_data, tiny_classifier, rounds=3)
    assert np.all(np.asarray(metrics["server_step"]) >= 1.0)


def test_fedsam_with_zero_rho_equals_fedavg(tiny_data, tiny_classifier):
    algorithm = fedsam(tiny_classifier.loss, optax.sgd(0.1), fedavg_server(1.0), STEPS, rho=0.0)
    state, _ = _run(algorithm, tiny_data, tiny_classifier)
    assert_trees_close(state.server_state.params, _fedavg_params(tiny_data, tiny_classifier), rtol=1e-6)


def test_fedsam_with_positive_rho_changes_the_update(tiny_data, tiny_classifier):
    state, _ = _run(fedsam(tiny_classifier.loss, optax.sgd(0.1), fedavg_server(1.0), STEPS, rho=0.5), tiny_data,
                    tiny_classifier)
    diff = optax.global_norm(jax.tree.map(jnp.subtract, state.server_state.params,
                                          _fedavg_params(tiny_data, tiny_classifier)))
    assert float(diff) > 1e-4


@pytest.mark.parametrize("make", [
    lambda c, n: fedprox(c.loss, optax.sgd(0.1), fedavg_server(1.0), STEPS, mu=0.1),
    lambda c, n: _scaffold(c, n, control_average="cohort"),
    lambda c, n: feddyn(c.loss, optax.sgd(0.1), STEPS, alpha=0.01, num_clients=n),
])
def test_baselines_learn_on_the_tiny_data(tiny_data, tiny_classifier, make):
    _, metrics = _run(make(tiny_classifier, tiny_data.num_clients), tiny_data, tiny_classifier, rounds=15)
    loss = np.asarray(metrics["train_loss"])
    assert np.all(np.isfinite(loss)) and loss[-3:].mean() < loss[:3].mean()


@pytest.mark.parametrize("overrides", [
    {"name": "fedprox", "mu": 0.1, "server_optimizer": "adam", "server_learning_rate": 0.03},
    {"name": "scaffold", "option": "I"}, {"name": "fednova"}, {"name": "feddyn", "alpha": 0.01},
    {"name": "fedexp"}, {"name": "fedsam", "rho": 0.05}, {"name": "moon", "mu": 1.0}, {"name": "feddecorr"}])
def test_every_baseline_runs_from_a_config(tmp_path, overrides):
    from fedjax_lab.experiments import run_experiment, validate

    raw = {"dataset": {"name": "gaussian_mixture", "num_clients": 6, "examples_per_client": 12, "dimension": 4,
                       "num_classes": 3},
           "model": {"name": "mlp", "hidden": [8]}, "algorithm": overrides,
           "client": {"local_steps": 2, "batch_size": 4, "learning_rate": 0.1, "momentum": 0.5},
           "rounds": {"num_rounds": 2, "clients_per_round": 3}, "eval": {"every": 2, "per_client": False}}
    summary = run_experiment(validate(raw), tmp_path / overrides["name"], progress=False)
    assert np.isfinite(summary["final"]["test_loss"]) and summary["diverged"] is None


def test_a_server_optimizer_for_a_method_with_its_own_server_step_is_rejected():
    from fedjax_lab.experiments import ConfigError, build_experiment, validate

    raw = {"dataset": {"name": "synthetic"}, "model": {"name": "logistic_regression"},
           "algorithm": {"name": "fedexp", "server_optimizer": "adam"}, "client": {"local_steps": 1}}
    with pytest.raises(ConfigError, match="algorithm.server_optimizer: fedexp has its own server step"):
        build_experiment(validate(raw))


def test_moon_with_zero_mu_equals_fedavg_and_keeps_each_clients_previous_model(tiny_data, tiny_classifier):
    from fedjax_lab.methods.moon import moon

    algorithm = moon(tiny_classifier, optax.sgd(0.1), fedavg_server(1.0), STEPS, mu=0.0)
    state, _ = _run(algorithm, tiny_data, tiny_classifier, rounds=1)
    assert_trees_close(state.server_state.params, _fedavg_params(tiny_data, tiny_classifier, rounds=1), rtol=1e-6)
    initial = tiny_classifier.init(jax.random.key(0))
    changed = [k for k in range(tiny_data.num_clients)
               if float(optax.global_norm(jax.tree.map(lambda p, q, k=k: p[k] - q, state.client_states, initial))) > 0]
    assert len(changed) == 6  # the cohort's previous models moved; the others are still the initial model


def test_moon_contrastive_term_prefers_the_global_representation():
    from fedjax_lab.methods.moon import cosine

    z = jnp.array([[1.0, 0.0], [0.0, 1.0]])
    np.testing.assert_allclose(cosine(z, z), [1.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(cosine(z, -z), [-1.0, -1.0], rtol=1e-6)


def test_feddecorr_with_zero_beta_equals_fedavg_and_its_term_is_minimal_for_decorrelated_features(
        tiny_data, tiny_classifier):
    from fedjax_lab.methods.feddecorr import decorrelation, feddecorr

    state, _ = _run(feddecorr(tiny_classifier, optax.sgd(0.1), fedavg_server(1.0), STEPS, beta=0.0), tiny_data,
                    tiny_classifier)
    assert_trees_close(state.server_state.params, _fedavg_params(tiny_data, tiny_classifier), rtol=1e-6)
    rng = np.random.RandomState(0)
    independent = jnp.asarray(rng.normal(size=(4000, 4)))
    collapsed = jnp.asarray(np.repeat(rng.normal(size=(4000, 1)), 4, axis=1))
    mask = jnp.ones(4000)
    assert abs(float(decorrelation(independent, mask)) - 0.25) < 0.01  # only the diagonal: d / d^2
    assert abs(float(decorrelation(collapsed, mask)) - 1.0) < 1e-3


def test_centralized_reference_trains_one_client_on_the_pooled_data():
    from fedjax_lab.experiments import build_experiment, validate

    raw = {"dataset": {"name": "gaussian_mixture", "num_clients": 6, "examples_per_client": 12, "dimension": 4,
                       "num_classes": 3},
           "model": {"name": "mlp", "hidden": [8]}, "algorithm": {"name": "centralized"},
           "client": {"local_epochs": 1, "batch_size": 4}, "rounds": {"num_rounds": 2, "clients_per_round": 3}}
    experiment = build_experiment(validate(raw))
    federated = build_experiment(validate({**raw, "algorithm": {"name": "fedavg"}}))
    assert experiment.dataset.num_clients == 1 and experiment.plan.cohort_size == 1
    assert experiment.dataset.client_train_counts[0] == federated.dataset.client_train_counts.sum()
    with pytest.raises(Exception, match="server_only needs dataset.server_data"):
        build_experiment(validate({**raw, "algorithm": {"name": "server_only"}}))


def test_scaffold_correction_placements_agree_without_momentum(tiny_data, tiny_classifier):
    n = tiny_data.num_clients
    after, _ = _run(_scaffold(tiny_classifier, n, correction="after_step"), tiny_data, tiny_classifier, rounds=3)
    through, _ = _run(_scaffold(tiny_classifier, n, correction="through_optimizer"), tiny_data, tiny_classifier,
                      rounds=3)
    assert_trees_close(after.server_state.params, through.server_state.params, rtol=1e-5, atol=1e-6)
