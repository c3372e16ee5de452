"""benchmarks/device_parts.py: an archive split into parts and joined again, byte for byte, or refused."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import device_parts


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    path = tmp_path / "shared" / "cifar10_webp_lossless.npz"
    path.parent.mkdir()
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 3 * 2**20 + 12345, dtype=np.uint8).tobytes())
    return path


def test_split_then_join_is_the_archive(archive: Path, tmp_path: Path):
    folders = [tmp_path / name for name in (".data_a", ".data_b", ".data_c")]
    parts = device_parts.split(archive, "cifar10/cifar10_webp_lossless.npz", folders, [1.5, 0.25])
    assert [p.stat().st_size for p in parts] == [3 * 2**19, 2**18, archive.stat().st_size - 7 * 2**18]
    # The far side joins from any order of folders, into the path the data loader reads.
    joined = device_parts.join(folders[::-1], tmp_path / "d")
    assert joined == tmp_path / "d" / "cifar10" / "cifar10_webp_lossless.npz"
    assert joined.read_bytes() == archive.read_bytes()


def test_join_refuses_a_missing_or_foreign_part(archive: Path, tmp_path: Path):
    folders = [tmp_path / ".data_a", tmp_path / ".data_b"]
    parts = device_parts.split(archive, "cifar10/x.npz", folders, [1.0])
    first = parts[0].read_bytes()
    parts[0].unlink()  # the machine went back between the two calls
    with pytest.raises(FileNotFoundError, match="data_a.*carry its folder again"):
        device_parts.join(folders, tmp_path / "d")
    parts[0].write_bytes(first[::-1])  # right size, wrong bytes
    with pytest.raises(ValueError, match="SHA-256"):
        device_parts.join(folders, tmp_path / "d")
    assert not (tmp_path / "d" / "cifar10" / "x.npz").exists()


def test_split_names_the_sizes_it_needs(archive: Path, tmp_path: Path):
    with pytest.raises(ValueError, match="--sizes-mib: give 1 size"):
        device_parts.split(archive, "x.npz", [tmp_path / "a", tmp_path / "b"], [])
    with pytest.raises(ValueError, match="under the archive's 3.0 MiB"):
        device_parts.split(archive, "x.npz", [tmp_path / "a", tmp_path / "b"], [4.0])
