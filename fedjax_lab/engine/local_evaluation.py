"""The local models of a round, evaluated before they are aggregated (FedCOG's Table 9 and Fig. 2).

At an evaluation, chosen clients each run the method's local training from the current global model, with the
keys the next round would give them, and their local models (global model plus the delta each sends) are
evaluated on the test set:

* ``local_accuracy``: their mean accuracy on the test set ("generalisation");
* ``local_personalized_accuracy``: their mean accuracy with the test set reweighted by each client's own class
  mix, ``sum_c pi_kc correct_kc / sum_c pi_kc total_c`` (FedCOG's personalised accuracy, Table 9; the
  FedAvg+FT of personalised FL);
* ``local_to_global_distance``: the mean L2 distance of each local model to their size-weighted mean, the
  model those clients would aggregate to (FedCOG's Fig. 2; FedImpro's weight divergence, Fig. 2b), and, for a
  model split into a lower and an upper part, ``local_to_global_distance_{lower,upper}`` over each part's
  trainable parameters (FedImpro's Fig. 3).

Nothing is aggregated and the loop state does not change.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_lab.engine import randomness
from fedjax_lab.engine.cohort_loop import map_cohort
from fedjax_lab.engine.evaluation import ExampleMetricsFn, pad_to_batches, per_example_metrics
from fedjax_lab.engine.simulation import RoundInputs
from fedjax_lab.engine.tree_math import tree_take
from fedjax_lab.engine.types import Algorithm, ClientData, LoopState, Params
from fedjax_lab.engine.variables import split_variables


def local_models(algorithm: Algorithm, state: LoopState, inputs: RoundInputs, ids: jax.Array,
                 chunk_size: int | None = None) -> Params:
    """The clients ``ids``' local models after one round of the method's local training from the current
    global model, stacked ``[len(ids), ...]``: the global model plus the delta each sends."""
    r = state.round
    clients = ClientData(ids, inputs.client_example_ids[ids], inputs.client_num_examples[ids],
                         jax.vmap(lambda i: randomness.data_key(inputs.key, i))(ids))
    keys = jax.vmap(lambda i: randomness.client_key(inputs.key, r, i))(ids)

    def client_fn(client_state, client, key):
        return algorithm.client_update(state.server_state, client_state, client, inputs.train_arrays, key)

    messages, _, _ = map_cohort(client_fn, chunk_size, tree_take(state.client_states, ids), clients, keys)
    return jax.tree.map(lambda w, d: w[None] + d, algorithm.model_params(state.server_state),
                        messages["delta"])


def personalized_accuracy(correct_by_class: jax.Array, count_by_class: jax.Array,
                          proportions: jax.Array) -> jax.Array:
    """``sum_c pi_c correct_c / sum_c pi_c total_c`` for each row: a model's test accuracy with each class
    weighted by a client's share of it."""
    return (jnp.sum(proportions * correct_by_class, -1)
            / jnp.maximum(jnp.sum(proportions * count_by_class, -1), 1e-30))


class LocalEvaluator:
    """Evaluates the local models of ``client_ids`` (see the module docstring).

    Args:
      algorithm_at: ``(inputs, round) -> Algorithm`` (the run's, with its hyper-parameters at that round).
      example_metrics: per-example loss, correctness and count (``Classifier.example_metrics``).
      test: ``{'x', 'y'}`` host arrays; ``num_classes`` labels.
      client_ids: the clients evaluated; ``client_class_counts[k]`` their training rows of each class.
      batch_size: test examples per batch; ``chunk_size``: clients trained at once.
      lower: a tree like the trainable parameters, ``True`` on the lower part's
        (:func:`~fedjax_lab.engine.dissimilarity.lower_mask`), for the distance of each part; ``None``: none.
    """

    def __init__(self, algorithm_at: Callable, example_metrics: ExampleMetricsFn, test: dict[str, np.ndarray],
                 num_classes: int, client_ids: np.ndarray, client_class_counts: np.ndarray, batch_size: int,
                 chunk_size: int | None = None, lower: Params | None = None):
        batches = jax.device_put(pad_to_batches(test, batch_size))
        labels = batches["y"].reshape(-1)
        proportions = jnp.asarray(client_class_counts
                                  / np.maximum(client_class_counts.sum(1, keepdims=True), 1))
        ids = jnp.asarray(client_ids, jnp.int32)

        def evaluate(state: LoopState, inputs: RoundInputs) -> dict[str, jax.Array]:
            algorithm = algorithm_at(inputs, state.round)
            models = local_models(algorithm, state, inputs, ids, chunk_size)

            def by_class(variables):
                _, correct, count = per_example_metrics(example_metrics, variables, batches)
                return (jax.ops.segment_sum(correct, labels, num_classes),
                        jax.ops.segment_sum(count, labels, num_classes))

            correct, count = jax.lax.map(by_class, models)
            sizes = inputs.client_num_examples[ids].astype(jnp.float32)
            center = jax.tree.map(lambda m: jnp.tensordot(sizes / jnp.sum(sizes), m, axes=1), models)
            squares = jax.tree.map(lambda m, c: jnp.sum(jnp.square(m - c[None]).reshape(m.shape[0], -1), 1),
                                   models, center)
            out = {"local_accuracy": jnp.mean(jnp.sum(correct, 1) / jnp.maximum(jnp.sum(count, 1), 1.0)),
                   "local_personalized_accuracy": jnp.mean(personalized_accuracy(correct, count,
                                                                                 proportions)),
                   "local_to_global_distance": jnp.mean(jnp.sqrt(sum(jax.tree.leaves(squares))))}
            if lower is not None:
                trainable = split_variables(squares)[0]
                for part, keep in (("lower", True), ("upper", False)):
                    parts = [v for v, k in zip(jax.tree.leaves(trainable), jax.tree.leaves(lower))
                             if k == keep]
                    out[f"local_to_global_distance_{part}"] = jnp.mean(jnp.sqrt(sum(parts)))
            return out

        self._evaluate = jax.jit(evaluate)

    def __call__(self, state: LoopState, inputs: RoundInputs) -> dict[str, float]:
        return {name: float(value) for name, value in self._evaluate(state, inputs).items()}
