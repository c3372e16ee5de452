"""Compact run records: one file per family of runs (``benchmarks/results/records/<family>.jsonl.gz``), one
JSON line per finished run, which is what the reproduction reports (``benchmarks/*_table.py``) read.

The file's first line is its header: ``{"records": "fedjax_lab runs", "version": 2, "base_config": {...}}``,
the resolved config most of its runs share. Every other line is one run, sorted by name::

    {"name": "cifar10/niid1/fedavg/seed0",         # the run's folder under runs/<family>/
     "seed": 0, "commit": "<git commit>" | "unknown", "backend": "cpu", "devices": ["cpu:0"],
     "config": {"dataset.partition.alpha": 0.3},   # dotted keys whose value differs from the base config
     "config_unset": ["asynchrony.sigma"],         # (only when some) dotted keys of the base the run lacks
     "summary": {...},                             # summary.json: final, best_test_accuracy, best_round, ...
     "rows": [{"round": 0, "test_accuracy": 0.1, ...}, ...],
     "float64": [["summary", "lr"]],               # (only when some) see below
     "arrays": {"staleness_counts": {"dtype": "int32", "shape": [1, 81],
                                     "base64": "..."}},   # (only when kept)
     "sizes": [120, 98, ...]}                      # (only when kept) each client's number of rows

``rows`` are the rows of ``metrics.jsonl`` that hold a test evaluation (whole, or the metrics its family's
reports read, ``Keep.evaluated``), and of the other rows only the per-round metrics its family's reports read
(``Keep.rounds``; rows with none are left out). ``arrays`` (the
array metrics, ``read_arrays``) and ``sizes`` are kept only where a report reads them (``Keep.arrays``,
``Keep.sizes``), reduced to what it reads. A run's full run directory (checkpoints, partition, every row,
array blocks) stays in the git-ignored ``runs/``.

Old records without a commit say ``"commit": "unknown"``; ``backend`` and ``devices`` come from
``summary.json`` (``"unknown"`` where it lacks them).

Floats of ``summary`` and ``rows`` (version 2): one that is a float32 value (the metrics are; in float64,
``0.10000000149011612``) is written as the shortest decimal that reads back to that float32 (``0.1``, half as
long); any other (a float64 value: a timing, a NumPy mean) is written exactly (``short_floats``). Reading
turns each float that is a float32's shortest decimal back into that float32's value (``float32_values``),
except the float64 values that happen to be one (``0.1`` computed in float64), whose paths ``float64`` lists:
a record reads back exactly as it was written, so the reports, which round at ties such as 78.25 %, print the
same. A reader of the plain JSON gets, for a metric, the float64 nearest its decimal: the same float32 once
cast. Version 1 files (every float written exactly) are read as they are.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import functools
import gzip
import io
import itertools
import json
import os
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

HEADER = {"records": "fedjax_lab runs", "version": 2}
REPO = Path(__file__).resolve().parents[1]
UNKNOWN = "unknown"
FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class Keep:
    """What a family's records keep beyond each run's evaluated rows, config and summary: exactly what its
    report reads, so that the report regenerates unchanged from the records.

    Attributes:
      rounds: per-round metrics read from rows without a test evaluation; kept at every round that has them.
      arrays: ``(name, arrays) -> arrays``: the array metrics to keep of the run ``name`` (``arrays`` as
        ``read_arrays`` returns them, with ``"round"``), reduced to what the report reads; None keeps none.
      sizes: whether to keep each client's number of rows (from ``client_sizes.json`` or ``partition.npz``).
      evaluated: the metrics an evaluated row keeps beside its ``round``, ``test_accuracy`` and a ``diverged``
        mark; None keeps the whole row.
    """

    rounds: tuple[str, ...] = ()
    arrays: Callable[[str, dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None
    sizes: bool = False
    evaluated: tuple[str, ...] | None = None

    def rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """What a record keeps of a run's ``metrics.jsonl`` rows (or of a record's: keeping again changes
        nothing): each evaluated row (whole, or its ``evaluated`` metrics), and of the others only the
        ``rounds`` metrics, rows with none left out."""
        keys = None if self.evaluated is None else {"round", "test_accuracy", "diverged", *self.evaluated}
        kept = []
        for row in rows:
            if "test_accuracy" in row:
                kept.append(row if keys is None else {k: v for k, v in row.items() if k in keys})
            elif any(k in row for k in self.rounds):
                kept.append({k: row[k] for k in ("round", *self.rounds) if k in row})
        return kept


EVERYTHING = None
"""``Record.from_run_dir``'s ``keep`` for a run read in place: every row and array, and the sizes."""


