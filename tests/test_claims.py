"""The reproduction reports judge each paper claim by the paired difference over seeds (``table_runs.judge``):
pairs by seed, only seeds both arms ran, and "unresolved (n seeds)" below ``table_runs.MIN_SEEDS`` pairs."""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import reproductions
import table_runs
from table_runs import Claim, claims_table, judge


def test_a_claim_is_judged_over_the_seeds_both_arms_ran():
    # differences 1, 2, 3 on seeds 0-2: mean 2, sample std 1, half-width t_{0.975, 2} / sqrt(3) = 2.48
    claim = Claim("A beats B", 1.0, {0: 10.0, 1: 12.0, 2: 14.0, 3: 50.0}, {0: 9.0, 1: 10.0, 2: 11.0})
    ours, seeds, verdict = judge(claim)
    assert (ours, seeds, verdict) == ("+2.0 [-0.5, +4.5]", [0, 1, 2], "unresolved")
    # the interval is below 5
    assert judge(Claim("A beats B", 5.0, claim.method, claim.base))[2] == "not held"
    assert judge(Claim("A beats B", 5.0, {0: 2.0, 1: 2.1, 2: 1.9}, {0: 0.0, 1: 0.0, 2: 0.0}))[2] == "held"


def test_fewer_than_two_pairs_leave_a_claim_unresolved():
    assert judge(Claim("A beats B", 1.0, {0: 3.0, 1: 4.0}, {1: 2.5})) == ("+1.5 (one seed)", [1],
                                                                          "unresolved (1 seed)")
    assert judge(Claim("A beats B", 1.0, {0: 3.0}, {1: 2.5})) == ("-", [], "unresolved (0 seeds)")


def test_two_seeds_give_an_interval_but_no_verdict():
    # differences 0.74 and 0.68: an interval wholly above 0 that three seeds would call held
    claim = Claim("A beats B", 0.49, {0: 53.12, 1: 53.18}, {0: 52.38, 1: 52.50})
    assert judge(claim) == ("+0.7 [+0.3, +1.1]", [0, 1], "unresolved (2 seeds)")
    assert judge(Claim("A beats B", 0.49, {**claim.method, 2: 53.0}, {**claim.base, 2: 52.3}))[2] == "held"


def test_the_claims_table_has_a_row_per_claim_and_lists_the_unpaired_below():
    lines = claims_table([Claim("A beats B, NIID-1", 4.27, {0: 71.0, 1: 69.2, 2: 74.9},
                                {0: 69.7, 1: 68.3, 2: 73.5}),
                          Claim("A beats C, NIID-1", 1.5, {0: 71.0}, {}, digits=1,
                                paper_note="(CIFAR-10's)")])
    assert lines[:2] == table_runs.CLAIMS_HEADER
    assert lines[2] == "| A beats B, NIID-1 | +4.27 | +1.2 [+0.5, +1.9] | 0, 1, 2 | held |"
    assert lines[3:] == ["", "Unresolved (0 seeds), no paired records: A beats C, NIID-1."]
    assert claims_table([]) == []


def test_the_reports_cells_use_the_sample_standard_deviation():
    assert table_runs.mean_std([40.0, 42.0, 44.0], of=3, ddof=1) == "42.0±2.0"
    # the sample standard deviation, ddof 1
    assert table_runs.mean_std([40.0, 42.0, 44.0], of=3) == "42.0±2.0"
    import fedcog_table
    import feddle_table
    import fedimpro_table

    for module in (fedcog_table, feddle_table, fedimpro_table):
        assert module.cell([40.0, 42.0], of=3) == "41.0±1.4 (2 seeds)"
    assert fedimpro_table.cell([40.0, 42.0, 44.0]) == "42.0±2.0"


def fake_run(run_dir: Path, accuracy: float) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text(json.dumps({"round": 30, "test_accuracy": accuracy}) + "\n")
    (run_dir / "summary.json").write_text(json.dumps({"best_test_accuracy": accuracy}))
    (run_dir / "config.yaml").write_text("seed: 0\n")


def test_fedcogs_claims_pair_fedcog_with_fedavg_by_seed(tmp_path):
    import fedcog_table

    runs = tmp_path / "fedcog"
    for seed, (fedavg, fedcog) in enumerate([(0.697, 0.710), (0.683, 0.692), (0.735, 0.749)]):
        fake_run(runs / f"fashion_mnist/niid1/fedavg/seed{seed}", fedavg)
        fake_run(runs / f"fashion_mnist/niid1/fedcog/seed{seed}", fedcog)
    fake_run(runs / "fashion_mnist/niid1/moon/seed1", 0.70)  # one pair only
    out = tmp_path / "fedcog_claims.md"
    fedcog_table.claims(runs, tmp_path / "none", ["fashion_mnist"], [0, 1, 2], out)
    text = out.read_text()
    assert ("| FedCOG beats FedAvg, Fashion-MNIST NIID-1 | +4.27 | +1.2 [+0.5, +1.9] | 0, 1, 2 | held |"
            in text)
    assert ("| FedCOG beats MOON, Fashion-MNIST NIID-1 | +4.13 | -0.8 (one seed) | 1 | unresolved (1 seed) |"
            in text)
    assert "FedCOG beats FedAvg, Fashion-MNIST NIID-2" in text.split("## Table 1 with")[0]  # no runs: listed
    assert "Table 3" not in text  # no Table 3 runs


