"""FedReg: local steps that forget less. The client's gradient is taken at a point pulled towards the global
model (slow update), and after each step the displacement from the global model is projected off the
directions that would raise the loss on data encoding the global model's knowledge.

At each local step on a real batch ``(x, y)``, with ``x_t`` the round's global model and ``w`` the client's
(its code, ``FedUtils/fed/fedreg.py``):

1. ``g1 = grad CE(f(m; x), y)`` at ``m = gamma w + (1 - gamma) x_t``, and the client optimiser steps on
   ``g1``.
2. At ``p = (w' + x_t) / 2`` (``w'`` the stepped model), ``g2 = grad CE(f(p; x_s), softmax(f(x_t; x_s)))`` on
   *pseudo* data and ``g3 = grad CE(f(p; x_p), y)`` on *perturbed* data, and with ``d = w' - x_t``:
   ``w'' = w' - a g2 - b g3``, ``a = max(0, <d, g2> / |g2|^2)``, ``b = max(0, <d - a g2, g3> / |g3|^2)``. The
   client's displacement thus never keeps a component that raises, to first order, the loss on the perturbed
   data (``<w'' - x_t, g3> <= 0``), nor on the pseudo data when the second projection is idle. This correction
   is not scaled by the learning rate and bypasses the optimiser's momentum, as in its code.

Pseudo and perturbed data are made from a batch of the client's data by ``p_iters`` signed-gradient *ascent*
steps on the global model's loss, ``x <- x + eta sign(grad_x CE(f(x_t; x), y))``, with ``eta = ps_eta``
(pseudo; labelled by the global model's soft prediction) and ``pt_eta`` (perturbed; the true labels), in
model-input units. Its code makes them once a round, one pass over the client's data, and reads entry
``j mod n_k / B`` at step ``j``; here each step makes its own from a random batch of the client's data (the
same distribution; as many input-gradient passes as steps rather than as batches in the data, which is fewer
at our CPU scales).

The server is FedAvg's (its code weighs clients equally: ``algorithm.weighting: uniform``); clients keep no
state.

References:
  Xu, Tong and Huang, "Acceleration of Federated Learning with Alleviated Forgetting in Local Training",
  ICLR 2022 (code: Zoesgithub/FedReg).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_lab.engine.components import ClientView, Component
from fedjax_lab.engine.local_training import sample_client_batch
from fedjax_lab.engine.tree_math import tree_add, tree_scale, tree_squared_norm, tree_sub, tree_vdot
from fedjax_lab.engine.types import Params
from fedjax_lab.engine.variables import merge_variables, split_variables
from fedjax_lab.models.tasks import Classifier, masked_mean

PROJECTION_POINT = 0.5  # beta of p = beta w' + (1 - beta) x_t, fixed in its code


def soft_cross_entropy(logits: jax.Array, targets: jax.Array, mask: jax.Array) -> jax.Array:
    """``mean_i -sum_c t_ic log softmax(logits)_ic`` over the rows where ``mask`` is set (soft or one-hot
    ``t``)."""
    return masked_mean(-jnp.sum(targets * jax.nn.log_softmax(logits), -1), mask)


def signed_ascent(logits_fn, x: jax.Array, targets: jax.Array, mask: jax.Array, eta: float | jax.Array,
                  steps: int) -> jax.Array:
    """``steps`` of ``x <- x + eta sign(grad_x CE(logits_fn(x), targets))`` (its code's ``FSGM``,
    unclipped)."""
    grad_x = jax.grad(lambda z: soft_cross_entropy(logits_fn(z), targets, mask))

    def step(z, _):
        return z + eta * jnp.sign(grad_x(z)), None

    return jax.lax.scan(step, x, None, length=steps)[0]


class Regularisation(NamedTuple):
    """A step's pseudo data (inputs, the global model's soft labels) and perturbed data (inputs, one-hot
    labels), with the rows' mask."""

    pseudo_x: jax.Array
    pseudo_targets: jax.Array
    perturbed_x: jax.Array
    perturbed_targets: jax.Array
    mask: jax.Array


