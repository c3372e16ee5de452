"""FedWalk's defining properties: a closed gate is the base algorithm, an open gate adds the leash steps after
the base's aggregation, SCAFFOLD's controls are untouched, and the gate and the EMA follow Eq. 5 and Eq. 7."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_lab.engine import CohortPlan, LocalSchedule, init_loop_state, make_run_rounds, randomness
from fedjax_lab.engine.components import ClientView, LocalResult, component_key
from fedjax_lab.engine.types import ClientData
from fedjax_lab.experiments import ConfigError, load_config, validate
from fedjax_lab.experiments.build import build_experiment
from fedjax_lab.experiments.run_directory import read_metrics
from fedjax_lab.experiments.runner import run_experiment
from fedjax_lab.methods.fedavg import fedavg
from fedjax_lab.methods.fednova import normalised_averaging
from fedjax_lab.methods.fedprox import proximal
from fedjax_lab.methods.fedwalk import (
    UNMEASURED_LEASH_LOSS,
    LeashTask,
    client_loss_report,
    fedwalk,
    gate_is_open,
    leash_steps,
    pretrain_on_leash,
)
from fedjax_lab.methods.scaffold import control_variates
from fedjax_lab.methods.server_optimizers import fedavg_server
from tests.conftest import assert_trees_close, make_inputs

PLAIN = LocalSchedule(4, local_steps=3)
LR = 0.1
COHORT = 6


def _bases(classifier, schedule=PLAIN, num_clients=None):
    opt, server = optax.sgd(LR), fedavg_server(1.0)
    return {"fedavg": fedavg(classifier, opt, server, schedule, weighting="uniform"),
            "scaffold": fedavg(classifier, opt, server, schedule, control_variates()),
            "fedprox": fedavg(classifier, opt, server, schedule, proximal(0.1)),
            "fednova": fedavg(classifier, opt, server, schedule, normalised_averaging())}


@pytest.fixture(scope="module")
def leash_setup(tiny_data, tiny_classifier):
    """A 3-class leash task on 40 examples unlike the clients' (their features shifted and relabelled)."""
    rng = np.random.RandomState(0)
    x = tiny_data.train["x"][:40] + 2.0
    arrays = {"x": jnp.asarray(x), "y": jnp.asarray(rng.randint(0, 3, 40).astype(np.int32))}
    inputs = make_inputs(tiny_data)._replace(server_arrays=arrays)
    return LeashTask(tiny_classifier, 3), inputs


def _run(algorithm, classifier, data, inputs, rounds=2):
    state = init_loop_state(algorithm, classifier.init(jax.random.key(0)), data.num_clients)
    return make_run_rounds(algorithm, CohortPlan(data.num_clients, COHORT))(state, inputs, num_rounds=rounds)


def _walk(base, leash, tau, **kwargs):
    return fedwalk(base, leash, jax.random.key(1), tau, learning_rate=LR, leash_loss_examples=16,
                   client_loss_examples=8, **kwargs)


@pytest.mark.parametrize("name", ["fedavg", "scaffold", "fedprox", "fednova"])
def test_closed_gate_equals_the_base_algorithm_exactly(tiny_data, tiny_classifier, leash_setup, name):
    leash, inputs = leash_setup
    walked = _walk(_bases(tiny_classifier)[name], leash, tau=-jnp.inf)
    state, metrics = _run(walked, tiny_classifier, tiny_data, inputs)
    base_state, _ = _run(_bases(tiny_classifier)[name], tiny_classifier, tiny_data,
                         inputs)
    assert_trees_close(state.server_state.base, base_state.server_state, rtol=0, atol=0)
    assert_trees_close(state.client_states, base_state.client_states, rtol=0, atol=0)
    assert float(metrics["leash_open"].sum()) == 0 and int(state.server_state.leash_steps_taken) == 0
    assert float(state.server_state.leash_loss) == UNMEASURED_LEASH_LOSS


