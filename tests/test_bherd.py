"""BHerd and GraB-FedAvg: the herding order against a NumPy Alg. 2, Proposition 1 (alpha = 1 is the base
method), what a client sends for alpha < 1, the online balancing, and the engine pieces they brought (fixed
batch order, dropped remainders, array metrics, the training objective)."""

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
    randomness,
    train_locally,
)
from fedjax_lab.methods import bherd
from fedjax_lab.methods.bherd import herded_steps, herding_order, nearest_order
from fedjax_lab.methods.fedavg import fedavg
from fedjax_lab.methods.fednova import normalised_averaging
from fedjax_lab.methods.grab import balance_step, online_balancing
from fedjax_lab.methods.scaffold import control_variates
from fedjax_lab.methods.server_optimizers import fedavg_server
from tests.conftest import assert_trees_close, make_inputs

# One epoch of floor(n_k / 3) full batches in a fixed order, as the paper: clients of 3 to 27 rows take 1 to 9
# steps.
PAPER = LocalSchedule(3, local_epochs=1, drop_remainder=True, reshuffle=False)


def numpy_herding(z: np.ndarray, k: int) -> list[int]:
    """Alg. 2 as written: centre, then k greedy picks minimising ||s + c_q|| over the remaining q."""
    c = z - z.mean(0)
    s, remaining, order = np.zeros(z.shape[1]), list(range(len(z))), []
    for _ in range(k):
        p = min(remaining, key=lambda q: (np.linalg.norm(s + c[q]), q))
        s += c[p]
        remaining.remove(p)
        order.append(p)
    return order


def _gram(z):
    return jnp.asarray(z @ z.T)


def test_herding_order_equals_numpy_alg2_with_padding_under_vmap():
    rng = np.random.default_rng(0)
    tau_max, d, trials = 12, 7, 40
    taus = rng.integers(3, tau_max + 1, trials)  # with 2 steps, c_1 = -c_2: a tie that float noise breaks
    ks = np.array([rng.integers(1, t + 1) for t in taus])
    zs = rng.normal(size=(trials, tau_max, d)) + rng.normal(size=(trials, 1, d))
    # padded steps are zeros, as the engine stores them
    zs[np.arange(tau_max)[None, :] >= taus[:, None]] = 0.0
    grams = jnp.asarray(np.einsum("tid,tjd->tij", zs, zs), jnp.float32)
    valid = jnp.asarray(np.arange(tau_max)[None, :] < taus[:, None])
    orders, selected = jax.jit(jax.vmap(herding_order))(grams, valid, jnp.asarray(ks))
    for i in range(trials):
        expected = numpy_herding(zs[i, :taus[i]], ks[i])
        assert list(np.asarray(orders[i, :ks[i]])) == expected, i
        assert (np.asarray(orders[i, ks[i]:]) == -1).all()
        assert set(np.flatnonzero(np.asarray(selected[i]))) == set(expected)


def test_first_pick_is_the_step_nearest_the_mean_and_topk_is_the_ablation():
    z = np.random.default_rng(1).normal(size=(9, 4))
    valid, distance = jnp.ones(9, bool), np.linalg.norm(z - z.mean(0), axis=1)
    order, _ = herding_order(_gram(z), valid, jnp.int32(3))
    assert int(order[0]) == int(np.argmin(distance))
    nearest, mask = nearest_order(_gram(z), valid, jnp.int32(4))
    assert list(np.asarray(nearest[:4])) == list(np.argsort(distance)[:4]) and int(mask.sum()) == 4


def test_kept_count_rounds_half_up_within_one_and_tau():
    counts = bherd.kept_count(jnp.float32(0.5), jnp.array([1, 3, 5, 120, 0]))
    assert list(np.asarray(counts)) == [1, 2, 3, 60, 1]
    assert int(bherd.kept_count(jnp.float32(0.1), jnp.int32(3))) == 1


def _run(algorithm, data, classifier, rounds=3, cohort=6):
    params = classifier.init(jax.random.key(0))
    state = init_loop_state(algorithm, params, data.num_clients)
    return make_run_rounds(algorithm, CohortPlan(data.num_clients, cohort))(state, make_inputs(data),
                                                                          num_rounds=rounds)


