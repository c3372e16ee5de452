"""Gradient dissimilarity across clients at the global model, split into the model's lower and upper parts
(FedImpro's Theorem 4.2 and its measured claim), for every method.

At an evaluation, chosen clients each take one step of their method's local update from the current global
model on ``examples`` of their rows, with plain SGD at rate 1 (no momentum, no weight decay): the step is
minus the gradient of the method's objective there (its loss terms included; SCAFFOLD's correction and
FedReg's projection included too, being part of the direction its clients follow). With ``p_m`` the clients'
size weights and ``g = sum_m p_m g_m``, for each part of the trainable parameters (those the model uses up to
stage ``split``, and the rest):

* ``gradient_dissimilarity_{lower,upper}``: ``sum_m p_m ||g_m - g||^2`` over that part;
* ``gradient_dissimilarity_{lower,upper}_relative``: the same divided by ``||g||^2``.

With a *counterfactual* the same clients take the same step a second time at the same global model with some
hyper-parameters changed (FedImpro's sampled-feature weight set to 0, say), and the metrics come back again
with the suffix ``_counterfactual``: the two objectives compared at the same parameters, where two runs would
compare them along two trajectories.

Nothing is aggregated and the loop state does not change.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from fedjax_lab.engine import randomness
from fedjax_lab.engine.cohort_loop import map_cohort
from fedjax_lab.engine.simulation import RoundInputs
from fedjax_lab.engine.tree_math import tree_take
from fedjax_lab.engine.types import Algorithm, ClientData, LoopState, Params
from fedjax_lab.engine.variables import split_variables


def lower_mask(module, params: Params, model_input_shape: tuple[int, ...], split: str) -> Params:
    """A tree like ``params`` (trainable) of booleans: ``True`` for the parameters the model reads up to and
    including stage ``split`` (Flax creates only those when initialised through ``lower``)."""
    x = jnp.zeros((1, *model_input_shape), jnp.float32)
    shapes = jax.eval_shape(lambda: module.init(jax.random.key(0), x, split, method="lower"))["params"]
    lower_paths = {path for path, _ in jax.tree_util.tree_flatten_with_path(shapes)[0]}
    flat, tree = jax.tree_util.tree_flatten_with_path(params)
    return jax.tree_util.tree_unflatten(tree, [path in lower_paths for path, _ in flat])


def dissimilarity(gradients: Params, weights: jax.Array, mask: Params) -> dict[str, jax.Array]:
    """The weighted dissimilarity of stacked client gradients ``[M, ...]`` over the parameters where ``mask``
    (``lower``) and the others (``upper``), absolute and relative to the weighted mean's squared norm."""
    p = weights / jnp.sum(weights)
    mean = jax.tree.map(lambda g: jnp.tensordot(p, g, 1), gradients)
    spread = jax.tree.map(
        lambda g, m: jnp.tensordot(p, jnp.sum(jnp.square(g - m[None]).reshape(g.shape[0], -1), -1), 1),
        gradients, mean)
    norm = jax.tree.map(lambda m: jnp.sum(jnp.square(m)), mean)
    out = {}
    for part, keep in (("lower", True), ("upper", False)):
        total = sum(v for v, k in zip(jax.tree.leaves(spread), jax.tree.leaves(mask)) if k == keep)
        size = sum(v for v, k in zip(jax.tree.leaves(norm), jax.tree.leaves(mask)) if k == keep)
        out[f"gradient_dissimilarity_{part}"] = jnp.asarray(total, jnp.float32)
        out[f"gradient_dissimilarity_{part}_relative"] = total / jnp.maximum(size, 1e-30)
    return out


class DissimilarityEvaluator:
    """Measures :func:`dissimilarity` of the clients ``client_ids`` (see the module docstring).

    Args:
      probe_at: ``(inputs, round) -> Algorithm``: the run's method with one SGD step at rate 1 on a batch of
        the probe's size as its local training.
      mask: :func:`lower_mask` of the model's trainable parameters.
      client_ids: the clients measured; ``chunk_size``: clients at once.
      counterfactual_at: like ``probe_at``, with the counterfactual's hyper-parameters; its metrics are
        reported with the suffix ``_counterfactual``.
    """

    def __init__(self, probe_at: Callable, mask: Params, client_ids, chunk_size: int | None = None,
                 counterfactual_at: Callable | None = None):
        ids = jnp.asarray(client_ids, jnp.int32)

        def evaluate(state: LoopState, inputs: RoundInputs) -> dict[str, jax.Array]:
            metrics = measure(probe_at, state, inputs)
            if counterfactual_at is not None:
                metrics.update({f"{k}_counterfactual": v
                                for k, v in measure(counterfactual_at, state, inputs).items()})
            return metrics

        def measure(algorithm_at: Callable, state: LoopState, inputs: RoundInputs) -> dict[str, jax.Array]:
            algorithm: Algorithm = algorithm_at(inputs, state.round)
            clients = ClientData(ids, inputs.client_example_ids[ids], inputs.client_num_examples[ids],
                                 jax.vmap(lambda i: randomness.data_key(inputs.key, i))(ids))
            keys = jax.vmap(lambda i: randomness.client_key(inputs.key, state.round, i))(ids)

            def client_fn(client_state, client, key):
                return algorithm.client_update(state.server_state, client_state, client, inputs.train_arrays,
                                               key)

            messages, _, _ = map_cohort(client_fn, chunk_size, tree_take(state.client_states, ids), clients,
                                        keys)
            gradients = jax.tree.map(jnp.negative, split_variables(messages["delta"])[0])
            weights = clients.num_examples.astype(jnp.float32)
            return dissimilarity(gradients, weights, mask)

        self._evaluate = jax.jit(evaluate)

    def __call__(self, state: LoopState, inputs: RoundInputs) -> dict[str, float]:
        return {k: float(v) for k, v in self._evaluate(state, inputs).items()}
