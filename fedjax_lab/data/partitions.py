"""Partitioners: deal the rows of a labelled training set to clients, deterministically from a seed.

Each returns one array of row indices per client. The conventions follow the libraries the papers build on
(``shared/papers/partitioning.md``); where we differ from a library, the docstring says so.

References:
  NIID-Bench: Li et al., "Federated Learning on Non-IID Data Silos: An Experimental Study", ICDE 2022.
  FedAvg shards: McMahan et al., AISTATS 2017.
  BHerd cases: the BHerd reference code (see ``shared/papers/001_bherd.md``).
"""

from __future__ import annotations

import numpy as np

ClientRows = list[np.ndarray]


class PartitionError(ValueError):
    """A partition cannot be made with the given settings; the message names the field and what to change."""


def _check_clients(num_clients: int, num_examples: int) -> None:
    if num_clients < 1:
        raise PartitionError(f"dataset.partition.num_clients must be >= 1, got {num_clients}")
    if num_clients > num_examples:
        raise PartitionError(f"dataset.partition.num_clients must be <= the number of training examples "
                             f"({num_examples}), got {num_clients}")


def _check_alpha(alpha: float) -> None:
    if not alpha > 0:
        raise PartitionError(f"dataset.partition.alpha must be > 0, got {alpha}")


def iid(labels: np.ndarray, num_clients: int, seed: int) -> ClientRows:
    """A uniform random permutation cut into ``num_clients`` near-equal parts (sizes differ by at most
    one)."""
    _check_clients(num_clients, len(labels))
    return [np.sort(part) for part in np.array_split(np.random.RandomState(seed).permutation(len(labels)),
                                                     num_clients)]


def dirichlet_label_skew(labels: np.ndarray, num_clients: int, alpha: float, seed: int, num_classes: int,
                         min_size: int = 10, max_attempts: int = 100) -> ClientRows:
    """NIID-Bench's ``noniid-labeldir`` procedure (used verbatim by FedML, FedLab, PFLlib, FedCOG).

    With ``np.random.seed(seed)`` semantics (one ``RandomState``), repeat until every client holds at least
    ``min_size`` rows: for each class k in order, shuffle its rows, draw ``p ~ Dir(alpha 1_n)``, zero ``p_j``
    for clients already holding ``>= N / n`` rows (balancing), renormalise, and cut the shuffled rows at
    ``(cumsum(p) * n_k).astype(int)[:-1]``. Finally each client's rows are shuffled. The only departure is
    the cap: after ``max_attempts`` failed attempts it raises instead of looping forever.

    Raises:
      PartitionError: ``alpha <= 0``, more clients than rows, or no valid partition within ``max_attempts``.
    """
    _check_alpha(alpha)
    _check_clients(num_clients, len(labels))
    rng = np.random.RandomState(seed)
    n = len(labels)
    for _ in range(max_attempts):
        client_rows: list[list[int]] = [[] for _ in range(num_clients)]
        for k in range(num_classes):
            rows_k = np.where(labels == k)[0]
            rng.shuffle(rows_k)
            p = rng.dirichlet(np.repeat(alpha, num_clients))
            p = np.array([p_j * (len(rows_j) < n / num_clients) for p_j, rows_j in zip(p, client_rows)])
            p = p / p.sum()
            cuts = (np.cumsum(p) * len(rows_k)).astype(int)[:-1]
            client_rows = [rows_j + part.tolist()
                           for rows_j, part in zip(client_rows, np.split(rows_k, cuts))]
            smallest = min(len(rows_j) for rows_j in client_rows)
        if smallest >= min_size:
            out = []
            for rows_j in client_rows:
                rows_j = np.asarray(rows_j, np.int64)
                rng.shuffle(rows_j)
                out.append(rows_j)
            return out
    raise PartitionError(
        f"dataset.partition: Dirichlet(alpha={alpha}) did not give each of {num_clients} clients >= "
        f"min_size={min_size} rows in max_attempts={max_attempts} attempts; raise alpha, "
        "lower num_clients or min_size, or raise max_attempts")


