"""Model variables: what the optimisers train and what the model only carries (BatchNorm statistics).

A model's variables are either a Flax variable dict ``{'params': ..., 'batch_stats': ..., ...}`` or any other
pytree. Optimisers, client or server, see only the trainable part: the ``'params'`` collection of a Flax dict,
or the whole pytree otherwise. The other collections are *model state*: a loss function returns their new
value after a step, and aggregation averages them (the FedAvg convention for BatchNorm running statistics).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedjax_lab.engine.types import PyTree

ModelState = Mapping[str, Any]


def split_variables(variables: PyTree) -> tuple[PyTree, ModelState]:
    """``(trainable, model_state)``: a Flax dict's ``'params'`` and its other collections, or
    ``(variables, {})``."""
    if isinstance(variables, Mapping) and "params" in variables:
        return variables["params"], {name: value for name, value in variables.items() if name != "params"}
    return variables, {}


def merge_variables(trainable: PyTree, model_state: ModelState, like: PyTree) -> PyTree:
    """The inverse of :func:`split_variables`; ``like`` (the variables split) says which form to rebuild."""
    if isinstance(like, Mapping) and "params" in like:
        return {"params": trainable, **model_state}
    return trainable
