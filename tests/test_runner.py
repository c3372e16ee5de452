"""The host loop and run directory: metrics as they go, plot, resume equals an uninterrupted run, the CLI."""

import json
import os

import numpy as np
import pytest

from fedjax_lab.experiments import ConfigError, build_experiment, run_experiment, validate
from fedjax_lab.experiments.cli import main
from fedjax_lab.experiments.run_directory import read_metrics

RAW = {
    "seed": 3,
    "dataset": {"name": "gaussian_mixture", "num_clients": 8, "examples_per_client": 20, "dimension": 6,
                "num_classes": 3},
    "model": {"name": "mlp", "hidden": [8]},
    "algorithm": {"name": "fedadam", "server_learning_rate": 0.05},
    "client": {"learning_rate": 0.1, "batch_size": 4, "local_steps": 3},
    "rounds": {"num_rounds": 6, "clients_per_round": 4},
    "eval": {"every": 2},
    "checkpoint": {"every_blocks": 1},
}


@pytest.fixture(scope="module")
def config():
    return validate(RAW)


@pytest.fixture(scope="module")
def experiment(config):
    return build_experiment(config)


def _final_params(run_dir, experiment):
    from fedjax_lab.experiments.run_directory import RunDirectory

    state = RunDirectory(run_dir).restore_checkpoint(experiment.initial_state())
    return np.asarray(state.server_state.params["params"]["output"]["kernel"]), int(state.round)


def test_run_writes_config_metrics_summary_plot_and_checkpoint(tmp_path, config, experiment):
    summary = run_experiment(config, tmp_path, progress=False, experiment=experiment)
    rows = read_metrics(tmp_path)
    assert [r["round"] for r in rows] == list(range(7))
    assert [r["round"] for r in rows if "test_accuracy" in r] == [0, 2, 4, 6]
    assert all(np.isfinite(r["train_loss"]) for r in rows[1:])
    assert summary["rounds"] == 6 and 0 <= summary["best_test_accuracy"] <= 1 and summary["collapsed"] is None
    assert json.loads((tmp_path / "summary.json").read_text())["best_round"] == summary["best_round"]
    # what decides the float rounding: the CPU's thread pool follows the cores this process may use
    assert summary["cpu_threads"] == len(os.sched_getaffinity(0)) and summary["device_kind"] == "cpu"
    assert summary["cpu"] and summary["cpu"] != "unknown"
    assert (tmp_path / "curves.png").stat().st_size > 1000
    assert "fedadam" in (tmp_path / "config.yaml").read_text()
    assert _final_params(tmp_path, experiment)[1] == 6


def test_resumed_run_equals_uninterrupted_run(tmp_path):
    config = validate({**RAW, "checkpoint": {"every_blocks": 2}})
    experiment = build_experiment(config)
    run_experiment(config, tmp_path / "whole", progress=False, experiment=experiment)
    run_experiment(config, tmp_path / "split", progress=False, experiment=experiment, stop_after_round=5)
    # Interrupted after round 5 with the last checkpoint at round 4: the resume rewinds and redoes round 5.
    assert [r["round"] for r in read_metrics(tmp_path / "split")][-1] == 5
    run_experiment(config, tmp_path / "split", progress=False, experiment=experiment, resume=True)
    whole, split = read_metrics(tmp_path / "whole"), read_metrics(tmp_path / "split")
    assert [r["round"] for r in split] == list(range(7))
    for a, b in zip(whole, split):
        assert a.keys() == b.keys()
        np.testing.assert_allclose([a[k] for k in sorted(a)], [b[k] for k in sorted(b)], rtol=1e-6)
    np.testing.assert_array_equal(_final_params(tmp_path / "whole", experiment)[0],
                                  _final_params(tmp_path / "split", experiment)[0])


