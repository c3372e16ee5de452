"""BHerd: each client sends the sum of a herd of its local steps that best represents their mean.

Client k runs its local steps as usual (the trajectory does not change) and keeps every step's update
``u_lambda`` (``-eta z_lambda`` for plain SGD, ``z`` the mini-batch gradient of Eq. 3). It orders them by
greedy herding towards their mean (Alg. 2): with ``c_lambda = u_lambda - mean(u)``, each pick is the step
``p`` that keeps the running sum ``s + c_p`` smallest, over all steps not yet picked. It keeps the first
``k_k = round(alpha tau_k)`` and sends ``(1 / alpha) sum_{kept} u`` in place of its model delta, so the server
step of Eq. 7, ``w <- w - (eta / alpha) sum_k p_k g_k``, is the usual weighted mean of what clients send. With
``alpha = 1`` every step is kept and BHerd is FedAvg (Proposition 1).

Herding works on the updates rather than the raw gradients: for plain SGD they differ by the constant
``-eta``, which changes no choice of Alg. 2 (every norm scales by ``eta``), and the sum is already the model
delta's unit. With a client optimiser that is not plain SGD, or with a component that corrects the steps
(SCAFFOLD), BHerd herds the steps the client really took, so ``alpha = 1`` stays equal to the base method.

The selection runs in Gram form inside the jitted, vmapped client update (digest section 1.5): one
``[tau, tau]`` Gram matrix of the stacked updates (``O(tau^2 d)``), then ``tau_max`` greedy steps on
``tau``-vectors with a frozen carry past ``k_k``. Memory: the stacked updates are ``tau_max x |params|``
floats per client in flight (``docs/reproductions/bherd.md``); :func:`check_memory` refuses, before compiling,
a chunk of clients that would not fit.

References:
  Luo et al., "Accelerating Federated Learning by Selecting Beneficial Herd of Local Gradients", 2024,
  Alg. 2, Alg. 3, Eq. 6-7 and Proposition 1.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_lab.engine.components import ClientView, Component, LocalResult, ServerView
from fedjax_lab.engine.memory import device_memory_bytes
from fedjax_lab.engine.tree_math import tree_scale
from fedjax_lab.engine.variables import merge_variables, split_variables
from fedjax_lab.methods.registry import ConfigError

Selection = Literal["herding", "topk_nearest"]


def gram_matrix(stacked) -> jax.Array:
    """``G = Z Z^T`` ``[tau, tau]`` of the stacked steps ``Z`` (every leaf ``[tau, ...]``, flattened and
    joined), at full float32 precision so that no backend changes an argmin."""
    def leaf_gram(leaf):
        flat = leaf.reshape(leaf.shape[0], -1)
        return jnp.matmul(flat, flat.T, precision=jax.lax.Precision.HIGHEST)

    return sum(leaf_gram(leaf) for leaf in jax.tree.leaves(stacked))


def centred_gram(gram: jax.Array, valid: jax.Array) -> jax.Array:
    """The Gram matrix of ``z_p - mean_valid(z)``, from the raw one (no centred copy of the steps)."""
    w = valid.astype(gram.dtype)
    n = jnp.maximum(jnp.sum(w), 1.0)
    r = gram @ w / n
    return gram - r[:, None] - r[None, :] + (w @ r) / n


def herding_order(gram: jax.Array, valid: jax.Array, k: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Alg. 2 (greedy herding) in Gram form.

    Args:
      gram: ``[tau_max, tau_max]`` raw Gram matrix of the steps.
      valid: ``[tau_max]`` bool, the client's real steps (padding is never picked).
      k: how many to pick (traced; at most the number of valid steps).

    Returns:
      ``(order, selected)``: ``order[j]`` is the j-th pick for ``j < k`` and -1 after; ``selected`` the mask
      of the picks. Ties go to the lowest index.
    """
    gc = centred_gram(gram, valid)
    diag = jnp.diag(gc)

    def pick(j, carry):
        v, available, order = carry  # v = <c_q, s> for every candidate q
        score = jnp.where(available, 2.0 * v + diag, jnp.inf)  # ||s + c_q||^2 - ||s||^2
        p = jnp.argmin(score)
        act = j < k
        order = order.at[j].set(jnp.where(act, p, -1))
        available = available.at[p].set(available[p] & ~act)
        return jnp.where(act, v + gc[:, p], v), available, order

    init = (jnp.zeros_like(diag), valid, jnp.full(valid.shape, -1, jnp.int32))
    _, _, order = jax.lax.fori_loop(0, valid.shape[0], pick, init)
    return order, selection_mask(order, valid.shape[0])


