"""The reproduction scripts keep every finished run's record in the repository and never run a kept cell again."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from fedjax_lab.data.report import save_partition

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import table_runs


@pytest.fixture
def records(tmp_path, monkeypatch):
    monkeypatch.setattr(table_runs, "RECORDS", tmp_path / "records")
    return tmp_path / "records"


def fake_run(run_dir: Path, accuracy: float) -> None:
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "big").write_bytes(b"0" * 1000)
    (run_dir / "metrics.jsonl").write_text(json.dumps({"round": 5, "test_accuracy": accuracy}) + "\n")
    (run_dir / "summary.json").write_text(json.dumps({"best_test_accuracy": accuracy}))
    (run_dir / "config.yaml").write_text("seed: 0\n")
    save_partition(run_dir / "partition.npz", [np.arange(3), np.arange(3, 8)], {})


def test_collect_keeps_the_record_of_finished_runs_without_checkpoints(tmp_path, records):
    runs = tmp_path / "fedimpro"
    fake_run(runs / "a/fedavg/seed0", 0.8)
    (runs / "a/fedavg/seed1").mkdir(parents=True)  # unfinished: no summary, not kept
    kept = table_runs.collect(runs)
    assert kept == records / "fedimpro"
    assert sorted(p.name for p in (kept / "a/fedavg/seed0").iterdir()) == [
        "client_sizes.json", "config.yaml", "metrics.jsonl", "summary.json"]
    assert json.loads((kept / "a/fedavg/seed0/client_sizes.json").read_text()) == [3, 5]
    assert not (kept / "a/fedavg/seed1").exists()
    assert table_runs.seeds_on_disk(kept, [7]) == [0]


def test_a_kept_cell_is_not_run_again_on_a_fresh_clone(tmp_path, records):
    runs = tmp_path / "fedimpro"
    fake_run(runs / "a/fedavg/seed0", 0.8)
    table_runs.collect(runs)
    fresh = tmp_path / "fresh" / "fedimpro"  # a new checkout: no run folders, the records committed
    # The config is never looked at: a kept cell returns before running.
    assert table_runs.run_once(fresh, "a/fedavg/seed0", config=None) is None
    assert not (fresh / ".claims" / "a__fedavg__seed0").exists()


def test_a_claimed_cell_is_skipped_and_its_claim_left_to_its_owner(tmp_path, records):
    runs = tmp_path / "fedimpro"
    (runs / ".claims").mkdir(parents=True)
    (runs / ".claims" / "a__fedavg__seed0").touch()
    assert table_runs.run_once(runs, "a/fedavg/seed0", config=None) is None
    assert (runs / ".claims" / "a__fedavg__seed0").exists()


OLD_REPORT = """# Table 5
| method | paper | ours | paper | ours |
|---|---|---|---|---|
| FedAvg | 60.8 | 52.8±6.5 | 80.7 | - |
| Feddle | 86.5 | 72.0±2.3 | 87.3 | - |
"""


def test_a_report_that_would_lose_filled_cells_goes_beside_the_old_one(tmp_path, capsys):
    out = tmp_path / "feddle_tables.md"
    out.write_text(OLD_REPORT)
    # Regenerated from fewer records: the first "ours" column is gone, the second filled in.
    new = OLD_REPORT.replace("52.8±6.5 | 80.7 | -", "- | 80.7 | 69.1±1.0")
    assert table_runs.lost_cells(OLD_REPORT, new) == [("Table 5", "FedAvg", "ours")]
    written = table_runs.write_report(out, new)
    assert written == tmp_path / "feddle_tables.new.md" and written.read_text() == new
    assert out.read_text() == OLD_REPORT
    assert "1 filled cells would be lost (Table 5 / FedAvg / ours)" in capsys.readouterr().out


def test_a_report_that_keeps_every_filled_cell_replaces_the_old_one(tmp_path):
    out = tmp_path / "feddle_tables.md"
    out.write_text(OLD_REPORT)
    new = OLD_REPORT.replace("| - |\n", "| 70.0±1.0 |\n") + "\n# New section\n| a | b |\n|---|---|\n| x | - |\n"
    assert table_runs.table_cells(new)["Table 5", "Feddle", "ours#2"] == "70.0±1.0"
    assert table_runs.write_report(out, new) == out and out.read_text() == new


def test_feddle_report_finds_center_under_whichever_column_it_ran(tmp_path):
    import feddle_table

    # Center uses no client: asked for the Dir(0.3)/N(5) column only, it ran there, not under the first column.
    fake_run(tmp_path / "fashion_mnist/dir0.3/N5/center/seed1", 0.8)
    assert feddle_table.center_metric(tmp_path, "fashion_mnist", 1) == pytest.approx((80.0, 80.0))
    assert feddle_table.center_metric(tmp_path, "fashion_mnist", 0) is None


def test_feddf_grid_reuses_table5_seed0_cells_at_the_rates_the_table_has_rows_for():
    import feddle_table

    jobs = {name: overrides for name, _, overrides in feddle_table.feddf_jobs("cifar10")}
    assert "cifar10/dir0.1/N20/feddf_id/seed0" in jobs  # lr 1e-3
    assert "cifar10/dir0.1/N20/feddf_ood_lr1e-5/seed0" in jobs
    assert "cifar10/feddf_lr/id/0.0001" in jobs and len(jobs) == 6
    table = {name: overrides for name, _, overrides in feddle_table.table_jobs(
        ["cifar10"], [0.1], [20], [0], ["feddf_id_lr1e-5"])}
    assert table["cifar10/dir0.1/N20/feddf_id_lr1e-5/seed0"] == jobs["cifar10/dir0.1/N20/feddf_id_lr1e-5/seed0"]


def test_fedcog_gain_is_the_plugged_run_minus_its_base_on_the_same_seed(tmp_path):
    import fedcog_table

    fake_run(tmp_path / "cifar10/niid1/table3/fedavg/seed0", 0.40)
    fake_run(tmp_path / "cifar10/niid1/table3/fedavg_fedcog/seed0", 0.425)
    fake_run(tmp_path / "cifar10/niid1/table3/fedavg/seed1", 0.41)  # its FedCOG arm has not finished
    assert fedcog_table.gain(tmp_path, "cifar10/niid1/table3/fedavg", 0) == "+2.5"
    assert fedcog_table.gain(tmp_path, "cifar10/niid1/table3/fedavg", 1) == "-"


def test_fedcog_table1_gain_pairs_fedcog_with_fedavg_on_the_same_seed(tmp_path):
    import fedcog_table

    fake_run(tmp_path / "cifar10/niid2/fedavg/seed2", 0.30)
    fake_run(tmp_path / "cifar10/niid2/fedcog/seed2", 0.288)
    assert fedcog_table.gain(tmp_path, "cifar10/niid2/fedavg", 2, "cifar10/niid2/fedcog") == "-1.2"
    assert fedcog_table.gain(tmp_path, "cifar10/niid2/fedavg", 0, "cifar10/niid2/fedcog") == "-"
    assert fedcog_table.paper_mean("fedcog", 2) - fedcog_table.paper_mean("fedavg", 2) == pytest.approx(0.47)


def test_a_cell_over_fewer_seeds_than_its_table_says_how_many():
    assert table_runs.mean_std([40.0, 42.0], of=3) == "41.0±1.0 (2 seeds)"
    assert table_runs.mean_std([40.0, 42.0, 44.0], of=3) == "42.0±1.6"
    assert table_runs.mean_std([40.0]) == "40.0 (1 seed)"


def test_fedcog_size_weighting_row_differs_from_fedcogs_only_in_the_kd_weighting():
    import fedcog_table

    from fedjax_lab.experiments import load_config

    configs = {}
    for name, dataset, overrides in fedcog_table.table1_jobs(["cifar10"], ["niid2"], [1], ["fedcog", "fedcog_size"]):
        configs[name.split("/")[2]] = load_config(fedcog_table.REPO / "configs/fedcog/cpu_cifar10.yaml", overrides)
    fixed, size = (configs[m].algorithm.plugins[0] for m in ("fedcog", "fedcog_size"))
    assert (fixed.kd_weighting, size.kd_weighting) == ("fixed", "size")
    assert fixed.model_copy(update={"kd_weighting": "size"}) == size
    assert configs["fedcog"].model_copy(update={"algorithm": None}) == \
        configs["fedcog_size"].model_copy(update={"algorithm": None})
