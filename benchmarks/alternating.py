"""The harness of the benchmarks that time a change against what it replaced, in one sitting.

Each way of a workload runs in a fresh process (``python <script> --worker [<workload>] <way> ...``), which
prints its measurements as a JSON line last; the ways alternate (A, B, A, B, ...) so that a drift of the
machine's speed falls on every way alike, and the ratio of two ways is taken repetition by repetition as well
as over all their calls. Each core is timed before and after each process (:func:`core_speeds`): a pair
timed while one core ran slow is named (``compare_two``'s ``uneven_repetitions``). Used by
``bherd_cnn_round.py``, ``band_height.py``, ``pool_gradient.py``, ``resnet_lowering.py`` and
``training_pages.py``, and the check by ``fedavg_cnn_throughput.py``.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
Run = dict[str, Any]


def examples_per_s(run: Run) -> str:
    """A process's line in the log: the median of its calls' examples a second."""
    return f"{statistics.median(run['examples_per_s']):,.0f} ex/s"


def alternate(script: str | Path, ways: Sequence[str], reps: int, *, before: Sequence[str] = (),
              after: Sequence[str] = (), show: Callable[[Run], str] = examples_per_s,
              label: str = "") -> dict[str, list[Run]]:
    """Runs ``python script --worker *before way *after`` for each way, ``reps`` times, the ways alternating.

    Returns:
      ``{way: [the JSON object each of its processes printed last, in order]}``, each with the
      ``core_balance`` its process ran at (the lesser of :func:`core_balance` before and after it).
    """
    runs: dict[str, list[Run]] = {way: [] for way in ways}
    for rep in range(reps):
        for way in ways:
            command = [sys.executable, str(script), "--worker", *before, way, *after]
            balance = core_balance(core_speeds())
            out = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True)
            run = json.loads(out.stdout.strip().splitlines()[-1])
            run["core_balance"] = min(balance, core_balance(core_speeds()))
            runs[way].append(run)
            print(f"{label}rep {rep} {way:>8}: {show(run)}; slowest core {run['core_balance']:.2f}x the "
                  "fastest", flush=True)
    return runs


def median_of_calls(runs: Sequence[Run], key: str = "examples_per_s") -> float:
    """The median of ``key`` over every call of every process of a way."""
    return statistics.median(value for run in runs for value in run[key])


def paired_ratios(numerator: Sequence[Run], denominator: Sequence[Run], key: str = "examples_per_s",
                  total: bool = False) -> list[float]:
    """Per repetition, ``numerator``'s median of ``key`` over ``denominator``'s (their sums with ``total``:
    for seconds, pass the slower way as the numerator)."""
    reduce = sum if total else statistics.median
    return [reduce(a[key]) / reduce(b[key]) for a, b in zip(numerator, denominator, strict=True)]


def compare_two(runs: dict[str, list[Run]], now: str, before: str, names: dict[str, str] | None = None
                ) -> dict[str, Any]:
    """Prints and returns ``now`` against ``before`` in examples a second: each way's median over its calls,
    their ratio (``speedup_of_<now>``) and the ratio per repetition. ``names`` label the ways in the line."""
    name = (names or {}).get
    medians = {way: median_of_calls(runs[way]) for way in (now, before)}
    pairs = paired_ratios(runs[now], runs[before])
    uneven = [i for i, (a, b) in enumerate(zip(runs[now], runs[before]))
              if min(a.get("core_balance", 1.0), b.get("core_balance", 1.0)) < EVEN]
    print(f"{name(now, now)} {medians[now]:,.0f} ex/s, {name(before, before)} {medians[before]:,.0f}: "
          f"{medians[now] / medians[before]:.3f}x; per repetition " + ", ".join(f"{p:.3f}" for p in pairs)
          + (f" (on uneven cores: repetition {', '.join(map(str, uneven))})" if uneven else ""))
    return {"median_examples_per_s": medians, f"speedup_of_{now}": medians[now] / medians[before],
            "speedup_per_repetition": pairs, "uneven_repetitions": uneven}


def core_speeds(work: int = 200_000, repeats: int = 5) -> dict[int, float]:
    """Each core this process may use, timed on one fixed single-threaded loop (NumPy's ``sin`` of ``work``
    floats, the best of ``repeats``) with this thread pinned to it in turn: loops a second per core.

    A VM's vCPUs can run at unequal speeds for minutes (on the 2-core AMD EPYC VM one ran at 0.4x the other,
    with no steal time counted, ``docs/benchmarks.md``), and a cohort split over the two waits for the slower,
    so a repetition timed then says more about the neighbours than the code: see :func:`even_repetitions`.

    Where the system cannot pin a thread (macOS, Windows) the loop is timed once, unpinned, under core 0:
    one speed, so a balance of 1 (nothing is set aside there).
    """
    import numpy as np

    x = np.linspace(0.0, 1.0, work)

    def speed() -> float:
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            np.sin(x)
            best = min(best, time.perf_counter() - start)
        return 1.0 / best

    if not (hasattr(os, "sched_getaffinity") and hasattr(os, "sched_setaffinity")):
        return {0: speed()}
    cores = os.sched_getaffinity(0)
    speeds = {}
    try:
        for core in sorted(cores):
            os.sched_setaffinity(0, {core})
            speeds[core] = speed()
    finally:
        os.sched_setaffinity(0, cores)
    return speeds


def core_balance(speeds: dict[int, float]) -> float:
    """The slowest core's speed over the fastest's: 1 where the cores run level."""
    return min(speeds.values()) / max(speeds.values())


EVEN = 0.8
"""The least :func:`core_balance` a repetition is kept at (``even_repetitions``)."""


def even_repetitions(balances: Sequence[float], least: float = EVEN) -> list[int]:
    """The repetitions timed on cores running level (their balance, before and after, at least ``least``);
    every repetition when none was, so that a machine uneven throughout still gets a figure (and says so)."""
    kept = [i for i, b in enumerate(balances) if b >= least]
    return kept or list(range(len(balances)))


def result_path(out: str | Path, name: str, machine: str, date: str) -> Path:
    """``<out>/<name>-<machine>-<yyyymmdd>.json``, or with ``-2``, ``-3``, ... where that file exists: a rerun
    never replaces a kept result."""
    stem = Path(out) / f"{name}-{machine}-{date.replace('-', '')}"
    path, n = stem.with_suffix(".json"), 1
    while path.exists():
        n += 1
        path = stem.parent / f"{stem.name}-{n}.json"
    return path


def save(name: str, record: dict[str, Any], out: str | Path) -> Path:
    """Writes ``record`` with the date, the commit and the machine (``fedavg_mlp_throughput.machine_info``)
    to :func:`result_path`, and returns the path."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fedavg_mlp_throughput import machine_info, machine_kind
    from records import code_commit

    info = machine_info()
    date = datetime.date.today().isoformat()
    path = result_path(out, name, machine_kind(info), date)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"date": date, "commit": code_commit(), "machine": info, **record}, indent=1))
    print(f"saved {path}")
    return path