def test_open_gate_takes_the_leash_steps_after_the_base_aggregation(tiny_data, tiny_classifier, leash_setup):
    leash, inputs = leash_setup
    base = _bases(tiny_classifier)["fedavg"]
    walked = _walk(base, leash, tau=jnp.inf, num_steps=3, batch_size=8)
    _, metrics = _run(walked, tiny_classifier, tiny_data, inputs, rounds=3)
    assert np.array_equal(np.asarray(metrics["leash_open"]), [1, 1, 1])
    assert np.array_equal(np.asarray(metrics["leash_steps_taken"]), [3, 6, 9])

    # Round 0 by hand: the base's round, then 3 leash steps with the round's server key, from the same head.
    one, _ = _run(walked, tiny_classifier, tiny_data, inputs, rounds=1)
    base_one, _ = _run(base, tiny_classifier, tiny_data, inputs, rounds=1)
    key = component_key(randomness.round_key(inputs.key, 0, randomness.Purpose.SERVER), "fedwalk")
    head = leash.init_head(jax.random.key(1), tiny_classifier.init(jax.random.key(0)))
    expected, expected_head = leash_steps(leash, base_one.server_state.params, head, inputs.server_arrays,
                                          jax.random.fold_in(key, 0), optax.sgd(LR), 3, 8)
    assert_trees_close(one.server_state.base.params, expected, rtol=1e-5)
    assert_trees_close(one.server_state.leash_head, expected_head, rtol=1e-5)
    assert not np.allclose(jax.tree.leaves(expected)[0], jax.tree.leaves(base_one.server_state.params)[0])


def test_scaffold_plus_fedwalk_keeps_scaffolds_control_variates(tiny_data, tiny_classifier, leash_setup):
    leash, inputs = leash_setup
    base = _bases(tiny_classifier)["scaffold"]
    walked, _ = _run(_walk(base, leash, tau=jnp.inf, num_steps=2), tiny_classifier, tiny_data, inputs,
                     rounds=1)
    alone, _ = _run(base, tiny_classifier, tiny_data, inputs, rounds=1)
    # Same round from the same model: the controls are SCAFFOLD's bit for bit, only the model has moved.
    assert_trees_close(walked.server_state.base.components["scaffold"],
                       alone.server_state.components["scaffold"], rtol=0, atol=0)
    assert_trees_close(walked.client_states, alone.client_states, rtol=0, atol=0)
    assert not np.allclose(jax.tree.leaves(walked.server_state.base.params)[0],
                           jax.tree.leaves(alone.server_state.params)[0])
    # Later rounds: clients correct with c - c_k and the server keeps averaging control deltas as SCAFFOLD
    # does.
    state, _ = _run(_walk(base, leash, tau=jnp.inf), tiny_classifier, tiny_data, inputs, rounds=4)
    mean_client = jax.tree.map(lambda c: jnp.mean(c, 0), state.client_states["scaffold"])
    assert_trees_close(state.server_state.base.components["scaffold"], mean_client, rtol=1e-4, atol=1e-6)


def test_gate_opens_exactly_when_log2_of_the_loss_ratio_is_below_tau():
    assert bool(gate_is_open(jnp.float32(1.0), jnp.float32(0.8), 0.5))       # log2(1/0.8) = 0.32 < 0.5
    assert not bool(gate_is_open(jnp.float32(1.0), jnp.float32(0.6), 0.5))   # log2(1/0.6) = 0.74
    assert bool(gate_is_open(jnp.float32(1.0), jnp.float32(2.1), -1.0))      # Ls > 2 Lc
    assert not bool(gate_is_open(jnp.float32(1.0), jnp.float32(1.9), -1.0))
    # round 1 always opens
    assert bool(gate_is_open(jnp.float32(0.5), jnp.float32(UNMEASURED_LEASH_LOSS), 3.0))
    assert not bool(gate_is_open(jnp.float32(0.5), jnp.float32(UNMEASURED_LEASH_LOSS), -jnp.inf))


def test_client_loss_ema_follows_eq5_and_leash_loss_moves_only_with_the_leash(tiny_data, tiny_classifier,
                                                                              leash_setup):
    leash, inputs = leash_setup
    base = _bases(tiny_classifier)["fedavg"]
    _, metrics = _run(_walk(base, leash, tau=-1.0, beta=0.7), tiny_classifier, tiny_data, inputs, rounds=6)
    ema, final, ls, opened = (np.asarray(metrics[k]) for k in ("client_loss_ema", "client_loss", "leash_loss",
                                                                 "leash_open"))
    expected = np.zeros(6)
    for r in range(6):
        expected[r] = 0.7 * (expected[r - 1] if r else 0.0) + 0.3 * final[r]
    np.testing.assert_allclose(ema, expected, rtol=1e-5)
    assert opened[0] == 1
    for r in range(1, 6):
        if not opened[r]:
            assert ls[r] == ls[r - 1]
        assert bool(opened[r]) == bool(ls[r - 1] > 2.0 * ema[r])


