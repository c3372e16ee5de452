"""VHL: its config, with its paper's defaults, registered by name.

The method itself, with its equations and builder, is ``method.py``. This file imports no JAX, so a config
validates in a fraction of a second; a name of ``method.py`` is also reached from here
(``from fedjax_lab.methods.vhl import ...``), which imports it on first use.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt

from fedjax_lab.methods.registry import AlgorithmFields, lazy_method, method_name, register


@register(plugin=True)
class VHLConfig(AlgorithmFields):
    """VHL (Tang et al. 2022; FedCOG's baseline): clients also fit a fixed virtual dataset of noise images
    shared by all, and align their classes' features with the virtual classes'."""

    name: Literal["vhl"] = method_name("vhl")
    alpha: float = Field(
        1.0, ge=0, description="weight of the virtual data's cross-entropy (its code's script: 1)")
    align_weight: float = Field(1.0, ge=0, description="weight of the supervised-contrastive alignment of "
                                                       "natural features with the (detached) virtual ones")
    virtual_weight: float = Field(
        0.1, ge=0, description="weight of the contrastive term among the virtual features")
    temperature: PositiveFloat = Field(0.07, description="SupCon's temperature")
    virtual_classes: PositiveInt | None = Field(
        None, description="V, classes of the virtual dataset (default: the dataset's number of classes)")
    per_class: PositiveInt = Field(200, description="virtual images per class (its code's generate.sh: 200)")
    batch_size: PositiveInt | None = Field(None, description="virtual images beside each real batch "
                                                             "(default: client.batch_size, as its code's "
                                                             "equal 128s)")
    labels: Literal["extra", "shared"] = Field(
        "extra", description="extra: virtual class c is label K + c of a head widened to K + V outputs (its "
                             "code); shared: label c of the K-way head")

    def extra_outputs(self, num_classes: int) -> int:
        """The model's outputs beyond the dataset's classes: V under ``labels: extra``."""
        return (self.virtual_classes or num_classes) if self.labels == "extra" else 0


__getattr__ = lazy_method(__name__)