@pytest.mark.parametrize("module", ["feddle_table", "fedimpro_table"])
def test_the_claims_pages_of_feddle_and_fedimpro_are_written_from_no_runs(tmp_path, module):
    import importlib

    script = importlib.import_module(module)
    out = tmp_path / "claims.md"
    script.claims(tmp_path, [], [0, 1, 2], out)
    assert out.read_text().startswith("# Fed")


def test_a_claim_of_direction_only_is_held_or_not_by_the_side_of_zero_its_interval_lies_on():
    # BHerd's paper prints no number: "faster" is held above 0, not held below 0, unresolved across it.
    above = Claim("A below B", 0.0, {0: 0.3, 1: 0.31, 2: 0.29}, {0: 0.0, 1: 0.0, 2: 0.0}, direction_only=True,
                  our_digits=2)
    assert judge(above) == ("+0.30 [+0.28, +0.32]", [0, 1, 2], "held")
    below = Claim("A below B", 0.0, {0: -0.3, 1: -0.31, 2: -0.29}, {0: 0.0, 1: 0.0, 2: 0.0},
                  direction_only=True)
    assert judge(below)[2] == "not held"
    across = Claim("A below B", 0.0, {0: -0.3, 1: 0.31, 2: 0.0}, {0: 0.0, 1: 0.0, 2: 0.0},
                   direction_only=True)
    assert judge(across)[2] == "unresolved"
    lines = claims_table([above], unit="objective")
    assert lines[0].startswith("| claim | paper's gain (objective) | ours: mean paired difference [95 % "
                               "interval] (objective) |")
    assert lines[2] == "| A below B | a gain, no number | +0.30 [+0.28, +0.32] | 0, 1, 2 | held |"


def test_a_claims_table_names_the_paired_runs_that_failed(tmp_path):
    from table_runs import SeedValues, evaluations, seed_values

    for seed, summary in enumerate([{}, {"diverged": "train_loss is nan at round 6"},
                                    {"collapsed": "test accuracy 0.1000 is ...: a constant predictor"}]):
        run = tmp_path / f"base/seed{seed}"
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps({"best_test_accuracy": 0.5, **summary}))
        (run / "metrics.jsonl").write_text('{"round": 5, "test_accuracy": 0.5}\n')
    base = seed_values(tmp_path, "base", [0, 1, 2, 3],  # seed 3 has not run
                       lambda run: 100 * rows[-1]["test_accuracy"] if (rows := evaluations(run)) else None)
    assert base == {0: 50.0, 1: 50.0, 2: 50.0} and base.failed == {1: "diverged", 2: "a constant predictor"}
    method = SeedValues({0: 52.0, 1: 53.0, 2: 54.0, 3: 55.0}, {3: "diverged"})  # seed 3 pairs nothing
    lines = claims_table([Claim("A beats B", 1.0, method, base), Claim("A beats C", 1.0, method, {0: 1.0})])
    assert lines[-1] == (
        "Failed runs among those paired (the run's summary: `diverged`, the runner stopped it and its values "
        "are from before; `collapsed`, a constant predictor; `at_chance`, no better than guessing): "
        "A beats B: the base diverged in seed 1 and was a constant predictor in seed 2.")
    assert not any(line.startswith("Failed") for line in claims_table([Claim("A", 1.0, {0: 1.0}, {0: 0.0})]))


def fake_curve(run_dir: Path, rows: list[dict]) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "summary.json").write_text(json.dumps(
        {"best_test_accuracy": max(r["test_accuracy"] for r in rows), "final": rows[-1]}))
    (run_dir / "config.yaml").write_text("seed: 0\n")


def test_bherds_claims_pair_the_early_training_objective_and_the_final_accuracy(tmp_path):
    import bherd_table

    # FedAvg minus BHerd: 0.05, 0.06, 0.03
    losses = {"fedavg": (0.40, 0.42, 0.41), "bherd": (0.35, 0.36, 0.38)}
    # BHerd minus FedAvg: -1, +2, 0 points
    accuracy = {"fedavg": (0.80, 0.81, 0.82), "bherd": (0.79, 0.83, 0.82)}
    for method in losses:
        for seed in range(3):
            fake_curve(tmp_path / f"svm/case3/{method}/seed{seed}",
                       [{"round": 0, "test_accuracy": 0.1, "full_train_loss": 1.0},
                        {"round": 10, "test_accuracy": 0.5, "full_train_loss": losses[method][seed]},
                        {"round": 500, "test_accuracy": accuracy[method][seed], "full_train_loss": 0.3}])
    text = bherd_table.claims(tmp_path, [0, 1, 2], tmp_path / "bherd_claims.md").read_text()
    # mean 0.0467, sample std 0.0153, half-width t_{0.975, 2} 0.0153 / sqrt(3) = 0.0379
    assert ("| BHerd-FedAvg (alpha 0.5) lower than FedAvg (RR) over rounds 1-10, case 3 | a gain, no number "
            "| +0.0467 [+0.0087, +0.0846] | 0, 1, 2 | held |") in text
    # mean 0.33, sample std 1.53, half-width 3.79
    assert ("| BHerd-FedAvg (alpha 0.5) ends above FedAvg (RR), case 3 | a gain, no number | +0.33 [-3.46, "
            "+4.13] | 0, 1, 2 | unresolved |") in text
    assert "case 1 |" not in text  # no runs of case 1: listed below the tables as unpaired
    summary = bherd_table.decisive(tmp_path)
    assert [judge(c)[2] for c in summary.claims if c.method] == ["held"]
    # seeds beyond TABLE_SEEDS (where a claim stays unresolved) join the claims: by default, every seed run
    for method, loss in (("fedavg", 0.41), ("bherd", 0.37)):
        for seed in (3, 4):
            fake_curve(tmp_path / f"svm/case3/{method}/seed{seed}",
                       [{"round": 0, "test_accuracy": 0.1, "full_train_loss": 1.0},
                        {"round": 10, "test_accuracy": 0.5, "full_train_loss": loss},
                        {"round": 500, "test_accuracy": 0.8, "full_train_loss": 0.3}])
    assert bherd_table.report_seeds(tmp_path) == [0, 1, 2, 3, 4]
    for seeds, paired in ((None, [0, 1, 2, 3, 4]), ([0, 1, 2], [0, 1, 2])):
        case3 = [c for c in bherd_table.decisive(tmp_path, seeds).claims if c.method]
        assert [judge(c)[1] for c in case3] == [paired]


