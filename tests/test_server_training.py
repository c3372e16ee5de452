"""The one server-side training loop (Fed+FT, FedDF, FedWalk's leash and Feddle's head all run it) against a
NumPy loop: each step's batch drawn without replacement with the step's folded key, plain SGD, the model state
carried."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_lab.engine.server_training import sample_server_batch, train_on_server_batches


def test_server_training_equals_a_numpy_loop_over_the_same_batches():
    rng = np.random.default_rng(0)
    arrays = {"x": jnp.asarray(rng.normal(size=(20, 3)), jnp.float32), "y": jnp.zeros(20, jnp.int32)}
    draw, key, steps, rate = sample_server_batch(5), jax.random.key(3), 4, 0.1

    # mean squared distance to the batch's rows; the state counts the steps
    def loss(w, count, batch, step_key):
        return jnp.mean(jnp.sum(jnp.square(batch["x"] - w), -1)), count + 1

    w, count = train_on_server_batches(loss, jnp.zeros(3), jnp.int32(0), draw=draw, arrays=arrays, key=key,
                                       steps=steps, optimizer=optax.sgd(rate))
    expected = np.zeros(3)
    for s in range(steps):
        rows = np.asarray(draw(arrays, jax.random.fold_in(key, s))["x"])
        assert len(rows) == 5 and len({tuple(r) for r in rows}) == 5  # without replacement
        expected -= rate * 2 * (expected - rows).mean(0)
    np.testing.assert_allclose(np.asarray(w), expected, rtol=1e-5)
    assert int(count) == steps
    assert len(draw({"x": arrays["x"][:3], "y": arrays["y"][:3]}, key)["x"]) == 3  # all rows when fewer
