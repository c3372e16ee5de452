"""Data sources: local archives, WebP decoding, image folders, Shakespeare, server data, configs end to
end."""

import io
import threading

import numpy as np
import pytest
from PIL import Image

from fedjax_lab.data import server_data
from fedjax_lab.data.partitions import PartitionError
from fedjax_lab.data.shakespeare import BOS, EOS, PAD, snippet_pieces
from fedjax_lab.data.sources import (
    decode_webp,
    default_data_dir,
    load_archive,
    load_image_folder,
    load_local,
    local_archive,
    relabel_parity,
)

HAVE_SHARED = (default_data_dir() / "mnist" / "mnist.npz").is_file()
needs_shared = pytest.mark.skipif(not HAVE_SHARED, reason="../shared/data not present")


def _webp_archive(path, images, labels):
    blobs = []
    for image in images:
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="WEBP", lossless=True)
        blobs.append(np.frombuffer(buffer.getvalue(), np.uint8))
    offsets = np.cumsum([0] + [len(b) for b in blobs])
    np.savez(path, x_train_webp=np.concatenate(blobs), x_train_offsets=offsets,
             x_test_webp=np.concatenate(blobs), x_test_offsets=offsets, y_train=labels, y_test=labels,
             label_names=np.array(["a", "b"]))


def test_webp_archive_decodes_losslessly_and_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDJAX_LAB_CACHE", str(tmp_path / "cache"))
    images = np.random.RandomState(0).randint(0, 256, (3, 8, 8, 3)).astype(np.uint8)
    _webp_archive(tmp_path / "tiny_webp.npz", images, np.array([0, 1, 1], np.uint8))
    data = load_archive(tmp_path / "tiny_webp.npz")
    np.testing.assert_array_equal(data.train["x"], images)
    assert data.class_names == ("a", "b") and data.train["y"].dtype == np.int32
    assert len(list((tmp_path / "cache").rglob("x_train.npy"))) == 1
    np.testing.assert_array_equal(load_archive(tmp_path / "tiny_webp.npz").test["x"], images)


def test_image_folder_layout(tmp_path):
    for split, n in (("train", 3), ("test", 2)):
        for name in ("cat", "dog"):
            (tmp_path / split / name).mkdir(parents=True)
            for i in range(n):
                Image.fromarray(np.full((5, 5), i * 40, np.uint8)).save(tmp_path / split / name / f"{i}.png")
    data = load_image_folder(tmp_path)
    assert data.train["x"].shape == (6, 5, 5, 1) and data.test["x"].shape == (4, 5, 5, 1)
    assert data.class_names == ("cat", "dog") and list(data.train["y"]) == [0, 0, 0, 1, 1, 1]


def test_image_folder_rejects_mixed_sizes(tmp_path):
    for split in ("train", "test"):
        (tmp_path / split / "a").mkdir(parents=True)
        Image.fromarray(np.zeros((5, 5), np.uint8)).save(tmp_path / split / "a" / "0.png")
        Image.fromarray(np.zeros((6, 5), np.uint8)).save(tmp_path / split / "a" / "1.png")
    with pytest.raises(ValueError, match="differ in size"):
        load_image_folder(tmp_path)


def test_missing_archive_names_the_field_and_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="dataset.data_dir: cifar10 archive not found at "
                                                ".*cifar10_webp"):
        local_archive("cifar10", tmp_path)
    with pytest.raises(ValueError, match="no local archive for 'svhn_cropped'"):
        local_archive("svhn_cropped", tmp_path)


@needs_shared
def test_local_mnist_has_the_official_counts_and_order():
    data = load_local("mnist")
    assert data.train["x"].shape == (60000, 28, 28, 1) and data.train["x"].dtype == np.uint8
    assert list(np.bincount(data.test["y"])) == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    assert list(data.train["y"][:5]) == [5, 0, 4, 1, 9]
    parity = relabel_parity(data)
    assert parity.num_classes == 2 and list(parity.train["y"][:5]) == [0, 1, 1, 0, 0]


@needs_shared
def test_cifar10_archive_decodes_real_images():
    with np.load(local_archive("cifar10")) as z:
        images = decode_webp(z["x_test_webp"], z["x_test_offsets"][:6])
        assert images.shape == (5, 32, 32, 3) and list(z["y_test"][:5]) == [3, 8, 8, 0, 6]
    assert 20 < images.mean() < 235


def test_shakespeare_pieces_follow_tff():
    pieces = snippet_pieces("ab", sequence_length=4)
    assert pieces.shape == (1, 5) and pieces[0, 0] == BOS and pieces[0, 3] == EOS and pieces[0, 4] == PAD
    assert snippet_pieces("x" * 10, 4).shape == (3, 5)


@needs_shared
def test_shakespeare_is_a_natural_partition_of_715_roles():
    from fedjax_lab.data.shakespeare import load_shakespeare

    data = load_shakespeare(num_clients=20)
    assert data.num_clients == 20 and data.train["x"].shape[1] == 80
    np.testing.assert_array_equal(data.train["x"][:, 1:], data.train["y"][:, :-1])
    assert data.client_test_ids is not None


def test_in_domain_server_data_is_balanced_and_disjoint_from_clients():
    labels = np.repeat(np.arange(4), 25)
    server, rest = server_data.carve_in_domain(labels, 20, seed=0)
    assert list(np.bincount(labels[server])) == [5, 5, 5, 5]
    assert len(np.intersect1d(server, rest)) == 0 and len(server) + len(rest) == 100


def test_withheld_classes_never_reach_clients():
    labels = np.repeat(np.arange(4), 25)
    server, rest = server_data.withhold_classes(labels, [3], 10, seed=0)
    assert set(labels[server]) == {3} and 3 not in set(labels[rest]) and len(server) == 10
    with pytest.raises(PartitionError, match="server_data.classes"):
        server_data.withhold_classes(labels, [0, 1, 2, 3], 10, seed=0)


def test_webp_cache_survives_two_runs_decoding_at_once(tmp_path, monkeypatch):
    """Two runs that miss the cache together both write it; neither may rename the other's half-written
    file."""
    monkeypatch.setenv("FEDJAX_LAB_CACHE", str(tmp_path / "cache"))
    images = np.random.RandomState(1).randint(0, 256, (4, 8, 8, 3)).astype(np.uint8)
    _webp_archive(tmp_path / "tiny_webp.npz", images, np.array([0, 1, 1, 0], np.uint8))
    both_written = threading.Barrier(2, timeout=30)
    real_save = np.save

    def save_then_wait(file, array, *args, **kwargs):  # both writers finish writing before either renames
        real_save(file, array, *args, **kwargs)
        both_written.wait()

    monkeypatch.setattr(np, "save", save_then_wait)
    results, errors = [], []

    def load():
        try:
            results.append(load_archive(tmp_path / "tiny_webp.npz"))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=load) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for data in results:
        np.testing.assert_array_equal(data.train["x"], images)
        np.testing.assert_array_equal(data.test["x"], images)
    assert not list((tmp_path / "cache").rglob("*.tmp*"))
