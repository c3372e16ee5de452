"""Turns run records of the older layout (a folder per run: ``config.yaml``, ``metrics.jsonl``,
``summary.json``, ``arrays/``, ``client_sizes.json``, under ``benchmarks/results/runs/<family>/``) into the
compact files the reports read, ``benchmarks/results/records/<family>.jsonl.gz`` (``records.py``), keeping
what each family's report reads (its script's ``KEEP``), and checks that every converted record reads back as
its folder did.

Also merges record files made elsewhere (a lent GPU's, ``gpu_tables.sh``) into the repository's, and gives
records made before the runner checked for a collapse their summary's ``collapsed`` and ``at_chance``
(``--collapsed``), and keeps of a file's records only what its family's ``KEEP`` says now (``--trim``: a
report that reads less).

Usage::

    python benchmarks/compact_records.py                      # every family under benchmarks/results/runs
    python benchmarks/compact_records.py --folders runs/feddle --delete   # any folder of runs; then delete it
    python benchmarks/compact_records.py --merge OUT/benchmarks/results/records/*.jsonl.gz
    python benchmarks/compact_records.py --collapsed                  # every file under records/
    python benchmarks/compact_records.py --trim records/bherd.jsonl.gz

A family's file already there is merged with (a converted run of the same name is replaced). ``--delete``
removes each folder once its records are written and checked. ``--merge`` adds each file's runs that the
repository's file of the same name lacks (a script never reruns a kept cell, so those are the runs made
elsewhere).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import shutil
from pathlib import Path

import numpy as np
import records as record_files
import yaml
from records import Keep, Record
from table_runs import RECORDS, SUFFIX

OLD = Path(__file__).resolve().parent / "results" / "runs"
SCRIPTS = {"async": "async_table", "baselines": "baselines_table", "bherd": "bherd_table",
           "fedcog": "fedcog_table", "fedcog_weighting": "fedcog_table", "feddle": "feddle_table",
           "fedimpro": "fedimpro_table", "fedwalk": "fedwalk_table"}
"""The script whose ``KEEP`` says what a family's records keep (by the runs folder's name; others:
``Keep()``)."""


def spec_of(family: str) -> Keep:
    return importlib.import_module(SCRIPTS[family]).KEEP if family in SCRIPTS else Keep()


def same_value(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def check(kept: Record, run_dir: Path, spec: Keep) -> None:
    """Raises unless ``kept`` (read back from its file) holds what the folder ``run_dir`` does, as ``spec``
    keeps it: config, summary, every evaluated row, and the kept rows, arrays and sizes."""
    whole = Record.from_run_dir(run_dir, kept.name)
    summary = json.loads((run_dir / "summary.json").read_text())
    kept_rows = spec.rows(whole.rows)
    problems = [what for what, a, b in (
        ("config", kept.config, yaml.safe_load((run_dir / "config.yaml").read_text())),
        ("summary", kept.summary, summary),
        ("backend", [kept.backend, kept.devices],
         [summary.get(k, record_files.UNKNOWN) for k in ("backend", "devices")]),
        ("evaluated rows", kept.evaluations(), [r for r in kept_rows if "test_accuracy" in r]),
        ("kept rows", kept.rows, kept_rows),
        ("sizes", kept.sizes, whole.sizes if spec.sizes else None)) if not same_value(a, b)]
    expected = spec.arrays(kept.name, whole.arrays) if spec.arrays and whole.arrays else {}
    got = kept.arrays
    if got.keys() != expected.keys() or any(
            got[k].dtype != expected[k].dtype or not np.array_equal(got[k], expected[k], equal_nan=True)
            for k in got):
        problems.append("arrays")
    if problems:
        raise ValueError(f"{run_dir}: the compact record differs in {', '.join(problems)}")


def compact(folder: Path, out: Path, spec: Keep) -> int:
    """Adds the records of every finished run under ``folder`` to ``out`` (a new file's base config: the runs'
    common values), checks them, and returns their number."""
    found = {s.parent.relative_to(folder).as_posix(): s.parent
             for s in sorted(folder.glob("**/summary.json"))}
    with record_files.locked(out):
        base, kept = record_files.read_with_base(out, cached=False)
        kept |= {name: Record.from_run_dir(run_dir, name, spec) for name, run_dir in found.items()}
        record_files.write(out, kept, base if out.is_file() else None)
    kept = record_files.read(out)
    for name, run_dir in found.items():
        check(kept[name], run_dir, spec)
    return len(found)


def evaluated_labels(config: dict, cache: dict) -> np.ndarray | None:
    """The test labels a run of ``config`` (a record's) was evaluated on, as ``build_dataset`` makes them;
    None where they cannot be made here (data not on this machine, a config this code no longer reads). They
    do not depend on the partition, so the runs of one dataset section share them (``cache``), but on the
    seed for a generated dataset and when the server's data comes out of the test set."""
    from fedjax_lab.experiments.config import validate
    from fedjax_lab.experiments.datasets import build_dataset

    dataset = dict(config.get("dataset", {}))
    dataset.pop("partition", None)
    seeded = dataset.get("server_data") or dataset.get("name") in ("synthetic", "gaussian_mixture")
    key = json.dumps([dataset, config.get("seed") if seeded else None], sort_keys=True)
    if key not in cache:
        try:
            cache[key] = build_dataset(validate(config)).test["y"]
        except (OSError, ValueError, KeyError) as exc:  # a ConfigError is a ValueError
            print(f"  no test labels for {dataset.get('name')}: {str(exc).splitlines()[0]}")
            cache[key] = None
    return cache[key]


def pad_label(config: dict) -> int | None:
    """The padding token of a run's sequence labels (not counted in its accuracy), None for classes."""
    from fedjax_lab.data import shakespeare

    return shakespeare.PAD if config.get("dataset", {}).get("name") == "shakespeare" else None


def mark_collapsed(path: Path, cache: dict) -> tuple[int, int]:
    """Gives each record of ``path`` whose summary lacks ``collapsed`` or ``at_chance`` the runner's verdicts
    on its evaluations (``runner.constant_predictor`` and ``runner.at_chance`` on the rows before any
    divergence, as the runner calls them); returns (how many were checked, how many failed either)."""
    from fedjax_lab.experiments.runner import at_chance, constant_predictor

    checks = {"collapsed": constant_predictor, "at_chance": at_chance}
    checked = failed = 0
    with record_files.locked(path):
        base, records = record_files.read_with_base(path, cached=False)
        for r in records.values():
            missing = [k for k in checks if k not in r.summary]
            if not missing or (labels := evaluated_labels(r.config, cache)) is None:
                continue
            evaluated = r.evaluations()
            healthy = [row for row in evaluated if "diverged" not in row] or evaluated[:1]
            for k in missing:
                r.summary[k] = checks[k](healthy, labels, **({"pad_label": pad_label(r.config)}
                                                             if k == "at_chance" else {}))
            checked, failed = checked + 1, failed + any(r.summary[k] for k in checks)
        if checked:
            record_files.write(path, records, base)
    return checked, failed


def trim(path: Path) -> tuple[int, int]:
    """Keeps of each record of ``path`` only the rows its family's ``KEEP`` keeps (``Keep.rows``); returns the
    file's size in bytes before and after."""
    spec, before = spec_of(path.name.removesuffix(SUFFIX)), path.stat().st_size
    with record_files.locked(path):
        base, records = record_files.read_with_base(path, cached=False)
        trimmed = {name: dataclasses.replace(r, rows=spec.rows(r.rows)) for name, r in records.items()}
        record_files.write(path, trimmed, base)
    return before, path.stat().st_size


def merge(other: Path, out: Path) -> int:
    """Adds the records of ``other`` that ``out`` lacks to ``out``; returns their number."""
    theirs = record_files.read(other)
    with record_files.locked(out):
        base, ours = record_files.read_with_base(out, cached=False)
        new = {name: r for name, r in theirs.items() if name not in ours}
        if new:
            record_files.write(out, ours | new, base if out.is_file() else None)
    return len(new)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folders", nargs="+", type=Path, help="folders of runs (default: every family "
                        "under benchmarks/results/runs); a folder's name is its family's")
    parser.add_argument("--delete", action="store_true",
                        help="delete each folder once its records are checked")
    parser.add_argument("--merge", nargs="+", type=Path, metavar="FILE",
                        help="record files to merge into the repository's of the same name (and "
                             "nothing else)")
    parser.add_argument("--collapsed", nargs="*", type=Path, metavar="FILE",
                        help="give the records of these files (default: every file under "
                             "benchmarks/results/records) that lack them their summary's collapsed and "
                             "at_chance")
    parser.add_argument("--trim", nargs="+", type=Path, metavar="FILE",
                        help="keep of these record files' runs only what their family's KEEP says now")
    args = parser.parse_args()
    if args.trim:
        for path in args.trim:
            before, after = trim(path)
            print(f"{path}: {before / 1e6:.2f} MB -> {after / 1e6:.2f} MB")
        return
    if args.collapsed is not None:
        cache = {}
        for path in args.collapsed or sorted(RECORDS.glob(f"*{SUFFIX}")):
            checked, failed = mark_collapsed(path, cache)
            print(f"{path}: {checked} records checked, {failed} a constant predictor or at chance")
        return
    if args.merge:
        for other in args.merge:
            out = RECORDS / other.name
            print(f"{other}: {merge(other, out)} runs added to {out}")
        return
    folders = args.folders or (sorted(p for p in OLD.iterdir() if p.is_dir()) if OLD.is_dir() else [])
    for folder in folders:
        out = RECORDS / f"{folder.name}{SUFFIX}"
        count = compact(folder, out, spec_of(folder.name))
        print(f"{folder}: {count} runs -> {out} ({out.stat().st_size / 1e6:.2f} MB)")
        if args.delete:
            shutil.rmtree(folder)
    if args.delete and OLD.is_dir() and not any(OLD.iterdir()):
        OLD.rmdir()


if __name__ == "__main__":
    main()
