"""FedProx: clients minimise ``f_k(w) + mu/2 ||w - x_t||^2``; the proximal term anchors them to the global
model ``x_t`` (``mu = 0`` is FedAvg).

References:
  Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020, Eq. (2).
"""

from __future__ import annotations

from fedjax_lab.engine.components import ClientView, Component
from fedjax_lab.engine.local_training import LossTerm
from fedjax_lab.engine.tree_math import tree_squared_norm, tree_sub
from fedjax_lab.engine.types import Params
from fedjax_lab.engine.variables import split_variables


def proximal_term(anchor: Params, mu: float) -> LossTerm:
    """``mu/2 ||w - anchor||^2`` over the trainable parameters ``w``."""
    anchor_params = split_variables(anchor)[0]

    def term(variables, batch, forward):
        return 0.5 * mu * tree_squared_norm(tree_sub(split_variables(variables)[0], anchor_params))

    return term


def proximal(mu: float) -> Component:
    """FedProx's change to the round: the proximal term to the round's global model in every client's loss."""

    def loss_term(view: ClientView) -> LossTerm:
        return proximal_term(view.global_variables, mu)

    return Component("fedprox", loss_term=loss_term)


def build(config, context) -> tuple[Component, ...]:
    """The components of ``algorithm.name: fedprox`` (or of a ``fedprox`` plug-in)."""
    return (proximal(config.mu),)
