"""Scale: streaming aggregation equals stacked, the cohort split over several devices and over two processes
joined by ``jax.distributed`` equals one device, and a run that cannot fit is refused before it compiles."""

from __future__ import annotations

import gc
import json
import mmap
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import optax
import pytest

from fedjax_lab.engine import CohortPlan, LocalSchedule, init_loop_state, make_run_rounds, sharding
from fedjax_lab.engine.types import Reduced
from fedjax_lab.experiments.build import build_experiment
from fedjax_lab.experiments.config import ConfigError, validate
from fedjax_lab.experiments.run_directory import read_metrics
from fedjax_lab.experiments.runner import run_experiment
from fedjax_lab.methods.fedavg import fedavg
from fedjax_lab.methods.feddyn import dynamic_regularization
from fedjax_lab.methods.fedexp import extrapolation
from fedjax_lab.methods.fednova import normalised_averaging
from fedjax_lab.methods.scaffold import control_variates
from fedjax_lab.methods.server_optimizers import fedavg_server
from tests.conftest import assert_trees_close, make_inputs
from tests.sharded_worker import RAW

WORKER = Path(__file__).with_name("sharded_worker.py")
ROOT = WORKER.parent.parent


def _components(classifier):
    return {"fedavg": (), "scaffold": (control_variates(),), "fednova": (normalised_averaging(),),
            "feddyn": (dynamic_regularization(0.1),), "fedexp": (extrapolation(1e-3),)}


@pytest.mark.parametrize("name", ["fedavg", "scaffold", "fednova", "feddyn", "fedexp"])
def test_streaming_aggregation_equals_stacked_aggregation(tiny_data, tiny_classifier, name):
    algorithm = fedavg(tiny_classifier, optax.sgd(0.1, momentum=0.9), fedavg_server(1.0),
                       LocalSchedule(4, local_steps=3), *_components(tiny_classifier)[name])
    assert algorithm.reduce is not None
    params, inputs = tiny_classifier.init(jax.random.key(0)), make_inputs(tiny_data)
    states = {}
    for aggregation in ("stacked", "streaming"):
        plan = CohortPlan(tiny_data.num_clients, 6, 2, aggregation=aggregation)
        state = init_loop_state(algorithm, params, tiny_data.num_clients)
        states[aggregation], _ = make_run_rounds(algorithm, plan)(state, inputs, num_rounds=3)
    assert_trees_close(states["stacked"], states["streaming"], rtol=1e-5, atol=1e-6)


def test_streamed_server_update_sees_only_the_sums(tiny_data, tiny_classifier):
    seen = []
    algorithm = fedavg(tiny_classifier, optax.sgd(0.1), fedavg_server(1.0), LocalSchedule(4, local_steps=2))
    server_update = algorithm.server_update

    def spy(server_state, messages, cohort, context):
        seen.append(type(messages))
        return server_update(server_state, messages, cohort, context)

    algorithm = algorithm._replace(server_update=spy)
    state = init_loop_state(algorithm, tiny_classifier.init(jax.random.key(0)), tiny_data.num_clients)
    make_run_rounds(algorithm, CohortPlan(tiny_data.num_clients, 6, 2))(state, make_inputs(tiny_data),
                                                                        num_rounds=1)
    make_run_rounds(algorithm, CohortPlan(tiny_data.num_clients, 6, 2, aggregation="stacked"))(
        state, make_inputs(tiny_data), num_rounds=1)
    assert seen == [Reduced, dict]


def test_a_server_update_that_needs_every_message_keeps_the_stack(tiny_classifier):
    from fedjax_lab.engine import Component

    reads_the_stack = Component("stack", aggregate=lambda view, mean: (view.messages["delta"], {}))
    algorithm = fedavg(tiny_classifier, optax.sgd(0.1), fedavg_server(1.0), LocalSchedule(4, local_steps=2),
                       reads_the_stack)
    assert algorithm.reduce is None
    assert not CohortPlan(12, 6, 2, aggregation="streaming").streams(algorithm)


