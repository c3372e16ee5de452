"""VHL, virtual homogeneity learning: every client also fits one fixed virtual dataset of noise images that
all clients share, and pulls its classes' features towards the virtual classes', so that the clients' feature
spaces are calibrated against the same, homogeneous data.

* **The virtual dataset** (built once from the run's key, identical for every client and round; its code's
  ``Gaussian_Noise`` generator): for each virtual class ``c < V`` a mean ``m_c ~ N(0, I)`` on an 8x8 grid of
  the model's channels; each image is ``m_c + 0.5 eps``, bilinearly upsampled to the model's input size,
  clipped to ``[0, 1]`` and stored in 8 bits (its code saves image files). Each draw is randomly cropped
  (padding 4) and flipped, then normalised by ``(x - 0.5) / 0.25``, and enters the model as its input
  directly.
* **The client loss** at every step, beside a real batch ``(x, y)``, on a virtual batch ``(x_v, y_v)``:
  ``CE(f(x), y) + alpha CE(f(x_v), y_v) + align_weight SupCon([h; sg(h_v)], [y; c_v])
  + virtual_weight SupCon(h_v, c_v)``, where ``h`` are the features the head reads, ``c_v`` the virtual class
  (so virtual class ``c`` is the positive of natural class ``c``), ``sg`` the stop-gradient and ``SupCon``
  Khosla et al.'s supervised contrastive loss (Eq. 2 of theirs, one view, temperature 0.07). This is the
  paper's "natural CE + virtual CE + a contrastive distance between the class-conditional feature
  distributions", as its code (``VHL_alignNoiseContrast.sh``) sets it.
* **Labels**: under ``labels: extra`` (its code) virtual class ``c`` is label ``K + c`` and the model has
  ``K + V`` outputs (``VHLConfig.extra_outputs``); test accuracy is the argmax over all of them, so predicting
  a virtual class counts as wrong. ``labels: shared`` uses label ``c`` of the ``K``-way head.
* The server is FedAvg's (or the base's, as a plug-in) and clients keep no state.

Deviations, written down in ``docs/fedcog.md``: the virtual batch has its own forward pass (its code
concatenates it with the real batch, so that BatchNorm's statistics mix both; identical for models without
normalisation layers such as the simple-CNN); images have the model's channels (its code makes 3-channel
images and repeats grey ones); no JPEG compression.

References:
  Tang, Zhang, Shi, Wang, Zhou and Chu, "Virtual Homogeneity Learning: Defending against Data Heterogeneity in
  Federated Learning", ICML 2022 (code: wizard1203/VHL).
  Khosla et al., "Supervised Contrastive Learning", NeurIPS 2020, Eq. 2.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_lab.engine import randomness
from fedjax_lab.engine.components import ClientView, Component
from fedjax_lab.models.augment import crop_and_flip
from fedjax_lab.models.tasks import Classifier, masked_mean

NOISE_GRID = 8  # the virtual images' resolution before upsampling (its generate.py)


class VirtualData(NamedTuple):
    """The virtual dataset: 8-bit images ``[V * per_class, H, W, C]`` in ``[0, 255]`` and their classes."""

    images: jax.Array
    classes: jax.Array


def virtual_dataset(key: jax.Array, num_classes: int, per_class: int, shape: tuple[int, ...]) -> VirtualData:
    """VHL's ``Gaussian_Noise`` virtual dataset: ``per_class`` images of each of ``num_classes`` classes,
    class ``c``'s being ``clip(upsample(m_c + 0.5 eps), 0, 1)`` with ``m_c ~ N(0, I)``, in the input shape
    ``(H, W, C)``; a function of ``key`` alone."""
    h, w, c = shape
    mean_key, noise_key = jax.random.split(key)
    means = jax.random.normal(mean_key, (num_classes, 1, NOISE_GRID, NOISE_GRID, c))
    noise = jax.random.normal(noise_key, (num_classes, per_class, NOISE_GRID, NOISE_GRID, c))
    small = (means + 0.5 * noise).reshape(-1, NOISE_GRID, NOISE_GRID, c)
    images = jax.image.resize(small, (small.shape[0], h, w, c), "bilinear")
    images = jnp.round(255.0 * jnp.clip(images, 0.0, 1.0)).astype(jnp.uint8)
    return VirtualData(images, jnp.repeat(jnp.arange(num_classes, dtype=jnp.int32), per_class))


def virtual_batch(data: VirtualData, key: jax.Array, size: int) -> tuple[jax.Array, jax.Array]:
    """``size`` virtual images drawn without replacement, cropped and flipped, normalised by
    ``(x - 0.5) / 0.25`` (its data loader), and their classes."""
    rows = jax.random.choice(jax.random.fold_in(key, 0), data.classes.shape[0], (size,), replace=False)
    images = data.images[rows].astype(jnp.float32) / 255.0
    images = crop_and_flip(jax.random.fold_in(key, 1), {"x": images})
    return (images - 0.5) / 0.25, data.classes[rows]


def supcon(features: jax.Array, labels: jax.Array, mask: jax.Array, temperature: float = 0.07) -> jax.Array:
    """Supervised contrastive loss (Khosla et al., Eq. 2, one view): for each anchor ``i`` among the rows
    where ``mask`` is set, ``-mean_{p in P(i)} [s_ip - log sum_{a != i} exp s_ia]`` with
    ``s = f f^T / temperature`` of the l2-normalised features and ``P(i)`` the other rows of ``i``'s label;
    averaged over the anchors, those without a positive counting 0."""
    f = features / (jnp.linalg.norm(features, axis=-1, keepdims=True) + 1e-12)
    n = f.shape[0]
    valid = mask.astype(bool)
    others = valid[None, :] & valid[:, None] & ~jnp.eye(n, dtype=bool)
    s = f @ f.T / temperature
    log_prob = s - jax.nn.logsumexp(jnp.where(others, s, -jnp.inf), axis=1, keepdims=True)
    positives = others & (labels[:, None] == labels[None, :])
    count = jnp.sum(positives, axis=1)
    per_anchor = -jnp.sum(jnp.where(positives, log_prob, 0.0), axis=1) / jnp.maximum(count, 1)
    return masked_mean(per_anchor, mask.astype(jnp.float32))


def virtual_homogeneity(classifier: Classifier, key: jax.Array, num_classes: int, alpha: float = 1.0,
                        align_weight: float = 1.0, virtual_weight: float = 0.1, temperature: float = 0.07,
                        virtual_classes: int | None = None, per_class: int = 200, batch_size: int = 64,
                        labels: str = "extra") -> Component:
    """VHL's change to the round (see the module docstring): the virtual dataset as server state broadcast
    unchanged, a virtual batch beside each real one, and the virtual and alignment terms in the loss."""
    num_virtual = virtual_classes or num_classes
    if labels == "shared" and num_virtual > num_classes:
        raise ValueError(f"algorithm: vhl with labels: shared needs virtual_classes <= {num_classes} (the "
                         f"dataset's classes), got {num_virtual}")
    offset = num_classes if labels == "extra" else 0
    shape = classifier.model_input_shape()
    if len(shape) != 3:
        raise ValueError(f"algorithm: vhl's virtual images need image inputs (H, W, C), got shape {shape}")
    size = min(batch_size, num_virtual * per_class)

    def batch(view: ClientView):
        def add_virtual(b, step, _):
            x_v, c_v = virtual_batch(view.server, jax.random.fold_in(view.key, step), size)
            return {**b, "vhl_x": x_v, "vhl_class": c_v}

        return add_virtual

    def loss_term(view: ClientView):
        def term(variables, b, forward):
            logits_v, h_v = classifier.apply_inputs(variables, b["vhl_x"], train=True)
            ce_v = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(
                logits_v, b["vhl_class"] + offset))
            h = forward.features.reshape(forward.features.shape[0], -1)
            h_v = h_v.reshape(h_v.shape[0], -1)
            both_mask = jnp.concatenate([b["mask"], jnp.ones(h_v.shape[:1])])
            align = supcon(jnp.concatenate([h, jax.lax.stop_gradient(h_v)]),
                           jnp.concatenate([b["y"], b["vhl_class"]]), both_mask, temperature)
            among_virtual = supcon(h_v, b["vhl_class"], jnp.ones(h_v.shape[:1]), temperature)
            return alpha * ce_v + align_weight * align + virtual_weight * among_virtual

        return term

    return Component("vhl", batch=batch, loss_term=loss_term, needs_features=True,
                     server_init=lambda variables: virtual_dataset(key, num_virtual, per_class, shape))


def build(config, context) -> tuple[Component, ...]:
    """The components of ``algorithm.name: vhl`` (or of a ``vhl`` plug-in)."""
    return (virtual_homogeneity(context.classifier, randomness.setup_key(context.key, "vhl"),
                                context.dataset.num_classes, alpha=config.alpha,
                                align_weight=config.align_weight, virtual_weight=config.virtual_weight,
                                temperature=config.temperature, virtual_classes=config.virtual_classes,
                                per_class=config.per_class,
                                batch_size=config.batch_size or context.config.client.batch_size,
                                labels=config.labels),)
