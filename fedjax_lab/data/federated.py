"""The federated dataset: pooled arrays plus an index table that says which rows belong to which client."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np


def index_table(client_rows: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Packs per-client row lists into ``([num_clients, max_examples] int32, [num_clients] int32)``.

    Padding entries are 0 and are masked by the counts wherever they are read.
    """
    counts = np.array([len(rows) for rows in client_rows], np.int32)
    table = np.zeros((len(client_rows), max(int(counts.max(initial=0)), 1)), np.int32)
    for k, rows in enumerate(client_rows):
        table[k, : len(rows)] = rows
    return table, counts


@dataclasses.dataclass(frozen=True)
class FederatedDataset:
    """A federated classification dataset held as host arrays, ready to move to the device once.

    Attributes:
      name: what it is, for logs and run directories.
      train: pooled training arrays ``{'x': [n, ...], 'y': [n] int32}``.
      test: the central test set, same keys.
      client_train_ids, client_train_counts: each client's rows of ``train`` (see :func:`index_table`).
      client_test_ids, client_test_counts: each client's rows of ``test``, when the data has per-client test
        splits (used for per-client evaluation); ``None`` otherwise.
      num_classes: the number of labels.
      class_names: one name per label, when known.
      server: data held by the server and by no client (``{'x', 'y'}``), or ``None``.
    """

    name: str
    train: dict[str, np.ndarray]
    test: dict[str, np.ndarray]
    client_train_ids: np.ndarray
    client_train_counts: np.ndarray
    num_classes: int
    client_test_ids: np.ndarray | None = None
    client_test_counts: np.ndarray | None = None
    class_names: tuple[str, ...] = ()
    server: dict[str, np.ndarray] | None = None

    def __post_init__(self):
        if self.client_train_counts.min(initial=1) < 1:
            empty = np.flatnonzero(self.client_train_counts < 1)
            raise ValueError(f"dataset {self.name!r}: every client needs at least one training example; "
                             f"clients {empty[:10].tolist()} have none")

    @property
    def num_clients(self) -> int:
        return len(self.client_train_counts)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train["x"].shape[1:])

    @property
    def max_examples(self) -> int:
        """The largest client's number of training examples."""
        return int(self.client_train_counts.max())

    @property
    def min_examples(self) -> int:
        """The smallest client's number of training examples."""
        return int(self.client_train_counts.min())

    @classmethod
    def from_clients(cls, name: str, clients: Sequence[tuple[np.ndarray, np.ndarray]],
                     client_tests: Sequence[tuple[np.ndarray, np.ndarray]],
                     num_classes: int) -> FederatedDataset:
        """Pools per-client ``(x, y)`` train and test parts; the central test set is the union of the test
        parts."""

        def pool(parts):
            x = np.concatenate([p[0] for p in parts])
            y = np.concatenate([p[1] for p in parts]).astype(np.int32)
            offsets = np.cumsum([0] + [len(p[1]) for p in parts])
            return {"x": x, "y": y}, [np.arange(offsets[k], offsets[k + 1]) for k in range(len(parts))]

        train, train_rows = pool(clients)
        test, test_rows = pool(client_tests)
        train_ids, train_counts = index_table(train_rows)
        test_ids, test_counts = index_table(test_rows)
        return cls(name, train, test, train_ids, train_counts, num_classes, test_ids, test_counts)

    def summary(self) -> str:
        """One line: clients, examples, and the spread of client sizes."""
        c = self.client_train_counts
        server = f", server {len(self.server['y'])} examples" if self.server is not None else ""
        return (f"{self.name}: {self.num_clients} clients, {len(self.train['y'])} train / "
                f"{len(self.test['y'])} test examples, {self.num_classes} classes, input {self.input_shape}, "
                f"client size min {c.min()} median {int(np.median(c))} max {c.max()}{server}")
