"""Data: the federated dataset container, sources (archives, image folders, tfds, Shakespeare, embedded
synthetic sets), partitioners, server-side data and partition reports."""

from fedjax_lab.data import partitions
from fedjax_lab.data.federated import FederatedDataset, index_table
from fedjax_lab.data.report import load_partition, save_partition, write_partition_report
from fedjax_lab.data.shakespeare import load_shakespeare
from fedjax_lab.data.sources import (
    CentralDataset,
    load_archive,
    load_image_folder,
    load_local,
    relabel_parity,
)
from fedjax_lab.data.synthetic import fedprox_synthetic, gaussian_mixture

__all__ = [
    "CentralDataset", "FederatedDataset", "fedprox_synthetic", "gaussian_mixture", "index_table",
    "load_archive", "load_image_folder", "load_local", "load_partition", "load_shakespeare", "partitions",
    "relabel_parity", "save_partition", "write_partition_report",
]
