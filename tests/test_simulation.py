"""The round loop: vmap equals a Python loop, chunking and seeds, cohort sampling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_trees_close, make_inputs

from fedjax_lab.engine import (
    ClientData,
    Cohort,
    CohortPlan,
    ServerContext,
    make_run_rounds,
    randomness,
    simulation,
)
from fedjax_lab.engine.cohort_loop import balanced_order, map_cohort
from fedjax_lab.engine.sampling import sample_cohort
from fedjax_lab.engine.simulation import run_round


def test_vmap_over_clients_equals_python_loop_over_clients(tiny_run):
    algorithm, plan, state, inputs = tiny_run
    new_state, _ = jax.jit(lambda s: run_round(algorithm, plan, s, inputs))(state)

    ids = sample_cohort(randomness.round_key(inputs.key, 0, randomness.Purpose.COHORT), plan.num_clients,
                        plan.cohort_size)
    update = jax.jit(algorithm.client_update)
    messages = []
    for i in np.asarray(ids):
        client = ClientData(jnp.int32(i), inputs.client_example_ids[i], inputs.client_num_examples[i])
        message, _, _ = update(state.server_state, (), client, inputs.train_arrays,
                               randomness.client_key(inputs.key, jnp.int32(0), jnp.int32(i)))
        messages.append(message)
    stacked = jax.tree.map(lambda *m: jnp.stack(m), *messages)
    context = ServerContext(randomness.round_key(inputs.key, 0, randomness.Purpose.SERVER), jnp.int32(0), {})
    expected, _ = algorithm.server_update(state.server_state, stacked,
                                          Cohort(ids, inputs.client_num_examples[ids]), context)
    assert_trees_close(new_state.server_state, expected)
    assert int(new_state.round) == 1


@pytest.mark.parametrize("chunk_size", [1, 2, 3])
def test_chunk_size_does_not_change_results(tiny_run, chunk_size):
    algorithm, plan, state, inputs = tiny_run
    whole, m_whole = make_run_rounds(algorithm, plan)(state, inputs, num_rounds=3)
    chunked_plan = CohortPlan(plan.num_clients, plan.cohort_size, chunk_size)
    chunked, m_chunked = make_run_rounds(algorithm, chunked_plan)(state, inputs, num_rounds=3)
    assert_trees_close(whole.server_state, chunked.server_state)
    np.testing.assert_allclose(m_whole["train_loss"], m_chunked["train_loss"], rtol=1e-5)


def test_same_seed_gives_same_result_and_another_seed_differs(tiny_run, tiny_data):
    algorithm, plan, state, inputs = tiny_run
    run = make_run_rounds(algorithm, plan)
    a, _ = run(state, inputs, num_rounds=2)
    b, _ = run(state, make_inputs(tiny_data, seed=0), num_rounds=2)
    c, _ = run(state, make_inputs(tiny_data, seed=1), num_rounds=2)
    assert all(jax.tree.leaves(jax.tree.map(lambda x, y: bool(jnp.array_equal(x, y)), a, b)))
    assert not np.allclose(a.server_state.params["params"]["output"]["kernel"],
                           c.server_state.params["params"]["output"]["kernel"])


def test_two_blocks_equal_one_block_of_the_same_rounds(tiny_run):
    algorithm, plan, state, inputs = tiny_run
    run = make_run_rounds(algorithm, plan)
    once, m_once = run(state, inputs, num_rounds=4)
    half, m1 = run(state, inputs, num_rounds=2)
    twice, m2 = run(half, inputs, num_rounds=2)
    assert_trees_close(once.server_state, twice.server_state)
    np.testing.assert_allclose(m_once["train_loss"], np.concatenate([m1["train_loss"], m2["train_loss"]]),
                               rtol=1e-6)


def _longest_first(work, devices, chunk):
    """An independent balanced order: sort heaviest first, cut into chunks, give each chunk (heaviest first)
    to the least-loaded device with room, the first such device on ties. Returns (order, each device's
    load)."""
    ranked = sorted(range(len(work)), key=lambda i: (-work[i], i))
    chunks = [ranked[j:j + chunk] for j in range(0, len(ranked), chunk)]
    per_device = len(chunks) // devices
    shares, loads = [[] for _ in range(devices)], [0.0] * devices
    for members in chunks:
        device = min((d for d in range(devices) if len(shares[d]) < per_device), key=lambda d: (loads[d], d))
        shares[device].append(members)
        loads[device] += chunk * work[members[0]]
    return [i for share in shares for members in share for i in members], loads


def _device_loads(work, order, devices, chunk):
    """Each device's work when ``work[order]`` is split into equal shares processed ``chunk`` at a time (a
    chunk takes its heaviest client's work)."""
    w = np.asarray(work)[np.asarray(order)].reshape(devices, -1, chunk)
    return (chunk * w.max(axis=2)).sum(axis=1)


