"""The reproduction reports judge each paper claim by the paired difference over seeds (``table_runs.judge``): pairs
by seed, only seeds both arms ran, and "unresolved (n seeds)" below two pairs."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import table_runs
from table_runs import Claim, claims_table, judge


def test_a_claim_is_judged_over_the_seeds_both_arms_ran():
    # differences 1, 2, 3 on seeds 0-2: mean 2, sample std 1, half-width t_{0.975, 2} / sqrt(3) = 2.48
    claim = Claim("A beats B", 1.0, {0: 10.0, 1: 12.0, 2: 14.0, 3: 50.0}, {0: 9.0, 1: 10.0, 2: 11.0})
    ours, seeds, verdict = judge(claim)
    assert (ours, seeds, verdict) == ("+2.0 [-0.5, +4.5]", [0, 1, 2], "unresolved")
    assert judge(Claim("A beats B", 5.0, claim.method, claim.base))[2] == "not held"  # the interval is below 5
    assert judge(Claim("A beats B", 5.0, {0: 2.0, 1: 2.1, 2: 1.9}, {0: 0.0, 1: 0.0, 2: 0.0}))[2] == "held"


def test_fewer_than_two_pairs_leave_a_claim_unresolved():
    assert judge(Claim("A beats B", 1.0, {0: 3.0, 1: 4.0}, {1: 2.5})) == ("+1.5 (one seed)", [1], "unresolved (1 seed)")
    assert judge(Claim("A beats B", 1.0, {0: 3.0}, {1: 2.5})) == ("-", [], "unresolved (0 seeds)")


def test_the_claims_table_has_a_row_per_claim_and_lists_the_unpaired_below():
    lines = claims_table([Claim("A beats B, NIID-1", 4.27, {0: 71.0, 1: 69.2, 2: 74.9}, {0: 69.7, 1: 68.3, 2: 73.5}),
                          Claim("A beats C, NIID-1", 1.5, {0: 71.0}, {}, digits=1, paper_note="(CIFAR-10's)")])
    assert lines[:2] == table_runs.CLAIMS_HEADER
    assert lines[2] == "| A beats B, NIID-1 | +4.27 | +1.2 [+0.5, +1.9] | 0, 1, 2 | held |"
    assert lines[3:] == ["", "Unresolved (0 seeds), no paired records: A beats C, NIID-1."]
    assert claims_table([]) == []


def test_the_reports_cells_use_the_sample_standard_deviation():
    assert table_runs.mean_std([40.0, 42.0, 44.0], of=3, ddof=1) == "42.0±2.0"
    assert table_runs.mean_std([40.0, 42.0, 44.0], of=3) == "42.0±2.0"  # the sample standard deviation, ddof 1
    import fedcog_table
    import feddle_table
    import fedimpro_table

    for module in (fedcog_table, feddle_table):
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
    assert "| FedCOG beats FedAvg, Fashion-MNIST NIID-1 | +4.27 | +1.2 [+0.5, +1.9] | 0, 1, 2 | held |" in text
    assert "| FedCOG beats MOON, Fashion-MNIST NIID-1 | +4.13 | -0.8 (one seed) | 1 | unresolved (1 seed) |" in text
    assert "FedCOG beats FedAvg, Fashion-MNIST NIID-2" in text.split("## Table 1 with")[0]  # no runs: listed
    assert "Table 3" not in text  # no Table 3 runs


@pytest.mark.parametrize("module", ["feddle_table", "fedimpro_table"])
def test_the_claims_pages_of_feddle_and_fedimpro_are_written_from_no_runs(tmp_path, module):
    import importlib

    script = importlib.import_module(module)
    out = tmp_path / "claims.md"
    script.claims(tmp_path, [], [0, 1, 2], out)
    assert out.read_text().startswith("# Fed")
