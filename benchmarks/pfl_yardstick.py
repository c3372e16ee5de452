"""pfl-research itself beside the engine, on pfl-research's own CIFAR-10 benchmark, in one sitting.

On its own benchmark the strongest alternative a user has is pfl-research (Granqvist et al., NeurIPS 2024;
``pip install pfl``), which its paper measured 7-72x faster than the other open-source FL simulators. This
runs the benchmark's setup (``configs/pfl_cifar10.yaml``: its two-convolution CNN with dropout, 1000 IID
users of 50 images, 50 a round, one local epoch of SGD at 0.1 in batches of 10, unweighted FedAvg with server
rate 1) in both, on the same machine and the same standardised images and users:

* ``engine``: fedjax_lab's compiled round (the layout ``fedjax-lab run`` picks, the cohort split over one
  CPU device per core as it splits it, or ``--set`` ones);
* ``pfl``: pfl-research's ``FederatedAveraging`` on its ``SimulatedBackend`` with ``PyTorchModel``, the
  model as pfl's benchmark builds it (NHWC input transposed in the model, Glorot-uniform kernels, PyTorch's
  default biases), in a separate process with its own Python (``--pfl-python``: pfl pins versions of numpy
  and others, so it lives in its own environment), ``torch.set_num_threads`` the same cores.

``--part speed``: blocks of ``--rounds`` rounds, the two ways alternating ``--reps`` times after a warm-up
(compilation, first calls), seconds per round and their ratio. ``--part curve``: one run of ``--rounds``
rounds in each way with the central test accuracy every ``--every`` rounds and the wall-clock time to reach
it (evaluation not counted), so that time to accuracy can be read side by side (``--ways`` runs one of
them). ``--part layers``: the model's layers alone, the engine's convolution lowerings against PyTorch's
(needs PyTorch beside fedjax_lab, not pfl). Each writes JSON (``--out``) with the commit and the machine.
pfl is not a dependency of fedjax_lab::

    python -m venv /tmp/pflenv && /tmp/pflenv/bin/pip install pfl==0.6.0 torch
    export PFL_PYTHON=/tmp/pflenv/bin/python
    python benchmarks/pfl_yardstick.py --part speed --rounds 5 --reps 5
    python benchmarks/pfl_yardstick.py --part curve --rounds 200 --every 20
    python benchmarks/pfl_yardstick.py --part layers

Results and what they mean: docs/benchmarks.md ("pfl-research itself beside the engine").
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "pfl_cifar10.yaml"
WAYS = ("engine", "pfl")
PFL_META = ("pfl_version", "torch", "threads")  # what the pfl process reports besides its times


# --- the pfl side: runs under --pfl-python, imports neither jax nor fedjax_lab ------------------------------

def pfl_cnn(num_classes: int):
    """pfl-research's benchmark CNN for 32x32x3 images (its ``simple_cnn``): NHWC input transposed to NCHW,
    conv3x3-32, conv3x3-64, 2x2 max pool, dropout 0.25, fc128, dropout 0.5, fc; Glorot-uniform weights,
    PyTorch's default biases; ``loss`` the batch mean of the cross-entropy and ``metrics`` its sum and the
    correct count, as pfl's ``PyTorchModel`` calls them."""
    import torch
    import torch.nn.functional as F
    from pfl.metrics import Weighted
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(3, 32, 3), nn.Conv2d(32, 64, 3)
            self.fc1, self.fc2 = nn.Linear(14 * 14 * 64, 128), nn.Linear(128, num_classes)
            for layer in (self.conv1, self.conv2, self.fc1, self.fc2):
                nn.init.xavier_uniform_(layer.weight)
            self.trained_on = 0  # examples through training passes, to check the work a round does

        def forward(self, x):
            self.trained_on += len(x) if self.training else 0
            h = F.relu(self.conv2(F.relu(self.conv1(x.permute(0, 3, 1, 2)))))
            h = F.dropout(F.max_pool2d(h, 2), 0.25, self.training).flatten(1)
            return self.fc2(F.dropout(F.relu(self.fc1(h)), 0.5, self.training))

        def loss(self, x, y, eval=False):
            self.eval() if eval else self.train()
            return F.cross_entropy(self(x), y)

        @torch.no_grad()
        def metrics(self, x, y, eval=True):
            self.eval() if eval else self.train()
            logits = self(x)
            return {"loss": Weighted(F.cross_entropy(logits, y, reduction="sum").item(), len(x)),
                    "accuracy": Weighted((logits.argmax(-1) == y).sum().item(), len(x))}

    return Net()


