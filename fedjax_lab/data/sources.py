"""Centralised datasets from local files: the archives of ``shared/data`` and an image-folder layout.

Every loader returns a :class:`CentralDataset` of host arrays (images stay ``uint8 [N, H, W, C]``); a
partitioner (:mod:`.partitions`) then deals its training rows to clients. Named datasets through
tensorflow-datasets are in :mod:`.tfds_source`.

Where the files are: ``data_dir`` if given, else ``$FEDJAX_LAB_DATA``, else ``shared/data`` beside the
repository (the layout of an offline checkout: ``mnist/mnist.npz``, ``cifar10/cifar10_webp_lossless.npz``,
...).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import tempfile
from pathlib import Path

import numpy as np

from fedjax_lab.data.files import DataFileError, read_npz

LOCAL_FILES = {
    "mnist": "mnist/mnist.npz",
    "fashion_mnist": "fashion_mnist/fashion_mnist.npz",
    "cifar10": "cifar10/cifar10_webp_lossless.npz",
    "cifar100": "cifar100/cifar100_webp_lossless.npz",
}
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")


@dataclasses.dataclass(frozen=True)
class CentralDataset:
    """A labelled dataset before federation.

    Attributes:
      name: what it is.
      train, test: ``{'x': [N, ...], 'y': [N] int32}`` host arrays.
      num_classes: the number of labels.
      class_names: one name per label.
    """

    name: str
    train: dict[str, np.ndarray]
    test: dict[str, np.ndarray]
    num_classes: int
    class_names: tuple[str, ...]

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train["x"].shape[1:])


def default_data_dir() -> Path:
    """``$FEDJAX_LAB_DATA``, else ``shared/data`` beside the repository checkout."""
    if os.environ.get("FEDJAX_LAB_DATA"):
        return Path(os.environ["FEDJAX_LAB_DATA"])
    return Path(__file__).resolve().parents[3] / "shared" / "data"


def cache_dir() -> Path:
    """Where decoded archives are cached: ``$FEDJAX_LAB_CACHE``, else ``~/.cache/fedjax_lab``."""
    return Path(os.environ.get("FEDJAX_LAB_CACHE", Path.home() / ".cache" / "fedjax_lab"))


def local_archive(name: str, data_dir: str | Path | None = None) -> Path:
    """The path of the archive of dataset ``name``.

    Raises:
      ValueError: ``name`` has no local archive (the message lists those that do).
      FileNotFoundError: the archive is not in ``data_dir`` (the message says where it was looked for).
    """
    if name not in LOCAL_FILES:
        raise ValueError(f"dataset.name: no local archive for {name!r}; local datasets: "
                         f"{sorted(LOCAL_FILES)} (others through dataset.source=tfds)")
    path = Path(data_dir or default_data_dir()) / LOCAL_FILES[name]
    if not path.is_file():
        raise FileNotFoundError(f"dataset.data_dir: {name} archive not found at {path}; set "
                                "dataset.data_dir or $FEDJAX_LAB_DATA to the folder holding "
                                f"{LOCAL_FILES[name]}, or use dataset.source=tfds")
    return path


def decode_webp(blob: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Decodes concatenated lossless WebP images (``blob[offsets[i]:offsets[i+1]]``) to
    ``uint8 [N, H, W, 3]``."""
    from PIL import Image

    return np.stack([np.asarray(Image.open(io.BytesIO(blob[offsets[i]:offsets[i + 1]].tobytes()))
                                .convert("RGB"))
                     for i in range(len(offsets) - 1)])


def _cached_decode(path: Path, archive) -> dict[str, np.ndarray]:
    """The decoded images of a WebP archive, decoded once and cached as ``.npy`` keyed by the file's
    digest."""
    stat = path.stat()
    digest = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    folder = cache_dir() / f"{path.stem}-{digest}"
    out = {}
    for split in ("train", "test"):
        file = folder / f"x_{split}.npy"
        if not file.is_file():
            folder.mkdir(parents=True, exist_ok=True)
            try:
                images = decode_webp(archive[f"x_{split}_webp"], archive[f"x_{split}_offsets"])
            except (OSError, ValueError, SyntaxError, IndexError) as exc:
                # Pillow's errors for a damaged image
                raise DataFileError(f"dataset.data_dir: the {split} images of {path} cannot be decoded "
                                    f"({type(exc).__name__}: {exc}); fetch it again (docs/data.md)") from None
            # A private temporary name per writer: several runs may decode the same archive at once, and a
            # shared name lets one rename another's half-written file into place.
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=f"x_{split}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    np.save(f, images)
                os.replace(tmp, file)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        out[split] = np.load(file)
    return out


