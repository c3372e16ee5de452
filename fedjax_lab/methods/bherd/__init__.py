"""BHerd: its config, with its paper's defaults, registered by name.

The method itself, with its equations and builder, is ``method.py``. This file imports no JAX, so a config
validates in a fraction of a second; a name of ``method.py`` is also reached from here
(``from fedjax_lab.methods.bherd import ...``), which imports it on first use.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedjax_lab.methods.registry import AlgorithmFields, lazy_method, method_name, register


@register(plugin=True)
class BHerdConfig(AlgorithmFields):
    """BHerd (Luo et al. 2024): clients send the herded sum of alpha of their local steps, rescaled by
    1/alpha."""

    name: Literal["bherd"] = method_name("bherd")
    alpha: float = Field(0.5, gt=0, le=1, description="fraction of local steps kept, k = round(alpha tau) "
                                                      "(the paper: 0.5; 1 is FedAvg)")
    selection: Literal["herding", "topk_nearest"] = Field(
        "herding", description="herding: Alg. 2 (BHerd); topk_nearest: the ablation keeping the k steps "
                               "nearest the mean")
    rescale: Literal["nominal", "exact"] = Field("nominal", description="scale the kept sum by 1/alpha (Eq. "
                                                                        "7) or by tau/k")
    diagnostics: bool = Field(True, description="record each client's selected steps and the Fig. 4d "
                                                "distance (array metrics in RUN_DIR/arrays)")


__getattr__ = lazy_method(__name__)
