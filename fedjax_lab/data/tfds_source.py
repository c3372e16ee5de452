"""Image-classification datasets from TensorFlow Datasets (tfds), read as NumPy arrays without TensorFlow.

:func:`load_tfds` reads a dataset that has been *prepared* in the ArrayRecord format with
``tfds.data_source`` (random access). Reading needs ``pip install tensorflow-datasets pillow``
(``array_record`` comes with tfds on Linux), not TensorFlow; with ``opencv-python-headless`` installed, tfds
decodes the images with OpenCV instead of Pillow, about 2.5 times faster.

Preparing (download and convert, once, on a machine with internet) does need TensorFlow: the builders read
their raw files with ``tf.io.gfile`` and encode the images with ``tf.image``. tfds 4.9.10 also imports
``importlib_resources`` there without declaring it (tensorflow/datasets#11212)::

    pip install tensorflow-datasets tensorflow importlib_resources
    python -c "import tensorflow_datasets as tfds; \\
        tfds.builder('cifar10', data_dir='DATA_DIR', file_format='array_record').download_and_prepare()"

``file_format='array_record'`` matters: with an explicit ``data_dir``, tfds prepares TFRecord by default,
which ``tfds.data_source`` cannot read. The ``tfds build NAME --file_format=array_record`` command does the
same but, in tfds 4.9.10, also needs ``apache-beam`` installed (tensorflow/datasets#5463).
"""

from __future__ import annotations

import numpy as np

_SUPPORTED = ("mnist", "fashion_mnist", "kmnist", "cifar10", "cifar100", "svhn_cropped", "emnist/balanced",
              "emnist/byclass", "emnist/bymerge", "emnist/digits", "emnist/letters", "emnist/mnist")
_SPLITS = ("train", "test")  # svhn_cropped's 'extra' split is not read.
_BATCH_SIZE = 4096


def _not_prepared(tfds, name: str, data_dir: str | None) -> FileNotFoundError:
    """The error for data that ``tfds.data_source`` cannot read, with the command that prepares it."""
    builder = tfds.builder(name, data_dir=data_dir)
    root = data_dir or tfds.core.constants.DATA_DIR
    where = (f"is prepared in {builder.data_dir!r} but not in the ArrayRecord format; delete that folder (or "
             f"use another data_dir) and prepare it again" if builder.is_prepared() else
             f"is not prepared in the ArrayRecord format under {root!r}; prepare it once")
    return FileNotFoundError(
        f"load_tfds: {name!r} {where} (needs internet and `pip install tensorflow-datasets tensorflow "
        f"importlib_resources`):\n  python -c \"import tensorflow_datasets as tfds; tfds.builder('{name}', "
        f"data_dir='{root}', file_format='array_record').download_and_prepare()\"")


def _read_split(source, image_key: str, label_key: str, image_shape: tuple[int, ...],
                max_examples: int | None) -> dict[str, np.ndarray]:
    """Reads the first ``max_examples`` records (all by default) of a random-access source, in batches."""
    n = len(source) if max_examples is None else min(len(source), max_examples)
    get_many = getattr(source, "__getitems__", None) or (lambda keys: [source[k] for k in keys])
    x, y = np.empty((n, *image_shape), np.uint8), np.empty(n, np.int32)
    for start in range(0, n, _BATCH_SIZE):
        stop = min(start + _BATCH_SIZE, n)
        batch = get_many(list(range(start, stop)))
        x[start:stop] = np.stack([ex[image_key] for ex in batch]).reshape(stop - start, *image_shape)
        y[start:stop] = [ex[label_key] for ex in batch]
    return {"x": x, "y": y}


def load_tfds(name: str, data_dir: str | None = None, *, image_key: str = "image", label_key: str = "label",
              max_examples: int | None = None) -> dict:
    """Loads the train and test splits of a prepared tfds image-classification dataset into host memory.

    Args:
      name: the tfds name, with the config where there is one: ``'mnist'``, ``'fashion_mnist'``, ``'kmnist'``,
        ``'cifar10'``, ``'cifar100'``, ``'svhn_cropped'``, ``'emnist/balanced'`` (or ``byclass``, ``bymerge``,
        ``digits``, ``letters``, ``mnist``); an optional version suffix (``'cifar10:3.0.2'``) is passed on.
      data_dir: where the dataset was prepared; tfds's default (``$TFDS_DATA_DIR`` or
        ``~/tensorflow_datasets``) when ``None``.
      image_key: the image feature (``[H, W, C]`` uint8).
      label_key: the class-label feature, e.g. ``'coarse_label'`` for the 20 superclasses of cifar100.
      max_examples: read only the first this many examples of each split (for quick runs).

    Returns:
      ``{'train': {'x', 'y'}, 'test': {'x', 'y'}, 'num_classes', 'class_names', 'input_shape'}`` with ``x``
      uint8 ``[n, H, W, C]`` and ``y`` int32 ``[n]``. Images are as tfds stores them: EMNIST's are
      transposed (flipped and rotated), as in the original release.

    Raises:
      ValueError: ``name`` is not a supported dataset, or ``image_key`` or ``label_key`` is not a feature.
      FileNotFoundError: the dataset has not been prepared in the ArrayRecord format under ``data_dir``; the
        message gives the command that prepares it.
    """
    if name.split(":")[0] not in _SUPPORTED:
        raise ValueError(f"load_tfds: unknown dataset name={name!r}; supported: {', '.join(_SUPPORTED)}")
    try:
        import tensorflow_datasets as tfds
    except ImportError as err:
        raise ImportError("load_tfds needs `pip install tensorflow-datasets pillow`") from err

    try:
        sources = tfds.data_source(name, split={s: s for s in _SPLITS}, data_dir=data_dir, download=False)
    except (FileNotFoundError, KeyError, NotImplementedError, ValueError) as err:
        raise _not_prepared(tfds, name, data_dir) from err

    features = sources["train"].dataset_info.features
    for field, key in (("image_key", image_key), ("label_key", label_key)):
        if key not in features:
            raise ValueError(f"load_tfds: {field}={key!r} is not a feature of {name!r}: {list(features)}")
    shape, labels = tuple(features[image_key].shape), features[label_key]
    data = {split: _read_split(source, image_key, label_key, shape, max_examples)
            for split, source in sources.items()}
    return {**data, "num_classes": int(labels.num_classes), "class_names": tuple(labels.names),
            "input_shape": shape}