def dirichlet_client_mix(labels: np.ndarray, num_clients: int, alpha: float, seed: int, num_classes: int,
                         client_size: int | None = None) -> ClientRows:
    """Client-centric Dirichlet (the family of Hsu et al. 2019, Reddi et al. 2021, pfl-research): each client
    draws its own class mix ``q ~ Dir(alpha 1_K)`` and ``client_size`` rows (default ``N // num_clients``),
    class by class from ``q`` restricted to the classes that still have rows left.

    Unlike pfl-research's per-sample redraws (with a 2% smoothing after repeated failures), exhausted classes
    are removed from ``q`` and it is renormalised; the outcome has the same distribution family.
    """
    _check_alpha(alpha)
    _check_clients(num_clients, len(labels))
    rng = np.random.RandomState(seed)
    size = client_size or len(labels) // num_clients
    if size * num_clients > len(labels):
        raise PartitionError(f"dataset.partition.client_size * num_clients must be <= {len(labels)} rows, "
                             f"got {size} * {num_clients}")
    pools = []
    for k in range(num_classes):
        rows_k = np.where(labels == k)[0]
        rng.shuffle(rows_k)
        pools.append(list(rows_k))
    out = []
    for _ in range(num_clients):
        q = rng.dirichlet(np.repeat(alpha, num_classes))
        taken: list[int] = []
        while len(taken) < size:
            available = np.array([len(pool) > 0 for pool in pools])
            p = q * available
            p = p / p.sum() if p.sum() > 0 else available / available.sum()
            counts = rng.multinomial(size - len(taken), p)
            for k in np.flatnonzero(counts):
                grab = min(counts[k], len(pools[k]))
                taken += pools[k][:grab]
                del pools[k][:grab]
        out.append(np.asarray(taken, np.int64))
    return out


def classes_per_client(labels: np.ndarray, num_clients: int, classes: int, seed: int,
                       num_classes: int) -> ClientRows:
    """NIID-Bench's ``noniid-#label{k}``: client i holds class ``i mod K`` plus ``classes - 1`` further
    distinct random classes; each class's shuffled rows are split evenly (``array_split``) among its holders.
    Classes that no client holds are left out. (NIID-Bench draws the extra classes with Python's ``random``;
    here everything comes from one ``RandomState``.)"""
    _check_clients(num_clients, len(labels))
    if not 1 <= classes <= num_classes:
        raise PartitionError(f"dataset.partition.classes must be in [1, {num_classes}], got {classes}")
    rng = np.random.RandomState(seed)
    holds = []
    for i in range(num_clients):
        current = [i % num_classes]
        while len(current) < classes:
            k = int(rng.randint(0, num_classes))
            if k not in current:
                current.append(k)
        holds.append(current)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for k in range(num_classes):
        holders = [i for i in range(num_clients) if k in holds[i]]
        rows_k = np.where(labels == k)[0]
        rng.shuffle(rows_k)
        for i, split in zip(holders, np.array_split(rows_k, len(holders)) if holders else []):
            parts[i].append(split)
    return [np.concatenate(p).astype(np.int64) for p in parts]


