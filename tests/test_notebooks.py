"""The notebooks' code runs from top to bottom (with matplotlib drawing off-screen), and does what it says."""

import json
import pathlib

import matplotlib
import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def _quickstart_checks(tmp_path, namespace):
    assert (tmp_path / "runs" / "notebook_fedadam" / "curves.png").exists()
    assert int(namespace["state"].round) == 4 * namespace["BLOCK"]


def _sweeps_checks(tmp_path, namespace):
    assert namespace["summary"]["layout"].startswith("one program")
    assert len(namespace["summary"]["members"]) == 12
    assert (tmp_path / "runs" / "notebook_sweep" / "curves.png").exists()


def _bherd_checks(tmp_path, namespace):
    assert len(namespace["results"]) == 9 and namespace["ROUNDS"] == 3
    assert (tmp_path / "runs" / "notebook_bherd" / "fig2a_svm.png").exists()
    assert namespace["selected"].shape[:2] == (3, 5)


def _feddle_checks(tmp_path, namespace):
    assert len(namespace["results"]) == 3 and namespace["ROUNDS"] == 3
    assert (tmp_path / "runs" / "notebook_feddle" / "feddle_vs_fedbuff.png").exists()
    assert len(namespace["negative"]) == 3


def _fedcog_checks(tmp_path, namespace):
    curves = namespace["curves"]
    assert len(curves) == 4 and all(len(c) == 4 for c in curves.values())  # rounds 0..3
    for base in ("FedAvg", "FedProx"):  # identical before the start round, apart after it
        assert curves[base][:2] == curves[f"{base} + FedCOG"][:2]
    assert (tmp_path / "runs" / "notebook_fedcog" / "fedcog_vs_base.png").exists()


def _fedimpro_checks(tmp_path, namespace):
    curves = namespace["curves"]
    assert len(curves) == 2 and all(len(c["round"]) == 5 for c in curves.values())  # rounds 0..4
    assert all(v > 0 for c in curves.values() for v in c["gradient_dissimilarity_upper_relative"])
    assert (tmp_path / "runs" / "notebook_fedimpro" / "fedimpro_vs_fedavg.png").exists()


CHECKS = {"quickstart.ipynb": _quickstart_checks, "sweeps.ipynb": _sweeps_checks, "bherd.ipynb": _bherd_checks,
          "feddle.ipynb": _feddle_checks, "fedcog.ipynb": _fedcog_checks,
          "fedimpro.ipynb": _fedimpro_checks}
NEEDS_MNIST = {"bherd.ipynb", "feddle.ipynb", "fedcog.ipynb", "fedimpro.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    from fedjax_lab.data.sources import default_data_dir

    if path.name in NEEDS_MNIST and not (default_data_dir() / "mnist" / "mnist.npz").is_file():
        pytest.skip("../shared/data not present")
    monkeypatch.setenv("FEDJAX_LAB_NOTEBOOK_TINY", "1")
    matplotlib.use("Agg")
    work = tmp_path / "notebooks"
    work.mkdir()
    (tmp_path / "configs").symlink_to(path.parent.parent / "configs")
    monkeypatch.chdir(work)
    cells = json.loads(path.read_text())["cells"]
    namespace = {}
    for cell in cells:
        if cell["cell_type"] == "code":
            exec("".join(cell["source"]), namespace)  # noqa: S102 (running the notebook is the test)
    CHECKS[path.name](tmp_path, namespace)
