"""DP-FedAvg inside the compiled round: each client's update clipped as it leaves the client, Gaussian noise
on their sum at the server, and optionally a clipping norm that tracks a quantile of the update norms.

One :class:`~fedjax_lab.engine.components.Component`, ``"dp"``, added in front of a method's own components,
so that it composes with every server optimiser (the noisy average is the pseudo-gradient DP-FedAdam and
DP-FedAvgM step on) and with every component that changes only what clients do:

* ``outgoing`` (in the vmapped client step): ``Delta_k <- Delta_k min(1, C / ||Delta_k||)``, and
  ``b_k = 1[||Delta_k|| <= C]``;
* ``aggregate`` (on the server, first): the fixed-denominator estimator
  ``Delta = (sum_k Delta_k + N(0, (sigma C)^2 I)) / (q W)``, or the clipped one
  ``Delta = sum_k Delta_k / max(q W, |cohort|) + N(0, (2 sigma C / (q W))^2 I)``
  (McMahan et al. 2018, Algorithm 1 and section 2; ``w_k = 1``, so ``W = N``, and ``q W`` is the expected
  number of clients);
* ``after_step`` (adaptive clipping, Andrew et al. 2021, Algorithm 1): the noisy fraction of unclipped updates
  ``b = (sum_k (b_k - 1/2) + N(0, sigma_b^2)) / (q W) + 1/2``, clamped to [0, 1] as in the authors' code,
  moves ``C <- C exp(-eta_C (b - gamma))``; the update noise is then
  ``sigma_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)``, so that the two releases together are one Gaussian
  mechanism of noise multiplier ``z`` (their Theorem 1), which is what the accountant counts.

References:
  McMahan, Ramage, Talwar, Zhang, "Learning Differentially Private Recurrent Language Models", ICLR 2018.
  Andrew, Thakkar, McMahan, Ramaswamy, "Differentially Private Learning with Adaptive Clipping", NeurIPS 2021.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
import optax

from fedjax_lab.engine import randomness
from fedjax_lab.engine.aggregation import cohort_mask
from fedjax_lab.engine.components import Component
from fedjax_lab.engine.tree_math import tree_add, tree_scale

NAME = "dp"
"""The component's name: its message part, server state and metrics prefix."""


def clip_to_norm(delta, clip_norm):
    """``delta`` scaled to an l2 norm (over every leaf) of at most ``clip_norm``, and whether it was within
    it: ``(delta min(1, C / ||delta||), ||delta|| <= C)``. With ``C = inf`` the delta comes back bit for
    bit."""
    norm = optax.global_norm(delta)
    within = norm <= clip_norm
    factor = jnp.where(within, 1.0, clip_norm / jnp.where(within, 1.0, norm))
    return tree_scale(delta, factor), within


def gaussian_like(key: jax.Array, tree, std):
    """Independent ``N(0, std^2)`` noise shaped like every leaf of ``tree``."""
    leaves, treedef = jax.tree.flatten(tree)
    keys = jax.random.split(key, len(leaves))
    return jax.tree.unflatten(treedef, [std * jax.random.normal(k, x.shape, x.dtype)
                                        for k, x in zip(keys, leaves)])


def update_noise_multiplier(noise_multiplier, count_noise):
    """``sigma_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)``: the update's share of a total noise multiplier ``z``
    when the count of unclipped updates is released with noise ``sigma_b`` (Andrew et al. 2021, Theorem 1);
    ``z`` itself without adaptive clipping (``count_noise=None``), and 0 when ``z = 0``."""
    if count_noise is None:
        return noise_multiplier
    z = jnp.asarray(noise_multiplier, jnp.float32)
    precision = 1.0 / jnp.square(jnp.where(z > 0, z, 1.0)) - 1.0 / jnp.square(2.0 * count_noise)
    return jnp.where(z > 0, jax.lax.rsqrt(jnp.maximum(precision, 1e-30)), 0.0)


def geometric_clip_update(clip_norm, unclipped_fraction, *, target_quantile, learning_rate):
    """Andrew et al. 2021's geometric update ``C exp(-eta_C (b - gamma))``: the norm shrinks while more than
    the target fraction ``gamma`` of updates are within it, and grows while fewer are."""
    return clip_norm * jnp.exp(-learning_rate * (unclipped_fraction - target_quantile))