def class_blocks(labels: np.ndarray, num_clients: int, classes: int, num_classes: int) -> ClientRows:
    """FedCOG's NIID-2 (its code's ``noniid-skew``), deterministic: the classes form ``C / classes`` blocks of
    consecutive classes, client ``i`` holds block ``i mod (C / classes)``, and each class's rows, in dataset
    order, are cut into equal contiguous pieces among the clients of its block. With 10 clients and 2 classes,
    clients 0 and 5 hold classes {0, 1}, each half of every row of those classes.

    Raises:
      PartitionError: ``classes`` does not divide the classes, or the blocks do not divide the clients.
    """
    _check_clients(num_clients, len(labels))
    if not 1 <= classes <= num_classes or num_classes % classes:
        raise PartitionError(f"dataset.partition.classes must divide the {num_classes} classes, "
                             f"got {classes}")
    blocks = num_classes // classes
    if num_clients % blocks:
        raise PartitionError(f"class_blocks: {blocks} blocks of {classes} classes need "
                             f"dataset.partition.num_clients to be a multiple of {blocks}, got {num_clients}")
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for k in range(num_classes):
        holders = [i for i in range(num_clients) if i % blocks == k // classes]
        for i, piece in zip(holders, np.array_split(np.flatnonzero(labels == k), len(holders))):
            parts[i].append(piece)
    return [np.concatenate(p).astype(np.int64) for p in parts]


def shards(labels: np.ndarray, num_clients: int, shards_per_client: int, seed: int) -> ClientRows:
    """FedAvg's pathological split: sort rows by label (stably), cut ``num_clients * shards_per_client``
    shards of ``N // (num_clients * shards_per_client)`` rows, and give each client that many random shards
    (the remainder rows are unused). MNIST with 100 clients x 2 shards = 200 shards of 300."""
    num_shards = num_clients * shards_per_client
    _check_clients(num_shards, len(labels))
    shard_size = len(labels) // num_shards
    order = np.argsort(labels, kind="stable")
    assignment = np.random.RandomState(seed).permutation(num_shards)
    return [np.concatenate([order[s * shard_size:(s + 1) * shard_size]
                            for s in assignment[i * shards_per_client:(i + 1) * shards_per_client]])
            for i in range(num_clients)]


def quantity_skew(labels: np.ndarray, num_clients: int, alpha: float, seed: int, min_size: int = 10,
                  max_attempts: int = 100) -> ClientRows:
    """NIID-Bench's ``iid-diff-quantity``: shuffle all rows, draw client proportions ``p ~ Dir(alpha 1_n)``
    until every client gets ``>= min_size`` rows, and cut at ``(cumsum(p) * N).astype(int)[:-1]``."""
    _check_alpha(alpha)
    _check_clients(num_clients, len(labels))
    rng = np.random.RandomState(seed)
    rows = rng.permutation(len(labels))
    for _ in range(max_attempts):
        p = rng.dirichlet(np.repeat(alpha, num_clients))
        if np.min(p * len(rows)) >= min_size:
            return np.split(rows, (np.cumsum(p) * len(rows)).astype(int)[:-1])
    raise PartitionError(f"dataset.partition: Dirichlet(alpha={alpha}) client sizes stayed below min_size="
                         f"{min_size} for {max_attempts} attempts; raise alpha or lower num_clients")


def feature_noise_levels(num_clients: int, noise: float) -> np.ndarray:
    """NIID-Bench's feature skew: client i's inputs get Gaussian noise with std ``noise * i / (n - 1)`` (on
    inputs scaled to [0, 1]); combine with :func:`iid`. Applied per step in training (fresh noise each
    read)."""
    if noise < 0:
        raise PartitionError(f"dataset.partition.noise must be >= 0, got {noise}")
    return noise * np.arange(num_clients) / max(num_clients - 1, 1)


def _class_to_clients(labels: np.ndarray, classes: list[int], clients: list[int], num_classes: int,
                      parts: list[list[np.ndarray]]) -> None:
    """BHerd Case 2 dealing: class y goes to ``clients[y mod len(clients)]``; with more clients than classes,
    class y is split evenly (in native order) over the clients c with ``c mod K == y``."""
    for y in classes:
        rows_y = np.where(labels == y)[0]
        if len(clients) <= num_classes:
            parts[clients[y % len(clients)]].append(rows_y)
        else:
            holders = [c for i, c in enumerate(clients) if i % num_classes == y % num_classes]
            for c, split in zip(holders, np.array_split(rows_y, len(holders))):
                parts[c].append(split)


def bherd_case(labels: np.ndarray, num_clients: int, case: int, num_classes: int) -> ClientRows:
    """BHerd's three partitions as its reference code builds them (no randomness; native order kept).

    * Case 1 (IID): row j goes to client ``j mod N``.
    * Case 2 (non-IID): class y goes to client ``y mod N`` (N = 5: client k holds classes {k, k+5}).
    * Case 3 (mixed): the first half of the classes go round-robin to the first ``ceil(N/2)`` clients; the
      other classes go to the other clients as in Case 2.
    """
    _check_clients(num_clients, len(labels))
    if case not in (1, 2, 3):
        raise PartitionError(f"dataset.partition.case must be 1, 2 or 3, got {case}")
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    if case == 1:
        rows = np.arange(len(labels))
        return [rows[rows % num_clients == i] for i in range(num_clients)]
    if case == 2:
        _class_to_clients(labels, list(range(num_classes)), list(range(num_clients)), num_classes, parts)
    else:
        if num_clients < 2:
            raise PartitionError("dataset.partition.num_clients must be >= 2 for BHerd case 3")
        half_classes, half_clients = num_classes // 2, -(-num_clients // 2)
        first = np.flatnonzero(labels < half_classes)
        for i in range(half_clients):
            parts[i].append(first[i::half_clients])
        _class_to_clients(labels, list(range(half_classes, num_classes)),
                          list(range(half_clients, num_clients)), num_classes, parts)
    empty = [i for i, p in enumerate(parts) if not p]
    if empty:
        raise PartitionError(f"dataset.partition: BHerd case {case} leaves clients {empty} empty with "
                             f"{num_clients} clients and {num_classes} classes")
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]


def class_counts(labels: np.ndarray, client_rows: ClientRows, num_classes: int) -> np.ndarray:
    """``[num_clients, num_classes]`` int: how many rows of each class each client holds."""
    return np.stack([np.bincount(labels[rows], minlength=num_classes) for rows in client_rows])
