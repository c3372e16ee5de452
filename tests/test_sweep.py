"""Hyper-parameters as data and many runs in one program: a sweep equals its runs one after another."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_lab.data import load_partition
from fedjax_lab.experiments import build_experiment, run_experiment, validate
from fedjax_lab.experiments.cli import main
from fedjax_lab.experiments.config import split_grid_args
from fedjax_lab.experiments.run_directory import RunDirectory, read_metrics
from fedjax_lab.experiments.sweep import expand, run_sweep

RAW = {
    "seed": 0,
    "dataset": {"name": "gaussian_mixture", "num_clients": 6, "examples_per_client": 16, "dimension": 5,
                "num_classes": 3},
    "model": {"name": "mlp", "hidden": [8]},
    "algorithm": {"name": "fedavg"},
    "client": {"learning_rate": 0.1, "batch_size": 4, "local_steps": 3},
    "rounds": {"num_rounds": 4, "clients_per_round": 3},
    "eval": {"every": 2, "per_client": False},
}


def _config(**sections):
    return validate({**RAW, **sections})


def _final_params(run_dir, config):
    experiment = build_experiment(config)
    state = RunDirectory(run_dir).restore_checkpoint(experiment.initial_state())
    return jax.tree.leaves(state.server_state.params)


def _assert_same_runs(sweep_dir, separate_dir, members):
    for member in members:
        together, alone = read_metrics(sweep_dir / member.name), read_metrics(separate_dir / member.name)
        assert [r["round"] for r in together] == [r["round"] for r in alone]
        for a, b in zip(together, alone):
            for key in ("test_accuracy", "test_loss", "train_loss"):
                if key in b:
                    np.testing.assert_allclose(a[key], b[key], rtol=2e-4, atol=1e-6)
        for a, b in zip(_final_params(sweep_dir / member.name, member.config),
                        _final_params(separate_dir / member.name, member.config)):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def _separately(members, run_dir):
    for member in members:
        run_experiment(member.config, run_dir / member.name, progress=False)


@pytest.mark.parametrize("algorithm", [{"name": "fedavg"}, {"name": "scaffold"}])
def test_four_seeds_in_one_program_equal_four_separate_runs(tmp_path, algorithm):
    config = _config(algorithm=algorithm)
    grid = {"seed": [0, 1, 2, 3]}
    summary = run_sweep(config, grid, tmp_path / "sweep", progress=False)
    assert summary["layout"].startswith("one program")
    members = expand(config, grid)
    _separately(members, tmp_path / "alone")
    _assert_same_runs(tmp_path / "sweep", tmp_path / "alone", members)
    finals = {m["final_accuracy"] for m in summary["members"]}
    assert len(finals) > 1 or len({json.dumps(read_metrics(tmp_path / "sweep" / m.name))
                                   for m in members}) == 4


def test_a_grid_of_client_learning_rates_and_momenta_in_one_program_equals_the_separate_runs(tmp_path):
    config = _config(client={**RAW["client"], "momentum": 0.0})
    grid = {"client.learning_rate": [0.01, 0.3], "client.momentum": [0.0, 0.5]}
    summary = run_sweep(config, grid, tmp_path / "sweep", progress=False, member_chunk=2)
    assert summary["layout"] == "one program, 2 member(s) vmapped at a time"
    members = expand(config, grid)
    _separately(members, tmp_path / "alone")
    _assert_same_runs(tmp_path / "sweep", tmp_path / "alone", members)


def test_a_step_decay_schedule_equals_its_two_phases_one_after_another():
    scheduled = build_experiment(_config(client={**RAW["client"],
                                                 "schedule": {"name": "step", "boundaries": [2],
                                                              "factor": 0.1}}))
    state, _ = scheduled.run_rounds(scheduled.initial_state(), scheduled.inputs, num_rounds=4)
    constant = build_experiment(_config())
    phase, _ = constant.run_rounds(constant.initial_state(), constant.inputs, num_rounds=2)
    slow = {**constant.inputs.hparams, "client.learning_rate": jnp.float32(0.01)}
    phase, _ = constant.run_rounds(phase, constant.inputs._replace(hparams=slow), num_rounds=2)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(phase)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    fast, _ = constant.run_rounds(constant.initial_state(), constant.inputs, num_rounds=4)
    assert not np.allclose(jax.tree.leaves(fast.server_state.params)[0],
                           jax.tree.leaves(state.server_state.params)[0])


def test_a_new_hyperparameter_value_does_not_recompile():
    experiment = build_experiment(_config(algorithm={"name": "fedprox", "mu": 0.1}))
    experiment.run_rounds(experiment.initial_state(), experiment.inputs, num_rounds=1)
    for mu in (0.0, 1.0):
        inputs = experiment.inputs._replace(hparams={**experiment.inputs.hparams,
                                                     "algorithm.mu": jnp.float32(mu)})
        experiment.run_rounds(experiment.initial_state(), inputs, num_rounds=1)
    assert experiment.run_rounds._cache_size() == 1


def test_a_grid_over_model_sizes_runs_one_after_another_and_says_so(tmp_path, capsys):
    summary = run_sweep(_config(), {"model.hidden": [[4], [8]]}, tmp_path / "sweep", progress=False)
    assert summary["layout"].startswith("one after another (model.hidden changes the program's structure")
    assert "runs one after another" in capsys.readouterr().err
    assert all((tmp_path / "sweep" / m["member"] / "summary.json").exists() for m in summary["members"])


def test_sweep_from_the_command_line_writes_a_table_a_plot_and_resumable_run_directories(tmp_path, capsys):
    import yaml

    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(RAW))
    sweep_dir = tmp_path / "sweep"
    assert main(["sweep", str(path), "seed=0,1", "client.learning_rate=0.05,0.2", "rounds.num_rounds=4",
                 "--sweep-dir", str(sweep_dir), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "client.learning_rate=0.05 | 2 |" in out and (sweep_dir / "curves.png").stat().st_size > 1000
    report = json.loads((sweep_dir / "sweep.json").read_text())
    assert len(report["members"]) == 4 and len(report["settings"]) == 2
    # the members share one partition, drawn once; each reloadable file names its member's seed
    members = [sweep_dir / m["member"] for m in report["members"]]
    assert len({(m / "partition.md").read_text() for m in members}) == 1
    assert len({(m / "partition.png").read_bytes() for m in members}) == 1
    assert [load_partition(m / "partition.npz")[1]["seed"] for m in members] == [
        m["seed"] for m in report["members"]]
    assert main(["sweep", str(path), "seed=0,1", "--sweep-dir", str(sweep_dir)]) == 2
    assert "already holds a sweep" in capsys.readouterr().err


def test_an_interrupted_sweep_resumes_as_a_whole_or_member_by_member(tmp_path):
    config = _config(checkpoint={"every_blocks": 1})
    grid = {"seed": [0, 1]}
    run_sweep(config, grid, tmp_path / "whole", progress=False)
    run_sweep(config, grid, tmp_path / "split", progress=False, stop_after_round=2)
    members = expand(config, grid)
    # One member on its own, as a single run; then the sweep resumes the rest.
    run_experiment(members[0].config, tmp_path / "split" / members[0].name, resume=True, progress=False)
    run_sweep(config, {"seed": [1]}, tmp_path / "split", resume=True, progress=False)
    _assert_same_runs(tmp_path / "split", tmp_path / "whole", members)


def test_grid_arguments_are_split_from_overrides():
    grid, overrides = split_grid_args(["seed=0,1,2", "model.hidden=[16, 8]", "client.learning_rate=0.1",
                                       "model.padding=SAME,VALID"])
    assert grid == {"seed": [0, 1, 2], "model.padding": ["SAME", "VALID"]}
    assert overrides == ["model.hidden=[16, 8]", "client.learning_rate=0.1"]
    assert split_grid_args(["model.hidden=[4],[8]"])[0] == {"model.hidden": [[4], [8]]}


def test_the_default_layout_follows_the_backend_and_the_model():
    from fedjax_lab.experiments.sweep import default_member_chunk

    assert default_member_chunk(12, "gpu") == 12  # the whole grid at once on an accelerator
    assert default_member_chunk(12, "cpu", "mlp") == 6 and default_member_chunk(8, "cpu", "mlp") == 8
    assert default_member_chunk(4, "cpu", "simple_cnn") is None  # separate runs: measured faster on CPU
