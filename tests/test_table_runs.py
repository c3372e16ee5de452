"""The reproduction scripts keep every finished run's record in the repository and never run a kept cell
again."""

import gzip
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from fedjax_lab.data.report import save_partition

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import compact_records
import records as record_files
import table_runs
from records import Keep, Record

from fedjax_lab.experiments.run_directory import read_arrays, read_metrics


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
    kept = table_runs.collect(runs, Keep(sizes=True))
    assert kept.path == records / "fedimpro.jsonl.gz"  # one compact file per table
    assert [p.name for p in records.iterdir() if not p.name.startswith(".")] == ["fedimpro.jsonl.gz"]
    assert list(kept.runs) == ["a/fedavg/seed0"]
    record = kept.runs["a/fedavg/seed0"]
    assert (record.config, record.seed, record.sizes) == ({"seed": 0}, 0, [3, 5])
    assert (record.backend, record.devices) == ("unknown", "unknown")  # the summary names none
    assert record.commit == record_files.code_commit()
    assert table_runs.evaluations(kept / "a/fedavg/seed0") == [{"round": 5, "test_accuracy": 0.8}]
    assert table_runs.summary(kept / "a/fedavg/seed0") == {"best_test_accuracy": 0.8}
    assert not table_runs.finished(kept / "a/fedavg/seed1")
    assert table_runs.seeds_on_disk(kept, [7]) == [0]
    assert table_runs.datasets_on_disk(kept, ["b", "a"]) == ["a"]
    assert table_runs.has_runs(kept / "a", "fedavg/*") and not table_runs.has_runs(kept / "a", "fedprox/*")


def test_a_record_keeps_the_evaluated_rows_whole_and_of_the_others_what_its_report_reads(tmp_path):
    run_dir = tmp_path / "run"
    fake_run(run_dir, 0.8)
    rows = [{"round": 0, "test_loss": 2.3, "test_accuracy": 0.1}]
    rows += [{"round": r, "train_loss": 1.0 / r, "server_steps": float(r % 2), **(
        {"test_loss": 1.5, "test_accuracy": 0.5, "diverged": "nan"} if r == 4 else {})} for r in range(1, 5)]
    rows[2]["x"] = float("nan")
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    record = Record.from_run_dir(run_dir, "run", Keep(rounds=("server_steps", "x")))
    assert json.dumps(record.rows) == json.dumps([rows[0], {"round": 1, "server_steps": 1.0}, {
        "round": 2, "server_steps": 0.0, "x": float("nan")}, {"round": 3, "server_steps": 1.0}, rows[4]])
    assert record.evaluations() == [rows[0], rows[4]]
    # rows with no kept metric go
    assert Record.from_run_dir(run_dir, "run", Keep()).rows == [rows[0], rows[4]]
    # read in place: everything
    assert json.dumps(Record.from_run_dir(run_dir, "run").rows) == json.dumps(rows)


def test_configs_are_kept_as_differences_from_the_files_base_and_read_back_exactly(tmp_path):
    base = {"seed": 0, "client": {"learning_rate": 0.1, "batch_size": 32},
            "asynchrony": {"sigma": 5, "cap": 40}, "eval": {"dissimilarity_counterfactual": {}, "every": 5},
            "algorithm": {"plugins": [{"name": "a"}]}}
    other = {"seed": 1, "client": {"learning_rate": 1, "batch_size": 32}, "asynchrony": None,
             "eval": {"dissimilarity_counterfactual": {"algorithm.weight": 0.0}, "every": 5},
             "algorithm": {"plugins": []}, "extra": {"new": True}}
    runs = {name: Record(name=name, config=config, summary={}, rows=[], seed=config["seed"])
            for name, config in (("a/seed0", base), ("a/seed1", other), ("b/seed0", base))}
    path = tmp_path / "family.jsonl.gz"
    record_files.write(path, runs)
    read = record_files.read(path)
    assert {n: r.config for n, r in read.items()} == {n: r.config for n, r in runs.items()}
    assert type(read["a/seed1"].config["client"]["learning_rate"]) is int  # 1, not the base's 0.1 read as 1.0
    header, *lines = [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().splitlines()]
    assert header["base_config"] == base  # the values most runs share, stored once
    assert [line["name"] for line in lines] == ["a/seed0", "a/seed1", "b/seed0"]
    assert lines[0]["config"] == {} and "config_unset" not in lines[0]
    assert lines[1]["config_unset"] == ["asynchrony.cap", "asynchrony.sigma"]
    record_files.write(tmp_path / "again.jsonl.gz", read, header["base_config"])
    # reproducible bytes: no churn in git
    assert (tmp_path / "again.jsonl.gz").read_bytes() == path.read_bytes()


