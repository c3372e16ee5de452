"""FedAsync: its config, with its paper's defaults, registered by name.

The method itself, with its equations and builder, is ``method.py``. This file imports no JAX, so a config
validates in a fraction of a second; a name of ``method.py`` is also reached from here
(``from fedjax_lab.methods.fedasync import ...``), which imports it on first use.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt

from fedjax_lab.methods.registry import AlgorithmFields, lazy_method, method_name, register


@register()
class FedAsyncConfig(AlgorithmFields):
    """FedAsync (Xie et al. 2019): each arrival is mixed in, w <- (1 - a_t) w + a_t w_new, a_t = alpha
    s(tau)."""

    name: Literal["fedasync"] = method_name("fedasync")
    buffer_size: PositiveInt | None = Field(1, description="1: one server step per arrival (the paper)")
    alpha: float = Field(0.4, gt=0, le=1, description="mixing weight (Feddle's grid: 0.2, 0.4, 0.8)")
    staleness: Literal["constant", "polynomial", "hinge"] = Field("polynomial", description="s(tau)")
    a: float = Field(0.5, ge=0, description="polynomial: (1 + tau)^-a; hinge: 1 / (a (tau - b) + 1) "
                                            "(Feddle's grid: 0.1, 0.5, 0.9)")
    b: float = Field(4.0, ge=0, description="hinge: staleness up to b counts fully")
    rho: float = Field(0.0, ge=0, description="Alg. 1's client objective f(x) + rho/2 ||x - x_tau||^2, x_tau "
                                              "the model the client was sent (0: the plain local SGD "
                                              "Feddle's baselines run)")


__getattr__ = lazy_method(__name__)
