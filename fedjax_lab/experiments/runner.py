"""The host loop: compiled blocks of rounds, with evaluation, metrics, progress and checkpoints between
them."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
from tqdm.auto import tqdm

from fedjax_lab.data.report import write_partition_report
from fedjax_lab.engine.sharding import to_host
from fedjax_lab.experiments.build import Experiment, build_experiment, join_processes
from fedjax_lab.experiments.config import Config, ConfigError, check_resumable, to_yaml
from fedjax_lab.experiments.plots import describe_run, plot_runs, plot_staleness, run_config
from fedjax_lab.experiments.privacy import privacy_summary
from fedjax_lab.experiments.run_directory import (
    RunDirectory,
    RunDirectoryError,
    clear_run,
    holds_run,
    naming,
    read_metrics,
    split_arrays,
    write_atomically,
)
from fedjax_lab.experiments.signals import RunInterrupted, StopOnSignal, StopRequested


def _check_writable(run_dir: Path) -> None:
    """Raises :class:`ConfigError` when ``run_dir`` cannot hold a run (a file, or not writable)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run directory {str(run_dir)!r} is a file; choose a directory with --run-dir")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write_test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"run directory {str(run_dir)!r} cannot be written: "
                          f"{exc.strerror or exc}") from None


def check_run_directory(config: Config, run_dir: Path, resume: bool,
                        overwrite: bool) -> tuple[str, str | None]:
    """What to do with ``run_dir`` for this request, without touching it: ``('start' | 'clear' | 'resume',
    note)``, ``note`` a line to tell the user or ``None``.

    A new run needs a directory without a run, or ``overwrite``. A resume needs the run's ``config.yaml`` to
    equal ``config`` (else the differing keys are named) and its ``metrics.jsonl``; with no run there, or no
    checkpoint yet, it starts from round 0 and says so.

    Raises:
      ConfigError: the directory holds another run, or a run whose settings cannot be checked.
      RunDirectoryError: the run's metrics are missing.
    """
    _check_writable(run_dir)
    if not holds_run(run_dir):
        return "start", f"--resume: {run_dir} holds no run yet; starting from round 0" if resume else None
    if overwrite:
        return "clear", None
    if not resume:
        raise ConfigError(f"run directory {run_dir} already holds a run; pass --resume to continue it or "
                          "--overwrite to start again")
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"cannot resume {run_dir}: its config.yaml is missing, so the settings of the "
                          "rounds already run cannot be checked; restore it, or start again with --overwrite")
    check_resumable(saved.read_text(), config, str(run_dir))
    checkpoints = run_dir / "checkpoints"
    if not (checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir())):
        return "clear", f"--resume: {run_dir} has no checkpoint yet; starting from round 0"
    if not (run_dir / "metrics.jsonl").is_file():
        raise RunDirectoryError(f"cannot resume {run_dir}: its metrics.jsonl is missing, so the curve of the "
                                "rounds already run is lost; start again with --overwrite")
    return "resume", None


def prepare_run_directory(config: Config, run_dir: Path, resume: bool, overwrite: bool) -> bool:
    """Does what :func:`check_run_directory` decided; returns whether the run continues from a checkpoint."""
    action, note = check_run_directory(config, run_dir, resume, overwrite)
    if note:
        print(f"fedjax-lab: {note}", file=sys.stderr)
    if action == "clear":
        clear_run(run_dir)
    return action == "resume"


EXPLOSION_FACTOR = 1e3


def divergence(rows: list[dict[str, Any]], initial_test_loss: float) -> str | None:
    """Why a block's metrics show divergence (a non-finite value, or a test loss above ``EXPLOSION_FACTOR``
    times the initial one), or ``None``."""
    for row in rows:
        for name, value in row.items():
            if isinstance(value, float) and not np.isfinite(value):
                return f"{name} is {value} at round {row['round']}"
        if row.get("test_loss", 0.0) > EXPLOSION_FACTOR * max(initial_test_loss, 1.0):
            return (f"test_loss {row['test_loss']:.4g} exceeds {EXPLOSION_FACTOR:g}x the initial "
                    f"{initial_test_loss:.4g}")
    return None