def test_fedwalks_and_bherds_tables_say_how_many_of_a_rows_runs_failed(tmp_path):
    """FedWalk's accuracy cells and BHerd's seeds column count the failed runs as the other tables do
    (``table_runs.failure_counts``), and read as before where none failed."""
    import bherd_table
    import fedwalk_table

    trained = {"final": {"test_accuracy": 0.40}, "best_test_accuracy": 0.44}
    diverged = {"final": {"test_accuracy": 0.10}, "best_test_accuracy": 0.20, "diverged": "NaN at round 3"}
    assert fedwalk_table.mean_std([trained, {**trained, "final": {"test_accuracy": 0.42}}]) == "41.0 ± 1.4"
    assert fedwalk_table.mean_std([trained, diverged], best=True) == "32.0 ± 17.0 (1 diverged)"
    assert fedwalk_table.mean_std([diverged]) == "10.0 (1 diverged)"
    assert fedwalk_table.mean_std([]) == "–"
    assert table_runs.failure_counts(["at chance", None, "diverged", "at chance"]) == ["1 diverged",
                                                                                         "2 at chance"]
    rows = [{"round": 0, "test_accuracy": 0.1, "full_train_loss": 2.0},
            {"round": 10, "test_accuracy": 0.6, "full_train_loss": 0.5}]
    for seed in (0, 1):
        fake_curve(tmp_path / f"cnn_full/case3/fedavg/seed{seed}", rows)
    assert bherd_table.seeds_cell(tmp_path, "cnn_full/case3/fedavg", [0, 1]) == "2"
    summary = tmp_path / "cnn_full/case3/fedavg/seed1/summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "collapsed": "one class"}))
    assert bherd_table.seeds_cell(tmp_path, "cnn_full/case3/fedavg", [0, 1]) == "2 (1 a constant predictor)"
    table = bherd_table.case_table(tmp_path, "cnn_full", 3, [0, 1], ["fedavg"], (10,))
    assert table[-1].endswith("| 2 (1 a constant predictor) |")


def test_bherds_case_figure_draws_only_the_cases_with_runs_and_one_legend_for_all(tmp_path):
    """A part that ran some of its cases (the full-MNIST CNN: case 3) gets a column per case that ran, no
    empty ones, and a legend built without matplotlib's warning for the first column's missing lines."""
    import warnings

    import bherd_table
    import matplotlib.image

    rows = [{"round": 0, "test_accuracy": 0.1, "full_train_loss": 2.0},
            {"round": 10, "test_accuracy": 0.6, "full_train_loss": 0.5}]
    fake_curve(tmp_path / "cnn_full/case3/fedavg/seed0", rows)
    fake_curve(tmp_path / "cnn_full/case2/bherd/seed0", rows)
    out = tmp_path / "cases.png"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert bherd_table.plot_cases(tmp_path, "cnn_full", (1, 2, 3), [0], ["fedavg", "bherd"], out)
    assert matplotlib.image.imread(out).shape[1] == round(2 * 4.6 * 100)  # two columns at dpi 100
    assert not bherd_table.plot_cases(tmp_path, "cnn_full", (1, 2), [0], ["fedavg"], out)


def test_bherds_decisive_cnn_moves_to_all_of_mnist_only_in_a_case_whose_seeds_have_all_finished(tmp_path):
    import bherd_table

    def curve(name, loss):
        fake_curve(tmp_path / name, [{"round": 0, "test_accuracy": 0.1, "full_train_loss": 1.0},
                                     {"round": 50, "test_accuracy": 0.9, "full_train_loss": loss}])

    for seed in range(3):
        curve(f"cnn10/case3/fedavg/seed{seed}", 0.5)
        curve(f"cnn10/case3/bherd/seed{seed}", 0.4)
    curve("cnn_full/case3/fedavg/seed0", 0.3)
    curve("cnn_full/case3/bherd/seed0", 0.2)
    curve("cnn_full/case1/fedavg/seed0", 0.3)
    assert bherd_table.decisive_cnn(tmp_path, [0, 1, 2]) == ("cnn10", (3,))  # one seed of three
    assert "6,000 of the 60,000 rows" in bherd_table.decisive(tmp_path).ours
    for seed in (1, 2):
        curve(f"cnn_full/case3/fedavg/seed{seed}", 0.3)
        curve(f"cnn_full/case3/bherd/seed{seed}", 0.2)
    assert bherd_table.decisive_cnn(tmp_path, [0, 1, 2]) == ("cnn_full", (3,))  # case 1 lacks BHerd
    summary = bherd_table.decisive(tmp_path)
    assert "all 60,000 rows at B = 100 for 150 of its 500 rounds, case 3 (30 %" in summary.ours
    assert [c.text for c in summary.claims] == [
        "CNN: BHerd-FedAvg (alpha 0.5) lower than FedAvg (RR) over rounds 1-50, case 3"]


