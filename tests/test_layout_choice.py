"""The round's layout chosen by measurement (fedjax_lab/experiments/layout.py): the fastest candidate past the
margin, explicit settings obeyed, the choice cached and written to the run directory."""

import json

import jax
import numpy as np
import pytest

from fedjax_lab.experiments import ConfigError, build_experiment, run_experiment, validate
from fedjax_lab.experiments import layout as layout_module
from fedjax_lab.experiments.layout import (
    Layout,
    UnequalWork,
    candidate_chunks,
    candidate_member_chunks,
    choose_layout,
    choose_member_chunk,
)
from fedjax_lab.experiments.sweep import run_sweep

RAW = {
    "seed": 1,
    "dataset": {"name": "gaussian_mixture", "num_clients": 8, "examples_per_client": 20, "dimension": 6,
                "num_classes": 3},
    "model": {"name": "mlp", "hidden": [8]},
    "algorithm": {"name": "fedavg"},
    "client": {"learning_rate": 0.1, "batch_size": 4, "local_steps": 3},
    "rounds": {"num_rounds": 2, "clients_per_round": 4, "layout": "measure"},
    "eval": {"every": 1},
}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDJAX_LAB_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "layouts.json"


def test_candidate_chunks_are_the_rule_one_two_ten_and_the_share_that_divide_it():
    assert candidate_chunks(10, 2) == [2, 1, 10]
    assert candidate_chunks(100, 1) == [1, 2, 10, 100]
    assert candidate_chunks(7, 1) == [1, 7]


def _fake_times(monkeypatch, times: dict[str, float | Exception], probe: float = 0.01):
    """``seconds_per_round`` of a built candidate from ``times``, by the candidate's label (``probe`` for the
    probe round's)."""
    built = []

    def build(config):
        matmul = None if config.rounds.cpu_matmul == "auto" else config.rounds.cpu_matmul
        label = Layout(config.model.lowering if config.model.name == "simple_cnn" else None,
                       config.rounds.chunk_size, matmul).label()
        if config.client.local_steps == layout_module.PROBE_STEPS:
            return "probe"
        built.append((label, config.client.local_steps, config.rounds.layout))
        if isinstance(times[label], Exception):
            raise times[label]
        return label

    monkeypatch.setattr(layout_module, "seconds_per_round",
                        lambda label, min_calls=2: probe if label == "probe" else times[label])
    return build, built


def test_the_lowering_then_the_chunk_are_chosen_fastest_past_the_margin(cache, monkeypatch):
    config = validate({**RAW, "model": {"name": "simple_cnn"}})
    times = {"banded, chunk 1": 1.0, "xla, chunk 1": 2.0, "im2col, chunk 1": 0.96,  # within 5 %: banded stays
             "banded, chunk 2": 0.5, "banded, chunk 4": ConfigError("does not fit")}
    build, built = _fake_times(monkeypatch, times)
    where = {"rules": Layout("banded", 1), "conv_model": True, "share": 4, "input_shape": (6,)}
    chosen, info = choose_layout(config, build=build, **where)
    assert chosen == Layout("banded", 2)
    assert info["how"] == "measured" and "2.00x the rules' banded, chunk 1" in info["why"]
    assert info["seconds_per_round"]["banded, chunk 4"].startswith("skipped: does not fit")
    # Each candidate built once, explicitly, with the rules and the short local budget.
    assert sorted(b[0] for b in built) == sorted(times)
    assert {b[1:] for b in built} == {(layout_module.MEASURED_STEPS, "rules")}
    # The next choice with the same key is read from the cache: nothing is built.
    again, info = choose_layout(config, build=lambda c: pytest.fail("built a candidate on a cache hit"),
                                **where)
    assert again == chosen and info["how"] == "cached"
    assert json.loads(cache.read_text())  # one entry


