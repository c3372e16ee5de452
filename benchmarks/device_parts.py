"""A lossless data archive carried to a lent GPU in parts, one part a call, and joined there, checked.

A call to the lent machine takes 64 MiB (the checkout's tracked files, about 11 MiB, count too), and
CIFAR-10's lossless archive is 102 MiB. Split here into folders that git ignores, carry one folder a call
while the machine stays warm (ignored paths already there are kept between calls), and join the parts there::

    python benchmarks/device_parts.py split cifar10 .data_a .data_b --sizes-mib 49.4
    # call 1 (carry .whl .data_a): install the wheels; call 2, at once (carry .data_b):
    python3 benchmarks/device_parts.py join .data_a .data_b --out /tmp/d && export FEDJAX_LAB_DATA=/tmp/d

``--sizes-mib`` gives each part's size but the last, which takes the rest (the first call also carries the
wheels, so its part is the smaller). Each folder gets a ``manifest.json`` naming the archive, its path under
``$FEDJAX_LAB_DATA``, its SHA-256 and the parts in order; ``join`` refuses a missing part or a wrong checksum,
and names it. Nothing but the standard library runs on the far side.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

MIB = 2**20
MANIFEST = "manifest.json"


def _sha256(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with path.open("rb") as f:
            for block in iter(lambda: f.read(MIB), b""):
                digest.update(block)
    return digest.hexdigest()


def split(source: Path, relative: str, folders: list[Path], sizes_mib: list[float]) -> list[Path]:
    """Writes ``source`` as ``len(folders)`` parts, part ``k`` into ``folders[k]``: the first parts of
    ``sizes_mib`` MiB each, the last the rest. Returns the parts' paths."""
    if len(sizes_mib) != len(folders) - 1:
        raise ValueError(f"--sizes-mib: give {len(folders) - 1} size(s) for {len(folders)} folders (the last "
                         f"part takes the rest), got {len(sizes_mib)}")
    total = source.stat().st_size
    cuts = [round(s * MIB) for s in sizes_mib]
    if any(c <= 0 for c in cuts) or sum(cuts) >= total:
        raise ValueError(f"--sizes-mib: each size must be positive and together under the archive's "
                         f"{total / MIB:.1f} MiB, got {sizes_mib}")
    sizes = [*cuts, total - sum(cuts)]
    parts = [folder / f"{source.name}.part{k}" for k, folder in enumerate(folders)]
    with source.open("rb") as f:
        for part, size in zip(parts, sizes):
            part.parent.mkdir(parents=True, exist_ok=True)
            part.write_bytes(f.read(size))
    manifest = {"archive": relative, "bytes": total, "sha256": _sha256([source]),
                "parts": [{"folder": folder.name, "file": part.name, "bytes": size}
                          for folder, part, size in zip(folders, parts, sizes)]}
    for folder in folders:
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return parts


def join(folders: list[Path], out: Path) -> Path:
    """Joins the parts that ``folders`` hold (in any order) into ``out/<archive>`` and checks its SHA-256."""
    manifests = [json.loads((f / MANIFEST).read_text()) for f in folders if (f / MANIFEST).is_file()]
    if not manifests:
        raise FileNotFoundError(f"no {MANIFEST} in {[str(f) for f in folders]}: split the archive first")
    manifest = manifests[0]
    by_name = {f.name: f for f in folders}
    parts = []
    for part in manifest["parts"]:
        path = by_name.get(part["folder"], Path(part["folder"])) / part["file"]
        if not path.is_file() or path.stat().st_size != part["bytes"]:
            raise FileNotFoundError(f"part {path} is missing or not {part['bytes']} bytes: carry its folder "
                                    "again (a machine given back between calls keeps nothing)")
        parts.append(path)
    target = out / manifest["archive"]
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("wb") as f:
        for path in parts:
            f.write(path.read_bytes())
    if _sha256([target]) != manifest["sha256"]:
        target.unlink()
        raise ValueError(f"{target}: SHA-256 differs from the manifest's; the parts do not belong together")
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("split", help="an archive of ../shared/data into parts, one folder each")
    s.add_argument("name", help="a local dataset (cifar10, cifar100, mnist, fashion_mnist)")
    s.add_argument("folders", nargs="+", type=Path)
    s.add_argument("--sizes-mib", type=float, nargs="+", default=[],
                   help="each part's size but the last's, in MiB")
    j = sub.add_parser("join", help="the parts into OUT/<archive>, checked")
    j.add_argument("folders", nargs="+", type=Path)
    j.add_argument("--out", type=Path, required=True, help="the folder to use as $FEDJAX_LAB_DATA")
    args = parser.parse_args(argv)
    if args.command == "split":
        from fedjax_lab.data.sources import LOCAL_FILES, local_archive

        parts = split(local_archive(args.name), LOCAL_FILES[args.name], args.folders, args.sizes_mib)
        for part in parts:
            print(f"wrote {part} ({part.stat().st_size / MIB:.1f} MiB)")
    else:
        target = join(args.folders, args.out)
        print(f"joined {target} ({target.stat().st_size / MIB:.1f} MiB, SHA-256 checked)")


if __name__ == "__main__":
    main()