def test_bherds_figure_is_written_only_when_one_of_its_methods_ran(tmp_path):
    import bherd_table

    fake_curve(tmp_path / "cnn10/case3/fedavg/seed0",
               [{"round": 0, "test_accuracy": 0.1, "full_train_loss": 1.0},
                {"round": 5, "test_accuracy": 0.5, "full_train_loss": 0.4}])
    drawn, empty = tmp_path / "drawn.png", tmp_path / "empty.png"
    assert bherd_table.plot_cases(tmp_path, "cnn10", (3,), [0], ["fedavg", "bherd"], drawn)
    assert drawn.is_file()
    assert not bherd_table.plot_cases(tmp_path, "cnn10", (3,), [0], ["scaffold", "fednova"], empty)
    assert not empty.exists()


def test_feddles_note_names_only_what_ran_before_the_records_and_has_not_rerun(tmp_path):
    import feddle_table

    rows = [{"round": 0, "test_accuracy": 0.1}, {"round": 10, "test_accuracy": 0.5}]
    cpu, paper = feddle_table.SCALES["cpu"], feddle_table.SCALES["paper"]
    assert "Dir(0.1)/N(20) column; " in feddle_table.pre_records_note(tmp_path, "fashion_mnist", cpu)[0]
    fake_curve(tmp_path / "fashion_mnist/dir0.1/N20/center/seed0", rows)  # Center alone reruns nothing
    assert "Dir(0.1)/N(20) column; " in feddle_table.pre_records_note(tmp_path, "fashion_mnist", cpu)[0]
    fake_curve(tmp_path / "fashion_mnist/dir0.1/N20/fedavg/seed0", rows)
    fake_curve(tmp_path / "fashion_mnist/ablation/id/step0", rows)
    note = feddle_table.pre_records_note(tmp_path, "fashion_mnist", cpu)[0]
    assert "Dir(0.1)/N(20)" not in note and "ablation" not in note
    assert "Table 5's Dir(0.1)/N(5) column; " in note and "`--part lambda`." in note
    assert feddle_table.pre_records_note(tmp_path, "fashion_mnist", paper) == []
    assert feddle_table.pre_records_note(tmp_path, "cifar10", cpu) == []


def test_feddfs_tuned_rows_take_fedbuffs_tuned_server_rate_at_the_papers_scale_only():
    import feddle_table

    from fedjax_lab.experiments.config import load_config

    cpu, paper = feddle_table.SCALES["cpu"], feddle_table.SCALES["paper"]

    def config(method):
        (_, path, overrides), = feddle_table.table_jobs(["cifar10"], [0.1], [20], [0], [method], paper.tuned)
        return load_config(path, [*paper.overrides, *overrides]).algorithm

    tuned, fedbuff = config("feddf_id_tuned"), config("fedbuff")
    assert (tuned.name, tuned.learning_rate) == ("feddf", 1e-5)
    assert tuned.server_learning_rate == fedbuff.server_learning_rate == 0.1
    assert config("feddf_id_lr1e-5").server_learning_rate == 1.0
    shown = [feddle_table.shown(m, s) for m in ("feddf_id_tuned", "feddf_id_lr1e-5") for s in (cpu, paper)]
    assert shown == [False, True, True, True]
    with pytest.raises(SystemExit):  # named at CPU scale: an error, before any run
        feddle_table.main(["--datasets", "cifar10", "--methods", "fedavg", "feddf_id_tuned"])


def test_fedimpros_summary_claims_come_from_resnet18_else_resnet8_near_the_papers_scale(tmp_path):
    import fedimpro_table

    cpu, resnet18, resnet8 = (tmp_path / name for name in ("cpu", "resnet18", "resnet8"))
    main = f"cifar10/{fedimpro_table.MAIN}"
    for seed in range(3):
        for method in fedimpro_table.METHODS:
            fake_run(cpu / f"{main}/{method}/seed{seed}", 0.51 if method == "fedimpro" else 0.50)
    for seed, (fedavg, fedimpro) in enumerate([(0.58, 0.60), (0.57, 0.60)]):
        fake_run(resnet8 / f"{main}/fedavg/seed{seed}", fedavg)
        fake_run(resnet8 / f"{main}/fedimpro/seed{seed}", fedimpro)
    none = tmp_path / "none"
    only_cpu = fedimpro_table.decisive(cpu, none, none)
    assert only_cpu.page == "fedimpro_claims.md"
    assert all(c.text.endswith(", CPU scale") for c in only_cpu.claims)
    # ResNet-8 pairs two seeds against FedAvg only: that claim comes from it, the other bases from the CPU
    small = fedimpro_table.decisive(cpu, none, resnet8)
    assert small.page == "fedimpro_paper_resnet8_claims.md"
    assert [judge(c)[:2] for c in small.claims] == [("+2.5 [-3.9, +8.9]", [0, 1])] + [
        ("+1.0 [+1.0, +1.0]", [0, 1, 2])] * 3
    assert small.claims[0].text.endswith("near the paper's scale")
    assert small.ours.startswith("the paper's federation and split, 300 of its 1000 rounds (30 % of its "
                                 "client steps), on ResNet-8 (BatchNorm) in place of ResNet-18 for 1 "
                                 "of the 4")
    # ResNet-18 is the paper's model: where it pairs, ResNet-8's runs are not read
    for seed in range(2):
        fake_run(resnet18 / f"{main}/fedavg/seed{seed}", 0.70)
        fake_run(resnet18 / f"{main}/fedimpro/seed{seed}", 0.69)
    large = fedimpro_table.decisive(cpu, resnet18, resnet8)
    assert large.page == "fedimpro_paper_claims.md" and "model and split" in large.ours
    assert judge(large.claims[0])[:2] == ("-1.0 [-1.0, -1.0]", [0, 1])


