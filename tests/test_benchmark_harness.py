"""The harness of the A/B benchmarks: the ways alternate in fresh processes, ratios are paired by repetition,
and a result file never replaces another."""

import json
import os
import statistics
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import alternating
from fedavg_mlp_throughput import machine_kind

WORKER = """
import json, os, sys
way, rest = sys.argv[2], sys.argv[3:]
log = os.environ["ORDER_LOG"]
with open(log, "a") as f:
    f.write(way + "\\n")
calls = sum(1 for _ in open(log))
print("compiling...")
print(json.dumps({"way": way, "rest": rest, "examples_per_s": [100.0 * calls, 300.0 * calls]}))
"""


def test_the_ways_alternate_in_fresh_processes_and_each_returns_its_last_json_line(tmp_path, monkeypatch):
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(WORKER))
    monkeypatch.setenv("ORDER_LOG", str(tmp_path / "order"))
    runs = alternating.alternate(script, ("a", "b"), 3, after=["--calls", "2"])
    assert (tmp_path / "order").read_text().split() == ["a", "b"] * 3
    assert [r["way"] for r in runs["a"]] == ["a"] * 3
    assert all(r["rest"] == ["--calls", "2"] for r in runs["b"])
    # the n-th process (1-based) reports 100 n and 300 n: its median is 200 n
    assert [statistics.median(r["examples_per_s"]) for r in runs["a"]] == [200.0, 600.0, 1000.0]
    assert alternating.paired_ratios(runs["b"], runs["a"]) == pytest.approx([4 / 2, 8 / 6, 12 / 10])
    assert alternating.median_of_calls(runs["a"]) == 400.0  # of 100, 300, 300, 900, 500, 1500
    summary = alternating.compare_two(runs, "b", "a")
    assert summary["speedup_of_b"] == pytest.approx(alternating.median_of_calls(runs["b"]) / 400.0)
    assert summary["speedup_per_repetition"] == pytest.approx([2.0, 4 / 3, 1.2])
    assert all(0 < r["core_balance"] <= 1 for way in runs.values() for r in way)  # timed around each process
    for way, balances in (("a", (0.9, 0.5, 1.0)), ("b", (1.0, 1.0, 0.7))):
        for run, balance in zip(runs[way], balances):
            run["core_balance"] = balance
    assert alternating.compare_two(runs, "b", "a")["uneven_repetitions"] == [1, 2]


def test_summed_seconds_give_the_slower_way_over_the_faster():
    slow, fast = [{"s": [3.0, 3.0]}, {"s": [4.0, 2.0]}], [{"s": [1.0, 2.0]}, {"s": [2.0, 1.0]}]
    assert alternating.paired_ratios(slow, fast, "s", total=True) == [2.0, 2.0]
    with pytest.raises(ValueError):
        alternating.paired_ratios(slow, fast[:1], "s")


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no thread pinning here")
def test_each_core_is_timed_pinned_and_uneven_repetitions_are_set_aside():
    cores = os.sched_getaffinity(0)
    speeds = alternating.core_speeds(work=1000, repeats=2)
    assert set(speeds) == cores and all(v > 0 for v in speeds.values())
    assert os.sched_getaffinity(0) == cores  # the thread's cores given back
    assert alternating.core_balance({0: 400.0, 1: 1000.0}) == 0.4
    assert alternating.core_balance({3: 7.0}) == 1.0
    assert alternating.even_repetitions([0.95, 0.45, 0.8, 0.79]) == [0, 2]
    assert alternating.even_repetitions([0.5, 0.6]) == [0, 1]  # uneven throughout: every repetition


def test_where_threads_cannot_be_pinned_the_cores_are_timed_once_and_count_as_level(monkeypatch):
    for name in ("sched_getaffinity", "sched_setaffinity"):
        monkeypatch.delattr(os, name, raising=False)
    speeds = alternating.core_speeds(work=1000, repeats=2)
    assert list(speeds) == [0] and speeds[0] > 0
    assert alternating.core_balance(speeds) == 1.0


def test_a_result_never_replaces_a_kept_file(tmp_path):
    first = alternating.result_path(tmp_path, "band-height", "cpu-amd-avx2-2core", "2026-12-01")
    assert first.name == "band-height-cpu-amd-avx2-2core-20261201.json"
    first.write_text("{}")
    second = alternating.result_path(tmp_path, "band-height", "cpu-amd-avx2-2core", "2026-12-01")
    assert second.name == "band-height-cpu-amd-avx2-2core-20261201-2.json"
    second.write_text("{}")
    assert alternating.result_path(tmp_path, "band-height", "cpu-amd-avx2-2core", "2026-12-01").name.endswith(
        "-3.json")
    assert json.loads(first.read_text()) == {}


@pytest.mark.parametrize("info, kind", [
    ({"cpu_model": "AMD EPYC", "cpu_simd": ["avx", "avx2", "fma"], "cores_available": 1},
     "cpu-amd-avx2-1core"),
    ({"cpu_model": "Intel(R) Xeon(R) Processor", "cpu_simd": ["avx2", "avx512f"], "cores_available": 2},
     "cpu-intel-avx512-2core"),
    ({"cpu_model": "", "cpu_simd": [], "cores_available": 4}, "cpu-4core"),
    ({"jax_backend": "gpu", "jax_devices": ["NVIDIA H200"]}, "gpu-nvidia-h200"),
])
def test_result_files_name_the_cpus_vendor_and_widest_simd(info, kind):
    assert machine_kind(info) == kind


def test_the_suite_profile_sums_each_files_tests_and_ranks_tests_by_compilations(tmp_path):
    import suite_profile

    compile_, lower = suite_profile.COMPILE, suite_profile.STAGES["lower"]
    lines = [{"test": "tests/a.py::eager", "wall": 2.5, "events": {compile_: [40, 1.5], lower: [40, 0.5]}},
             {"test": "tests/a.py::jitted", "wall": 1.0, "events": {compile_: [1, 0.25]}},
             {"test": "tests/b.py::subprocess", "wall": 9.0, "events": {}}]
    path = tmp_path / "profile.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = suite_profile.report(path).splitlines()
    assert out[0] == "3 tests, 12 worker-seconds"
    files = [line for line in out if line.startswith("| tests/") and ".py |" in line]
    assert files == ["| tests/b.py | 9.0 | 0 | 0.0 | 0.0 | 0.0 |",
                     "| tests/a.py | 3.5 | 41 | 0.0 | 0.5 | 1.8 |"]
    ranked = [line.split(" | ")[0] for line in out if "::" in line]
    assert ranked == ["| tests/a.py::eager", "| tests/a.py::jitted", "| tests/b.py::subprocess"]