def test_float32_metrics_are_written_short_and_float64_values_exactly_and_read_back_as_they_were(tmp_path):
    single = float(np.float32(0.1))  # a metric: a float32 value, 0.10000000149011612 as a float64
    double = float(np.mean([0.1, 0.2, 0.4]))  # a float64 value that is no float32
    assert float(np.float32(double)) != double
    summary = {"best_test_accuracy": single, "mean": double, "lr": 0.1, "best_round": 3, "none": None,
               "nan": float("nan"), "whole": 2.0, "tiny": float(np.float32(1e-40)), "huge": 1e300,
               "inf": float("inf")}
    rows = [{"round": 3, "test_accuracy": single, "test_loss": double, "diverged": False, "tag": "x",
             "nested": {"values": [single, double, 0.1, -0.0]}}]
    path = tmp_path / "family.jsonl.gz"
    record_files.write(path, {"a": Record(name="a", config={"lr": single}, summary=summary, rows=rows)})
    header, line = [json.loads(x) for x in gzip.decompress(path.read_bytes()).decode().splitlines()]
    assert header["version"] == 2 and line["config"] == {}  # the config is not rounded: the base holds it
    assert header["base_config"] == {"lr": single}
    # float32 values short, float64 values exactly
    assert line["summary"]["best_test_accuracy"] == 0.1 and line["rows"][0]["test_accuracy"] == 0.1
    assert line["summary"]["tiny"] == 1e-40 and line["summary"]["whole"] == 2.0
    assert line["summary"]["mean"] == double and line["rows"][0]["test_loss"] == double
    # float64 values that are a float32's shortest decimal: listed, to be read as they are
    assert line["float64"] == [["summary", "lr"], ["rows", 0, "nested", "values", 2]]
    back = record_files.read(path)["a"]
    assert json.dumps(back.summary) == json.dumps(summary) and json.dumps(back.rows) == json.dumps(rows)
    assert back.summary["best_test_accuracy"] == single and back.summary["lr"] == 0.1
    assert type(back.summary["best_round"]) is int and back.rows[0]["diverged"] is False
    # read back and written again: the same bytes
    record_files.write(tmp_path / "again.jsonl.gz", record_files.read(path))
    assert (tmp_path / "again.jsonl.gz").read_bytes() == path.read_bytes()
    # a version 1 file (every float written exactly) reads as it is
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps({"records": "fedjax_lab runs", "version": 1, "base_config": {}}) + "\n"
                   + json.dumps({"name": "a", "config": {}, "summary": {"lr": 0.1}, "rows": []}) + "\n")
    assert record_files.read(old)["a"].summary == {"lr": 0.1}


def test_arrays_are_kept_exactly():
    arrays = {"selected": np.random.default_rng(0).random((3, 5, 7)) < 0.3,
              "ids": np.arange(15, dtype=np.int32).reshape(3, 5),
              "distance": np.array([[1.5, np.nan]], np.float32)}
    for name, array in arrays.items():
        back = record_files.decode_array(json.loads(json.dumps(record_files.encode_array(array))))
        assert back.dtype == array.dtype and back.shape == array.shape, name
        np.testing.assert_array_equal(back, array)


