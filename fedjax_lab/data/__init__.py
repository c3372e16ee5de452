"""Data: the federated dataset container and the embedded (generated) datasets."""

from fedjax_lab.data.federated import FederatedDataset, index_table
from fedjax_lab.data.synthetic import fedprox_synthetic, gaussian_mixture

__all__ = ["FederatedDataset", "fedprox_synthetic", "gaussian_mixture", "index_table"]
