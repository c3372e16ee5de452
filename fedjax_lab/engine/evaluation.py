"""Evaluation of the global model: central test metrics and the spread across clients.

The global model is the same for every client, so per-client metrics come from one pass over the pooled
examples: per-example loss and correctness, then a masked mean over each client's rows.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_lab.engine.types import Arrays, Params

PredictFn = Callable[[Params, jax.Array], jax.Array]
"""``predict_fn(params, x) -> logits`` on a batch of raw inputs."""


def pad_to_batches(arrays: dict[str, np.ndarray], batch_size: int) -> dict[str, np.ndarray]:
    """Pads every array to a multiple of ``batch_size`` rows and reshapes to ``[num_batches, batch_size, ...]``;
    adds ``'mask'`` marking the real rows."""
    n = len(next(iter(arrays.values())))
    num_batches = max(-(-n // batch_size), 1)
    pad = num_batches * batch_size - n
    out = {}
    for name, value in arrays.items():
        value = np.concatenate([value, np.zeros((pad,) + value.shape[1:], value.dtype)])
        out[name] = value.reshape((num_batches, batch_size) + value.shape[1:])
    out["mask"] = (np.arange(num_batches * batch_size) < n).reshape(num_batches, batch_size)
    return out


def per_example_metrics(predict_fn: PredictFn, params: Params, batches: Arrays) -> tuple[jax.Array, jax.Array]:
    """Cross-entropy loss and 0/1 correctness of every example of batched arrays (see :func:`pad_to_batches`),
    flattened to ``[num_batches * batch_size]``; padded rows are zero."""

    def one_batch(batch):
        logits = predict_fn(params, batch["x"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"])
        correct = (jnp.argmax(logits, -1) == batch["y"]).astype(jnp.float32)
        return loss * batch["mask"], correct * batch["mask"]

    loss, correct = jax.lax.map(one_batch, batches)
    return loss.reshape(-1), correct.reshape(-1)


class Evaluator:
    """Evaluates the global model on a fixed set of examples, optionally grouped by client.

    Args:
      predict_fn: ``(params, x) -> logits``.
      arrays: ``{'x', 'y'}`` host arrays.
      batch_size: examples per evaluation batch.
      client_example_ids, client_num_examples: optional index table grouping ``arrays`` by client; with it,
        ``__call__`` also reports the mean, spread and tails of per-client accuracy.
    """

    def __init__(self, predict_fn: PredictFn, arrays: dict[str, np.ndarray], batch_size: int,
                 client_example_ids: np.ndarray | None = None, client_num_examples: np.ndarray | None = None):
        self._per_example = jax.jit(functools.partial(per_example_metrics, predict_fn))
        self.num_examples = len(arrays["y"])
        self.batches = jax.device_put(pad_to_batches(arrays, batch_size))
        self.clients = None
        if client_example_ids is not None:
            self.clients = jax.device_put((client_example_ids, client_num_examples))

    def __call__(self, params: Params) -> dict[str, float]:
        """``{'test_loss', 'test_accuracy'}`` and, with clients, ``client_accuracy_{mean,std,min,p10,max}``."""
        loss, correct = self._per_example(params, self.batches)
        out = {"test_loss": jnp.sum(loss) / self.num_examples,
               "test_accuracy": jnp.sum(correct) / self.num_examples}
        if self.clients is not None:
            out.update(client_spread(correct, *self.clients))
        return {name: float(value) for name, value in out.items()}


@jax.jit
def client_spread(correct: jax.Array, example_ids: jax.Array, num_examples: jax.Array) -> dict[str, jax.Array]:
    """Summary of per-client accuracy: each client's accuracy is the mean correctness over its rows."""
    mask = jnp.arange(example_ids.shape[1])[None, :] < num_examples[:, None]
    acc = jnp.sum(correct[example_ids] * mask, axis=1) / jnp.maximum(num_examples, 1)
    return {"client_accuracy_mean": jnp.mean(acc), "client_accuracy_std": jnp.std(acc),
            "client_accuracy_min": jnp.min(acc), "client_accuracy_p10": jnp.percentile(acc, 10),
            "client_accuracy_max": jnp.max(acc)}