def test_on_a_cpu_the_matmul_library_is_measured_last_in_the_fastest_layout(cache, monkeypatch):
    config = validate({**RAW, "model": {"name": "simple_cnn"}})
    times = {"banded, chunk 1, ynnpack matmul": 1.0, "xla, chunk 1, ynnpack matmul": 2.0,
             "im2col, chunk 1, ynnpack matmul": 3.0, "banded, chunk 2, ynnpack matmul": 0.5,
             "banded, chunk 4, ynnpack matmul": 0.6, "banded, chunk 2, eigen matmul": 0.45}
    build, built = _fake_times(monkeypatch, times)
    rules = Layout("banded", 1, "ynnpack")
    chosen, info = choose_layout(config, build=build, rules=rules, conv_model=True, share=4, input_shape=(6,))
    assert chosen == Layout("banded", 2, "eigen") and sorted(b[0] for b in built) == sorted(times)
    assert "2.22x the rules' banded, chunk 1, ynnpack matmul" in info["why"]
    # Within the margin the rules' library stands; set explicitly, it is not measured.
    times["banded, chunk 2, eigen matmul"] = 0.49
    chosen, _ = choose_layout(validate({**RAW, "model": {"name": "simple_cnn"}, "seed": 2}), build=build,
                              rules=rules, conv_model=True, share=4, input_shape=(7,))
    assert chosen == Layout("banded", 2, "ynnpack")
    fixed = validate({**RAW, "model": {"name": "simple_cnn", "lowering": "banded"},
                      "rounds": {**RAW["rounds"], "chunk_size": 2, "cpu_matmul": "eigen"}})
    chosen, info = choose_layout(fixed, build=build, rules=Layout("banded", 2, "eigen"), conv_model=True,
                                 share=4, input_shape=(6,))
    assert chosen == Layout("banded", 2, "eigen") and info["how"] == "explicit"


def test_the_eigen_matmul_compiles_another_cpu_program_that_agrees_at_float_rounding():
    programs, servers = {}, {}
    for matmul in ("ynnpack", "eigen"):
        experiment = build_experiment(validate({**RAW, "rounds": {**RAW["rounds"], "layout": "rules",
                                                                   "cpu_matmul": matmul}}))
        assert experiment.cpu_matmul == matmul
        compiled = experiment.run_rounds.lower(jax.eval_shape(experiment.initial_state), experiment.inputs,
                                               num_rounds=2).compile()
        programs[matmul] = compiled.as_text()
        servers[matmul] = compiled(experiment.initial_state(), experiment.inputs)[0].server_state
    assert "__ynn" not in programs["eigen"] and programs["eigen"] != programs["ynnpack"]
    for a, b in zip(jax.tree.leaves(servers["ynnpack"]), jax.tree.leaves(servers["eigen"])):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_a_round_compiled_with_compiler_options_runs_inside_another_trace_without_them():
    # JAX refuses compiler options on a jit nested in another trace (eval_shape, an outer jit)
    experiment = build_experiment(validate({**RAW, "rounds": {**RAW["rounds"], "layout": "rules",
                                                               "cpu_matmul": "eigen"}}))
    run = lambda s: experiment.run_rounds(s, experiment.inputs, num_rounds=2)
    top, top_metrics = run(experiment.initial_state())
    shapes = jax.eval_shape(run, jax.eval_shape(experiment.initial_state))
    nested, nested_metrics = jax.jit(run)(experiment.initial_state())
    assert jax.tree.map(lambda a: (a.shape, a.dtype), shapes) == jax.tree.map(
        lambda a: (a.shape, a.dtype), (top, top_metrics))
    for a, b in zip(jax.tree.leaves((top, top_metrics)), jax.tree.leaves((nested, nested_metrics))):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("model, matmul", [({"name": "mlp", "hidden": [8]}, "ynnpack"),
                                           ({"name": "resnet8"}, "eigen")])
def test_on_a_cpu_the_rules_give_convolutional_models_eigen_products_and_others_xlas_default(model, matmul):
    from fedjax_lab.experiments.build import rules_layout

    raw = {**RAW, "model": model, "rounds": {**RAW["rounds"], "layout": "rules"}}
    if model["name"] == "resnet8":
        raw["dataset"] = {"name": "cifar10", "partition": {"name": "iid", "num_clients": 8}}
    rules = rules_layout(validate(raw), share=4)
    assert rules.cpu_matmul == (matmul if jax.default_backend() == "cpu" else None)
    assert rules.lowering == (None if model["name"] == "mlp" else
                              "banded" if jax.default_backend() == "cpu" else "xla")