@pytest.mark.parametrize("size, devices, chunk", [(10, 2, 1), (12, 2, 3), (12, 3, 2), (8, 1, 2), (20, 4, 5)])
def test_balanced_order_is_longest_processing_time_first_over_chunks(size, devices, chunk):
    rng = np.random.default_rng(size + devices + chunk)
    for _ in range(5):
        work = rng.integers(1, 30, size)
        order = np.asarray(balanced_order(jnp.asarray(work), num_devices=devices, chunk_size=chunk))
        assert sorted(order.tolist()) == list(range(size))
        expected, loads = _longest_first(work.tolist(), devices, chunk)
        np.testing.assert_array_equal(work[order], work[expected])  # equal up to ties between equal work
        np.testing.assert_allclose(_device_loads(work, order, devices, chunk), loads)


def test_balanced_order_evens_out_the_devices_and_packs_similar_clients_into_chunks():
    work = np.array([9, 8, 1, 1, 1, 1, 1, 1])  # drawn in this order, device 0 would take 19 and device 1 4
    assert _device_loads(work, range(8), 2, 1).tolist() == [19, 4]
    order = balanced_order(jnp.asarray(work), num_devices=2, chunk_size=1)
    assert sorted(_device_loads(work, order, 2, 1).tolist()) == [11, 12]  # the best split of 23 in 4 + 4
    work = np.array([1, 10, 1, 10, 1, 10])  # one device, chunks of 2: drawn, each chunk pads a 1 to 10 steps
    assert _device_loads(work, range(6), 1, 2).tolist() == [60]
    order = balanced_order(jnp.asarray(work), num_devices=1, chunk_size=2)
    assert work[np.asarray(order)].tolist() == [10, 10, 10, 1, 1, 1]  # chunks (10, 10), (10, 1), (1, 1)
    assert _device_loads(work, order, 1, 2).tolist() == [42]


class _Split:
    """A stand-in for a mesh of ``n`` devices: a plan reads only its shape."""

    def __init__(self, n):
        self.shape = {"clients": n}


@pytest.mark.parametrize("devices, chunk, balances", [(1, None, False), (1, 1, False), (1, 2, True),
                                                      (1, 6, False), (2, 1, True), (2, None, True)])
def test_a_plan_reorders_its_cohort_only_where_the_order_can_change_the_work(devices, chunk, balances):
    plan = CohortPlan(24, 6 * devices, chunk, mesh=_Split(devices) if devices > 1 else None,
                      cohort_order="balanced")
    assert plan.balances is balances
    assert not CohortPlan(12, 6, 2, cohort_order="sampled").balances
    assert not CohortPlan(12, 6, 2, buffer_size=2, cohort_order="balanced").balances  # asynchronous
    with pytest.raises(ValueError, match="cohort_order must be 'sampled' or 'balanced'"):
        CohortPlan(12, 6, cohort_order="sorted")


