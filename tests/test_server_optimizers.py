"""Each server optimiser of the FedAvg family against a hand-computed update (Reddi et al. 2021, Alg. 2)."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_lab.engine import Cohort, ServerContext
from fedjax_lab.methods import server_optimizers as so
from fedjax_lab.methods.fedavg import ServerState, apply_server_optimizer, fedavg

X0 = np.array([0.5, -1.0, 2.0], np.float32)
DELTAS = [np.array([0.1, -0.2, 0.3], np.float32), np.array([-0.05, 0.4, 0.0], np.float32),
          np.array([0.2, 0.1, -0.3], np.float32)]


def _run(optimizer):
    state = ServerState(jnp.asarray(X0), optimizer.init(jnp.asarray(X0)), {})
    xs = []
    for delta in DELTAS:
        state = apply_server_optimizer(optimizer, state, jnp.asarray(delta))
        xs.append(np.asarray(state.params))
    return xs


def _reddi_reference(rule, lr, b1, b2, tau):
    x, m, v, xs = X0.astype(np.float64), np.zeros(3), np.full(3, tau**2), []
    for d in DELTAS:
        m = b1 * m + (1 - b1) * d
        if rule == "adagrad":
            v = v + d**2
        elif rule == "yogi":
            v = v - (1 - b2) * d**2 * np.sign(v - d**2)
        else:
            v = b2 * v + (1 - b2) * d**2
        x = x + lr * m / (np.sqrt(v) + tau)
        xs.append(x.copy())
    return xs


def test_fedavg_server_adds_lr_times_mean_delta():
    xs = _run(so.fedavg_server(0.7))
    np.testing.assert_allclose(xs[-1], X0 + 0.7 * sum(DELTAS), rtol=1e-6)


def test_fedavgm_server_is_heavy_ball_on_the_mean_delta():
    lr, beta, x, v = 0.5, 0.9, X0.astype(np.float64), np.zeros(3)
    expected = []
    for d in DELTAS:
        v = beta * v + d
        x = x + lr * v
        expected.append(x.copy())
    np.testing.assert_allclose(_run(so.fedavgm_server(lr, beta)), expected, rtol=1e-5)


@pytest.mark.parametrize("rule", ["adam", "yogi", "adagrad"])
def test_adaptive_servers_match_algorithm_2(rule):
    lr, b1, b2, tau = 0.1, 0.9, 0.99, 1e-2
    np.testing.assert_allclose(_run(so.reddi_server(rule, lr, b1, b2, tau)),
                               _reddi_reference(rule, lr, b1, b2, tau), rtol=1e-5)


def test_server_update_weights_clients_by_examples_or_uniformly():
    deltas = jnp.asarray(np.stack(DELTAS[:2]))
    cohort = Cohort(jnp.array([0, 1]), jnp.array([1, 3]))
    context = ServerContext(None, jnp.int32(0), {})
    for weighting, w in (("num_examples", np.array([0.25, 0.75])), ("uniform", np.array([0.5, 0.5]))):
        algorithm = fedavg(None, optax.sgd(1.0), so.fedavg_server(1.0), None, weighting=weighting)
        state, metrics = algorithm.server_update(algorithm.server_init(jnp.asarray(X0)), {"delta": deltas},
                                                 cohort, context)
        expected = X0 + w[0] * DELTAS[0] + w[1] * DELTAS[1]
        np.testing.assert_allclose(state.params, expected, rtol=1e-6)
        np.testing.assert_allclose(metrics["update_norm"], np.linalg.norm(expected - X0), rtol=1e-5)


def test_fedcog_momentum_variant_matches_its_code_rule():
    import jax.numpy as jnp

    from fedjax_lab.methods.server_optimizers import fedcog_momentum_server

    opt = fedcog_momentum_server(0.1)
    g = {"w": jnp.array([1.0, -2.0])}
    state = opt.init(g)
    first, state = opt.update(g, state)
    np.testing.assert_allclose(first["w"], -g["w"])  # round 0: x - v with v = g
    second, state = opt.update(g, state)
    np.testing.assert_allclose(second["w"], -(0.1 * g["w"] + g["w"]) / 1.1, rtol=1e-6)


def test_asking_the_adaptive_server_for_sgd_points_to_the_plain_fedavg_server():
    from fedjax_lab.methods.server_optimizers import reddi_server

    with pytest.raises(ValueError, match=r"the plain FedAvg server is fedavg_server\(learning_rate\)"):
        reddi_server("sgd", 1.0)