def pfl_worker(data: Path, rounds: int, warmup: int, every: int, threads: int, seed: int) -> dict:
    """Trains with pfl-research: ``warmup`` untimed rounds, then ``rounds`` timed ones (with the central test
    accuracy every ``every`` rounds when ``every`` > 0, its time not counted). Returns the per-round
    seconds and the curve."""
    import torch
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.aggregate.weighting import WeightByUser
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.metrics import get_overall_value
    from pfl.model.pytorch import PyTorchModel

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    np.random.seed(seed)
    arrays = np.load(data)
    x, y = torch.from_numpy(arrays["x"]), torch.from_numpy(arrays["y"].astype(np.int64))
    users = [(x[rows], y[rows]) for rows in torch.from_numpy(arrays["rows"].astype(np.int64))]
    test = Dataset(raw_data=[torch.from_numpy(arrays["x_test"]),
                             torch.from_numpy(arrays["y_test"].astype(np.int64))])
    cfg = json.loads(str(arrays["config"]))
    train = FederatedDataset.from_slices(users, get_user_sampler("random", range(len(users))))
    net = pfl_cnn(cfg["num_classes"])
    params = [p for p in net.parameters() if p.requires_grad]
    model = PyTorchModel(model=net, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(params, cfg["server_learning_rate"]))
    backend = SimulatedBackend(training_data=train, val_data=None, postprocessors=[WeightByUser()])
    eval_params = NNEvalHyperParams(local_batch_size=10_000)

    class Clock(TrainingProcessCallback):
        """Each round's seconds, and the test accuracy every ``every`` timed rounds (outside the clock)."""

        def __init__(self):
            self.seconds, self.curve, self.last = [], [], None

        def on_train_begin(self, *, model):
            self.last = time.perf_counter()
            return super().on_train_begin(model=model)

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            now = time.perf_counter()
            timed = central_iteration + 1 - warmup
            if timed > 0:
                self.seconds.append(now - self.last)
                if every and timed % every == 0:
                    metrics = {str(k): v for k, v in model.evaluate(test, eval_params=eval_params)}
                    accuracy = float(get_overall_value(metrics["accuracy"]))
                    self.curve.append({"round": timed, "seconds": sum(self.seconds),
                                       "test_accuracy": accuracy})
            self.last = time.perf_counter()
            return super().after_central_iteration(aggregate_metrics, model,
                                                   central_iteration=central_iteration)

    clock = Clock()
    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(central_num_iterations=warmup + rounds, evaluation_frequency=10**9,
                                           train_cohort_size=cfg["clients_per_round"], val_cohort_size=0),
        backend=backend, model=model,
        model_train_params=NNTrainHyperParams(local_learning_rate=cfg["learning_rate"],
                                              local_num_epochs=cfg["local_epochs"],
                                              local_batch_size=cfg["batch_size"]),
        model_eval_params=eval_params, callbacks=[clock])
    import pfl

    return {"seconds": clock.seconds, "curve": clock.curve, "pfl_version": pfl.__version__,
            "examples_per_round": net.trained_on / (warmup + rounds),
            "torch": torch.__version__, "threads": threads}


# --- the driver: runs in fedjax_lab's environment -----------------------------------------------------------

def build(overrides: list[str]):
    """The engine's experiment of ``configs/pfl_cifar10.yaml`` with ``overrides``."""
    from fedjax_lab.experiments import load_config
    from fedjax_lab.experiments.build import build_experiment

    return build_experiment(load_config(CONFIG, overrides))


def export_data(experiment, path: Path) -> None:
    """The engine's standardised images (NHWC float32), labels, users and settings, for the pfl process."""
    import jax

    cfg, data = experiment.config, experiment.dataset
    preprocess = jax.jit(experiment.classifier.preprocess)
    counts = np.asarray(data.client_train_counts)
    if counts.min() != counts.max():
        raise ValueError("the pfl side expects users of equal size (the IID partition)")
    settings = {"num_classes": data.num_classes, "clients_per_round": cfg.rounds.clients_per_round,
                "learning_rate": cfg.client.learning_rate, "batch_size": cfg.client.batch_size,
                "local_epochs": cfg.client.local_epochs,
                "server_learning_rate": cfg.algorithm.server_learning_rate}
    np.savez(path, x=np.asarray(preprocess(data.train["x"])), y=np.asarray(data.train["y"]),
             rows=np.asarray(data.client_train_ids)[:, : counts[0]],
             x_test=np.asarray(preprocess(data.test["x"])), y_test=np.asarray(data.test["y"]),
             config=json.dumps(settings))


