"""Building the offline archives (``fedjax-lab data prepare NAME``) from the datasets' official distribution
files, downloaded where there is internet or read from a local copy, each verified by its published MD5.

The archives are those :func:`fedjax_lab.data.sources.load_local` reads (``<data_dir>/mnist/mnist.npz``,
``<data_dir>/cifar10/cifar10_webp_lossless.npz``, ...): the official order and train/test split, uint8 images
(MNIST and Fashion-MNIST as arrays, CIFAR as lossless WebP, decoded bit for bit), the official labels and
class names.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import pickle
import shutil
import struct
import tarfile
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedjax_lab.data.files import DataFileError
from fedjax_lab.data.sources import LOCAL_FILES, default_data_dir

MNIST_URL = "https://ossci-datasets.s3.amazonaws.com/mnist/"
FASHION_URL = "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/"
CIFAR_URL = "https://www.cs.toronto.edu/~kriz/"
IDX_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
             "t10k-labels-idx1-ubyte.gz")
FASHION_NAMES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                 "Ankle boot")


@dataclass(frozen=True)
class Official:
    """A dataset's official distribution: its files with their published MD5s, where to download them, and how
    to turn them into the archive's arrays."""

    files: dict[str, str]  # file name -> MD5
    url: str
    build: Callable[[dict[str, Path]], dict[str, np.ndarray]]


def _idx(path: Path, magic: int) -> np.ndarray:
    """The array in a gzipped IDX file (LeCun's format: big-endian magic, dimensions, then uint8 data)."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    found, *_ = struct.unpack(">I", data[:4])
    if found != magic:
        raise DataFileError(f"{path} is not an IDX file of {'images' if magic == 2051 else 'labels'} (magic "
                            f"{found}, expected {magic})")
    rank = data[3]
    shape = struct.unpack(f">{rank}I", data[4:4 + 4 * rank])
    return np.frombuffer(data, np.uint8, offset=4 + 4 * rank).reshape(shape)


def _mnist_like(names: tuple[str, ...]) -> Callable[[dict[str, Path]], dict[str, np.ndarray]]:
    def build(files: dict[str, Path]) -> dict[str, np.ndarray]:
        train, train_y, test, test_y = (files[n] for n in IDX_FILES)
        return {"x_train": _idx(train, 2051)[..., None], "y_train": _idx(train_y, 2049),
                "x_test": _idx(test, 2051)[..., None], "y_test": _idx(test_y, 2049),
                "label_names": np.array(names)}

    return build


class _ArraysOnly(pickle.Unpickler):
    """Unpickles the CIFAR batches (dicts of bytes, lists and NumPy arrays) and nothing else: a pickle naming
    any other callable is refused instead of run."""

    ALLOWED = frozenset({("numpy.core.multiarray", "_reconstruct"),
                         ("numpy._core.multiarray", "_reconstruct"),
                         ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
                         ("numpy._core.multiarray", "scalar"), ("_codecs", "encode")})  # bytes, in protocol 2

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise DataFileError(f"a CIFAR batch may hold only arrays, lists and bytes; this one names "
                                f"{module}.{name}")
        for where in (module.replace("numpy.core.", "numpy._core."),
                      module.replace("numpy._core.", "numpy.core.")):
            try:  # NumPy 2 moved numpy.core to numpy._core; a batch may name either
                return super().find_class(where, name)
            except (ImportError, AttributeError):
                continue
        raise DataFileError(f"cannot find {module}.{name} in this NumPy")


def _batch(archive: tarfile.TarFile, member: str) -> dict[bytes, object]:
    try:
        handle = archive.extractfile(member)
    except KeyError:
        raise DataFileError(f"{archive.name} has no {member}; is it the official python version?") from None
    return _ArraysOnly(io.BytesIO(handle.read()), encoding="bytes").load()


def _images(batch: dict[bytes, object]) -> np.ndarray:
    """``uint8 [N, 32, 32, 3]`` from a batch's rows of 1024 red, 1024 green and 1024 blue bytes."""
    return np.asarray(batch[b"data"], np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)


def _cifar10(files: dict[str, Path]) -> dict[str, np.ndarray]:
    with tarfile.open(files["cifar-10-python.tar.gz"]) as archive:
        batches = [_batch(archive, f"cifar-10-batches-py/data_batch_{i}") for i in range(1, 6)]
        test = _batch(archive, "cifar-10-batches-py/test_batch")
        meta = _batch(archive, "cifar-10-batches-py/batches.meta")
    return {"x_train": np.concatenate([_images(b) for b in batches]),
            "y_train": np.concatenate([np.asarray(b[b"labels"], np.uint8) for b in batches]),
            "x_test": _images(test), "y_test": np.asarray(test[b"labels"], np.uint8),
            "label_names": np.array([n.decode() for n in meta[b"label_names"]])}


def _cifar100(files: dict[str, Path]) -> dict[str, np.ndarray]:
    with tarfile.open(files["cifar-100-python.tar.gz"]) as archive:
        train, test = (_batch(archive, f"cifar-100-python/{split}") for split in ("train", "test"))
        meta = _batch(archive, "cifar-100-python/meta")
    out = {"x_train": _images(train), "x_test": _images(test)}
    for split, batch in (("train", train), ("test", test)):
        out[f"y_{split}"] = np.asarray(batch[b"fine_labels"], np.uint8)
        out[f"y_{split}_coarse"] = np.asarray(batch[b"coarse_labels"], np.uint8)
    out["label_names"] = np.array([n.decode() for n in meta[b"fine_label_names"]])
    out["coarse_label_names"] = np.array([n.decode() for n in meta[b"coarse_label_names"]])
    return out


