"""From a Flax module to what the engine consumes: a loss for training and per-example metrics for evaluation.

:class:`Classifier` pairs a model of the zoo with its input pipeline (preprocessing, optional augmentation)
and its objective. It covers image and tabular classification (labels ``[B]``), BHerd's binary squared-hinge
SVM, and next-token prediction (labels ``[B, T]``, where tokens equal to ``pad_label`` do not count).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_lab.engine.tree_math import tree_squared_norm
from fedjax_lab.engine.types import Arrays, Forward, Params

Preprocess = Callable[[jax.Array], jax.Array]
Augment = Callable[[jax.Array, Arrays], jax.Array]
"""``augment(key, batch) -> x``: new raw inputs for a training batch (see :mod:`.augment`)."""
Objective = Literal["cross_entropy", "squared_hinge"]


def as_float(x: jax.Array) -> jax.Array:
    """Identity on floating inputs; integer images are scaled to ``[0, 1]``."""
    if jnp.issubdtype(x.dtype, jnp.integer):
        return x.astype(jnp.float32) / 255.0
    return x.astype(jnp.float32)


def as_tokens(x: jax.Array) -> jax.Array:
    """Token ids pass through unchanged (the model embeds them)."""
    return x


def _integer_moments(images: np.ndarray, chunk: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Per-channel sums of the values and of their squares, exact (int64), and the pixel count. Each image
    is one contiguous row (chunks of whole images), so the reduction runs over rows (vectorised) instead of
    over a 3-wide channel axis (strided): on CIFAR-100's 50,000 training images 0.5 s against 4.3 s."""
    channels = images.shape[-1]
    rows = images.reshape(len(images), -1)
    total = np.zeros(rows.shape[1], np.int64)
    squares = np.zeros(rows.shape[1], np.int64)
    step = max(1, chunk // max(rows.shape[1], 1))
    for start in range(0, len(rows), step):
        part = rows[start:start + step].astype(np.int64)
        total += part.sum(0)
        squares += np.square(part).sum(0)
    count = rows.size // channels
    return (total.reshape(-1, channels).sum(0).astype(np.float64),
            squares.reshape(-1, channels).sum(0).astype(np.float64), count)


def _float_moments(images: np.ndarray, chunk: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Per-channel sums of the values and of their squares in float64, over chunks of pixels."""
    pixels = images.reshape(-1, images.shape[-1])
    total = np.zeros(pixels.shape[1])
    squares = np.zeros(pixels.shape[1])
    for start in range(0, len(pixels), chunk):
        part = pixels[start:start + chunk].astype(np.float64)
        total += part.sum(0)
        squares += np.square(part).sum(0)
    return total, squares, len(pixels)


@dataclasses.dataclass(frozen=True)
class Standardize:
    """``(as_float(x) - mean) / std`` per channel (the last axis), with statistics of the training set."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    @classmethod
    def fit(cls, images: np.ndarray, chunk: int = 1 << 20) -> Standardize:
        """Per-channel mean and std of ``as_float(images)`` (channels on the last axis), with no float copy
        of the whole dataset: integer images are summed exactly in integers, float images in float64 over
        chunks."""
        total, squares, count = (_integer_moments if np.issubdtype(images.dtype, np.integer)
                                 else _float_moments)(images, chunk)
        scale = 255.0 if np.issubdtype(images.dtype, np.integer) else 1.0
        mean = total / count
        std = np.sqrt(np.maximum(squares / count - mean**2, 0.0))
        return cls(tuple((mean / scale).tolist()), tuple(np.maximum(std / scale, 1e-8).tolist()))

    def __call__(self, x: jax.Array) -> jax.Array:
        return (as_float(x) - jnp.asarray(self.mean, jnp.float32)) / jnp.asarray(self.std, jnp.float32)


def _outputs_and_features(module: nn.Module, x: jax.Array, train: bool = False,
                          mask: jax.Array | None = None):
    features = module.features(x, train, mask)
    return module.head(features), features


def masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """``sum(values * mask) / max(sum(mask), 1)``."""
    return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def squared_hinge(scores: jax.Array, labels: jax.Array) -> jax.Array:
    """``0.5 * max(0, 1 - y s)^2`` per example, with ``y = +1`` for label 1 and ``-1`` for label 0."""
    signs = 2.0 * labels.astype(jnp.float32) - 1.0
    return 0.5 * jnp.square(jnp.maximum(0.0, 1.0 - signs * scores))


def _cast_floats(tree, dtype):
    """``tree`` with its floating array leaves cast to ``dtype`` (integers, booleans, keys and Python values
    left as they are)."""
    def cast(leaf):
        if isinstance(leaf, (jax.Array, np.ndarray)) and jnp.issubdtype(leaf.dtype, jnp.floating):
            return leaf.astype(dtype)
        return leaf

    return jax.tree.map(cast, tree)


@dataclasses.dataclass(frozen=True)
class Classifier:
    """A Flax model, its input pipeline and its objective.

    Attributes:
      module: a model mapping a preprocessed batch to logits ``[B, C]`` (or ``[B, T, C]`` for sequences, or
        scores ``[B]`` for ``squared_hinge``). Modules of the zoo also take ``train`` and ``mask``.
      input_shape: the shape of one raw example.
      preprocess: raw batch -> model input, applied inside the compiled step (data stays raw on device).
      objective: ``'cross_entropy'`` (softmax) or ``'squared_hinge'`` (binary labels 0/1, as BHerd's SVM).
      l2: adds ``l2 / 2 * ||params||^2`` to the training loss (BHerd's SVM uses 0.1).
      augment: ``(key, batch) -> x``, training only (see :mod:`.augment`).
      pad_label: for sequence labels, the token that is padding (excluded from loss and accuracy).
      input_dtype: dtype of the dummy batch used by :meth:`init`.
      precision: ``'float32'``, or ``'bfloat16'``: the forward and backward passes compute in bfloat16 (the
        parameters and floating inputs are cast for each pass, so their gradients and every output come back
        in float32: parameters, optimiser states, messages and aggregation stay float32). See :meth:`apply`.
    """

    module: nn.Module
    input_shape: tuple[int, ...]
    preprocess: Preprocess = as_float
    objective: Objective = "cross_entropy"
    l2: float = 0.0
    augment: Augment | None = None
    pad_label: int | None = None
    input_dtype: str = "float32"
    precision: Literal["float32", "bfloat16"] = "float32"

    @functools.cached_property
    def variable_shapes(self) -> Params:
        """The shapes and dtypes of :meth:`init`'s variables (``jax.ShapeDtypeStruct`` s), traced once: the
        builder, the memory estimates and several methods read them, and a ResNet's trace takes a fraction of
        a second each time."""
        return jax.eval_shape(self.init, jax.random.key(0))

    def init(self, key: jax.Array) -> Params:
        """Initial variables of the module (``{'params': ...}`` plus ``'batch_stats'`` for BatchNorm
        models)."""
        x = jnp.zeros((1,) + tuple(self.input_shape), self.input_dtype)
        return self.module.init(key, self.preprocess(x))

    def apply(self, variables: Params, *args, **kwargs):
        """``module.apply`` at :attr:`precision`. With bfloat16 the ``params`` collection and the floating
        positional inputs are cast to bfloat16 for the pass, and every floating output (new BatchNorm
        statistics included) is cast back to float32, so that the cast's transpose returns float32 gradients:
        mixed precision in the manner of ``jmp``, for any module of the zoo, without touching the modules."""
        if self.precision == "float32":
            return self.module.apply(variables, *args, **kwargs)
        compute = {**variables, "params": _cast_floats(variables["params"], jnp.bfloat16)}
        out = self.module.apply(compute, *_cast_floats(args, jnp.bfloat16), **kwargs)
        return _cast_floats(out, jnp.float32)

    def predict(self, variables: Params, x: jax.Array) -> jax.Array:
        """Outputs on a raw batch, in evaluation mode (BatchNorm uses its running averages)."""
        return self.apply(variables, self.preprocess(x))

    def apply_train(self, variables: Params, batch: Arrays, key: jax.Array, with_features: bool = False):
        """Outputs in training mode and the model's non-trainable collections after the batch; with
        ``with_features``, the outputs are ``(outputs, features, model_inputs)`` (for representation
        terms)."""
        x = self.preprocess(batch["x"] if self.augment is None else self.augment(key, batch))
        mask = batch["mask"]
        method = _outputs_and_features if with_features else None
        state_names = [name for name in variables if name != "params"]
        # A model with dropout (``uses_dropout``) gets its key, independent of augmentation's.
        rngs = ({"dropout": jax.random.fold_in(key, 1)} if getattr(self.module, "uses_dropout", False)
                else None)
        if not state_names and rngs is None:
            out, state = (self.apply(variables, x, method=method) if method
                          else self.apply(variables, x)), {}
        elif not state_names:
            out, state = self.apply(variables, x, train=True, mask=mask, method=method, rngs=rngs), {}
        else:
            out, state = self.apply(variables, x, train=True, mask=mask, mutable=state_names, method=method,
                                    rngs=rngs)
        return ((*out, x) if with_features else out), state

    def model_input_shape(self) -> tuple[int, ...]:
        """The shape of one example as the model sees it, after :attr:`preprocess` (where FedCOG generates
        inputs and VHL's virtual images live)."""
        dummy = jnp.zeros((1, *self.input_shape), self.input_dtype)
        return tuple(jax.eval_shape(self.preprocess, dummy).shape[1:])

    def apply_inputs(self, variables: Params, model_inputs: jax.Array, train: bool = False):
        """``(outputs, features)`` of already preprocessed inputs; in training mode normalisation layers use
        the batch's statistics and their updated averages are dropped (a pass that is not the training
        batch's: VHL's virtual data, FedReg's pseudo data)."""
        state_names = [name for name in variables if name != "params"]
        if not train or not state_names:
            return self.apply(variables, model_inputs, method=_outputs_and_features)
        mask = jnp.ones(model_inputs.shape[:1], jnp.float32)
        out, _ = self.apply(variables, model_inputs, True, mask, mutable=state_names,
                            method=_outputs_and_features)
        return out

    def features(self, variables: Params, model_inputs: jax.Array) -> jax.Array:
        """The representation (evaluation mode) of already preprocessed inputs."""
        return self.apply(variables, model_inputs, method="features")

    def token_weights(self, y: jax.Array, mask: jax.Array) -> jax.Array:
        """Which labels count: the example mask, broadcast over tokens and without padding tokens."""
        weights = mask.reshape(mask.shape + (1,) * (y.ndim - 1)).astype(jnp.float32)
        if self.pad_label is not None:
            weights = weights * (y != self.pad_label)
        return jnp.broadcast_to(weights, y.shape)

    def pointwise_loss(self, outputs: jax.Array, y: jax.Array) -> jax.Array:
        """The objective per label."""
        if self.objective == "squared_hinge":
            return squared_hinge(outputs, y)
        return optax.softmax_cross_entropy_with_integer_labels(outputs, y)

    def correct(self, outputs: jax.Array, y: jax.Array) -> jax.Array:
        """1.0 where the prediction equals the label."""
        predicted = ((outputs > 0).astype(y.dtype) if self.objective == "squared_hinge"
                     else jnp.argmax(outputs, -1))
        return (predicted == y).astype(jnp.float32)

    def batch_objective(self, variables: Params, outputs: jax.Array, batch: Arrays) -> jax.Array:
        """Mean objective over the real labels of the batch, plus the L2 term."""
        loss = masked_mean(self.pointwise_loss(outputs, batch["y"]),
                           self.token_weights(batch["y"], batch["mask"]))
        if self.l2:
            loss = loss + 0.5 * self.l2 * tree_squared_norm(variables["params"])
        return loss

    def loss(self, variables: Params, batch: Arrays, key: jax.Array):
        """The engine's ``LossFn``: :meth:`batch_objective` of a training-mode forward pass, and the new model
        state."""
        outputs, model_state = self.apply_train(variables, batch, key)
        return self.batch_objective(variables, outputs, batch), model_state

    def forward(self, variables: Params, batch: Arrays, key: jax.Array,
                with_features: bool = False) -> Forward:
        """The engine's ``ForwardFn``: the training loss of :meth:`loss` with the new model state, and with
        ``with_features`` the representation and model inputs of the same pass (for representation terms)."""
        if not with_features:
            return Forward(*self.loss(variables, batch, key))
        (outputs, features, inputs), model_state = self.apply_train(variables, batch, key, with_features=True)
        return Forward(self.batch_objective(variables, outputs, batch), model_state, features, inputs)

    def eval_loss(self, variables: Params, batch: Arrays) -> jax.Array:
        """The evaluation-mode mean loss of a masked batch (no augmentation, BatchNorm running statistics)."""
        losses, _, counts = self.example_metrics(variables, batch)
        return jnp.sum(losses) / jnp.maximum(jnp.sum(counts), 1.0)

    def example_metrics(self, variables: Params, batch: Arrays) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Per example: summed loss, number correct and number of labels counted (0 for masked rows), so that
        totals divide into means over labels (tokens, for sequences)."""
        outputs = self.predict(variables, batch["x"])
        weights = self.token_weights(batch["y"], batch["mask"])
        axes = tuple(range(1, weights.ndim))
        per_label_loss = self.pointwise_loss(outputs, batch["y"]) * weights
        return (jnp.sum(per_label_loss, axes), jnp.sum(self.correct(outputs, batch["y"]) * weights, axes),
                jnp.sum(weights, axes))

    def num_params(self, variables: Params) -> int:
        """The number of trainable scalars."""
        return sum(int(p.size) for p in jax.tree.leaves(variables["params"]))


def cross_entropy_loss(predict_fn: Callable[[Params, jax.Array], jax.Array]):
    """A ``LossFn`` for a stateless ``predict_fn``: mask-weighted mean softmax cross-entropy, no model
    state."""

    def loss_fn(params: Params, batch, key: jax.Array):
        del key
        logits = predict_fn(params, batch["x"])
        return masked_mean(optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]),
                           batch["mask"]), {}

    return loss_fn