def test_streaming_bounds_the_compiled_memory_of_a_large_cohort():
    """The MLP at a cohort of 64 trained 2 at a time: XLA's memory analysis with and without the stack."""
    raw = {**RAW, "dataset": {**RAW["dataset"], "num_clients": 64, "dimension": 100},
           "model": {"name": "mlp", "hidden": [256, 256]},
           "rounds": {"num_rounds": 2, "clients_per_round": 64, "chunk_size": 2}}
    need = {}
    for aggregation in ("stacked", "streaming"):
        experiment = build_experiment(validate({**raw, "parallel": {"aggregation": aggregation}}))
        state = jax.eval_shape(experiment.initial_state)
        compiled = experiment.run_rounds.lower(state, experiment.inputs, num_rounds=1).compile()
        need[aggregation] = compiled.memory_analysis().temp_size_in_bytes
    message = (100 * 256 + 256 * 256 + 256 * 3 + 256 + 256 + 3) * 4
    assert need["stacked"] - need["streaming"] > 30 * message, need


def test_an_unset_chunk_is_sized_from_the_memory_budget(monkeypatch):
    """As on an accelerator (whole cohort by default): the largest chunk whose compiled round fits the
    budget."""
    from fedjax_lab.experiments import build, memory_fit

    monkeypatch.setattr(build, "default_chunk_size", lambda *args: None)
    raw = {**RAW, "dataset": {**RAW["dataset"], "num_clients": 64, "dimension": 100},
           "model": {"name": "mlp", "hidden": [256, 256]},
           "rounds": {"num_rounds": 2, "clients_per_round": 64}}
    assert build.build_experiment(validate(raw)).plan.chunk_size is None  # fits whole
    budget = 0.005 * 2**30
    experiment = build.build_experiment(validate({**raw, "parallel": {"memory_budget_gb": 0.005}}))
    chunk = experiment.plan.chunk_size
    assert chunk is not None and 64 % chunk == 0
    need = memory_fit._compiled_need
    assert need(experiment, chunk) <= budget < need(experiment, 2 * chunk)


def test_building_and_sizing_an_asynchronous_run_traces_its_client_update_once(monkeypatch):
    """The memory estimates and the in-flight store reuse one client's message shapes, traced at build (a
    ResNet's client update took seconds to trace, each time)."""
    from fedjax_lab.engine import simulation
    from fedjax_lab.experiments import build, memory_fit

    calls = []
    traced = simulation.message_shapes

    def counted(*args, **kwargs):
        calls.append(1)
        return traced(*args, **kwargs)

    for module in (build, memory_fit, simulation):
        monkeypatch.setattr(module, "message_shapes", counted)
    raw = {**RAW, "algorithm": {"name": "fedbuff", "buffer_size": 4}, "asynchrony": {"sigma": 1.0}}
    experiment = build.build_experiment(validate(raw))
    state = jax.eval_shape(experiment.initial_state)
    memory_fit.estimate_memory(experiment)
    assert len(calls) == 1
    assert jax.tree.structure(state.asynchrony.in_flight.messages) == jax.tree.structure(experiment.messages)


@pytest.mark.parametrize("change, message", [
    ({"dataset": {**RAW["dataset"], "num_clients": 16}, "algorithm": {"name": "scaffold"},
      "parallel": {"memory_budget_gb": 1e-6}}, r"dataset.num_clients=16: the population's per-client state"),
    ({"parallel": {"memory_budget_gb": 8.5e-6}}, r"rounds.chunk_size=2: a round needs about"),
])
def test_a_configuration_that_cannot_fit_fails_before_compiling(monkeypatch, change, message):
    def no_compiling(*args, **kwargs):
        raise AssertionError("compiled before refusing")

    monkeypatch.setattr(jax.stages.Lowered, "compile", no_compiling)
    with pytest.raises(ConfigError, match=message) as error:
        build_experiment(validate({**RAW, "rounds": {**RAW["rounds"], "chunk_size": 2}, **change}))
    assert "GiB" in str(error.value) and "parallel.memory_budget_gb" in str(error.value)