def test_adding_replaces_a_run_of_the_same_name_and_copies_adding_at_once_all_keep_theirs(tmp_path):
    path = tmp_path / "family.jsonl.gz"
    record_files.add(path, [Record(name="a", config={"seed": 0}, summary={"best_test_accuracy": 0.1},
                                   rows=[])])
    record_files.add(path, [Record(name="a", config={"seed": 0}, summary={"best_test_accuracy": 0.2},
                                   rows=[])])
    threads = [threading.Thread(target=record_files.add, args=(path, [Record(
        name=f"b{k}", config={"seed": k}, summary={}, rows=[])])) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    read = record_files.read(path)
    assert sorted(read) == ["a"] + [f"b{k}" for k in range(8)]
    assert read["a"].summary == {"best_test_accuracy": 0.2} and read["b3"].config == {"seed": 3}


def test_a_record_written_out_reads_as_a_run_directory_for_the_plots(tmp_path, records):
    runs = tmp_path / "async"
    fake_run(runs / "fedbuff/seed0", 0.8)
    counts = np.arange(20, dtype=np.int32).reshape(4, 5)
    np.savez(runs / "fedbuff/seed0/arrays.npz", x=0)  # not an array block: ignored
    (runs / "fedbuff/seed0/arrays").mkdir()
    np.savez(runs / "fedbuff/seed0/arrays/rounds_000001_000004.npz", staleness_counts=counts)
    kept = table_runs.collect(runs, Keep(
        arrays=lambda name, a: {"staleness_counts": a["staleness_counts"].sum(0, keepdims=True)}))
    with table_runs.run_directories([kept / "fedbuff/seed0", runs / "fedbuff/seed0"]) as (written, in_place):
        assert in_place == runs / "fedbuff/seed0"
        assert read_metrics(written) == read_metrics(in_place)
        np.testing.assert_array_equal(read_arrays(written)["staleness_counts"], counts.sum(0, keepdims=True))
        assert json.loads((written / "summary.json").read_text()) == {"best_test_accuracy": 0.8}


def test_old_record_folders_convert_and_merge(tmp_path, records):
    old = tmp_path / "old" / "fedimpro"
    fake_run(old / "a/fedavg/seed0", 0.8)
    fake_run(old / "a/fedavg/seed1", float(np.float32(0.7)))  # a float32 metric, written short
    (old / "a/fedavg/seed0/client_sizes.json").write_text("[3, 5]\n")
    out = records / "fedimpro.jsonl.gz"
    assert compact_records.compact(old, out, Keep()) == 2  # also checks each record against its folder
    assert sorted(record_files.read(out)) == ["a/fedavg/seed0", "a/fedavg/seed1"]
    elsewhere = tmp_path / "gpu" / "fedimpro.jsonl.gz"
    record_files.write(elsewhere, {name: Record(name=name, config={"seed": 9}, summary={}, rows=[])
                                   for name in ("a/fedavg/seed1", "a/fedavg/seed2")})
    assert compact_records.merge(elsewhere, out) == 1  # a run kept here is never replaced by another copy's
    merged = record_files.read(out)
    assert sorted(merged) == ["a/fedavg/seed0", "a/fedavg/seed1", "a/fedavg/seed2"]
    assert merged["a/fedavg/seed1"].seed == 0


def test_a_family_that_reads_less_of_each_evaluated_row_keeps_less(tmp_path, monkeypatch):
    rows = [{"round": 0, "test_accuracy": 0.1, "full_train_loss": 2.0, "test_loss": 2.3},
            {"round": 1, "train_loss": 1.5, "update_norm": 0.2},
            {"round": 2, "test_accuracy": 0.5, "full_train_loss": 1.0, "test_loss": 1.2, "diverged": "nan"}]
    spec = Keep(rounds=("train_loss",), evaluated=("full_train_loss",))
    kept = [{"round": 0, "test_accuracy": 0.1, "full_train_loss": 2.0}, {"round": 1, "train_loss": 1.5},
            {"round": 2, "test_accuracy": 0.5, "full_train_loss": 1.0, "diverged": "nan"}]
    assert spec.rows(rows) == kept and spec.rows(kept) == kept  # keeping again changes nothing
    assert Keep().rows(rows) == [rows[0], rows[2]]  # by default, evaluated rows whole
    path = tmp_path / "bherd.jsonl.gz"
    record_files.write(path, {"a": Record(name="a", config={"seed": 0}, summary={"x": 1}, rows=rows)})
    monkeypatch.setattr(compact_records, "spec_of", lambda family: spec if family == "bherd" else None)
    compact_records.trim(path)
    assert record_files.read(path)["a"].rows == kept and record_files.read(path)["a"].summary == {"x": 1}


def test_records_made_before_the_collapse_check_get_the_runners_verdict(tmp_path):
    from fedjax_lab.experiments.config import validate
    from fedjax_lab.experiments.datasets import build_dataset

    config = validate({**TINY, "seed": 3}).model_dump(mode="json")
    labels = build_dataset(validate(config)).test["y"]
    share = float(np.mean(labels == np.bincount(labels).argmax()))
    shares = np.bincount(labels) / len(labels)
    guess = next(share - j / len(labels) for j in range(1, len(labels))  # near the share but no class's
                 if np.min(np.abs(shares - (share - j / len(labels)))) > 0.5 / len(labels))
    evaluations = {"constant": [0.5, share, share, share], "learning": [0.5, share, 0.9, 0.95],
                   "diverged": [0.5, share, share, share, 0.1], "checked": [share] * 4,
                   "guessing": [0.5, guess, share, guess]}

    def rows(accuracies):
        got = [{"round": 5 * i, "test_accuracy": a} for i, a in enumerate(accuracies)]
        return got[:4] + [{**row, "diverged": True} for row in got[4:]]  # the runner's rows after a NaN

    path = tmp_path / "fedimpro.jsonl.gz"
    made = {name: Record(name=name, config=config, summary={}, rows=rows(accuracies))
            for name, accuracies in evaluations.items()}
    made["checked"].summary.update(collapsed=None, at_chance=None)  # checked by the runner: kept as it is
    made["elsewhere"] = Record(name="elsewhere", summary={}, rows=rows([share] * 4),
                               config={**config, "dataset": {"name": "image_folder", "path": "/nowhere"}})
    record_files.write(path, made)
    assert compact_records.mark_collapsed(path, {}) == (4, 3)
    summaries = {name: r.summary for name, r in record_files.read(path).items()}
    assert summaries["constant"]["collapsed"].endswith("from round 5 to 15: a constant predictor")
    assert summaries["diverged"]["collapsed"].endswith("from round 5 to 15: a constant predictor")
    assert summaries["learning"]["collapsed"] is None and summaries["checked"]["collapsed"] is None
    assert summaries["guessing"]["collapsed"] is None and summaries["guessing"]["at_chance"].endswith(
        "from round 5 to 15: at chance")
    assert summaries["constant"]["at_chance"] and summaries["checked"]["at_chance"] is None
    assert summaries["learning"]["at_chance"] is None
    assert "collapsed" not in summaries["elsewhere"]  # no labels here: left unchecked, not called healthy
    assert compact_records.mark_collapsed(path, {}) == (0, 0)  # nothing left to check
    assert compact_records.pad_label({"dataset": {"name": "shakespeare"}}) == 0  # its tokens' padding
    assert compact_records.pad_label(config) is None


def test_a_kept_cell_is_not_run_again_on_a_fresh_clone(tmp_path, records):
    runs = tmp_path / "fedimpro"
    fake_run(runs / "a/fedavg/seed0", 0.8)
    table_runs.collect(runs)
    fresh = tmp_path / "fresh" / "fedimpro"  # a new checkout: no run folders, the records committed
    # The config is never looked at: a kept cell returns before running.
    assert table_runs.run_once(fresh, "a/fedavg/seed0", config=None) is None
    assert not (fresh / ".claims" / "a__fedavg__seed0").exists()


def test_a_kept_cell_asked_for_as_another_experiment_is_named_not_skipped(tmp_path, records):
    import yaml

    from fedjax_lab.experiments.config import validate

    runs = tmp_path / "fedwalk"
    fake_run(runs / "a/fedavg/seed0", 0.8)
    same = validate({**TINY, "seed": 0})  # the kept run's config
    (runs / "a/fedavg/seed0" / "config.yaml").write_text(yaml.safe_dump(same.model_dump(mode="json")))
    table_runs.collect(runs)
    fresh = tmp_path / "fresh" / "fedwalk"
    layout = same.model_copy(update={"rounds": same.rounds.model_copy(update={"chunk_size": 2}),
                                     "model": same.model.model_copy(update={"lowering": "banded"})})
    assert table_runs.run_once(fresh, "a/fedavg/seed0", layout) is None  # how it runs: the same experiment
    for where in (fresh, runs):  # from the records, and from the run directory
        with pytest.raises(ValueError, match=r"a/fedavg/seed0 .*model.name: 'mlp' ran, 'resnet18' asked"):
            table_runs.run_once(where, "a/fedavg/seed0", same.model_copy(
                update={"model": same.model.model_copy(update={"name": "resnet18"})}))
    with pytest.raises(ValueError, match="seed: 0 ran, 1 asked"):
        table_runs.run_once(fresh, "a/fedavg/seed0", same.model_copy(update={"seed": 1}))
    # A hyper-parameter is part of the experiment too (a tuned server rate over the default's records).
    tuned = same.model_copy(update={"algorithm": same.algorithm.model_copy(
        update={"server_learning_rate": 0.1})})
    with pytest.raises(ValueError, match=r"algorithm.server_learning_rate: 1.0 ran, 0.1 asked"):
        table_runs.run_once(fresh, "a/fedavg/seed0", tuned)
    # So is a section the kept run had off (null) and the asked one sets (asynchronous clients here).
    delayed = validate({**TINY, "seed": 0, "asynchrony": {"delay": "fixed", "rounds": 1}})
    with pytest.raises(ValueError, match=r"asynchrony: null ran, set in the other"):
        table_runs.run_once(fresh, "a/fedavg/seed0", delayed)


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
    # a column whose header holds a target the runs set (BHerd's) is the same column when the target moves
    target = "| method | rounds to acc 86.74% |\n|---|---|\n| FedAvg | 4 |\n"
    assert table_runs.lost_cells(target, target.replace("86.74", "86.77")) == []
    assert table_runs.lost_cells(target, target.replace("86.74", "86.77").replace("| 4 |", "| - |")) == [
        ("", "FedAvg", "rounds to acc #%")]
    seeds = "| run | seed 0 | seed 1 |\n|---|---|---|\n| FedAvg | 83.6 | - |\n"  # columns told apart by order
    assert table_runs.lost_cells(seeds, seeds) == []
    assert table_runs.lost_cells(seeds, seeds.replace("83.6", "-")) == [("", "FedAvg", "seed #")]
    written = table_runs.write_report(out, new)
    assert written == tmp_path / "feddle_tables.new.md" and written.read_text() == new
    assert out.read_text() == OLD_REPORT
    assert "1 filled cells would be lost (Table 5 / FedAvg / ours)" in capsys.readouterr().out


def test_a_report_that_keeps_every_filled_cell_replaces_the_old_one(tmp_path):
    out = tmp_path / "feddle_tables.md"
    out.write_text(OLD_REPORT)
    new = (OLD_REPORT.replace("| - |\n", "| 70.0±1.0 |\n")
           + "\n# New section\n| a | b |\n|---|---|\n| x | - |\n")
    assert table_runs.table_cells(new)["Table 5", "Feddle", "ours#2"] == "70.0±1.0"
    assert table_runs.write_report(out, new) == out and out.read_text() == new


def test_feddle_report_finds_center_under_whichever_column_it_ran(tmp_path):
    import feddle_table

    # Center uses no client: asked for the Dir(0.3)/N(5) column only, it ran there, not under the first
    # column.
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
    assert (table["cifar10/dir0.1/N20/feddf_id_lr1e-5/seed0"]
            == jobs["cifar10/dir0.1/N20/feddf_id_lr1e-5/seed0"])


@pytest.mark.parametrize("read_from", ["run folders", "records"])
def test_fedcog_gain_is_the_plugged_run_minus_its_base_on_the_same_seed(tmp_path, records, read_from):
    import fedcog_table

    runs = tmp_path / "fedcog"
    fake_run(runs / "cifar10/niid1/table3/fedavg/seed0", 0.40)
    fake_run(runs / "cifar10/niid1/table3/fedavg_fedcog/seed0", 0.425)
    fake_run(runs / "cifar10/niid1/table3/fedavg/seed1", 0.41)  # its FedCOG arm has not finished
    if read_from == "records":
        runs = table_runs.collect(runs, fedcog_table.KEEP)
    assert fedcog_table.gain(runs, "cifar10/niid1/table3/fedavg", 0) == "+2.5"
    assert fedcog_table.gain(runs, "cifar10/niid1/table3/fedavg", 1) == "-"
    assert table_runs.has_runs(runs / "cifar10", "*/table3/*/*")


def test_fedcog_table1_gain_pairs_fedcog_with_fedavg_on_the_same_seed(tmp_path):
    import fedcog_table

    fake_run(tmp_path / "cifar10/niid2/fedavg/seed2", 0.30)
    fake_run(tmp_path / "cifar10/niid2/fedcog/seed2", 0.288)
    assert fedcog_table.gain(tmp_path, "cifar10/niid2/fedavg", 2, "cifar10/niid2/fedcog") == "-1.2"
    assert fedcog_table.gain(tmp_path, "cifar10/niid2/fedavg", 0, "cifar10/niid2/fedcog") == "-"
    assert fedcog_table.paper_mean("fedcog", 2) - fedcog_table.paper_mean("fedavg", 2) == pytest.approx(0.47)


def test_a_cell_over_fewer_seeds_than_its_table_says_how_many():
    assert table_runs.mean_std([40.0, 42.0], of=3) == "41.0±1.4 (2 seeds)"
    assert table_runs.mean_std([40.0, 42.0, 44.0], of=3) == "42.0±2.0"
    assert table_runs.mean_std([40.0]) == "40.0 (1 seed)"


def test_a_cell_says_how_many_of_its_runs_failed():
    values = table_runs.SeedValues({0: 40.0, 1: 10.0, 2: 44.0, 3: 10.0},
                                   failed={1: "a constant predictor", 3: "diverged"})
    assert table_runs.mean_std(values) == "26.0±18.5 (1 diverged; 1 a constant predictor)"
    assert table_runs.mean_std(values, of=5) == "26.0±18.5 (4 seeds; 1 diverged; 1 a constant predictor)"
    one = table_runs.SeedValues({2: 44.0}, failed={2: "diverged"})
    assert table_runs.mean_std(one) == "44.0 (1 seed; 1 diverged)"
    assert table_runs.mean_std(table_runs.SeedValues({0: 40.0, 2: 44.0})) == table_runs.mean_std([40.0, 44.0])
    guessed = {"at_chance": "test accuracy 0.0101 is at most 0.0130 ...: at chance"}
    assert table_runs.failure(guessed) == "at chance"
    assert table_runs.failure({**guessed, "collapsed": "...: a constant predictor"}) == "a constant predictor"
    assert table_runs.failure({"collapsed": None, "at_chance": None}) is None
    near = table_runs.SeedValues({0: 1.0, 1: 1.1}, {1: "at chance"})
    assert table_runs.mean_std(near) == "1.1±0.1 (1 at chance)"


@pytest.mark.parametrize("scale, rounds, local_steps, schedule", [("cpu", 30, 50, (20, 128, 50)),
                                                                  ("paper", 70, 400, (50, 256, 100))])
def test_fedcog_size_weighting_row_differs_from_fedcogs_only_in_the_kd_weighting(scale, rounds, local_steps,
                                                                                  schedule):
    import fedcog_table

    from fedjax_lab.experiments import load_config

    configs = {}
    for name, dataset, overrides in fedcog_table.table1_jobs(["cifar10"], ["niid2"], [1],
                                                             ["fedcog", "fedcog_size"],
                                                             fedcog_table.SCALES[scale]):
        configs[name.split("/")[2]] = load_config(fedcog_table.REPO / f"configs/fedcog/{scale}_cifar10.yaml",
                                                  overrides)
    fixed, size = (configs[m].algorithm.plugins[0] for m in ("fedcog", "fedcog_size"))
    assert (fixed.kd_weighting, size.kd_weighting) == ("fixed", "size")
    assert (fixed.start_round, fixed.num_samples, fixed.steps) == schedule
    plain = configs["fedcog"]
    assert (plain.rounds.num_rounds, plain.client.local_steps) == (rounds, local_steps)
    assert fixed.model_copy(update={"kd_weighting": "size"}) == size
    assert configs["fedcog"].model_copy(update={"algorithm": None}) == \
        configs["fedcog_size"].model_copy(update={"algorithm": None})


def test_feddles_paper_scale_runs_every_method_with_the_papers_client_work():
    import feddle_table

    from fedjax_lab.experiments import load_config

    paper, cpu = feddle_table.SCALES["paper"], feddle_table.SCALES["cpu"]
    jobs = feddle_table.table_jobs(["cifar10"], [0.3], [5], [1], feddle_table.METHODS)
    for name, config, overrides in jobs:
        at_paper = load_config(config, [*paper.overrides, *overrides])
        at_cpu = load_config(config, [*cpu.overrides, *overrides])
        for at, work in ((at_paper, (2, None, 200)), (at_cpu, (None, 5, 100))):
            assert (at.client.local_epochs, at.client.local_steps, at.rounds.num_rounds) == work, name
        # nothing else differs: the method, the federation and the delays are the CPU table's
        assert at_paper.model_copy(update={"client": at_cpu.client, "rounds": at_cpu.rounds}) == at_cpu, name
        assert (at_paper.dataset.partition.alpha, at_paper.seed) == (0.3, 1)


def test_feddles_paper_scale_runs_the_tuned_server_rates_and_its_grid_each_value_in_its_own_folder():
    import feddle_table

    from fedjax_lab.experiments import load_config

    paper = feddle_table.SCALES["paper"]
    methods = ["fedavg", "fedbuff", "ca2fl", "fedasync", "feddle_id"]
    configs = {name.split("/")[3]: load_config(config, [*paper.overrides, *overrides])
               for name, config, overrides in feddle_table.table_jobs(["cifar10"], [0.1], [20], [0], methods,
                                                                      paper.tuned)}
    assert configs["fedavg"].algorithm.server_learning_rate == 1.0  # the paper's FedAvg: the full step
    assert configs["fedbuff"].algorithm.server_learning_rate == 0.1
    assert configs["ca2fl"].algorithm.server_learning_rate == 0.1
    assert configs["feddle_id"].algorithm.fallback_learning_rate == 0.1
    assert (configs["fedasync"].algorithm.alpha, configs["fedasync"].algorithm.a) == (0.8, 0.9)
    assert not feddle_table.SCALES["cpu"].tuned  # the CPU table keeps the defaults
    grid = list(feddle_table.tuning_jobs())
    assert len(grid) == 7 + 9
    for folder, name, config, overrides in grid:
        method = name.split("/")[3]
        at = load_config(config, [*paper.overrides, *overrides])
        if method == "fedasync":  # alpha by a
            assert folder == f"feddle_paper_fedasync_alpha{at.algorithm.alpha}_a{at.algorithm.a}"
            continue
        value = float(overrides[-1].split("=")[1])
        assert folder.endswith(str(value)) and name == f"cifar10/dir0.1/N20/{method}/seed0"
        assert value == (at.algorithm.fallback_learning_rate if method == "feddle_id"
                         else at.algorithm.server_learning_rate)
    fedasync = {tuple(float(o.split("=")[1]) for o in overrides[-2:])
                for _, name, _, overrides in grid if "fedasync" in name}
    assert fedasync == {(alpha, a) for alpha in (0.2, 0.4, 0.8) for a in (0.1, 0.5, 0.9)}  # App. D's grid
    # every tuned setting is one of the grid's values
    tuned = {(m, s.split("=")[0], float(s.split("=")[1])) for m, ss in paper.tuned.items() for s in ss}
    points = {(g.method, k, v) for g in feddle_table.TUNING for p in g.points for k, v in zip(g.settings, p)}
    assert points >= {t for t in tuned if t[0] != "feddle_ood"}


def test_fedimpros_paper_scale_runs_resnet18_split_after_layer2_for_300_rounds():
    import fedimpro_table

    from fedjax_lab.experiments import load_config

    scale = fedimpro_table.SCALES["paper"]
    for name, dataset, overrides in fedimpro_table.jobs(["cifar10"], ["a0.1_E1_M10"], [2],
                                                        fedimpro_table.METHODS):
        config = load_config(fedimpro_table.REPO / f"configs/fedimpro/paper_{dataset}.yaml",
                             [*scale.before, *overrides, *scale.after])
        assert (config.model.name, config.rounds.num_rounds, config.eval.split, config.seed) == (
            "resnet18", 300, "layer2", 2), name
        if name.split("/")[2] == "fedimpro":
            assert (config.algorithm.split, config.algorithm.ramp_rounds) == ("layer2", 150)


def test_bherds_full_mnist_cnn_runs_the_papers_federation_and_local_work_for_150_rounds():
    import bherd_table

    from fedjax_lab.experiments import load_config

    names = []
    for name, config, overrides in bherd_table.jobs("cnn_full", [0], ["fedavg", "bherd"]):
        c = load_config(bherd_table.CONFIGS / config, overrides)
        assert (c.model.name, c.dataset.subset, c.client.batch_size, c.client.local_epochs,
                c.rounds.num_rounds) == ("bherd_cnn", None, 100, 1, 150), name
        names.append(name)
    assert names == [f"cnn_full/case{k}/{m}/seed0" for k in (1, 2, 3) for m in ("fedavg", "bherd")]
    case3 = [name for name, *_ in bherd_table.jobs("cnn_full", [0, 1], ["fedavg"], cases=[3])]
    assert case3 == ["cnn_full/case3/fedavg/seed0", "cnn_full/case3/fedavg/seed1"]
    assert [name for name, *_ in bherd_table.jobs("cnn10", [0], ["fedavg"], cases=[1])] == []  # case 3 only


def test_fedwalks_pretrained_table_pairs_arms_that_pretrain_alike_and_differ_in_the_leash_only():
    import fedwalk_table

    from fedjax_lab.experiments import load_config

    jobs = fedwalk_table.table_pretrained_jobs([1], ["fedprox"])
    configs = {name.split("/")[2]: load_config(fedwalk_table.CONFIGS / file, [*extra, "model.name=resnet8"])
               for name, file, extra in jobs if name.startswith("table_pt/dir0.1/")}
    base, walk = (configs[m].algorithm for m in ("fedprox", "fedprox+fedwalk"))
    assert (base.plugins[0].mode, walk.plugins[0].mode) == ("pretrain", "leash")
    assert base.plugins[0].pretrain_steps == walk.plugins[0].pretrain_steps == fedwalk_table.PRETRAINED_STEPS
    assert base.model_copy(update={"plugins": walk.plugins}) == walk  # FedProx's mu and weighting in both
    for config in configs.values():
        assert (config.rounds.num_rounds, config.model.name, config.seed) == (300, "resnet8", 1)
        assert config.client.schedule.boundaries == (100,)


TINY = {"seed": 1, "dataset": {"name": "gaussian_mixture", "num_clients": 6, "examples_per_client": 12,
                               "dimension": 4, "num_classes": 3, "label_alpha": 0.3},
        "model": {"name": "mlp", "hidden": [8]}, "algorithm": {"name": "fedavg"},
        "client": {"local_steps": 3, "batch_size": 4, "learning_rate": 0.1},
        "rounds": {"num_rounds": 4, "clients_per_round": 6, "layout": "rules"},
        "eval": {"every": 1, "per_client": False}, "checkpoint": {"every_blocks": 1, "keep": 9}}
"""A four-round run of seconds, checkpointed after every round."""


def tiny_fedcog(weighting, start=2):
    from fedjax_lab.experiments.config import validate

    return validate({**TINY, "algorithm": {"name": "fedavg", "plugins": [
        {"name": "fedcog", "start_round": start, "num_samples": 8, "steps": 3, "batch_size": 4,
         "kd_weighting": weighting, "lambda_kd": 1.0}]}})


def test_arms_forked_from_a_fedcog_run_at_its_start_round_equal_the_arms_run_from_round_0(tmp_path, records):
    """FedAvg and FedCOG's size weighting, started from a fixed-weight FedCOG run's checkpoint at the start
    round, end where they end run from round 0, and their records say where they started."""
    from fedjax_lab.experiments.config import validate

    raw, fedcog = TINY, tiny_fedcog

    runs, alone = tmp_path / "runs", tmp_path / "alone"
    table_runs.run_once(runs, "fedcog", fedcog("fixed"))
    for name, config in (("fedavg", validate(raw)), ("fedcog_size", fedcog("size"))):
        forked, _ = table_runs.run_once(runs, name, config, fork_from=(["fedcog"], 2))
        whole, _ = table_runs.run_once(alone, name, config)
        assert forked["forked_from"] == {"run": "fedcog", "round": 2} and "forked_from" not in whole
        assert forked["final"] == whole["final"]
        assert read_metrics(runs / name) == read_metrics(alone / name)
        assert table_runs.summary(table_runs.collect(runs) / name)["forked_from"]["run"] == "fedcog"
    # the arms differ after the start round
    last = [read_metrics(runs / name)[-1]["test_loss"] for name in ("fedavg", "fedcog", "fedcog_size")]
    assert len(set(last)) == 3
    with pytest.raises(ValueError, match="must start at round 3 or later"):
        table_runs.fork(runs / "fedcog", 3, tmp_path / "x", fedcog("size"))
    with pytest.raises(ValueError, match="differ in more than plug-ins"):
        table_runs.fork(runs / "fedcog", 2, tmp_path / "x", fedcog("size").model_copy(update={"seed": 2}))
    with pytest.raises(ValueError, match="has state the source's lacks"):
        table_runs.fork(runs / "fedavg", 2, tmp_path / "x", fedcog("size"))


def dead_process_id() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_run_a_killed_copy_left_resumes_from_its_checkpoint_and_ends_where_a_whole_run_ends(
        tmp_path, records, capsys):
    """A copy killed outright leaves its claim and an unfinished run: the next copy takes the claim over, its
    process having gone, and resumes the run instead of starting it again."""
    from fedjax_lab.experiments import run_experiment
    from fedjax_lab.experiments.config import validate

    config, runs = validate(TINY), tmp_path / "runs"
    run_experiment(config, runs / "a", stop_after_round=2, progress=False)
    (runs / ".claims").mkdir(parents=True)
    gone = dead_process_id()
    (runs / ".claims" / "a").write_text(f"{socket.gethostname()} {gone}\n")
    resumed, _ = table_runs.run_once(runs, "a", config)
    out = capsys.readouterr().out
    assert f"taking over the claim of process {gone}" in out and "resuming the unfinished run" in out
    assert not (runs / ".claims" / "a").exists()
    whole, _ = table_runs.run_once(tmp_path / "alone", "a", config)
    assert [r["round"] for r in resumed["resumed"]] == [2] and "resumed" not in whole
    assert resumed["final"] == whole["final"]
    assert read_metrics(runs / "a") == read_metrics(tmp_path / "alone" / "a")
    assert table_runs.summary(table_runs.collect(runs) / "a")["resumed"][0]["round"] == 2


def test_an_interrupted_fork_resumes_as_a_fork(tmp_path, records, monkeypatch):
    """A forked arm stopped after a round of its own resumes from there, still named as forked, and ends where
    the arm run from round 0 ends."""
    runs = tmp_path / "runs"
    table_runs.run_once(runs, "fedcog", tiny_fedcog("fixed"))
    real = table_runs.run_experiment

    def killed_after_round_3(*args, **kwargs):
        real(*args, **kwargs, stop_after_round=3)
        raise KeyboardInterrupt

    monkeypatch.setattr(table_runs, "run_experiment", killed_after_round_3)
    with pytest.raises(KeyboardInterrupt):
        table_runs.run_once(runs, "fedcog_size", tiny_fedcog("size"), fork_from=(["fedcog"], 2))
    assert not (runs / ".claims" / "fedcog_size").exists()  # released when its run fails
    monkeypatch.setattr(table_runs, "run_experiment", real)
    forked, _ = table_runs.run_once(runs, "fedcog_size", tiny_fedcog("size"), fork_from=(["fedcog"], 2))
    whole, _ = table_runs.run_once(tmp_path / "alone", "fedcog_size", tiny_fedcog("size"))
    assert forked["forked_from"] == {"run": "fedcog", "round": 2}
    assert [r["round"] for r in forked["resumed"]] == [3]
    assert forked["final"] == whole["final"]


def test_a_claim_of_a_live_copy_or_of_one_that_cannot_be_checked_is_left_and_named(tmp_path, records, capsys):
    runs = tmp_path / "runs"
    (runs / ".claims").mkdir(parents=True)
    (runs / ".claims" / "a").write_text(f"{socket.gethostname()} {os.getpid()}\n")
    (runs / ".claims" / "b").write_text(f"another-host {dead_process_id()}\n")
    assert table_runs.run_once(runs, "a", config=None) is None
    assert table_runs.run_once(runs, "b", config=None) is None
    out = capsys.readouterr().out
    assert f"a: skipped, claimed by process {os.getpid()}" in out
    assert "b: skipped, claimed by another-host" in out and "remove it if no copy runs this cell" in out
    assert (runs / ".claims" / "a").exists() and (runs / ".claims" / "b").exists()


def test_a_copy_stopped_by_a_signal_ends_with_a_line_and_128_plus_it_and_the_same_command_resumes_the_run(
        tmp_path, records, monkeypatch, capsys):
    """``run_script``: a signal's stop (the runner's ``RunInterrupted``, after its checkpoint) is one line on
    stderr and exit status 143 for SIGTERM, not a traceback; the claim is released, and running the script
    again resumes the run and keeps its record."""
    import signal

    from fedjax_lab.experiments import run_experiment
    from fedjax_lab.experiments.config import validate
    from fedjax_lab.experiments.signals import RunInterrupted

    config, runs = validate(TINY), tmp_path / "runs"

    def stopped_after_round_2(config, run_dir, **kwargs):
        run_experiment(config, run_dir, **kwargs, stop_after_round=2)
        raise RunInterrupted(run_dir, 2, signal.SIGTERM)

    def script():
        table_runs.run_once(runs, "a/seed0", config)

    monkeypatch.setattr(table_runs, "run_experiment", stopped_after_round_2)
    assert table_runs.run_script(script) == 128 + signal.SIGTERM
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"SIGTERM stopped the run in {runs / 'a/seed0'} after round 2; the same command resumes it" in err
    assert not (runs / ".claims" / "a__seed0").exists() and not (runs / "a/seed0/summary.json").exists()
    monkeypatch.setattr(table_runs, "run_experiment", run_experiment)
    assert table_runs.run_script(script) == 0
    kept = table_runs.collect(runs) / "a/seed0"
    assert [r["round"] for r in table_runs.summary(kept)["resumed"]] == [2]
    with pytest.raises(ValueError, match="not a stop"):  # anything else still fails loudly
        table_runs.run_script(lambda: (_ for _ in ()).throw(ValueError("not a stop")))