def test_the_rules_stand_when_nothing_beats_them_by_the_margin(cache, monkeypatch):
    config = validate(RAW)
    build, _ = _fake_times(monkeypatch, {"chunk 2": 1.0, "chunk 1": 0.97, "chunk 4": 1.2})
    chosen, info = choose_layout(config, rules=Layout(None, 2), conv_model=False, share=4, input_shape=(6,),
                                 build=build)
    assert chosen == Layout(None, 2)
    assert "stands" in info["why"] and "chunk 1" in info["why"]


def test_a_slow_probe_round_keeps_the_rules_without_timing_the_candidates(cache, monkeypatch):
    config = validate({**RAW, "model": {"name": "simple_cnn"}})
    build, built = _fake_times(monkeypatch, {}, probe=3.0)
    chosen, info = choose_layout(config, rules=Layout("im2col", 1), conv_model=True, share=4,
                                 input_shape=(6,), build=build)
    assert chosen == Layout("im2col", 1) and not built
    assert "took 3.0 s" in info["why"] and info["probe_seconds"] == 3.0


def test_explicit_settings_are_obeyed_and_nothing_is_measured(cache, monkeypatch):
    monkeypatch.setattr(layout_module, "seconds_per_round", lambda e: pytest.fail("measured"))
    experiment = build_experiment(validate({**RAW, "rounds": {**RAW["rounds"], "chunk_size": 4,
                                                              "cpu_matmul": "ynnpack"}}))
    assert experiment.plan.chunk_size == 4 and experiment.layout["how"] == "explicit"
    assert not cache.exists()
    rules = build_experiment(validate({**RAW, "rounds": {**RAW["rounds"], "layout": "rules"}}))
    assert rules.layout == {} and rules.plan.chunk_size == 2  # the CPU rule for dense models


def test_an_explicit_setting_is_obeyed_though_the_cache_holds_a_choice_made_with_another_value(cache):
    configs = [validate({**RAW, "rounds": {**RAW["rounds"], "chunk_size": chunk}}) for chunk in (4, 2, 1)]
    chunks = [build_experiment(config).plan.chunk_size for config in configs]
    assert chunks == [4, 2, 1]  # each measured its matmul library under its own key, none read another's
    assert len(json.loads(cache.read_text())) == 3


def test_a_choice_cached_by_other_source_code_is_measured_again(cache, monkeypatch):
    """A changed lowering changes the speeds: the cache answers only for the source that measured it."""
    where = {"rules": Layout(None, 4), "conv_model": False, "share": 4, "input_shape": (6,)}
    build, _ = _fake_times(monkeypatch, {"chunk 1": 1.0, "chunk 2": 1.0, "chunk 4": 0.5})
    assert choose_layout(validate(RAW), build=build, **where)[1]["how"] == "measured"
    assert choose_layout(validate(RAW), build=build, **where)[1]["how"] == "cached"
    monkeypatch.setattr(layout_module, "source_digest", lambda: "edited")
    build, _ = _fake_times(monkeypatch, {"chunk 1": 0.2, "chunk 2": 1.0, "chunk 4": 0.5})
    chosen, info = choose_layout(validate(RAW), build=build, **where)
    assert info["how"] == "measured" and chosen == Layout(None, 1)
    assert len(json.loads(cache.read_text())) == 2


def test_unequal_work_counts_the_busiest_device_s_chunk_steps():
    steps = np.array([1, 1, 1, 1, 10, 10, 10, 10])  # the whole population in every cohort
    balanced = UnequalWork(steps, cohort_size=8, num_devices=2, balanced=True)
    sampled = UnequalWork(steps, cohort_size=8, num_devices=2, balanced=False)
    # a client at a time: balanced, each device takes two 10s and two 1s; in id order, one takes the 10s
    assert balanced.busiest_chunk_steps(1) == 22 and sampled.busiest_chunk_steps(1) == 40
    # the whole share at once: a chunk steps as long as its heaviest client
    assert balanced.busiest_chunk_steps(4) == 10 and sampled.busiest_chunk_steps(4) == 10
    assert balanced.busiest_chunk_steps(2) == 11  # chunks (10, 10) and (1, 1) on each device
    # equal steps: the measured round's own count, whatever the layout
    equal = UnequalWork(np.full(8, 10), cohort_size=4, num_devices=1, balanced=True)
    assert [equal.scale(chunk, 4) for chunk in (1, 2, 4)] == [1.0, 1.0, 1.0]
    assert balanced.digest() != sampled.digest() and balanced.digest() == UnequalWork(
        steps.copy(), cohort_size=8, num_devices=2, balanced=True).digest()


