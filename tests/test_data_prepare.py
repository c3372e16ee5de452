"""``fedjax-lab data prepare``: the offline archives built from files in the official formats (made here,
small), verified by MD5, read back bit for bit, and a config run on them with no ../shared."""

import dataclasses
import gzip
import io
import pickle
import struct
import tarfile

import numpy as np
import pytest

from fedjax_lab.data import prepare as prep
from fedjax_lab.data.sources import load_local
from fedjax_lab.experiments.cli import main

RNG = np.random.default_rng(0)


def cifar10_tarball(path, train_per_batch=24, test=20):
    """A CIFAR-10 python tarball as the official one is laid out, with few images."""

    def batch(n):
        data = RNG.integers(0, 256, (n, 3072), dtype=np.uint8)
        return {b"data": data, b"labels": [int(v) for v in RNG.integers(0, 10, n)]}

    batches = {f"data_batch_{i}": batch(train_per_batch) for i in range(1, 6)}
    batches["test_batch"] = batch(test)
    batches["batches.meta"] = {b"label_names": [n.encode() for n in ("airplane", "automobile", "bird", "cat",
                                                                      "deer", "dog", "frog", "horse", "ship",
                                                                      "truck")]}
    with tarfile.open(path, "w:gz") as archive:
        for name, content in batches.items():
            blob = pickle.dumps(content, protocol=2)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(blob)
            archive.addfile(info, io.BytesIO(blob))
    return batches


def official(monkeypatch, name, folder):
    """Lets the test's small files stand for the official ones: their MD5s become the expected ones."""
    entry = prep.OFFICIAL[name]
    files = {f: prep.md5(folder / f) for f in entry.files}
    monkeypatch.setitem(prep.OFFICIAL, name, dataclasses.replace(entry, files=files))


def test_cifar10_is_built_from_the_official_tarball_and_read_back_bit_for_bit(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDJAX_LAB_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "downloaded"
    source.mkdir()
    batches = cifar10_tarball(source / "cifar-10-python.tar.gz")
    official(monkeypatch, "cifar10", source)
    assert main(["data", "prepare", "cifar10", "--from", str(source), "--data-dir", str(tmp_path / "data"),
                 "--no-progress"]) == 0
    data = load_local("cifar10", tmp_path / "data")
    expected = np.concatenate([batches[f"data_batch_{i}"][b"data"] for i in range(1, 6)])
    # Row layout of the official batches: 1024 red, then green, then blue values, each row-major 32 x 32.
    np.testing.assert_array_equal(data.train["x"][7, 3, 5], expected[7, [3 * 32 + 5, 1024 + 3 * 32 + 5,
                                                                       2048 + 3 * 32 + 5]])
    np.testing.assert_array_equal(data.train["x"], expected.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(data.train["y"], np.concatenate([batches[f"data_batch_{i}"][b"labels"]
                                                                   for i in range(1, 6)]))
    np.testing.assert_array_equal(data.test["y"], batches["test_batch"][b"labels"])
    assert data.class_names[:2] == ("airplane", "automobile")


def test_mnist_is_built_from_the_official_idx_files(tmp_path, monkeypatch):
    source = tmp_path / "downloaded"
    source.mkdir()
    arrays = {}
    for file in prep.IDX_FILES:
        images = "images" in file
        n = 12 if file.startswith("train") else 5
        value = RNG.integers(0, 256, (n, 28, 28) if images else (n,), dtype=np.uint8)
        arrays[file] = value
        header = struct.pack(">I", 2051 if images else 2049) + struct.pack(f">{value.ndim}I", *value.shape)
        (source / file).write_bytes(gzip.compress(header + value.tobytes()))
    official(monkeypatch, "mnist", source)
    out = prep.prepare("mnist", source, tmp_path / "data", progress=False)
    assert out == tmp_path / "data" / "mnist" / "mnist.npz"
    data = load_local("mnist", tmp_path / "data")
    np.testing.assert_array_equal(data.train["x"][..., 0], arrays["train-images-idx3-ubyte.gz"])
    np.testing.assert_array_equal(data.test["y"], arrays["t10k-labels-idx1-ubyte.gz"])
    assert data.class_names == tuple(str(d) for d in range(10))


def test_a_file_that_is_not_the_official_one_is_refused_with_both_checksums(tmp_path, capsys):
    source = tmp_path / "downloaded"
    source.mkdir()
    cifar10_tarball(source / "cifar-10-python.tar.gz")  # not the official file: its MD5 differs
    assert main(["data", "prepare", "cifar10", "--from", str(source), "--data-dir",
                 str(tmp_path / "data")]) == 2
    err = capsys.readouterr().err
    assert "c58f30108f718f92721af3b95e74349a" in err and prep.md5(source / "cifar-10-python.tar.gz") in err
    assert not (tmp_path / "data" / "cifar10").exists()
    assert main(["data", "prepare", "cifar10", "--from", str(tmp_path / "nowhere")]) == 2
    assert "cifar-10-python.tar.gz is not in" in capsys.readouterr().err
    assert main(["data", "prepare", "shakespeare"]) == 2


def test_a_batch_that_names_another_callable_is_not_run(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    blob = pickle.dumps({b"data": Evil()})
    with pytest.raises(prep.DataFileError, match="builtins.print"):
        prep._ArraysOnly(io.BytesIO(blob), encoding="bytes").load()


def test_a_config_runs_on_an_archive_built_here_with_no_shared_data(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDJAX_LAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FEDJAX_LAB_DATA", str(tmp_path / "no_shared"))  # nothing there
    source = tmp_path / "downloaded"
    source.mkdir()
    cifar10_tarball(source / "cifar-10-python.tar.gz", train_per_batch=40)
    official(monkeypatch, "cifar10", source)
    data = tmp_path / "data"
    assert main(["data", "prepare", "cifar10", "--from", str(source), "--data-dir", str(data),
                 "--no-progress"]) == 0
    tiny = ["dataset.partition={name: iid, num_clients: 4}", "rounds.clients_per_round=2",
            "rounds.num_rounds=2", "eval.every=1", "client.local_epochs=1", f"dataset.data_dir={data}"]
    config = str(prep.Path(__file__).resolve().parents[1] / "configs" / "cifar10_fedavg.yaml")
    assert main(["run", config, *tiny, "--run-dir", str(tmp_path / "run"), "--no-progress"]) == 0
    assert (tmp_path / "run" / "summary.json").is_file()
