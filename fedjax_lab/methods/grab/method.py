"""GraB-FedAvg: online balancing of the local steps, the baseline of BHerd's Alg. 4.

Each client keeps, through its steps, a running sum ``m`` of its updates divided by ``tau_k`` (the paper's
"running mean", which is a partial sum), a balance ``s`` and the sum ``g`` of the steps it selects: at each
step, with ``c = u - m``, the step is selected (``s <- s + c``, ``g <- g + u``) when ``||s + c|| < ||s - c||``
and otherwise ``s <- s - c``. Nothing is stored per step. The client sends ``g`` and its selected fraction
``alpha_k``; the server steps by ``(1 / a_t) sum_k p_k g_k`` with ``a_t = sum_k p_k alpha_k``. The state is
reset every round.

As in :mod:`.bherd`, the steps are the client's updates (``-eta z`` for plain SGD): the choice is the same,
and ``g`` is already in the delta's unit.

References:
  Luo et al., "Accelerating Federated Learning by Selecting Beneficial Herd of Local Gradients", 2024, Alg. 4
  (its server line is garbled; ``a_t`` as above is our reading, docs/reproductions/bherd.md).
  Lu et al., "GraB: Finding Provably Better Data Permutations than Random Reshuffling", NeurIPS 2022.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_lab.engine.components import ClientView, Component, LocalResult, ServerView
from fedjax_lab.engine.local_training import LocalSchedule
from fedjax_lab.engine.tree_math import tree_add, tree_scale, tree_sub, tree_vdot, tree_zeros_like
from fedjax_lab.engine.variables import merge_variables, split_variables


def balance_step(carry: dict, update, num_steps: jax.Array, centering: str = "partial_sum") -> dict:
    """One step of Alg. 4's balancing: ``carry`` holds ``m``, ``s``, ``g`` and the count of selected steps.

    ``centering``: ``partial_sum`` is Alg. 4 as written, ``m <- m + u / tau_k`` (a running sum over ``tau_k``,
    which lags the steps' mean by the fraction of the round not yet run); ``running_mean`` is the mean of the
    steps so far, ``m <- m + (u - m) / j`` at the ``j``-th step (what GraB's balancing assumes: centred
    vectors)."""
    if centering == "running_mean":
        j = (carry["count_seen"] + 1).astype(jnp.float32)
        m = tree_add(carry["m"], tree_scale(tree_sub(update, carry["m"]), 1.0 / j))
    else:
        m = tree_add(carry["m"], tree_scale(update, 1.0 / num_steps))
    c = tree_sub(update, m)
    take = tree_vdot(carry["s"], c) < 0  # ||s + c|| < ||s - c||
    sign = jnp.where(take, 1.0, -1.0)
    return {"m": m, "s": tree_add(carry["s"], tree_scale(c, sign)),
            "g": tree_add(carry["g"], tree_scale(update, take.astype(jnp.float32))),
            "count": carry["count"] + take.astype(jnp.int32), "count_seen": carry["count_seen"] + 1}


def online_balancing(schedule: LocalSchedule, centering: str = "partial_sum") -> Component:
    """GraB-FedAvg's change to the round (see the module docstring); ``schedule`` gives each client's
    ``tau_k``."""

    def running(view: ClientView):
        num_steps = jnp.maximum(schedule.client_steps(view.client.num_examples), 1).astype(jnp.float32)

        def init():
            zeros = tree_zeros_like(split_variables(view.global_variables)[0])
            return {"m": zeros, "s": zeros, "g": zeros, "count": jnp.zeros((), jnp.int32),
                    "count_seen": jnp.zeros((), jnp.int32)}

        return init, lambda carry, record: balance_step(carry, record.update, num_steps, centering)

    def send(view: ClientView, result: LocalResult):
        carry = result.stats.running["grab"]
        fraction = carry["count"] / jnp.maximum(result.stats.num_steps, 1)
        return merge_variables(carry["g"], split_variables(result.delta)[1], result.delta), fraction

    def sums(messages, weights, cohort):
        return jnp.sum(weights * messages["grab"])

    def aggregate(view: ServerView, mean_delta):
        a_t = view.sums["grab"] / jnp.maximum(view.sums["weight"], 1e-12)
        params, model_state = split_variables(mean_delta)
        scaled = tree_scale(params, 1.0 / jnp.maximum(a_t, 1e-12))
        return merge_variables(scaled, model_state, mean_delta), {"grab_selected_fraction": a_t}

    return Component("grab", running=running, send=send, aggregate=aggregate, sums=sums)


def build(config, context) -> tuple[Component, ...]:
    """The components of ``algorithm.name: grab`` (or of a ``grab`` plug-in)."""
    return (online_balancing(context.schedule, config.centering),)
