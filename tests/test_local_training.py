"""Local training: the FedAvg/GD identity, epoch semantics, masking of clients that finished early."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from conftest import assert_trees_close, make_fedavg, make_inputs

from fedjax_lab.data import FederatedDataset, index_table
from fedjax_lab.engine import CohortPlan, LocalSchedule, init_loop_state, make_run_rounds, train_locally
from fedjax_lab.engine.cohort_loop import CHUNK
from fedjax_lab.engine.local_training import LocalHooks, batch_slots, epoch_permutations
from fedjax_lab.engine.types import ClientData
from fedjax_lab.models import Classifier, LogisticRegression, cross_entropy_loss


def _one_client_dataset(n=37, dim=4, classes=3, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.normal(size=(n, dim)).astype(np.float32)
    y = rng.randint(classes, size=n).astype(np.int32)
    ids, counts = index_table([np.arange(n)])
    return FederatedDataset("one", {"x": x, "y": y}, {"x": x, "y": y}, ids, counts, classes)


def test_fedavg_with_one_client_and_full_batch_equals_centralised_gradient_descent():
    data = _one_client_dataset()
    clf = Classifier(LogisticRegression(data.num_classes), data.input_shape)
    loss = cross_entropy_loss(clf.predict)
    lr, steps, rounds = 0.5, 3, 4
    algorithm = make_fedavg(clf, LocalSchedule(batch_size=37, local_steps=steps), client_lr=lr)
    params = clf.init(jax.random.key(1))
    state = init_loop_state(algorithm, params, 1)
    state, _ = make_run_rounds(algorithm, CohortPlan(1, 1))(state, make_inputs(data), num_rounds=rounds)

    batch = {"x": jnp.asarray(data.train["x"]), "y": jnp.asarray(data.train["y"]), "mask": jnp.ones(37)}
    expected = params
    for _ in range(rounds * steps):
        grads = jax.grad(loss, has_aux=True)(expected, batch, None)[0]
        expected = jax.tree.map(lambda p, g: p - lr * g, expected, grads)
    assert_trees_close(state.server_state.params, expected, rtol=1e-5, atol=1e-6)


def test_each_epoch_reads_every_example_exactly_once():
    n, max_n, batch, epochs = 23, 30, 5, 3
    schedule = LocalSchedule(batch, local_epochs=epochs)
    perms = epoch_permutations(jax.random.key(4), jnp.int32(n), max_n, epochs)
    steps = int(schedule.client_steps(jnp.int32(n)))
    assert steps == epochs * 5
    seen = [[] for _ in range(epochs)]
    for s in range(steps):
        slots, mask = batch_slots(schedule, perms, jnp.int32(s), jnp.int32(n))
        seen[s // 5].extend(np.asarray(slots)[np.asarray(mask)].tolist())
    for e in range(epochs):
        assert sorted(seen[e]) == list(range(n))
    assert seen[0] != seen[1], "each epoch must be shuffled afresh"


def test_local_steps_cycle_through_epochs_when_client_is_small():
    n, batch, steps = 7, 3, 8  # 3 batches per epoch (3, 3, 1 examples): 8 steps span 3 epochs
    schedule = LocalSchedule(batch, local_steps=steps, min_examples=n)
    assert schedule.num_epochs() == 3
    perms = epoch_permutations(jax.random.key(0), jnp.int32(n), 10, schedule.num_epochs())
    sizes = [int(batch_slots(schedule, perms, jnp.int32(s), jnp.int32(n))[1].sum()) for s in range(steps)]
    assert sizes == [3, 3, 1, 3, 3, 1, 3, 3]


def test_vmapped_client_that_finishes_early_matches_it_trained_alone():
    rng = np.random.RandomState(0)
    x = rng.normal(size=(40, 4)).astype(np.float32)
    y = rng.randint(3, size=40).astype(np.int32)
    ids, counts = index_table([np.arange(0, 6), np.arange(6, 40)])
    clf = Classifier(LogisticRegression(3), (4,))
    loss = cross_entropy_loss(clf.predict)
    schedule = LocalSchedule(4, local_epochs=2)
    params = clf.init(jax.random.key(0))
    arrays = {"x": jnp.asarray(x), "y": jnp.asarray(y)}
    keys = jax.random.split(jax.random.key(1), 2)
    clients = ClientData(jnp.arange(2), jnp.asarray(ids), jnp.asarray(counts))

    def train(client, key):
        return train_locally(params, loss, optax.sgd(0.3), client, arrays, key, schedule)

    together, stats = jax.vmap(train)(clients, keys)
    alone, alone_stats = train(jax.tree.map(lambda a: a[0], clients), keys[0])
    assert stats.num_steps.tolist() == [4, 18]
    assert_trees_close(jax.tree.map(lambda a: a[0], together), alone)
    np.testing.assert_allclose(stats.mean_loss[0], alone_stats.mean_loss, rtol=1e-6)


def _first(size, tree):
    return jax.tree.map(lambda a: a[:size], tree)


def test_stacked_step_outputs_skip_the_steps_past_a_chunks_longest_client_and_equal_the_masked_scan():
    """Per-step outputs (BHerd's) need a scan of the population's most steps. Vmapped over a named chunk
    (``cohort_loop.CHUNK``), steps past the chunk's longest client go under a cond whose predicate is not
    batched, so they are skipped at run time; the outputs and the trained variables equal the masked scan's
    (an unnamed vmap, which cannot tell) bit for bit, zeros past each client's own steps included."""
    rng = np.random.RandomState(0)
    x = rng.normal(size=(60, 4)).astype(np.float32)
    y = rng.randint(3, size=60).astype(np.int32)
    ids, counts = index_table([np.arange(0, 6), np.arange(6, 20), np.arange(20, 60)])  # 2, 4 and 10 steps
    clf = Classifier(LogisticRegression(3), (4,))
    loss = cross_entropy_loss(clf.predict)
    schedule = LocalSchedule(4, local_epochs=1)
    params = clf.init(jax.random.key(0))
    arrays = {"x": jnp.asarray(x), "y": jnp.asarray(y)}
    hooks = LocalHooks(step_output=lambda record: jax.tree.map(lambda g: 2.0 * g, record.grads))
    keys = jax.random.split(jax.random.key(1), 3)
    clients = ClientData(jnp.arange(3), jnp.asarray(ids), jnp.asarray(counts), data_key=keys)

    def train(client, key):
        return train_locally(params, loss, optax.sgd(0.3), client, arrays, key, schedule, hooks)

    masked = jax.jit(jax.vmap(train))(clients, keys)
    for size in (2, 3):  # the chunk's longest client: 4 steps of the scan's 10, then all 10
        skipped = jax.jit(jax.vmap(train, axis_name=CHUNK))(*_first(size, (clients, keys)))
        equal = jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b, equal_nan=True)), _first(size, masked),
                             skipped)
        assert jax.tree.all(equal)
    assert masked[1].num_steps.tolist() == [2, 4, 10]
    kernel = masked[1].step_outputs["output"]["kernel"]  # [client, step, ...]
    assert not np.any(kernel[0, 2:]) and np.all(np.any(kernel[2] != 0, axis=(1, 2)))

    jaxpr = str(jax.make_jaxpr(jax.vmap(train, axis_name=CHUNK))(clients, keys))
    assert "pmax" in jaxpr and "cond[" in jaxpr
