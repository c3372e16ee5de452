"""FedAsync: each arriving model is mixed into the global one with a weight that decays with its staleness.

Each client minimises ``f(x) + rho/2 ||x - x_tau||^2`` from the model ``x_tau`` it was sent (Alg. 1;
``rho = 0``, the default, is the plain local SGD that Feddle's baselines run). Per arrival, in arrival order:
``w <- (1 - a_t) w + a_t w_new`` with ``a_t = alpha s(tau)`` (Eq. 2 of the paper)
and ``w_new = w^{k_j} + Delta_j`` the client's trained model, mixed into the *current* ``w`` (not the one it
started from). In this library that is the FedAvg round with a server buffer of one arrival
(``algorithm.buffer_size: 1``, so the server steps once per arrival), SGD at rate 1 on the server, and this
component turning the step into ``a_t (w_new - w)``. Clients send their trained model beside their delta, so
the in-flight store holds two models per job. With ``alpha = 1`` and no delay it is sequential FedAvg.

References:
  Xie, Koyejo and Gupta, "Asynchronous Federated Optimization", 2019, Alg. 1 and Sec. 5.2.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from fedjax_lab.engine.aggregation import cohort_staleness, weighted_mean
from fedjax_lab.engine.components import ClientView, Component, LocalResult, ServerView
from fedjax_lab.engine.local_training import LossTerm
from fedjax_lab.methods.fedprox import proximal_term
from fedjax_lab.methods.staleness import staleness_function


def mixing(alpha: float | jax.Array, staleness: Callable[[jax.Array], jax.Array],
           rho: float | jax.Array = 0.0) -> Component:
    """FedAsync's change to the round: each client minimises ``f(x) + rho/2 ||x - x_tau||^2`` (Alg. 1,
    ``x_tau`` the model it was sent), and the server's step becomes
    ``sum_j w_j a_j (w_new_j - w) / sum_j w_j`` with ``a_j = alpha s(tau_j)`` (with one arrival per step:
    ``a_t (w_new - w)``)."""

    def loss_term(view: ClientView) -> LossTerm:
        return proximal_term(view.global_variables, rho)

    def finish(view, result: LocalResult):
        return result.variables, ()

    def aggregate(view: ServerView, mean_delta):
        rates = alpha * staleness(cohort_staleness(view.cohort))
        moved = jax.tree.map(lambda y, w: y - w[None], view.messages["fedasync"], view.global_variables)
        scaled = jax.tree.map(lambda x: x * rates.reshape((-1,) + (1,) * (x.ndim - 1)), moved)
        mixed = weighted_mean(scaled, view.weights)
        rate = jnp.sum(view.weights * rates) / jnp.maximum(jnp.sum(view.weights), 1e-30)
        return mixed, {"fedasync_rate": rate}

    return Component("fedasync", loss_term=loss_term, finish=finish, aggregate=aggregate)


def build(config, context) -> tuple[Component, ...]:
    """The components of ``algorithm.name: fedasync``."""
    return (mixing(config.alpha, staleness_function(config.staleness, config.a, config.b), config.rho),)