def _method(classifier, *components, optimizer=None):
    return fedavg(classifier, optimizer or optax.sgd(0.1), fedavg_server(1.0), PAPER, *components)


@pytest.mark.parametrize("base", ["fedavg", "scaffold", "fednova"])
def test_alpha_one_equals_the_base_method(tiny_data, tiny_classifier, base):
    """Proposition 1: keeping every step, BHerd(-SCAFFOLD, -FedNova) is FedAvg (SCAFFOLD, FedNova)."""
    parts = {"fedavg": (), "scaffold": (control_variates(),), "fednova": (normalised_averaging(),)}[base]
    plain, _ = _run(_method(tiny_classifier, *parts), tiny_data, tiny_classifier)
    herded, metrics = _run(_method(tiny_classifier, *parts, herded_steps(1.0)), tiny_data, tiny_classifier)
    assert_trees_close(herded.server_state, plain.server_state, rtol=1e-5, atol=1e-6)
    assert float(metrics["bherd_kept_fraction"][-1]) == 1.0
    assert float(jnp.max(metrics["bherd_distance"])) < 1e-3


def test_alpha_one_equals_fedavg_with_momentum(tiny_data, tiny_classifier):
    opt = optax.sgd(0.05, momentum=0.9)
    plain, _ = _run(_method(tiny_classifier, optimizer=opt), tiny_data, tiny_classifier)
    herded, _ = _run(_method(tiny_classifier, herded_steps(1.0), optimizer=opt), tiny_data, tiny_classifier)
    assert_trees_close(herded.server_state.params, plain.server_state.params, rtol=1e-5, atol=1e-6)


def test_a_client_sends_the_rescaled_sum_of_its_herd(tiny_data, tiny_classifier):
    """alpha = 0.5: the delta is (1 / alpha) times the sum of the Alg. 2 picks among the steps really
    taken."""
    algorithm = _method(tiny_classifier, herded_steps(0.5))
    params = tiny_classifier.init(jax.random.key(0))
    k = 4  # 27 rows, B = 3: 9 steps, 5 kept
    client = ClientData(jnp.int32(k), jnp.asarray(tiny_data.client_train_ids[k]),
                        jnp.int32(tiny_data.client_train_counts[k]),
                        randomness.data_key(jax.random.key(0), k))
    server_state = algorithm.server_init(params)
    message, _, _ = jax.jit(algorithm.client_update)(server_state, {}, client,
                                                     jax.device_put(tiny_data.train), jax.random.key(1))
    _, stats = train_locally(params, tiny_classifier, optax.sgd(0.1), client, jax.device_put(tiny_data.train),
                             jax.random.key(1), PAPER, LocalHooks(step_output=lambda r: r.update))
    steps = np.concatenate([np.asarray(x).reshape(9, -1) for x in jax.tree.leaves(stats.step_outputs)],
                           axis=1)
    picks = numpy_herding(steps.astype(np.float64), 5)
    expected = steps[picks].sum(0) / 0.5
    sent = np.concatenate([np.asarray(x).reshape(-1) for x in jax.tree.leaves(message["delta"])])
    np.testing.assert_allclose(sent, expected, rtol=1e-4, atol=1e-6)
    assert sorted(np.flatnonzero(np.asarray(message["bherd"]["selected"]))) == sorted(picks)
    mean_gap = np.linalg.norm(steps[picks].mean(0) - steps.mean(0)) / 0.1  # in gradient units
    np.testing.assert_allclose(float(message["bherd"]["distance"]), mean_gap, rtol=1e-3)


def test_selection_runs_inside_the_jitted_round_without_host_callbacks(tiny_data, tiny_classifier):
    algorithm = _method(tiny_classifier, herded_steps(0.5))
    state = init_loop_state(algorithm, tiny_classifier.init(jax.random.key(0)), tiny_data.num_clients)
    run = make_run_rounds(algorithm, CohortPlan(tiny_data.num_clients, 6))
    inputs = make_inputs(tiny_data)
    jaxpr = str(jax.make_jaxpr(run, static_argnums=2)(state, inputs, 2))
    assert "callback" not in jaxpr and "argmin" in jaxpr
    with jax.transfer_guard("disallow"):
        state, metrics = run(state, inputs, num_rounds=2)
    assert metrics["bherd_selected"].shape == (2, 6, PAPER.max_steps(tiny_data.client_train_ids.shape[1]))