def test_with_unequal_steps_a_chunk_is_judged_by_a_real_round_not_by_equal_steps(cache, monkeypatch):
    # A round has a fixed 0.5 ms, and a step of 4 clients at once costs 1 ms, of 2 clients 0.75 ms, of one
    # 0.5 ms: with every client taking 10 steps, the whole share of 4 is fastest.
    times = {"chunk 1": 0.0005 + 40 * 0.0005, "chunk 2": 0.0005 + 20 * 0.00075,
             "chunk 4": 0.0005 + 10 * 0.001}
    build, _ = _fake_times(monkeypatch, times, probe=0.0005 + 2 * 0.001)
    where = {"rules": Layout(None, 4), "conv_model": False, "share": 4, "input_shape": (6,)}
    assert choose_layout(validate(RAW), build=build, **where)[0] == Layout(None, 4)
    # Each cohort holds one client of 100 steps and three of 1: the whole share steps 100 times (100 ms),
    # chunks of 2 (100, 1) and (1, 1) 101 times (76 ms), one client at a time 103 times (52 ms).
    work = UnequalWork(np.array([100, 1, 1, 1]), cohort_size=4, num_devices=1, balanced=True)
    chosen, info = choose_layout(validate(RAW), build=build, work=work, **where)
    assert chosen == Layout(None, 1) and "unequal steps" in info["why"]
    np.testing.assert_allclose(info["fixed_seconds_per_round"], 0.0005)
    np.testing.assert_allclose([info["predicted_seconds_per_round"][f"chunk {c}"] for c in (4, 2, 1)],
                               [0.0005 + 0.1, 0.0005 + 0.07575, 0.0005 + 0.0515])
    # Two such clients of four: chunks of 2, (100, 100) and (1, 1), mask almost nothing and win.
    work = UnequalWork(np.array([100, 100, 1, 1]), cohort_size=4, num_devices=1, balanced=True)
    assert choose_layout(validate(RAW), build=build, work=work, **where)[0] == Layout(None, 2)


def test_a_measured_run_writes_its_layout_and_the_next_build_reads_the_cache(cache, tmp_path):
    config = validate(RAW)
    run_experiment(config, tmp_path / "run", progress=False)
    written = json.loads((tmp_path / "run" / "layout.json").read_text())
    assert written["how"] == "measured"
    chunk = written["layout"]["chunk_size"]
    assert set(written["seconds_per_round"]) == {"chunk 2, ynnpack matmul", "chunk 1, ynnpack matmul",
                                                 "chunk 4, ynnpack matmul", f"chunk {chunk}, eigen matmul"}
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["cpu_matmul"] == written["layout"]["cpu_matmul"]
    assert all(isinstance(t, float) and t > 0 for t in written["seconds_per_round"].values())
    assert written["key"]["model"]["name"] == "mlp" and written["key"]["share"] == 4
    again = build_experiment(config)
    assert again.layout["how"] == "cached"
    assert again.plan.chunk_size == written["layout"]["chunk_size"]
    assert again.config == config  # the run's config keeps its unset layout


def test_a_bad_environment_default_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv("FEDJAX_LAB_LAYOUT", "fastest")
    with pytest.raises(ValueError, match="FEDJAX_LAB_LAYOUT .* must be 'measure' or 'rules', got 'fastest'"):
        validate({**RAW, "rounds": {"num_rounds": 2, "clients_per_round": 4}})


# ------------------------------------------------------------------------------------------------ sweeps
def test_candidate_member_chunks_are_the_rule_one_two_four_eight_the_share_and_separate_runs():
    assert candidate_member_chunks(8, 8) == [8, 1, 2, 4, None]
    assert candidate_member_chunks(8, None) == [None, 1, 2, 4, 8]
    assert candidate_member_chunks(6, 2) == [2, 1, 6, None]
    assert candidate_member_chunks(9, 6) == [1, 9, None]  # a rule that does not divide the share is left out


def _choose(**kwargs):
    where = {"key": "k", "rule": 2, "share": 4, "members": 4, "rounds": 100, "steps_ratio": 2.0}
    return choose_member_chunk(**{**where, **kwargs})


