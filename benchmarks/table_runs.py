"""What the reproduction scripts (``benchmarks/*_table.py``) share: running each cell once, with several copies
of a script sharing the work, keeping every finished run in the repository, and finding what has run.

A run goes to ``<runs>/<name>`` (git-ignored: checkpoints, plots). When it finishes, its record (``KEPT``: the
resolved config, the metrics, the summary, array metrics, and each client's number of rows) is copied to
``benchmarks/results/runs/<runs' folder name>/<name>``, which is committed: the reports read only these records, so
a table regenerated in a later session, on a fresh clone, still covers every run made before.

A run is skipped when its record or its ``summary.json`` exists (it finished before), or when another copy of the
script holds its claim file ``<runs>/.claims/<name with / as __>``. A claim is released when its run ends, also
when it fails, so an interrupted script leaves nothing that blocks a later one; a copy killed outright leaves its
claim behind, and ``rm -r <runs>/.claims`` clears it.

A report never silently loses a cell: ``write_report`` writes a table that would leave a filled cell of the
committed one empty (regenerated before that cell's run was rerun, say) beside it, as ``*.new.md``.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from fedjax_lab.data.report import load_partition
from fedjax_lab.experiments import Config, run_experiment
from fedjax_lab.experiments.run_directory import read_metrics

RECORDS = Path(__file__).resolve().parent / "results" / "runs"
KEPT = ("config.yaml", "metrics.jsonl", "summary.json", "arrays")
SIZES = "client_sizes.json"  # kept in place of the partition (~250 KB a run): the rows of each client


def records_of(runs: Path) -> Path:
    """The committed records of the runs under ``runs``: ``benchmarks/results/runs/<runs.name>``."""
    return RECORDS / Path(runs).name


def keep(run_dir: Path, record: Path) -> None:
    """Copies a finished run's record (``KEPT``) from ``run_dir`` to ``record``."""
    record.mkdir(parents=True, exist_ok=True)
    for name in KEPT:
        source = run_dir / name
        if source.is_dir():
            shutil.copytree(source, record / name, dirs_exist_ok=True)
        elif source.is_file():
            shutil.copy2(source, record / name)
    if (run_dir / "partition.npz").is_file():
        rows, _ = load_partition(run_dir / "partition.npz")
        (record / SIZES).write_text(json.dumps([len(r) for r in rows]) + "\n")


def collect(runs: Path) -> Path:
    """Keeps the record of every finished run under ``runs`` not kept yet (runs made by an older script or
    copied in by hand), and returns the folder of records the reports read."""
    records = records_of(runs)
    for summary in Path(runs).glob("**/summary.json"):
        name = summary.parent.relative_to(runs)
        if not (records / name / "summary.json").is_file():
            keep(summary.parent, records / name)
    return records


def run_once(runs: Path, name: str, config: Config) -> tuple[dict[str, Any], float] | None:
    """Runs ``config`` into ``runs/name`` unless it has finished or another copy claimed it, and keeps its record.

    Returns:
      ``(summary, seconds)`` of a run made now, or None when it was skipped.
    """
    run_dir = runs / name
    if (run_dir / "summary.json").is_file() or (records_of(runs) / name / "summary.json").is_file():
        return None
    claim = runs / ".claims" / name.replace("/", "__")
    claim.parent.mkdir(parents=True, exist_ok=True)
    try:
        claim.open("x").close()
    except FileExistsError:
        return None
    start = time.perf_counter()
    try:
        summary = run_experiment(config, run_dir, overwrite=True, progress=False)
        keep(run_dir, records_of(runs) / name)
    finally:
        claim.unlink(missing_ok=True)
    return summary, time.perf_counter() - start


def backends(folder: Path) -> str:
    """How many finished runs under ``folder`` ran on each backend, e.g. ``"12 on cpu, 80 on gpu"``."""
    counts: dict[str, int] = {}
    for summary in sorted(Path(folder).glob("**/summary.json")):
        backend = json.loads(summary.read_text()).get("backend", "unknown")
        counts[backend] = counts.get(backend, 0) + 1
    return ", ".join(f"{n} on {b}" for b, n in sorted(counts.items()))


def seeds_on_disk(runs: Path, default: list[int]) -> list[int]:
    """Every seed with a finished run under ``runs`` (``.../seed<k>/summary.json``), or ``default`` if none: the
    report covers what has run, not only what one invocation asked for."""
    found = {int(m.group(1)) for path in runs.glob("**/seed*/summary.json")
             if (m := re.fullmatch(r"seed(\d+)", path.parent.name))}
    return sorted(found) or list(default)


def datasets_on_disk(runs: Path, known) -> list[str]:
    """The datasets of ``known`` (in its order) with a folder of runs under ``runs``."""
    return [d for d in known if (runs / d).is_dir()]


def evaluations(run_dir: Path) -> list[dict[str, Any]] | None:
    """The metrics rows of a finished run that hold a test evaluation, in round order; None if it has not
    finished."""
    if not (run_dir / "summary.json").is_file():
        return None
    return [r for r in read_metrics(run_dir) if "test_accuracy" in r]


def mean_std(values: list[float], sep: str = "±", of: int | None = None) -> str:
    """A table cell: ``mean±std`` over seeds, the value and "(1 seed)" for one, "-" for none; with ``of`` (the
    seeds the table is over), a cell over fewer says how many: "(2 seeds)"."""
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.1f} (1 seed)"
    fewer = f" ({len(values)} seeds)" if of is not None and len(values) < of else ""
    return f"{np.mean(values):.1f}{sep}{np.std(values):.1f}{fewer}"


def table_cells(text: str) -> dict[tuple[str, str, str], str]:
    """The cells of every markdown table in ``text``, keyed by (the heading above, the row's first cell, the
    column's header); a repeated header is numbered ("ours", "ours#2", ...)."""
    cells, heading, header = {}, "", None
    for line in text.splitlines():
        if line.startswith("#"):
            heading, header = line.strip("# "), None
        elif not line.startswith("|"):
            header = None
        elif header is None:
            names = [c.strip() for c in line.strip().strip("|").split("|")]
            header = [n if names[:i].count(n) == 0 else f"{n}#{names[:i].count(n) + 1}"
                      for i, n in enumerate(names)]
        elif not set(line) <= set("|-: "):
            row = [c.strip() for c in line.strip().strip("|").split("|")]
            for name, cell in zip(header[1:], row[1:]):
                cells[heading, row[0], name] = cell
    return cells


def lost_cells(old: str, new: str) -> list[tuple[str, str, str]]:
    """The table cells filled in ``old`` that ``new`` leaves empty, '-' or out: what regenerating a report from
    fewer records than made it would lose."""
    new_cells = table_cells(new)
    return [key for key, cell in table_cells(old).items()
            if cell not in ("", "-") and new_cells.get(key, "-") in ("", "-")]


def write_report(out: Path, text: str) -> Path:
    """Writes a generated report to ``out``, unless that would lose a filled cell of the report already there
    (its runs made before records were kept, say): then it goes beside it, to ``<out stem>.new.md``, and the lost
    cells are printed. Returns the path written."""
    out = Path(out)
    lost = lost_cells(out.read_text(), text) if out.is_file() else []
    if lost:
        out = out.with_name(out.stem + ".new.md")
        shown = "; ".join(" / ".join(key) for key in lost[:5]) + (" ..." if len(lost) > 5 else "")
        print(f"{len(lost)} filled cells would be lost ({shown}): the report went to {out} instead; merge it by "
              "hand or rerun the missing cells", flush=True)
    out.write_text(text)
    return out