@dataclass
class Record:
    """One finished run's record."""

    name: str
    config: dict[str, Any]
    summary: dict[str, Any]
    rows: list[dict[str, Any]]
    seed: int | None = None
    commit: str = UNKNOWN
    backend: str = UNKNOWN
    devices: list[str] | str = UNKNOWN
    encoded_arrays: dict[str, dict[str, Any]] = field(default_factory=dict)
    sizes: list[int] | None = None

    @classmethod
    def from_run_dir(cls, run_dir: Path, name: str, keep: Keep | None = EVERYTHING,
                     commit: str = UNKNOWN) -> Record:
        """The record of the finished run in ``run_dir`` (``summary.json``, ``config.yaml``,
        ``metrics.jsonl``, ``arrays/``, ``client_sizes.json`` or ``partition.npz``), keeping what ``keep``
        says (everything when None)."""
        from fedjax_lab.experiments.run_directory import read_arrays, read_metrics

        run_dir = Path(run_dir)
        summary = json.loads((run_dir / "summary.json").read_text())
        config_path = run_dir / "config.yaml"
        config = yaml.safe_load(config_path.read_text()) if config_path.is_file() else {}
        rows = read_metrics(run_dir)
        if keep is not EVERYTHING:
            rows = keep.rows(rows)
        arrays = read_arrays(run_dir)
        if keep is not EVERYTHING:
            arrays = keep.arrays(name, arrays) if keep.arrays and arrays else {}
        sizes = None
        if keep is EVERYTHING or keep.sizes:
            if (run_dir / "client_sizes.json").is_file():
                sizes = json.loads((run_dir / "client_sizes.json").read_text())
            elif (run_dir / "partition.npz").is_file():
                from fedjax_lab.data.report import load_partition

                sizes = [len(r) for r in load_partition(run_dir / "partition.npz")[0]]
        return cls(name=name, config=config, summary=summary, rows=rows, seed=config.get("seed"),
                   commit=summary.get("commit", commit), backend=summary.get("backend", UNKNOWN),
                   devices=summary.get("devices", UNKNOWN),
                   encoded_arrays={k: encode_array(v) for k, v in arrays.items()}, sizes=sizes)

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """The kept array metrics (leading axis: rounds, beside ``"round"``), as ``read_arrays`` gives
        them."""
        return {k: decode_array(v) for k, v in self.encoded_arrays.items()}

    def evaluations(self) -> list[dict[str, Any]]:
        """The rows holding a test evaluation, in round order."""
        return [r for r in self.rows if "test_accuracy" in r]

    def write_run_dir(self, run_dir: Path) -> None:
        """Writes the record out as a run directory (``summary.json``, ``config.yaml``, ``metrics.jsonl`` of
        the kept rows, the kept arrays as ``arrays/`` blocks, ``client_sizes.json``), for code that reads
        one."""
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "summary.json").write_text(json.dumps(self.summary, indent=2) + "\n")
        (run_dir / "config.yaml").write_text(yaml.safe_dump(self.config, sort_keys=False))
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in self.rows))
        if self.sizes is not None:
            (run_dir / "client_sizes.json").write_text(json.dumps(self.sizes) + "\n")
        arrays = self.arrays
        if arrays:
            rounds = arrays.pop("round", None)
            length = len(next(iter(arrays.values())))
            rounds = np.arange(1, length + 1) if rounds is None else np.asarray(rounds)
            # one block per consecutive stretch
            breaks = [0, *(np.flatnonzero(np.diff(rounds) != 1) + 1), length]
            (run_dir / "arrays").mkdir(exist_ok=True)
            for a, b in itertools.pairwise(breaks):
                np.savez(run_dir / "arrays" / f"rounds_{rounds[a]:06d}_{rounds[b - 1]:06d}.npz",
                         **{k: v[a:b] for k, v in arrays.items()})

    def to_line(self, base: dict[str, Any]) -> dict[str, Any]:
        changed, unset = config_difference(base, self.config)
        line = {"name": self.name, "seed": self.seed, "commit": self.commit, "backend": self.backend,
                "devices": self.devices, "config": changed}
        if unset:
            line["config_unset"] = unset
        float64: list[list[str | int]] = []
        line |= {"summary": short_floats(self.summary, ("summary",), float64),
                 "rows": short_floats(self.rows, ("rows",), float64)}
        if float64:
            line["float64"] = float64
        if self.encoded_arrays:
            line["arrays"] = self.encoded_arrays
        if self.sizes is not None:
            line["sizes"] = self.sizes
        return line

    @classmethod
    def from_line(cls, line: dict[str, Any], base: dict[str, Any],
                  version: int = HEADER["version"]) -> Record:
        summary, rows = line["summary"], line["rows"]
        if version >= 2:  # float32 values written short
            float64 = {tuple(p) for p in line.get("float64", ())}
            summary = float32_values(summary, ("summary",), float64)
            rows = float32_values(rows, ("rows",), float64)
        return cls(name=line["name"], config=apply_difference(base, line["config"],
                                                              line.get("config_unset", ())),
                   summary=summary, rows=rows, seed=line.get("seed"),
                   commit=line.get("commit", UNKNOWN), backend=line.get("backend", UNKNOWN),
                   devices=line.get("devices", UNKNOWN), encoded_arrays=line.get("arrays", {}),
                   sizes=line.get("sizes"))


