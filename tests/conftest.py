"""Shared fixtures: tiny embedded data and a FedAvg built on it."""

from __future__ import annotations

import os
import shutil
import tempfile

# The tests compile many tiny programs and run each for a few steps, so compiling is most of their time. With
# XLA's backend optimisation off (LLVM -O0; the programs compute the same functions), tests/test_fedcog.py
# took 126 s instead of 232 s on one core. Set before JAX makes its backend; other runs keep the default.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()
# XLA's older CPU fusion code generator compiles these small programs in about half the time of its MLIR
# emitters (a tiny FedAvg round: 0.5 s against 1.1 s; tests/test_fedcog.py and test_reliability.py: 148 s
# against 181 s on 2 cores).
if "xla_cpu_use_fusion_emitters" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_cpu_use_fusion_emitters=false"
# One LLVM module a program instead of parts compiled on parallel threads: the cores are already busy with
# one test each, and the split costs CPU time (compiling a FedCOG and a Feddle round: 2.65 and 2.32
# CPU-seconds against 3.05 and 2.66; the programs compute the same).
if "xla_cpu_parallel_codegen_split_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_cpu_parallel_codegen_split_count=1"

# Many tests build the same program more than once (a run, its resume and the uninterrupted run it must
# equal; a sweep and its separate runs; the same eager operation on the same shapes): a compilation cache for
# the session compiles each program once. One directory for the session, shared by the xdist workers and the
# subprocesses they start: JAX's key for an entry includes the directory's path, so per-worker directories
# never shared an entry. A worker writes each entry whole (``_write_whole`` below); a half-written entry (from
# a subprocess killed on purpose, see pyproject.toml's filterwarnings) makes JAX warn and compile again.
# Fresh each session, removed at its end, so that the suite's time is a fresh machine's.
# Builds keep the hand-written layout rules unless a test asks for measurement (tests/test_layout_choice.py):
# timing candidate layouts would compile every test's round several times.
os.environ["FEDJAX_LAB_LAYOUT"] = "rules"

_CACHE_MADE_HERE = "FEDJAX_LAB_TEST_XLA_CACHE" not in os.environ
if _CACHE_MADE_HERE:  # the controller (or a run without xdist)
    os.environ["FEDJAX_LAB_TEST_XLA_CACHE"] = tempfile.mkdtemp(prefix="fedjax_lab_tests_xla_cache_")
os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ["FEDJAX_LAB_TEST_XLA_CACHE"]
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

try:
    from jax._src import lru_cache as _lru_cache
except ImportError:  # another JAX: entries are written as JAX writes them, and a torn one is compiled again
    _lru_cache = None


def _write_whole(cache, key: str, value: bytes) -> None:
    """JAX's cache ``put`` (no eviction), writing under a temporary name and renaming, so that another worker
    reads the whole entry or none."""
    path = cache.path / f"{key}{_lru_cache._CACHE_SUFFIX}"
    if path.exists():
        return
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    part.write_bytes(value)
    os.replace(part, path)


if _lru_cache is not None and hasattr(_lru_cache, "_CACHE_SUFFIX"):
    _put = _lru_cache.LRUCache.put
    _lru_cache.LRUCache.put = lambda cache, key, value: (
        _put(cache, key, value) if cache.eviction_enabled else _write_whole(cache, key, value))

from fedjax_lab.data import FederatedDataset, gaussian_mixture
from fedjax_lab.engine import CohortPlan, LocalSchedule, RoundInputs, init_loop_state, randomness
from fedjax_lab.methods.fedavg import fedavg
from fedjax_lab.methods.server_optimizers import fedavg_server
from fedjax_lab.models import MLP, Classifier


@pytest.fixture(scope="session")
def tiny_data():
    """12 clients of 3 to 25 training examples, 4 classes, 5 features: uneven sizes exercise the masks."""
    mixture = gaussian_mixture(num_clients=12, examples_per_client=30, num_classes=4, dimension=5,
                               label_alpha=0.3, train_fraction=0.9, seed=3)
    sizes = [3, 25, 7, 12, 27, 5, 9, 18, 4, 22, 11, 16]
    parts = [(mixture.train["x"][ids[:n]], mixture.train["y"][ids[:n]])
             for ids, n in zip(mixture.client_train_ids, sizes)]
    tests = [(mixture.test["x"][ids[:c]], mixture.test["y"][ids[:c]])
             for ids, c in zip(mixture.client_test_ids, mixture.client_test_counts)]
    return FederatedDataset.from_clients("tiny", parts, tests, mixture.num_classes)


@pytest.fixture(scope="session")
def tiny_classifier(tiny_data):
    return Classifier(MLP(tiny_data.num_classes, (8,)), tiny_data.input_shape)


def make_inputs(data, seed=0):
    return RoundInputs(randomness.base_key(seed), jax.device_put(data.train),
                       jnp.asarray(data.client_train_ids), jnp.asarray(data.client_train_counts), {})


def make_fedavg(classifier, schedule=None, server=None, client_lr=0.1):
    return fedavg(classifier.loss, optax.sgd(client_lr), server or fedavg_server(1.0),
                  schedule or LocalSchedule(4, local_steps=3))


@pytest.fixture
def tiny_run(tiny_data, tiny_classifier):
    """(algorithm, plan, initial loop state, inputs) for FedAvg on the tiny data, 6 clients per round."""
    algorithm = make_fedavg(tiny_classifier,
                            LocalSchedule(4, local_epochs=2, min_examples=tiny_data.min_examples))
    params = tiny_classifier.init(jax.random.key(0))
    state = init_loop_state(algorithm, params, tiny_data.num_clients)
    return algorithm, CohortPlan(tiny_data.num_clients, 6), state, make_inputs(tiny_data)


def assert_trees_close(a, b, rtol=1e-5, atol=1e-6):
    close = jax.tree.map(lambda x, y: bool(jnp.allclose(x, y, rtol=rtol, atol=atol)), a, b)
    assert all(jax.tree.leaves(close)), jax.tree.map(lambda x, y: float(jnp.max(jnp.abs(x - y))), a, b)


@pytest.fixture(scope="session")
def image_root(tmp_path_factory):
    """A 3-class image-folder dataset of 16x16 RGB images: 30 train and 9 test per class."""
    return _image_folder(tmp_path_factory.mktemp("images"), seed=0)


@pytest.fixture(scope="session")
def other_image_root(tmp_path_factory):
    """Other images of :func:`image_root`'s classes (another draw): out-of-domain data for it."""
    return _image_folder(tmp_path_factory.mktemp("other_images"), seed=1)


def _image_folder(root, seed: int):
    from PIL import Image

    rng = np.random.RandomState(seed)
    for split, n in (("train", 30), ("test", 9)):
        for k, name in enumerate(("red", "green", "blue")):
            (root / split / name).mkdir(parents=True)
            for i in range(n):
                image = rng.randint(0, 80, (16, 16, 3)).astype(np.uint8)
                image[..., k] += 150
                Image.fromarray(image).save(root / split / name / f"{i}.png")
    return root


def pytest_unconfigure(config):
    """Removes the session's compilation cache (in the process that made it, after its workers finished)."""
    if _CACHE_MADE_HERE and not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ["FEDJAX_LAB_TEST_XLA_CACHE"], ignore_errors=True)
