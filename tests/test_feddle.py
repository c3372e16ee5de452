"""Feddle's merge: the fallback is FedBuff, the chain-rule coefficient gradient is the true one, the atlas's
insertion and eviction rules, and a run in the asynchronous loop."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
from conftest import assert_trees_close, make_inputs

from fedjax_lab.engine import CohortPlan, LocalSchedule, init_loop_state, make_run_rounds
from fedjax_lab.engine.asynchrony import DelayModel
from fedjax_lab.methods.fedavg import fedavg
from fedjax_lab.methods.feddle import (
    Atlas,
    coefficient_gradient,
    coefficient_search,
    init_atlas,
    insert,
    masked_median,
    sample_server_batch,
)
from fedjax_lab.methods.server_optimizers import fedavg_server


def _feddle(classifier, steps=5, **kwargs):
    component = coefficient_search(classifier.loss, sample_server_batch(16), kwargs.pop("atlas_size", 8),
                                   steps, kwargs.pop("learning_rate", 0.01), **kwargs)
    return fedavg(classifier.loss, optax.sgd(0.1), fedavg_server(1.0), LocalSchedule(4, local_steps=3),
                  component, weighting="uniform")


def _inputs(data, seed=0):
    inputs = make_inputs(data, seed)
    rows = np.arange(0, len(data.train["y"]), 3)
    return inputs._replace(server_arrays={"x": jnp.asarray(data.train["x"][rows]),
                                          "y": jnp.asarray(data.train["y"][rows])})


def _run(algorithm, plan, data, classifier, rounds):
    inputs = _inputs(data)
    state = init_loop_state(algorithm, classifier.init(jax.random.key(0)), data.num_clients, plan, inputs)
    return make_run_rounds(algorithm, plan)(state, inputs, num_rounds=rounds)


def test_feddle_with_coefficients_fixed_at_the_fallback_equals_fedbuff(tiny_data, tiny_classifier):
    fedbuff = fedavg(tiny_classifier.loss, optax.sgd(0.1), fedavg_server(0.5),
                     LocalSchedule(4, local_steps=3), weighting="uniform")
    expected, _ = _run(fedbuff, CohortPlan(tiny_data.num_clients, 4, buffer_size=4), tiny_data,
                       tiny_classifier, 3)
    got, metrics = _run(_feddle(tiny_classifier, steps=0, fallback_rate=0.5),
                        CohortPlan(tiny_data.num_clients, 4, delay=DelayModel("zero")), tiny_data,
                        tiny_classifier, 3)
    assert_trees_close(expected.server_state.params, got.server_state.params, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(metrics["feddle_atlas_size"], [4, 8, 8])


def test_the_chain_rule_coefficient_gradient_equals_jax_grad_through_the_merge(tiny_classifier, tiny_data):
    variables = tiny_classifier.init(jax.random.key(0))
    params = variables["params"]
    anchors = jax.tree.map(lambda p: jax.random.normal(jax.random.key(1), (3,) + p.shape) * 0.1, params)
    batch = {"x": jnp.asarray(tiny_data.train["x"][:20]), "y": jnp.asarray(tiny_data.train["y"][:20]),
             "mask": jnp.ones(20)}

    def loss(p):
        return tiny_classifier.loss({**variables, "params": p}, batch, jax.random.key(2))[0]

    c = jnp.array([0.3, -0.7, 1.2])
    value, chain = coefficient_gradient(loss, params, anchors, c)
    merged = lambda c: loss(jax.tree.map(lambda p, a: p + jnp.tensordot(c, a, 1), params, anchors))
    np.testing.assert_allclose(chain, jax.grad(merged)(c), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(value, merged(c), rtol=1e-6)


def _full_atlas():
    """Four searched anchors with importances 0.5, 0.1, 0.9, 0.3."""
    return Atlas({"w": jnp.arange(8.0).reshape(4, 2) + 1}, jnp.ones(4, bool), jnp.array([0.5, 0.1, 0.9, 0.3]),
                 jnp.arange(4))


def test_two_arrivals_into_a_full_atlas_evict_the_two_least_important_anchors():
    atlas, filled = insert(_full_atlas(), {"w": jnp.array([[10.0, 10.0], [20.0, 20.0]])},
                           jnp.array([True, True]), jnp.int32(10))
    np.testing.assert_array_equal(filled, [False, True, False, True])  # |c| = 0.1 and 0.3 go, one each
    np.testing.assert_allclose(np.asarray(atlas.anchors["w"])[[1, 3]], [[10, 10], [20, 20]])
    assert np.all(np.isinf(np.asarray(atlas.scores)[[1, 3]]))  # protected until searched


def test_more_arrivals_than_slots_in_one_round_keep_the_latest():
    updates = {"w": jnp.arange(1.0, 13.0).reshape(6, 2)}
    atlas, filled = insert(_full_atlas(), updates, jnp.ones(6, bool), jnp.int32(10))
    assert bool(jnp.all(filled))
    np.testing.assert_allclose(np.sort(atlas.anchors["w"][:, 0]), [5, 7, 9, 11])


def test_the_server_sees_a_rounds_arrivals_in_arrival_order_so_the_atlas_keeps_the_newest():
    # Four jobs arrive in round 9, held in store slots out of arrival order: dispatched in rounds 7, 5, 7, 8
    # at cohort positions 1, 0, 0, 2. The server must see them as (5, 0), (7, 0), (7, 1), (8, 2), and a
    # two-slot atlas then keeps the last two: the jobs of round 7 position 1 and round 8.
    from fedjax_lab.engine.asynchrony import InFlight, _step_on_arrivals
    from fedjax_lab.engine.types import ServerContext

    store = InFlight({"delta": {"w": jnp.array([[1.0, 0], [2, 0], [3, 0], [4, 0], [5, 0]])}},
                     jnp.array([10, 11, 12, 13, 14]), jnp.ones(5, jnp.int32), jnp.array([7, 5, 7, 8, 9]),
                     jnp.array([9, 9, 9, 9, 12]), jnp.array([1, 0, 0, 2, 0]), jnp.ones(5, bool))
    arrived = store.arrival_round == 9
    seen = {}

    def server_update(state, messages, cohort, context):
        seen.update(ids=cohort.client_ids, mask=cohort.mask, staleness=cohort.staleness)
        atlas, _ = insert(init_atlas({"w": jnp.zeros(2)}, 2), messages["delta"], cohort.mask, jnp.int32(0))
        return atlas, {}

    algorithm = types.SimpleNamespace(server_update=server_update)
    atlas, _ = _step_on_arrivals(algorithm, init_atlas({"w": jnp.zeros(2)}, 2), store, arrived,
                                 9 - store.dispatch_round, ServerContext(jax.random.key(0), jnp.int32(9), {}),
                                 3)
    np.testing.assert_array_equal(seen["ids"][:4], [11, 12, 10, 13])
    np.testing.assert_array_equal(seen["mask"], [True, True, True, True, False])
    np.testing.assert_array_equal(seen["staleness"][:4], [4, 2, 2, 1])
    np.testing.assert_allclose(np.sort(np.asarray(atlas.anchors["w"])[:, 0]), [1, 4])


def test_a_zero_norm_update_never_enters_the_atlas(tiny_data, tiny_classifier):
    atlas, _filled = insert(init_atlas({"w": jnp.zeros(2)}, 3), {"w": jnp.array([[0.0, 0.0], [1.0, 0.0]])},
                           jnp.array([False, True]), jnp.int32(0))
    np.testing.assert_array_equal(atlas.valid, [True, False, False])
    np.testing.assert_allclose(atlas.anchors["w"][0], [1, 0])
    # In the loop: clients with no steps (lr 0) send zero updates; the model stays finite and does not move.
    frozen = fedavg(tiny_classifier.loss, optax.sgd(0.0), fedavg_server(1.0), LocalSchedule(4, local_steps=3),
                    coefficient_search(tiny_classifier.loss, sample_server_batch(16), 4, 3, 0.01),
                    weighting="uniform")
    state, metrics = _run(frozen, CohortPlan(tiny_data.num_clients, 3, delay=DelayModel("zero")), tiny_data,
                          tiny_classifier, 2)
    np.testing.assert_array_equal(metrics["feddle_atlas_size"], 0)
    assert_trees_close(state.server_state.params, tiny_classifier.init(jax.random.key(0)))


def test_masked_median_is_numpys():
    values = jnp.array([4.0, 1.0, 3.0, 100.0, 2.0])
    np.testing.assert_allclose(masked_median(values, jnp.array([True, True, True, False, True])), 2.5)
    np.testing.assert_allclose(masked_median(values, jnp.array([True, True, True, False, False])), 3.0)


def test_feddle_learns_in_the_asynchronous_loop_and_finds_negative_coefficients(tiny_data, tiny_classifier):
    plan = CohortPlan(tiny_data.num_clients, 3, delay=DelayModel("half_normal", sigma=2.0))
    state, metrics = _run(_feddle(tiny_classifier, steps=10, learning_rate=0.05, atlas_size=4), plan,
                          tiny_data, tiny_classifier, 12)
    atlas = state.server_state.components["feddle"].atlas
    # every anchor was searched
    assert bool(jnp.all(atlas.valid)) and bool(jnp.all(jnp.isfinite(atlas.scores)))
    np.testing.assert_allclose(atlas.scores, np.abs(metrics["feddle_coefficients"][-1]), rtol=1e-6)
    assert np.any(metrics["feddle_negative_fraction"] > 0)
    assert np.all(np.isfinite(metrics["feddle_search_loss_end"]))
    searched = metrics["feddle_atlas_size"] > 0
    assert np.mean(metrics["feddle_search_loss_end"][searched]
                   <= metrics["feddle_search_loss_start"][searched]) > 0.7
    assert metrics["feddle_coefficients"].shape == (12, 4)


def test_the_out_of_domain_head_trains_on_the_server_but_never_reaches_the_global_model(tiny_data,
                                                                                        tiny_classifier):
    from fedjax_lab.models.surrogate import FeatureHeadTask

    surrogate = FeatureHeadTask(tiny_classifier, 2)
    component = coefficient_search(tiny_classifier.loss, sample_server_batch(16), 6, 5, 0.05,
                                   regularization=0.01, surrogate=surrogate, head_steps=5,
                                   head_learning_rate=0.05, head_key=jax.random.key(3))
    algorithm = fedavg(tiny_classifier.loss, optax.sgd(0.1), fedavg_server(1.0),
                       LocalSchedule(4, local_steps=3), component, weighting="uniform")
    inputs = _inputs(tiny_data)
    # other labels
    inputs = inputs._replace(server_arrays={**inputs.server_arrays, "y": inputs.server_arrays["y"] % 2})
    plan = CohortPlan(tiny_data.num_clients, 3, delay=DelayModel("zero"))
    w0 = tiny_classifier.init(jax.random.key(0))
    state = init_loop_state(algorithm, w0, tiny_data.num_clients, plan, inputs)
    head0 = state.server_state.components["feddle"].head
    state, metrics = make_run_rounds(algorithm, plan)(state, inputs, num_rounds=3)
    assert jax.tree.structure(state.server_state.params) == jax.tree.structure(w0)
    head = state.server_state.components["feddle"].head
    assert not np.allclose(jax.tree.leaves(head)[0], jax.tree.leaves(head0)[0])
    assert np.all(np.isfinite(metrics["feddle_search_loss_end"]))
    # The coefficients were applied to the whole anchors: the task's own output layer moved too.
    assert not np.allclose(state.server_state.params["params"]["output"]["kernel"],
                           w0["params"]["output"]["kernel"])


def test_the_probe_cosine_is_one_when_the_probe_is_the_search_loss_itself(tiny_data, tiny_classifier):
    server = _inputs(tiny_data).server_arrays
    n = int(server["y"].shape[0])
    # batches of every row: the search's loss is fixed
    whole = {**server, "mask": jnp.ones((n,), jnp.float32)}
    probe = lambda variables, key: tiny_classifier.loss(variables, whole, key)[0]
    component = coefficient_search(tiny_classifier.loss, sample_server_batch(n), 6, 3, 0.05, probe=probe)
    algorithm = fedavg(tiny_classifier.loss, optax.sgd(0.1), fedavg_server(1.0),
                       LocalSchedule(4, local_steps=3), component, weighting="uniform")
    _, metrics = _run(algorithm, CohortPlan(tiny_data.num_clients, 3, delay=DelayModel("zero")), tiny_data,
                      tiny_classifier, 3)
    np.testing.assert_allclose(metrics["feddle_probe_cosine"], 1.0, rtol=1e-4)