COLLAPSE_EVALUATIONS = 3
"""How many evaluations in a row at one class's share of the test labels :func:`constant_predictor` takes
for a collapse."""


def constant_predictor(evaluated: list[dict[str, Any]], labels: np.ndarray, *,
                       evaluations: int = COLLAPSE_EVALUATIONS) -> str | None:
    """Why the global model looks like a constant predictor, or ``None``.

    A model that gives every test example the same class scores exactly that class's share of the test
    labels. When the last ``evaluations`` evaluations after round 0 all score one share (to within half an
    example), the run has most likely collapsed: the loss stays finite, so :func:`divergence` misses it
    (SCAFFOLD at its Table 5 rate on Fashion-MNIST, ``docs/reproductions/fedimpro.md``). The run goes on;
    the summary and the command say so. Only for one label per example (not sequences).

    Args:
      evaluated: the metrics rows that hold ``test_accuracy``, in round order.
      labels: the test set's labels, ``[n]`` integers.
      evaluations: how many evaluations in a row count as a collapse.
    """
    labels = np.asarray(labels)
    rows = [row for row in evaluated if row["round"] > 0]
    if labels.ndim != 1 or len(labels) == 0 or len(rows) < evaluations:
        return None
    shares = np.bincount(labels) / len(labels)

    def classes_at(row) -> tuple[int, ...]:  # the classes whose share the accuracy is
        return tuple(np.flatnonzero(np.abs(shares - row["test_accuracy"]) <= 0.5 / len(labels)).tolist())

    classes = classes_at(rows[-1])
    if not classes or any(classes_at(row) != classes for row in rows[-evaluations:]):
        return None
    first = len(rows) - evaluations
    while first > 0 and classes_at(rows[first - 1]) == classes:
        first -= 1
    which = (f"class {classes[0]}'s share" if len(classes) == 1
             else f"the share of each of {len(classes)} classes")
    return (f"test accuracy {rows[-1]['test_accuracy']:.4f} is {which} in the test labels at every "
            f"evaluation from round {rows[first]['round']} to {rows[-1]['round']}: a constant predictor")


CHANCE_DEVIATIONS = 3.0
"""How many binomial standard deviations of guessing above the largest class's share of the test labels an
accuracy may lie and still count as chance (:func:`at_chance`)."""


def at_chance(evaluated: list[dict[str, Any]], labels: np.ndarray, *, pad_label: int | None = None,
              evaluations: int = COLLAPSE_EVALUATIONS) -> str | None:
    """Why the global model looks no better than chance, or ``None``.

    A model that has learned nothing scores about the largest class's share ``p`` of the ``n`` test labels or
    less; one that guesses reaches ``p + 3 sqrt(p (1 - p) / n)`` only rarely. When the last ``evaluations``
    evaluations after round 0 all lie at or below that bound, the run has not learned. This catches what
    :func:`constant_predictor` does not: a model at chance that spreads its answers over a few classes
    (FedSAM at rho 0.5 on CIFAR-100, 0.99-1.02 % in ``docs/reproductions/fedcog.md``). The run goes on; the
    summary (``at_chance``) and the command say so. For sequences the labels are the tokens that count (the
    accuracy's), and the bound is the most frequent token's share: a next-character model at or below it
    predicts no better than always the commonest character. (Tokens of one sequence are not independent, so
    there the bound's margin is narrower than chance's spread: a run just above the share is not flagged.)

    Args:
      evaluated: the metrics rows that hold ``test_accuracy``, in round order.
      labels: the test set's labels, ``[n]`` integers, or ``[n, T]`` tokens for sequences.
      pad_label: for sequences, the token that is padding (not counted in the accuracy).
      evaluations: how many evaluations in a row at chance count.
    """
    labels = np.asarray(labels).reshape(-1)
    if pad_label is not None:
        labels = labels[labels != pad_label]
    rows = [row for row in evaluated if row["round"] > 0]
    if len(labels) == 0 or len(rows) < evaluations:
        return None
    share = np.bincount(labels).max() / len(labels)
    bound = share + CHANCE_DEVIATIONS * np.sqrt(share * (1 - share) / len(labels))
    if any(row["test_accuracy"] > bound for row in rows[-evaluations:]):
        return None
    first = len(rows) - evaluations
    while first > 0 and rows[first - 1]["test_accuracy"] <= bound:
        first -= 1
    return (f"test accuracy {rows[-1]['test_accuracy']:.4f} is at most {bound:.4f} (the largest class's "
            f"share {share:.4f} of the test labels and {CHANCE_DEVIATIONS:g} standard deviations of "
            f"guessing) at every evaluation from round {rows[first]['round']} to {rows[-1]['round']}: "
            "at chance")