def test_the_member_chunk_is_chosen_by_the_sweep_s_predicted_time_compilation_included(cache):
    first_and_round = {4: (2.0, 0.02), 2: (1.5, 0.03), 1: ConfigError("does not fit")}

    def time_program(chunk):
        if isinstance(first_and_round[chunk], Exception):
            raise first_and_round[chunk]
        return first_and_round[chunk]

    chosen, info = _choose(time_program=time_program, time_run=lambda: (1.0, 0.01))
    # compilation (first call less a round) + 100 rounds x 2 x the measured round; separate runs: 4 of them
    predicted = {k: v["predicted_s"] for k, v in info["measured"].items() if isinstance(v, dict)}
    assert predicted == pytest.approx({"separate runs": 4 * (0.99 + 2.0), "4 member(s) vmapped at a time":
                                       1.98 + 4.0, "2 member(s) vmapped at a time": 1.47 + 6.0})
    assert chosen == 4 and info["how"] == "measured" and "1.25x the rules' 2 member(s)" in info["why"]
    assert info["measured"]["1 member(s) vmapped at a time"].startswith("skipped: does not fit")
    again, info = _choose(time_program=lambda c: pytest.fail("timed on a cache hit"),
                          time_run=lambda: pytest.fail("timed on a cache hit"))
    assert again == 4 and info["how"] == "cached"


def test_a_way_that_runs_out_of_memory_is_skipped_and_any_other_error_raised(cache):
    def time_program(chunk):
        if chunk == 4:
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 90 GiB")
        return (1.0, 0.05)

    _, info = _choose(time_program=time_program, time_run=lambda: (0.5, 0.02))
    assert info["measured"]["4 member(s) vmapped at a time"].startswith("skipped: out of memory")
    with pytest.raises(ValueError, match="a bug"):
        _choose(key="bug", time_program=lambda chunk: (_ for _ in ()).throw(ValueError("a bug")),
                time_run=lambda: (0.5, 0.02))


def test_separate_runs_win_when_a_member_alone_is_that_much_faster_and_a_slow_member_keeps_the_rules(cache):
    chosen, info = _choose(key="fast", time_program=lambda chunk: (1.0, 0.05), time_run=lambda: (0.5, 0.001))
    assert chosen is None and "separate runs" in info["why"]
    chosen, info = _choose(key="slow", time_program=lambda chunk: pytest.fail("timed"),
                           time_run=lambda: (9.0, 3.0))
    assert chosen == 2 and "took 3.0 s" in info["why"]


def test_a_measured_sweep_writes_its_choice_and_the_next_sweep_reads_it(cache, tmp_path):
    config = validate(RAW)
    summary = run_sweep(config, {"seed": [0, 1]}, tmp_path / "sweep", progress=False)
    written = json.loads((tmp_path / "sweep" / "layout.json").read_text())
    assert written["how"] == "measured" and written["key"]["sweep_members"] == 2
    assert set(written["measured"]) == {"separate runs", "2 member(s) vmapped at a time",
                                        "1 member(s) vmapped at a time"}
    assert summary["layout"].startswith("one program" if written["member_chunk"] else "one after another")
    run_sweep(config, {"seed": [0, 1]}, tmp_path / "sweep", progress=False, overwrite=True)
    assert json.loads((tmp_path / "sweep" / "layout.json").read_text())["how"] == "cached"


def test_a_given_chunk_the_rules_and_a_resumed_sweep_measure_nothing(cache, tmp_path, monkeypatch):
    from fedjax_lab.experiments import sweep as sweep_module

    monkeypatch.setattr(layout_module, "choose_member_chunk", lambda *a, **k: pytest.fail("measured"))
    members = sweep_module.expand(validate(RAW), {"seed": [0, 1, 2]})
    assert sweep_module._member_chunk(members, 3, tmp_path, resume=False) == (3, None)
    rules = sweep_module.expand(validate({**RAW, "rounds": {**RAW["rounds"], "layout": "rules"}}),
                                {"seed": [0, 1, 2]})
    assert sweep_module._member_chunk(rules, None, tmp_path, resume=False) == (3, None)  # 3 divides 3
    (tmp_path / "layout.json").write_text(json.dumps({"member_chunk": 1, "why": "measured before"}))
    assert sweep_module._member_chunk(members, None, tmp_path, resume=True)[0] == 1