def test_table_3s_default_split_is_table_1s_fedimpro_run_paired_by_seed_with_each_other_split(tmp_path):
    """The split after conv2 is FedImpro's default, so Table 3 reads its cell from Table 1's main-setting run
    (not run twice): each other split is judged against it over the seeds both ran, into the claims page and
    the tables page."""
    import fedimpro_table

    assert [name for name, _, _ in fedimpro_table.split_jobs("cifar10", [1, 2])] == [
        f"cifar10/splits/{split}/seed{seed}" for seed in (1, 2) for split in ("conv1", "fc1", "fc2")]
    runs = tmp_path / "runs"
    default, fc2 = {0: 0.40, 1: 0.30, 2: 0.35}, {0: 0.44, 1: 0.41, 2: 0.40}  # ordered differently
    for seed in range(3):
        fake_run(runs / f"cifar10/{fedimpro_table.MAIN}/fedimpro/seed{seed}", default[seed])
        fake_run(runs / f"cifar10/splits/fc2/seed{seed}", fc2[seed])
    fake_run(runs / "cifar10/splits/conv1/seed2", 0.30)
    fedimpro_table.claims(runs, ["cifar10"], [0, 1, 2], tmp_path / "claims.md")
    rows = {line.split(" | ")[0]: line for line in (tmp_path / "claims.md").read_text().splitlines()}
    # paired by seed: -4, -11, -5; mean -6.67, sd 3.79, half-width t(0.975, 2) 4.303 x 3.79 / sqrt(3) = 9.41
    assert rows["| the split after conv2 (default) beats the split after fc2 (features)"].endswith(
        "| -6.7 [-16.1, +2.7] | 0, 1, 2 | not held |")
    assert "| +5.0 (one seed) | 2 | unresolved (1 seed) |" in rows[  # seed 2: 35 - 30
        "| the split after conv2 (default) beats the split after conv1"]
    assert ("Unresolved (0 seeds), no paired records: the split after conv2 (default) beats the split after "
            "fc1.") in rows
    fedimpro_table.report(runs, ["cifar10"], [0, 1, 2], tmp_path / "tables.md")
    assert "| best accuracy (%) | 30.0 (1 seed) | 35.0±5.0 | - | 41.7±2.1 |" in (
        tmp_path / "tables.md").read_text()


def test_the_summarys_scale_names_the_share_only_when_the_claims_mix_scales():
    from table_runs import ours_at_either_scale

    assert ours_at_either_scale("P", "C", [True, True]) == "P"
    assert ours_at_either_scale("P", "C", [False, False]) == "C"
    assert ours_at_either_scale("P", "C", [True, False, True]) == "P for 2 of the 3 claims; the rest at C"


def test_fedimpros_resnet8_scale_is_the_paper_scale_on_resnet8():
    import fedimpro_table

    from fedjax_lab.experiments import load_config

    scale = fedimpro_table.SCALES["paper_resnet8"]
    (_, dataset, overrides), = fedimpro_table.jobs(["cifar10"], [fedimpro_table.MAIN], [1], ["fedimpro"])
    path = fedimpro_table.REPO / "configs/fedimpro" / scale.config_file(dataset)
    config = load_config(path, [*scale.before, *overrides, *scale.after])
    assert (config.model.name, config.rounds.num_rounds, config.eval.split, config.algorithm.split,
            config.algorithm.ramp_rounds, config.seed) == ("resnet8", 300, "layer2", "layer2", 150, 1)


