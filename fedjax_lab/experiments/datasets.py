"""From ``config.dataset`` to a :class:`FederatedDataset`: load, carve server data, partition, index."""

from __future__ import annotations

import dataclasses
import difflib

import numpy as np

from fedjax_lab.data import partitions
from fedjax_lab.data.federated import FederatedDataset, index_table
from fedjax_lab.data.report import load_partition
from fedjax_lab.data.server_data import carve_in_domain, sample_rows, withhold_classes
from fedjax_lab.data.shakespeare import load_shakespeare
from fedjax_lab.data.sources import CentralDataset, load_image_folder, load_local, relabel_parity
from fedjax_lab.data.synthetic import fedprox_synthetic, gaussian_mixture
from fedjax_lab.experiments.config import Config, ConfigError, ImageDataset, PartitionConfig, ServerDataConfig


def load_central(d: ImageDataset, name: str | None = None, relabel: bool = True) -> CentralDataset:
    """The centralised dataset ``name`` (default ``d.name``) from ``d.source``, with ``d.labels`` applied
    (``parity`` only with ``relabel``). Another dataset (out-of-domain server data) keeps its own labels
    (CIFAR-100's fine ones)."""
    labels = d.labels if name in (None, d.name) else "fine"
    name = name or d.name
    if name == "image_folder":
        data = load_image_folder(d.data_dir)
    elif d.source == "tfds":
        from fedjax_lab.data.tfds_source import load_tfds

        raw = load_tfds(d.tfds_name or name, d.data_dir,
                        label_key="coarse_label" if labels == "coarse" else "label")
        data = CentralDataset(name, raw["train"], raw["test"], raw["num_classes"], tuple(raw["class_names"]))
    else:
        data = load_local(name, d.data_dir, "coarse" if labels == "coarse" else "fine")
    return relabel_parity(data) if labels == "parity" and relabel else data


def partition_rows(labels: np.ndarray, p: PartitionConfig, num_classes: int, seed: int) -> list[np.ndarray]:
    """Client rows (indices into ``labels``) for the partition ``p``."""
    n = p.num_clients
    if p.name in ("iid", "feature_skew"):
        return partitions.iid(labels, n, seed)
    if p.name == "dirichlet":
        return partitions.dirichlet_label_skew(labels, n, p.alpha, seed, num_classes, p.min_size,
                                               p.max_attempts)
    if p.name == "dirichlet_client":
        return partitions.dirichlet_client_mix(labels, n, p.alpha, seed, num_classes, p.client_size)
    if p.name == "classes_per_client":
        return partitions.classes_per_client(labels, n, p.classes, seed, num_classes)
    if p.name == "class_blocks":
        return partitions.class_blocks(labels, n, p.classes, num_classes)
    if p.name == "shards":
        return partitions.shards(labels, n, p.shards_per_client, seed)
    if p.name == "quantity_skew":
        return partitions.quantity_skew(labels, n, p.alpha, seed, p.min_size, p.max_attempts)
    return partitions.bherd_case(labels, n, p.case, num_classes)


def class_ids(classes: tuple[int | str, ...], data: CentralDataset) -> list[int]:
    """``dataset.server_data.classes`` as label ids of ``data``; names are looked up in its class names.

    Raises:
      ConfigError: an id out of range or a name the dataset does not have (the message lists the names).
    """
    ids = []
    for c in classes:
        if isinstance(c, str):
            if c not in data.class_names:
                close = difflib.get_close_matches(c, data.class_names, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"dataset.server_data.classes: {data.name} has no class {c!r}{hint} "
                                  "(allowed: "
                                  f"{', '.join(data.class_names) or f'ids 0..{data.num_classes - 1}'})")
            c = data.class_names.index(c)
        if not 0 <= c < data.num_classes:
            raise ConfigError(f"dataset.server_data.classes: {c} is not a class id of {data.name} "
                              f"(0..{data.num_classes - 1})")
        ids.append(int(c))
    if len(set(ids)) != len(ids):
        raise ConfigError(f"dataset.server_data.classes: a class is listed twice in {list(classes)}")
    return ids


