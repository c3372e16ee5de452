"""What the reproduction scripts (``benchmarks/*_table.py``) share: running each cell once, with several
copies of a script sharing the work, keeping every finished run's record in the repository, and finding what
has run.

A run goes to ``<runs>/<name>`` (git-ignored: checkpoints, partition, every metrics row, array blocks). When
it finishes, its record (``records.py``: the resolved config, seed, commit, backend and devices, the evaluated
rows of the curve and the per-round metrics and arrays its report reads, the summary's final and best) is
added to ``benchmarks/results/records/<runs' folder name>.jsonl.gz``, one file per table, which is committed:
the reports read only these records, so a table regenerated in a later session, on a fresh clone, still covers
every run made before. ``python benchmarks/compact_records.py`` turns record folders of the older layout into
these files.

A run is skipped when its record or its ``summary.json`` exists (it finished before), or when another copy of
the script holds its claim file ``<runs>/.claims/<name with / as __>``, which names the copy's host and
process. A claim is released when its run ends, also when it fails. A copy killed outright (``kill -9``, a
machine that went away) leaves its claim behind: a later copy on the same host takes it over once that
process has gone, and says so; one it cannot check (another host's, or an older script's empty file) it
leaves, naming the file to remove.

A run that a killed copy left unfinished resumes from its last checkpoint when its directory holds the same
config (the runner's resume, which ends where a run never stopped ends) instead of starting again. Its summary
says where it resumed and under which commit (``resumed``); a forked run keeps its ``forked_from``. A copy
stopped by Ctrl-C or SIGTERM finishes its block, writes a checkpoint and ends with one line saying how to go
on (``run_script``), not a traceback.

The readers below (``finished``, ``evaluations``, ``metrics``, ``summary``, ``arrays``, ``sizes``, ``config``,
``has_runs``, ...) take a run either as ``records / name`` (``records`` as ``collect`` returns them) or as the
path of a run directory on disk.

A report never silently loses a cell: ``write_report`` writes a table that would leave a filled cell of the
committed one empty (regenerated before that cell's run was rerun, say) beside it, as ``*.new.md``.

A report's claims (``Claim``, ``judge``, ``claims_table``) are each judged by the paired difference over the
seeds both arms ran and its 95 % interval (``fedjax_lab/experiments/statistics.py``): held, not held or
unresolved.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import records as record_files
from records import Keep, Record

from fedjax_lab.experiments import Config, run_experiment
from fedjax_lab.experiments.run_directory import write_atomically
from fedjax_lab.experiments.signals import RunInterrupted
from fedjax_lab.experiments.statistics import describe, paired_difference, verdict

RECORDS = Path(__file__).resolve().parent / "results" / "records"
SUFFIX = ".jsonl.gz"
EVALUATIONS = Keep()
"""A record that keeps, of the metrics, the evaluated rows only (a script's ``KEEP`` says what else its report
reads)."""


class Records:
    """The records of one file, as ``collect`` returns them: ``records / "cifar10/niid1"`` is a
    ``RunPath``."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.runs: dict[str, Record] = record_files.read(self.path)

    def __truediv__(self, name: str) -> RunPath:
        return RunPath(self, str(PurePosixPath(name)))

    def __repr__(self) -> str:
        return f"Records({str(self.path)!r}, {len(self.runs)} runs)"


class RunPath:
    """A run, or a folder of runs, among ``records``: ``name`` is its path under the runs' folder."""

    def __init__(self, records: Records, name: str):
        self.records, self.name = records, name

    def __truediv__(self, name: str) -> RunPath:
        return RunPath(self.records, str(PurePosixPath(self.name, name)))

    def __repr__(self) -> str:
        return f"{self.records.path}:{self.name}"

    def record(self) -> Record | None:
        return self.records.runs.get(self.name)

    def under(self) -> dict[str, Record]:
        """The records under this folder, by their path relative to it."""
        prefix = self.name + "/"
        return {n[len(prefix):]: r for n, r in self.records.runs.items() if n.startswith(prefix)}


Run = Path | RunPath | Records


def records_of(runs: Path) -> Path:
    """The committed records of the runs under ``runs``:
    ``benchmarks/results/records/<runs.name>.jsonl.gz``."""
    return RECORDS / f"{Path(runs).name}{SUFFIX}"


def keep(run_dir: Path, records: Path, name: str, spec: Keep = EVALUATIONS,
         commit: str | None = None) -> None:
    """Adds the record of the finished run in ``run_dir`` (what ``spec`` keeps) to the file ``records`` as
    ``name``, made by ``commit`` (default: this checkout's)."""
    commit = commit or record_files.code_commit()
    record_files.add(records, [Record.from_run_dir(run_dir, name, spec, commit)])