def regularisation_data(classifier: Classifier, global_variables: Params, batch: dict, key: jax.Array,
                        num_classes: int, p_iters: int, ps_eta: float, pt_eta: float) -> Regularisation:
    """Pseudo and perturbed data from a raw batch of the client's (augmented as for training), by
    :func:`signed_ascent` on the global model in evaluation mode."""
    raw = batch["x"] if classifier.augment is None else classifier.augment(key, batch)
    x = classifier.preprocess(raw)
    one_hot = jax.nn.one_hot(batch["y"], num_classes)

    def logits_fn(z):
        return classifier.apply_inputs(global_variables, z)[0]

    pseudo = signed_ascent(logits_fn, x, one_hot, batch["mask"], ps_eta, p_iters)
    perturbed = signed_ascent(logits_fn, x, one_hot, batch["mask"], pt_eta, p_iters)
    soft = jax.lax.stop_gradient(jax.nn.softmax(logits_fn(pseudo)))
    return Regularisation(pseudo, soft, perturbed, one_hot, batch["mask"])


def project_displacement(displacement: Params, g2: Params, g3: Params) -> Params:
    """Step 2's correction ``-a g2 - b g3`` of the displacement ``d`` (``a``, ``b`` as in the module
    docstring)."""
    a = jnp.maximum(0.0, tree_vdot(displacement, g2) / (tree_squared_norm(g2) + 1e-30))
    rest = tree_sub(displacement, tree_scale(g2, a))
    b = jnp.maximum(0.0, tree_vdot(rest, g3) / (tree_squared_norm(g3) + 1e-30))
    return tree_scale(tree_add(tree_scale(g2, a), tree_scale(g3, b)), -1.0)


def alleviated_forgetting(classifier: Classifier, num_classes: int, gamma: float = 0.5, p_iters: int = 10,
                          ps_eta: float = 0.1, pt_eta: float = 0.001, batch_size: int = 64) -> Component:
    """FedReg's change to the round: the gradient at the slow-update point, the regularisation data beside
    each batch, and the projection after each optimiser step (see the module docstring)."""
    if classifier.input_dtype != "float32":
        raise ValueError("algorithm: fedreg perturbs inputs by gradient ascent and needs real-valued "
                         f"inputs, got {classifier.input_dtype} (token) inputs")

    def grad_fn(view: ClientView, fn):
        anchor = split_variables(view.global_variables)[0]

        def at_slow_point(params, model_state, batch, key):
            return fn(tree_add(tree_scale(params, gamma), tree_scale(anchor, 1.0 - gamma)),
                      model_state, batch, key)

        return at_slow_point

    def batch(view: ClientView):
        def add_regularisation(b, step, key):
            source = sample_client_batch(view.client, view.arrays, jax.random.fold_in(view.key, step),
                                         batch_size)
            return {**b, "fedreg": regularisation_data(classifier, view.global_variables, source, key=key,
                                                       num_classes=num_classes, p_iters=p_iters,
                                                       ps_eta=ps_eta, pt_eta=pt_eta)}

        return add_regularisation

    def update(view: ClientView) -> optax.GradientTransformationExtraArgs:
        anchor, model_state = split_variables(view.global_variables)

        def loss_at(params, x, targets, mask):
            variables = merge_variables(params, model_state, view.global_variables)
            logits, _ = classifier.apply_inputs(variables, x, train=True)
            return soft_cross_entropy(logits, targets, mask)

        def project(updates, state, params, *, batch, **_):
            r: Regularisation = batch["fedreg"]
            stepped = optax.apply_updates(params, updates)
            point = tree_add(tree_scale(stepped, PROJECTION_POINT),
                             tree_scale(anchor, 1.0 - PROJECTION_POINT))
            g2 = jax.grad(loss_at)(point, r.pseudo_x, r.pseudo_targets, r.mask)
            g3 = jax.grad(loss_at)(point, r.perturbed_x, r.perturbed_targets, r.mask)
            return tree_add(updates, project_displacement(tree_sub(stepped, anchor), g2, g3)), state

        return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), project)

    return Component("fedreg", grad_fn=grad_fn, batch=batch, update=update)


def build(config, context) -> tuple[Component, ...]:
    """The components of ``algorithm.name: fedreg`` (or of a ``fedreg`` plug-in)."""
    return (alleviated_forgetting(context.classifier, context.dataset.num_classes, config.gamma,
                                  p_iters=config.p_iters, ps_eta=config.ps_eta, pt_eta=config.pt_eta,
                                  batch_size=context.config.client.batch_size),)
