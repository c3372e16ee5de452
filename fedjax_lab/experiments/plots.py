"""Learning-curve plots of run directories: one run, or several overlaid.

The figures are :class:`matplotlib.figure.Figure` objects built without ``pyplot``: saving one needs no
backend and leaves the user's alone (a notebook's inline backend keeps working after a run), and a notebook
shows the figure that ``curves_figure`` returns.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from matplotlib.figure import Figure

from fedjax_lab.experiments.run_directory import read_metrics

PANELS = (  # metric, panel title, y-axis label
    ("test_accuracy", "test accuracy of the global model", "accuracy (fraction of test examples)"),
    ("test_loss", "test loss of the global model", "cross-entropy (nats)"),
    ("train_loss", "clients' training loss", "mean over local steps and clients (nats)"),
)
SMOOTHED = {"train_loss"}  # per-round values too noisy to read raw: drawn faint, with a moving average on top


class ShownFigure(Figure):
    """A figure that a notebook shows as the value of a cell (``_repr_png_``), whatever backend is active."""

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self.savefig(buffer, format="png", dpi=90)
        return buffer.getvalue()


def run_config(run_dir: str | Path) -> dict[str, Any]:
    """A run directory's resolved ``config.yaml`` as a dict (empty if it has none)."""
    path = Path(run_dir) / "config.yaml"
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def method_name(config: dict[str, Any]) -> str:
    """``fedavg``, ``scaffold + fedprox + fedcog``: the method and its plug-ins."""
    algorithm = config.get("algorithm") or {}
    return " + ".join([str(algorithm.get("name", "?"))]
                      + [str(p.get("name")) for p in algorithm.get("plugins") or []])


def describe_run(config: dict[str, Any]) -> str:
    """What ran, in one line: ``fedavg on synthetic, logistic_regression, 30 clients (10 a round)``."""
    dataset, rounds = config.get("dataset") or {}, config.get("rounds") or {}
    partition = dataset.get("partition") or {}
    clients = dataset.get("num_clients") or partition.get("num_clients")
    split = partition.get("name", "")
    if split == "dirichlet" and "alpha" in partition:
        split = f"Dirichlet({partition['alpha']})"
    where = ", ".join(str(x) for x in (dataset.get("name"), split, (config.get("model") or {}).get("name"))
                      if x)
    cohort = f", {clients} clients ({rounds.get('clients_per_round')} a round)" if clients else ""
    return f"{method_name(config)} on {where}{cohort}"


def start_rounds(config: dict[str, Any]) -> list[tuple[str, int]]:
    """The rounds where a method of the run starts acting (a ``start_round`` field, such as FedCOG's)."""
    algorithm = config.get("algorithm") or {}
    return [(str(m.get("name")), int(m["start_round"]))
            for m in [algorithm, *(algorithm.get("plugins") or [])] if m.get("start_round")]


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """The mean of each value and the ``window - 1`` before it (fewer at the start)."""
    sums = np.cumsum(np.insert(np.asarray(values, float), 0, 0.0))
    ends = np.arange(1, len(values) + 1)
    starts = np.maximum(ends - window, 0)
    return (sums[ends] - sums[starts]) / (ends - starts)


