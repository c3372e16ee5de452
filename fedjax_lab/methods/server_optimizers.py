"""Server optimisers of the FedAvg family (Reddi et al., "Adaptive Federated Optimization", ICLR 2021).

The server treats the negated mean client delta ``-Delta_t`` as a gradient and feeds it to an optax
optimiser, so FedAvg, FedAvgM, FedAdam, FedYogi and FedAdagrad differ only in that optimiser.

The adaptive ones follow the paper's Algorithm 2 exactly, which differs from ``optax.adam`` and friends:
no bias correction, ``tau`` added outside the square root, and ``v_{-1} = tau^2``::

    m_t = b1 m_{t-1} + (1 - b1) Delta_t
    v_t = v_{t-1} + Delta_t^2                                   (FedAdagrad)
    v_t = v_{t-1} - (1 - b2) Delta_t^2 sign(v_{t-1} - Delta_t^2)  (FedYogi)
    v_t = b2 v_{t-1} + (1 - b2) Delta_t^2                       (FedAdam)
    x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import optax

AdaptiveRule = Literal["adagrad", "yogi", "adam"]


class ScaleByReddiState(NamedTuple):
    """First and second moment estimates of the pseudo-gradient."""

    mu: optax.Updates
    nu: optax.Updates


def scale_by_reddi(rule: AdaptiveRule, b1: float, b2: float, tau: float) -> optax.GradientTransformation:
    """Rescales updates by ``m_t / (sqrt(v_t) + tau)`` with the second-moment ``rule`` of Algorithm 2.

    References:
      Reddi et al., "Adaptive Federated Optimization", ICLR 2021, Algorithm 2.
    """

    def init_fn(params):
        return ScaleByReddiState(mu=jax.tree.map(jnp.zeros_like, params),
                                 nu=jax.tree.map(lambda p: jnp.full_like(p, tau**2), params))

    def second_moment(v, g):
        g2 = jnp.square(g)
        if rule == "adagrad":
            return v + g2
        if rule == "yogi":
            return v - (1.0 - b2) * g2 * jnp.sign(v - g2)
        return b2 * v + (1.0 - b2) * g2

    def update_fn(updates, state, params=None):
        del params
        mu = jax.tree.map(lambda m, g: b1 * m + (1.0 - b1) * g, state.mu, updates)
        nu = jax.tree.map(second_moment, state.nu, updates)
        updates = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + tau), mu, nu)
        return updates, ScaleByReddiState(mu, nu)

    if rule not in ("adagrad", "yogi", "adam"):
        raise ValueError(f"rule must be one of 'adagrad', 'yogi', 'adam', got {rule!r}; the plain FedAvg "
                         "server is fedavg_server(learning_rate), FedAvgM's fedavgm_server(learning_rate, "
                         "momentum)")
    return optax.GradientTransformation(init_fn, update_fn)


def fedavg_server(learning_rate: float = 1.0) -> optax.GradientTransformation:
    """FedAvg: ``x_{t+1} = x_t + eta Delta_t`` (``eta = 1`` is McMahan et al.'s FedAvg)."""
    return optax.sgd(learning_rate)


def fedavgm_server(learning_rate: float = 1.0, momentum: float = 0.9) -> optax.GradientTransformation:
    """FedAvgM (Hsu et al. 2019): heavy-ball momentum on the pseudo-gradient."""
    return optax.sgd(learning_rate, momentum=momentum)


def reddi_server(rule: AdaptiveRule, learning_rate: float, b1: float = 0.9, b2: float = 0.99,
                 tau: float = 1e-3) -> optax.GradientTransformation:
    """FedAdagrad / FedYogi / FedAdam: :func:`scale_by_reddi` followed by a step of size ``learning_rate``."""
    return optax.chain(scale_by_reddi(rule, b1, b2, tau), optax.scale(-learning_rate))


class FedCOGMomentumState(NamedTuple):
    velocity: optax.Updates
    count: jax.Array


def fedcog_momentum_server(momentum: float = 0.1) -> optax.GradientTransformation:
    """FedAvgM as FedCOG's code runs it: ``v <- beta v + g`` on the pseudo-gradient ``g``, then
    ``x <- x - v / (1 + beta)``, except ``x <- x - v`` in the first round (see docs/baselines.md)."""

    def init_fn(params):
        return FedCOGMomentumState(jax.tree.map(jnp.zeros_like, params), jnp.zeros((), jnp.int32))

    def update_fn(updates, state, params=None):
        del params
        velocity = jax.tree.map(lambda v, g: momentum * v + g, state.velocity, updates)
        scale = jnp.where(state.count == 0, 1.0, 1.0 / (1.0 + momentum))
        return jax.tree.map(lambda v: -scale * v, velocity), FedCOGMomentumState(velocity, state.count + 1)

    return optax.GradientTransformation(init_fn, update_fn)