# ------------------------------------------------------------------------------------------------ floats
def shortest(single: np.float32) -> float:
    """The float64 of the shortest decimal that reads back to the float32 ``single`` (``np.float32(0.1)``:
    ``0.1``)."""
    return float(np.format_float_positional(single, unique=True))


def short_floats(value: Any, path: tuple = (), float64: list | None = None) -> Any:
    """``value`` (JSON: dicts, lists, scalars) as written: each float that is exactly a float32 value (the
    metrics are, ``0.10000000149011612`` in float64) replaced by ``shortest``'s decimal of it (``0.1``, half
    as long); every other float kept exactly (a float64 value: a timing, a NumPy float64 mean; nan, inf), so
    that the rule is idempotent; ints, bools, strings and None kept. A float64 value that is itself the
    shortest decimal of a float32 (``0.1``: it would read back as ``np.float32(0.1)``) has its path (``path``
    and the keys and indices under it) added to ``float64`` when given, for ``float32_values`` to keep."""
    if isinstance(value, float):
        if not abs(value) <= FLOAT32_MAX:  # nan, inf, or beyond float32's range
            return value
        single = np.float32(value)
        short = shortest(single)
        if float(single) == value:
            return short if np.float32(short) == single else value
        if short == value and float64 is not None:
            float64.append(list(path))
        return value
    if isinstance(value, dict):
        return {k: short_floats(v, (*path, k), float64) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [short_floats(v, (*path, k), float64) for k, v in enumerate(value)]
    return value


def float32_values(value: Any, path: tuple = (), float64: frozenset | set = frozenset()) -> Any:
    """The inverse of ``short_floats`` on reading: each float that is the shortest decimal of a float32
    and not that float32 itself (``0.1``) becomes the float32 value (``0.10000000149011612``), except at the
    paths in ``float64``; so a record reads back exactly as it was written."""
    if isinstance(value, float):
        if not abs(value) <= FLOAT32_MAX or path in float64:
            return value
        single = np.float32(value)
        exact = float(single)
        return exact if exact != value and shortest(single) == value else value
    if isinstance(value, dict):
        return {k: float32_values(v, (*path, k), float64) for k, v in value.items()}
    if isinstance(value, list):
        return [float32_values(v, (*path, k), float64) for k, v in enumerate(value)]
    return value


# ------------------------------------------------------------------------------------------------ configs
def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``. A dict that is empty or has a key with a dot (an override map
    such as ``{algorithm.weight: 0.0}``) is one value, so that ``unflatten`` inverts it exactly."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict) and value and all(isinstance(k, str) and "." not in k for k in value):
            flat |= flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, last = key.split(".")
        node = config
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return config


def same(a: Any, b: Any) -> bool:
    """Equal as JSON (so 1 and 1.0, or 0 and False, differ)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def config_difference(base: dict[str, Any], config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(the dotted keys of ``config`` whose value differs from ``base``'s or that it lacks, the dotted keys of
    ``base`` that ``config`` lacks), sorted: a record reads back and writes again to the same line."""
    flat, flat_base = flatten(config), flatten(base)
    changed = {k: v for k, v in sorted(flat.items()) if k not in flat_base or not same(v, flat_base[k])}
    return changed, sorted(k for k in flat_base if k not in flat)


def apply_difference(base: dict[str, Any], changed: dict[str, Any], unset=()) -> dict[str, Any]:
    flat = {k: v for k, v in flatten(base).items() if k not in set(unset)}
    return unflatten(flat | changed)


def common_config(configs: list[dict[str, Any]]) -> dict[str, Any]:
    """A base config that leaves ``configs`` small differences: each dotted key at least half of them have,
    with its most common value."""
    flats = [flatten(c) for c in configs]
    counts = Counter(k for f in flats for k in f)
    base = {}
    for key in dict.fromkeys(k for f in flats for k in f):  # first-seen order
        if 2 * counts[key] >= len(flats):
            values = Counter(json.dumps(f[key], sort_keys=True) for f in flats if key in f)
            top = values.most_common(1)[0][0]
            base[key] = next(f[key] for f in flats if key in f and json.dumps(f[key], sort_keys=True) == top)
    return unflatten(base)


# ------------------------------------------------------------------------------------------------ arrays
def encode_array(array: np.ndarray) -> dict[str, Any]:
    """An array as JSON: dtype, shape and its bytes (little-endian; booleans packed 8 to a byte) in base64."""
    array = np.asarray(array)
    if array.dtype == bool:
        data = np.packbits(array.ravel()).tobytes()
    else:
        data = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
    return {"dtype": array.dtype.str.lstrip("<>|="), "shape": list(array.shape),
            "base64": base64.b64encode(data).decode()}


def decode_array(encoded: dict[str, Any]) -> np.ndarray:
    data, shape = base64.b64decode(encoded["base64"]), tuple(encoded["shape"])
    if encoded["dtype"] == "b1":
        return np.unpackbits(np.frombuffer(data, np.uint8),
                             count=int(np.prod(shape))).astype(bool).reshape(shape)
    return np.frombuffer(data, np.dtype("<" + encoded["dtype"])).reshape(shape).astype(encoded["dtype"])


# ------------------------------------------------------------------------------------------------ files
def code_commit() -> str:
    """The checkout's git commit, ``+dirty`` when its code or configs differ from it; ``unknown`` outside
    git."""
    return _code_commit(REPO)


@functools.cache
def _code_commit(repo: Path) -> str:
    try:
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=30, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no", "--",
                                "fedjax_lab", "configs", "benchmarks/*.py"], capture_output=True, text=True,
                               timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return UNKNOWN
    return commit + ("+dirty" if dirty else "") if commit else UNKNOWN


