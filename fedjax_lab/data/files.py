"""Opening data files: every dataset archive and partition file is read here, and any failure to read one (a
truncated download, a damaged disk, a file of another kind) becomes a :class:`DataFileError` naming the config
field, the file and what was expected, not the traceback of the zip, zlib, gzip or JSON reader underneath."""

from __future__ import annotations

import gzip
import json
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

_READ_ERRORS = (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile, zlib.error, gzip.BadGzipFile,
                UnicodeDecodeError)


class DataFileError(ValueError):
    """A data file cannot be read as what the config says it is (the message names the field and the file)."""


def read_npz(path: str | Path, field: str, what: str, required: tuple[str, ...] = (),
             hint: str = "") -> dict[str, np.ndarray]:
    """All arrays of an ``.npz`` file, read at once.

    Args:
      path: the file.
      field: the config field that named it (``dataset.partition.file``), for the message.
      what: what the file should be (``"an MNIST archive"``), for the message.
      required: arrays it must hold.
      hint: what to do about a bad file, appended to the message.

    Raises:
      DataFileError: the file is missing, is not an ``.npz`` file, is truncated or damaged, holds pickled
        objects, or lacks one of ``required``.
    """
    path = Path(path)
    if not path.is_file():
        raise DataFileError(f"{field}: {path} does not exist (expected {what}){_then(hint)}")
    try:
        with np.load(path, allow_pickle=False) as archive:
            if not hasattr(archive, "files"):
                raise DataFileError(f"{field}: {path} is a single .npy array, not {what} "
                                    f"(an .npz file){_then(hint)}")
            missing = [name for name in required if name not in archive.files]
            if missing:
                raise DataFileError(f"{field}: {path} is not {what}: it lacks {', '.join(missing)} (it holds "
                                    f"{', '.join(archive.files[:8]) or 'nothing'}){_then(hint)}")
            return {name: archive[name] for name in archive.files}
    except DataFileError:
        raise
    except _READ_ERRORS as exc:
        raise DataFileError(f"{field}: {path} cannot be read as {what} ({_reason(exc)}); it may be "
                            f"truncated or damaged{_then(hint)}") from None


def read_json_gz(path: str | Path, field: str, what: str, hint: str = "") -> Any:
    """A gzipped JSON file.

    Raises:
      DataFileError: the file is missing, not gzip, truncated, or not JSON.
    """
    path = Path(path)
    if not path.is_file():
        raise DataFileError(f"{field}: {path} does not exist (expected {what}){_then(hint)}")
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return json.load(f)
    except _READ_ERRORS as exc:
        raise DataFileError(f"{field}: {path} cannot be read as {what} ({_reason(exc)}); it may be "
                            f"truncated or damaged{_then(hint)}") from None


def _reason(exc: BaseException) -> str:
    text = str(exc).split("\n")[0]
    if "allow_pickle" in text:
        text = "it holds pickled Python objects, which are never loaded"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _then(hint: str) -> str:
    return f"; {hint}" if hint else ""