@pytest.mark.parametrize("parallel, message", [
    ({"devices": 3}, "parallel.devices must divide rounds.clients_per_round=8"),
    ({"devices": 2, "process_id": 2, "num_processes": 2},
     "parallel.process_id must be < parallel.num_processes"),
])
def test_bad_parallel_settings_are_refused_with_the_field(parallel, message):
    with pytest.raises(ConfigError, match=message):
        validate({**RAW, "parallel": parallel})


def test_more_devices_than_there_are_is_refused_before_compiling():
    with pytest.raises(ConfigError, match=r"parallel.devices must be in \[1, 1\]"):
        build_experiment(validate({**RAW, "parallel": {"devices": 2}}))


def test_sharded_runs_and_sweeps_equal_one_device_for_fedavg_scaffold_and_fedbuff(tmp_path):
    out = tmp_path / "diffs.json"
    subprocess.run([sys.executable, str(WORKER), "devices", str(out)], check=True, cwd=ROOT, timeout=600)
    found = json.loads(out.read_text())
    diffs, compiles = found["diffs"], found["compiles"]
    assert len(diffs) == 7 and {k.split()[0] for k in diffs} == {"fedavg", "scaffold", "fedbuff", "epochs",
                                                                 "sweep", "resume"}
    assert max(diffs.values()) < 1e-5, diffs
    # the second block starts from the first's replicated output, and reuses its program
    assert len(compiles) == 6 and set(compiles.values()) == {1}, compiles


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_joined_by_jax_distributed_equal_one_process(tmp_path):
    address = f"127.0.0.1:{_free_port()}"
    workers = [subprocess.Popen([sys.executable, str(WORKER), "process", str(i), "2", address,
                                 str(tmp_path / "two")], cwd=ROOT) for i in range(2)]
    assert [w.wait(timeout=600) for w in workers] == [0, 0]
    run_experiment(validate(RAW), tmp_path / "one", progress=False)
    two, one = read_metrics(tmp_path / "two"), read_metrics(tmp_path / "one")
    assert [r["round"] for r in two] == list(range(5))
    for a, b in zip(one, two):
        assert a.keys() == b.keys()
        np.testing.assert_allclose([a[k] for k in sorted(a)], [b[k] for k in sorted(b)], rtol=1e-5, atol=1e-6)
    assert read_metrics(tmp_path / "two" / ".process_1") == two


@pytest.mark.parametrize("backend, devices, cohort, chunk, expected", [
    ("cpu", 4, 8, None, 4), ("cpu", 4, 6, None, 3), ("cpu", 4, 5, None, 1),
    ("cpu", 4, 8, 4, 2),  # each device's share must be a multiple of the chunk
    ("cpu", 1, 8, None, 1), ("gpu", 4, 8, None, 1)])
def test_auto_devices_split_a_cpu_cohort_over_the_most_devices_that_divide_it(monkeypatch, backend, devices,
                                                                                cohort, chunk, expected):
    from fedjax_lab.experiments import build

    monkeypatch.setattr(build.jax, "devices", lambda *_: [object()] * devices)
    monkeypatch.setattr(build.jax, "default_backend", lambda: backend)
    config = validate({**RAW, "rounds": {**RAW["rounds"], "clients_per_round": cohort, "chunk_size": chunk}})
    assert config.parallel.devices == "auto"  # the default
    assert build.mesh_devices(config, cohort) == expected


USE_CORES = ("from fedjax_lab.engine.sharding import use_cpu_cores; print(use_cpu_cores()); import jax; "
             "print(len(jax.devices())); print(use_cpu_cores())")