def nearest_order(gram: jax.Array, valid: jax.Array, k: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The ablation "top-k nearest to the mean" (Fig. 1d's drawing, not Alg. 2): the ``k`` steps with the
    smallest ``||z_p - mean(z)||``, nearest first; same outputs as :func:`herding_order`."""
    distance = jnp.where(valid, jnp.diag(centred_gram(gram, valid)), jnp.inf)
    ranked = jnp.argsort(distance, stable=True).astype(jnp.int32)
    order = jnp.where(jnp.arange(valid.shape[0]) < k, ranked, -1)
    return order, selection_mask(order, valid.shape[0])


def selection_mask(order: jax.Array, size: int) -> jax.Array:
    """``[size]`` bool: the indices listed in ``order`` (entries -1 are none)."""
    return jnp.zeros(size, bool).at[jnp.where(order >= 0, order, size)].set(True, mode="drop")


def kept_count(alpha: jax.Array, num_steps: jax.Array) -> jax.Array:
    """``k_k = round(alpha tau_k)``, halves rounded up, at least 1 and at most ``tau_k``."""
    return jnp.clip(jnp.floor(alpha * num_steps + 0.5), 1, jnp.maximum(num_steps, 1)).astype(jnp.int32)


def selected_distance(gram: jax.Array, valid: jax.Array, selected: jax.Array) -> jax.Array:
    """``||mean_selected(z) - mean_valid(z)||`` (Fig. 4d), from the Gram matrix."""
    gc = centred_gram(gram, valid)
    s = selected.astype(gram.dtype)
    return jnp.sqrt(jnp.maximum(s @ gc @ s, 0.0)) / jnp.maximum(jnp.sum(s), 1.0)


def herded_steps(alpha, selection: Selection = "herding", rescale: Literal["nominal", "exact"] = "nominal",
                 diagnostics: bool = True) -> Component:
    """BHerd's change to the round: clients send ``scale * sum_{kept} u`` as their delta (see the module
    docstring).

    Args:
      alpha: the fraction of steps kept, in (0, 1] (a number, or an array inside the compiled round).
      selection: ``'herding'`` (Alg. 2, BHerd) or ``'topk_nearest'`` (the ablation).
      rescale: ``'nominal'`` scales the kept sum by ``1 / alpha`` (Eq. 7); ``'exact'`` by ``tau_k / k_k``, so
        that it is ``tau_k`` times the kept mean whatever the rounding.
      diagnostics: report per round each client's selected steps (``bherd_selected``, ``[cohort, tau_max]``,
        with ``bherd_client_ids``) and the distance of Fig. 4d (``bherd_distance``), as array metrics.
    """
    order_fn = herding_order if selection == "herding" else nearest_order

    def step_output(view: ClientView, record):
        return record.update

    def send(view: ClientView, result: LocalResult):
        stacked = result.stats.step_outputs["bherd"]
        gram = gram_matrix(stacked)
        valid = jnp.arange(gram.shape[0]) < result.stats.num_steps
        k = kept_count(alpha, result.stats.num_steps)
        _, selected = order_fn(gram, valid, k)
        kept = jax.tree.map(lambda leaf: jnp.tensordot(selected.astype(leaf.dtype), leaf, axes=1), stacked)
        scale = 1.0 / alpha if rescale == "nominal" else result.stats.num_steps / k
        delta = merge_variables(tree_scale(kept, scale), split_variables(result.delta)[1], result.delta)
        if not diagnostics:
            return delta, None
        # In gradient units: the updates are -eta z for plain SGD.
        distance = selected_distance(gram, valid, selected) / view.learning_rate
        return delta, {"selected": selected, "distance": distance,
                       "kept": k / jnp.maximum(result.stats.num_steps, 1)}

    def aggregate(view: ServerView, mean_delta):
        part = view.messages["bherd"]
        return mean_delta, {"bherd_selected": part["selected"], "bherd_distance": part["distance"],
                            "bherd_client_ids": view.cohort.client_ids,
                            "bherd_kept_fraction": jnp.mean(part["kept"]),
                            "bherd_mean_distance": jnp.mean(part["distance"])}

    return Component("bherd", step_output=step_output, send=send,
                     aggregate=aggregate if diagnostics else None)


def stacked_bytes(num_params: int, max_steps: int, clients_at_once: int) -> int:
    """The bytes BHerd adds to the clients trained at once: their stacked float32 steps and Gram matrices."""
    return clients_at_once * 4 * (max_steps * num_params + max_steps * max_steps)


def check_memory(num_params: int, max_steps: int, clients_at_once: int, cohort: int,
                 budget: int | None = None) -> None:
    """Raises ``ValueError`` (before compiling) when the stacked steps of ``clients_at_once`` clients exceed
    half the device's memory (``budget``, default :func:`~fedjax_lab.engine.memory.device_memory_bytes`),
    naming the chunk size that fits."""
    budget = budget if budget is not None else device_memory_bytes() // 2
    need = stacked_bytes(num_params, max_steps, clients_at_once)
    if need <= budget:
        return
    fits = [c for c in range(1, cohort + 1)
            if cohort % c == 0 and stacked_bytes(num_params, max_steps, c) <= budget]
    advice = (f"set rounds.chunk_size={max(fits)} (a divisor of the cohort that fits)" if fits else
              "no chunk size fits: lower client.local_epochs or raise client.batch_size (fewer steps)")
    raise ValueError(f"algorithm: bherd stores {max_steps} steps x {num_params:,} parameters for each of "
                     f"{clients_at_once} clients trained at once: {need / 2**30:.2f} GiB, over the "
                     f"{budget / 2**30:.2f} GiB allowed (half the device's memory); {advice}")


def build(config, context) -> tuple[Component, ...]:
    """The components of ``algorithm.name: bherd`` (or of a ``bherd`` plug-in)."""
    num_params = context.classifier.num_params(context.classifier.variable_shapes)
    max_steps = context.schedule.max_steps(int(np.asarray(context.dataset.client_train_ids).shape[1]))
    cohort = context.config.rounds.clients_per_round
    try:
        check_memory(num_params, max_steps, context.clients_at_once or cohort, cohort)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return (herded_steps(config.alpha, config.selection, config.rescale, config.diagnostics),)
