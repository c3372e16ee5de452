"""Evaluation of the global model: central test metrics and the spread across clients.

The global model is the same for every client, so per-client metrics come from one pass over the pooled
examples: per-example loss and correctness, then a masked mean over each client's rows.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_lab.engine.tree_math import tree_squared_norm
from fedjax_lab.engine.types import Arrays, Params

ExampleMetricsFn = Callable[[Params, Arrays], tuple[jax.Array, jax.Array, jax.Array]]
"""``example_metrics(params, batch) -> (loss, correct, count)``, each ``[B]``: per example the summed loss,
the number of correct predictions and the number of labels counted (1 per example for classification, the real
tokens for sequences; 0 for masked rows)."""


def pad_to_batches(arrays: dict[str, np.ndarray], batch_size: int) -> dict[str, np.ndarray]:
    """Pads every array to a multiple of ``batch_size`` rows and reshapes to
    ``[num_batches, batch_size, ...]``; adds ``'mask'`` marking the real rows."""
    n = len(next(iter(arrays.values())))
    num_batches = max(-(-n // batch_size), 1)
    pad = num_batches * batch_size - n
    out = {}
    for name, value in arrays.items():
        value = np.concatenate([value, np.zeros((pad,) + value.shape[1:], value.dtype)])
        out[name] = value.reshape((num_batches, batch_size) + value.shape[1:])
    out["mask"] = (np.arange(num_batches * batch_size) < n).reshape(num_batches, batch_size)
    return out


def per_example_metrics(example_metrics: ExampleMetricsFn, params: Params,
                        batches: Arrays) -> tuple[jax.Array, jax.Array, jax.Array]:
    """:data:`ExampleMetricsFn` over batched arrays (see :func:`pad_to_batches`), flattened to
    ``[num_batches * batch_size]``."""
    loss, correct, count = jax.lax.map(lambda batch: example_metrics(params, batch), batches)
    return loss.reshape(-1), correct.reshape(-1), count.reshape(-1)


class Evaluator:
    """Evaluates the global model on a fixed set of examples, optionally grouped by client.

    Args:
      example_metrics: per-example loss, correctness and label count (:data:`ExampleMetricsFn`), e.g.
        ``Classifier.example_metrics``.
      arrays: ``{'x', 'y'}`` host arrays.
      batch_size: examples per evaluation batch.
      client_example_ids, client_num_examples: optional index table grouping ``arrays`` by client; with it,
        ``__call__`` also reports the mean, spread and tails of per-client accuracy.
      prefix: the metrics' names, ``{prefix}_loss`` and ``{prefix}_accuracy``.
      l2: adds ``l2 / 2 * ||params||^2`` to the loss, so that it is the training objective (BHerd's SVM).
    """

    def __init__(self, example_metrics: ExampleMetricsFn, arrays: dict[str, np.ndarray], batch_size: int,
                 client_example_ids: np.ndarray | None = None, client_num_examples: np.ndarray | None = None,
                 prefix: str = "test", l2: float = 0.0):
        self._per_example = jax.jit(functools.partial(per_example_metrics, example_metrics))
        self.prefix, self.l2 = prefix, l2
        self.batches = jax.device_put(pad_to_batches(arrays, batch_size))
        self.clients = None
        if client_example_ids is not None:
            self.clients = jax.device_put((client_example_ids, client_num_examples))

    def __call__(self, params: Params) -> dict[str, float]:
        """``{'test_loss', 'test_accuracy'}`` (by ``prefix``) and, with clients,
        ``client_accuracy_{mean,std,min,p10,max}``."""
        loss, correct, count = self._per_example(params, self.batches)
        total = jnp.maximum(jnp.sum(count), 1.0)
        mean_loss = jnp.sum(loss) / total
        if self.l2:
            mean_loss = mean_loss + 0.5 * self.l2 * tree_squared_norm(params["params"])
        out = {f"{self.prefix}_loss": mean_loss, f"{self.prefix}_accuracy": jnp.sum(correct) / total}
        if self.clients is not None:
            out.update(client_spread(correct, count, *self.clients))
        return {name: float(value) for name, value in out.items()}


@jax.jit
def client_spread(correct: jax.Array, count: jax.Array, example_ids: jax.Array,
                  num_examples: jax.Array) -> dict[str, jax.Array]:
    """Summary of per-client accuracy: each client's accuracy is its correct labels over its counted
    labels."""
    mask = jnp.arange(example_ids.shape[1])[None, :] < num_examples[:, None]
    acc = (jnp.sum(correct[example_ids] * mask, axis=1)
           / jnp.maximum(jnp.sum(count[example_ids] * mask, axis=1), 1))
    return {"client_accuracy_mean": jnp.mean(acc), "client_accuracy_std": jnp.std(acc),
            "client_accuracy_min": jnp.min(acc), "client_accuracy_p10": jnp.percentile(acc, 10),
            "client_accuracy_max": jnp.max(acc)}