def test_client_loss_is_the_evaluation_mode_loss_of_the_final_model_on_the_clients_data(tiny_data,
                                                                                        tiny_classifier):
    k = 1  # 25 examples; a sample larger than the client covers all of them
    client = ClientData(jnp.int32(k), jnp.asarray(tiny_data.client_train_ids[k]),
                        jnp.int32(tiny_data.client_train_counts[k]))
    arrays = jax.device_put(tiny_data.train)
    trained = tiny_classifier.init(jax.random.key(5))
    view = ClientView(None, (), (), client, arrays, jax.random.key(2), jnp.float32(LR))
    reported, _ = client_loss_report(tiny_classifier, "final", 64).finish(view,
                                                                          LocalResult(trained, None, None))
    n = int(client.num_examples)
    rows = tiny_data.client_train_ids[k, :n]
    whole = tiny_classifier.eval_loss(trained, {"x": arrays["x"][rows], "y": arrays["y"][rows],
                                                "mask": jnp.ones(n)})
    np.testing.assert_allclose(float(reported), float(whole), rtol=1e-5)


def test_the_leash_never_applies_the_clients_augmentation(tiny_classifier, leash_setup):
    import dataclasses

    from fedjax_lab.models import augment

    leash, inputs = leash_setup
    noisy = dataclasses.replace(tiny_classifier, augment=augment.gaussian_noise)  # reads batch['noise_std']
    walked_leash = LeashTask(noisy, 3)
    params = tiny_classifier.init(jax.random.key(0))
    head = walked_leash.init_head(jax.random.key(1), params)
    # The leash set has no 'noise_std': with the clients' augmentation this would fail.
    trained, _ = leash_steps(walked_leash, params, head, inputs.server_arrays, jax.random.key(2),
                             optax.sgd(LR), 2, 8)
    assert_trees_close(trained, leash_steps(leash, params, head, inputs.server_arrays, jax.random.key(2),
                                            optax.sgd(LR), 2, 8)[0], rtol=0, atol=0)


def test_pretraining_lowers_the_leash_loss_and_leaves_the_fl_head(tiny_classifier, leash_setup):
    leash, inputs = leash_setup
    params = tiny_classifier.init(jax.random.key(0))
    trained, head = pretrain_on_leash(leash, params, jax.random.key(1), inputs.server_arrays,
                                      jax.random.key(3), num_steps=40, learning_rate=0.2, batch_size=16)
    initial_head = leash.init_head(jax.random.key(1), params)
    before = leash.evaluate(params, initial_head, inputs.server_arrays, jax.random.key(0), 40)
    after = leash.evaluate(trained, head, inputs.server_arrays, jax.random.key(0), 40)
    assert float(after) < float(before)
    assert not np.allclose(params["params"]["hidden_0"]["kernel"], trained["params"]["hidden_0"]["kernel"])
    assert np.array_equal(params["params"]["output"]["kernel"], trained["params"]["output"]["kernel"])


def _image_config(image_root, other_image_root, fedwalk=None, **algorithm):
    if fedwalk is not None:
        algorithm["plugins"] = [{"name": "fedwalk", **fedwalk}]
    return {"dataset": {"name": "image_folder", "data_dir": str(image_root),
                        "partition": {"name": "iid", "num_clients": 6},
                        "server_data": {"kind": "out_of_domain", "dataset": "image_folder", "size": 40,
                                        "data_dir": str(other_image_root), "classes": ["blue", "red"]}},
            "model": {"name": "simple_cnn"}, "algorithm": {"name": "fedavg", **algorithm},
            "client": {"batch_size": 8, "local_steps": 2, "learning_rate": 0.05},
            "rounds": {"num_rounds": 2, "clients_per_round": 3}, "eval": {"every": 2, "per_client": False}}


