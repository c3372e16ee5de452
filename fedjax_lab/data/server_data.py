"""Data held by the server (FedWalk's leash set, Feddle's merging set), kept apart from every client.

* In-domain: rows carved from the training set before it is partitioned, so no client holds them.
* Out-of-domain: another dataset (e.g. CIFAR-100 for CIFAR-10), or classes of the same dataset that are
  withheld from the clients.
"""

from __future__ import annotations

import numpy as np

from fedjax_lab.data.partitions import PartitionError


def carve_in_domain(labels: np.ndarray, size: int, seed: int, stratified: bool = True) -> tuple[np.ndarray,
                                                                                                np.ndarray]:
    """``(server_rows, client_rows)``: ``size`` training rows for the server (class-balanced as far as the
    classes allow when ``stratified``, else uniform) and the remaining rows, for the partitioner."""
    if not 0 < size < len(labels):
        raise PartitionError(f"server_data.size must be in [1, {len(labels) - 1}], got {size}")
    rng = np.random.RandomState(seed)
    if stratified:
        classes = np.unique(labels)
        per_class = [rng.permutation(np.flatnonzero(labels == k)) for k in classes]
        # Round-robin over the shuffled classes keeps the server set balanced to within one row per class.
        order = np.concatenate([rows[i:i + 1] for i in range(max(map(len, per_class))) for rows in per_class])
        server = np.sort(order[:size])
    else:
        server = np.sort(rng.choice(len(labels), size, replace=False))
    return server, np.setdiff1d(np.arange(len(labels)), server)


def withhold_classes(labels: np.ndarray, classes: list[int], size: int, seed: int) -> tuple[np.ndarray,
                                                                                            np.ndarray]:
    """``(server_rows, client_rows)``: up to ``size`` random rows of ``classes`` for the server; clients get
    only the rows of the other classes."""
    held = np.isin(labels, classes)
    if not held.any() or held.all():
        raise PartitionError(f"server_data.classes must name some but not all classes, got {classes}")
    rows = np.flatnonzero(held)
    server = np.sort(np.random.RandomState(seed).permutation(rows)[:size])
    return server, np.flatnonzero(~held)


def sample_rows(num_rows: int, size: int, seed: int) -> np.ndarray:
    """``size`` distinct random rows of another dataset (out-of-domain server data)."""
    if not 0 < size <= num_rows:
        raise PartitionError(f"server_data.size must be in [1, {num_rows}], got {size}")
    return np.sort(np.random.RandomState(seed).choice(num_rows, size, replace=False))
