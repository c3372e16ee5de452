"""Federated Shakespeare (LEAF, as packaged by TensorFlow Federated): one client per speaking role,
next-character prediction.

Preprocessing follows TFF and FedJAX: characters map to ids ``1..86`` over TFF's 86-character vocabulary
(0 is padding, then out-of-vocabulary, beginning and end of snippet: 90 ids in all). Each snippet becomes
``[BOS] + chars + [EOS]``, padded to a multiple of ``sequence_length + 1`` and cut into pieces; a piece gives
the input ``piece[:-1]`` and the label ``piece[1:]``. Padding labels are excluded from loss and accuracy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedjax_lab.data.federated import FederatedDataset, index_table
from fedjax_lab.data.files import DataFileError, read_json_gz
from fedjax_lab.data.sources import default_data_dir

VOCAB = list("dhlptx@DHLPTX $(,048cgkoswCGKOSW[_#'/37;?bfjnrvzBFJNRVZ\"&*.26:\naeimquyAEIMQUY]!%)-159\r")
PAD, OOV, BOS, EOS = 0, len(VOCAB) + 1, len(VOCAB) + 2, len(VOCAB) + 3
VOCAB_SIZE = len(VOCAB) + 4
_CHAR_IDS = {c: i + 1 for i, c in enumerate(VOCAB)}


def snippet_pieces(snippet: str, sequence_length: int) -> np.ndarray:
    """``[num_pieces, sequence_length + 1]`` int32 token ids of one snippet (see the module docstring)."""
    ids = [BOS] + [_CHAR_IDS.get(c, OOV) for c in snippet] + [EOS]
    width = sequence_length + 1
    ids += [PAD] * (-len(ids) % width)
    return np.asarray(ids, np.int32).reshape(-1, width)


def _client_examples(snippets: list[str], sequence_length: int) -> np.ndarray:
    pieces = [snippet_pieces(s, sequence_length) for s in snippets]
    return np.concatenate(pieces) if pieces else np.zeros((0, sequence_length + 1), np.int32)


def load_shakespeare(data_dir: str | Path | None = None, sequence_length: int = 80,
                     num_clients: int | None = None) -> FederatedDataset:
    """The natural partition: client k is the k-th role (sorted ids) with at least one training piece;
    the central test set is the union of the clients' test pieces.

    Args:
      data_dir: folder holding ``shakespeare/shakespeare_tff.json.gz`` (default: see :mod:`.sources`).
      sequence_length: characters per example.
      num_clients: keep only the first ``num_clients`` roles (all 715 by default).
    """
    path = Path(data_dir or default_data_dir()) / "shakespeare" / "shakespeare_tff.json.gz"
    what = "the Shakespeare archive ({'train': {role: [snippets]}, 'test': ...})"
    raw = read_json_gz(path, "dataset.data_dir", what, "set dataset.data_dir or $FEDJAX_LAB_DATA to the "
                                                         "folder holding shakespeare/shakespeare_tff.json.gz")
    if not (isinstance(raw, dict) and isinstance(raw.get("train"), dict)
            and isinstance(raw.get("test"), dict)):
        raise DataFileError(f"dataset.data_dir: {path} is not {what}")
    train_parts, test_parts = [], []
    for client_id in sorted(raw["train"]):
        train = _client_examples(raw["train"][client_id], sequence_length)
        if len(train):
            train_parts.append(train)
            test_parts.append(_client_examples(raw["test"].get(client_id, []), sequence_length))
    if num_clients is not None:
        if not 1 <= num_clients <= len(train_parts):
            raise ValueError(f"dataset.num_clients must be in [1, {len(train_parts)}], got {num_clients}")
        train_parts, test_parts = train_parts[:num_clients], test_parts[:num_clients]

    def pool(parts):
        pieces = np.concatenate(parts)
        offsets = np.cumsum([0] + [len(p) for p in parts])
        table, counts = index_table([np.arange(offsets[k], offsets[k + 1]) for k in range(len(parts))])
        return {"x": pieces[:, :-1], "y": pieces[:, 1:]}, table, counts

    train, train_ids, train_counts = pool(train_parts)
    test, test_ids, test_counts = pool(test_parts)
    return FederatedDataset("shakespeare", train, test, train_ids, train_counts, VOCAB_SIZE, test_ids,
                            test_counts)
