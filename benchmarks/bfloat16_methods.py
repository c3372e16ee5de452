"""Every registered method for one round in bfloat16 (``model.precision: bfloat16``) and in float32, on a tiny
image-folder dataset made here (3 classes of 16x16 images, 6 clients, the simple-CNN, server data held in
domain): that each runs, and its test loss beside float32's. The suite runs four of them
(``tests/test_precision.py``); this runs all. Writes ``benchmarks/results/bfloat16_methods.json``.

Usage::

    python benchmarks/bfloat16_methods.py              # about 10 minutes on one core
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from fedjax_lab.experiments import validate
from fedjax_lab.experiments.runner import run_experiment
from fedjax_lab.methods import registry

REPO = Path(__file__).resolve().parents[1]


def image_folder(root: Path) -> Path:
    """Three classes of 16x16 RGB images (30 train, 9 test each), each class brighter in its own channel."""
    from PIL import Image

    rng = np.random.RandomState(0)
    for split, n in (("train", 30), ("test", 9)):
        for k, name in enumerate(("red", "green", "blue")):
            (root / split / name).mkdir(parents=True)
            for i in range(n):
                image = rng.randint(0, 80, (16, 16, 3)).astype(np.uint8)
                image[..., k] += 150
                Image.fromarray(image).save(root / split / name / f"{i}.png")
    return root


def config(root: Path, name: str, precision: str):
    return validate({
        "dataset": {"name": "image_folder", "data_dir": str(root),
                    "partition": {"name": "iid", "num_clients": 6},
                    "server_data": {"kind": "in_domain", "size": 20}},
        "model": {"name": "simple_cnn", "precision": precision}, "algorithm": {"name": name},
        "client": {"batch_size": 8, "local_steps": 2, "learning_rate": 0.05},
        "rounds": {"num_rounds": 1, "clients_per_round": 3}, "eval": {"every": 1, "per_client": False}})


def main() -> None:
    results = {"backend": jax.default_backend(), "jax": jax.__version__, "methods": {}}
    with tempfile.TemporaryDirectory() as work:
        root = image_folder(Path(work) / "images")
        for name, spec in registry.REGISTRY.items():
            if not spec.base:  # a plug-in only (FedWalk): it runs on a base, as fedwalk_table.py does
                continue
            row = {}
            for precision in ("float32", "bfloat16"):
                start = time.perf_counter()
                summary = run_experiment(config(root, name, precision), Path(work) / precision / name,
                                         progress=False)
                row[precision] = {"test_loss": summary["final"]["test_loss"],
                                  "seconds": time.perf_counter() - start}
            results["methods"][name] = row
            print(f"{name:<12} float32 loss {row['float32']['test_loss']:.4f}  bfloat16 loss "
                  f"{row['bfloat16']['test_loss']:.4f}", flush=True)
    out = REPO / "benchmarks" / "results" / "bfloat16_methods.json"
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
