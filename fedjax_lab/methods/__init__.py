"""FL methods, one per file, each an :class:`fedjax_lab.engine.Algorithm` built from the engine's pieces."""

from fedjax_lab.methods.fedavg import fedavg
from fedjax_lab.methods.server_optimizers import fedavg_server, fedavgm_server, reddi_server, scale_by_reddi

__all__ = ["fedavg", "fedavg_server", "fedavgm_server", "reddi_server", "scale_by_reddi"]
