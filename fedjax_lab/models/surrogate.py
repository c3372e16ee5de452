"""A new linear head on a classifier's features, trained on other labels: FedWalk's leash task and Feddle's
out-of-domain surrogate."""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_lab.engine.types import Arrays, Params
from fedjax_lab.models.tasks import Classifier, masked_mean


@dataclasses.dataclass(frozen=True)
class FeatureHeadTask:
    """A task on the server's own labels: the classifier's features, a new linear head of ``num_classes``
    outputs, and softmax cross-entropy (FedWalk's leash task, Feddle's out-of-domain surrogate). Its batches
    are not augmented: the clients' augmentation (crop, flip, feature-skew noise) belongs to their data, not
    the server's."""

    classifier: Classifier
    num_classes: int

    def __post_init__(self):
        object.__setattr__(self, "classifier", dataclasses.replace(self.classifier, augment=None))

    @property
    def head_module(self) -> nn.Module:
        return nn.Dense(self.num_classes, name="head")

    def init_head(self, key: jax.Array, variables: Params) -> Params:
        """Fresh head parameters sized for the model's features."""
        dummy = jnp.zeros((1,) + tuple(self.classifier.input_shape), self.classifier.input_dtype)
        features = jax.eval_shape(lambda v: self.classifier.features(v, self.classifier.preprocess(dummy)),
                                  variables)
        return self.head_module.init(key, jnp.zeros((1, int(np.prod(features.shape[1:])))))

    def logits(self, head: Params, features: jax.Array) -> jax.Array:
        return self.head_module.apply(head, features.reshape(features.shape[0], -1))

    def loss(self, variables: Params, head: Params, batch: Arrays, key: jax.Array):
        """``(F(W; batch), model_state)``: training-mode cross-entropy of the head on the model's features."""
        (_, features, _), model_state = self.classifier.apply_train(variables, batch, key, with_features=True)
        losses = optax.softmax_cross_entropy_with_integer_labels(self.logits(head, features), batch["y"])
        return masked_mean(losses, batch["mask"]), model_state

    def evaluate(self, variables: Params, head: Params, arrays: Arrays, key: jax.Array, num_examples: int,
                 chunk: int = 512) -> jax.Array:
        """The evaluation-mode loss on ``num_examples`` examples drawn without replacement (all of them when
        there are fewer), in chunks of ``chunk`` (FedWalk's ``Ls``)."""
        total = arrays["y"].shape[0]
        size = min(num_examples, total)
        chunk = min(chunk, size)
        rows = jax.random.permutation(key, total)[:size]
        rows = jnp.pad(rows, (0, -size % chunk)).reshape(-1, chunk)
        mask = (jnp.arange(rows.size) < size).reshape(rows.shape).astype(jnp.float32)

        def chunk_loss(args):
            ids, m = args
            features = self.classifier.features(variables, self.classifier.preprocess(arrays["x"][ids]))
            losses = optax.softmax_cross_entropy_with_integer_labels(self.logits(head, features),
                                                                     arrays["y"][ids])
            return jnp.sum(losses * m)

        return jnp.sum(jax.lax.map(chunk_loss, (rows, mask))) / size
