"""A smaller copy of a CIFAR archive for a machine that can only be sent a few tens of MiB (a lent GPU takes
64 MiB a call, and the lossless CIFAR-10 archive is 102 MB): the same arrays, each image re-encoded as lossy
WebP (quality 90: 34 MiB for CIFAR-10). For timing only; accuracy runs use the lossless archive.

Usage::

    python benchmarks/transport_copy.py cifar10 .data     # then FEDJAX_LAB_DATA=.data on the other machine
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import numpy as np
from PIL import Image

from fedjax_lab.data.sources import LOCAL_FILES, decode_webp, local_archive


def lossy_webp(images: np.ndarray, quality: int) -> tuple[np.ndarray, np.ndarray]:
    """``images`` ``uint8 [N, H, W, 3]`` as concatenated lossy WebP files and their ``N + 1`` offsets."""
    blobs = []
    for image in images:
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, "WEBP", quality=quality, method=4)
        blobs.append(buffer.getvalue())
    offsets = np.cumsum([0] + [len(b) for b in blobs]).astype(np.int64)
    return np.frombuffer(b"".join(blobs), np.uint8), offsets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=["cifar10", "cifar100"])
    parser.add_argument("out", help="the folder to use as $FEDJAX_LAB_DATA")
    parser.add_argument("--quality", type=int, default=90)
    args = parser.parse_args()

    with np.load(local_archive(args.name)) as archive:
        arrays = {k: archive[k] for k in archive.files if not k.startswith(("x_", "lossy_"))}
        for split in ("train", "test"):
            images = decode_webp(archive[f"x_{split}_webp"], archive[f"x_{split}_offsets"])
            arrays[f"x_{split}_webp"], arrays[f"x_{split}_offsets"] = lossy_webp(images, args.quality)
            arrays[f"lossy_{split}"] = np.ones(len(images), bool)
    path = Path(args.out) / LOCAL_FILES[args.name]  # the loader's file name, though its images are now lossy
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
    print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
