"""Training-time input augmentation, jit-able and per example: ``augment(key, batch) -> x``.

Each function reads the raw batch ``{'x', ...}`` and returns new inputs; every example gets its own draw.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from fedjax_lab.models.tasks import as_float

Augment = Callable[[jax.Array, dict], jax.Array]


def random_flip(key: jax.Array, batch: dict) -> jax.Array:
    """Mirrors each image left-right with probability 1/2."""
    x = batch["x"]
    flip = jax.random.bernoulli(key, 0.5, (x.shape[0],))
    return jnp.where(flip[:, None, None, None], x[:, :, ::-1, :], x)


def random_crop(key: jax.Array, batch: dict, padding: int = 4) -> jax.Array:
    """Zero-pads each image by ``padding`` pixels and crops a random window of the original size
    (torchvision's ``RandomCrop(size, padding)``)."""
    x = batch["x"]
    _, h, w, _ = x.shape
    padded = jnp.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    offsets = jax.random.randint(key, (x.shape[0], 2), 0, 2 * padding + 1)

    def crop(image, offset):
        return jax.lax.dynamic_slice(image, (offset[0], offset[1], 0), (h, w, image.shape[-1]))

    return jax.vmap(crop)(padded, offsets)


def crop_and_flip(key: jax.Array, batch: dict) -> jax.Array:
    """:func:`random_crop` then :func:`random_flip` (the usual CIFAR augmentation)."""
    crop_key, flip_key = jax.random.split(key)
    return random_flip(flip_key, {**batch, "x": random_crop(crop_key, batch)})


def gaussian_noise(key: jax.Array, batch: dict) -> jax.Array:
    """Adds ``N(0, noise_std^2)`` to inputs scaled to ``[0, 1]``, with ``batch['noise_std']`` per example
    (NIID-Bench's feature skew: a fresh draw every time an example is read)."""
    x = as_float(batch["x"])
    std = batch["noise_std"].reshape((-1,) + (1,) * (x.ndim - 1))
    return x + std * jax.random.normal(key, x.shape)


def chain(*augments: Augment) -> Augment:
    """Applies augmentations in order, each on the output of the previous one, with independent keys."""

    def augment(key, batch):
        for i, fn in enumerate(augments):
            batch = {**batch, "x": fn(jax.random.fold_in(key, i), batch)}
        return batch["x"]

    return augment
