"""User-level DP: the mechanism against FedAvg and against its definition, the accountant against
dp-accounting called directly, adaptive clipping against its target, and privacy on the sweep axis."""

import json
import math

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import make_inputs
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from fedjax_lab.engine import (
    ClientData,
    CohortPlan,
    LocalSchedule,
    ServerContext,
    ServerView,
    init_loop_state,
    run_round,
)
from fedjax_lab.engine.round import component_round
from fedjax_lab.engine.sampling import sample_poisson_cohort
from fedjax_lab.engine.types import Cohort
from fedjax_lab.experiments import ConfigError, build_experiment, run_experiment, validate
from fedjax_lab.experiments import privacy as run_privacy
from fedjax_lab.experiments.run_directory import read_metrics
from fedjax_lab.experiments.sweep import expand, run_sweep
from fedjax_lab.methods.fedprox.method import proximal
from fedjax_lab.methods.server_optimizers import fedavg_server, reddi_server
from fedjax_lab.privacy import accounting
from fedjax_lab.privacy.mechanism import clip_to_norm, dp_aggregation

RAW = {
    "seed": 0,
    "dataset": {"name": "gaussian_mixture", "num_clients": 20, "examples_per_client": 16, "dimension": 5,
                "num_classes": 3},
    "model": {"name": "mlp", "hidden": [8]},
    "algorithm": {"name": "fedavg", "weighting": "uniform"},
    "client": {"learning_rate": 0.1, "batch_size": 4, "local_steps": 3},
    "rounds": {"num_rounds": 4, "clients_per_round": 5},
    "eval": {"every": 2, "per_client": False},
    "privacy": {"clip_norm": 0.5, "noise_multiplier": 1.0, "accountant": "rdp"},
}


def _config(**privacy):
    return validate({**RAW, "privacy": {**RAW["privacy"], **privacy}})


def _run_rounds(algorithm, plan, params, inputs, rounds=3):
    state = init_loop_state(algorithm, params, plan.num_clients)
    step = jax.jit(lambda s: run_round(algorithm, plan, s, inputs))
    for _ in range(rounds):
        state, metrics = step(state)
    return state, metrics


@pytest.mark.parametrize("server, extra", [("sgd", ()), ("adam", ()), ("sgd", ("fedprox",))],
                         ids=["fedavg", "fedadam", "fedprox"])
@pytest.mark.parametrize("chunk", [None, 2], ids=["stacked", "streamed"])
def test_infinite_clip_norm_and_no_noise_equal_the_base(tiny_data, tiny_classifier, server, extra,
                                                                     chunk):
    optimizer = fedavg_server(1.0) if server == "sgd" else reddi_server("adam", 0.05)
    components = tuple(proximal(0.1) for _ in extra)
    schedule = LocalSchedule(4, local_steps=3)

    def algorithm(*dp):
        return component_round(tiny_classifier.loss, optax.sgd(0.1), optimizer, schedule, *dp, *components,
                               weighting="uniform")

    dp = dp_aggregation(clip_norm=jnp.inf, noise_multiplier=0.0, expected_clients=6)
    plan = CohortPlan(tiny_data.num_clients, 6, chunk_size=chunk)
    params, inputs = tiny_classifier.init(jax.random.key(0)), make_inputs(tiny_data)
    base, _ = _run_rounds(algorithm(), plan, params, inputs)
    private, metrics = _run_rounds(algorithm(dp), plan, params, inputs)
    for a, b in zip(jax.tree.leaves(base.server_state.params), jax.tree.leaves(private.server_state.params)):
        if server == "sgd":
            np.testing.assert_array_equal(a, b)
        else:  # the same arithmetic, which XLA fuses differently in the two programs: a few ulps
            np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-8)
    assert float(metrics["dp_clipped_fraction"]) == 0.0


def test_every_update_leaves_the_client_within_the_clip_norm(tiny_data, tiny_classifier):
    clip = 0.05
    algorithm = component_round(tiny_classifier.loss, optax.sgd(0.5), fedavg_server(1.0),
                                LocalSchedule(4, local_steps=5),
                                dp_aggregation(clip_norm=clip, noise_multiplier=1.0, expected_clients=6),
                                weighting="uniform")
    inputs = make_inputs(tiny_data)
    server_state = algorithm.server_init(tiny_classifier.init(jax.random.key(0)))
    clients = ClientData(jnp.arange(tiny_data.num_clients), inputs.client_example_ids,
                         inputs.client_num_examples)

    def send(client, key):
        return algorithm.client_update(server_state, {}, client, inputs.train_arrays, key)[0]

    messages = jax.vmap(send)(clients, jax.random.split(jax.random.key(1), tiny_data.num_clients))
    norms = jax.vmap(optax.global_norm)(messages["delta"])
    assert float(jnp.max(norms)) <= clip * (1 + 1e-6)
    assert float(jnp.min(norms)) > 0.99 * clip  # 5 steps at lr 0.5 move every client further than C ...
    assert not np.any(messages["dp"]["within"])  # ... and each says it was clipped (adaptive clipping's b_k)


