"""Each baseline's defining property, and the pairs of methods that compose, on the tiny embedded data."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_lab.engine import (
    ClientData,
    CohortPlan,
    LocalHooks,
    LocalSchedule,
    init_loop_state,
    make_run_rounds,
    train_locally,
)
from fedjax_lab.methods.fedavg import fedavg
from fedjax_lab.methods.feddecorr import decorrelated, decorrelation
from fedjax_lab.methods.feddyn import dynamic_regularization
from fedjax_lab.methods.fedexp import extrapolation, extrapolation_step
from fedjax_lab.methods.fednova import normalised_averaging
from fedjax_lab.methods.fedprox import proximal
from fedjax_lab.methods.fedsam import sharpness_aware
from fedjax_lab.methods.moon import contrastive, cosine
from fedjax_lab.methods.scaffold import control_variates
from fedjax_lab.methods.server_optimizers import fedavg_server, reddi_server
from tests.conftest import assert_trees_close, make_inputs

STEPS = LocalSchedule(4, local_steps=3)
EPOCHS = LocalSchedule(4, local_epochs=2)


def _run(algorithm, data, classifier, rounds=2, cohort=6):
    params = classifier.init(jax.random.key(0))
    state = init_loop_state(algorithm, params, data.num_clients)
    state, metrics = make_run_rounds(algorithm, CohortPlan(data.num_clients, cohort))(
        state, make_inputs(data), num_rounds=rounds)
    return state, metrics


def _fedavg(classifier, *components, schedule=STEPS, weighting="num_examples", server=None, optimizer=None):
    return fedavg(classifier, optimizer or optax.sgd(0.1), server or fedavg_server(1.0), schedule,
                  *components, weighting=weighting)


def _fedavg_params(data, classifier, schedule=STEPS, weighting="num_examples", server=None, rounds=2):
    return _run(_fedavg(classifier, schedule=schedule, weighting=weighting, server=server), data, classifier,
                rounds)[0].server_state.params


def _scaffold(classifier, **kwargs):
    return control_variates(classifier.loss, STEPS.batch_size, **kwargs)


def test_fedprox_with_zero_mu_equals_fedavg(tiny_data, tiny_classifier):
    algorithm = _fedavg(tiny_classifier, proximal(0.0))
    state, _ = _run(algorithm, tiny_data, tiny_classifier)
    assert_trees_close(state.server_state.params, _fedavg_params(tiny_data, tiny_classifier), rtol=1e-6)


def test_fedprox_large_mu_keeps_clients_at_the_global_model(tiny_data, tiny_classifier):
    small = _run(_fedavg(tiny_classifier, proximal(0.0)),
                 tiny_data, tiny_classifier, rounds=1)[1]["update_norm"]
    large = _run(_fedavg(tiny_classifier, proximal(9.0)),
                 tiny_data, tiny_classifier, rounds=1)[1]["update_norm"]
    assert float(large[0]) < 0.5 * float(small[0])


def test_fedprox_composes_with_fedadam(tiny_data, tiny_classifier):
    server = reddi_server("adam", 0.03)
    algorithm = _fedavg(tiny_classifier, proximal(0.0), server=server)
    state, _ = _run(algorithm, tiny_data, tiny_classifier)
    assert_trees_close(state.server_state.params, _fedavg_params(tiny_data, tiny_classifier, server=server))


def _control(state, where="server"):
    return state.server_state.components["scaffold"] if where == "server" else state.client_states["scaffold"]


def test_scaffold_first_round_is_fedavg_and_controls_follow_option_ii(tiny_data, tiny_classifier):
    n = tiny_data.num_clients
    state, _ = _run(_fedavg(tiny_classifier, _scaffold(tiny_classifier)), tiny_data, tiny_classifier,
                    rounds=1)
    assert_trees_close(state.server_state.params, _fedavg_params(tiny_data, tiny_classifier, rounds=1),
                       rtol=1e-6)
    # With c = c_k = 0, option II gives the cohort's clients c_k = (x - y_k) / (K eta); the others stay at
    # zero.
    controls = _control(state, "clients")
    touched = [k for k in range(n)
               if float(optax.global_norm(jax.tree.map(lambda c, k=k: c[k], controls))) > 0]
    assert len(touched) == 6
    # The server control is the mean of all N client controls (control_average='all').
    assert_trees_close(_control(state), jax.tree.map(lambda c: jnp.mean(c, 0), controls), rtol=1e-5,
                       atol=1e-7)


def test_scaffold_server_control_stays_the_mean_of_all_client_controls(tiny_data, tiny_classifier):
    state, _ = _run(_fedavg(tiny_classifier, _scaffold(tiny_classifier)), tiny_data, tiny_classifier,
                    rounds=4)
    assert_trees_close(_control(state), jax.tree.map(lambda c: jnp.mean(c, 0), _control(state, "clients")),
                       rtol=1e-4, atol=1e-6)


def test_scaffold_option_ii_with_one_full_batch_step_equals_option_i(tiny_data, tiny_classifier):
    schedule = LocalSchedule(64, local_steps=1)
    one = _fedavg(tiny_classifier, control_variates(tiny_classifier.loss, 64, option="I"), schedule=schedule)
    two = _fedavg(tiny_classifier, control_variates(option="II"), schedule=schedule)
    s1, _ = _run(one, tiny_data, tiny_classifier, rounds=1)
    s2, _ = _run(two, tiny_data, tiny_classifier, rounds=1)
    assert_trees_close(s1.client_states, s2.client_states, rtol=1e-3, atol=1e-5)


def test_scaffold_option_i_runs_with_training_augmentation(tiny_data, tiny_classifier):
    import dataclasses

    noisy = dataclasses.replace(
        tiny_classifier,
        augment=lambda key, batch: batch["x"] + 0.01 * jax.random.normal(key, batch["x"].shape))
    state, _ = _run(_fedavg(noisy, control_variates(noisy.loss, 8, option="I")), tiny_data, noisy, rounds=1)
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(_control(state)))


def test_scaffold_correction_placements_agree_without_momentum(tiny_data, tiny_classifier):
    after, _ = _run(_fedavg(tiny_classifier, _scaffold(tiny_classifier, correction="after_step")), tiny_data,
                    tiny_classifier, rounds=3)
    through, _ = _run(_fedavg(tiny_classifier, _scaffold(tiny_classifier, correction="through_optimizer")),
                      tiny_data, tiny_classifier, rounds=3)
    assert_trees_close(after.server_state.params, through.server_state.params, rtol=1e-5, atol=1e-6)


def test_scaffold_reads_the_learning_rate_from_the_client_optimizer(tiny_data, tiny_classifier):
    # Option II's c_k = (x - y_k) / (K eta) must follow the optimiser's rate: doubling eta with the same
    # gradients steps (one step, so the trajectory is the same up to scale) leaves the control the same
    # gradient.
    schedule = LocalSchedule(64, local_steps=1)
    controls = []
    for lr in (0.05, 0.1):
        state, _ = _run(_fedavg(tiny_classifier, control_variates(), schedule=schedule,
                                optimizer=optax.sgd(lr)),
                        tiny_data, tiny_classifier, rounds=1)
        controls.append(_control(state, "clients"))
    assert_trees_close(controls[0], controls[1], rtol=1e-4, atol=1e-6)


def test_unit_step_is_fednovas_momentum_normaliser_times_the_rate(tiny_data, tiny_classifier):
    rho, tau, lr = 0.9, 7, 0.05
    client = ClientData(jnp.int32(1), jnp.asarray(tiny_data.client_train_ids[1]),
                        jnp.asarray(tiny_data.client_train_counts[1]))
    arrays = jax.device_put(tiny_data.train)
    _, stats = train_locally(tiny_classifier.init(jax.random.key(0)), tiny_classifier.loss,
                             optax.sgd(lr, momentum=rho), client, arrays, jax.random.key(1),
                             LocalSchedule(4, local_steps=tau), LocalHooks(unit_step=True))
    series = sum((1 - rho**r) / (1 - rho) for r in range(1, tau + 1))  # FedNova's a_k, Appendix
    np.testing.assert_allclose(stats.unit_step, lr * series, rtol=1e-5)


def test_fednova_with_equal_steps_equals_weighted_fedavg(tiny_data, tiny_classifier):
    state, _ = _run(_fedavg(tiny_classifier, normalised_averaging()), tiny_data, tiny_classifier)
    assert_trees_close(state.server_state.params, _fedavg_params(tiny_data, tiny_classifier), rtol=1e-5)


def test_fednova_differs_from_fedavg_when_steps_differ(tiny_data, tiny_classifier):
    state, _ = _run(_fedavg(tiny_classifier, normalised_averaging(), schedule=EPOCHS), tiny_data,
                    tiny_classifier)
    base = _fedavg_params(tiny_data, tiny_classifier, schedule=EPOCHS)
    diff = optax.global_norm(jax.tree.map(jnp.subtract, state.server_state.params, base))
    assert float(diff) > 1e-3


def test_fednova_averages_batchnorm_statistics_and_normalises_only_weights():
    from fedjax_lab.engine import Cohort, ServerContext, ServerView

    deltas = {"params": {"w": jnp.array([[2.0], [6.0]])}, "batch_stats": {"m": jnp.array([[1.0], [3.0]])}}
    a, weights = jnp.array([1.0, 3.0]), jnp.array([1.0, 1.0])
    messages, cohort = {"delta": deltas, "fednova": a}, Cohort(jnp.arange(2), jnp.array([5, 5]))
    component = normalised_averaging()
    sums = {"weight": jnp.sum(weights), "fednova": component.sums(messages, weights, cohort)}
    view = ServerView((), messages, weights, cohort, ServerContext(jax.random.key(0), jnp.int32(0), {}), None,
                      sums)
    mean = jax.tree.map(lambda d: jnp.mean(d, 0), deltas)
    out, metrics = component.aggregate(view, mean)
    np.testing.assert_allclose(out["batch_stats"]["m"], [2.0])  # the plain weighted mean of the statistics
    np.testing.assert_allclose(out["params"]["w"], [2.0 * (2.0 / 1.0 + 6.0 / 3.0) / 2])  # tau_eff * mean d_k
    np.testing.assert_allclose(metrics["tau_eff"], 2.0)


def test_feddyn_with_zero_alpha_equals_uniform_fedavg(tiny_data, tiny_classifier):
    state, _ = _run(_fedavg(tiny_classifier, dynamic_regularization(0.0), weighting="uniform"), tiny_data,
                    tiny_classifier)
    assert_trees_close(state.server_state.params,
                       _fedavg_params(tiny_data, tiny_classifier, weighting="uniform"), rtol=1e-5)


def test_feddyn_state_follows_its_update_rule(tiny_data, tiny_classifier):
    alpha, n = 0.1, tiny_data.num_clients
    state, _ = _run(_fedavg(tiny_classifier, dynamic_regularization(alpha), weighting="uniform"), tiny_data,
                    tiny_classifier, rounds=1)
    # h = -alpha/N sum_S (y_k - x) and g_k = -alpha (y_k - x): so h = (1/N) sum_k g_k over all clients.
    assert_trees_close(state.server_state.components["feddyn"],
                       jax.tree.map(lambda g: jnp.sum(g, 0) / n, state.client_states["feddyn"]), rtol=1e-5,
                       atol=1e-7)


def test_feddyn_from_a_config_averages_uniformly_by_default():
    from fedjax_lab.experiments import validate

    raw = {"dataset": {"name": "synthetic"}, "model": {"name": "logistic_regression"},
           "algorithm": {"name": "feddyn"}, "client": {"local_steps": 1}}
    assert validate(raw).algorithm.weighting == "uniform"


def test_fedexp_step_is_never_below_one_and_extrapolates_disagreeing_clients():
    same = {"w": jnp.ones((4, 3))}
    assert float(extrapolation_step(same, 1e-3)) == 1.0
    opposite = {"w": jnp.array([[1.0, 0.0], [-1.0, 0.1], [0.9, 0.0], [-1.0, 0.0]])}
    assert float(extrapolation_step(opposite, 1e-3)) > 1.0


def test_fedexp_runs_and_reports_its_step(tiny_data, tiny_classifier):
    _, metrics = _run(_fedavg(tiny_classifier, extrapolation(), weighting="uniform"), tiny_data,
                      tiny_classifier, rounds=3)
    assert np.all(np.asarray(metrics["server_step"]) >= 1.0)


def test_fedexp_reports_the_average_of_its_last_two_iterates_and_trains_on_the_last(tiny_data,
                                                                                    tiny_classifier):
    averaged = _fedavg(tiny_classifier, extrapolation(), weighting="uniform")
    plain = _fedavg(tiny_classifier, extrapolation(average_last_two=False), weighting="uniform")
    two, _ = _run(averaged, tiny_data, tiny_classifier, rounds=2)
    one, _ = _run(plain, tiny_data, tiny_classifier, rounds=1)
    two_plain, _ = _run(plain, tiny_data, tiny_classifier, rounds=2)
    # The trajectory is FedExP's own; only the reported model changes: (w_2 + w_1) / 2.
    assert_trees_close(two.server_state.params, two_plain.server_state.params, rtol=0, atol=0)
    expected = jax.tree.map(lambda a, b: (a + b) / 2, two_plain.server_state.params, one.server_state.params)
    assert_trees_close(averaged.evaluated_params(two.server_state), expected, rtol=1e-6, atol=1e-7)
    assert plain.evaluated_params(two_plain.server_state) is two_plain.server_state.params
    from fedjax_lab.experiments import validate

    assert validate({"dataset": {"name": "synthetic"}, "model": {"name": "logistic_regression"},
                     "algorithm": {"name": "fedexp"},
                     "client": {"local_steps": 1}}).algorithm.average_last_two


def test_fedsam_with_zero_rho_equals_fedavg(tiny_data, tiny_classifier):
    state, _ = _run(_fedavg(tiny_classifier, sharpness_aware(0.0)), tiny_data, tiny_classifier)
    assert_trees_close(state.server_state.params, _fedavg_params(tiny_data, tiny_classifier), rtol=1e-6)


def test_fedsam_with_positive_rho_changes_the_update(tiny_data, tiny_classifier):
    state, _ = _run(_fedavg(tiny_classifier, sharpness_aware(0.5)), tiny_data, tiny_classifier)
    diff = optax.global_norm(jax.tree.map(jnp.subtract, state.server_state.params,
                                          _fedavg_params(tiny_data, tiny_classifier)))
    assert float(diff) > 1e-4


@pytest.mark.parametrize("components", [
    lambda c: (proximal(0.1),), lambda c: (_scaffold(c, control_average="cohort"),),
    lambda c: (dynamic_regularization(0.01),)])
def test_baselines_learn_on_the_tiny_data(tiny_data, tiny_classifier, components):
    _, metrics = _run(_fedavg(tiny_classifier, *components(tiny_classifier)), tiny_data, tiny_classifier,
                      rounds=15)
    loss = np.asarray(metrics["train_loss"])
    assert np.all(np.isfinite(loss)) and loss[-3:].mean() < loss[:3].mean()


@pytest.mark.parametrize("overrides", [
    {"name": "fedprox", "mu": 0.1, "server_optimizer": "adam", "server_learning_rate": 0.03},
    {"name": "scaffold", "option": "I"}, {"name": "fednova"}, {"name": "feddyn", "alpha": 0.01},
    {"name": "fedexp"}, {"name": "fedsam", "rho": 0.05}, {"name": "moon", "mu": 1.0}, {"name": "feddecorr"},
    {"name": "scaffold", "plugins": [{"name": "fedprox", "mu": 0.01}, {"name": "moon", "mu": 1.0}]}])
def test_every_baseline_runs_from_a_config(tmp_path, overrides):
    from fedjax_lab.experiments import run_experiment, validate

    raw = {"dataset": {"name": "gaussian_mixture", "num_clients": 6, "examples_per_client": 12,
                       "dimension": 4, "num_classes": 3},
           "model": {"name": "mlp", "hidden": [8]}, "algorithm": overrides,
           "client": {"local_steps": 2, "batch_size": 4, "learning_rate": 0.1, "momentum": 0.5},
           "rounds": {"num_rounds": 2, "clients_per_round": 3}, "eval": {"every": 2, "per_client": False}}
    summary = run_experiment(validate(raw), tmp_path / overrides["name"], progress=False)
    assert np.isfinite(summary["final"]["test_loss"]) and summary["diverged"] is None


def test_moon_with_zero_mu_equals_fedavg_and_keeps_each_clients_previous_model(tiny_data, tiny_classifier):
    state, _ = _run(_fedavg(tiny_classifier, contrastive(tiny_classifier, mu=0.0)), tiny_data,
                    tiny_classifier, rounds=1)
    assert_trees_close(state.server_state.params, _fedavg_params(tiny_data, tiny_classifier, rounds=1),
                       rtol=1e-6)
    initial = tiny_classifier.init(jax.random.key(0))
    previous = state.client_states["moon"]
    changed = [k for k in range(tiny_data.num_clients)
               if float(optax.global_norm(jax.tree.map(lambda p, q, k=k: p[k] - q, previous, initial))) > 0]
    assert len(changed) == 6  # the cohort's previous models moved; the others are still the initial model


def test_moon_contrastive_term_prefers_the_global_representation():
    z = jnp.array([[1.0, 0.0], [0.0, 1.0]])
    np.testing.assert_allclose(cosine(z, z), [1.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(cosine(z, -z), [-1.0, -1.0], rtol=1e-6)


def test_feddecorr_with_zero_beta_equals_fedavg_and_its_term_is_minimal_for_decorrelated_features(
        tiny_data, tiny_classifier):
    state, _ = _run(_fedavg(tiny_classifier, decorrelated(0.0)), tiny_data, tiny_classifier)
    assert_trees_close(state.server_state.params, _fedavg_params(tiny_data, tiny_classifier), rtol=1e-6)
    rng = np.random.RandomState(0)
    independent = jnp.asarray(rng.normal(size=(4000, 4)))
    collapsed = jnp.asarray(np.repeat(rng.normal(size=(4000, 1)), 4, axis=1))
    mask = jnp.ones(4000)
    assert abs(float(decorrelation(independent, mask)) - 0.25) < 0.01  # only the diagonal: d / d^2
    assert abs(float(decorrelation(collapsed, mask)) - 1.0) < 1e-3


def test_centralized_reference_trains_one_client_on_the_pooled_data():
    from fedjax_lab.experiments import build_experiment, validate

    raw = {"dataset": {"name": "gaussian_mixture", "num_clients": 6, "examples_per_client": 12,
                       "dimension": 4, "num_classes": 3},
           "model": {"name": "mlp", "hidden": [8]}, "algorithm": {"name": "centralized"},
           "client": {"local_epochs": 1, "batch_size": 4},
           "rounds": {"num_rounds": 2, "clients_per_round": 3}}
    experiment = build_experiment(validate(raw))
    federated = build_experiment(validate({**raw, "algorithm": {"name": "fedavg"}}))
    assert experiment.dataset.num_clients == 1 and experiment.plan.cohort_size == 1
    assert experiment.dataset.client_train_counts[0] == federated.dataset.client_train_counts.sum()
    with pytest.raises(Exception, match="server_only needs dataset.server_data"):
        build_experiment(validate({**raw, "algorithm": {"name": "server_only"}}))


# ------------------------------------------------------------------------------- methods compose in one line
def test_fedprox_plus_moon_equals_each_alone_when_the_others_strength_is_zero(tiny_data, tiny_classifier):
    both = _fedavg(tiny_classifier, proximal(0.0), contrastive(tiny_classifier, mu=1.0))
    moon_only = _fedavg(tiny_classifier, contrastive(tiny_classifier, mu=1.0))
    assert_trees_close(_run(both, tiny_data, tiny_classifier)[0],
                       _run(moon_only, tiny_data, tiny_classifier)[0], rtol=1e-6)
    both = _fedavg(tiny_classifier, proximal(0.3), contrastive(tiny_classifier, mu=0.0))
    prox_only = _fedavg(tiny_classifier, proximal(0.3))
    s_both, s_prox = _run(both, tiny_data, tiny_classifier)[0], _run(prox_only, tiny_data, tiny_classifier)[0]
    assert_trees_close(s_both.server_state.params, s_prox.server_state.params, rtol=1e-6)
    assert float(optax.global_norm(jax.tree.map(jnp.subtract, s_prox.server_state.params,
                                                _fedavg_params(tiny_data, tiny_classifier)))) > 1e-4


def test_scaffold_plus_fedprox_equals_each_alone_when_the_others_strength_is_zero(tiny_data, tiny_classifier):
    both = _fedavg(tiny_classifier, _scaffold(tiny_classifier), proximal(0.0))
    scaffold_only = _fedavg(tiny_classifier, _scaffold(tiny_classifier))
    assert_trees_close(_run(both, tiny_data, tiny_classifier, rounds=3)[0],
                       _run(scaffold_only, tiny_data, tiny_classifier, rounds=3)[0], rtol=1e-5, atol=1e-7)
    # SCAFFOLD's controls start at zero, so its first round has no correction: SCAFFOLD + FedProx is FedProx.
    both = _fedavg(tiny_classifier, _scaffold(tiny_classifier), proximal(0.3))
    prox_only = _fedavg(tiny_classifier, proximal(0.3))
    assert_trees_close(_run(both, tiny_data, tiny_classifier, rounds=1)[0].server_state.params,
                       _run(prox_only, tiny_data, tiny_classifier, rounds=1)[0].server_state.params,
                       rtol=1e-6)


def test_components_with_the_same_name_are_rejected(tiny_classifier):
    with pytest.raises(ValueError, match="distinct names"):
        _fedavg(tiny_classifier, proximal(0.1), proximal(0.2))

