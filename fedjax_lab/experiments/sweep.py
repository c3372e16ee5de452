"""Many runs in one compiled program: a grid of seeds and hyper-parameters, vmapped.

``run_sweep(config, {"seed": [0, 1, 2, 3], "client.learning_rate": [0.01, 0.05]})`` expands the grid into
members (each a full config, written to its own run directory) and, when the members differ only in their seed
and data fields (``hyperparams.py``), runs them as one program: the loop state is stacked over the members and
``vmap``-ed, ``member_chunk`` members at a time (``lax.map`` over the chunks bounds memory, as ``chunk_size``
does for the cohort; unset, the fastest way is measured: ``layout.choose_member_chunk``), and split over
``parallel.devices`` devices. Members that change shapes or structure (a
model size, the cohort, the method) run one after another instead, and the sweep says so. Either way each
member's directory is an ordinary run directory (``config.yaml``, ``metrics.jsonl``, checkpoints,
``summary.json``, ``curves.png``) that ``fedjax-lab run --resume`` continues, and the sweep writes
``sweep.md`` / ``sweep.json`` (final and best accuracy per member, mean and spread over seeds) and
``curves.png`` (the curves of each setting with their spread over seeds).

A seed in a grid varies the training's randomness (initialisation, cohorts, shuffles); the data and its
partition stay those of the base config's seed, which each member's config pins (``dataset.seed``).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec
from tqdm.auto import tqdm

from fedjax_lab.data.report import write_partition_report
from fedjax_lab.engine import init_loop_state, randomness, run_round
from fedjax_lab.engine.sharding import client_mesh, place_training_arrays
from fedjax_lab.engine.simulation import jit_with_options, map_cohort
from fedjax_lab.experiments import hyperparams, layout, privacy
from fedjax_lab.experiments.build import build_experiment
from fedjax_lab.experiments.classifiers import CONV_MODELS
from fedjax_lab.experiments.config import Config, ConfigError, Grid, apply_override, to_yaml, validate
from fedjax_lab.experiments.datasets import build_dataset
from fedjax_lab.experiments.run_directory import (
    RunDirectory,
    clear_run,
    holds_run,
    naming,
    read_metrics,
    split_arrays,
    write_atomically,
)
from fedjax_lab.experiments.runner import (
    _block_rows,
    _summarise,
    check_run_directory,
    divergence,
    run_experiment,
)
from fedjax_lab.experiments.signals import RunInterrupted, StopOnSignal


@dataclasses.dataclass(frozen=True)
class Member:
    """One run of a sweep: its name (its grid values), those values, and its whole config."""

    name: str
    values: dict[str, Any]
    config: Config


def expand(config: Config, grid: Grid) -> list[Member]:
    """The grid's members in order (the last key varies fastest), each validated.

    Raises:
      ConfigError: an empty axis, or a member whose config is invalid (named by its values).
    """
    for key, values in grid.items():
        if not values:
            raise ConfigError(f"grid {key}: give at least one value")
        repeated = [v for i, v in enumerate(values) if v in values[:i]]
        if repeated:
            raise ConfigError(f"grid {key}: {repeated[0]!r} is listed twice in {values}; each member needs "
                              "its own values (and run directory)")
    raw = config.model_dump(mode="json")
    if "seed" in grid and "seed" in type(config.dataset).model_fields and raw["dataset"].get("seed") is None:
        # the data stays the base config's; only training randomness varies
        raw["dataset"]["seed"] = config.seed
    members = []
    for combination in itertools.product(*grid.values()):
        values = dict(zip(grid, combination))
        member_raw = json.loads(json.dumps(raw))
        for key, value in values.items():
            apply_override(member_raw, f"{key}={json.dumps(value)}")
        name = ",".join(f"{key}={value}" for key, value in values.items())
        try:
            members.append(Member(name, values, validate(member_raw)))
        except ConfigError as error:
            raise ConfigError(f"sweep member {name}: {error}") from None
    names = [m.name for m in members]
    shared = sorted({n for n in names if names.count(n) > 1})
    if shared:
        raise ConfigError(f"grid: several members would share the run directory {shared[0]!r}; give values "
                          "that differ as written")
    return members


def why_not_one_program(members: list[Member]) -> str | None:
    """Why the members cannot share one compiled program (they differ in more than their seeds and data
    fields), or ``None``."""
    def structure(member):
        dump = member.config.model_dump(mode="json")
        dump.pop("seed")
        for path in hyperparams.hyperparams(member.config):
            node = dump
            *parents, leaf = path.split(".")
            for key in parents:
                node = next(p for p in node if p["name"] == key) if isinstance(node, list) else node[key]
            node.pop(leaf)
        return dump

    first = structure(members[0])
    for member in members[1:]:
        if structure(member) != first:
            data = hyperparams.hyperparams(member.config)
            keys = [k for k in member.values if k != "seed" and k not in data]
            return (f"{', '.join(keys) or 'the grid'} changes the program's structure or shapes (only seed "
                    f"and the float fields of client, algorithm and privacy are data: {', '.join(data)})")
    return None


def default_member_chunk(num_members: int, backend: str, model: str = "mlp") -> int | None:
    """Members vmapped at once when ``member_chunk`` is unset (docs/benchmarks.md has the measurements), or
    ``None`` for separate runs one after another: all of them on an accelerator; on CPU up to 8 for dense
    models (8 MNIST-MLP seeds ran 1.11-1.20x their runs one after another; fewer at a time ran 0.83-0.87x),
    and separate runs for convolutional models, whose vmapped convolutions run slower per example on CPU (the
    cohort's reason, ``build.default_chunk_size``), so that a sweep is never slower than its runs."""
    if backend != "cpu":
        return num_members
    if model in CONV_MODELS:
        return None
    return max(d for d in range(1, min(num_members, 8) + 1) if num_members % d == 0)


def run_sweep(config: Config, grid: Grid, sweep_dir: str | Path | None = None, *, resume: bool = False,
              overwrite: bool = False, progress: bool = True, member_chunk: int | None = None,
              stop_after_round: int | None = None) -> dict[str, Any]:
    """Runs every member of ``grid`` over ``config`` (see the module docstring) and returns the sweep summary,
    also written to ``sweep_dir/sweep.json``.

    Args:
      config: the base config; the grid's keys are dotted paths of it (``seed``, ``client.learning_rate``,
        ``algorithm.plugins.fedwalk.tau``, or any other field, which makes the members run one after another).
      grid: ``{path: [values]}``.
      sweep_dir: where the members' run directories and the sweep table go (default ``runs/sweep``).
      resume, overwrite: as for a single run, for every member.
      member_chunk: members vmapped at once (must divide their number); default measured (``rounds.layout:
        measure``) or the rules (``default_member_chunk``).
      stop_after_round: stop early, as an interruption would.
    """
    sweep_dir = Path(sweep_dir or "runs/sweep")
    if member_chunk is not None and member_chunk < 1:
        raise ConfigError(f"--chunk must be at least 1, got {member_chunk}")
    members = expand(config, grid)
    if sweep_dir.exists() and not sweep_dir.is_dir():
        raise ConfigError(f"sweep directory {str(sweep_dir)!r} is a file")
    if overwrite and sweep_dir.exists():  # the members' runs and the table; nothing else in the folder
        for member in members:
            clear_run(sweep_dir / member.name)
        for name in ("sweep.json", "sweep.md", "curves.png", "layout.json"):
            (sweep_dir / name).unlink(missing_ok=True)
    _refuse_taken(members, sweep_dir, resume)
    reason = why_not_one_program(members) if len(members) > 1 else "a single member"
    chunk, measured = member_chunk, None
    if reason is None:
        chunk, measured = _member_chunk(members, member_chunk, sweep_dir, resume)
    if reason is None and chunk is None:
        reason = measured["why"] if measured else (
            f"{config.model.name} is convolutional: on CPU its vmapped members run slower than separate "
            "runs; --chunk N vmaps them anyway")
    if measured is not None:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(sweep_dir / "layout.json", json.dumps(measured, indent=1) + "\n")
    start = time.perf_counter()
    if reason is None:
        share = len(members) // sweep_devices(config)
        if share % chunk:
            raise ConfigError(f"--chunk must divide each device's share of the members ({share}), got "
                              f"{chunk}")
        devices = sweep_devices(config)
        arrangement = f"one program, {chunk} member(s) vmapped at a time" + (
            f" on each of {devices} devices" if devices > 1 else "")
        print(f"fedjax-lab: sweep of {len(members)} members as {arrangement}", file=sys.stderr)
        with StopOnSignal(f"the sweep in {sweep_dir}") as stop_request:
            summaries = _run_together(members, sweep_dir, chunk, resume, progress, stop_after_round,
                                      stop_request)
    else:
        arrangement = f"one after another ({reason})"
        print(f"fedjax-lab: sweep of {len(members)} members runs {arrangement}", file=sys.stderr)
        for member in members:  # every member's directory checked before any runs
            check_run_directory(member.config, sweep_dir / member.name, resume, overwrite=False)
        with StopOnSignal(f"the sweep in {sweep_dir}"):
            summaries = [run_experiment(m.config, sweep_dir / m.name, resume=resume, progress=progress,
                                        stop_after_round=stop_after_round) for m in members]
    return write_sweep_report(sweep_dir, members, summaries, grid, arrangement, time.perf_counter() - start)


def _member_chunk(members: list[Member], given: int | None, sweep_dir: Path,
                  resume: bool) -> tuple[int | None, dict | None]:
    """The members vmapped at once (``None``: separate runs) of members that share one program, and how it
    was measured (``None`` unless it was): ``given`` (``--chunk``) if set; the rules' with ``rounds.layout:
    rules`` or several devices (measured on one only); the way a resumed sweep started with; else the measured
    fastest (:func:`.layout.choose_member_chunk`)."""
    config = members[0].config
    devices = sweep_devices(config)
    if len(members) % devices:
        raise ConfigError(f"parallel.devices={devices} must divide the number of members ({len(members)})")
    if given is not None:
        return given, None
    share = len(members) // devices
    rule = default_member_chunk(share, jax.default_backend(), config.model.name)
    if config.rounds.layout != "measure" or devices > 1:
        return rule, None
    if resume and (sweep_dir / "layout.json").exists():  # a resumed sweep goes on the way it started
        started = json.loads((sweep_dir / "layout.json").read_text())
        return started["member_chunk"], {**started, "how": "resumed"}
    return _measured_member_chunk(members, share, rule)


def _measured_member_chunk(members: list[Member], share: int, rule: int | None) -> tuple[int | None, dict]:
    """:func:`.layout.choose_member_chunk` for the members, keyed by the layout key, the members and the
    run's budget; the programs are built only when the cache has no choice. With ``local_epochs`` a round's
    steps are the median client's, which favours vmapping a little (a vmapped round waits for its busiest
    client)."""
    config, client = members[0].config, members[0].config.client
    dataset = build_dataset(config)
    steps = client.local_steps or client.local_epochs * math.ceil(
        float(np.median(dataset.client_train_counts)) / client.batch_size)
    key = json.loads(layout.layout_key(config, tuple(dataset.input_shape), config.rounds.clients_per_round))
    key = json.dumps({**key, "sweep_members": len(members), "sweep_share": share, "rounds":
                      config.rounds.num_rounds, "local_steps": client.local_steps,
                      "local_epochs": client.local_epochs}, sort_keys=True)
    short = [dataclasses.replace(m, config=layout.short_budget(m.config)) for m in members]

    def time_program(chunk: int) -> tuple[float, float]:
        program = build_sweep_program(short, chunk)
        return layout.timed_calls(lambda states: program.run(states, 1), program.initial_states())

    def time_run() -> tuple[float, float]:  # one timed call: a slow member keeps the rules
        experiment = build_experiment(short[0].config)  # also the cohort's own layout, measured or cached
        return layout.timed_calls(lambda state: experiment.run_rounds(state, experiment.inputs, num_rounds=1),
                                  experiment.initial_state(), min_calls=1)

    chosen, info = layout.choose_member_chunk(
        key, rule=rule, share=share, members=len(members), rounds=config.rounds.num_rounds,
        steps_ratio=steps / layout.MEASURED_STEPS, time_program=time_program, time_run=time_run)
    return chosen, {**info, "key": json.loads(key)}


def sweep_devices(config: Config) -> int:
    """Devices a one-program sweep splits its members over: ``parallel.devices`` (each member's cohort then
    stays on one device); one for ``auto``, which splits a single run's cohort, not a sweep's members (members
    run as runs of their own split their cohorts as any run does)."""
    devices = config.parallel.devices
    return len(jax.devices()) if devices == "all" else 1 if devices == "auto" else devices


def _stack(trees: list[Any]) -> Any:
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _member(tree: Any, i: int) -> Any:
    return jax.tree.map(lambda x: x[i], tree)


@dataclasses.dataclass
class SweepProgram:
    """The members' runs as one compiled program: ``states = program.initial_states()``, then
    ``states, metrics = program.run(states, num_rounds)`` (every leaf with a leading member axis)."""

    experiment: Any
    keys: jax.Array
    values: dict[str, jax.Array]
    member_chunk: int
    _init: Any = None
    _run: Any = None
    configs: list[Config] = dataclasses.field(default_factory=list)  # each member's, its privacy resolved
    epsilons: list[Mapping[int, float]] = dataclasses.field(default_factory=list)  # each member's ε by round

    def initial_states(self):
        return self._init(self.keys, self.values, self.experiment.inputs)

    def run(self, states, num_rounds: int):
        return self._run(states, self.keys, self.values, self.experiment.inputs, num_rounds=num_rounds)


def build_sweep_program(members: list[Member], member_chunk: int,
                        cohort_chunk: int | None = None) -> SweepProgram:
    """Builds the shared program once from the members' structure config (:func:`_structure_config`) and
    vmaps it over their keys and hyper-parameter values, ``member_chunk`` members at a time. ``cohort_chunk``
    overrides the cohort's chunk size (default: a single run's, which also measured fastest under the members'
    vmap; docs/benchmarks.md)."""
    structure = _structure_config(members)
    devices = sweep_devices(structure)
    mesh = client_mesh(devices) if devices > 1 else None
    structure = structure.model_copy(
        update={"parallel": structure.parallel.model_copy(update={"devices": 1})})
    experiment = build_experiment(structure)
    if cohort_chunk is not None:
        experiment = dataclasses.replace(experiment,
                                         plan=dataclasses.replace(experiment.plan, chunk_size=cohort_chunk))
    if mesh is not None:  # every device reads the training arrays: placed there once, not copied each call
        train = place_training_arrays(experiment.dataset.train, mesh)
        inputs = experiment.inputs._replace(train_arrays=train)
        experiment = dataclasses.replace(experiment, inputs=jax.device_put(
            inputs, NamedSharding(mesh, PartitionSpec())))
    algorithm_at, plan, classifier = experiment.algorithm_at, experiment.plan, experiment.classifier

    @jax.jit
    def initial_states(keys, values, inputs):
        def one(inputs, key, hp):
            member_inputs = inputs._replace(key=key, hparams=hp)
            params = classifier.init(randomness.init_key(key))
            return init_loop_state(algorithm_at(member_inputs, jnp.zeros((), jnp.int32)), params,
                                   plan.num_clients, plan, member_inputs)

        return map_cohort(one, member_chunk, keys, values, shared=(inputs,), mesh=mesh)

    def run_rounds(states, keys, values, inputs, num_rounds):
        def one(inputs, state, key, hp):
            member_inputs = inputs._replace(key=key, hparams=hp)
            return jax.lax.scan(lambda s, _: run_round(algorithm_at, plan, s, member_inputs), state, None,
                                length=num_rounds)

        return map_cohort(one, member_chunk, states, keys, values, shared=(inputs,), mesh=mesh)

    keys = jnp.stack([randomness.base_key(m.config.seed) for m in members])
    num_clients = experiment.dataset.num_clients
    configs = [privacy.resolve(m.config, num_clients) for m in members]  # a noise multiplier for each
    values = _stack([hyperparams.as_arrays(hyperparams.hyperparams(c)) for c in configs])
    run_rounds = jit_with_options(run_rounds, layout.compiler_options(experiment.cpu_matmul),
                                  static_argnames="num_rounds")
    return SweepProgram(experiment, keys, values, member_chunk, initial_states, run_rounds, configs,
                        [privacy.epsilons(c, num_clients) for c in configs])


def _run_together(members: list[Member], sweep_dir: Path, chunk: int, resume: bool, progress: bool,
                  stop_after_round: int | None, stop_request: StopOnSignal) -> list[dict[str, Any]]:
    """The shared program's host loop: blocks of rounds, then each member's evaluation, metrics,
    checkpoint."""
    total = members[0].config.rounds.num_rounds
    resumed = _check_members(members, sweep_dir, resume)
    finished = [sweep_dir / m.name / "summary.json" for m in members]
    if all(resumed) and all(f.exists() and _done(read_metrics(f.parent), total) for f in finished):
        print(f"fedjax-lab: every member of {sweep_dir} has finished all {total} rounds; nothing to resume",
              file=sys.stderr)
        return [json.loads(f.read_text()) for f in finished]
    if not all(resumed):
        if resume:
            print(f"fedjax-lab: --resume: {sweep_dir} has no checkpoint yet; starting every member from "
                  "round 0", file=sys.stderr)
        for m in members:
            clear_run(sweep_dir / m.name)
    program = build_sweep_program(members, chunk)
    directories = [RunDirectory(sweep_dir / m.name, m.config.checkpoint.keep) for m in members]
    if all(resumed):
        states, diverged = _restore_members(program, directories, sweep_dir)
    else:
        states, diverged = _start_members(program, members, directories)
    stop = total if stop_after_round is None else min(stop_after_round, total)
    states, timings = _run_blocks(program, members, directories, states, diverged, sweep_dir, stop, progress,
                                  stop_request)
    return _finish_members(program, members, directories, states, diverged, timings)


def _check_members(members: list[Member], sweep_dir: Path, resume: bool) -> list[bool]:
    """Whether each member resumes; refuses runs that would be overwritten, or a sweep whose members cannot
    resume together."""
    _refuse_taken(members, sweep_dir, resume)
    plans = [check_run_directory(m.config, sweep_dir / m.name, resume, overwrite=False) for m in members]
    resumed = [action == "resume" for action, _ in plans]
    if any(resumed) and not all(resumed):
        fresh = [m.name for m, r in zip(members, resumed) if not r]
        raise ConfigError(f"cannot resume {sweep_dir} as one program: members {', '.join(fresh)} have no "
                          "checkpoint while the others have; resume each with fedjax-lab run "
                          "MEMBER/config.yaml --run-dir MEMBER --resume, or start again with --overwrite")
    return resumed


def _refuse_taken(members: list[Member], sweep_dir: Path, resume: bool) -> None:
    """Refuses, without ``--resume``, a sweep whose members' directories already hold runs."""
    taken = [m.name for m in members if holds_run(sweep_dir / m.name)]
    if taken and not resume:
        raise ConfigError(f"sweep directory {sweep_dir} already holds runs of these members "
                          f"({', '.join(taken)}); "
                          "pass --resume to continue them or --overwrite to start again")


def _restore_members(program: SweepProgram, directories: list[RunDirectory], sweep_dir: Path):
    """The members' stacked states from their checkpoints (all at one round), and which had diverged."""
    initial = program.initial_states()
    states = _stack([d.restore_checkpoint(_member(initial, i)) for i, d in enumerate(directories)])
    first = int(states.round[0])
    if any(int(r) != first for r in states.round):
        raise ConfigError(f"cannot resume {sweep_dir}: its members' checkpoints are at different rounds "
                          f"({sorted({int(r) for r in states.round})}); resume them one by one with "
                          "fedjax-lab run")
    # A member that diverged stopped writing at its divergence; it stays stopped (its state still runs along).
    diverged = [(d.read_metrics() or [{}])[-1].get("diverged") for d in directories]
    for d, reason in zip(directories, diverged):
        if not reason:
            d.truncate_metrics(first)
        (d.path / "summary.json").unlink(missing_ok=True)
    return states, diverged


def _start_members(program: SweepProgram, members: list[Member], directories: list[RunDirectory]):
    """The members' initial states, with each run directory's config, partition report and round-0 row."""
    experiment, states = program.experiment, program.initial_states()
    for i, (member, d) in enumerate(zip(members, directories)):
        write_atomically(d.config_path, to_yaml(member.config))
        with naming(d.path / "partition.*"):  # one dataset for every member: drawn once
            write_partition_report(experiment.dataset, d.path, {"seed": member.config.seed},
                                   drawn_in=directories[0].path if i else None)
        d.metrics_path.write_text("")
        d.append_metrics([{"round": 0, **experiment.evaluate_params(member_params(experiment, states, i))}])
    return states, [None] * len(members)


def _run_blocks(program: SweepProgram, members: list[Member], directories: list[RunDirectory], states,
                diverged: list, sweep_dir: Path, stop: int, progress: bool, stop_request: StopOnSignal):
    """Runs blocks of rounds up to ``stop``, writing each live member's rows (and evaluation) after each block
    and checkpointing every member together; returns the states and the blocks' timings."""
    experiment, config = program.experiment, members[0].config
    total, every = config.rounds.num_rounds, config.eval.every
    initial_losses = [d.read_metrics()[0].get("test_loss", 1.0) for d in directories]
    timings, blocks_run = [], 0
    bar = tqdm(total=total, initial=int(states.round[0]), unit="round", disable=not progress,
               dynamic_ncols=True, desc=f"sweep of {len(members)}")
    while int(states.round[0]) < stop:
        if stop_request.signum is not None:
            for i, d in enumerate(directories):  # every member, so that all resume from the same round
                if int(states.round[0]) > 0:
                    d.save_checkpoint(_member(states, i))
            bar.close()
            raise RunInterrupted(sweep_dir, int(states.round[0]), stop_request.signum)
        first = int(states.round[0])
        num_rounds = min(every - first % every, stop - first)
        begin = time.perf_counter()
        states, metrics = program.run(states, num_rounds)
        metrics = jax.device_get(metrics)
        timings.append((num_rounds, time.perf_counter() - begin))
        evaluate = int(states.round[0]) % every == 0 or int(states.round[0]) == total
        blocks_run += 1
        checkpoint = int(states.round[0]) == total or (config.checkpoint.every_blocks
                                                      and blocks_run % config.checkpoint.every_blocks == 0)
        for i, d in enumerate(directories):
            if diverged[i]:
                continue
            scalars, arrays = split_arrays({k: v[i] for k, v in metrics.items()})
            rows = _block_rows(first, scalars, program.epsilons[i])
            if evaluate:
                rows[-1].update(experiment.evaluate_params(member_params(experiment, states, i)))
            diverged[i] = divergence(rows, initial_losses[i])
            if diverged[i]:
                rows[-1]["diverged"] = diverged[i]
                print(f"fedjax-lab: member {members[i].name} diverged ({diverged[i]})", file=sys.stderr)
            d.append_metrics(rows)
            d.append_arrays(first, arrays)
        for i, d in enumerate(directories if checkpoint else ()):  # after the metrics; diverged members too,
            d.save_checkpoint(_member(states, i))                   # so that all resume from the same round
        bar.update(num_rounds)
    bar.close()
    return states, timings


def _finish_members(program: SweepProgram, members: list[Member], directories: list[RunDirectory], states,
                    diverged: list, timings) -> list[dict[str, Any]]:
    """Each member's summary, written (with its curves) when it finished or diverged."""
    experiment, total = program.experiment, members[0].config.rounds.num_rounds
    summaries = []
    for i, d in enumerate(directories):
        summary = {**_summarise(d, timings, experiment), "diverged": diverged[i],
                   "sweep_members_per_program": len(members)}
        if program.configs[i].privacy is not None:
            summary["privacy"] = privacy.privacy_summary(program.configs[i], experiment.dataset.num_clients)
        if int(states.round[0]) == total or diverged[i]:
            d.write_summary(summary)
            from fedjax_lab.experiments.plots import plot_runs

            with naming(d.path / "curves.png"):
                plot_runs([d.path], d.path / "curves.png")
        summaries.append(summary)
    return summaries


def _done(rows: list[dict[str, Any]], total: int) -> bool:
    """Whether a member's metrics show it finished: every round run, or stopped by its divergence."""
    return bool(rows) and (rows[-1].get("round") == total or "diverged" in rows[-1])


def member_params(experiment, states, i: int):
    """Member ``i``'s model as evaluation reports it (the global model, or FedExP's average of two
    iterates)."""
    return experiment.algorithm.evaluated_params(_member(states, i).server_state)


def _structure_config(members: list[Member]) -> Config:
    """The config that decides the shared program's structure: the first member's, with a momentum buffer or
    weight decay wherever any member uses one (at a value of 0 they compute exactly what their absence
    does)."""
    base = members[0].config
    client = base.client.model_copy(update={
        "momentum": max(m.config.client.momentum for m in members),
        "weight_decay": max(m.config.client.weight_decay for m in members)})
    return base.model_copy(update={"client": client})


def write_sweep_report(sweep_dir: Path, members: list[Member], summaries: list[dict[str, Any]], grid: Grid,
                       layout: str, seconds: float) -> dict[str, Any]:
    """``sweep.json``, ``sweep.md`` (a row per member, then mean ± std over seeds for each setting) and
    ``curves.png`` (each setting's mean test accuracy with its spread over seeds)."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    private = any("privacy" in s for s in summaries)
    rows = [{"member": m.name, **m.values, "final_accuracy": s["final"].get("test_accuracy"),
             "best_accuracy": s.get("best_test_accuracy"), "best_round": s.get("best_round"),
             "diverged": s.get("diverged"), "collapsed": s.get("collapsed"), "at_chance": s.get("at_chance"),
             **({"epsilon": (s.get("privacy") or {}).get("epsilon")} if private else {})}
            for m, s in zip(members, summaries)]
    settings: dict[str, list[int]] = {}
    for i, m in enumerate(members):
        settings.setdefault(",".join(f"{k}={v}" for k, v in m.values.items() if k != "seed") or "all",
                            []).append(i)
    groups = []
    for label, idx in settings.items():
        finals = [rows[i]["final_accuracy"] for i in idx]
        bests = [rows[i]["best_accuracy"] for i in idx]
        groups.append({"setting": label, "members": len(idx), "final_mean": float(np.mean(finals)),
                       "final_std": _std(finals), "best_mean": float(np.mean(bests)),
                       "best_std": _std(bests), **({"epsilon": rows[idx[0]]["epsilon"]} if private else {})})
    summary = {"grid": grid, "layout": layout, "seconds": seconds, "members": rows, "settings": groups}
    write_atomically(sweep_dir / "sweep.json", json.dumps(summary, indent=1, default=str) + "\n")
    eps_head, eps_rule = (" ε |", "---:|") if private else ("", "")

    def eps(row):
        return f" {_epsilon(row['epsilon'])} |" if private else ""

    lines = [f"# Sweep: {len(members)} members, {layout}, {seconds:.0f} s", "",
             (f"| member |{eps_head} final accuracy | best accuracy (round) | "
              "diverged, collapsed or at chance |"),
             f"|---|{eps_rule}---:|---:|---|"]
    lines += [f"| {r['member']} |{eps(r)} {r['final_accuracy']:.4f} | {r['best_accuracy']:.4f} "
              f"({r['best_round']}) | {r['diverged'] or r['collapsed'] or r['at_chance'] or ''} |"
              for r in rows]
    lines += ["", "Over seeds (mean ± sample standard deviation, ddof 1; one member: no spread):", "",
              f"| setting | members |{eps_head} final accuracy | best accuracy |",
              f"|---|---:|{eps_rule}---:|---:|"]
    lines += [f"| {g['setting']} | {g['members']} |{eps(g)} {g['final_mean']:.4f}{_spread(g['final_std'])} | "
              f"{g['best_mean']:.4f}{_spread(g['best_std'])} |" for g in groups]
    if private:
        lines += ["", ("ε: user-level, at each member's privacy.delta after its last round (∞: no noise); "
                       "docs/privacy.md.")]
    (sweep_dir / "sweep.md").write_text("\n".join(lines) + "\n")
    _plot_spread(sweep_dir, members, settings)
    return summary


def _epsilon(value: float | None) -> str:
    """ε as the table shows it: ``∞`` without noise."""
    return "∞" if value is None else f"{value:.3g}"


def _std(values: list[float]) -> float | None:
    """The sample standard deviation (ddof 1), or ``None`` for a single value."""
    return float(np.std(values, ddof=1)) if len(values) > 1 else None


def _spread(std: float | None) -> str:
    return "" if std is None else f" ± {std:.4f}"


def _plot_spread(sweep_dir: Path, members: list[Member], settings: dict[str, list[int]]) -> None:
    from matplotlib.figure import Figure

    from fedjax_lab.experiments.plots import describe_run, run_config

    figure = Figure(figsize=(7.5, 4.4), layout="constrained")
    ax = figure.subplots()
    for label, idx in settings.items():
        curves = [[(r["round"], r["test_accuracy"]) for r in read_metrics(sweep_dir / members[i].name)
                   if "test_accuracy" in r] for i in idx]
        length = min(len(c) for c in curves)
        rounds = np.array([x for x, _ in curves[0][:length]])
        accuracy = np.array([[y for _, y in c[:length]] for c in curves])
        mean, std = accuracy.mean(0), accuracy.std(0, ddof=1) if len(idx) > 1 else np.zeros(length)
        (line,) = ax.plot(rounds, mean,
                          label=f"{label} (mean of {len(idx)} seed{'s' if len(idx) > 1 else ''})")
        if len(idx) > 1:
            ax.fill_between(rounds, mean - std, mean + std, color=line.get_color(), alpha=0.2,
                            label=f"{label}: ± 1 sample std over seeds")
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (fraction of test examples)")
    ax.set_title(f"sweep of {describe_run(run_config(sweep_dir / members[0].name))}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    figure.savefig(sweep_dir / "curves.png", dpi=110)