def test_grab_balancing_equals_numpy_alg4_and_its_fraction_is_a_fraction(tiny_data, tiny_classifier):
    rng = np.random.default_rng(2)
    u = rng.normal(size=(10, 5)).astype(np.float32)
    carry = {"m": jnp.zeros(5), "s": jnp.zeros(5), "g": jnp.zeros(5), "count": jnp.int32(0),
             "count_seen": jnp.int32(0)}
    for step in u:
        carry = balance_step(carry, jnp.asarray(step), jnp.float32(10))
    m, s, g, count = np.zeros(5), np.zeros(5), np.zeros(5), 0
    for z in u:
        m = m + z / 10
        c = z - m
        if np.linalg.norm(s + c) < np.linalg.norm(s - c):
            s, g, count = s + c, g + z, count + 1
        else:
            s = s - c
    np.testing.assert_allclose(np.asarray(carry["g"]), g, rtol=1e-5, atol=1e-6)
    assert int(carry["count"]) == count
    _, metrics = _run(_method(tiny_classifier, online_balancing(PAPER)), tiny_data, tiny_classifier)
    assert 0.0 < float(metrics["grab_selected_fraction"][-1]) <= 1.0


def _selected_fraction(steps, centering):
    carry = {k: jnp.zeros(steps.shape[1]) for k in ("m", "s", "g")}
    carry.update(count=jnp.int32(0), count_seen=jnp.int32(0))
    for step in steps:
        carry = balance_step(carry, jnp.asarray(step), jnp.float32(len(steps)), centering)
    return int(carry["count"]) / len(steps), np.asarray(carry["m"])


def test_grab_running_mean_centering_balances_the_steps_less_their_running_mean():
    # The variant centres each step on the mean of the steps so far (Alg. 4 centres it on a partial sum over
    # tau): the same balance, a different c; checked against a NumPy loop.
    rng = np.random.default_rng(3)
    steps = rng.normal(size=(12, 6)).astype(np.float32) + 1.0
    fraction, m = _selected_fraction(steps, "running_mean")
    mean, s, count = np.zeros(6), np.zeros(6), 0
    for j, z in enumerate(steps, 1):
        mean = mean + (z - mean) / j
        c = z - mean
        if s @ c < 0:
            s, count = s + c, count + 1
        else:
            s = s - c
    np.testing.assert_allclose(m, steps.mean(0), rtol=1e-5)
    assert fraction == count / len(steps)


def test_fixed_batch_order_repeats_across_rounds_and_reshuffling_does_not(tiny_data, tiny_classifier):
    def batches(schedule, round_index):
        k = 1
        key = randomness.client_key(jax.random.key(0), round_index, k)
        client = ClientData(jnp.int32(k), jnp.asarray(tiny_data.client_train_ids[k]),
                            jnp.int32(tiny_data.client_train_counts[k]),
                            randomness.data_key(jax.random.key(0), k))
        _, stats = train_locally(tiny_classifier.init(jax.random.key(0)), tiny_classifier, optax.sgd(0.1),
                                 client, jax.device_put(tiny_data.train), key, schedule,
                                 LocalHooks(step_output=lambda r: r.batch["y"] * 0 + r.batch["x"][:, 0]))
        return np.asarray(stats.step_outputs)

    reshuffled = LocalSchedule(3, local_epochs=1, drop_remainder=True)
    np.testing.assert_array_equal(batches(PAPER, 0), batches(PAPER, 5))
    assert not np.array_equal(batches(reshuffled, 0), batches(reshuffled, 5))


def test_drop_remainder_takes_floor_n_over_b_full_batches():
    sizes = jnp.array([3, 25, 7, 2])
    assert list(np.asarray(PAPER.client_steps(sizes))) == [1, 8, 2, 1]
    assert list(np.asarray(LocalSchedule(3, local_epochs=1).client_steps(sizes))) == [1, 9, 3, 1]
    assert PAPER.max_steps(27) == 9


