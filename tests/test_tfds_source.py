"""tfds loading, on tfds's generated mock data: no download, no TensorFlow."""

import importlib
import sys

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from fedjax_lab.data import tfds_source  # noqa: E402
from fedjax_lab.data.tfds_source import load_tfds  # noqa: E402


@pytest.mark.parametrize("name, shape, num_classes", [("mnist", (28, 28, 1), 10), ("cifar10", (32, 32, 3), 10),
                                                      ("emnist/balanced", (28, 28, 1), 47)])
def test_load_tfds_matches_the_dataset_features(name, shape, num_classes):
    with tfds.testing.mock_data(num_examples=12, policy=tfds.testing.MockPolicy.USE_CODE):
        data = load_tfds(name, data_dir="/nonexistent", max_examples=7)
    assert data["input_shape"] == shape
    assert data["num_classes"] == num_classes and len(data["class_names"]) == num_classes
    for split, n in (("train", 7), ("test", 7)):
        x, y = data[split]["x"], data[split]["y"]
        assert x.shape == (n, *shape) and x.dtype == np.uint8
        assert y.shape == (n,) and y.dtype == np.int32
        assert 0 <= y.min() and y.max() < num_classes


def test_load_tfds_reads_every_record_without_max_examples():
    with tfds.testing.mock_data(num_examples=5000, policy=tfds.testing.MockPolicy.USE_CODE):
        data = load_tfds("mnist")
    assert len(data["train"]["y"]) == len(data["test"]["y"]) == 5000  # more than one read batch
    assert data["train"]["x"].std() > 0


def test_load_tfds_does_not_import_tensorflow():
    if "tensorflow" in sys.modules:
        pytest.skip("tensorflow was imported by something else")
    with tfds.testing.mock_data(num_examples=3, policy=tfds.testing.MockPolicy.USE_CODE):
        load_tfds("cifar100", label_key="coarse_label")
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
    with tfds.testing.mock_data(num_examples=2, policy=tfds.testing.MockPolicy.USE_CODE):
        with pytest.raises(ValueError, match="label_key='fine_label'"):
            load_tfds("cifar100", label_key="fine_label")


def test_unprepared_data_says_how_to_prepare_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"(?s)not prepared.*tfds\.builder\('mnist'.*array_record"):
        load_tfds("mnist", data_dir=str(tmp_path))