def test_clipping_keeps_short_updates_and_scales_long_ones_to_the_norm():
    tree = {"a": jnp.array([3.0, 0.0]), "b": jnp.array([[4.0]])}
    clipped, within = clip_to_norm(tree, 1.0)
    np.testing.assert_allclose(clipped["a"], [0.6, 0.0], rtol=1e-6)
    np.testing.assert_allclose(clipped["b"], [[0.8]], rtol=1e-6)
    assert not bool(within)
    kept, within = clip_to_norm(tree, 5.0)
    assert bool(within) and all(jnp.array_equal(x, y) for x, y in zip(jax.tree.leaves(kept),
                                                                      jax.tree.leaves(tree)))


def _server_view(key, total, within=3.0, count=5.0, state=()):
    cohort = Cohort(jnp.arange(5), jnp.ones(5, jnp.int32))
    sums = {"delta": total, "weight": jnp.float32(count), "dp": {"within": jnp.float32(within),
                                                               "count": jnp.float32(count)}}
    context = ServerContext(key, jnp.int32(0), {}, 20)
    return ServerView(state, None, jnp.ones(5), cohort, context, total, sums)


@pytest.mark.parametrize("estimator, factor", [("fixed", 1.0), ("clipped", 2.0)])
def test_the_servers_noise_has_the_expected_standard_deviation(estimator, factor):
    clip, z, expected = 0.7, 1.3, 4.0
    dp = dp_aggregation(clip_norm=clip, noise_multiplier=z, expected_clients=expected, estimator=estimator)
    zeros = {"w": jnp.zeros((50, 20)), "b": jnp.zeros(20)}
    keys = jax.random.split(jax.random.key(0), 200)
    means = jax.vmap(lambda k: dp.aggregate(_server_view(k, zeros), zeros)[0])(keys)
    draws = np.concatenate([np.ravel(x) for x in jax.tree.leaves(means)])
    want = factor * z * clip / expected  # sigma C on the sum, over q W; f_c's sensitivity is twice f_f's
    assert abs(np.std(draws, ddof=1) / want - 1) < 0.01  # 204,000 draws: the std's error is ~0.16 %
    assert abs(np.mean(draws)) < 0.01 * want


def test_the_fixed_estimator_divides_by_the_expected_clients_and_the_clipped_one_by_at_least_them():
    total = {"w": jnp.full((3,), 10.0)}
    for estimator, count, want in (("fixed", 5.0, 2.5), ("clipped", 5.0, 2.0), ("clipped", 2.0, 2.5)):
        dp = dp_aggregation(clip_norm=1.0, noise_multiplier=0.0, expected_clients=4.0, estimator=estimator)
        mean, _ = dp.aggregate(_server_view(jax.random.key(0), total, count=count), total)
        np.testing.assert_allclose(mean["w"], want)


def test_adaptive_clipping_converges_to_its_target_quantile():
    """Andrew et al.'s geometric update on update norms drawn from a log-normal: C settles at the target
    quantile of the norm distribution, exp(Phi^-1(gamma)), with the count's noise included."""
    gamma, clients = 0.3, 100
    dp = dp_aggregation(clip_norm=5.0, noise_multiplier=1.0, expected_clients=clients, target_quantile=gamma,
                        clip_learning_rate=0.2, count_noise=clients / 20)

    def one_round(clip, key):
        norms = jnp.exp(jax.random.normal(jax.random.fold_in(key, 1), (clients,)))
        within = jnp.sum((norms <= clip).astype(jnp.float32))
        view = _server_view(key, {}, within=within, count=float(clients), state={"clip_norm": clip})
        state, _, _ = dp.after_step(view, {})
        return state["clip_norm"], state["clip_norm"]

    _, path = jax.lax.scan(one_round, jnp.float32(5.0), jax.random.split(jax.random.key(0), 600))
    quantile = math.exp(-0.5244005)  # the standard normal's 0.3 quantile
    assert abs(float(jnp.mean(path[300:])) / quantile - 1) < 0.05
    assert float(path[0]) < 5.0  # it moved from where it started


def test_the_reported_epsilon_equals_dp_accounting_called_directly(tmp_path):
    config = _config()
    summary = run_experiment(config, tmp_path / "run", progress=False)
    q, rounds = 5 / 20, config.rounds.num_rounds
    accountant = rdp_privacy_accountant.RdpAccountant()
    accountant.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(1.0)), rounds)
    assert summary["privacy"]["epsilon"] == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-12)
    rows = read_metrics(tmp_path / "run")
    assert [r["round"] for r in rows if "epsilon" in r] == [1, 2, 3, 4]
    assert np.all(np.diff([r["epsilon"] for r in rows if "epsilon" in r]) > 0)
    assert {r["cohort_size"] for r in rows[1:]} <= set(range(21))