def server_split(d: ImageDataset, s: ServerDataConfig, data: CentralDataset,
                 seed: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """``(server_arrays, client_rows)``: the server's data and the training rows left for the clients."""
    labels = data.train["y"]
    if s.kind == "in_domain":
        server_rows, rest = carve_in_domain(labels, s.size, seed, s.stratified)
    elif s.kind == "withheld_classes":
        server_rows, rest = withhold_classes(labels, class_ids(s.classes, data), s.size, seed)
    else:
        other = load_central(d.model_copy(update={"data_dir": s.data_dir or d.data_dir}), s.dataset,
                             relabel=False)
        if other.input_shape != data.input_shape:
            raise ConfigError(f"dataset.server_data.dataset: {s.dataset} inputs {other.input_shape} do not "
                              f"match {d.name} inputs {data.input_shape}")
        x, y = other.train["x"], other.train["y"]
        if s.classes:  # keep the listed classes only, relabelled by their position in the list
            keep = class_ids(s.classes, other)
            new_label = np.full(other.num_classes, -1, y.dtype)
            new_label[keep] = np.arange(len(keep))
            selected = np.flatnonzero(new_label[y] >= 0)
            x, y = x[selected], new_label[y[selected]]
        rows = sample_rows(len(y), min(s.size, len(y)), seed)
        return {"x": x[rows], "y": y[rows]}, np.arange(len(labels))
    return {"x": data.train["x"][server_rows], "y": labels[server_rows]}, rest


def _base_name(name: str) -> str:
    """A dataset's name without what the run made of it (``mnist-parity``, ``mnist (centralized)``:
    ``mnist``)."""
    return name.split(" (")[0].removesuffix("-parity")


def reload_partition(path: str, num_clients: int, dataset_name: str | None,
                     client_rows: np.ndarray) -> list[np.ndarray]:
    """A saved partition (``dataset.partition.file``), checked against the run: its dataset (unless
    ``dataset_name`` is ``None``), its number of clients, and rows that are all among ``client_rows`` (the
    training rows left for clients: not past the end of the data, or of ``dataset.subset``, and none of the
    server's).

    Raises:
      ConfigError: the file cannot be read, or it was made for other data.
    """
    rows, meta = load_partition(path)
    saved = meta.get("dataset")
    if dataset_name is not None and isinstance(saved, str) and _base_name(saved) != _base_name(dataset_name):
        raise ConfigError(f"dataset.partition.file: {path} was made for {saved!r}, not {dataset_name!r}; "
                          f"partition {dataset_name} with fedjax-lab partition, or use that dataset")
    if len(rows) != num_clients:
        raise ConfigError(f"dataset.partition.file holds {len(rows)} clients, but "
                          f"dataset.partition.num_clients is {num_clients}")
    every = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    outside = every[~np.isin(every, client_rows)]
    if len(outside):
        raise ConfigError(f"dataset.partition.file: {path} deals rows the clients cannot have "
                          f"({len(outside)} of {len(every)}, e.g. row {int(outside[0])}): the clients' rows "
                          f"here are {len(client_rows)} of {dataset_name or 'the dataset'} (after "
                          "dataset.subset and dataset.server_data); "
                          "was it made for a larger dataset or other server data?")
    return rows


def build_image_dataset(d: ImageDataset, seed: int) -> FederatedDataset:
    """Loads, carves server data, partitions the rest (or reloads ``partition.file``) and indexes the clients.

    With ``labels: parity`` the server data and the partition follow the original classes (BHerd's case 2
    gives client k the digits {k, k+5}), and the labels become even/odd afterwards. With
    ``partition.by: fine_label`` CIFAR-100 is dealt by its fine classes and learnt by its superclasses
    (Feddle)."""
    data = load_central(d, relabel=False)
    if d.subset is not None:
        data = dataclasses.replace(data, train={k: v[:d.subset] for k, v in data.train.items()})
    server, rows = None, np.arange(len(data.train["y"]))
    if d.server_data is not None and d.server_data.split == "test":
        s = d.server_data
        server_rows, rest = carve_in_domain(data.test["y"], s.size, seed, s.stratified)
        server = {"x": data.test["x"][server_rows], "y": data.test["y"][server_rows]}
        data = dataclasses.replace(data, test={k: v[rest] for k, v in data.test.items()})
    elif d.server_data is not None:
        server, rows = server_split(d, d.server_data, data, seed)
    p = d.partition
    if p.file:
        # An image folder is named by its path, which a copy (node-local scratch) changes: rows alone checked.
        client_rows = reload_partition(p.file, p.num_clients, None if d.name == "image_folder" else data.name,
                                       rows)
    else:
        labels, num_classes = data.train["y"], data.num_classes
        if p.by == "fine_label":
            fine = load_central(d.model_copy(update={"labels": "fine"}))
            labels, num_classes = fine.train["y"][: len(labels)], fine.num_classes
        local = partition_rows(labels[rows], p, num_classes, seed if p.seed is None else p.seed)
        client_rows = [rows[r] for r in local]
    train = dict(data.train)
    if p.name == "feature_skew":
        levels = partitions.feature_noise_levels(p.num_clients, p.noise)
        train["noise_std"] = np.zeros(len(train["y"]), np.float32)
        for k, r in enumerate(client_rows):
            train["noise_std"][r] = levels[k]
    if d.labels == "parity":
        parity = relabel_parity(data)
        data = dataclasses.replace(parity,
                                   train={**parity.train, **{k: v for k, v in train.items() if k != "y"}})
        train = data.train
        if server is not None:
            server = {**server, "y": (server["y"] % 2 == 0).astype(np.int32)}
    ids, counts = index_table(client_rows)
    return FederatedDataset(data.name, train, data.test, ids, counts, data.num_classes,
                            class_names=data.class_names, server=server)


def build_dataset(config: Config) -> FederatedDataset:
    """The federated dataset named by ``config.dataset``.

    Raises:
      ConfigError: a missing file, an impossible partition, or server data that does not fit.
    """
    d = config.dataset
    seed = config.seed if getattr(d, "seed", None) is None else d.seed
    try:
        if d.name == "synthetic":
            return fedprox_synthetic(d.alpha, d.beta, d.num_clients, d.iid, d.dimension, d.num_classes,
                                     d.train_fraction, seed)
        if d.name == "gaussian_mixture":
            return gaussian_mixture(d.num_clients, d.examples_per_client, d.num_classes, d.dimension,
                                    d.separation, d.label_alpha, d.train_fraction, seed)
        if d.name == "shakespeare":
            return load_shakespeare(d.data_dir, d.sequence_length, d.num_clients)
        return build_image_dataset(d, seed)
    except (FileNotFoundError, ValueError, ImportError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(str(exc)) from None


def reference_view(dataset: FederatedDataset, reference: str) -> FederatedDataset:
    """The data of a reference run, as one client: every client's training rows pooled (``centralized``), or
    the server's data alone (``server_only``, Feddle's "Center")."""
    if reference == "centralized":
        rows = np.concatenate([dataset.client_train_ids[k, :n]
                               for k, n in enumerate(dataset.client_train_counts)])
        train = dataset.train
    else:
        if dataset.server is None:
            raise ConfigError("algorithm.name: server_only needs dataset.server_data")
        train = dict(dataset.server)
        rows = np.arange(len(train["y"]))
    ids, counts = index_table([rows])
    return dataclasses.replace(dataset, name=f"{dataset.name} ({reference})", train=train,
                               client_train_ids=ids, client_train_counts=counts)