def test_memory_check_names_a_chunk_that_fits():
    bherd.check_memory(430_698, 120, 1, 5, budget=2**29)
    with pytest.raises(ValueError, match=r"bherd stores 120 steps x 430,698 .* set rounds.chunk_size=1"):
        bherd.check_memory(430_698, 120, 5, 5, budget=2**29)


BHERD_RAW = {
    "seed": 1,
    "dataset": {"name": "gaussian_mixture", "num_clients": 4, "examples_per_client": 30, "dimension": 6,
                "num_classes": 3},
    "model": {"name": "mlp", "hidden": [8]},
    "algorithm": {"name": "bherd", "alpha": 0.5},
    "client": {"learning_rate": 0.1, "batch_size": 4, "local_epochs": 1, "drop_remainder": True,
               "batch_order": "fixed"},
    "rounds": {"num_rounds": 6, "clients_per_round": 4},
    "eval": {"every": 2, "train": True},
    "checkpoint": {"every_blocks": 1},
}


def test_a_resumed_bherd_run_keeps_its_selection_maps_and_training_objective(tmp_path):
    """The array metrics (selected steps per client) are written per block, truncated on resume, and joined;
    the full training objective is reported beside the test metrics."""
    from fedjax_lab.experiments import build_experiment, run_experiment, validate
    from fedjax_lab.experiments.run_directory import read_arrays, read_metrics

    config = validate(BHERD_RAW)
    experiment = build_experiment(config)
    run_experiment(config, tmp_path / "whole", progress=False, experiment=experiment)
    run_experiment(config, tmp_path / "split", progress=False, experiment=experiment, stop_after_round=4)
    # as if cut off after round 4
    (tmp_path / "split" / "arrays" / "rounds_000005_000006.npz").write_bytes(b"")
    run_experiment(config, tmp_path / "split", progress=False, experiment=experiment, resume=True)
    whole, split = read_arrays(tmp_path / "whole"), read_arrays(tmp_path / "split")
    assert list(whole["round"]) == list(range(1, 7)) and whole["bherd_selected"].shape[:2] == (6, 4)
    for name in ("bherd_selected", "bherd_distance", "bherd_client_ids"):
        np.testing.assert_array_equal(whole[name], split[name])
    kept = whole["bherd_selected"].sum(-1)
    steps = np.asarray(experiment.dataset.client_train_counts)[whole["bherd_client_ids"]] // 4
    np.testing.assert_array_equal(kept, np.floor(0.5 * steps + 0.5))
    last = read_metrics(tmp_path / "whole")[-1]
    assert {"full_train_loss", "full_train_accuracy", "test_accuracy"} <= set(last)


def test_full_train_objective_includes_the_l2_term():
    from fedjax_lab.engine import Evaluator
    from fedjax_lab.models import Classifier, LinearSVM

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(50, 6)).astype(np.float32), rng.integers(0, 2, 50).astype(np.int32)
    clf = Classifier(LinearSVM(), (6,), objective="squared_hinge", l2=0.1)
    params = {"params": {"output": {"kernel": jnp.asarray(rng.normal(size=(6, 1)), jnp.float32)}}}
    out = Evaluator(clf.example_metrics, {"x": x, "y": y}, 16, prefix="full_train", l2=0.1)(params)
    w = np.asarray(jax.tree.leaves(params)[0]).reshape(-1)
    signs = 2.0 * y - 1.0
    objective = 0.05 * w @ w + np.mean(0.5 * np.maximum(0, 1 - signs * (x @ w)) ** 2)
    np.testing.assert_allclose(out["full_train_loss"], objective, rtol=1e-5)
    assert set(out) == {"full_train_loss", "full_train_accuracy"}


def test_alpha_outside_zero_one_is_refused_naming_the_field():
    from fedjax_lab.experiments import ConfigError, validate

    for alpha in (0.0, 1.5):
        with pytest.raises(ConfigError, match="algorithm.alpha: Input should be (greater than 0|less than or "
                                              "equal to 1)"):
            validate({**BHERD_RAW, "algorithm": {"name": "bherd", "alpha": alpha}})
    with pytest.raises(ConfigError, match="algorithm.plugins.0.selection"):
        validate({**BHERD_RAW, "algorithm": {"name": "scaffold",
                                             "plugins": [{"name": "bherd", "selection": "top"}]}})