def test_the_pld_accountant_counts_the_truncated_poisson_round():
    # a large noise multiplier: a narrow privacy loss distribution, built in a fraction of a second
    mechanism = accounting.Mechanism(num_clients=50, sampling="poisson", clients_per_round=5, slots=9,
                                     noise_multiplier=4.0, accountant="pld")
    event = dp_event.TruncatedSubsampledGaussianDpEvent(50, 0.1, 9, 4.0)
    accountant = pld_privacy_accountant.PLDAccountant()
    accountant.compose(event, 3)
    assert accounting.epsilon(mechanism, 3, 1e-4) == pytest.approx(accountant.get_epsilon(1e-4), rel=1e-12)
    # a run's curve, every round: the accountant composing one round at a time
    curve, one_at_a_time = accounting.EpsilonCurve(mechanism, 3, 1e-4), pld_privacy_accountant.PLDAccountant()
    for r in (1, 2, 3):
        one_at_a_time.compose(event)
        assert curve[r] == pytest.approx(one_at_a_time.get_epsilon(1e-4), rel=1e-12)
    assert curve[3] == pytest.approx(accountant.get_epsilon(1e-4), rel=1e-6)  # the counts composed at once
    assert list(curve) == [1, 2, 3] and 0 not in curve and 4 not in curve and curve.get(4) is None
    assert np.int64(2) in curve and curve[np.int64(2)] == curve[2]


def test_an_error_in_the_accountant_s_thread_is_raised_where_the_curve_is_read():
    unsupported = accounting.Mechanism(num_clients=50, sampling="fixed", clients_per_round=5, slots=5,
                                       noise_multiplier=1.0, accountant="pld")  # refused before a run
    with pytest.raises(RuntimeError, match="counting ε after round 1 failed") as raised:
        accounting.EpsilonCurve(unsupported, 2, 1e-5)[1]
    assert isinstance(raised.value.__cause__, dp_accounting.UnsupportedEventError)


def test_fixed_size_sampling_is_counted_with_the_replace_one_sensitivity():
    mechanism = accounting.Mechanism(num_clients=50, sampling="fixed", clients_per_round=5, slots=5,
                                     noise_multiplier=2.0, accountant="rdp")
    accountant = rdp_privacy_accountant.RdpAccountant(
        neighboring_relation=rdp_privacy_accountant.NeighborRel.REPLACE_ONE)
    accountant.compose(dp_event.SampledWithoutReplacementDpEvent(50, 5, dp_event.GaussianDpEvent(1.0)), 10)
    assert accounting.epsilon(mechanism, 10, 1e-5) == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-12)


def test_a_target_epsilon_is_met_by_the_noise_multiplier_found_before_compiling():
    config = validate({**RAW, "privacy": {"clip_norm": 0.5, "target_epsilon": 3.0, "accountant": "rdp"}})
    resolved = run_privacy.resolve(config, 20)
    z = resolved.privacy.noise_multiplier
    spent = accounting.epsilon(run_privacy.mechanism_of(resolved, 20), 4, 1e-5)
    assert spent <= 3.0 and spent > 2.97
    assert accounting.epsilon(run_privacy.mechanism_of(resolved, 20, z * 0.99), 4, 1e-5) > 3.0


def test_poisson_sampling_draws_distinct_clients_and_truncates_to_a_random_subset():
    keys = jax.random.split(jax.random.key(0), 4000)
    ids, mask = jax.vmap(lambda k: sample_poisson_cohort(k, 30, 8, 0.2))(keys)
    counts = np.asarray(mask.sum(1))
    assert all(len(set(row)) == 8 for row in np.asarray(ids))
    joined = jax.vmap(lambda k: jax.random.uniform(jax.random.split(k)[0], (30,)) < 0.2)(keys)
    np.testing.assert_array_equal(counts, np.minimum(np.asarray(joined.sum(1)), 8))
    sampled = np.asarray(ids)[np.asarray(mask)]
    assert abs(np.bincount(sampled, minlength=30).std() / np.bincount(sampled, minlength=30).mean()) < 0.1
    assert all(np.all(np.diff(row[m]) > 0) for row, m in zip(np.asarray(ids), np.asarray(mask)))


