"""Partition reports: per-client class counts as a table and as a plot, and saving/reloading a partition."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fedjax_lab.data.files import DataFileError, read_npz
from fedjax_lab.data.partitions import ClientRows


def save_partition(path: str | Path, client_rows: ClientRows, meta: dict) -> None:
    """Writes client rows (concatenated, with offsets) and ``meta`` (JSON) to an ``.npz`` file."""
    offsets = np.cumsum([0] + [len(rows) for rows in client_rows])
    rows = np.concatenate(client_rows) if client_rows else np.zeros(0, np.int64)
    np.savez(path, rows=rows, offsets=offsets, meta=np.asarray(json.dumps(meta)))


def load_partition(path: str | Path) -> tuple[ClientRows, dict]:
    """Reads what :func:`save_partition` wrote: ``(client_rows, meta)``."""
    what = "a partition file (rows, offsets, meta)"
    hint = "write one with fedjax-lab partition CONFIG --out FOLDER (or take a run directory's partition.npz)"
    z = read_npz(path, "dataset.partition.file", what, ("rows", "offsets", "meta"), hint)
    offsets, rows = z["offsets"], z["rows"]
    try:
        meta = json.loads(str(z["meta"]))
    except ValueError:
        meta = None
    if (not isinstance(meta, dict) or offsets.ndim != 1 or rows.ndim != 1 or not len(offsets)
            or offsets[0] != 0 or offsets[-1] != len(rows) or np.any(np.diff(offsets) < 0)
            or not np.issubdtype(rows.dtype, np.integer)):
        raise DataFileError(f"dataset.partition.file: {path} is not {what}: its offsets, rows or meta are "
                            f"inconsistent; {hint}")
    return [rows[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)], meta


def counts_table(counts: np.ndarray, class_names: tuple[str, ...] | None = None, max_rows: int = 30) -> str:
    """A Markdown table of per-client class counts (first ``max_rows`` clients) with a totals row."""
    k = counts.shape[1]
    names = list(class_names or [str(i) for i in range(k)])
    head = "| client | " + " | ".join(names) + " | total |\n|---:|" + "---:|" * (k + 1)
    lines = [f"| {i} | " + " | ".join(str(int(c)) for c in row) + f" | {int(row.sum())} |"
             for i, row in enumerate(counts[:max_rows])]
    if len(counts) > max_rows:
        lines.append(f"| ... {len(counts) - max_rows} more | " + " | " * k)
    lines.append("| **all** | " + " | ".join(str(int(c)) for c in counts.sum(0))
                 + f" | {int(counts.sum())} |")
    sizes = counts.sum(1)
    classes_held = (counts > 0).sum(1)
    summary = (f"\n{len(counts)} clients; size min {sizes.min()} median {int(np.median(sizes))} "
               f"max {sizes.max()}; classes per client min {classes_held.min()} "
               f"median {int(np.median(classes_held))} max {classes_held.max()}\n")
    return "\n".join([head] + lines) + "\n" + summary


def plot_counts(counts: np.ndarray, path: str | Path, title: str = "", max_clients: int = 100,
                class_names: list[str] | None = None) -> None:
    """Saves a stacked bar chart of per-client class counts (one bar per client, one colour per class, named
    in the legend as in ``partition.md``)."""
    from matplotlib import colormaps
    from matplotlib.collections import PolyCollection
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    shown = f" (the first {max_clients} of {len(counts)} clients)" if len(counts) > max_clients else ""
    counts = counts[:max_clients]
    n, k = counts.shape
    names = list(class_names or [str(i) for i in range(k)])
    figure = Figure(figsize=(min(max(6, n * 0.12), 16) + (1.5 if k <= 20 else 0), 4), layout="constrained")
    ax = figure.subplots()
    colours = colormaps["tab20" if k > 10 else "tab10"]
    # One collection of rectangles per class, not one patch per bar (ax.bar): drawing 100 clients x 10 classes
    # as patches took 1-2 s, which every run and every member of a sweep paid.
    left, right = np.arange(n) - 0.45, np.arange(n) + 0.45
    bottom = np.zeros(n)
    for c in range(k):
        top = bottom + counts[:, c]
        corners = np.stack([np.stack([left, bottom], -1), np.stack([right, bottom], -1),
                            np.stack([right, top], -1), np.stack([left, top], -1)], axis=1)
        ax.add_collection(PolyCollection(corners, facecolors=colours(c % colours.N), edgecolors="none",
                                         label=names[c] if k <= 20 else None))
        bottom = top
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_ylim(0, max(float(bottom.max()), 1.0) * 1.05)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # clients are whole
    ax.set_xlabel("client")
    ax.set_ylabel("training examples")
    ax.set_title(title + shown, fontsize=10)
    if k <= 20:
        ax.legend(title="class", ncol=1 if k <= 10 else 2, fontsize=7, bbox_to_anchor=(1.01, 1),
                  loc="upper left")
    figure.savefig(path, dpi=110)


def write_partition_report(dataset, out_dir: str | Path, meta: dict | None = None,
                           drawn_in: str | Path | None = None) -> str:
    """Writes ``partition.npz`` (reloadable with ``dataset.partition.file``), ``partition.md`` (class-count
    table) and ``partition.png`` for a :class:`~fedjax_lab.data.FederatedDataset` with one label per example;
    returns the table. Sequence datasets get only ``partition.npz``. ``drawn_in``: a folder where the same
    dataset's report was written (a one-program sweep's members share one partition), whose table and plot
    are copied rather than drawn again."""
    out_dir = Path(out_dir)
    rows = [dataset.client_train_ids[k, :n] for k, n in enumerate(dataset.client_train_counts)]
    save_partition(out_dir / "partition.npz", rows, {"dataset": dataset.name, **(meta or {})})
    if dataset.train["y"].ndim != 1:
        return ""
    if drawn_in is not None:
        table = (Path(drawn_in) / "partition.md").read_text()
        (out_dir / "partition.md").write_text(table)
        (out_dir / "partition.png").write_bytes((Path(drawn_in) / "partition.png").read_bytes())
        return table.split("\n\n", 1)[1]
    counts = np.stack([np.bincount(dataset.train["y"][r], minlength=dataset.num_classes) for r in rows])
    table = counts_table(counts, dataset.class_names or None)
    (out_dir / "partition.md").write_text(f"# Partition of {dataset.name}\n\n{table}")
    plot_counts(counts, out_dir / "partition.png", title=dataset.summary().split(":")[0],
                class_names=dataset.class_names or None)
    return table
