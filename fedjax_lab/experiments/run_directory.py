"""The run directory: resolved config, per-round metrics as they are produced, summary, plot, checkpoints.

Layout::

    RUN_DIR/config.yaml      the fully resolved config
    RUN_DIR/metrics.jsonl    one JSON object per round (and round 0), appended as blocks finish
    RUN_DIR/arrays/          metrics that are arrays per round (BHerd's selected steps per client), one .npz a
                             block; :func:`read_arrays` joins them
    RUN_DIR/summary.json     final and best metrics, timings
    RUN_DIR/curves.png       accuracy and loss against rounds
    RUN_DIR/staleness.png    asynchronous runs: arrivals, jobs in flight and staleness
    RUN_DIR/partition.*      the clients' rows (npz, reloadable), class counts (md) and their plot (png)
    RUN_DIR/checkpoints/     Orbax checkpoints of the whole loop state, by round
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from fedjax_lab.engine import LoopState


class RunDirectoryError(RuntimeError):
    """A run directory cannot be read or written as the run needs (the command line's exit status 4)."""


class CheckpointError(RunDirectoryError):
    """No checkpoint of the run directory can be read."""


RUN_FILES = ("config.yaml", "metrics.jsonl", "summary.json", "curves.png", "staleness.png", "partition.npz",
             "partition.md", "partition.png", "arrays", "checkpoints")
"""What a run writes in its directory, and all that ``--overwrite`` removes."""


def holds_run(path: str | Path) -> bool:
    """Whether ``path`` holds (part of) a run: its config, metrics or a checkpoint (not just the empty folder
    Orbax makes before the run writes anything)."""
    path = Path(path)
    checkpoints = path / "checkpoints"
    return ((path / "config.yaml").exists() or (path / "metrics.jsonl").exists()
            or checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir()))


def clear_run(path: str | Path) -> None:
    """Removes the run in ``path`` (:data:`RUN_FILES`), leaving anything else (another process of a
    distributed run clears its own ``.process_N`` copy)."""
    path = Path(path)
    for entry in [path / name for name in RUN_FILES]:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        elif entry.exists() or entry.is_symlink():
            entry.unlink()