def test_a_poisson_cohort_gives_the_same_result_in_chunks(tiny_data, tiny_classifier):
    algorithm = component_round(tiny_classifier.loss, optax.sgd(0.1), fedavg_server(1.0),
                                LocalSchedule(4, local_steps=3),
                                dp_aggregation(clip_norm=0.3, noise_multiplier=0.5, expected_clients=3.0),
                                weighting="uniform")
    params, inputs = tiny_classifier.init(jax.random.key(0)), make_inputs(tiny_data)
    whole, m1 = _run_rounds(algorithm, CohortPlan(12, 6, sampling_rate=0.25), params, inputs)
    chunked, m2 = _run_rounds(algorithm, CohortPlan(12, 6, chunk_size=2, sampling_rate=0.25), params, inputs)
    for a, b in zip(jax.tree.leaves(whole.server_state.params), jax.tree.leaves(chunked.server_state.params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert float(m1["cohort_size"]) == float(m2["cohort_size"])


def test_a_noise_multiplier_sweep_in_one_program_equals_the_separate_runs(tmp_path, capsys):
    config = _config()
    grid = {"privacy.noise_multiplier": [0.0, 0.5, 2.0]}
    summary = run_sweep(config, grid, tmp_path / "sweep", progress=False)
    assert "one program" in summary["layout"]
    for member in expand(config, grid):
        alone = run_experiment(member.config, tmp_path / "alone" / member.name, progress=False)
        together = json.loads((tmp_path / "sweep" / member.name / "summary.json").read_text())
        assert together["privacy"]["epsilon"] == alone["privacy"]["epsilon"]
        for a, b in zip(read_metrics(tmp_path / "sweep" / member.name),
                        read_metrics(tmp_path / "alone" / member.name)):
            for key in ("test_accuracy", "test_loss", "train_loss", "epsilon"):
                if key in b:
                    np.testing.assert_allclose(a[key], b[key], rtol=2e-4, atol=1e-6)
    table = (tmp_path / "sweep" / "sweep.md").read_text()
    assert "| ε |" in table and "∞" in table  # sigma = 0 spends an infinite epsilon


@pytest.mark.parametrize("privacy, field", [
    ({"clip_norm": 0.0}, "privacy.clip_norm"),
    ({"clip_norm": -1.0}, "privacy.clip_norm"),
    ({"noise_multiplier": -0.5}, "privacy.noise_multiplier"),
    ({"delta": 0.0}, "privacy.delta"),
    ({"delta": 1.0}, "privacy.delta"),
    ({"noise_multiplier": None}, "privacy.noise_multiplier"),
    ({"sampling": "fixed", "accountant": "pld"}, "privacy.accountant"),
    ({"accountant": "rdp", "max_clients": 10}, "privacy.max_clients"),
    ({"accountant": "pld", "max_clients": 30}, "privacy.max_clients"),
    ({"adaptive_quantile": 0.5, "noise_multiplier": 1.0, "count_noise": 0.4}, "privacy.count_noise"),
])
def test_bad_privacy_settings_are_refused_naming_the_field(privacy, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        _config(**privacy)


def test_a_method_whose_server_reads_more_than_the_updates_is_refused_before_compiling():
    with pytest.raises(ConfigError, match="algorithm.weighting"):
        validate({**RAW, "algorithm": {"name": "fedavg"}})
    with pytest.raises(ConfigError, match="privacy: .*scaffold"):
        build_experiment(validate({**RAW, "algorithm": {"name": "scaffold", "weighting": "uniform"}}))


def test_a_target_epsilon_out_of_reach_or_a_budget_exceeded_is_refused_before_compiling():
    with pytest.raises(ConfigError, match="privacy.target_epsilon: even a noise multiplier"):
        build_experiment(validate({**RAW, "privacy": {"target_epsilon": 1e-7, "accountant": "rdp"}}))
    with pytest.raises(ConfigError, match="privacy.target_epsilon: the run would spend"):
        build_experiment(_config(target_epsilon=0.5))


def test_a_chunk_that_does_not_divide_the_poisson_slots_is_refused_naming_both_fields():
    config = validate({**RAW, "rounds": {**RAW["rounds"], "chunk_size": 5},
                       "privacy": {**RAW["privacy"], "accountant": "pld", "max_clients": 8}})
    with pytest.raises(ConfigError, match="rounds.chunk_size=5 .*8 slots.*privacy.max_clients"):
        build_experiment(config)


def test_a_run_without_privacy_settings_does_not_import_the_accountant():
    """dp-accounting (with SciPy's signal and optimisation modules, about 2.5 s) is imported only for a
    config with privacy settings: a fresh process that builds a run without them leaves it out."""
    import subprocess
    import sys

    raw = {k: v for k, v in RAW.items() if k != "privacy"}
    program = ("import json, sys\n"
               "from fedjax_lab.experiments import build_experiment, validate\n"
               "import fedjax_lab.experiments.cli, fedjax_lab.experiments.runner\n"
               "import fedjax_lab.experiments.sweep\n"
               f"build_experiment(validate(json.loads({json.dumps(json.dumps(raw))})))\n"
               "print(sorted(m for m in ('dp_accounting', 'scipy.signal') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", program], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"