def test_a_resume_may_checkpoint_more_often_and_still_equals_the_uninterrupted_run(tmp_path):
    rare = validate({**RAW, "checkpoint": {"every_blocks": 2}})
    often = validate({**RAW, "checkpoint": {"every_blocks": 1}})
    experiment = build_experiment(rare)
    run_experiment(rare, tmp_path / "whole", progress=False, experiment=experiment)
    run_experiment(rare, tmp_path / "split", progress=False, experiment=experiment, stop_after_round=5)
    run_experiment(often, tmp_path / "split", progress=False, experiment=experiment, resume=True)
    assert sorted(int(p.name) for p in (tmp_path / "split/checkpoints").iterdir()) == [4, 6]
    np.testing.assert_array_equal(_final_params(tmp_path / "whole", experiment)[0],
                                  _final_params(tmp_path / "split", experiment)[0])
    other = validate({**RAW, "checkpoint": {"every_blocks": 1}, "client": {**RAW["client"], "batch_size": 5}})
    with pytest.raises(ConfigError, match=r"config.yaml in\n  client.batch_size: 4 stored, 5 given\n"):
        run_experiment(other, tmp_path / "split", progress=False, resume=True)


def test_existing_run_needs_resume_or_overwrite_and_resume_needs_same_config(tmp_path, config, experiment):
    run_experiment(config, tmp_path, progress=False, experiment=experiment, stop_after_round=2)
    with pytest.raises(ConfigError, match="already holds a run; pass --resume"):
        run_experiment(config, tmp_path, progress=False, experiment=experiment)
    other = validate({**RAW, "seed": 4})
    with pytest.raises(ConfigError, match=r"differs from its config.yaml in\n  seed: 3 stored, 4 given\n"):
        run_experiment(other, tmp_path, progress=False, resume=True)


def test_cli_run_and_plot(tmp_path, capsys):
    import yaml

    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(RAW))
    assert main(["run", str(path), "rounds.num_rounds=2", "--run-dir", str(tmp_path / "a"),
                 "--no-progress"]) == 0
    assert main(["run", str(path), "rounds.num_rounds=2", "algorithm.name=fedavg",
                 "algorithm.server_learning_rate=1", "--run-dir", str(tmp_path / "b"), "--no-progress"]) == 0
    assert "test accuracy" in capsys.readouterr().out
    out = tmp_path / "both.png"
    assert main(["plot", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out)]) == 0
    assert out.stat().st_size > 1000
    assert main(["plot", str(tmp_path / "missing")]) == 2


def test_divergence_is_detected_reported_and_stops_the_run(tmp_path):
    raw = {"dataset": {"name": "synthetic", "num_clients": 10}, "model": {"name": "mlp", "hidden": [16]},
           "algorithm": {"name": "fedavg"}, "client": {"local_steps": 20, "learning_rate": 1e4},
           "rounds": {"num_rounds": 40, "clients_per_round": 5}, "eval": {"every": 5, "per_client": False}}
    summary = run_experiment(validate(raw), tmp_path / "diverged", progress=False)
    assert summary["diverged"] and summary["rounds"] < 40
    rows = read_metrics(tmp_path / "diverged")
    assert rows[-1]["diverged"] == summary["diverged"]
    assert json.loads((tmp_path / "diverged" / "summary.json").read_text())["diverged"] == summary["diverged"]


def test_a_diverged_run_exits_non_zero_and_its_best_round_is_before_the_divergence(tmp_path, capsys):
    import yaml

    raw = {"dataset": {"name": "synthetic", "num_clients": 10}, "model": {"name": "mlp", "hidden": [16]},
           "algorithm": {"name": "fedavg"}, "client": {"local_steps": 20, "learning_rate": 1e4},
           "rounds": {"num_rounds": 40, "clients_per_round": 5}, "eval": {"every": 5, "per_client": False}}
    path = tmp_path / "diverging.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["run", str(path), "--run-dir", str(tmp_path / "run"), "--no-progress"]) == 3
    assert "the run diverged" in capsys.readouterr().err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    diverged_round = read_metrics(tmp_path / "run")[-1]["round"]
    assert summary["best_round"] < diverged_round