def test_fedcogs_summary_claim_is_judged_at_the_papers_scale_where_two_seeds_pair_there(tmp_path):
    import fedcog_table
    import reproductions

    cpu, paper = tmp_path / "fedcog", tmp_path / "fedcog_paper"
    for seed in range(3):
        for niid in ("niid1", "niid2"):
            fake_run(cpu / f"fashion_mnist/{niid}/fedavg/seed{seed}", 0.70)
            fake_run(cpu / f"fashion_mnist/{niid}/fedcog/seed{seed}", 0.71)
    for seed, (fedavg, fedcog) in enumerate([(0.697, 0.710), (0.683, 0.692)]):
        fake_run(paper / f"fashion_mnist/niid1/fedavg/seed{seed}", fedavg)
        fake_run(paper / f"fashion_mnist/niid1/fedcog/seed{seed}", fedcog)
    fake_run(paper / "fashion_mnist/niid2/fedavg/seed0", 0.60)  # one seed there: NIID-2 stays at CPU scale
    fake_run(paper / "fashion_mnist/niid2/fedcog/seed0", 0.65)
    summary = fedcog_table.decisive(cpu, paper, tmp_path / "none")
    # differences 1.3 and 0.9 points on NIID-1 at the paper's scale, 1.0 on every seed at CPU scale on NIID-2
    assert [(c.text, judge(c)[1]) for c in summary.claims] == [
        ("FedCOG beats FedAvg, Fashion-MNIST NIID-1, the paper's scale", [0, 1]),
        ("FedCOG beats FedAvg, Fashion-MNIST NIID-2, CPU scale", [0, 1, 2])]
    with_size = tmp_path / "with_size"  # and the size weighting on NIID-2, at the paper's scale only
    shutil.copytree(paper, with_size)
    for seed in range(3):
        if seed:
            fake_run(with_size / f"fashion_mnist/niid2/fedavg/seed{seed}", 0.60)
        fake_run(with_size / f"fashion_mnist/niid2/fedcog_size/seed{seed}", 0.62 + 0.01 * seed)
    sized = fedcog_table.decisive(cpu, with_size, tmp_path / "none")
    # its differences 2, 3 and 4 points; no size-weighting claim where it never ran
    assert [(c.text, judge(c)[1]) for c in sized.claims] == [
        ("FedCOG beats FedAvg, Fashion-MNIST NIID-1, the paper's scale", [0, 1]),
        ("FedCOG beats FedAvg, Fashion-MNIST NIID-2, CPU scale", [0, 1, 2]),
        ("FedCOG, size weighting, beats FedAvg, Fashion-MNIST NIID-2, the paper's scale", [0, 1, 2])]
    assert judge(sized.claims[2])[0] == "+3.0 [+0.5, +5.5]"
    assert sized.at_scale == "FedCOG's Fashion-MNIST NIID-1, Fashion-MNIST NIID-2"
    assert sized.ours.endswith("on Fashion-MNIST NIID-2")  # its fixed-weight claim is at CPU scale
    assert summary.page == "fedcog_paper_claims.md" and summary.at_scale == "FedCOG's Fashion-MNIST NIID-1"
    assert summary.ours.startswith("the paper's federation, model and client work (100 % of its client "
                                   "steps) on Fashion-MNIST NIID-1; ")
    assert reproductions.at_scale([summary, summary]) == ("FedCOG's Fashion-MNIST NIID-1 and "
                                                          "FedCOG's Fashion-MNIST NIID-1")
    rerun = tmp_path / "fedcog_weighting"  # the one-VM rerun judges the size weighting at CPU scale
    for seed in range(3):
        fake_run(rerun / f"fashion_mnist/niid1/fedavg/seed{seed}", 0.70)
        fake_run(rerun / f"fashion_mnist/niid1/fedcog_size/seed{seed}", 0.69)
    only_cpu = fedcog_table.decisive(cpu, tmp_path / "none", rerun)
    assert [(c.text, judge(c)[0]) for c in only_cpu.claims] == [
        ("FedCOG beats FedAvg, Fashion-MNIST NIID-1, CPU scale", "+1.0 [+1.0, +1.0]"),
        ("FedCOG, size weighting, beats FedAvg, Fashion-MNIST NIID-1, CPU scale", "-1.0 [-1.0, -1.0]"),
        ("FedCOG beats FedAvg, Fashion-MNIST NIID-2, CPU scale", "+1.0 [+1.0, +1.0]")]
    assert (only_cpu.page, only_cpu.at_scale) == ("fedcog_claims.md", "")
    assert reproductions.at_scale([only_cpu]) == "nothing"


def test_fedwalks_claims_pair_x_plus_fedwalk_with_x_by_seed():
    import fedwalk_table

    results = {f"table/dir0.1/{method}/seed{s}": {"summary": {"best_test_accuracy": acc}}
               for method, accs in (("fedavg", (0.30, 0.32, 0.31)), ("fedavg+fedwalk", (0.31, 0.34, 0.32)))
               for s, acc in enumerate(accs)}
    claims = fedwalk_table.table2_claims(results, [0, 1, 2], "cifar10")
    fedavg = next(c for c in claims if c.text == "fedavg + FedWalk beats fedavg, Dir(0.1)")
    assert fedavg.paper_gain == pytest.approx(91.45 - 88.06)
    # differences 1, 2, 1 points: mean 1.33, sample std 0.577, half-width 1.43
    assert judge(fedavg) == ("+1.3 [-0.1, +2.8]", [0, 1, 2], "not held")  # the paper's +3.39 lies above
    assert all(not c.method for c in claims if c is not fedavg)


def test_fedwalks_sweep_figure_is_not_written_without_a_sweep(tmp_path):
    import fedwalk_table

    summary = {"summary": {"best_test_accuracy": 0.4}}
    out = tmp_path / "fedwalk_tau.png"
    assert not fedwalk_table.plot_sweep({"table/dir0.1/fedavg/seed0": summary, "pretrain/LH": summary}, out)
    assert not out.exists()
    assert fedwalk_table.plot_sweep({"table/dir0.1/fedavg/seed0": summary, "sweep/LH/tau-1": summary}, out)
    assert out.is_file()


