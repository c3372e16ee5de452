"""The asynchronous round and FedAsync, FedBuff, CA2FL: reductions to the synchronous round, the dispatch and
arrival bookkeeping, the store's bounds, the cache, chunking and seeds, config and resume."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import assert_trees_close, make_inputs

from fedjax_lab.engine import (
    ClientData,
    Cohort,
    CohortPlan,
    LocalSchedule,
    ServerContext,
    ServerView,
    init_loop_state,
    make_run_rounds,
    randomness,
)
from fedjax_lab.engine.asynchrony import DelayModel, check_store_memory, sample_idle, store_capacity
from fedjax_lab.engine.sampling import sample_cohort
from fedjax_lab.engine.simulation import message_shapes, run_round
from fedjax_lab.experiments import ConfigError, build_experiment, run_experiment, validate
from fedjax_lab.experiments.run_directory import read_arrays, read_metrics
from fedjax_lab.methods.ca2fl import cached_calibration
from fedjax_lab.methods.fedasync import mixing
from fedjax_lab.methods.fedavg import fedavg
from fedjax_lab.methods.fedprox import proximal
from fedjax_lab.methods.server_optimizers import fedavg_server
from fedjax_lab.methods.staleness import staleness_function

SCHEDULE = LocalSchedule(4, local_steps=3)


def _fedavg(classifier, *components, weighting="num_examples", server_lr=1.0):
    return fedavg(classifier.loss, optax.sgd(0.1), fedavg_server(server_lr), SCHEDULE, *components,
                  weighting=weighting)


def _run(algorithm, plan, data, classifier, rounds, seed=0):
    inputs = make_inputs(data, seed)
    state = init_loop_state(algorithm, classifier.init(jax.random.key(0)), data.num_clients, plan, inputs)
    return make_run_rounds(algorithm, plan)(state, inputs, num_rounds=rounds)


def _params(state):
    return state.server_state.params


# ------------------------------------------------------------------------------- reductions to the sync round
def test_zero_delay_asynchronous_round_equals_synchronous_fedavg(tiny_data, tiny_classifier):
    algorithm = _fedavg(tiny_classifier)
    sync, m_sync = _run(algorithm, CohortPlan(tiny_data.num_clients, 5), tiny_data, tiny_classifier, 4)
    plan = CohortPlan(tiny_data.num_clients, 5, delay=DelayModel("zero"))
    asynchronous, m_async = _run(algorithm, plan, tiny_data, tiny_classifier, 4)
    assert_trees_close(_params(sync), _params(asynchronous))
    np.testing.assert_allclose(m_sync["train_loss"], m_async["train_loss"], rtol=1e-6)
    np.testing.assert_array_equal(m_async["arrivals"], 5)
    np.testing.assert_array_equal(m_async["staleness_max"], 0)


def test_zero_delay_sampling_draws_the_synchronous_cohort():
    key = jax.random.key(7)
    ids, dispatched = sample_idle(key, jnp.zeros(20, bool), 6, jnp.int32(20))
    np.testing.assert_array_equal(ids, sample_cohort(key, 20, 6))
    assert bool(jnp.all(dispatched))


def test_fedbuff_with_buffer_equal_to_cohort_and_zero_delay_equals_fedavg(tiny_data, tiny_classifier):
    algorithm = _fedavg(tiny_classifier, weighting="uniform", server_lr=0.7)
    sync, _ = _run(algorithm, CohortPlan(tiny_data.num_clients, 4), tiny_data, tiny_classifier, 3)
    buffered, metrics = _run(algorithm, CohortPlan(tiny_data.num_clients, 4, buffer_size=4), tiny_data,
                             tiny_classifier, 3)
    assert_trees_close(_params(sync), _params(buffered))
    np.testing.assert_array_equal(metrics["server_steps"], 1)


def test_fedbuff_flushes_mid_round_each_time_the_buffer_fills(tiny_data, tiny_classifier):
    # Cohort 6, buffer 2, zero delay: three server steps a round, each on the mean of two updates computed
    # from the same model, so with SGD at rate 1 the round moves by 3x the cohort mean: FedAvg at server rate
    # 3.
    sync, _ = _run(_fedavg(tiny_classifier, weighting="uniform", server_lr=3.0),
                   CohortPlan(tiny_data.num_clients, 6), tiny_data, tiny_classifier, 2)
    buffered, metrics = _run(_fedavg(tiny_classifier, weighting="uniform"),
                             CohortPlan(tiny_data.num_clients, 6, buffer_size=2), tiny_data,
                             tiny_classifier, 2)
    assert_trees_close(_params(sync), _params(buffered), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(metrics["server_steps"], 3)
    np.testing.assert_array_equal(metrics["buffer_fill"], 0)


def test_fedasync_with_alpha_one_and_one_client_per_round_equals_sequential_fedavg(tiny_data,
                                                                                   tiny_classifier):
    sequential, _ = _run(_fedavg(tiny_classifier), CohortPlan(tiny_data.num_clients, 1), tiny_data,
                         tiny_classifier, 5)
    fedasync = _fedavg(tiny_classifier, mixing(1.0, staleness_function("polynomial", 0.5)))
    mixed, metrics = _run(fedasync, CohortPlan(tiny_data.num_clients, 1, buffer_size=1), tiny_data,
                          tiny_classifier, 5)
    assert_trees_close(_params(sequential), _params(mixed))
    np.testing.assert_allclose(metrics["fedasync_rate"], 1.0)


def test_fedasync_client_proximal_term_is_fedprox_in_the_client_and_rho_zero_is_the_plain_client(
        tiny_data, tiny_classifier):
    # Alg. 1's client objective f(x) + rho/2 ||x - x_tau||^2 is FedProx's term with mu = rho: with alpha 1 and
    # one client a round (sequential FedAvg) FedAsync(rho) equals FedProx(rho); rho 0 equals the plain client.
    plan, stale = CohortPlan(tiny_data.num_clients, 1, buffer_size=1), staleness_function("polynomial", 0.5)
    fedprox, _ = _run(_fedavg(tiny_classifier, proximal(0.3)), CohortPlan(tiny_data.num_clients, 1),
                      tiny_data, tiny_classifier, 4)
    with_rho, _ = _run(_fedavg(tiny_classifier, mixing(1.0, stale, rho=0.3)), plan, tiny_data,
                       tiny_classifier, 4)
    assert_trees_close(_params(fedprox), _params(with_rho))
    plain = mixing(1.0, stale)._replace(loss_term=None)  # FedAsync as it was, without the client term
    before, _ = _run(_fedavg(tiny_classifier, plain), plan, tiny_data, tiny_classifier, 4)
    zero, _ = _run(_fedavg(tiny_classifier, mixing(1.0, stale, rho=0.0)), plan, tiny_data, tiny_classifier, 4)
    assert_trees_close(_params(before), _params(zero), rtol=0, atol=0)
    assert not np.allclose(jax.tree.leaves(_params(before))[0], jax.tree.leaves(_params(with_rho))[0])


def test_fedasync_mixes_the_trained_model_into_the_current_one_with_a_staleness_weight():
    w = {"w": jnp.array([1.0, 1.0])}
    trained = {"w": jnp.array([[3.0, 1.0]])}  # trained from an older model, 2 rounds stale
    view = ServerView((), {"delta": {"w": jnp.zeros((1, 2))}, "fedasync": trained}, jnp.ones(1),
                      Cohort(jnp.zeros(1, jnp.int32), jnp.ones(1, jnp.int32), None, jnp.array([2])),
                      ServerContext(jax.random.key(0), jnp.int32(0), {}), w)
    step, _ = mixing(0.5, staleness_function("polynomial", 1.0)).aggregate(view, None)
    # a_t = 0.5 / (1 + 2); w + a_t (w_new - w) = (1 + 2/6, 1)
    np.testing.assert_allclose(step["w"], [2.0 / 6.0, 0.0], rtol=1e-6)


def test_fedbuff_staleness_scaling_weighs_each_update_by_one_over_sqrt_one_plus_staleness():
    from fedjax_lab.methods.fedbuff import staleness_scaled

    deltas = {"w": jnp.array([[4.0], [4.0]])}
    view = ServerView((), {"delta": deltas}, jnp.ones(2),
                      Cohort(jnp.arange(2), jnp.ones(2, jnp.int32), None, jnp.array([0, 3])),
                      ServerContext(jax.random.key(0), jnp.int32(0), {}), {"w": jnp.zeros(1)})
    step, metrics = staleness_scaled(staleness_function("polynomial", 0.5)).aggregate(view, None)
    np.testing.assert_allclose(step["w"], [(4.0 + 4.0 / 2.0) / 2], rtol=1e-6)  # (1/K) sum s(tau) Delta
    np.testing.assert_allclose(metrics["fedbuff_scale"], 0.75, rtol=1e-6)


def test_staleness_functions():
    tau = jnp.array([0, 1, 3, 8])
    np.testing.assert_allclose(staleness_function("constant")(tau), 1.0)
    np.testing.assert_allclose(staleness_function("polynomial", 0.5)(tau),
                               1 / np.sqrt(1 + np.array([0, 1, 3, 8])))
    np.testing.assert_allclose(staleness_function("hinge", 2.0, 3.0)(tau), [1, 1, 1, 1 / 11])


# --------------------------------------------------------------------------------------- dispatch and arrival
def _step_rounds(algorithm, plan, data, classifier, rounds, seed=0):
    """Runs round by round; returns the loop states before each round and the metrics of each."""
    inputs = make_inputs(data, seed)
    state = init_loop_state(algorithm, classifier.init(jax.random.key(0)), data.num_clients, plan, inputs)
    step = jax.jit(lambda s: run_round(algorithm, plan, s, inputs))
    states, metrics = [state], []
    for _ in range(rounds):
        state, m = step(state)
        states.append(state)
        metrics.append(jax.tree.map(np.asarray, m))
    return states, metrics, inputs


class _Recorder:
    """Wraps an algorithm so that the server reports which clients each step received and their staleness,
    both plus one (a round without a server step reports zeros)."""

    @staticmethod
    def wrap(algorithm):
        def server_update(state, messages, cohort, context):
            state, metrics = algorithm.server_update(state, messages, cohort, context)
            mask = cohort.mask if cohort.mask is not None else jnp.ones_like(cohort.client_ids, bool)
            return state, {**metrics, "seen": jnp.where(mask, cohort.client_ids + 1, 0),
                           "seen_staleness": jnp.where(mask, cohort.staleness + 1, 0)}

        return algorithm._replace(server_update=server_update)


def test_busy_clients_are_never_dispatched_and_every_job_arrives_once_at_its_drawn_round(tiny_data,
                                                                                         tiny_classifier):
    delay = DelayModel("half_normal", sigma=2.0)
    plan = CohortPlan(tiny_data.num_clients, 3, delay=delay)
    states, metrics, inputs = _step_rounds(_Recorder.wrap(_fedavg(tiny_classifier)), plan, tiny_data,
                                           tiny_classifier, 14)
    expected = []  # (arrival round, client, staleness) of every dispatched job
    for r in range(14):
        before, after, m = states[r].asynchrony.in_flight, states[r + 1].asynchrony.in_flight, metrics[r]
        busy = set(np.asarray(before.client_id)[np.asarray(before.occupied)])
        new = np.asarray(after.occupied) & (np.asarray(after.dispatch_round) == r)
        arrived_now = [(c - 1, s - 1) for c, s in zip(m["seen"], m["seen_staleness"]) if c > 0 and s == 1]
        dispatched = sorted([int(c) for c in np.asarray(after.client_id)[new]]
                            + [int(c) for c, _ in arrived_now])
        assert len(dispatched) == m["dispatched"] == 3 - m["not_dispatched"]
        assert not busy & set(dispatched), f"round {r}: dispatched busy clients {busy & set(dispatched)}"
        delays = np.asarray(delay.sample(
            randomness.round_key(inputs.key, jnp.int32(r), randomness.Purpose.DELAY), (3,)))
        positions = {int(c): int(p) for c, p in zip(np.asarray(after.client_id)[new],
                                                    np.asarray(after.position)[new])}
        for c in dispatched:
            tau = int(delays[positions[c]]) if c in positions else 0
            expected.append((r + tau, c, tau))
    seen = [(r, int(c) - 1, int(s) - 1) for r, m in enumerate(metrics)
            for c, s in zip(m["seen"], m["seen_staleness"]) if c > 0]
    in_flight = {(int(a), int(c), int(a - d)) for a, c, d, o in zip(
        *(np.asarray(getattr(states[-1].asynchrony.in_flight, f))
          for f in ("arrival_round", "client_id", "dispatch_round", "occupied"))) if o}
    assert sorted(seen) == sorted(e for e in expected if e[0] < 14)
    assert in_flight == {e for e in expected if e[0] >= 14}
    assert max(s for _, _, s in seen) > 0


def test_fixed_delay_round_applies_each_update_trained_from_the_model_it_was_sent(tiny_data, tiny_classifier):
    # An independent hand-staled FedAvg: with every delay d, the step of round r is the size-weighted mean of
    # the updates of the clients dispatched at r - d, each trained from w^{r-d} (not from w^r), so
    # w^{r+1} = w^r + sum_j n_j Delta_j(w^{r-d}) / sum_j n_j, and w^{r+1} = w^r for r < d.
    algorithm, d, rounds = _fedavg(tiny_classifier), 2, 7
    plan = CohortPlan(tiny_data.num_clients, 3, delay=DelayModel("fixed", rounds=d))
    states, _, inputs = _step_rounds(algorithm, plan, tiny_data, tiny_classifier, rounds)
    train_one = jax.jit(lambda server_state, c, key: algorithm.client_update(
        server_state, {}, ClientData(c, inputs.client_example_ids[c], inputs.client_num_examples[c],
                                     randomness.data_key(inputs.key, c)), inputs.train_arrays, key)[0])
    for r in range(rounds):
        expected = _params(states[r])
        if r >= d:
            sent = states[r - d + 1].asynchrony.in_flight  # the store just after round r - d dispatched
            ids = [int(c) for c, o, k in zip(sent.client_id, sent.occupied, sent.dispatch_round)
                   if o and k == r - d]
            assert len(ids) == 3
            sizes = np.array([int(inputs.client_num_examples[c]) for c in ids], np.float32)
            deltas = [train_one(states[r - d].server_state, jnp.int32(c),
                                randomness.client_key(inputs.key, jnp.int32(r - d), jnp.int32(c)))["delta"]
                      for c in ids]
            weights = sizes / sizes.sum()
            step = jax.tree.map(lambda *x, w=weights: sum(n * v for n, v in zip(w, x)), *deltas)
            expected = jax.tree.map(jnp.add, expected, step)
        assert_trees_close(_params(states[r + 1]), expected, rtol=1e-5, atol=1e-6)
    assert not all(jax.tree.leaves(jax.tree.map(lambda a, b: bool(jnp.allclose(a, b)), _params(states[d]),
                                                _params(states[rounds]))))


def test_no_arrival_means_no_server_step(tiny_data, tiny_classifier):
    algorithm = _fedavg(tiny_classifier)
    plan = CohortPlan(tiny_data.num_clients, 3, delay=DelayModel("fixed", rounds=2))
    _state, metrics = _run(algorithm, plan, tiny_data, tiny_classifier, 3)
    np.testing.assert_array_equal(metrics["arrivals"], [0, 0, 3])
    np.testing.assert_array_equal(metrics["staleness_max"], [0, 0, 2])
    two, _ = _run(algorithm, plan, tiny_data, tiny_classifier, 2)
    assert_trees_close(_params(two), tiny_classifier.init(jax.random.key(0)))


def test_store_capacity_bounds_the_jobs_in_flight_and_a_smaller_one_limits_dispatch_visibly(tiny_data,
                                                                                          tiny_classifier):
    delay = DelayModel("fixed", rounds=3)
    assert store_capacity(1000, 10, DelayModel("half_normal", sigma=5.0)) == 10 * 21
    assert store_capacity(100, 10, DelayModel("half_normal", sigma=5.0)) == 100
    assert store_capacity(12, 3, delay) == 12
    limited = CohortPlan(tiny_data.num_clients, 3, delay=delay, max_in_flight=5)
    _, metrics = _run(_fedavg(tiny_classifier), limited, tiny_data, tiny_classifier, 6)
    assert int(np.max(metrics["in_flight"])) <= 5
    np.testing.assert_array_equal(metrics["dispatched"][:2], [3, 2])
    assert int(np.sum(metrics["not_dispatched"])) > 0
    assert int(np.sum(metrics["dispatched"])) == int(np.sum(metrics["arrivals"]) + metrics["in_flight"][-1])
    # With few idle clients, fewer are dispatched and the rest are reported.
    crowded = CohortPlan(tiny_data.num_clients, 5, delay=DelayModel("fixed", rounds=4))
    _, metrics = _run(_fedavg(tiny_classifier), crowded, tiny_data, tiny_classifier, 4)
    np.testing.assert_array_equal(metrics["dispatched"], [5, 5, 2, 0])
    with pytest.raises(ValueError, match="max_in_flight must be >= cohort_size"):
        CohortPlan(12, 3, delay=delay, max_in_flight=2)


def test_a_store_that_does_not_fit_is_refused_before_compiling(tiny_data, tiny_classifier):
    algorithm = _fedavg(tiny_classifier)
    shapes = message_shapes(algorithm, tiny_classifier.init(jax.random.key(0)), make_inputs(tiny_data))
    check_store_memory(shapes, 12, 4, budget=1 << 30)
    with pytest.raises(ValueError, match="asynchrony.max_delay or asynchrony.max_in_flight"):
        check_store_memory(shapes, 12, 4, budget=100)


# ----------------------------------------------------------------------------------------------------- CA2FL
def test_ca2fl_calibrates_with_the_cache_and_keeps_each_clients_latest_update():
    component = cached_calibration(num_clients=4)
    params = {"w": jnp.zeros(2)}
    state = component.server_init(params)
    state = state._replace(cache={"w": jnp.array([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [0.0, 0.0]])},
                           mean={"w": jnp.array([0.75, 0.75])})
    deltas = {"w": jnp.array([[3.0, 3.0], [1.0, 1.0], [5.0, 5.0]])}  # clients 0, 2, then 0 again
    cohort = Cohort(jnp.array([0, 2, 0]), jnp.ones(3, jnp.int32))
    view = ServerView(state, {"delta": deltas}, jnp.ones(3), cohort,
                      ServerContext(jax.random.key(0), jnp.int32(0), {}, 4), params)
    v, _ = component.aggregate(view, None)
    # h_bar + mean(Delta_i - h_i) = 0.75 + ((3,3)-(1,0) + (1,1)-(2,2) + (5,5)-(1,0)) / 3
    np.testing.assert_allclose(v["w"], [0.75 + (2 - 1 + 4) / 3, 0.75 + (3 - 1 + 5) / 3], rtol=1e-6)
    new, _, _ = component.after_step(view, params)
    np.testing.assert_allclose(new.cache["w"], [[5, 5], [0, 1], [1, 1], [0, 0]])
    np.testing.assert_allclose(new.mean["w"], np.mean(new.cache["w"], 0))


def test_ca2fl_cache_holds_each_clients_latest_stepped_update_through_the_asynchronous_loop(tiny_data,
                                                                                              tiny_classifier):
    algorithm = _fedavg(tiny_classifier, cached_calibration(tiny_data.num_clients), weighting="uniform")
    # A one-round delay keeps every job in the store for a round, so the test sees every update sent.
    plan = CohortPlan(tiny_data.num_clients, 3, delay=DelayModel("fixed", rounds=1), buffer_size=2)
    states, _, _ = _step_rounds(algorithm, plan, tiny_data, tiny_classifier, 8)
    kernel = lambda tree: np.asarray(tree["delta"]["params"]["output"]["kernel"])
    jobs = []  # (dispatch round, position, client, delta), in arrival order
    for r in range(7):
        store = states[r + 1].asynchrony.in_flight
        new = np.flatnonzero(np.asarray(store.occupied) & (np.asarray(store.dispatch_round) == r))
        jobs += sorted((r, int(store.position[i]), int(store.client_id[i]), kernel(store.messages)[i])
                       for i in new)
    expected = np.zeros((tiny_data.num_clients,) + jobs[0][3].shape, np.float32)
    for start in range(0, len(jobs) - len(jobs) % 2, 2):  # every full buffer of two arrivals was stepped on
        for _, _, client, delta in jobs[start:start + 2]:
            expected[client] = delta
    cache = states[-1].server_state.components["ca2fl"]
    np.testing.assert_allclose(cache.cache["params"]["output"]["kernel"], expected, rtol=1e-6)
    np.testing.assert_allclose(cache.mean["params"]["output"]["kernel"], expected.mean(0), rtol=1e-5,
                               atol=1e-7)


# ------------------------------------------------------------------------------------ chunking, seeds, sweeps
@pytest.mark.parametrize("chunk_size", [1, 3])
def test_asynchronous_results_do_not_depend_on_chunk_size(tiny_data, tiny_classifier, chunk_size):
    algorithm = _fedavg(tiny_classifier, weighting="uniform")
    plan = CohortPlan(tiny_data.num_clients, 3, delay=DelayModel("half_normal", sigma=2.0), buffer_size=2)
    whole, m_whole = _run(algorithm, plan, tiny_data, tiny_classifier, 6)
    chunked, m_chunked = _run(algorithm, dataclasses.replace(plan, chunk_size=chunk_size), tiny_data,
                              tiny_classifier, 6)
    assert_trees_close(_params(whole), _params(chunked))
    np.testing.assert_array_equal(m_whole["arrivals"], m_chunked["arrivals"])


def test_asynchronous_runs_are_deterministic_from_the_seed(tiny_data, tiny_classifier):
    algorithm = _fedavg(tiny_classifier)
    plan = CohortPlan(tiny_data.num_clients, 3, delay=DelayModel("half_normal", sigma=2.0))
    a, ma = _run(algorithm, plan, tiny_data, tiny_classifier, 5, seed=1)
    b, mb = _run(algorithm, plan, tiny_data, tiny_classifier, 5, seed=1)
    c, mc = _run(algorithm, plan, tiny_data, tiny_classifier, 5, seed=2)
    assert all(jax.tree.leaves(jax.tree.map(lambda x, y: bool(jnp.array_equal(x, y)), (a, ma), (b, mb))))
    assert not np.array_equal(ma["arrivals"], mc["arrivals"]) or not np.allclose(
        _params(a)["params"]["output"]["kernel"], _params(c)["params"]["output"]["kernel"])


# --------------------------------------------------------------------------------------- configs and runs
RAW = {
    "seed": 1,
    "dataset": {"name": "gaussian_mixture", "num_clients": 10, "examples_per_client": 16, "dimension": 5,
                "num_classes": 3},
    "model": {"name": "mlp", "hidden": [8]},
    "algorithm": {"name": "fedbuff", "buffer_size": 3},
    "client": {"optimizer": "adam", "learning_rate": 0.01, "batch_size": 4, "local_steps": 3},
    "rounds": {"num_rounds": 6, "clients_per_round": 3},
    "asynchrony": {"sigma": 2.0},
    "eval": {"every": 2, "per_client": False},
    "checkpoint": {"every_blocks": 1},
}


@pytest.mark.parametrize("raw, message", [
    ({"asynchrony": {"delay": "later"}}, "asynchrony.delay"),
    ({"asynchrony": {"sigma": -1}}, "asynchrony.sigma"),
    ({"asynchrony": {"max_in_flight": 2}}, "asynchrony.max_in_flight must be >= rounds.clients_per_round"),
    ({"algorithm": {"name": "fedasync", "alpha": 1.5}}, "alpha"),
    ({"algorithm": {"name": "centralized"}}, "reference run 'centralized' has no clients to wait for"),
])
def test_bad_asynchrony_configs_are_refused_with_the_field(raw, message):
    with pytest.raises(ConfigError, match=message):
        validate({**RAW, **raw})


@pytest.mark.parametrize("name", ["fedavg", "fedasync", "fedbuff", "ca2fl"])
def test_each_asynchronous_method_runs_from_its_config_and_learns(tmp_path, name):
    config = validate({**RAW, "algorithm": {"name": name},
                       "rounds": {"num_rounds": 12, "clients_per_round": 3},
                       "eval": {"every": 6, "per_client": False}})
    summary = run_experiment(config, tmp_path, progress=False)
    rows = read_metrics(tmp_path)
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"] + 0.1, (name, rows[0], rows[-1])
    assert {"arrivals", "dispatched", "in_flight", "staleness_mean", "staleness_max"} <= rows[1].keys()
    assert read_arrays(tmp_path)["staleness_counts"].shape == (12, 9)
    assert summary["rounds"] == 12


def test_resumed_asynchronous_run_equals_uninterrupted_run(tmp_path):
    config = validate(RAW)
    experiment = build_experiment(config)
    run_experiment(config, tmp_path / "whole", progress=False, experiment=experiment)
    run_experiment(config, tmp_path / "split", progress=False, experiment=experiment, stop_after_round=3)
    run_experiment(config, tmp_path / "split", progress=False, experiment=experiment, resume=True)
    whole, split = read_metrics(tmp_path / "whole"), read_metrics(tmp_path / "split")
    assert [r["round"] for r in split] == list(range(7))
    for a, b in zip(whole, split):
        np.testing.assert_allclose([a[k] for k in sorted(a)], [b[k] for k in sorted(b)], rtol=1e-6)


def test_a_sweep_over_seeds_of_an_asynchronous_run_equals_the_separate_runs(tmp_path):
    from fedjax_lab.experiments.run_directory import RunDirectory
    from fedjax_lab.experiments.sweep import expand, run_sweep

    config = validate({**RAW, "rounds": {"num_rounds": 4, "clients_per_round": 3}})
    grid = {"seed": [0, 1]}
    run_sweep(config, grid, tmp_path / "sweep", progress=False)
    for member in expand(config, grid):
        run_experiment(member.config, tmp_path / "alone" / member.name, progress=False)
        experiment = build_experiment(member.config)
        together, alone = (RunDirectory(tmp_path / d / member.name).restore_checkpoint(
                               experiment.initial_state()) for d in ("sweep", "alone"))
        assert_trees_close(together.server_state.params, alone.server_state.params, rtol=1e-4, atol=1e-6)
        np.testing.assert_array_equal(together.asynchrony.in_flight.client_id,
                                      alone.asynchrony.in_flight.client_id)