def curves_figure(run_dirs: list[str | Path], labels: list[str] | None = None,
                  title: str | None = None) -> Figure:
    """Test accuracy, test loss and the clients' training loss against rounds, one line per run.

    The clients' training loss is drawn faint per round, with its moving average (a tenth of the rounds) on
    top; the round where a method starts (FedCOG's ``start_round``) is a dashed line; the title says what ran.

    Args:
      run_dirs: run directories holding ``metrics.jsonl`` (and ``config.yaml``).
      labels: legend entries; default: each run's method, or its directory's name where the methods repeat.
      title: default: what ran (the method and data, for one run; the data, for several).
    """
    configs = [run_config(d) for d in run_dirs]
    if labels is None:
        methods = [method_name(c) for c in configs]
        labels = methods if len(set(methods)) == len(methods) else [Path(d).name for d in run_dirs]
    if title is None:
        title = (describe_run(configs[0]) if len(run_dirs) == 1
                 else describe_run(configs[0]).split(" on ", 1)[-1])
    figure = ShownFigure(figsize=(5 * len(PANELS), 3.9), layout="constrained")
    axes = figure.subplots(1, len(PANELS))
    colours = [f"C{i % 10}" for i in range(len(run_dirs))]
    for run_dir, label, colour, config in zip(run_dirs, labels, colours, configs):
        rows = read_metrics(run_dir)
        for ax, (key, _, _) in zip(axes, PANELS):
            points = np.array([(row["round"], row[key]) for row in rows if key in row], float).reshape(-1, 2)
            if not len(points):
                continue
            rounds, values = points.T
            if key in SMOOTHED and len(points) > 10:
                ax.plot(rounds, values, color=colour, alpha=0.25, linewidth=0.7)
                window = max(2, len(points) // 10)
                ax.plot(rounds, moving_average(values, window), color=colour,
                        label=f"{label} ({window}-round mean)")
            else:
                ax.plot(rounds, values, color=colour, label=label, marker="." if len(points) < 40 else None)
        for name, start in start_rounds(config):
            for ax in axes:
                ax.axvline(start, color=colour, linestyle="--", linewidth=0.8, alpha=0.7)
            axes[0].annotate(f"{name} starts", (start, 0.02), xycoords=("data", "axes fraction"), fontsize=7,
                             rotation=90, va="bottom", ha="right", color=colour)
    for ax, (_, panel, ylabel) in zip(axes, PANELS):
        ax.set_title(panel, fontsize=10)
        ax.set_xlabel("round")
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    figure.suptitle(title, fontsize=11)
    return figure


def plot_runs(run_dirs: list[str | Path], out_path: str | Path, labels: list[str] | None = None,
              title: str | None = None) -> Path:
    """Saves :func:`curves_figure` of ``run_dirs`` to ``out_path`` (PNG); returns it as a Path."""
    out_path = Path(out_path)
    curves_figure(run_dirs, labels, title).savefig(out_path, dpi=110)
    return out_path


def staleness_figure(run_dirs: list[str | Path], labels: list[str] | None = None) -> Figure:
    """The asynchronous round's traffic for each run: arrivals and jobs in flight per round, mean and max
    staleness of the arrivals per round, and the distribution of staleness over the whole run."""
    from fedjax_lab.experiments.run_directory import read_arrays

    labels = labels or [Path(d).name for d in run_dirs]
    figure = ShownFigure(figsize=(15, 3.9), layout="constrained")
    axes = figure.subplots(1, 3)
    for run_dir, label in zip(run_dirs, labels):
        rows = [r for r in read_metrics(run_dir) if "arrivals" in r]
        rounds = [r["round"] for r in rows]
        line = axes[0].plot(rounds, [r["in_flight"] for r in rows], label=f"{label}: in flight")[0]
        axes[0].plot(rounds, [r["arrivals"] for r in rows], color=line.get_color(), alpha=0.5, lw=0.8,
                     label=f"{label}: arrivals")
        line = axes[1].plot(rounds, [r["staleness_mean"] for r in rows], label=f"{label}: mean")[0]
        axes[1].plot(rounds, [r["staleness_max"] for r in rows], color=line.get_color(), ls=":",
                     label=f"{label}: max")
        counts = read_arrays(run_dir).get("staleness_counts")
        if counts is not None:
            total = counts.sum(0)
            axes[2].step(np.arange(len(total)), total / max(total.sum(), 1), where="mid", label=label)
    for ax, title, xlabel, ylabel in zip(
            axes, ("jobs", "staleness of the arrivals", "staleness distribution"),
            ("round", "round", "staleness (rounds)"),
            ("clients", "staleness (rounds)", "fraction of arrivals")):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    figure.suptitle(describe_run(run_config(run_dirs[0])) if len(run_dirs) == 1 else "asynchronous traffic",
                    fontsize=11)
    return figure


def plot_staleness(run_dirs: list[str | Path], out_path: str | Path, labels: list[str] | None = None) -> Path:
    """Saves :func:`staleness_figure` of ``run_dirs`` to ``out_path`` (PNG); returns it as a Path."""
    out_path = Path(out_path)
    staleness_figure(run_dirs, labels).savefig(out_path, dpi=110)
    return out_path