def test_fedwalks_decisive_claims_come_pre_trained_where_two_seeds_pair_there():
    import fedwalk_table

    def runs(prefix, seeds, gain):  # seed s: the base at 0.3 + s / 100, + FedWalk ``gain`` above it
        out = {}
        for setting in fedwalk_table.SETTINGS:
            for s in seeds:
                for base in fedwalk_table.BASES:
                    for method, up in ((base, 0.0), (f"{base}+fedwalk", gain)):
                        out[f"{prefix}/{setting}/{method}/seed{s}"] = {
                            "rows": [], "summary": {"best_test_accuracy": 0.3 + s / 100 + up}}
        return out

    # every 300-round run from scratch (FedWalk 1 point up); fedavg pre-trained on two seeds (4 points up)
    results = runs("table300", [0, 1, 2], 0.01)
    results |= {k: v for k, v in runs("table_pt", [0, 1], 0.04).items() if "/fedavg" in k}
    found = fedwalk_table.decisive(results, (0, 1, 2))
    by_text = {c.text: c for c in found.claims}
    assert len(found.claims) == 2 * len(fedwalk_table.BASES)
    pre = by_text["fedavg + FedWalk beats fedavg, Dir(0.1), pre-trained"]
    assert judge(pre)[:2] == ("+4.0 [+4.0, +4.0]", [0, 1])
    scratch = by_text["scaffold + FedWalk beats scaffold, IID, from scratch"]
    assert judge(scratch)[:2] == ("+1.0 [+1.0, +1.0]", [0, 1, 2])
    assert "fedavg from a simple-CNN pre-trained 2000 steps on the leash set" in found.ours
    resnet = {k: v | {"config": {"model": {"name": "resnet18"}}} for k, v in results.items()}
    assert "fedavg from a ResNet-18 pre-trained" in fedwalk_table.decisive(resnet, (0, 1, 2)).ours
    # the GPU's ResNet-18 table, once complete, is the one judged
    gpu = {k: v | {"config": {"model": {"name": "resnet18"}}}
           for k, v in runs("table_pt", [0, 1, 2], 0.02).items()}
    partial = {k: v for k, v in gpu.items() if not k.endswith("seed2")}
    assert fedwalk_table.decisive(results, (0, 1, 2), partial).page == "fedwalk_claims.md"
    found = fedwalk_table.decisive(results, (0, 1, 2), gpu)
    assert found.page == "fedwalk_resnet18/fedwalk_claims.md"
    assert "a ResNet-18 pre-trained 2000 steps" in found.ours
    assert judge(found.claims[0])[:2] == ("+2.0 [+2.0, +2.0]", [0, 1, 2])
    # seeds beyond TABLE_SEEDS (where a claim stays unresolved) join the claims: by default, every seed run
    more = results | {k: v for k, v in runs("table_pt", [2, 3, 4], 0.04).items() if "/fedavg" in k}
    pre = {c.text: c for c in fedwalk_table.decisive(more).claims}[
        "fedavg + FedWalk beats fedavg, Dir(0.1), pre-trained"]
    assert judge(pre)[1] == [0, 1, 2, 3, 4]
    # nothing pre-trained pairs two seeds: the claims stay as they were
    one_seed = runs("table300", [0, 1, 2], 0.01) | {k: v for k, v in runs("table_pt", [0], 0.04).items()}
    assert all(not c.text.endswith(("pre-trained", "from scratch"))
               for c in fedwalk_table.decisive(one_seed, (0, 1, 2)).claims)


def test_the_summary_page_counts_each_papers_verdicts():
    import reproductions
    from table_runs import Decisive

    held = Claim("A beats B", 5.0, {0: 2.0, 1: 2.1, 2: 1.9}, {0: 0.0, 1: 0.0, 2: 0.0})
    not_held = Claim("A beats C", 5.0, {0: 0.0, 1: 0.1, 2: -0.1}, {0: 0.0, 1: 0.0, 2: 0.0})
    lonely = Claim("A beats D", 5.0, {0: 1.0}, {0: 0.0})
    lines = reproductions.summary_lines([Decisive("A (its paper)", "a_claims.md", "theirs", "ours, 5 %",
                                                  [held, not_held, lonely])])
    assert "| A (its paper) | theirs | ours, 5 % | 1 | 1 | 1 | [a_claims.md](a_claims.md) |" in lines
    assert "| A beats B | +5.00 | +2.0 [+1.8, +2.2] | 0, 1, 2 | held |" in lines


def test_a_band_over_seeds_goes_on_without_a_run_that_stopped_early():
    curves = [[{"round": 0, "test_accuracy": 0.1}, {"round": 10, "test_accuracy": 0.5},
               {"round": 20, "test_accuracy": 0.7}],
              # diverged after round 10
              [{"round": 0, "test_accuracy": 0.1}, {"round": 10, "test_accuracy": 0.3}],
              [{"round": 0, "test_accuracy": 0.1}, {"round": 10, "test_accuracy": 0.4},
               {"round": 20, "test_accuracy": 0.8}]]
    rounds, mean, spread, reached = table_runs.band(curves, scale=100.0)
    assert rounds.tolist() == [0, 10, 20] and reached.tolist() == [3, 3, 2]
    np.testing.assert_allclose(mean, [10.0, 40.0, 75.0])
    np.testing.assert_allclose(spread, [0.0, 10.0, np.sqrt(50.0)])  # ddof 1: ((5^2 + 5^2) / 1) ** 0.5
    _, _, spread, _ = table_runs.band(curves[:1])
    assert np.isnan(spread).all()  # one seed: no band