@pytest.mark.parametrize("env, printed", [
    ({"FEDJAX_LAB_CPU_DEVICES": "3"}, ["3", "3", "None"]),  # set before JAX started; after, nothing changes
    ({"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}, ["None", "2", "None"]),  # the user's count
])
def test_use_cpu_cores_sets_the_cpu_devices_only_before_jax_starts(env, printed):
    environ = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "FEDJAX_LAB_CPU_DEVICES")}
    out = subprocess.run([sys.executable, "-c", USE_CORES], cwd=ROOT, env={**environ, **env}, text=True,
                         capture_output=True, check=True, timeout=120).stdout
    assert out.split() == printed


def test_the_command_line_splits_the_cohort_over_the_cpu_cores_and_says_so(tmp_path):
    """A run of the CLI in its own process gets one CPU device per core ($FEDJAX_LAB_CPU_DEVICES here) and
    splits its cohort over them by default; it computes what one device computes."""
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps(RAW))  # YAML reads JSON
    env = {**os.environ, "FEDJAX_LAB_CPU_DEVICES": "4"}
    subprocess.run([sys.executable, "-m", "fedjax_lab.experiments.cli", "run", str(config), "--run-dir",
                    str(tmp_path / "four"), "--no-progress"], cwd=ROOT, env=env, check=True, timeout=300,
                   capture_output=True)
    layout = json.loads((tmp_path / "four" / "layout.json").read_text())
    assert layout["devices"].startswith("4 of 4 cpu devices (parallel.devices: auto"), layout
    run_experiment(validate(RAW), tmp_path / "one", progress=False)  # this process: one CPU device
    four, one = read_metrics(tmp_path / "four"), read_metrics(tmp_path / "one")
    assert [r["round"] for r in four] == [r["round"] for r in one] == list(range(5))
    for a, b in zip(one, four):
        np.testing.assert_allclose([a[k] for k in sorted(a)], [b[k] for k in sorted(b)], rtol=1e-5, atol=1e-6)


def test_a_training_array_on_huge_pages_is_an_aligned_read_only_copy():
    array = np.random.RandomState(0).randint(0, 256, (700, 32, 32, 3)).astype(np.uint8)  # 2.1 MB
    copy = sharding.on_huge_pages(array)
    assert copy.dtype == array.dtype and copy.shape == array.shape and np.array_equal(copy, array)
    assert copy.ctypes.data != array.ctypes.data and not copy.flags.writeable
    if hasattr(mmap, "MADV_HUGEPAGE"):  # Linux
        assert copy.ctypes.data % sharding.HUGE_PAGE == 0


def test_a_cpu_device_reads_the_huge_page_copy_of_a_training_array_for_as_long_as_it_lives(monkeypatch):
    monkeypatch.setattr(sharding, "HUGE_PAGE_MIN_BYTES", 4096)
    rows = np.random.RandomState(1).normal(size=(3000, 17)).astype(np.float32)  # 204 kB: onto huge pages
    labels = np.arange(3000, dtype=np.int32) % 7  # 12 kB: as it is
    placed = sharding.place_training_arrays({"x": rows, "y": labels}, None)
    if hasattr(mmap, "MADV_HUGEPAGE"):  # aliased, not copied again (XLA's CPU client takes it as it is)
        assert placed["x"].unsafe_buffer_pointer() % sharding.HUGE_PAGE == 0
    gc.collect()  # only the device array holds the host copy now
    filler = [np.full((1 << 18,), i, np.float32) for i in range(64)]  # 64 MB of other allocations
    np.testing.assert_array_equal(np.asarray(placed["x"]), rows)
    np.testing.assert_array_equal(np.asarray(placed["y"]), labels)
    assert float(jax.jit(lambda x: x.sum())(placed["x"])) == pytest.approx(float(rows.sum(dtype=np.float64)),
                                                                           rel=1e-5)
    del filler