def collect(runs: Path, spec: Keep = EVALUATIONS) -> Records:
    """Keeps the record of every finished run under ``runs`` not kept yet (runs made by an older script or
    copied in by hand), and returns the records the reports read."""
    path = records_of(runs)
    kept = record_files.read(path)
    new = []
    for summary in sorted(Path(runs).glob("**/summary.json")):
        name = summary.parent.relative_to(runs).as_posix()
        if name not in kept:
            new.append(Record.from_run_dir(summary.parent, name, spec, record_files.code_commit()))
    record_files.add(path, new)
    return Records(path)


def fork(source: Path, until: int, run_dir: Path, config: Config) -> None:
    """Makes ``run_dir`` the finished run in ``source`` as it stood after round ``until``, under ``config``,
    for the runner to resume from there.

    The two configs may differ only in plug-ins that start at round ``until`` or later, and ``config``'s
    components must be among ``source``'s: before its start round such a plug-in leaves its base's round
    unchanged bit for bit (FedCOG's tests pin this): FedAvg, FedCOG and FedCOG with the size weighting
    share their first 50 rounds, and a run of ``config`` resumed from here ends where one from round 0
    would. The components ``config`` lacks are dropped from the state, and their metrics (``<name>_*``) from
    the rows.

    Raises:
      ValueError: the configs differ in more than such plug-ins, ``config`` has a component ``source`` lacks,
        or ``source`` kept no checkpoint after round ``until``.
    """
    import yaml

    from fedjax_lab.engine.round import ServerState
    from fedjax_lab.experiments import build_experiment
    from fedjax_lab.experiments.config import to_yaml
    from fedjax_lab.experiments.run_directory import RunDirectory

    theirs = yaml.safe_load((source / "config.yaml").read_text())
    ours = config.model_dump(mode="json")
    plugins = theirs["algorithm"].pop("plugins") + ours["algorithm"].pop("plugins")
    if theirs != ours:
        raise ValueError(f"cannot fork {run_dir} from {source}: their configs differ in more than plug-ins")
    if any(p.get("start_round", 0) < until for p in plugins):
        raise ValueError(f"cannot fork {run_dir} from {source} at round {until}: every plug-in must start at "
                         f"round {until} or later")
    checkpoint = source / "checkpoints" / str(until)
    if not checkpoint.is_dir():
        raise ValueError(f"cannot fork {run_dir} from {source}: it kept no checkpoint after round {until}")
    theirs_state = build_experiment(load_config_yaml(source)).initial_state()
    ours_state = build_experiment(config).initial_state()
    dropped = set(theirs_state.server_state.components) - set(ours_state.server_state.components)
    if set(ours_state.server_state.components) - set(theirs_state.server_state.components) \
            or set(ours_state.client_states) - set(theirs_state.client_states):
        raise ValueError(f"cannot fork {run_dir} from {source}: its config has state the source's lacks")
    with tempfile.TemporaryDirectory() as tmp:  # the source's checkpoint after ``until``, alone
        shutil.copytree(checkpoint, Path(tmp) / "checkpoints" / str(until))
        state = RunDirectory(tmp).restore_checkpoint(theirs_state)
    server = state.server_state
    kept = {k: server.components[k] for k in ours_state.server_state.components}
    state = state._replace(server_state=ServerState(server.params, server.opt_state, kept),
                           client_states={k: state.client_states[k] for k in ours_state.client_states})
    if run_dir.exists():
        shutil.rmtree(run_dir)
    directory = RunDirectory(run_dir, config.checkpoint.keep)
    directory.save_checkpoint(state)
    for file in ("partition.npz", "partition.md", "partition.png"):
        shutil.copy2(source / file, run_dir / file)
    if (source / "arrays").is_dir():
        shutil.copytree(source / "arrays", run_dir / "arrays")
    rows = [{k: v for k, v in json.loads(line).items() if not k.startswith(tuple(f"{c}_" for c in dropped))}
            for line in (source / "metrics.jsonl").read_text().splitlines()]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "config.yaml").write_text(to_yaml(config))  # the resume drops the rows after ``until``


def load_config_yaml(run_dir: Path) -> Config:
    """A run directory's ``config.yaml``, validated."""
    import yaml

    from fedjax_lab.experiments.config import validate

    return validate(yaml.safe_load((run_dir / "config.yaml").read_text()))


