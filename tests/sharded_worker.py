"""Runs a small config in a fresh process, for the tests of several devices and processes
(``tests/test_scale.py``).

``python tests/sharded_worker.py devices OUT``: with 4 forced host devices, runs FedAvg, SCAFFOLD,
FedBuff and FedAvg with local epochs over clients of unequal size (its cohort balanced over the devices) on
1 and 4 (a client at a time) of them and FedAvg on 2 (the whole share at once), every device reading one
host copy of the training arrays on huge pages, and a sweep of 4 seeds with its members split over 1 and 4,
and writes each run's final parameters' largest difference from the single-device run, and how many
programs each sharded run's two blocks of rounds compiled; and whether a sharded run stopped and resumed from
its checkpoint equals one that was not stopped.
``python tests/sharded_worker.py process I N ADDRESS RUN_DIR``: process ``I`` of ``N`` joined by
``jax.distributed`` at ``ADDRESS``, running :data:`RAW` over every process's device with the runner.
"""

from __future__ import annotations

import json
import os
import sys

RAW = {
    "seed": 2,
    "dataset": {"name": "gaussian_mixture", "num_clients": 16, "examples_per_client": 20, "dimension": 5,
                "num_classes": 3},
    "model": {"name": "mlp", "hidden": [8]},
    "algorithm": {"name": "fedavg"},
    "client": {"optimizer": "sgd", "learning_rate": 0.1, "momentum": 0.9, "batch_size": 5, "local_steps": 4},
    "rounds": {"num_rounds": 4, "clients_per_round": 8},
    "eval": {"every": 2, "per_client": False},
    "checkpoint": {"every_blocks": 1},
}
METHODS = {
    "fedavg": {},
    "scaffold": {"algorithm": {"name": "scaffold"}},
    "fedbuff": {"algorithm": {"name": "fedbuff", "buffer_size": 4}, "asynchrony": {"sigma": 1.0}},
    # local epochs over clients of unequal size: the cohort is reordered to balance the devices
    "epochs": {"dataset": {"name": "synthetic", "alpha": 1.0, "beta": 1.0, "num_clients": 16},
               "model": {"name": "logistic_regression"},
               "client": {**RAW["client"], "local_steps": None, "local_epochs": 1, "batch_size": 50,
                          "learning_rate": 0.01, "momentum": 0.0}},  # Synthetic(1, 1)'s stable rate
}


def _final_params(raw):
    import jax

    from fedjax_lab.experiments.build import build_experiment
    from fedjax_lab.experiments.config import validate

    experiment = build_experiment(validate(raw))
    state = experiment.initial_state()
    for _ in range(2):  # the second block starts from the first's sharded output, as the runner's blocks do
        state, _ = experiment.run_rounds(state, experiment.inputs, num_rounds=2)
    return jax.device_get(experiment.algorithm.model_params(state.server_state)), experiment


def devices(out: str) -> None:
    import jax
    import numpy as np

    from fedjax_lab.engine import sharding

    assert len(jax.devices()) == 4, jax.devices()
    sharding.HUGE_PAGE_MIN_BYTES = 0  # every training array onto huge pages, read by every device
    result, compiles = {}, {}
    for name, change in METHODS.items():
        reference, single = _final_params({**RAW, **change, "parallel": {"devices": 1}})
        assert single.plan.num_devices == 1, single.plan  # (auto would split it over the 4)
        # FedAvg on 2 devices, the whole share at once, and every method on 4, a client at a time
        for num, chunk in ((2, None), (4, 1)) if name == "fedavg" else ((4, 1),):
            raw = {**RAW, **change, "parallel": {"devices": num},
                   "rounds": {**RAW["rounds"], "chunk_size": chunk}}
            params, experiment = _final_params(raw)
            assert experiment.plan.num_devices == num, experiment.plan
            assert experiment.plan.balances == (name == "epochs"), experiment.plan
            # the training arrays are on every device once, not copied there by each call
            assert all(len(x.sharding.device_set) == num for x in jax.tree.leaves(experiment.inputs))
            # ... and the devices read one host copy of them, on huge pages
            for x in experiment.inputs.train_arrays.values():
                pointers = {shard.data.unsafe_buffer_pointer() for shard in x.addressable_shards}
                assert len(pointers) == 1 and pointers.pop() % sharding.HUGE_PAGE == 0, x.addressable_shards
            diff = max(float(np.max(np.abs(a - b))) for a, b in zip(jax.tree.leaves(reference),
                                                                    jax.tree.leaves(params)))
            result[f"{name} devices={num} chunk={chunk}"] = diff
            compiles[f"{name} devices={num} chunk={chunk}"] = experiment.run_rounds._cache_size()
    from fedjax_lab.experiments.config import validate
    from fedjax_lab.experiments.sweep import build_sweep_program, expand

    states = {}
    for num in (1, 4):
        members = expand(validate({**RAW, "parallel": {"devices": num}}), {"seed": [0, 1, 2, 3]})
        program = build_sweep_program(members, 1)
        state = program.run(program.initial_states(), 1)[0]
        state = program.run(state, 1)[0]
        if num > 1:
            compiles[f"sweep devices={num}"] = program._run._cache_size()
        assert len(state.round.sharding.device_set) == num, state.round.sharding  # the members are split
        states[num] = jax.device_get(state.server_state)
    for num in (4,):
        result[f"sweep devices={num}"] = max(float(np.max(np.abs(a - b))) for a, b in zip(
            jax.tree.leaves(states[1]), jax.tree.leaves(states[num])))
    result["resume equals uninterrupted, devices=4"] = _resumed_equals_whole(
        validate({**RAW, "parallel": {"devices": 4}, "rounds": {**RAW["rounds"], "chunk_size": 1}}))
    with open(out, "w") as f:
        json.dump({"diffs": result, "compiles": compiles}, f)


def _resumed_equals_whole(config) -> float:
    """0.0 when a sharded run stopped after round 2 and resumed from its checkpoint writes the metrics of the
    run that was not stopped, byte for byte (its checkpoint restored into the replicated state), else 1.0."""
    import tempfile
    from pathlib import Path

    from fedjax_lab.experiments.runner import run_experiment

    with tempfile.TemporaryDirectory() as work:
        whole, part = Path(work) / "whole", Path(work) / "part"
        run_experiment(config, whole, progress=False)
        run_experiment(config, part, progress=False, stop_after_round=2)
        run_experiment(config, part, resume=True, progress=False)
        same = (part / "metrics.jsonl").read_text() == (whole / "metrics.jsonl").read_text()
    return 0.0 if same else 1.0


def process(index: int, count: int, address: str, run_dir: str) -> None:
    from fedjax_lab.experiments.config import validate
    from fedjax_lab.experiments.runner import run_experiment

    raw = {**RAW, "parallel": {"devices": "all", "coordinator_address": address, "num_processes": count,
                               "process_id": index}}
    run_experiment(validate(raw), run_dir, progress=False)


if __name__ == "__main__":
    if sys.argv[1] == "devices":
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + " --xla_force_host_platform_device_count=4")
        devices(sys.argv[2])
    else:
        process(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