def _block_rows(first_round: int, metrics: dict[str, np.ndarray],
                epsilons: Mapping[int, float] | None = None) -> list[dict[str, Any]]:
    """A row per round of a block's metrics, with the privacy spent by that round where it is counted."""
    num_rounds = len(next(iter(metrics.values())))
    rows = [{"round": first_round + i + 1, **{k: float(v[i]) for k, v in metrics.items()}}
            for i in range(num_rounds)]
    for row in rows:
        if epsilons and row["round"] in epsilons:
            row["epsilon"] = epsilons[row["round"]]
    return rows


def run_experiment(config: Config, run_dir: str | Path, *, resume: bool = False, overwrite: bool = False,
                   progress: bool = True, stop_after_round: int | None = None,
                   experiment: Experiment | None = None) -> dict[str, Any]:
    """Runs (or resumes) an experiment, writing its run directory as it goes.

    Rounds run in compiled blocks of ``config.eval.every``; after each block the global model is evaluated,
    the block's per-round metrics are appended to ``metrics.jsonl``, the progress bar advances, and every
    ``config.checkpoint.every_blocks`` blocks the whole loop state is checkpointed. A resumed run restarts
    from the latest checkpoint and reaches the same result as an uninterrupted one.

    Args:
      config: a validated config.
      run_dir: the run directory (created if needed).
      resume: continue from the latest checkpoint in ``run_dir``.
      overwrite: delete an existing run in ``run_dir`` first.
      progress: show a progress bar.
      stop_after_round: stop early after this round, as an interruption would (for tests and notebooks).
      experiment: a prebuilt experiment for ``config`` (skips building it again).

    Returns:
      The summary also written to ``summary.json``.
    """
    run_dir = Path(run_dir)
    if join_processes(config) and jax.process_index() > 0:
        # process 0 writes the run; the others keep a copy
        run_dir = run_dir / f".process_{jax.process_index()}"
    with StopOnSignal(f"the run in {run_dir}") as stop_request:
        return _run(config, run_dir, resume, overwrite, progress, stop_after_round, experiment, stop_request)