def run_once(runs: Path, name: str, config: Config, spec: Keep = EVALUATIONS,
             fork_from: tuple[list[str], int] | None = None) -> tuple[dict[str, Any], float] | None:
    """Runs ``config`` into ``runs/name`` unless it has finished or another copy claimed it, and keeps its
    record (what ``spec`` says).

    A run left unfinished under the same config resumes from its last checkpoint. Otherwise
    ``fork_from=(others, round)`` starts it from the first of the runs ``runs/<other>`` that has finished
    and kept its checkpoint after ``round`` (:func:`fork`), and its summary (so its record) names that run
    (``forked_from``); with none such it runs from round 0.

    Returns:
      ``(summary, seconds)`` of a run made now, or None when it was skipped.
    """
    run_dir = runs / name
    kept = record_files.read(records_of(runs)).get(name)
    if (run_dir / "summary.json").is_file() or kept is not None:
        if config is not None:
            check_same_experiment(name, kept.config if kept is not None else _saved_config(run_dir), config)
        return None
    if config is not None and "layout" not in config.rounds.model_fields_set:
        # The hand rules' layout, not a timed choice: the arms of a paired claim then share their layout
        # (bit-for-bit comparisons between them hold), and no record depends on a machine's timing noise.
        config = config.model_copy(update={"rounds": config.rounds.model_copy(update={"layout": "rules"})})
    with claimed(runs, name) as mine:
        if not mine:
            return None
        commit = record_files.code_commit()  # this checkout's (read once)
        start = time.perf_counter()
        resume_after = interrupted_at(run_dir, config)
        if resume_after is None:
            others, until = fork_from or ([], 0)
            source = next((o for o in others if (runs / o / "summary.json").is_file()
                           and (runs / o / "checkpoints" / str(until)).is_dir()), None)
            if source is not None:
                fork(runs / source, until, run_dir, config)
            origin = {"commit": commit}
            if source is not None:
                origin["forked_from"] = {"run": source, "round": until}
            run_dir.mkdir(parents=True, exist_ok=True)
            write_atomically(run_dir / STARTED, json.dumps(origin) + "\n")
            summary = run_experiment(config, run_dir, resume=source is not None, overwrite=source is None,
                                     progress=False)
        else:
            print(f"{name}: resuming the unfinished run in {run_dir} after round {resume_after}", flush=True)
            origin = json.loads((run_dir / STARTED).read_text()) if (run_dir / STARTED).is_file() else {}
            origin["resumed"] = [*origin.get("resumed", []), {"round": resume_after, "commit": commit}]
            write_atomically(run_dir / STARTED, json.dumps(origin) + "\n")
            summary = run_experiment(config, run_dir, resume=True, progress=False)
        summary |= {k: origin[k] for k in ("forked_from", "resumed") if k in origin}
        write_atomically(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
        keep(run_dir, records_of(runs), name, spec, commit=origin.get("commit", commit))
    return summary, time.perf_counter() - start


def run_script(main: Callable[[], Any]) -> int:
    """Runs a table script's ``main`` and returns its exit status: 0, or ``128 + signal`` when a signal
    stopped a run after its block (its metrics and checkpoint written, its claim released).

    The stop is one line on stderr naming the run and its round. Rerunning the script is how to go on, since
    ``run_once`` resumes an unfinished run and keeps its record; the ``fedjax-lab --resume`` command in
    ``RunInterrupted``'s message would finish the run without keeping it.
    """
    try:
        main()
    except RunInterrupted as stop:
        print(f"{Path(sys.argv[0]).name}: {signal.Signals(stop.signum).name} stopped the run in "
              f"{stop.run_dir} after round {stop.last_round}; the same command resumes it", file=sys.stderr)
        return 128 + stop.signum
    return 0


EXPERIMENT = ("seed", "dataset.", "model.", "algorithm.", "client.", "rounds.num_rounds",
              "rounds.clients_per_round", "rounds.sampling_rate", "asynchrony.", "privacy.")
"""The settings that say which experiment a table's cell holds: a setting equal to one of these or under one
ending in a dot. Its layout, thread pool or code may change between the copies that run a table
(:data:`HOW_IT_RUNS`); these may not."""

HOW_IT_RUNS = ("model.lowering", "model.remat", "dataset.source", "dataset.data_dir", "dataset.tfds_name")
"""Settings under :data:`EXPERIMENT` that say how a run computes or where it reads, not what it computes."""


def _defines_experiment(key: str) -> bool:
    return key not in HOW_IT_RUNS and any(key in (p, p.rstrip(".")) or (p.endswith(".") and key.startswith(p))
                                          for p in EXPERIMENT)


def check_same_experiment(name: str, ran: dict[str, Any], config: Config) -> None:
    """Checks that the finished run of cell ``name`` (``ran``: its config, nested as in ``config.yaml``) is
    the experiment ``config`` asks for in each setting of :data:`EXPERIMENT` that both name, and in each
    section of them that one has off (null) and the other sets (asynchrony, privacy, server data).

    A script given ``--set model.name=resnet18`` (or ``algorithm.server_learning_rate=0.1``) over a table
    whose records hold another run would otherwise skip every cell as done, and a merge of its records would
    drop them for the names they share.

    Raises:
      ValueError: naming the cell, each differing setting with both values, and the way out (another
        ``--runs`` folder, whose records are a file of their own).
    """
    ran, asked = record_files.flatten(ran), record_files.flatten(config.model_dump(mode="json"))
    differ = [f"{key}: {ran[key]!r} ran, {asked[key]!r} asked" for key in sorted(ran.keys() & asked.keys())
              if _defines_experiment(key) and ran[key] != asked[key]]
    for one, other, verb in ((ran, asked, "ran"), (asked, ran, "asked")):  # a section off in one, on in other
        differ += [f"{key}: null {verb}, set in the other" for key in sorted(one)
                   if one[key] is None and _defines_experiment(key)
                   and any(k.startswith(key + ".") for k in other)]
    if differ:
        raise ValueError(f"cell {name} has finished as another experiment ({'; '.join(differ)}); give this "
                         "table another runs folder (--runs runs/<table>_<what differs>), so that its "
                         "records go to a file of their own")


def _saved_config(run_dir: Path) -> dict[str, Any]:
    import yaml

    path = run_dir / "config.yaml"
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


STARTED = "table_run.json"
"""A run directory's note of how :func:`run_once` started it, for its summary: the commit, ``forked_from``,
and ``resumed`` once a later copy resumed it."""


def interrupted_at(run_dir: Path, config: Config) -> int | None:
    """The round of the last checkpoint of an unfinished run of ``config`` in ``run_dir``; None where there
    is nothing to resume (no run, no checkpoint yet, or another config's run, which is then run again)."""
    from fedjax_lab.experiments import ConfigError
    from fedjax_lab.experiments.run_directory import RunDirectoryError
    from fedjax_lab.experiments.runner import check_run_directory

    if not (run_dir / "config.yaml").is_file():
        return None
    try:
        action, _ = check_run_directory(config, run_dir, resume=True, overwrite=False)
    except (ConfigError, RunDirectoryError) as error:
        print(f"{run_dir} holds an unfinished run it cannot resume, so it starts again: {error}", flush=True)
        return None
    if action != "resume":
        return None
    return max(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())


@contextlib.contextmanager
def claimed(runs: Path, name: str) -> Iterator[bool]:
    """Holds the claim on ``name`` (``<runs>/.claims/<name with / as __>``, its text ``host pid``) for the
    ``with`` block, yielding True; yields False, holding nothing, while another copy holds it."""
    claim = runs / ".claims" / name.replace("/", "__")
    claim.parent.mkdir(parents=True, exist_ok=True)
    if not _take(claim, name):
        yield False
        return
    try:
        yield True
    finally:
        claim.unlink(missing_ok=True)


def _take(claim: Path, name: str) -> bool:
    """Creates ``claim`` for this process, or takes it over from a process of this host that has gone."""
    host = socket.gethostname()
    for _ in range(2):
        try:
            with claim.open("x") as file:
                file.write(f"{host} {os.getpid()}\n")
            return True
        except FileExistsError:
            try:
                owner = claim.read_text().split()
            except FileNotFoundError:  # released meanwhile
                continue
        checkable = len(owner) == 2 and owner[0] == host and owner[1].isdigit()
        if checkable and not _alive(int(owner[1])):
            print(f"{name}: taking over the claim of process {owner[1]}, which has gone", flush=True)
            claim.unlink(missing_ok=True)
            continue
        if checkable:
            print(f"{name}: skipped, claimed by process {owner[1]}", flush=True)
        else:
            holder = " ".join(owner) or "an unknown copy"
            print(f"{name}: skipped, claimed by {holder} ({claim}: remove it if no copy runs this cell)",
                  flush=True)
        return False
    return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


# --------------------------------------------------------------------------------- reading runs and records
def record(run: Run) -> Record | None:
    """The record of a finished run, ``records / name`` or a run directory; None if it has not finished."""
    if isinstance(run, RunPath):
        return run.record()
    if isinstance(run, Records):
        return None
    run = Path(run)
    return Record.from_run_dir(run, run.name) if (run / "summary.json").is_file() else None


def runs_under(folder: Run) -> dict[str, Record | Path]:
    """The finished runs under ``folder`` by their path relative to it: records, or run directories on
    disk."""
    if isinstance(folder, Records):
        return dict(folder.runs)
    if isinstance(folder, RunPath):
        return folder.under()
    folder = Path(folder)
    return {s.parent.relative_to(folder).as_posix(): s.parent for s in sorted(folder.glob("**/summary.json"))
            if s.parent != folder}


def has_runs(folder: Run, pattern: str = "*") -> bool:
    """Whether a finished run lies under ``folder`` at a path whose first parts match ``pattern`` (``*`` for
    one part: ``has_runs(runs / "cifar10", "*/table3/*/*")``)."""
    parts = PurePosixPath(pattern).parts
    return any(len(p := PurePosixPath(name).parts) >= len(parts)
               and all(fnmatch.fnmatchcase(a, b) for a, b in zip(p, parts)) for name in runs_under(folder))


def finished(run: Run) -> bool:
    """Whether ``run`` has finished (has a record, or a ``summary.json`` on disk)."""
    return record(run) is not None


def summary(run: Run) -> dict[str, Any] | None:
    """A finished run's ``summary.json``; None if it has not finished."""
    return None if (r := record(run)) is None else r.summary


def failure(found: dict[str, Any] | None) -> str | None:
    """How a finished run failed, by its summary ``found``: "diverged" (the runner stopped it at a NaN or an
    exploding loss), "a constant predictor" (``collapsed``: ``runner.constant_predictor``) or "at chance"
    (``at_chance``: ``runner.at_chance``; records made before the runner checked have both from
    ``compact_records.py --collapsed``); None for a run that trained or has not finished."""
    found = found or {}
    return ("diverged" if found.get("diverged") else "a constant predictor" if found.get("collapsed")
            else "at chance" if found.get("at_chance") else None)


FAILURES = ("diverged", "a constant predictor", "at chance")


def failure_counts(failed) -> list[str]:
    """How many of some runs failed, by how (``failed``: each run's ``failure``, None for one that trained),
    in ``FAILURES``' order: ``["1 diverged", "2 at chance"]``; empty when none did."""
    failed = list(failed)
    return [f"{n} {how}" for how in FAILURES if (n := failed.count(how))]


class SeedValues(dict):
    """One arm of a claim: its value per seed (a ``dict[int, float]``), and ``failed``, how the runs of those
    seeds that failed failed (seed -> ``failure``), for the note under a claims table (``claims_table``)."""

    def __init__(self, values=(), failed: dict[int, str] | None = None):
        super().__init__(values)
        self.failed = dict(failed or {})


def seed_values(runs: Run, name: str, seeds, value: Callable[[Run], float | None]) -> SeedValues:
    """``value`` of each seed's finished run of ``name`` (``runs / name / "seed<k>"``; a None is left out),
    with the seeds whose run failed (``failure``)."""
    found, failed = {}, {}
    for seed in seeds:
        run = runs / f"{name}/seed{seed}"
        if (got := value(run)) is not None:
            found[seed] = got
            if why := failure(summary(run)):
                failed[seed] = why
    return SeedValues(found, failed)


def evaluations(run: Run) -> list[dict[str, Any]] | None:
    """The metrics rows of a finished run that hold a test evaluation, in round order; None if it has not
    finished."""
    return None if (r := record(run)) is None else r.evaluations()


def metrics(run: Run) -> list[dict[str, Any]]:
    """A finished run's metrics rows (of a record: the evaluated rows and the kept per-round metrics); empty
    if it has not finished."""
    return [] if (r := record(run)) is None else r.rows


def arrays(run: Run) -> dict[str, np.ndarray]:
    """A finished run's (kept) array metrics, as ``read_arrays`` gives them; empty if none."""
    return {} if (r := record(run)) is None else r.arrays


def sizes(run: Run) -> list[int] | None:
    """Each client's number of rows (kept where a report reads them); None if not kept."""
    return None if (r := record(run)) is None else r.sizes


def config(run: Run) -> dict[str, Any] | None:
    """A finished run's resolved config, as the dict of its ``config.yaml``."""
    return None if (r := record(run)) is None else r.config


@contextlib.contextmanager
def run_directories(runs: list[Run]) -> Iterator[list[Path]]:
    """Run directories for functions that read one (``fedjax_lab.experiments.plots``): a record is written out
    to a temporary one (``Record.write_run_dir``); a run directory on disk is passed as it is."""
    with tempfile.TemporaryDirectory() as folder:
        out = []
        for k, run in enumerate(runs):
            if not isinstance(run, RunPath):
                out.append(Path(run))
                continue
            r, run_dir = run.record(), Path(folder) / str(k)
            run_dir.mkdir()
            if r is not None:
                r.write_run_dir(run_dir)
            out.append(run_dir)
        yield out


def backends(folder: Run) -> str:
    """How many finished runs under ``folder`` ran on each backend, e.g. ``"12 on cpu, 80 on gpu"``."""
    counts: dict[str, int] = {}
    for run in runs_under(folder).values():
        backend = run.backend if isinstance(run, Record) else json.loads(
            (run / "summary.json").read_text()).get("backend", "unknown")
        counts[backend] = counts.get(backend, 0) + 1
    return ", ".join(f"{n} on {b}" for b, n in sorted(counts.items()))


def seeds_on_disk(runs: Run, default: list[int]) -> list[int]:
    """Every seed with a finished run under ``runs`` (``.../seed<k>``), or ``default`` if none: the report
    covers what has run, not only what one invocation asked for."""
    found = {int(m.group(1)) for name in runs_under(runs)
             if (m := re.fullmatch(r"seed(\d+)", PurePosixPath(name).name))}
    return sorted(found) or list(default)


def datasets_on_disk(runs: Run, known) -> list[str]:
    """The datasets of ``known`` (in its order) with a finished run under ``runs``."""
    return [d for d in known if has_runs(runs / d)]


def mean_std(values: list[float] | SeedValues, sep: str = "±", of: int | None = None, ddof: int = 1) -> str:
    """A table cell: ``mean±std`` over seeds, the value and "(1 seed)" for one, "-" for none; with ``of`` (the
    seeds the table is over), a cell over fewer says how many: "(2 seeds)". The spread is the sample standard
    deviation (``ddof=1``), the project's standard. Given a :class:`SeedValues`, the cell also says how many
    of its runs failed (``failure``), e.g. "(1 diverged)" or "(2 seeds; 1 a constant predictor)": such a mean
    is not a method's accuracy."""
    failed = getattr(values, "failed", {})
    values = list(values.values()) if isinstance(values, dict) else list(values)
    if not values:
        return "-"
    notes = [f"{len(values)} seed{'s' if len(values) > 1 else ''}"] if len(values) == 1 or (
        of is not None and len(values) < of) else []
    notes += failure_counts(failed.values())
    note = f" ({'; '.join(notes)})" if notes else ""
    if len(values) == 1:
        return f"{values[0]:.1f}{note}"
    return f"{np.mean(values):.1f}{sep}{np.std(values, ddof=ddof):.1f}{note}"


# --------------------------------------------------------------------------------- claims


def claims_header(unit: str = "points") -> list[str]:
    """The header rows of a claims table whose differences are in ``unit``."""
    return [(f"| claim | paper's gain ({unit}) | ours: mean paired difference [95 % interval] ({unit}) | "
             "seeds | verdict |"), "|---|---|---|---|---|"]


MIN_SEEDS = 3
"""The fewest paired seeds a verdict is drawn from; with fewer the interval is shown and the claim stays
unresolved (two seeds that happen to agree give a narrow interval that says little)."""


CLAIMS_HEADER = claims_header()
CLAIMS_RULE = (
    "Each claim \"A beats B\" is judged by the paired difference A - B over the seeds both arms ran (the "
    "same seed for both), in points of accuracy (or the unit a table's header names): its mean and 95 % "
    "Student-t interval, from the sample standard deviation (ddof 1) of the differences "
    "(`fedjax_lab/experiments/statistics.py`). **held**: the interval excludes 0 on the paper's side; **not "
    "held**: it does not, and lies wholly below the paper's gain; **unresolved**: it holds both 0 and the "
    f"paper's gain, or fewer than {MIN_SEEDS} seeds pair (\"unresolved (n seeds)\"; with two, the "
    "interval is shown without a verdict). The paper's gain is the difference of its two means.")


@dataclass
class Claim:
    """One claim "``method`` beats ``base``": the paper's gain and our values by seed, in points."""

    text: str
    paper_gain: float
    method: dict[int, float]
    base: dict[int, float]
    digits: int = 2  # of the paper's gain, as the paper prints its numbers
    paper_note: str = ""  # after the paper's gain, e.g. "(CIFAR-10)" where it comes from another setting
    direction_only: bool = False  # the paper claims a direction ("faster", "higher") and prints no number:
    # held when the interval lies above 0, not held when it lies below 0 (``paper_gain`` is then 0)
    our_digits: int = 1  # of our difference and interval (a loss needs more than points of accuracy)


@dataclass
class Decisive:
    """A paper's decisive experiment, as the summary page (``benchmarks/reproductions.py``) shows it."""

    paper: str  # the method and its paper, e.g. "FedCOG (Fake It Till Make It, Table 1)"
    page: str  # its claims page, relative to docs/reproductions/
    experiment: str  # the paper's decisive experiment, at the paper's scale
    ours: str  # what we ran, with the fraction of the paper's client work
    claims: list[Claim]
    unit: str = "points"  # of the claims' differences
    at_scale: str = ""  # what of it ran at the paper's scale, e.g. "BHerd's SVM"; "" for nothing


def at_either_scale(paper: list[Claim], cpu: list[Claim]) -> tuple[list[Claim], list[bool]]:
    """Each claim at the paper's scale where its records pair two seeds or more there, else at CPU scale
    (``paper`` and ``cpu``: the same claims, in the same order, from the two scales' records), its text
    ending in the scale; and whether each came from the paper's scale."""
    chosen, from_paper = [], []
    for at_paper, at_cpu in zip(paper, cpu, strict=True):
        pairs = [s for s in set(at_paper.method) & set(at_paper.base)
                 if np.isfinite(at_paper.method[s]) and np.isfinite(at_paper.base[s])]
        use = len(pairs) >= 2
        claim = at_paper if use else at_cpu
        scale = "the paper's scale" if use else "CPU scale"
        chosen.append(dataclasses.replace(claim, text=f"{claim.text}, {scale}"))
        from_paper.append(use)
    return chosen, from_paper


def ours_at_either_scale(paper: str, cpu: str, from_paper: list[bool]) -> str:
    """The summary's "ours" for claims judged by :func:`at_either_scale`: ``paper`` or ``cpu`` (what ran at
    each scale) where every claim came from one, else which share came from the paper's scale."""
    if all(from_paper):
        return paper
    if not any(from_paper):
        return cpu
    return f"{paper} for {sum(from_paper)} of the {len(from_paper)} claims; the rest at {cpu}"


def judge(claim: Claim) -> tuple[str, list[int], str]:
    """(our mean paired difference and interval, the seeds that pair, the verdict) of ``claim``. A seed whose
    run diverged in either arm (its value NaN) pairs nothing: a model at chance after a NaN says nothing of
    the gain; the verdict names those seeds. Fewer than ``MIN_SEEDS`` pairs leave it unresolved."""
    both = sorted(set(claim.method) & set(claim.base))
    seeds = [s for s in both if np.isfinite(claim.method[s]) and np.isfinite(claim.base[s])]
    diverged = [s for s in both if s not in seeds]
    note = (f"; seed{'s' if len(diverged) > 1 else ''} {', '.join(map(str, diverged))} diverged" if diverged
            else "")
    if len(seeds) < 2:
        ours = ("-" if not seeds
                else f"{claim.method[seeds[0]] - claim.base[seeds[0]]:+.{claim.our_digits}f} (one seed)")
        return (ours, seeds or diverged,
                f"unresolved ({len(seeds)} seed{'' if len(seeds) == 1 else 's'}{note})")
    difference = paired_difference([claim.method[s] for s in seeds], [claim.base[s] for s in seeds])
    ours = describe(difference, digits=claim.our_digits, scale=1.0)
    if len(seeds) < MIN_SEEDS:
        return ours, seeds, f"unresolved ({len(seeds)} seeds{note})"
    return ours, seeds, verdict(difference, claim.paper_gain) + (f" ({note[2:]})" if note else "")


def paper_gain_cell(claim: Claim) -> str:
    """The paper's gain as a claims table shows it: its number, or "a gain, no number" for a claim of
    direction."""
    gain = "a gain, no number" if claim.direction_only else f"{claim.paper_gain:+.{claim.digits}f}"
    return gain + (f" {claim.paper_note}" if claim.paper_note else "")


def failed_arms(claim: Claim, seeds: list[int]) -> str:
    """Which of ``claim``'s arms failed in which of ``seeds`` (its arms' ``SeedValues.failed``), e.g. "the
    base diverged in seeds 0, 1 and was a constant predictor in seed 3"; "" if none did."""
    parts = []
    for arm, values in (("the method", claim.method), ("the base", claim.base)):
        failed = getattr(values, "failed", {})
        hows = [(how, [s for s in seeds if failed.get(s) == how]) for how in FAILURES]
        hows = [f"{'' if how == 'diverged' else 'was '}{how} in seed{'s' if len(at) > 1 else ''} "
                f"{', '.join(map(str, at))}" for how, at in hows if at]
        if hows:
            parts.append(f"{arm} {' and '.join(hows)}")
    return "; ".join(parts)


def claims_table(claims: list[Claim], unit: str = "points") -> list[str]:
    """The markdown rows of ``claims`` (``claims_header``'s columns, differences in ``unit``), with the claims
    no seed pairs for gathered in a line below the table rather than as rows of '-', and a line naming the
    paired runs that failed (``failed_arms``): a claim held against a run that diverged or collapsed says
    little of the method."""
    header = claims_header(unit)
    lines, missing, failed = list(header), [], []
    for claim in claims:
        ours, seeds, judged = judge(claim)
        if not seeds:
            missing.append(claim.text)
            continue
        lines.append(f"| {claim.text} | {paper_gain_cell(claim)} | {ours} | {', '.join(map(str, seeds))} "
                     f"| {judged} |")
        if arms := failed_arms(claim, seeds):
            failed.append(f"{claim.text}: {arms}")
    if len(lines) == len(header):
        lines = []
    if failed:
        lines += ["", ("Failed runs among those paired (the run's summary: `diverged`, the runner stopped it "
                       "and its values are from before; `collapsed`, a constant predictor; `at_chance`, no "
                       "better than guessing): "
                       + "; ".join(failed) + ".")]
    if missing:
        lines += ["", "Unresolved (0 seeds), no paired records: " + "; ".join(missing) + "."]
    return lines


def table_cells(text: str, header_numbers: bool = True) -> dict[tuple[str, str, str], str]:
    """The cells of every markdown table in ``text``, keyed by (the heading above, the row's first cell, the
    column's header); a repeated header is numbered ("ours", "ours#2", ...). ``header_numbers=False`` reads
    each number in a header as "#" first ("seed 0", "seed 1": "seed #", "seed ##2"), so that a column whose
    header holds a number the runs set keeps its name when the number moves."""
    cells, heading, header = {}, "", None
    for line in text.splitlines():
        if line.startswith("#"):
            heading, header = line.strip("# "), None
        elif not line.startswith("|"):
            header = None
        elif header is None:
            names = [c.strip() if header_numbers else re.sub(r"\d+(\.\d+)?", "#", c.strip())
                     for c in line.strip().strip("|").split("|")]
            header = [n if names[:i].count(n) == 0 else f"{n}#{names[:i].count(n) + 1}"
                      for i, n in enumerate(names)]
        elif not set(line) <= set("|-: "):
            row = [c.strip() for c in line.strip().strip("|").split("|")]
            for name, cell in zip(header[1:], row[1:]):
                cells[heading, row[0], name] = cell
    return cells


def lost_cells(old: str, new: str) -> list[tuple[str, str, str]]:
    """The table cells filled in ``old`` that ``new`` leaves empty, '-' or out: what regenerating a report
    from fewer records than made it would lose. A header's numbers do not name its column (its key says
    "#"): a target the runs set (BHerd's "rounds to acc 86.74%", FedAvg's mean) moves as more seeds finish."""
    new_cells = table_cells(new, header_numbers=False)
    return [key for key, cell in table_cells(old, header_numbers=False).items()
            if cell not in ("", "-") and new_cells.get(key, "-") in ("", "-")]


def write_report(out: Path, text: str) -> Path:
    """Writes a generated report to ``out``, unless that would lose a filled cell of the report already there
    (its runs made before records were kept, say): then it goes beside it, to ``<out stem>.new.md``, and the
    lost cells are printed. Returns the path written."""
    out = Path(out)
    lost = lost_cells(out.read_text(), text) if out.is_file() else []
    if lost:
        out = out.with_name(out.stem + ".new.md")
        shown = "; ".join(" / ".join(key) for key in lost[:5]) + (" ..." if len(lost) > 5 else "")
        print(f"{len(lost)} filled cells would be lost ({shown}): the report went to {out} instead; merge it "
              "by hand or rerun the missing cells", flush=True)
    out.write_text(text)
    return out


# --------------------------------------------------------------------------------- figures
Series = tuple[str, list[list[dict[str, Any]]]]  # a label and, per seed, the evaluated rows of its run


def seed_curves(run: Run, seeds) -> list[list[dict[str, Any]]]:
    """The evaluated rows of each seed's finished run under ``run`` (``run / "seed<k>"``)."""
    return [rows for s in seeds if (rows := evaluations(run / f"seed{s}"))]


def band(curves: list[list[dict[str, Any]]], key: str = "test_accuracy", scale: float = 1.0):
    """``(rounds, mean, spread, reached)`` of ``scale`` times ``key`` over seeds' curves: every round any seed
    evaluated, the mean over the seeds that reached it, the sample standard deviation (ddof 1; NaN where fewer
    than two did) and how many did. A run that diverged stops early; the others go on without it."""
    rounds = sorted({row["round"] for c in curves for row in c})
    values = np.full((len(curves), len(rounds)), np.nan)
    for i, c in enumerate(curves):
        for row in c:
            values[i, rounds.index(row["round"])] = scale * row.get(key, np.nan)
    reached = np.isfinite(values).sum(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # rounds that one seed or none reached
        mean = np.nanmean(values, 0)
        spread = np.where(reached > 1, np.nanstd(values, 0, ddof=1), np.nan)
    return np.array(rounds), mean, spread, reached


def plot_bands(panels: list[tuple[str, list[Series]]], out: Path, *, key: str = "test_accuracy",
               scale: float = 100.0, ylabel: str = "test accuracy (%)", log: bool = False,
               mark: float | None = None) -> bool:
    """Curves a reader takes in at a glance: per panel, each series' mean over seeds against rounds with a
    band of one sample standard deviation (ddof 1), its seeds counted in the legend; ``mark`` draws a dashed
    line at that round (where a method starts). Panels or series without runs are left out. Returns whether
    anything was drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # one colour per label on every panel, even where a panel lacks a series
    labels = list(dict.fromkeys(label for _, series in panels for label, _ in series))
    colours = {label: f"C{i % 10}" for i, label in enumerate(labels)}
    panels = [(title, [(label, curves) for label, curves in series if curves]) for title, series in panels]
    panels = [(title, series) for title, series in panels if series]
    if not panels:
        return False
    columns = min(len(panels), 4)
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 2.9 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (title, series) in zip(axes.flat, panels):
        for label, curves in series:
            rounds, mean, spread, reached = band(curves, key, scale)
            short = f", {len(curves) - reached[-1]} stopped early" if reached[-1] < len(curves) else ""
            ax.plot(rounds, mean, label=f"{label} (n={len(curves)}{short})", linewidth=1.2,
                    color=colours[label])
            ax.fill_between(rounds, mean - spread, mean + spread, color=colours[label], alpha=0.2)
        if mark is not None:
            ax.axvline(mark, color="grey", linestyle="--", linewidth=0.8)
        if log:
            ax.set_yscale("log")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True
