"""The run plots: readable (axis labels, a title saying what ran, smoothed client loss, a method's start
marked, class names in partition.png) and neutral (no pyplot, so a notebook's backend survives a run)."""

import json
import subprocess
import sys

import numpy as np
import yaml

from fedjax_lab.data.report import plot_counts
from fedjax_lab.experiments.plots import curves_figure, describe_run, moving_average, start_rounds

CONFIG = {"dataset": {"name": "fashion_mnist",
                      "partition": {"name": "dirichlet", "num_clients": 10, "alpha": 0.1}},
          "model": {"name": "simple_cnn"}, "rounds": {"clients_per_round": 10},
          "algorithm": {"name": "fedprox", "plugins": [{"name": "fedcog", "start_round": 20}]}}


def fake_run(run_dir, rounds=40):
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    rows = [{"round": 0, "test_accuracy": 0.1, "test_loss": 2.3}]
    rows += [{"round": r, "train_loss": 1.0 + (r % 2),
              **({"test_accuracy": 0.5, "test_loss": 1.0} if r % 5 == 0 else {})}
             for r in range(1, rounds + 1)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_moving_average_is_the_mean_of_each_value_and_those_before_it():
    values = np.array([4.0, 2.0, 6.0, 0.0, 5.0])
    expected = [4.0, 3.0, 4.0, 8 / 3, 11 / 3]  # windows of 3, shorter at the start
    np.testing.assert_allclose(moving_average(values, 3), expected)


def test_the_title_says_what_ran_and_a_methods_start_is_marked(tmp_path):
    assert describe_run(CONFIG) == ("fedprox + fedcog on fashion_mnist, Dirichlet(0.1), simple_cnn, 10 "
                                    "clients (10 a round)")
    assert start_rounds(CONFIG) == [("fedcog", 20)]
    fake_run(tmp_path / "run")
    figure = curves_figure([tmp_path / "run"])
    assert figure.get_suptitle() == describe_run(CONFIG)
    for ax in figure.axes:
        assert ax.get_xlabel() == "round" and ax.get_ylabel()
        assert any(list(line.get_xdata()) == [20, 20] for line in ax.get_lines())  # FedCOG's start
    loss = figure.axes[2]
    labels = [line.get_label() for line in loss.get_lines()]
    # 40 rounds: a window of a tenth, over the faint raw values
    assert "fedprox + fedcog (4-round mean)" in labels
    raw = next(line for line in loss.get_lines() if line.get_alpha() == 0.25)
    assert len(raw.get_xdata()) == 40
    assert figure._repr_png_().startswith(b"\x89PNG")  # a notebook shows it as a cell's value


def test_partition_png_names_the_classes(tmp_path, monkeypatch):
    import matplotlib.figure

    saved = {}
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda self, *a, **k: saved.setdefault("figure", self))
    plot_counts(np.array([[3, 0], [1, 2]]), tmp_path / "partition.png", title="mnist",
                class_names=["T-shirt/top", "Trouser"])
    legend = saved["figure"].axes[0].get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["T-shirt/top", "Trouser"]
    assert saved["figure"].axes[0].get_ylabel() == "training examples"


def test_plotting_leaves_the_users_matplotlib_backend_alone(tmp_path):
    fake_run(tmp_path / "run", rounds=5)
    code = ("import sys, matplotlib; matplotlib.use('svg'); "
            "from fedjax_lab.experiments.plots import plot_runs; "
            f"plot_runs([{str(tmp_path / 'run')!r}], {str(tmp_path / 'curves.png')!r}); "
            "print(matplotlib.get_backend(), 'matplotlib.pyplot' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["svg", "False"] and (tmp_path / "curves.png").read_bytes().startswith(b"\x89PNG")
