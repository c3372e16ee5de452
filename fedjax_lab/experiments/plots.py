"""Learning-curve plots: one run, or several overlaid."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from fedjax_lab.experiments.run_directory import read_metrics

PANELS = (("test_accuracy", "test accuracy"), ("test_loss", "test loss"), ("train_loss", "client train loss"))


def plot_runs(run_dirs: list[str | Path], out_path: str | Path, labels: list[str] | None = None) -> Path:
    """Plots test accuracy, test loss and client training loss against rounds for each run, overlaid.

    Args:
      run_dirs: run directories holding ``metrics.jsonl``.
      out_path: where to write the PNG.
      labels: legend entries; defaults to the directories' names.

    Returns:
      ``out_path`` as a Path.
    """
    labels = labels or [Path(d).name for d in run_dirs]
    fig, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 3.6))
    for run_dir, label in zip(run_dirs, labels):
        rows = read_metrics(run_dir)
        for ax, (key, title) in zip(axes, PANELS):
            points = [(row["round"], row[key]) for row in rows if key in row]
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, label=label, marker="." if len(xs) < 40 else None)
    for ax, (_, title) in zip(axes, PANELS):
        ax.set_title(title)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    out_path = Path(out_path)
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return out_path