def redirected(module, args: list[str], folder: Path) -> list[str]:
    """``args`` with the script's runs and pages moved under ``folder``; the runs folder keeps its name, so
    the committed records it reads are the ones ``--all`` reads."""
    name = module.__name__
    if name in ("fedcog_table", "feddle_table", "fedimpro_table"):
        scale = module.SCALES[args[args.index("--scale") + 1] if "--scale" in args else "cpu"]
        extra = ["--runs", folder / scale.runs, "--out", folder / scale.tables, "--claims-out",
                 folder / scale.claims]
        if name == "fedcog_table" and scale.name == "cpu":
            extra += ["--weighting-runs", folder / "fedcog_weighting"]
    elif name == "fedimpro_divergence":
        extra = ["--out", folder]
    elif name == "privacy_table":
        extra = ["--runs", folder / "privacy", "--out", folder / "privacy_results.md"]
    else:  # bherd_table, fedwalk_table: a folder of pages
        extra = ["--runs", folder / name.removesuffix("_table"), "--out", folder]
    return [*args, *map(str, extra)]


@pytest.mark.parametrize("module, args", reproductions.page_commands(),
                         ids=lambda x: x.__name__ if hasattr(x, "__name__") else " ".join(x))
def test_every_generated_page_is_what_its_records_regenerate(tmp_path, module, args):
    """``reproductions.py --all`` rewrites each page from the records file in the tree (no run directory): the
    same command, writing under ``tmp_path``, gives the committed pages. A page left behind its records (a run
    kept, the page not rewritten; a generator changed, its page not) fails here."""
    module.main(redirected(module, args, tmp_path))
    pages = Path(__file__).resolve().parents[1] / "docs" / "reproductions"
    written = sorted(tmp_path.glob("*.md"))
    assert written and not any(p.name.endswith(".new.md") for p in written)
    for page in written:
        assert page.read_text() == (pages / page.name).read_text(), page.name


def test_an_update_blows_up_when_it_is_not_finite_or_ten_times_the_median_before_it():
    from fedimpro_divergence import blown_up

    assert not blown_up([1.0, 1.2, 0.9, 9.0])
    assert blown_up([1.0, 1.2, 0.9, 11.0])
    assert blown_up([1.0, float("nan")]) and blown_up([float("inf")])
    assert not blown_up([1.0, 50.0])  # too few rounds before it to judge


def test_a_rerun_that_never_blows_up_is_not_reported_as_a_blow_up():
    """A rerun that is another run of its record's config (another CPU) may run all its rounds without
    blowing up: the page says so instead of naming its last round as the blow-up's; records written before
    ``blew_up`` was kept all blew up."""
    from fedimpro_divergence import table_lines

    rows = [{"update_norm": 1.0, "test_accuracy": 0.5}] * 3
    kept = {"matches": 1, "compared": 1, "blowup_round": 40, "weight_then": None, "branch_round": 31,
            "branches": dict.fromkeys(["as run", "FedAvg from there", "control deltas over N",
                                       "half the rate"], rows)}
    name = "fashion_mnist/a0.1_E5_M10/scaffold/seed3"
    never = table_lines("scaffold", {name: {**kept, "blew_up": False}})[-1]
    assert never.startswith(f"| {name} | did not blow up in its 40 rounds | 1 of 1 evaluations | 31 |")
    assert table_lines("scaffold", {name: kept})[-1].startswith(f"| {name} | 40 | 1 of 1 evaluations | 31 |")


def test_the_fedavg_branch_drops_scaffolds_term_and_keeps_the_recorded_server():
    """"FedAvg from there" replaces SCAFFOLD's control variates only: a recorded server optimiser, its rate
    and the weighting stay as run (``algorithm={name: fedavg}`` alone would reset them to FedAvg's
    defaults)."""
    from fedimpro_divergence import BRANCHES, REPO, build_config

    from fedjax_lab.experiments import load_config

    scaffold = ("algorithm={name: scaffold, control_average: cohort, server_optimizer: momentum, "
                "server_learning_rate: 0.5, weighting: uniform}")
    recorded = load_config(REPO / "configs/fedimpro/cpu_fashion_mnist.yaml", [scaffold])
    branch = build_config(recorded.model_dump(mode="json"),
                          BRANCHES["scaffold"]["FedAvg from there"](recorded)).algorithm
    assert (branch.name, branch.server_optimizer, branch.server_learning_rate, branch.weighting) == (
        "fedavg", "momentum", 0.5, "uniform")
    assert not hasattr(branch, "control_average")
    half = build_config(recorded.model_dump(mode="json"), BRANCHES["scaffold"]["half the rate"](recorded))
    assert half.client.learning_rate == recorded.client.learning_rate / 2


def test_the_summary_page_is_what_the_records_regenerate(tmp_path, monkeypatch):
    """docs/reproductions/README.md, as ``reproductions.py`` writes it, from the records file in the tree
    (each script's ``REPO`` moved to an empty folder, so that no run directory is read)."""
    for module in reproductions.PAPERS:
        monkeypatch.setattr(module, "REPO", tmp_path)
    out = tmp_path / "README.md"
    reproductions.main(["--out", str(out)])
    assert out.read_text() == reproductions.OUT.read_text()
