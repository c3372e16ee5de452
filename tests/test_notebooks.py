"""The notebooks run from top to bottom in a Jupyter kernel, as a reader runs them (the inline backend,
nothing forced), do what they say, and show every figure they draw."""

import pathlib

import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))

# Run in the kernel after the notebook's own cells, in its namespace (the notebooks run in tmp/notebooks).
CHECKS = {
    "quickstart.ipynb": """
assert Path("../runs/notebook_fedadam/curves.png").exists() and Path("../runs/fedavg_vs_fedadam.png").exists()
assert int(state.round) == 4 * BLOCK
""",
    "sweeps.ipynb": """
assert summary["layout"].startswith("one program")
assert len(summary["members"]) == 12
assert Path("../runs/notebook_sweep/curves.png").exists()
assert Path("../runs/notebook_sweep/seeds_x_rates.png").exists()
""",
    "bherd.ipynb": """
assert len(results) == 9 and ROUNDS == 3
assert (RUNS / "fig2a_svm.png").exists() and (RUNS / "fig4_selection.png").exists()
assert selected.shape[:2] == (3, 5)
""",
    "feddle.ipynb": """
assert len(results) == 3 and ROUNDS == 3
assert (RUNS / "feddle_vs_fedbuff.png").exists()
assert len(negative) == 3
""",
    "fedcog.ipynb": """
assert len(curves) == 4 and all(len(c) == 4 for c in curves.values())  # rounds 0..3
for base in ("FedAvg", "FedProx"):  # identical before the start round, apart after it
    assert curves[base][:2] == curves[f"{base} + FedCOG"][:2]
assert (RUNS / "fedcog_vs_base.png").exists()
""",
    "fedimpro.ipynb": """
assert len(curves) == 2 and all(len(c["round"]) == 5 for c in curves.values())  # rounds 0..4
assert all(v > 0 for c in curves.values() for v in c["gradient_dissimilarity_upper_relative"])
assert (RUNS / "fedimpro_vs_fedavg.png").exists()
""",
}
NEEDS_MNIST = {"bherd.ipynb", "feddle.ipynb", "fedcog.ipynb", "fedimpro.ipynb"}


def draws(source: str) -> bool:
    """Whether a code cell draws a figure for the reader."""
    return any(call in source for call in ("plt.show()", "plt.subplots(", "curves_figure("))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_and_shows_its_figures(path, tmp_path, monkeypatch):
    nbclient = pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")
    from fedjax_lab.data.sources import default_data_dir

    if path.name in NEEDS_MNIST and not (default_data_dir() / "mnist" / "mnist.npz").is_file():
        pytest.skip("../shared/data not present")
    monkeypatch.setenv("FEDJAX_LAB_NOTEBOOK_TINY", "1")
    # One CPU device a kernel: the suite runs a kernel on each core already. (Every notebook also ran, and
    # passed these checks, with its round split over both cores of a 2-core VM; test_scale tests the split.)
    monkeypatch.setenv("FEDJAX_LAB_CPU_DEVICES", "1")
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's own (inline) backend, as a reader has it
    work = tmp_path / "notebooks"
    work.mkdir()
    (tmp_path / "configs").symlink_to(path.parent.parent / "configs")
    notebook = nbformat.reads(path.read_text(), as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell("from pathlib import Path\n" + CHECKS[path.name]))
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(work)}}).execute()
    # the executed copy, for a look after a failure
    (tmp_path / path.name).write_text(nbformat.writes(notebook))
    drawing = [cell for cell in notebook.cells if cell.cell_type == "code" and draws(cell.source)]
    assert drawing, f"{path.name} draws no figure"
    for cell in drawing:
        images = [o for o in cell.outputs if "image/png" in o.get("data", {})]
        assert images, f"{path.name}: a cell draws but shows no figure:\n{cell.source[:200]}"