def test_a_constant_predictor_is_the_same_class_share_at_the_last_evaluations_after_round_0():
    from fedjax_lab.experiments.runner import constant_predictor

    labels = np.array([0] * 5 + [1] * 3 + [2] * 2)  # shares 0.5, 0.3, 0.2; half an example is 0.05

    def rows(*accuracies):
        return [{"round": 2 * i, "test_accuracy": a} for i, a in enumerate(accuracies)]

    found = constant_predictor(rows(0.6, 0.8, 0.3, 0.3, 0.34), labels)
    assert "class 1's share in" in found and "from round 4 to 8" in found
    assert "from round 2 to 6" in constant_predictor(rows(0.2, 0.5, 0.5, 0.5), labels)  # round 0 not counted
    assert constant_predictor(rows(0.5, 0.5, 0.5), labels) is None  # two evaluations after round 0
    assert constant_predictor(rows(0.6, 0.3, 0.3, 0.36), labels) is None  # more than half an example off
    assert constant_predictor(rows(0.6, 0.3, 0.5, 0.3), labels) is None  # not one class throughout
    assert constant_predictor(rows(0.6, 0.2, 0.2, 0.2, 0.2), labels, evaluations=5) is None
    assert constant_predictor(rows(0.6, 0.2, 0.2, 0.2), labels.reshape(5, 2)) is None  # sequences: no check
    balanced = np.repeat(np.arange(4), 25)  # which class cannot be told
    assert "the share of each of 4 classes" in constant_predictor(rows(0.5, 0.25, 0.25, 0.25), balanced)


def test_a_model_at_chance_is_at_most_the_largest_share_and_three_deviations_of_guessing():
    from fedjax_lab.experiments.runner import at_chance, constant_predictor

    labels = np.repeat(np.arange(100), 100)  # CIFAR-100's test set: 1 % a class, 10,000 labels
    bound = 0.01 + 3 * np.sqrt(0.01 * 0.99 / 10_000)  # 0.01298

    def rows(*accuracies):
        return [{"round": 2 * i, "test_accuracy": a} for i, a in enumerate(accuracies)]

    # FedSAM at rho 0.5's last evaluations: a few classes, no constant predictor, no better than guessing
    fedsam = rows(0.0085, 0.0126, 0.0105, 0.0099, 0.0102, 0.0099, 0.0104)
    assert constant_predictor(fedsam, labels) is None
    found = at_chance(fedsam, labels)
    assert found.endswith("from round 2 to 12: at chance") and "at most 0.0130" in found
    late = at_chance(rows(0.01, 0.02, 0.03, bound - 1e-6, bound, 0.012), labels)
    assert late.endswith("from round 6 to 10: at chance")
    assert at_chance(rows(0.01, 0.01, 0.01, bound + 1e-4), labels) is None  # the last one learned a little
    assert at_chance(rows(0.01, 0.01, 0.01), labels) is None  # two evaluations after round 0
    skewed = np.array([0] * 900 + [1] * 100)  # the bound is the largest share's: 0.9 + 3 x 0.0095
    assert at_chance(rows(0.5, 0.92, 0.92, 0.928), skewed)
    assert at_chance(rows(0.5, 0.92, 0.95, 0.95), skewed) is None
    # sequences: the tokens that count, padding (0) left out: token 1 is 60 of 100 real tokens, 20 of the
    # [4, 30] labels are padding; 3 deviations of 100 tokens: 0.6 + 3 x 0.049
    tokens = np.array([1] * 60 + list(range(2, 42)) + [0] * 20).reshape(4, 30)
    seq_bound = 0.6 + 3 * np.sqrt(0.6 * 0.4 / 100)
    assert "share 0.6000" in at_chance(rows(0.0, 0.6, 0.7, seq_bound - 1e-6), tokens, pad_label=0)
    assert at_chance(rows(0.0, 0.6, 0.7, seq_bound + 1e-4), tokens, pad_label=0) is None
    assert "share 0.5000" in at_chance(rows(0.0, 0.6, 0.6, 0.6), tokens)  # padding counted: a bigger n