def dp_aggregation(
    *,
    clip_norm,
    noise_multiplier,
    expected_clients: float,
    estimator: Literal["fixed", "clipped"] = "fixed",
    target_quantile=None,
    clip_learning_rate=0.2,
    count_noise=None,
) -> Component:
    """DP-FedAvg's clipping and noise as a component (see the module docstring for the equations).

    Floats may be arrays (hyper-parameters as data: a sweep over ``noise_multiplier`` is one program).

    Args:
      clip_norm: C, the l2 norm each client's update is clipped to (the first round's with adaptive
        clipping). ``inf`` with ``noise_multiplier=0`` is FedAvg with uniform weights, bit for bit.
      noise_multiplier: z, the noise's standard deviation in units of the sum's sensitivity C (the total over
        the update and the count with adaptive clipping).
      expected_clients: ``q W``, the denominator of the fixed estimator: ``q N`` under Poisson sampling, the
        cohort size under fixed-size sampling.
      estimator: ``'fixed'`` (f_f) or ``'clipped'`` (f_c) of McMahan et al. 2018.
      target_quantile: gamma; ``None``: the clipping norm is fixed.
      clip_learning_rate: eta_C of the geometric update.
      count_noise: sigma_b, the noise on the count of unclipped updates (adaptive clipping only); must exceed
        ``z / 2``.
    """
    adaptive = target_quantile is not None
    if adaptive and count_noise is None:
        raise ValueError("adaptive clipping needs count_noise (sigma_b)")
    if estimator not in ("fixed", "clipped"):
        raise ValueError(f"estimator must be 'fixed' or 'clipped', got {estimator!r}")
    sigma = update_noise_multiplier(noise_multiplier, count_noise if adaptive else None)

    def current_clip(state):
        return state["clip_norm"] if adaptive else clip_norm

    def server_init(params):
        return {"clip_norm": jnp.asarray(clip_norm, jnp.float32)}

    def outgoing(view, delta):
        clipped, within = clip_to_norm(delta, current_clip(view.server))
        return clipped, {"within": within.astype(jnp.float32)}

    def sums(messages, weights, cohort):
        mask = cohort_mask(cohort).astype(jnp.float32)
        return {"within": jnp.sum(mask * messages[NAME]["within"]), "count": jnp.sum(mask)}

    def aggregate(view, mean_delta):
        c = current_clip(view.state)
        total, denominator = view.sums["delta"], jnp.asarray(expected_clients, jnp.float32)
        key = randomness.named_key(view.context.key, f"{NAME}/update")
        std = jnp.where(sigma > 0, sigma * c, 0.0)  # no noise with C = inf and z = 0, not inf * 0
        if estimator == "fixed":
            noisy = tree_add(total, gaussian_like(key, total, std))
            mean = tree_scale(noisy, 1.0 / denominator)
        else:
            mean = tree_add(tree_scale(total, 1.0 / jnp.maximum(denominator, view.sums[NAME]["count"])),
                            gaussian_like(key, total, 2.0 * std / denominator))
        counted = view.sums[NAME]
        clipped = 1.0 - counted["within"] / jnp.maximum(counted["count"], 1.0)
        return mean, {"dp_clip_norm": c, "dp_clipped_fraction": clipped}

    def after_step(view, params):
        counted = view.sums[NAME]
        key = randomness.named_key(view.context.key, f"{NAME}/count")
        centred = counted["within"] - 0.5 * counted["count"] + count_noise * jax.random.normal(key)
        # Clamped to [0, 1] as the authors' code does (TF Privacy's QuantileEstimatorQuery): post-processing.
        fraction = jnp.clip(centred / expected_clients + 0.5, 0.0, 1.0)
        new_clip = geometric_clip_update(view.state["clip_norm"], fraction, target_quantile=target_quantile,
                                         learning_rate=clip_learning_rate)
        return {"clip_norm": new_clip}, params, {"dp_unclipped_fraction": fraction}

    return Component(NAME, outgoing=outgoing, sums=sums, aggregate=aggregate,
                     server_init=server_init if adaptive else None,
                     after_step=after_step if adaptive else None)


def check_composes(components) -> None:
    """Raises ``ValueError`` naming a component whose server hooks read what clients send beyond their clipped
    update (``merge``, ``sums``, ``aggregate``, ``after_step``): the noise covers only the update (and the
    count), so such a method would release its clients' data without privacy."""
    readers = [c.name for c in components if c.name != NAME and any(
        getattr(c, hook) is not None for hook in ("merge", "sums", "aggregate", "after_step"))]
    if readers:
        raise ValueError(f"the server hooks of {', '.join(readers)} read what clients send beyond the "
                         "clipped update, which the noise does not cover; DP-FedAvg composes with server "
                         "optimisers and with methods that change only what clients do")
