"""FedAvg and its server-optimiser family (FedAvgM, FedAdam, FedYogi, FedAdagrad), and the reference runs:
their configs, with their papers' defaults, registered by name.

The method itself, with its equations and builder, is ``method.py``. This file imports no JAX, so a config
validates in a fraction of a second; a name of ``method.py`` is also reached from here
(``from fedjax_lab.methods.fedavg import ...``), which imports it on first use.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, create_model

from fedjax_lab.methods.registry import AlgorithmFields, lazy_method, method_name, register


@register()
class FedAvgConfig(AlgorithmFields):
    """FedAvg (McMahan et al. 2017): SGD at ``server_learning_rate`` on the averaged delta."""

    name: Literal["fedavg"] = method_name("fedavg")


def _family(name: str, rule: str, doc: str) -> type[AlgorithmFields]:
    config = create_model(f"{name.capitalize()}Config", __base__=AlgorithmFields, __doc__=doc,
                          name=(Literal[name], method_name(name)),
                          server_optimizer=(Literal["sgd", "momentum", "momentum_fedcog", "adam", "yogi",
                                                    "adagrad"], Field(rule)))
    return register()(config)


FedAvgMConfig = _family("fedavgm", "momentum", "FedAvgM: server momentum (Hsu et al. 2019).")
FedAdamConfig = _family("fedadam", "adam", "FedAdam (Reddi et al. 2021, Algorithm 2).")
FedYogiConfig = _family("fedyogi", "yogi", "FedYogi (Reddi et al. 2021, Algorithm 2).")
FedAdagradConfig = _family("fedadagrad", "adagrad", "FedAdagrad (Reddi et al. 2021, Algorithm 2).")


@register(reference=True)
class CentralizedConfig(AlgorithmFields):
    """Reference: FedAvg on one client holding the pooled training data."""

    name: Literal["centralized"] = method_name("centralized")


@register(reference=True)
class ServerOnlyConfig(AlgorithmFields):
    """Reference: FedAvg on one client holding only the server's data."""

    name: Literal["server_only"] = method_name("server_only")


__getattr__ = lazy_method(__name__)