def test_a_run_whose_model_gives_every_example_one_class_says_it_collapsed(tmp_path, monkeypatch, capsys):
    """The output layer zeroed but for its bias on class 2, and a learning rate too small to move it: every
    evaluation scores class 2's share, the summary says so, the command warns and still exits 0."""
    import jax
    import yaml

    from fedjax_lab.experiments import runner

    # test_cli_run_and_plot's second run but for the learning rate: the same compiled program
    raw = {**RAW, "algorithm": {"name": "fedavg", "server_learning_rate": 1},
           "client": {**RAW["client"], "learning_rate": 1e-30}}
    experiment = build_experiment(validate(raw))
    start = experiment.initial_state()

    def one_class(path, leaf):
        names = [str(getattr(k, "key", k)) for k in path]
        if "output" not in names:
            return leaf
        return leaf * 0 if names[-1] == "kernel" else (leaf * 0).at[..., 2].set(1.0)

    experiment.initial_state = lambda: jax.tree_util.tree_map_with_path(one_class, start)
    summary = run_experiment(validate(raw), tmp_path / "run", progress=False, experiment=experiment)
    labels = experiment.dataset.test["y"]
    assert summary["final"]["test_accuracy"] == pytest.approx(np.mean(labels == 2))
    shares = np.bincount(labels) / len(labels)
    tied = np.sum(np.isclose(shares, shares[2]))  # classes with class 2's share, which it cannot tell apart
    assert (f"is {'class 2' if tied == 1 else f'the share of each of {tied} classes'}"
            in summary["collapsed"]) and "from round 2 to 6: a constant predictor" in summary["collapsed"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["collapsed"] == summary["collapsed"]

    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw))
    monkeypatch.setattr(runner, "run_experiment", lambda *args, **kwargs: summary)
    assert main(["run", str(path), "--run-dir", str(tmp_path / "cli"), "--no-progress"]) == 0
    assert f"warning: {summary['collapsed']}" in capsys.readouterr().err


def test_resuming_a_finished_run_changes_nothing(tmp_path, config, experiment, capsys):
    run_experiment(config, tmp_path, progress=False, experiment=experiment)
    before = (tmp_path / "summary.json").read_text()
    summary = run_experiment(config, tmp_path, progress=False, experiment=experiment, resume=True)
    assert (tmp_path / "summary.json").read_text() == before and summary["rounds"] == 6
    assert "nothing to resume" in capsys.readouterr().err


def test_a_corrupted_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, config, experiment, capsys):
    run_experiment(config, tmp_path / "whole", progress=False, experiment=experiment)
    run_experiment(config, tmp_path / "split", progress=False, experiment=experiment, stop_after_round=4)
    latest = tmp_path / "split" / "checkpoints" / "4"
    for f in latest.rglob("*"):
        if f.is_file():
            f.write_bytes(b"garbage")
    run_experiment(config, tmp_path / "split", progress=False, experiment=experiment, resume=True)
    assert "checkpoint of round 4" in capsys.readouterr().err
    np.testing.assert_array_equal(_final_params(tmp_path / "whole", experiment)[0],
                                  _final_params(tmp_path / "split", experiment)[0])


def test_ctrl_c_leaves_a_resumable_run_and_the_cli_says_so(tmp_path, config, capsys):
    import dataclasses

    import yaml

    from fedjax_lab.experiments.runner import RunInterrupted

    experiment = build_experiment(config)
    calls = []

    def interrupted(state, inputs, num_rounds):
        calls.append(num_rounds)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return experiment.run_rounds(state, inputs, num_rounds=num_rounds)

    with pytest.raises(RunInterrupted, match="results up to round 2"):
        run_experiment(config, tmp_path / "run", progress=False,
                       experiment=dataclasses.replace(experiment, run_rounds=interrupted))
    summary = run_experiment(config, tmp_path / "run", progress=False, experiment=experiment, resume=True)
    assert summary["rounds"] == 6
    # The command line turns the interruption into a message and exit status 130.
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(RAW))
    from fedjax_lab.experiments import runner

    original = runner.run_experiment

    def raise_interrupt(*args, **kwargs):
        raise RunInterrupted(tmp_path, 2)

    runner.run_experiment = raise_interrupt
    try:
        assert main(["run", str(path), "--run-dir", str(tmp_path / "cli")]) == 130
    finally:
        runner.run_experiment = original
    assert "interrupted (SIGINT); results up to round 2" in capsys.readouterr().err