def _open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8")


@functools.lru_cache(maxsize=32)
def _read(path: Path, stamp: tuple[int, ...] | None) -> tuple[dict[str, Any], dict[str, Record]]:
    del stamp  # the cache key: a rewritten file (a new inode, time and size) is read again
    with _open_text(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    if not lines or lines[0].get("records") != HEADER["records"]:
        raise ValueError(f"{path} is not a file of run records (no header line)")
    base = lines[0].get("base_config", {})
    version = lines[0].get("version", 1)
    return base, {line["name"]: Record.from_line(line, base, version) for line in lines[1:]}


def read(path: Path) -> dict[str, Record]:
    """The records of ``path`` by name (empty if the file does not exist)."""
    return read_with_base(path)[1]


def read_with_base(path: Path, cached: bool = True) -> tuple[dict[str, Any], dict[str, Record]]:
    """(the file's base config, its records by name); ``cached=False`` reads the file again whatever its stamp
    (under the lock, before writing it)."""
    path = Path(path)
    try:
        stat = path.stat()
    except FileNotFoundError:
        return {}, {}
    if not cached:
        base, records = _read.__wrapped__(path, None)
    else:
        base, records = _read(path, (stat.st_ino, stat.st_mtime_ns, stat.st_size))
    return base, dict(records)


def write(path: Path, records: dict[str, Record], base: dict[str, Any] | None = None) -> None:
    """Writes ``records`` to ``path`` atomically, sorted by name, as differences from ``base`` (default: the
    configs' common values). A ``.gz`` path is gzipped reproducibly (no name or time in the header)."""
    path = Path(path)
    if base is None:
        base = common_config([r.config for r in records.values()])
    lines = [{**HEADER, "base_config": base}] + [records[n].to_line(base) for n in sorted(records)]
    text = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines).encode()
    if path.suffix == ".gz":
        buffer = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=buffer, mtime=0) as f:
            f.write(text)
        text = buffer.getvalue()
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_bytes(text)
    temporary.replace(path)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Holds the lock of the records file ``path`` (``.<name>.lock`` beside it, git-ignored): copies of a
    script finishing runs at once each add theirs to what the others wrote."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def add(path: Path, new: list[Record]) -> None:
    """Adds ``new`` to the records of ``path`` (replacing records of the same name), under its lock. A new
    file's base config is its first run's."""
    if not new:
        return
    path = Path(path)
    with locked(path):
        base, records = read_with_base(path, cached=False)
        records |= {r.name: r for r in new}
        write(path, records, base if path.is_file() else new[0].config)
