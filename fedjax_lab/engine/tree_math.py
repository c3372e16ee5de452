"""Small pytree arithmetic used by aggregation and by methods."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_lab.engine.types import PyTree


def tree_sub(a: PyTree, b: PyTree) -> PyTree:
    """``a - b`` leaf by leaf."""
    return jax.tree.map(jnp.subtract, a, b)


def tree_add(a: PyTree, b: PyTree) -> PyTree:
    """``a + b`` leaf by leaf."""
    return jax.tree.map(jnp.add, a, b)


def tree_scale(a: PyTree, s: jax.Array | float) -> PyTree:
    """``s * a`` leaf by leaf."""
    return jax.tree.map(lambda x: s * x, a)


def tree_squared_norm(a: PyTree) -> jax.Array:
    """``sum of squares`` over every leaf."""
    return sum(jnp.sum(jnp.square(leaf)) for leaf in jax.tree.leaves(a))


def tree_vdot(a: PyTree, b: PyTree) -> jax.Array:
    """``<a, b>`` summed over every leaf."""
    return sum(jnp.vdot(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def tree_zeros_like(a: PyTree) -> PyTree:
    """A tree of zeros shaped like ``a``."""
    return jax.tree.map(jnp.zeros_like, a)


def tree_where(pred: jax.Array, a: PyTree, b: PyTree) -> PyTree:
    """Selects ``a`` where the scalar ``pred`` is true, else ``b``."""
    return jax.tree.map(lambda x, y: jnp.where(pred, x, y), a, b)


def tree_stack_copies(a: PyTree, n: int) -> PyTree:
    """Stacks ``n`` copies of ``a`` along a new leading axis."""
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + jnp.shape(x)), a)


def tree_take(a: PyTree, ids: jax.Array) -> PyTree:
    """Rows ``ids`` of every leaf's leading axis."""
    return jax.tree.map(lambda x: x[ids], a)


def tree_put(a: PyTree, ids: jax.Array, rows: PyTree) -> PyTree:
    """``a`` with rows ``ids`` of the leading axis replaced by ``rows``."""
    return jax.tree.map(lambda x, r: x.at[ids].set(r), a, rows)


def tree_select(mask: jax.Array, on_true: PyTree, on_false: PyTree) -> PyTree:
    """Row ``k`` of every leaf from ``on_true`` where ``mask[k]``, else from ``on_false`` (leading axis)."""
    return jax.tree.map(lambda t, f: jnp.where(mask.reshape(mask.shape + (1,) * (t.ndim - 1)), t, f),
                        on_true, on_false)