def run_pfl(python: str, data: Path, rounds: int, warmup: int, every: int, threads: int, seed: int) -> dict:
    """:func:`pfl_worker` in a process of ``python``; its JSON result (the last line it prints)."""
    out = subprocess.run([python, __file__, "--worker", "--data", str(data), "--rounds", str(rounds),
                          "--warmup", str(warmup), "--every", str(every), "--threads", str(threads),
                          "--seed", str(seed)], capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"the pfl process failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def engine_rounds(experiment, state, rounds: int):
    """``rounds`` compiled rounds, one call; returns the state and the seconds."""
    import jax

    start = time.perf_counter()
    state, _ = experiment.run_rounds(state, experiment.inputs, num_rounds=rounds)
    jax.block_until_ready(state)
    return state, time.perf_counter() - start


def engine_examples(experiment) -> int:
    """The examples the engine trains on a round: every client of the cohort takes ``local_epochs`` passes
    over its (equal-sized) data."""
    cfg, per_client = experiment.config, int(experiment.dataset.client_train_counts[0])
    return cfg.rounds.clients_per_round * per_client * cfg.client.local_epochs


def speed(experiment, python: str, data: Path, rounds: int, reps: int, threads: int, seed: int) -> dict:
    """Alternating blocks of ``rounds`` rounds, after a warm-up of each way."""
    state = experiment.initial_state()
    state, compile_seconds = engine_rounds(experiment, state, rounds)
    engine, pfl, meta = [], [], {}
    for rep in range(reps):
        state, seconds = engine_rounds(experiment, state, rounds)
        engine.append(seconds / rounds)
        result = run_pfl(python, data, rounds, warmup=2, every=0, threads=threads, seed=seed + rep)
        pfl.append(sum(result["seconds"]) / rounds)
        meta = {k: result[k] for k in PFL_META}
        print(f"rep {rep}: engine {engine[-1]:.3f} s/round, pfl {pfl[-1]:.3f} s/round", flush=True)
    e, p = statistics.median(engine), statistics.median(pfl)
    examples = engine_examples(experiment)
    if result["examples_per_round"] != examples:
        raise RuntimeError(f"pfl trained on {result['examples_per_round']} examples a round, the engine on "
                           f"{examples}: not the same workload")
    return {"engine_seconds_per_round": engine, "pfl_seconds_per_round": pfl,
            "engine_first_call_seconds": compile_seconds, "engine_examples_per_second": examples / e,
            "pfl_examples_per_second": examples / p, "speedup_median": p / e,
            "speedups": [b / a for a, b in zip(engine, pfl)], **meta}


def curve(experiment, python: str, data: Path, rounds: int, every: int, threads: int, seed: int,
          ways: tuple[str, ...] = WAYS) -> dict:
    """One run of each of ``ways`` with the test accuracy every ``every`` rounds. The engine's compilation
    is left out of its clock (a block of ``every`` rounds is compiled and run once beforehand, its result
    dropped); pfl's first rounds, which pay for its first calls, are in its own."""
    result: dict = {"examples_per_round": engine_examples(experiment)}
    if "engine" in ways:
        engine_rounds(experiment, experiment.initial_state(), every)  # compiles; its result is dropped
        state, points, total = experiment.initial_state(), [], 0.0
        for r in range(every, rounds + 1, every):
            state, seconds = engine_rounds(experiment, state, every)
            total += seconds
            points.append({"round": r, "seconds": total,
                           "test_accuracy": float(experiment.evaluate(state)["test_accuracy"])})
            print(f"engine round {r}: {points[-1]['test_accuracy']:.4f} after {total:.0f} s", flush=True)
        result["engine"] = points
    if "pfl" in ways:
        pfl = run_pfl(python, data, rounds, warmup=0, every=every, threads=threads, seed=seed)
        if pfl["examples_per_round"] != result["examples_per_round"]:
            raise RuntimeError(f"pfl trained on {pfl['examples_per_round']} examples a round, the engine on "
                               f"{result['examples_per_round']}: not the same workload")
        result.update(pfl=pfl["curve"], **{k: pfl[k] for k in PFL_META})
    return result


# The model's two convolutions and its first dense layer: (input [H, W, C], output features, kernel).
LAYERS = {"conv1": ((32, 32, 3), 32, 3), "conv2": ((30, 30, 32), 64, 3), "fc1": ((12544,), 128, None)}


def best_ms(call, calls: int = 100, repeats: int = 3) -> float:
    """The fastest of ``repeats`` means over ``calls`` calls of ``call`` (after a first call), in ms."""
    call()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            out = call()
        best = min(best, (time.perf_counter() - start) / calls)
        del out
    return best * 1e3


def jax_layer_ms(module, x: np.ndarray, wrt_input: bool) -> tuple[float, float]:
    """A Flax layer's forward pass, and its forward and backward pass, in ms."""
    import jax
    import jax.numpy as jnp

    params = module.init(jax.random.key(0), x)
    forward = jax.jit(module.apply)
    both = jax.jit(jax.grad(lambda p, h: jnp.sum(jax.nn.relu(module.apply(p, h)) ** 2),
                            argnums=(0, 1) if wrt_input else 0))
    return (best_ms(lambda: jax.block_until_ready(forward(params, x))),
            best_ms(lambda: jax.block_until_ready(both(params, x))))


def torch_layer_ms(layer, x) -> tuple[float, float]:
    """The same for a PyTorch layer (``x`` asks for its gradient where the input's is wanted)."""
    import torch

    def both():
        layer.zero_grad()
        (torch.relu(layer(x)) ** 2).sum().backward()

    with torch.no_grad():
        forward = best_ms(lambda: layer(x))
    return forward, best_ms(both)


def layers(batch: int, threads: int) -> dict:
    """Each layer's forward pass and its forward and backward pass (the gradients of its parameters and,
    but for the first layer, of its input) at the clients' batch size: the engine's convolution lowerings
    (``fedjax_lab.models.layers.Conv``) and PyTorch's (oneDNN on a CPU), in ms; one process, the same
    threads."""
    import flax.linen as nn
    import torch

    from fedjax_lab.models.layers import Conv

    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    out: dict[str, dict[str, float]] = {}
    for name, (shape, features, k) in LAYERS.items():
        x = rng.standard_normal((batch, *shape), dtype=np.float32)
        wrt_input = name != "conv1"
        if k is None:
            modules = {"dense": nn.Dense(features)}
            layer, xt = torch.nn.Linear(shape[0], features), torch.from_numpy(x)
        else:
            modules = {lowering: Conv(features, (k, k), "VALID", lowering=lowering)
                       for lowering in ("xla", "im2col", "banded")}
            layer = torch.nn.Conv2d(shape[-1], features, k)
            xt = torch.from_numpy(x.transpose(0, 3, 1, 2).copy())
        xt.requires_grad_(wrt_input)
        row = {}
        for label, module in modules.items():
            row[f"{label} forward"], row[f"{label} forward+backward"] = jax_layer_ms(module, x, wrt_input)
        row["torch forward"], row["torch forward+backward"] = torch_layer_ms(layer, xt)
        out[name] = row
        print(name, "  ".join(f"{key} {value:.2f} ms" for key, value in row.items()), flush=True)
    return {"layers_ms": out, "batch": batch, "threads": threads, "torch": torch.__version__}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("speed", "curve", "layers"), default="speed")
    parser.add_argument("--pfl-python", default=os.environ.get("PFL_PYTHON"),
                        help="a Python with pfl and torch installed (or $PFL_PYTHON)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS),
                        help="--part curve: the ways to run (both by default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", nargs="*", default=[], help="config overrides for the engine")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        result = pfl_worker(args.data, args.rounds, args.warmup, args.every, args.threads, args.seed)
        print(json.dumps(result))
        return
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if args.part == "layers":
        import jax

        from fedjax_lab.experiments.runner import machine

        batch = build([]).config.client.batch_size
        result = {**layers(batch, threads), "part": "layers", "jax": jax.__version__, **machine()}
        write(result, args.out)
        return
    if not args.pfl_python and (args.part == "speed" or "pfl" in args.ways):
        parser.error("--pfl-python (or $PFL_PYTHON): a Python with pfl and torch, e.g. "
                     "python -m venv /tmp/pflenv && /tmp/pflenv/bin/pip install pfl torch")
    from fedjax_lab.engine.sharding import use_cpu_cores

    use_cpu_cores()  # as `fedjax-lab run`: one CPU device per core, the cohort split over them
    import jax

    from fedjax_lab.experiments.runner import machine

    experiment = build([f"seed={args.seed}", *args.set])
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "cifar10_users.npz"
        export_data(experiment, data)
        if args.part == "speed":
            result = speed(experiment, args.pfl_python, data, args.rounds, args.reps, threads, args.seed)
        else:
            result = curve(experiment, args.pfl_python, data, args.rounds, args.every, threads, args.seed,
                           tuple(args.ways))
    settings = {"reps": args.reps} if args.part == "speed" else {"every": args.every, "ways": args.ways}
    result.update(part=args.part, rounds=args.rounds, overrides=args.set, **settings,
                  layout={k: experiment.layout.get(k) for k in ("layout", "why", "devices")},
                  jax=jax.__version__, python=platform.python_version(), **machine())
    write(result, args.out)


def commit() -> str:
    """The checkout's commit, ``+`` when it has changes, or ``unknown``."""
    def git(*args):
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                              check=False).stdout.strip()

    head = git("rev-parse", "--short", "HEAD")
    return (head + ("+" if git("status", "--porcelain", "--untracked-files=no") else "")) or "unknown"


def write(result: dict, out: Path | None) -> None:
    result = {**result, "commit": commit(), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    text = json.dumps(result, indent=1)
    print(text)
    if out:
        out.write_text(text + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