@pytest.mark.parametrize("chunk_size", [2, 3])
def test_a_balanced_cohort_trains_reordered_and_the_server_sees_the_order_drawn(tiny_run, chunk_size,
                                                                               monkeypatch):
    algorithm, plan, state, inputs = tiny_run  # local epochs over clients of 3 to 27 examples
    fedavg_server_update, trained = algorithm.server_update, []

    def server_update(server_state, messages, cohort, context):  # also reports the order it received
        new_state, metrics = fedavg_server_update(server_state, messages, cohort, context)
        return new_state, {**metrics, "ids": cohort.client_ids}

    def recording_map_cohort(fn, chunk, client_states, clients, *rest, **kwargs):  # the order trained in
        jax.debug.callback(lambda ids: trained.append(np.asarray(ids)), clients.client_id, ordered=True)
        return map_cohort(fn, chunk, client_states, clients, *rest, **kwargs)

    monkeypatch.setattr(simulation, "map_cohort", recording_map_cohort)
    algorithm = algorithm._replace(server_update=server_update, reduce=None)  # the stacked messages
    sampled, m_sampled = make_run_rounds(algorithm, CohortPlan(plan.num_clients, 6, chunk_size))(
        state, inputs, num_rounds=3)
    balanced_plan = CohortPlan(plan.num_clients, 6, chunk_size, cohort_order="balanced")
    assert balanced_plan.balances
    balanced, m_balanced = make_run_rounds(algorithm, balanced_plan)(state, inputs, num_rounds=3)
    assert_trees_close(sampled.server_state, balanced.server_state)
    assert_trees_close(sampled.client_states, balanced.client_states)
    np.testing.assert_allclose(m_sampled["train_loss"], m_balanced["train_loss"], rtol=1e-5)
    assert len(trained) == 6
    for r in range(3):
        key = randomness.round_key(inputs.key, r, randomness.Purpose.COHORT)
        ids = sample_cohort(key, plan.num_clients, 6)
        order = balanced_order(inputs.client_num_examples[ids], num_devices=1, chunk_size=chunk_size)
        assert np.asarray(order).tolist() != list(range(6))  # another order than the one drawn
        np.testing.assert_array_equal(trained[r], ids)
        np.testing.assert_array_equal(trained[3 + r], ids[order])
        np.testing.assert_array_equal(m_sampled["ids"][r], ids)
        np.testing.assert_array_equal(m_balanced["ids"][r], ids)


def test_cohort_is_distinct_deterministic_and_covers_population():
    key = randomness.round_key(randomness.base_key(0), 7, randomness.Purpose.COHORT)
    ids = np.asarray(sample_cohort(key, 50, 20))
    assert len(set(ids.tolist())) == 20 and ids.min() >= 0 and ids.max() < 50
    assert np.array_equal(ids, np.asarray(sample_cohort(key, 50, 20)))
    counts = np.zeros(50)
    for r in range(200):
        counts[np.asarray(sample_cohort(randomness.round_key(randomness.base_key(0), r,
                                                             randomness.Purpose.COHORT), 50, 20))] += 1
    assert counts.min() > 50 and counts.max() < 110  # each client expected 80 times


def test_cohort_plan_rejects_cohort_larger_than_population():
    with pytest.raises(ValueError, match="cohort_size must be in"):
        CohortPlan(num_clients=5, cohort_size=6)
    with pytest.raises(ValueError, match="chunk_size must divide"):
        CohortPlan(num_clients=10, cohort_size=6, chunk_size=4)


def test_a_build_traces_the_clients_training_once_for_all_its_blocks_and_computes_the_same(monkeypatch):
    """The build's message shapes, a block of 2 rounds and one of 1 (a streamed, chunked cohort) trace the
    local training once between them, and run exactly what rounds tracing it afresh each time run."""
    import fedjax_lab.engine.round as round_module
    from fedjax_lab.engine.simulation import client_update_of
    from fedjax_lab.experiments import build_experiment, load_config

    traces = []
    train_locally = round_module.train_locally
    monkeypatch.setattr(round_module, "train_locally",
                        lambda *args, **kwargs: traces.append(1) or train_locally(*args, **kwargs))
    experiment = build_experiment(load_config("configs/synthetic_fedavg.yaml", [
        "rounds.clients_per_round=10", "rounds.chunk_size=5", "client.local_epochs=1"]))
    assert experiment.plan.streams(experiment.algorithm)
    state, first = experiment.run_rounds(experiment.initial_state(), experiment.inputs, num_rounds=2)
    state, second = experiment.run_rounds(state, experiment.inputs, num_rounds=1)
    assert len(traces) == 1

    afresh = make_run_rounds(experiment.algorithm_at, experiment.plan,
                             client_update=client_update_of(experiment.algorithm_at))
    expected, expected_first = afresh(experiment.initial_state(), experiment.inputs, num_rounds=2)
    expected, expected_second = afresh(expected, experiment.inputs, num_rounds=1)
    assert len(traces) == 1 + 2  # each block traced afresh
    for got, want in ((state, expected), (first, expected_first), (second, expected_second)):
        jax.tree.map(np.testing.assert_array_equal, got, want)