def _umask() -> int:
    """The process's umask, read without changing it (``os.umask`` would, for a moment, for every thread)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


@contextlib.contextmanager
def naming(path: str | Path):
    """Adds ``path`` to an ``OSError`` raised inside that names no file (matplotlib's, for a full disk)."""
    try:
        yield
    except OSError as exc:
        if exc.filename or not exc.errno:
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from None


def write_atomically(path: Path, text: str) -> None:
    """Writes ``text`` to ``path`` through a temporary file and a rename: a kill leaves the old file or the
    new."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # as open() would make it, not mkstemp's 0o600
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class RunDirectory:
    """Reads and writes one run's files (see the module docstring)."""

    def __init__(self, path: str | Path, checkpoints_to_keep: int = 2):
        self.path = Path(path).absolute()
        self.path.mkdir(parents=True, exist_ok=True)
        self._checkpoints = ocp.CheckpointManager(
            self.path / "checkpoints", options=ocp.CheckpointManagerOptions(max_to_keep=checkpoints_to_keep))

    @property
    def config_path(self) -> Path:
        return self.path / "config.yaml"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    def append_metrics(self, rows: list[dict[str, Any]]) -> None:
        """Appends rows to ``metrics.jsonl`` and flushes them to disk (a kill mid-write leaves at most a torn
        last line, which :func:`read_metrics` drops)."""
        try:
            with self.metrics_path.open("a") as f:
                f.write("".join(json.dumps(row) + "\n" for row in rows))
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, str(self.metrics_path)) from None

    def read_metrics(self) -> list[dict[str, Any]]:
        return read_metrics(self.path)

    def append_arrays(self, first_round: int, arrays: dict[str, np.ndarray]) -> None:
        """Writes a block's array metrics (leading axis: its rounds, ``first_round + 1`` onwards) to
        ``arrays/``."""
        if not arrays:
            return
        num_rounds = len(next(iter(arrays.values())))
        folder = self.path / "arrays"
        folder.mkdir(exist_ok=True)
        np.savez(folder / f"rounds_{first_round + 1:06d}_{first_round + num_rounds:06d}.npz", **arrays)

    def truncate_metrics(self, last_round: int) -> None:
        """Drops rows (and array blocks) after ``last_round``: a resumed run rewrites what the interrupted one
        wrote past its checkpoint."""
        rows = [row for row in self.read_metrics() if row["round"] <= last_round]
        if not rows or rows[-1]["round"] != last_round:
            raise RunDirectoryError(f"cannot resume {self.path}: metrics.jsonl ends at round "
                                    f"{rows[-1]['round'] if rows else 'none'}, before the checkpoint's round "
                                    f"{last_round}, so the curve would have a gap; start again with "
                                    "--overwrite")
        write_atomically(self.metrics_path, "".join(json.dumps(row) + "\n" for row in rows))
        for block in sorted((self.path / "arrays").glob("rounds_*.npz")):
            if int(block.stem.split("_")[-1]) > last_round:
                block.unlink()

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_atomically(self.path / "summary.json", json.dumps(summary, indent=2) + "\n")

    def save_checkpoint(self, state: LoopState) -> None:
        """Saves the whole loop state under its round number (waits until it is on disk).

        Raises:
          OSError: it could not be written (a full disk, a read-only folder), with the reason Orbax gave.
        """
        step = int(state.round)
        if step in self._checkpoints.all_steps():
            return
        with _held_stderr() as held:
            try:
                self._checkpoints.save(step, args=ocp.args.StandardSave(state))
                self._checkpoints.wait_until_finished()
            except Exception as exc:  # Orbax wraps the file system's errors in its own
                code = _os_error_code(exc)
                if code is None:
                    raise
                # the rest of Orbax's writes fail alike, some after Orbax has closed their event loop
                logging.getLogger("asyncio").setLevel(logging.CRITICAL)
                _quiet_closed_event_loops()
                held.discard()  # a page of tracebacks from Orbax's threads, all saying what ``code`` says
                for partial in (self.path / "checkpoints").glob(f"{step}.orbax-checkpoint-tmp*"):
                    shutil.rmtree(partial, ignore_errors=True)
                raise OSError(code, f"{os.strerror(code)} (writing the checkpoint of round {step})",
                              str(self.path / "checkpoints")) from None

    def latest_checkpoint_round(self) -> int | None:
        return self._checkpoints.latest_step()

    def restore_checkpoint(self, template: LoopState) -> LoopState:
        """The latest intact checkpoint, restored into the structure (and dtypes) of ``template``; a
        checkpoint that cannot be read (a crash while writing it, a damaged disk) is reported and the one
        before it used.

        Raises:
          CheckpointError: no checkpoint can be read.
        """
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
        damaged = []
        for step in sorted(self._checkpoints.all_steps(), reverse=True):
            try:
                restored = self._checkpoints.restore(step, args=ocp.args.StandardRestore(abstract))
            except Exception as exc:  # noqa: BLE001
                # any unreadable checkpoint falls back to the previous one
                print(f"fedjax-lab: checkpoint of round {step} in {self.path} cannot be read "
                      f"({type(exc).__name__}); trying the one before it", file=sys.stderr)
                damaged.append(step)
                continue
            for step in damaged:  # the resumed run writes them again
                self._checkpoints.delete(step)
            return jax.tree.unflatten(jax.tree.structure(template), jax.tree.leaves(restored))
        raise CheckpointError(f"no readable checkpoint in {self.path / 'checkpoints'}; start again with "
                              "--overwrite")


class _HeldOutput:
    def __init__(self):
        self.keep = True

    def discard(self) -> None:
        self.keep = False


@contextlib.contextmanager
def _held_stderr():
    """Holds back what is written to file descriptor 2 (Orbax's threads log there) and writes it out at the
    end, unless :meth:`_HeldOutput.discard` was called. A no-op where descriptor 2 cannot be redirected."""
    held = _HeldOutput()
    try:
        sys.stderr.flush()
        buffer = tempfile.TemporaryFile()  # noqa: SIM115 - entered below, once it exists
    except (OSError, ValueError):
        yield held
        return
    with buffer:
        saved = os.dup(2)
        os.dup2(buffer.fileno(), 2)
        try:
            yield held
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if held.keep:
                buffer.seek(0)
                text = buffer.read().decode(errors="replace")
                if text:
                    sys.stderr.write(text)


