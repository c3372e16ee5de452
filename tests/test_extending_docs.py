"""The examples in docs/extending.md run, and do what the text says."""

import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_lab.engine import CohortPlan, RoundInputs, init_loop_state, make_run_rounds, randomness
from fedjax_lab.models import cross_entropy_loss

DOC = pathlib.Path(__file__).parent.parent / "docs" / "extending.md"


def _doc_namespace(loss_fn):
    namespace = {"loss_fn": loss_fn}
    for block in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL):
        exec(block, namespace)
    return namespace


def test_fedsgd_example_takes_one_gradient_step_per_round(tiny_data, tiny_classifier):
    loss_fn = cross_entropy_loss(tiny_classifier.predict)
    ns = _doc_namespace(loss_fn)
    algorithm = ns["fedsgd"](loss_fn, server_learning_rate=0.5, batch_size=64)
    n = tiny_data.num_clients
    params = tiny_classifier.init(jax.random.key(0))
    inputs = RoundInputs(randomness.base_key(0), jax.device_put(tiny_data.train),
                         jnp.asarray(tiny_data.client_train_ids), jnp.asarray(tiny_data.client_train_counts), {})
    state, _ = make_run_rounds(algorithm, CohortPlan(n, n))(init_loop_state(algorithm, params, n), inputs, 1)
    # batch 64 > every client's size, and all clients take part: one full-batch gradient step on all the data.
    batch = {"x": jnp.asarray(tiny_data.train["x"]), "y": jnp.asarray(tiny_data.train["y"]),
             "mask": jnp.ones(len(tiny_data.train["y"]))}
    expected = jax.tree.map(lambda p, g: p - 0.5 * g, params, jax.grad(loss_fn, has_aux=True)(params, batch, None)[0])
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), state.server_state, expected)


def test_server_step_plugin_moves_the_model_towards_the_server_data(tiny_data, tiny_classifier):
    loss_fn = cross_entropy_loss(tiny_classifier.predict)
    ns = _doc_namespace(loss_fn)
    walked = ns["walked"]
    server = {"x": jnp.asarray(tiny_data.test["x"]), "y": jnp.asarray(tiny_data.test["y"])}
    inputs = RoundInputs(randomness.base_key(0), jax.device_put(tiny_data.train),
                         jnp.asarray(tiny_data.client_train_ids), jnp.asarray(tiny_data.client_train_counts), server)
    state = init_loop_state(walked, tiny_classifier.init(jax.random.key(0)), tiny_data.num_clients)
    state, metrics = make_run_rounds(walked, CohortPlan(tiny_data.num_clients, 4))(state, inputs, num_rounds=30)
    assert np.all(np.isfinite(metrics["server_loss"]))
    assert metrics["server_loss"][-5:].mean() < metrics["server_loss"][:5].mean()