OFFICIAL: dict[str, Official] = {
    "mnist": Official(dict(zip(IDX_FILES, ("f68b3c2dcbeaaa9fbdd348bbdeb94873",
                                           "d53e105ee54ea40749a09fcbcd1e9432",
                                           "9fb629c4189551a2d022fa330f9573f3",
                                           "ec29112dd5afa0611ce80d1b7f02629c"))),
                      MNIST_URL, _mnist_like(tuple(str(d) for d in range(10)))),
    "fashion_mnist": Official(dict(zip(IDX_FILES, ("8d4fb7e6c68d591d4c3dfef9ec88bf0d",
                                                   "25c81989df183df01b3e8a0aad5dffbe",
                                                   "bef4ecab320f06d8554ea6380940ec79",
                                                   "bb300cfdad3c16e7a12a480ee83cd310"))),
                              FASHION_URL, _mnist_like(FASHION_NAMES)),
    "cifar10": Official({"cifar-10-python.tar.gz": "c58f30108f718f92721af3b95e74349a"}, CIFAR_URL, _cifar10),
    "cifar100": Official({"cifar-100-python.tar.gz": "eb9058c3a382ffc7106e4002c42a8d85"}, CIFAR_URL,
                         _cifar100),
}


def md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def official_files(name: str, source: Path | None, downloads: Path, *,
                   progress: bool = True) -> dict[str, Path]:
    """The official files of ``name``, verified by MD5: read from ``source`` (a folder holding them, or the
    one file itself), else downloaded into ``downloads``.

    Raises:
      DataFileError: a file is missing from ``source``, cannot be downloaded, or its MD5 is not the published
        one.
    """
    official, found = OFFICIAL[name], {}
    for file, expected in official.files.items():
        if source is not None:
            path = source if source.is_file() and source.name == file else source / file
            if not path.is_file():
                raise DataFileError(f"--from: {file} is not in {source} (the official files of {name}: "
                                    f"{', '.join(official.files)})")
        else:
            path = downloads / file
            if not path.is_file() or md5(path) != expected:
                _download(official.url + file, path, progress)
        if (got := md5(path)) != expected:
            raise DataFileError(f"{path}: MD5 {got}, but the official {file} has {expected}; the file is "
                                "damaged or another version: fetch it again")
        found[file] = path
    return found


def _download(url: str, path: Path, progress: bool) -> None:
    from tqdm import tqdm

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(partial, "wb") as out, tqdm(
                total=int(response.headers.get("Content-Length") or 0) or None, unit="B", unit_scale=True,
                desc=path.name, disable=not progress) as bar:
            while chunk := response.read(1 << 20):
                out.write(chunk)
                bar.update(len(chunk))
    except OSError as exc:  # URLError, timeouts and refused connections are OSErrors
        partial.unlink(missing_ok=True)
        raise DataFileError(f"cannot download {url} ({exc}); with no internet, copy the official files to a "
                            "folder and pass it as --from") from None
    partial.replace(path)


def encode_webp(images: np.ndarray, progress: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Each image as lossless WebP, concatenated: ``(blob, offsets)`` with image i at ``blob[offsets[i]:
    offsets[i + 1]]`` (what :func:`fedjax_lab.data.sources.decode_webp` reads back bit for bit)."""
    from PIL import Image
    from tqdm import tqdm

    blobs = []
    for image in tqdm(images, desc="encoding", unit="image", disable=not progress, mininterval=1.0):
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="WEBP", lossless=True, quality=100, method=4)
        blobs.append(np.frombuffer(buffer.getvalue(), np.uint8))
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in blobs])]).astype(np.int64)
    return np.concatenate(blobs), offsets


def prepare(name: str, source: str | Path | None = None, data_dir: str | Path | None = None, *,
            progress: bool = True) -> Path:
    """Builds the archive of ``name`` in ``data_dir`` (default :func:`default_data_dir`) from its official
    files (``source``: a local copy; default: download them into ``<data_dir>/<name>/downloads``); returns its
    path.

    Raises:
      DataFileError: the files cannot be had, or are not the official ones.
      ValueError: ``name`` has no official files known here.
    """
    if name not in OFFICIAL:
        raise ValueError(f"data prepare: no official files known for {name!r}; known: {', '.join(OFFICIAL)} "
                         "(others through dataset.source=tfds)")
    data_dir = Path(data_dir or default_data_dir())
    files = official_files(name, Path(source) if source else None, data_dir / name / "downloads",
                           progress=progress)
    arrays = OFFICIAL[name].build(files)
    if LOCAL_FILES[name].endswith("_webp_lossless.npz"):
        for split in ("train", "test"):
            arrays[f"x_{split}_webp"], arrays[f"x_{split}_offsets"] = encode_webp(arrays.pop(f"x_{split}"),
                                                                                  progress)
    out = data_dir / LOCAL_FILES[name]
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.stem + ".part.npz")
    (np.savez_compressed if "x_train" in arrays else np.savez)(partial, **arrays)
    partial.replace(out)
    if source is None:  # the downloads are in the archive now
        shutil.rmtree(data_dir / name / "downloads", ignore_errors=True)
    return out