def _run(config: Config, run_dir: Path, resume: bool, overwrite: bool, progress: bool,
         stop_after_round: int | None, experiment: Experiment | None,
         stop_request: StopOnSignal) -> dict[str, Any]:
    resumed = prepare_run_directory(config, run_dir, resume, overwrite)
    finished = run_dir / "summary.json"
    if (resumed and finished.exists()
            and (read_metrics(run_dir) or [{}])[-1].get("round") == config.rounds.num_rounds):
        print(f"fedjax-lab: {run_dir} has finished all {config.rounds.num_rounds} rounds; nothing to resume "
              "(its results are unchanged)", file=sys.stderr)
        return json.loads(finished.read_text())
    experiment = experiment or build_experiment(config)
    if experiment.layout:  # which layout runs, and why (this start's: a resume may choose again)
        write_atomically(run_dir / "layout.json", json.dumps(experiment.layout, indent=1) + "\n")
    directory = RunDirectory(run_dir, config.checkpoint.keep)
    state = experiment.initial_state()
    if resumed:
        state = directory.restore_checkpoint(state)
        if agreed(int(state.round), min) != agreed(int(state.round), max):
            raise RunDirectoryError(f"cannot resume {run_dir}: the processes' latest checkpoints are at "
                                    "different rounds; delete the later ones, or start again with "
                                    "--overwrite")
        directory.truncate_metrics(int(state.round))
        (run_dir / "summary.json").unlink(missing_ok=True)  # rewritten when the run finishes
    else:
        write_atomically(directory.config_path, to_yaml(config))
        with naming(run_dir / "partition.*"):
            write_partition_report(experiment.dataset, run_dir, {"seed": config.seed})
        directory.metrics_path.write_text("")
        directory.append_metrics([{"round": 0, **experiment.evaluate(state)}])

    initial_test_loss = directory.read_metrics()[0].get("test_loss", 1.0)
    total = config.rounds.num_rounds
    stop = total if stop_after_round is None else min(stop_after_round, total)
    bar = tqdm(total=total, initial=int(state.round), unit="round", disable=not progress, dynamic_ncols=True,
               desc=experiment.dataset.name)
    timings: list[tuple[int, float]] = []
    try:
        state, diverged = _run_blocks(experiment, directory, state, stop, initial_test_loss, bar, timings,
                                      stop_request)
    except StopRequested as request:
        bar.close()
        _leave_what_ran(directory, timings, experiment)
        raise RunInterrupted(run_dir, read_metrics(run_dir)[-1]["round"], request.signum) from None
    except KeyboardInterrupt:
        bar.close()
        _leave_what_ran(directory, timings, experiment)
        raise RunInterrupted(run_dir, read_metrics(run_dir)[-1]["round"], checkpointed=False) from None
    bar.close()
    (run_dir / INTERRUPTED).unlink(missing_ok=True)
    summary = {**_summarise(directory, timings, experiment), "diverged": diverged}
    if int(state.round) == total or diverged:
        directory.write_summary(summary)
        with naming(run_dir / "curves.png"):
            plot_runs([run_dir], run_dir / "curves.png")
        if experiment.plan.asynchronous:
            with naming(run_dir / "staleness.png"):
                plot_staleness([run_dir], run_dir / "staleness.png")
    return summary


def agreed(value: int, reduce) -> int:
    """``reduce`` (``max``, ``min``) of an integer over the processes of a distributed run (a collective:
    every process must call it); the value itself in a single process."""
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils

    return int(reduce(np.asarray(multihost_utils.process_allgather(np.int32(value))).ravel()))


def _run_blocks(experiment: Experiment, directory: RunDirectory, state, stop: int, initial_test_loss: float,
                bar, timings: list, stop_request: StopOnSignal) -> tuple[Any, str | None]:
    """Runs compiled blocks of rounds until round ``stop`` or divergence, writing metrics and checkpoints as
    it goes; returns the state and why the run diverged (or ``None``).

    Raises:
      StopRequested: a signal arrived; the state so far is checkpointed first.
    """
    config = experiment.config
    total, every = config.rounds.num_rounds, config.eval.every
    blocks_run, diverged = 0, None
    while int(state.round) < stop and not diverged:
        requested = agreed(stop_request.signum or 0, max)  # every process stops at the same block
        if requested:
            if int(state.round) > 0:
                directory.save_checkpoint(state)
            raise StopRequested(requested)
        first = int(state.round)
        num_rounds = min(every - first % every, stop - first)
        start = time.perf_counter()
        state, metrics = experiment.run_rounds(state, experiment.inputs, num_rounds=num_rounds)
        if jax.process_count() > 1:  # bring the state home: evaluation and checkpoints stay per process
            state = to_host(state)
        metrics, arrays = split_arrays(to_host(metrics))
        rows = _block_rows(first, metrics, experiment.epsilons)
        timings.append((num_rounds, time.perf_counter() - start))
        if int(state.round) % every == 0 or int(state.round) == total:
            rows[-1].update(experiment.evaluate(state))
        diverged = divergence(rows, initial_test_loss)
        if diverged:
            rows[-1]["diverged"] = diverged
        directory.append_metrics(rows)
        directory.append_arrays(first, arrays)
        if diverged:
            print(f"fedjax-lab: run diverged ({diverged}); stopped", file=sys.stderr)
            break
        blocks_run += 1
        if int(state.round) == total or (config.checkpoint.every_blocks
                                         and blocks_run % config.checkpoint.every_blocks == 0):
            directory.save_checkpoint(state)
        bar.update(num_rounds)
        if "test_accuracy" in rows[-1]:
            bar.set_postfix(acc=f"{rows[-1]['test_accuracy']:.4f}", loss=f"{rows[-1]['test_loss']:.4f}")
    return state, diverged


