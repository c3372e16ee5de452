"""Nothing lost, nothing silently wrong: the hostile inputs of docs/reliability.md, each through the command
line.

Signals, a full disk and the distributed start-up run the CLI in a subprocess (what is tested there is the
process: its exit status, what it prints, what it leaves on disk); the other cases call ``cli.main`` in this
process, the same code less the interpreter start-up.
"""

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from fedjax_lab.experiments import ConfigError, run_experiment, validate
from fedjax_lab.experiments.cli import main
from fedjax_lab.experiments.config import load_config
from fedjax_lab.experiments.run_directory import read_metrics

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"

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
LONG = {**RAW, "rounds": {"num_rounds": 3000, "clients_per_round": 4}, "eval": {"every": 500},
        "checkpoint": {"every_blocks": 2}}
"""Blocks of 500 rounds: long enough to signal a run in the middle of one."""


def _write(tmp_path: Path, raw: dict, name: str = "c.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _cli(*args: str, **kwargs) -> subprocess.Popen:
    """The CLI in a process of its own, with one CPU device as this process has: a run it starts and one
    resumed here then sum their messages in the same order (on several, the CLI would split the cohort)."""
    env = {**os.environ, "FEDJAX_LAB_CPU_DEVICES": "1", **kwargs.pop("env", {})}
    return subprocess.Popen([sys.executable, "-m", "fedjax_lab.experiments.cli", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, **kwargs)


def _wait_for(condition, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _has_round(run_dir: Path, round_index: int) -> bool:
    path = run_dir / "metrics.jsonl"
    return path.exists() and f'"round": {round_index},' in path.read_text()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """:data:`LONG` run to the end without interruption: the metrics every resumed run must equal."""
    run_dir = tmp_path_factory.mktemp("whole")
    run_experiment(validate(LONG), run_dir, progress=False)
    return (run_dir / "metrics.jsonl").read_text()


# ------------------------------------------------------------------------------------------- signals
@pytest.mark.parametrize("signum, wait_round", [(signal.SIGINT, 0), (signal.SIGTERM, 500)])
def test_a_signal_stops_after_the_block_writes_everything_and_the_resume_equals_an_uninterrupted_run(
        tmp_path, uninterrupted, signum, wait_round):
    # SIGINT as soon as round 0 is written: the first block is compiling. SIGTERM in the middle of the run.
    config, run_dir = _write(tmp_path, LONG), tmp_path / "run"
    process = _cli("run", config, "--run-dir", str(run_dir), "--no-progress")
    _wait_for(lambda: _has_round(run_dir, wait_round))
    process.send_signal(signum)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 128 + signum, err
    assert "Traceback" not in err and "Exception ignored" not in err
    assert f"interrupted ({signal.Signals(signum).name})" in err
    assert f"fedjax-lab run {run_dir}/config.yaml --run-dir {run_dir} --resume" in err
    stopped = read_metrics(run_dir)[-1]["round"]
    assert stopped >= wait_round and stopped < 3000
    if stopped:  # the last block is kept (a signal before the first block stops at round 0)
        assert (run_dir / "checkpoints" / str(stopped)).is_dir()
    so_far = json.loads((run_dir / "interrupted.json").read_text())  # what ran, beside a plot of it
    assert so_far["interrupted"] and so_far["rounds"] == stopped and (run_dir / "curves.png").is_file()
    assert not (run_dir / "summary.json").exists()  # summary.json says a run has finished
    assert main(["run", str(run_dir / "config.yaml"), "--run-dir", str(run_dir), "--resume",
                 "--no-progress"]) == 0
    assert (run_dir / "metrics.jsonl").read_text() == uninterrupted
    assert (run_dir / "summary.json").exists() and not (run_dir / "interrupted.json").exists()


def test_a_second_signal_stops_at_once_and_the_run_resumes_from_its_last_checkpoint(tmp_path, uninterrupted):
    config, run_dir = _write(tmp_path, LONG), tmp_path / "run"
    process = _cli("run", config, "--run-dir", str(run_dir), "--no-progress")
    _wait_for(lambda: (run_dir / "config.yaml").exists())
    process.send_signal(signal.SIGINT)
    time.sleep(0.05)
    process.send_signal(signal.SIGINT)  # while the first block compiles, or while the process winds down
    _, err = process.communicate(timeout=300)
    assert process.returncode == 130 and "Traceback" not in err and "Exception ignored" not in err, err
    assert main(["run", config, "--run-dir", str(run_dir), "--resume", "--no-progress"]) == 0
    assert (run_dir / "metrics.jsonl").read_text() == uninterrupted


# ---------------------------------------------------------------------------------------------- disks
FILE_SIZE_LIMIT = """import os, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]),) * 2)
os.execv(sys.executable, [sys.executable, "-m", "fedjax_lab.experiments.cli", *sys.argv[2:]])
"""
"""Runs the CLI with writes past ``argv[1]`` bytes a file failing with EFBIG, as they would with ENOSPC on a
full disk (the limit and the ignored SIGXFSZ survive the ``exec``)."""


@pytest.mark.parametrize("what, limit, overrides", [
    # more than partition.png (17 kB), less than these metrics
    ("metrics", 30_000, ["rounds.num_rounds=400"]),
    ("checkpoint", 200_000, ["model.hidden=[256,256]", "rounds.num_rounds=40"]),  # a checkpoint of 0.8 MB
])
def test_a_full_disk_is_exit_4_with_a_message_and_the_run_resumes(tmp_path, what, limit, overrides):
    raw = {**RAW, "checkpoint": {"every_blocks": 20}}
    config, run_dir = _write(tmp_path, raw), tmp_path / "run"
    process = subprocess.Popen([sys.executable, "-c", FILE_SIZE_LIMIT, str(limit), "run", config, *overrides,
                                "--run-dir", str(run_dir), "--no-progress"], cwd=ROOT, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 4, err
    assert "Traceback" not in err and "free space (or fix the permissions) and continue with --resume" in err
    assert ("metrics.jsonl" if what == "metrics" else "writing the checkpoint of round") in err
    assert not list((run_dir / "checkpoints").glob("*tmp*"))  # the partial checkpoint is removed
    assert main(["run", config, *overrides, "--run-dir", str(run_dir), "--resume", "--no-progress"]) == 0
    assert read_metrics(run_dir)[-1]["round"] == int(overrides[-1].split("=")[1])


def test_writes_that_end_after_a_failed_checkpoint_print_nothing_and_other_errors_still_show(monkeypatch):
    """The race the full-disk test can lose under load: TensorStore finishes a write after Orbax closed the
    event loop awaiting it, and Python prints the "Event loop is closed" traceback after the run's message."""
    import asyncio
    import gc

    import tensorstore as ts

    from fedjax_lab.experiments import run_directory

    passed_on, seen = [], []
    monkeypatch.setattr(logging.getLogger("asyncio"), "disabled", True)  # "Task was destroyed", as the CLI
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: passed_on.append(str(unraisable.exc_value)))
    run_directory._quiet_closed_event_loops()
    run_directory._quiet_closed_event_loops()  # a second failure does not wrap the hook again
    quiet = sys.unraisablehook
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: (seen.append(str(unraisable.exc_value)),
                                                                   quiet(unraisable)))

    promise, write = ts.Promise.new()

    async def abandon(write):  # as Orbax does when another write of the checkpoint fails
        waiting = asyncio.ensure_future(_await(write))
        await asyncio.wait([waiting], timeout=0.01)

    loop = asyncio.new_event_loop()
    loop.run_until_complete(abandon(write))
    loop.close()
    promise.set_result(0)  # the write ends, on the full disk, after the loop closed
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)

    class Broken:
        def __init__(self, error):
            self.error = error

        def __del__(self):
            raise self.error

    del promise, write  # the abandoned task goes with them, while the asyncio logger is off
    Broken(ValueError("another unraisable error"))
    Broken(RuntimeError("Event loop is closed"))  # the same error raised elsewhere is not a late write
    gc.collect()
    assert seen == ["Event loop is closed", "another unraisable error", "Event loop is closed"]
    assert passed_on == ["another unraisable error", "Event loop is closed"]


def test_a_checkpoint_that_cannot_be_written_installs_the_quiet_hook(tmp_path, monkeypatch):
    from fedjax_lab.experiments import run_directory

    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
    directory = run_directory.RunDirectory(tmp_path / "run")

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(directory._checkpoints, "save", full_disk)
    state = type("State", (), {"round": 3})()
    with pytest.raises(OSError, match="writing the checkpoint of round 3"):
        directory.save_checkpoint(state)
    assert getattr(sys.unraisablehook, "quiets_closed_event_loops", False)


async def _await(future):
    return await future


# ------------------------------------------------------------------------------------------ run files
def test_a_torn_last_metrics_line_is_dropped_and_the_run_resumes_to_the_same_result(tmp_path, uninterrupted):
    config = validate(LONG)
    run_experiment(config, tmp_path / "run", progress=False, stop_after_round=1500)
    with (tmp_path / "run" / "metrics.jsonl").open("a") as f:
        f.write('{"round": 1501, "train_lo')  # killed while appending
    out = tmp_path / "plots" / "new" / "curves.png"  # plot --out into a folder that does not exist yet
    assert main(["plot", str(tmp_path / "run"), "--out", str(out)]) == 0 and out.stat().st_size > 1000
    path = _write(tmp_path, LONG)
    assert main(["run", path, "--run-dir", str(tmp_path / "run"), "--resume", "--no-progress"]) == 0
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == uninterrupted


def test_a_damaged_line_inside_the_metrics_is_named(tmp_path, capsys):
    path = _write(tmp_path, RAW)
    assert main(["run", path, "--run-dir", str(tmp_path / "run"), "--no-progress"]) == 0
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    lines[2] = lines[2][:10]
    (tmp_path / "run" / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["plot", str(tmp_path / "run"), "--out", str(tmp_path / "c.png")]) == 4
    assert "metrics.jsonl, line 3, is damaged" in capsys.readouterr().err


def test_resume_refuses_a_run_whose_config_or_metrics_are_missing_and_says_when_it_starts_over(tmp_path,
                                                                                               capsys):
    path, run_dir = _write(tmp_path, RAW), tmp_path / "run"
    resume = ["run", path, "--run-dir", str(run_dir), "--resume", "--no-progress"]
    assert main(["run", path, "--run-dir", str(run_dir), "--no-progress", "rounds.num_rounds=4"]) == 0
    (run_dir / "config.yaml").rename(tmp_path / "kept.yaml")
    assert main([*resume, "client.learning_rate=0.3"]) == 2
    assert "config.yaml is missing" in capsys.readouterr().err
    (tmp_path / "kept.yaml").rename(run_dir / "config.yaml")
    (run_dir / "metrics.jsonl").unlink()
    assert main([*resume, "rounds.num_rounds=4"]) == 4
    assert "metrics.jsonl is missing" in capsys.readouterr().err
    shutil.rmtree(run_dir / "checkpoints")
    assert main([*resume, "rounds.num_rounds=4"]) == 0
    assert "has no checkpoint yet; starting from round 0" in capsys.readouterr().err
    assert main(["run", path, "--run-dir", str(tmp_path / "new"), "--resume", "--no-progress"]) == 0
    assert "holds no run yet; starting from round 0" in capsys.readouterr().err


def test_a_refused_resume_names_every_differing_key_with_both_values(tmp_path, capsys):
    path, run_dir = _write(tmp_path, RAW), tmp_path / "run"
    assert main(["run", path, "--run-dir", str(run_dir), "--no-progress", "rounds.num_rounds=2"]) == 0
    assert main(["run", path, "--run-dir", str(run_dir), "--resume", "client.learning_rate=0.2",
                 "client.local_steps=5"]) == 2
    err = capsys.readouterr().err
    assert ("client.learning_rate: 0.1 stored, 0.2 given" in err
            and "client.local_steps: 3 stored, 5 given" in err)
    assert "rounds.num_rounds: 2 stored, 6 given" in err
    # What never changes results may change: the start-up timeout, how many checkpoints are kept.
    assert main(["run", path, "--run-dir", str(run_dir), "--resume", "rounds.num_rounds=2",
                 "checkpoint.keep=3", "parallel.init_timeout_s=10", "--no-progress"]) == 0


# --------------------------------------------------------------------------------------------- sweeps
@pytest.mark.parametrize("grid", [["seed=0,1"], ["model.hidden=[4],[8]"]], ids=["one program", "one by one"])
def test_a_sweep_resume_with_a_changed_setting_is_refused_naming_the_key(tmp_path, capsys, grid):
    path, sweep_dir = _write(tmp_path, RAW), tmp_path / "sweep"
    assert main(["sweep", path, *grid, "--sweep-dir", str(sweep_dir), "--no-progress"]) == 0
    before = {p: p.read_bytes() for p in sorted(sweep_dir.rglob("metrics.jsonl"))}
    capsys.readouterr()
    for change in ("client.learning_rate=0.3", "client.local_steps=5"):
        assert main(["sweep", path, *grid, change, "--sweep-dir", str(sweep_dir), "--resume",
                     "--no-progress"]) == 2
        key = change.split("=")[0]
        assert f"cannot resume {sweep_dir}/" in (err := capsys.readouterr().err) and f"{key}: " in err
    assert {p: p.read_bytes() for p in sorted(sweep_dir.rglob("metrics.jsonl"))} == before


def test_a_sweep_member_without_its_config_is_not_resumed(tmp_path, capsys):
    path, sweep_dir = _write(tmp_path, RAW), tmp_path / "sweep"
    assert main(["sweep", path, "seed=0,1", "rounds.num_rounds=4", "--sweep-dir", str(sweep_dir),
                 "--no-progress", "--chunk", "1"]) == 0
    (sweep_dir / "seed=1" / "config.yaml").unlink()
    assert main(["sweep", path, "seed=0,1", "rounds.num_rounds=6", "--sweep-dir", str(sweep_dir),
                 "--resume"]) == 2
    assert "seed=0: the config given differs" in capsys.readouterr().err


@pytest.mark.parametrize("items, message", [
    (["seed=0,0"], "grid seed: 0 is listed twice"),
    (["client.learning_rate=0.1,0.10"], "grid client.learning_rate: 0.1 is listed twice"),
    (["seed=0,1", "seed=2,3"], "seed is given twice"),
    (["seed=0,1", "seed=4"], "seed is given twice"),
    ([f"seed={','.join(map(str, range(100)))}", "client.learning_rate=0.1,0.2,0.3"],
     "the grid has 300 members (100 x 3), more than 256; pass --yes"),
])
def test_grids_that_would_mix_members_or_surprise_are_refused_before_anything_runs(tmp_path, capsys, items,
                                                                                   message):
    path = _write(tmp_path, RAW)
    assert main(["sweep", path, *items, "--sweep-dir", str(tmp_path / "s")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("chunk", ["0", "-1", "two"])
def test_chunk_must_be_a_whole_number_of_at_least_one(tmp_path, capsys, chunk):
    with pytest.raises(SystemExit) as exit_:
        main(["sweep", _write(tmp_path, RAW), "seed=0,1", "--chunk", chunk])
    assert exit_.value.code == 2 and "--chunk: must be a whole number >= 1" in capsys.readouterr().err


def test_the_sweep_table_reports_the_sample_standard_deviation(tmp_path):
    path, sweep_dir = _write(tmp_path, RAW), tmp_path / "sweep"
    assert main(["sweep", path, "seed=0,1,2", "rounds.num_rounds=2", "--sweep-dir", str(sweep_dir),
                 "--no-progress"]) == 0
    import json

    summary = json.loads((sweep_dir / "sweep.json").read_text())
    finals = [m["final_accuracy"] for m in summary["members"]]
    assert summary["settings"][0]["final_std"] == pytest.approx(np.std(finals, ddof=1))
    assert "ddof 1" in (sweep_dir / "sweep.md").read_text()


# ---------------------------------------------------------------------------------- distributed start-up
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("process_id, message", [
    (1, "could not be reached within 1 s"),  # no coordinator
    (0, "processes [1] did not reach the coordinator"),  # the coordinator, alone
])
def test_distributed_start_up_gives_up_after_its_timeout_with_a_message(tmp_path, process_id, message):
    address = f"127.0.0.1:{_free_port()}"
    start = time.monotonic()
    process = _cli("run", _write(tmp_path, RAW), "--run-dir", str(tmp_path / "run"),
                   f"parallel.coordinator_address={address}", "parallel.num_processes=2",
                   f"parallel.process_id={process_id}", "parallel.init_timeout_s=1")
    _, err = process.communicate(timeout=120)
    assert process.returncode == 2, err
    assert "waiting for the" in err and address in err and message in err and "Traceback" not in err
    assert time.monotonic() - start < 60


@pytest.mark.parametrize("environment, overrides, message", [
    ({}, ["parallel.num_processes=2"], "parallel.coordinator_address: required for 2 processes"),
    ({"JAX_NUM_PROCESSES": "two"}, [],
     "parallel.num_processes (from $JAX_NUM_PROCESSES): must be a whole number"),
    ({"JAX_COORDINATOR_ADDRESS": "host", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"}, [],
     "must be host:port"),
    ({"JAX_PROCESS_ID": "3"}, ["parallel.num_processes=2", "parallel.coordinator_address=h:1"],
     "parallel.process_id (from $JAX_PROCESS_ID): must be < num_processes=2"),
])
def test_distributed_settings_are_checked_before_jax_starts(tmp_path, capsys, monkeypatch, environment,
                                                            overrides, message):
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert main(["run", _write(tmp_path, RAW), *overrides, "--run-dir", str(tmp_path / "run")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------------ data and settings
IMAGE = {**RAW, "dataset": {"name": "mnist", "subset": 1200, "partition": {"name": "iid", "num_clients": 8}},
         "model": {"name": "logistic_regression"}}


def _image(**dataset) -> dict:
    return {**IMAGE, "dataset": {**IMAGE["dataset"], **dataset}}


@pytest.fixture(scope="module")
def mnist_partition(tmp_path_factory):
    if not (DATA / "mnist" / "mnist.npz").is_file():
        pytest.skip("shared/data/mnist is not beside the checkout")
    out = tmp_path_factory.mktemp("partition")
    path = out / "c.yaml"
    path.write_text(yaml.safe_dump(IMAGE))
    assert main(["partition", str(path), "--out", str(out)]) == 0
    return out / "partition.npz"


def _refused(tmp_path, capsys, raw: dict) -> str:
    assert main(["partition", _write(tmp_path, raw), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_a_saved_partition_is_checked_against_the_dataset_and_its_rows(tmp_path, capsys, mnist_partition):
    assert main(["partition", _write(tmp_path, _image(partition={"name": "iid", "num_clients": 8,
                                                                 "file": str(mnist_partition)})),
                 "--out", str(tmp_path / "same")]) == 0
    err = _refused(tmp_path, capsys, _image(name="fashion_mnist", partition={"name": "iid", "num_clients": 8,
                                                                             "file": str(mnist_partition)}))
    assert "was made for 'mnist', not 'fashion_mnist'" in err
    err = _refused(tmp_path, capsys, _image(subset=600, partition={"name": "iid", "num_clients": 8,
                                                                  "file": str(mnist_partition)}))
    assert "deals rows the clients cannot have" in err and "larger dataset" in err
    err = _refused(tmp_path, capsys, _image(partition={"name": "iid", "num_clients": 8,
                                                       "file": str(DATA / "mnist" / "mnist.npz")}))
    assert "dataset.partition.file" in err and "is not a partition file (rows, offsets, meta)" in err


@pytest.mark.parametrize("damage", ["truncated", "corrupted", "a partition file", "pickled", "missing"])
def test_a_damaged_dataset_archive_is_named_with_its_field(tmp_path, capsys, mnist_partition, damage):
    archive = tmp_path / "data" / "mnist" / "mnist.npz"
    archive.parent.mkdir(parents=True)
    original = (DATA / "mnist" / "mnist.npz").read_bytes()
    if damage == "truncated":
        archive.write_bytes(original[: len(original) // 3])
    elif damage == "corrupted":
        middle = len(original) // 2
        archive.write_bytes(original[:middle] + bytes(b ^ 0xFF for b in original[middle:middle + 4096])
                            + original[middle + 4096:])
    elif damage == "a partition file":
        shutil.copy(mnist_partition, archive)
    elif damage == "pickled":
        np.savez(archive, x_train=np.array([{"a": 1}], dtype=object), y_train=np.zeros(1), y_test=np.zeros(1),
                 label_names=np.array(["0"]))
    err = _refused(tmp_path, capsys, _image(data_dir=str(tmp_path / "data")))
    assert (f"dataset.data_dir: {archive}" in err
            or f"dataset.data_dir: mnist archive not found at {archive}" in err)


@pytest.mark.parametrize("overrides, message", [
    (["seed=-1"], "seed: Input should be greater than or equal to 0, got -1"),
    (["asynchrony={delay: fixed, rounds: 6}"],
     "asynchrony.rounds: a job sent in round r arrives in round r + 6"),
    (["asynchrony={delay: fixed, rounds: 5}", "algorithm.name=fedbuff", "algorithm.buffer_size=5"],
     "algorithm.buffer_size: at most 4 updates arrive"),
    (["asynchrony.sigmaa=3"], "asynchrony.sigmaa: unknown key; did you mean 'sigma'?"),
])
def test_settings_that_cannot_work_are_refused_before_compiling(tmp_path, capsys, overrides, message):
    assert main(["run", _write(tmp_path, RAW), *overrides, "--run-dir", str(tmp_path / "run")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_out_of_domain_server_data_must_come_from_another_dataset(tmp_path):
    raw = _image(server_data={"kind": "out_of_domain", "dataset": "mnist", "size": 100})
    with pytest.raises(ConfigError, match="out-of-domain data must come from another dataset"):
        validate(raw)
    with pytest.raises(ConfigError, match=r"dataset.server_data.sizee: unknown key; did you mean 'size'\?"):
        load_config(_write(tmp_path, IMAGE), ["dataset.server_data={kind: in_domain, sizee: 3}"])


# ------------------------------------------------------------------------------- corners a review found
def test_an_empty_checkpoints_folder_is_not_a_run(tmp_path):
    from fedjax_lab.experiments.run_directory import RunDirectory, holds_run
    from fedjax_lab.experiments.runner import check_run_directory

    RunDirectory(tmp_path / "run")  # what a run that failed before writing anything leaves
    assert not holds_run(tmp_path / "run")
    assert (check_run_directory(validate(RAW), tmp_path / "run", resume=False, overwrite=False)
            == ("start", None))


def test_a_stored_config_is_compared_with_todays_defaults_filled_in():
    from fedjax_lab.experiments.config import check_resumable, to_yaml

    config = validate(RAW)
    stored = yaml.safe_load(to_yaml(config))
    del stored["eval"]["dissimilarity"], stored["parallel"]["init_timeout_s"]  # fields a later version added
    check_resumable(yaml.safe_dump(stored), config, "run")
    stored["client"]["learning_rate"] = 0.5
    with pytest.raises(ConfigError, match="client.learning_rate: 0.5 stored, 0.1 given"):
        check_resumable(yaml.safe_dump(stored), config, "run")


def test_distributed_settings_keep_ipv6_brackets_and_leave_a_missing_id_to_the_cluster():
    from fedjax_lab.experiments.config import ParallelConfig, distributed_settings

    six = distributed_settings(ParallelConfig(coordinator_address="[::1]:1234", num_processes=2,
                                              process_id=1), {})
    assert (six.coordinator_address, six.host, six.port, six.complete) == ("[::1]:1234", "::1", 1234, True)
    slurm = distributed_settings(ParallelConfig(coordinator_address="h:1", num_processes=4), {})
    assert not slurm.complete  # JAX reads the process id from SLURM, Open MPI or Kubernetes
    assert distributed_settings(ParallelConfig(), {}) is None


def test_a_silent_connection_does_not_hold_up_the_rendezvous():
    import threading

    from fedjax_lab.engine.sharding import rendezvous

    port, left = _free_port(), {}

    def process(index):
        left[index] = rendezvous("127.0.0.1", port, 2, index, timeout_s=30, log=lambda line: None)

    coordinator = threading.Thread(target=process, args=(0,))
    coordinator.start()
    _wait_for(lambda: socket.socket().connect_ex(("127.0.0.1", port)) == 0, timeout=10)
    silent = socket.create_connection(("127.0.0.1", port))  # says nothing (a port scanner)
    start = time.monotonic()
    process(1)
    coordinator.join(timeout=30)
    silent.close()
    assert set(left) == {0, 1} and time.monotonic() - start < 15  # the silent peer costs at most 5 s


def test_outside_the_command_line_a_second_signal_raises_keyboard_interrupt_and_handlers_are_restored():
    from fedjax_lab.experiments.signals import REPEAT_WINDOW_S, StopOnSignal

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), StopOnSignal() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        _wait_for(lambda: stop.signum == signal.SIGTERM, timeout=10)
        time.sleep(REPEAT_WINDOW_S + 0.1)
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(500):
            time.sleep(0.01)
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_signal_repeated_at_once_counts_once():
    from fedjax_lab.experiments.signals import StopOnSignal

    with StopOnSignal() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)  # a wrapper forwarding the terminal's Ctrl-C as well
        _wait_for(lambda: stop.signum == signal.SIGINT, timeout=10)
        time.sleep(0.2)
    assert stop.signum == signal.SIGINT


def test_a_one_program_sweep_with_a_diverged_member_resumes_and_finishes(tmp_path):
    from fedjax_lab.experiments.sweep import run_sweep

    config = validate({**RAW, "rounds": {"num_rounds": 8, "clients_per_round": 4}})
    grid = {"client.learning_rate": [0.1, 1e9]}
    run_sweep(config, grid, tmp_path, progress=False, stop_after_round=4, member_chunk=2)
    assert "diverged" in read_metrics(tmp_path / "client.learning_rate=1000000000.0")[-1]
    summary = run_sweep(config, grid, tmp_path, resume=True, progress=False, member_chunk=2)
    assert [m["diverged"] is not None for m in summary["members"]] == [False, True]
    assert read_metrics(tmp_path / "client.learning_rate=0.1")[-1]["round"] == 8
    assert "1000000000.0" in (tmp_path / "sweep.md").read_text()


def test_an_image_folder_partition_reloads_from_a_copy_of_the_folder(tmp_path, image_root):
    raw = {**RAW, "dataset": {"name": "image_folder", "data_dir": str(image_root),
                              "partition": {"name": "iid", "num_clients": 4}},
           "model": {"name": "logistic_regression"}}
    assert main(["partition", _write(tmp_path, raw), "--out", str(tmp_path / "p")]) == 0
    copy = shutil.copytree(image_root, tmp_path / "scratch" / "images")
    raw["dataset"].update(data_dir=str(copy), partition={"name": "iid", "num_clients": 4,
                                                         "file": str(tmp_path / "p" / "partition.npz")})
    assert main(["partition", _write(tmp_path, raw, "copy.yaml"), "--out", str(tmp_path / "q")]) == 0
    tables = [(tmp_path / out / "partition.md").read_text().split("\n", 1)[1] for out in ("p", "q")]
    assert tables[0] == tables[1]  # the same clients (the title names the folder)
