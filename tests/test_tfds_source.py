"""tfds loading, on tfds's generated mock data: no download, no TensorFlow."""

import contextlib
import importlib
import sys
from unittest import mock

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from fedjax_lab.data import tfds_source
from fedjax_lab.data.tfds_source import load_tfds


@contextlib.contextmanager
def mock_tfds(num_examples):
    """``tfds.testing.mock_data`` with generated examples from the builders' code (no metadata files).

    Its data sources' batch read (``__getitems__``) is broken in tfds 4.9.10: the mock sets it to
    ``partial(_getitems, generator=...)``, which expects ``self``, but MagicMock binds only the magic
    methods it knows, so no ``self`` is passed. The replacement takes just the keys.
    """
    def getitems(record_keys, generator, serialized=False):
        return [generator[k] for k in record_keys]

    with tfds.testing.mock_data(num_examples=num_examples, policy=tfds.testing.MockPolicy.USE_CODE), \
            mock.patch("tensorflow_datasets.testing.mocking._getitems", getitems):
        yield


@pytest.mark.parametrize("name, shape, num_classes", [
    ("mnist", (28, 28, 1), 10), ("cifar10", (32, 32, 3), 10), ("emnist/balanced", (28, 28, 1), 47)])
def test_load_tfds_matches_the_dataset_features(name, shape, num_classes):
    with mock_tfds(12):
        data = load_tfds(name, data_dir="/nonexistent", max_examples=7)
    assert data["input_shape"] == shape
    assert data["num_classes"] == num_classes and len(data["class_names"]) == num_classes
    for split, n in (("train", 7), ("test", 7)):
        x, y = data[split]["x"], data[split]["y"]
        assert x.shape == (n, *shape) and x.dtype == np.uint8
        assert y.shape == (n,) and y.dtype == np.int32
        assert 0 <= y.min() and y.max() < num_classes


@pytest.mark.parametrize("name", tfds_source._SUPPORTED)
def test_every_supported_name_is_an_image_classification_dataset(name):
    with mock_tfds(2):
        data = load_tfds(name)
    assert data["train"]["x"].shape == (2, *data["input_shape"]) and len(data["input_shape"]) == 3
    assert len(data["class_names"]) == data["num_classes"] >= 10


def test_load_tfds_reads_every_record_in_batches(monkeypatch):
    monkeypatch.setattr(tfds_source, "_BATCH_SIZE", 4)
    with mock_tfds(10):
        data = load_tfds("fashion_mnist")
    assert len(data["train"]["y"]) == len(data["test"]["y"]) == 10  # batches of 4, 4 and 2
    assert data["train"]["x"].std() > 0 and data["train"]["x"][-1].any()


def test_load_tfds_does_not_import_tensorflow():
    if "tensorflow" in sys.modules:
        pytest.skip("tensorflow was imported by something else")
    with mock_tfds(3):
        assert load_tfds("cifar100", label_key="coarse_label")["num_classes"] == 20
    assert "tensorflow" not in sys.modules


def test_module_imports_without_tfds(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    module = importlib.reload(tfds_source)
    with pytest.raises(ImportError, match="pip install tensorflow-datasets"):
        module.load_tfds("mnist")
    monkeypatch.undo()
    importlib.reload(tfds_source)


def test_unknown_names_and_fields_are_rejected():
    with pytest.raises(ValueError, match=r"name='imagenet2012'.*cifar10.*emnist/balanced"):
        load_tfds("imagenet2012")
    with pytest.raises(ValueError, match="name='emnist'"):
        load_tfds("emnist")  # the config is required
    with mock_tfds(2), pytest.raises(ValueError, match="label_key='fine_label'"):
        load_tfds("cifar100", label_key="fine_label")


def test_unprepared_data_says_how_to_prepare_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"(?s)not prepared.*tfds\.builder\('mnist'.*array_record"):
        load_tfds("mnist", data_dir=str(tmp_path))