def rounds_to_target(evaluated: list[dict[str, Any]], target: float | None) -> int | None:
    """The first evaluated round whose test accuracy reaches ``target`` (``None``: no target, or never)."""
    if target is None:
        return None
    return next((row["round"] for row in evaluated if row["test_accuracy"] >= target), None)


INTERRUPTED = "interrupted.json"
"""What an interrupted run leaves beside ``curves.png`` of the rounds it ran: the summary so far. It is not
``summary.json``, which says a run has finished; a resumed run removes it."""


def _leave_what_ran(directory: RunDirectory, timings: list[tuple[int, float]],
                    experiment: Experiment) -> None:
    """After an interruption: the summary of the rounds that ran (``interrupted.json``) and their curves, so
    the run directory shows what happened. A failure to write them (a full disk) does not hide the
    interruption."""
    try:
        summary = {**_summarise(directory, timings, experiment), "interrupted": True,
                   "num_rounds": experiment.config.rounds.num_rounds}
        write_atomically(directory.path / INTERRUPTED, json.dumps(summary, indent=2) + "\n")
        total = experiment.config.rounds.num_rounds
        plot_runs([directory.path], directory.path / "curves.png",
                  title=f"{describe_run(run_config(directory.path))}: interrupted at round "
                        f"{summary['rounds']} of {total}")
    except (OSError, ValueError, KeyError):
        pass


def machine() -> dict[str, Any]:
    """What decides a run's float rounding besides its config: the device kind and, on a CPU, its model and
    the cores this process may use. XLA sizes its CPU thread pool from those cores, and another pool splits
    and sums the matrix products in another order, which training amplifies into points of final accuracy:
    two arms of a paired comparison (FedCOG and its FedAvg, identical until FedCOG starts) must share it, and
    the library of the matrix products too (the summary's ``cpu_matmul``, ``rounds.cpu_matmul``)."""
    device = jax.devices()[0]
    out: dict[str, Any] = {"device_kind": device.device_kind}
    if device.platform == "cpu":
        affinity = getattr(os, "sched_getaffinity", None)
        out["cpu_threads"] = len(affinity(0)) if affinity else os.cpu_count()
        out["cpu"] = cpu_model()
    return out


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else ``platform.processor()``, else ``'unknown'``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _summarise(directory: RunDirectory, timings: list[tuple[int, float]],
               experiment: Experiment) -> dict[str, Any]:
    rows = directory.read_metrics()
    evaluated = [row for row in rows if "test_accuracy" in row]
    healthy = [row for row in evaluated if "diverged" not in row] or evaluated[:1]
    best = max(healthy, key=lambda row: row["test_accuracy"])
    steady = timings[1:] or timings
    rounds, seconds = sum(n for n, _ in steady), sum(t for _, t in steady)
    return {
        "dataset": experiment.dataset.summary(),
        "rounds": rows[-1]["round"],
        "final": evaluated[-1],
        "best_test_accuracy": best["test_accuracy"],
        "best_round": best["round"],
        "rounds_to_target": rounds_to_target(healthy, experiment.config.eval.target_accuracy),
        "collapsed": constant_predictor(healthy, labels := experiment.dataset.test["y"]),
        "at_chance": at_chance(healthy, labels, pad_label=experiment.classifier.pad_label),
        "rounds_per_second": rounds / seconds if seconds else None,
        "first_block_seconds": timings[0][1] if timings else None,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "cohort_devices": experiment.plan.num_devices,  # the split sums the messages in another order
        **machine(),
        **({"cpu_matmul": experiment.cpu_matmul} if experiment.cpu_matmul is not None else {}),
        **({"privacy": privacy_summary(experiment.config, experiment.dataset.num_clients)}
           if experiment.config.privacy is not None else {}),
    }