def load_archive(path: str | Path, name: str | None = None, labels: str = "fine") -> CentralDataset:
    """Loads an archive in the format of ``shared/data``: an ``.npz`` of ``uint8`` arrays (``x_train``, ...)
    or of lossless WebP images (``x_train_webp`` + offsets, decoded once and cached; see :func:`cache_dir`).

    Args:
      path: the ``.npz`` file.
      name: the dataset's name (default: the file's stem).
      labels: ``'fine'`` or ``'coarse'`` (CIFAR-100's 20 superclasses).
    """
    path = Path(path)
    what = f"a {name or path.stem} archive (x_train, y_train, x_test, y_test, label_names)"
    hint = "fetch it again (docs/data.md)"
    archive = read_npz(path, "dataset.data_dir", what, ("y_train", "y_test", "label_names"), hint)
    webp = "x_train_webp" in archive
    images_needed = (("x_train_webp", "x_train_offsets", "x_test_webp", "x_test_offsets") if webp
                     else ("x_train", "x_test"))
    missing = [k for k in images_needed if k not in archive]
    if missing:
        raise DataFileError(f"dataset.data_dir: {path} is not {what}: it lacks {', '.join(missing)}; {hint}")
    images = (_cached_decode(path, archive) if webp
              else {"train": archive["x_train"], "test": archive["x_test"]})
    suffix = "_coarse" if labels == "coarse" else ""
    if f"y_train{suffix}" not in archive:
        raise ValueError(f"dataset.labels: {path.name} has no {labels!r} labels")
    y_train, y_test = archive[f"y_train{suffix}"], archive[f"y_test{suffix}"]
    class_names = tuple(str(c) for c in archive[f"{labels}_label_names" if suffix else "label_names"])
    if len(y_train) != len(images["train"]) or len(y_test) != len(images["test"]):
        raise DataFileError(f"dataset.data_dir: {path} holds {len(images['train'])} training images but "
                            f"{len(y_train)} labels (test: {len(images['test'])}, {len(y_test)}); {hint}")
    return CentralDataset(name or path.stem, {"x": images["train"], "y": y_train.astype(np.int32)},
                          {"x": images["test"], "y": y_test.astype(np.int32)}, len(class_names), class_names)


def load_local(name: str, data_dir: str | Path | None = None, labels: str = "fine") -> CentralDataset:
    """A named dataset from its local archive (see :data:`LOCAL_FILES`)."""
    return load_archive(local_archive(name, data_dir), name, labels)


def load_image_folder(root: str | Path, name: str | None = None) -> CentralDataset:
    """Images laid out as ``root/{train,test}/<class name>/<image file>``; classes are the sorted folder names
    of ``train``. Every image must have the same size; grayscale images get one channel.

    Raises:
      FileNotFoundError: ``root/train`` or ``root/test`` is missing or holds no images.
      ValueError: images of different sizes, or a test class unknown to ``train``.
    """
    from PIL import Image

    root = Path(root)
    classes = (sorted(p.name for p in (root / "train").iterdir() if p.is_dir()) if (root / "train").is_dir()
               else [])
    if not classes:
        raise FileNotFoundError(f"dataset.data_dir: expected class folders in {root / 'train'}")
    splits = {}
    for split in ("train", "test"):
        files, labels = [], []
        for folder in sorted(p for p in (root / split).glob("*") if p.is_dir()):
            if folder.name not in classes:
                raise ValueError(f"dataset.data_dir: class {folder.name!r} of {split} "
                                 "is not a class of train")
            found = sorted(f for f in folder.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
            files += found
            labels += [classes.index(folder.name)] * len(found)
        if not files:
            raise FileNotFoundError(f"dataset.data_dir: no images under {root / split}")
        images = [np.asarray(Image.open(f)) for f in files]
        shapes = {im.shape for im in images}
        if len(shapes) > 1:
            raise ValueError(f"dataset.data_dir: images in {root / split} differ in size: "
                             f"{sorted(shapes)[:4]}")
        x = np.stack(images)
        splits[split] = {"x": x[..., None] if x.ndim == 3 else x, "y": np.asarray(labels, np.int32)}
    return CentralDataset(name or root.name, splits["train"], splits["test"], len(classes), tuple(classes))


def relabel_parity(data: CentralDataset) -> CentralDataset:
    """Binary labels ``1`` for even classes and ``0`` for odd ones (BHerd's even-vs-odd SVM task)."""
    parity = {split: {"x": arrays["x"], "y": (arrays["y"] % 2 == 0).astype(np.int32)}
              for split, arrays in (("train", data.train), ("test", data.test))}
    return CentralDataset(f"{data.name}-parity", parity["train"], parity["test"], 2, ("odd", "even"))