def _is_late_write(unraisable: Any) -> bool:
    """Whether an unraisable exception is TensorStore finishing a write whose event loop Orbax has closed: the
    closed loop's ``RuntimeError``, raised where TensorStore calls ``loop.call_soon_threadsafe`` itself (the
    traceback's first frame), not anywhere else."""
    error, trace = unraisable.exc_value, unraisable.exc_traceback
    return (isinstance(error, RuntimeError) and str(error) == "Event loop is closed" and trace is not None
            and trace.tb_frame.f_code.co_name == "call_soon_threadsafe")


def _quiet_closed_event_loops() -> None:
    """Drops, for the rest of the process, the "Event loop is closed" tracebacks of writes that end after a
    checkpoint failed.

    When one of a checkpoint's writes fails, Orbax stops awaiting the others and closes their event loop;
    each of them, failing alike on the full disk moments later, hands its result to that closed loop from
    TensorStore's threads, and Python prints the ``RuntimeError`` through ``sys.unraisablehook``, at any
    later time (after the run's own message). Every other unraisable exception is passed on.
    """
    previous = sys.unraisablehook
    if getattr(previous, "quiets_closed_event_loops", False):
        return

    def hook(unraisable):
        if not _is_late_write(unraisable):
            previous(unraisable)

    hook.quiets_closed_event_loops = True
    sys.unraisablehook = hook


def _os_error_code(exc: BaseException) -> int | None:
    """The operating system's error number behind an exception: an ``OSError`` in its chain, or the
    ``os_error_code='N'`` that TensorStore (under Orbax) writes into its messages; ``None`` if there is
    none."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno:
            return exc.errno
        found = re.search(r"os_error_code='?(\d+)", str(exc))
        if found:
            return int(found.group(1))
        exc = exc.__cause__ or exc.__context__
    return None


def _parse_row(line: str) -> dict[str, Any] | None:
    """A line of ``metrics.jsonl`` as its row, or ``None`` when it is not one (torn, damaged)."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) and isinstance(row.get("round"), int) else None


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of a run's ``metrics.jsonl`` (empty if none were written). A torn last line (the run was
    killed while appending it) is dropped with a warning; its rounds are redone by ``--resume``.

    Raises:
      RunDirectoryError: a damaged line before the last one, named by its number.
    """
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    lines = path.read_text(errors="replace").split("\n")
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        row = _parse_row(line)
        if row is None:
            if any(rest.strip() for rest in lines[number:]):
                raise RunDirectoryError(f"{path}, line {number}, is damaged ({line[:40]!r}...); repair or "
                                        "delete that line, or start again with --overwrite") from None
            print(f"fedjax-lab: dropping the torn last line of {path} (line {number}: the run was stopped "
                  "while writing it; --resume redoes its rounds)", file=sys.stderr)
            break
        rows.append(row)
    return rows


def split_arrays(metrics: dict[str, Any]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A block's metrics (leading axis: rounds) split into scalars per round and arrays per round."""
    scalars = {k: v for k, v in metrics.items() if np.ndim(v) <= 1}
    return scalars, {k: np.asarray(v) for k, v in metrics.items() if np.ndim(v) > 1}


def read_arrays(run_dir: str | Path) -> dict[str, np.ndarray]:
    """A run's array metrics, joined over its blocks (leading axis: rounds), with ``'round'`` (1-based) beside
    them; empty when the run wrote none."""
    blocks = sorted((Path(run_dir) / "arrays").glob("rounds_*.npz"))
    if not blocks:
        return {}
    loaded = [dict(np.load(b)) for b in blocks]
    joined = {k: np.concatenate([b[k] for b in loaded]) for k in loaded[0]}
    first = [int(b.stem.split("_")[1]) for b in blocks]
    joined["round"] = np.concatenate([np.arange(f, f + len(next(iter(b.values()))))
                                      for f, b in zip(first, loaded)])
    return joined
