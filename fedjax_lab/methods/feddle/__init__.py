"""Feddle: its config, with its paper's defaults, registered by name.

The method itself, with its equations and builder, is ``method.py``. This file imports no JAX, so a config
validates in a fraction of a second; a name of ``method.py`` is also reached from here
(``from fedjax_lab.methods.feddle import ...``), which imports it on first use.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt

from fedjax_lab.methods.registry import AlgorithmFields, lazy_method, method_name, register


@register(needs_server_data=True)
class FeddleConfig(AlgorithmFields):
    """Feddle (Zhu et al.): coefficients over an atlas of client updates, searched on the server's data."""

    name: Literal["feddle"] = method_name("feddle")
    atlas_size: PositiveInt = Field(
        20, description="M, anchors kept (the paper: twice the clients per round)")
    search_steps: int = Field(
        20, ge=0, description="T, optimiser steps on the coefficients a round (0: FedBuff)")
    search_learning_rate: PositiveFloat = Field(
        1e-3, description="Adam's rate on c (the paper's grid: 1e-5 to 1e-3)")
    search_batch_size: PositiveInt = Field(64, description="server examples per search step")
    regularization: float = Field(0.0, ge=0, description="lambda of the pull towards the fallback (Eq. 11; "
                                                        "the paper: 0 in-domain, 0.01 out-of-domain)")
    fallback_learning_rate: PositiveFloat = Field(1.0, description="eta_g of the FedBuff fallback")
    fallback_init: bool = Field(
        True, description="start the search at the fallback (false: at 0, the ablation)")
    normalize: bool = Field(True, description="rescale anchors to their median norm (Eq. 5)")
    eviction: Literal["importance", "fifo"] = Field(
        "importance", description="which anchor a full atlas drops")
    head_steps: int = Field(
        20, ge=0, description="out-of-domain: Adam steps on the surrogate head a round (Eq. 9)")
    head_learning_rate: PositiveFloat = Field(1e-3, description="out-of-domain: the surrogate head's rate")
    probe_examples: int = Field(0, ge=0, description="diagnostic (Fig. 7): the cosine of the search's "
                                                     "coefficient gradient with that of the task's loss on "
                                                     "this many test rows, never searched on (0: off)")


__getattr__ = lazy_method(__name__)