def test_fedwalk_without_a_leash_set_fails_validation_naming_the_field(image_root, other_image_root):
    raw = _image_config(image_root, other_image_root, fedwalk={"tau": 0.5})
    del raw["dataset"]["server_data"]
    with pytest.raises(ConfigError, match="algorithm: fedwalk needs data held by the server: set "
                                          "dataset.server_data"):
        validate(raw)


def test_leash_classes_are_chosen_by_name_and_relabelled_in_list_order(image_root, other_image_root):
    data = build_experiment(validate(_image_config(image_root, other_image_root, fedwalk={}))).dataset
    blue_first = data.server["x"][data.server["y"] == 0]
    red_second = data.server["x"][data.server["y"] == 1]
    assert set(np.unique(data.server["y"])) == {0, 1} and len(data.server["y"]) == 40
    assert (blue_first[..., 2].mean() > 150) and (red_second[..., 0].mean() > 150)
    raw = _image_config(image_root, other_image_root, fedwalk={})
    raw["dataset"]["server_data"]["classes"] = ["blue", "rde"]
    with pytest.raises(ConfigError, match="dataset.server_data.classes: .* no class 'rde'; did "
                                          "you mean 'red'"):
        build_experiment(validate(raw))


@pytest.mark.parametrize("algorithm", [{"name": "scaffold", "fedwalk": {"steps": 2}},
                                       {"name": "fedavg", "fedwalk": {"mode": "pretrain",
                                                                      "pretrain_steps": 3}}])
def test_fedwalk_runs_from_a_config_and_logs_its_gate(image_root, other_image_root, tmp_path, algorithm):
    summary = run_experiment(validate(_image_config(image_root, other_image_root, **algorithm)), tmp_path,
                             progress=False)
    rows = read_metrics(tmp_path)
    assert np.isfinite(summary["final"]["test_loss"]) and summary["diverged"] is None
    if algorithm["fedwalk"].get("mode") == "pretrain":
        assert "leash_open" not in rows[1] and "client_loss" not in rows[1]
    else:
        assert rows[1]["leash_open"] == 1.0 and rows[-1]["leash_steps_taken"] == 2.0 * rows[-1]["round"]


def test_pretrained_fedwalk_starts_from_the_pretrained_model_and_leash_head(image_root, other_image_root):
    scratch = build_experiment(validate(_image_config(image_root, other_image_root,
                                                      fedwalk={}))).initial_state()
    experiment = build_experiment(validate(_image_config(image_root, other_image_root,
                                                         fedwalk={"pretrain_steps": 5})))
    state = experiment.initial_state()
    head_key = component_key(randomness.init_key(randomness.base_key(0)), "fedwalk")
    leash = LeashTask(experiment.classifier, 2)
    params, head = pretrain_on_leash(leash,
                                     experiment.classifier.init(randomness.init_key(experiment.inputs.key)),
                                     head_key, jax.device_put(experiment.dataset.server),
                                     jax.random.fold_in(head_key, 1), 5, 0.05, batch_size=64)
    assert_trees_close(state.server_state.base.params, params, rtol=1e-6, atol=1e-7)
    assert_trees_close(state.server_state.leash_head, head, rtol=1e-6, atol=1e-7)
    assert not np.allclose(jax.tree.leaves(head)[0], jax.tree.leaves(scratch.server_state.leash_head)[0])


def test_a_config_extends_another_and_overrides_only_what_it_names(tmp_path):
    (tmp_path / "base.yaml").write_text(
        "dataset: {name: gaussian_mixture, num_clients: 8}\nmodel: {name: mlp, hidden: [4]}\n"
        "algorithm: {name: fedavg}\nclient: {local_steps: 2, learning_rate: 0.1}\n"
        "rounds: {num_rounds: 3, clients_per_round: 4}\n")
    (tmp_path / "child.yaml").write_text("extends: base.yaml\nclient: {learning_rate: 0.5}\n")
    config = load_config(tmp_path / "child.yaml", ["rounds.num_rounds=7"])
    assert (config.client.learning_rate, config.client.local_steps, config.rounds.num_rounds) == (0.5, 2, 7)
    (tmp_path / "loop.yaml").write_text("extends: loop.yaml\n")
    with pytest.raises(ConfigError, match="extends itself"):
        load_config(tmp_path / "loop.yaml")
