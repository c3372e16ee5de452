"""The accelerator benchmark: FedAvg with fedjax_lab's engine vs the conventional per-client loops,
on the device JAX and PyTorch find (a GPU when there is one, else the CPU), in one command.

Workloads (FedAvg, client SGD without momentum, FedAvg server with rate 1, populations of 1000 clients from an
IID partition, every client taking exactly ``--local-steps`` steps (default 10) so that every way does the
same work: ``examples/round = cohort x local_steps x batch``):

* ``mlp``: the FedAvg paper's 784-200-200-10 MLP (``model: {name: mlp, hidden: [200, 200]}``) on MNIST, 60
  examples a client, batch 10, lr 0.05;
* ``simple_cnn``: the NIID-Bench simple-CNN on CIFAR-10 (standardised), 50 examples a client, batch 25, lr
  0.01;
* ``resnet18``: the CIFAR ResNet-18 of ``fedjax_lab/models/resnets.py`` (3x3 stem, BatchNorm) on CIFAR-10, as
  the simple-CNN;
* each at cohorts of 10, 100 and 1000 clients a round (``--cohorts``);
* ``sweep``: 8 seeds of the MLP at cohort 10 (``--sweep-seeds``), as one program
  (``fedjax_lab.experiments.sweep.build_sweep_program``) against 8 separate runs one after another.

Ways (same data, partition, cohorts and hyper-parameters; the JAX ways and the PyTorch MLP / simple-CNN also
start from the same weights; the PyTorch ResNet-18 has the same architecture and FLOPs, PyTorch's own init):

* ``engine``: ``build_experiment(validate(raw))`` and its ``run_rounds``, compiled ahead of time
  (``run_rounds.lower(...).compile()``: the compile time is that call's), with the builder's defaults (cohort
  chunking, convolution lowering) for the backend; for the sweep, one ``build_sweep_program``;
* ``engine_bf16``: the engine with ``model.precision: bfloat16`` (passes in bfloat16, everything kept in
  float32);
* ``engine_runs`` (sweep only): ``build_experiment`` + ``run_rounds`` for each seed in turn, as separate runs;
* ``jax_loop``: a Python loop over the cohort calling one jitted ``train_locally`` per client, then a jitted
  server update (``fedavg_cnn_throughput.jax_loop_way``); compile time = first call - steady call;
* ``torch_loop``: the same per-client loop in PyTorch (eager; ``cuda`` if available, else ``cpu`` timed with 1
  thread and with all cores, the faster reported: on a busy machine the multi-threaded run can collapse),
  data preprocessed into one float tensor outside the timed region, FedAvg of the parameters and of the
  BatchNorm running statistics (as the engine averages them).
* ``torch_func``: FedAvg as a PyTorch user who knows ``torch.func`` writes it: the cohort's weights stacked on
  a client axis, each local step one ``vmap(grad(loss))`` over the clients (``functional_call``), SGD on the
  stacked weights, the weighted mean of the deltas; eager, on CUDA when present (``--torch-func-chunk``
  clients at a time); BatchNorm without running statistics (they cannot be updated in place under ``vmap``).

Reported for each (model, cohort, way), every configuration in a fresh subprocess (clean peak memory), after a
warm-up call, as the median of ``--reps`` timed repetitions, each lasting at least ``--min-time`` seconds:

* examples/s and rounds/s (for the sweep, over all members: member-rounds/s); compile time; peak memory (CPU:
  peak RSS of the subprocess, which includes the data and, for ``torch_loop``, the JAX copy of the data it was
  built from; GPU: ``peak_bytes_in_use`` of the JAX device or ``torch.cuda.max_memory_allocated``);
* engine / way: the engine's examples/s over the way's, both measured in the same invocation;
* FLOP/s: model FLOPs per round over the measured round time, and that over the device's peak float32 FLOP/s
  and, on a GPU, over its tensor-core peak (TF32 for float32 rows, bfloat16 for ``engine_bf16``); bytes/s:
  the fewest bytes a client step must move (its parameters read twice and written once, its batch read:
  ``step_min_bytes``) times the steps of a round, over the round time and over the GPU's memory bandwidth.
  That share is how close a way comes to the bandwidth bound, the MLP's, whose products are too small for
  the arithmetic units.
  Model FLOPs are XLA's ``cost_analysis()['flops']`` of one client step (forward, backward and update on one
  batch, compiled with XLA's own convolution so that the banded CPU lowering's extra multiplications by zero
  are not counted) times ``cohort x local_steps``. XLA's cost analysis of the whole ``run_rounds`` program
  (recorded as ``xla_run_rounds_flops``) counts the body of every loop once, not once per trip: it is short by
  the factor ``local_steps x cohort / chunk_size`` and is not used for the rate. The peaks are a table by GPU
  name (``GPU_PEAKS``, data sheets, tensor cores without sparsity; H100 SXM: 67 TFLOP/s float32, 494.5 TF32,
  989.5 bfloat16, 3.35 TB/s; JAX may run float32 matrix products on TF32 tensor cores, so above 100% of the
  float32 peak is possible), or on CPU an estimate of float32 only: cores x clock x FLOPs/cycle (64 with
  AVX-512, two FMA units assumed; 32 with AVX2 + FMA), from ``/proc/cpuinfo``.

A configuration that runs past ``--timeout`` seconds is killed and reported as ``skipped (timeout N s)``, and
the same (model, way) is not tried at larger cohorts; with ``--skip-slow`` (the default) a configuration whose
time, extrapolated linearly in the cohort from the same (model, way) at a smaller cohort, exceeds the timeout
is skipped up front (on a 2-core CPU: ResNet-18 beyond cohort 10, all ways).

Results go to ``benchmarks/results/accelerator-<backend>-<device>-<YYYYMMDD>.json`` (merged with the rows of
earlier invocations of the same day and device, unless ``--fresh``; ratios only ever compare rows of one
invocation; rewritten after every configuration, so that a run cut off keeps what it measured) and a Markdown
table on stdout; ``--plot`` draws ``docs/accelerator_<backend>.png``. This is a benchmark, not a test: it
asserts nothing about speed.

Usage::

    python benchmarks/accelerator.py                                   # everything (hours on a 2-core CPU)
    python benchmarks/accelerator.py --quick                           # smoke run, ~3 minutes on 2 cores
    python benchmarks/accelerator.py --models mlp --cohorts 10 100 --plot
    python benchmarks/accelerator.py --models resnet18 --cohorts 10 --ways engine torch_loop --local-steps 2
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
import fedavg_mlp_throughput as mlp_bench  # stdlib-only at import time; its helpers are reused

MODELS = ("mlp", "simple_cnn", "resnet18")
WAYS = ("engine", "engine_bf16", "jax_loop", "torch_loop", "torch_func")
NUM_CLIENTS = 1000
SERVER_LR = 1.0
# model -> (dataset, model config, batch size, client learning rate); batch sizes divide the clients' 60 / 50.
WORKLOADS = {
    "mlp": ("mnist", {"name": "mlp", "hidden": [200, 200]}, 10, 0.05),
    "simple_cnn": ("cifar10", {"name": "simple_cnn"}, 25, 0.01),
    "resnet18": ("cifar10", {"name": "resnet18", "norm": "batch"}, 25, 0.01),
}
# Peaks by GPU name, first match wins (vendor data sheets; tensor-core figures dense, without the 2:4
# sparsity the sheets quote first): float32 without tensor cores, TF32 and bfloat16 on tensor cores (FLOP/s),
# and memory bandwidth (bytes/s); None where the sheet gives none we trust.
GPU_PEAKS = (
    # name, float32, TF32 tensor, bfloat16 tensor, memory bandwidth
    ("H200", 67e12, 494.5e12, 989.5e12, 4.8e12),
    ("H100 PCIe", 51e12, 378e12, 756.5e12, 2.0e12),
    ("H100 NVL", 60e12, 417.5e12, 835.5e12, 3.9e12),
    ("H100", 67e12, 494.5e12, 989.5e12, 3.35e12),
    ("GH200", 67e12, 494.5e12, 989.5e12, 4.0e12),
    ("A100-SXM4-80GB", 19.5e12, 156e12, 312e12, 2.039e12),
    ("A100-PCIE-80GB", 19.5e12, 156e12, 312e12, 1.935e12),
    ("A100", 19.5e12, 156e12, 312e12, 1.555e12),
    ("A10G", 31.2e12, None, None, None), ("A10", 31.2e12, None, None, None),
    ("L40S", 91.6e12, None, None, None), ("L4", 30.3e12, None, None, None),
    ("V100", 15.7e12, None, None, None), ("T4", 8.1e12, None, None, None),
    ("RTX 4090", 82.6e12, None, None, None), ("RTX 3090", 35.6e12, None, None, None),
)

log = mlp_bench.log


def raw_config(model: str, cohort: int, local_steps: int, seed: int = 0,
               chunk_size: int | None = None, precision: str = "float32", layout: str = "measure") -> dict:
    """The config dict of a workload, as a user writes it (``layout``: ``rounds.layout``; the ways that do not
    run the engine's round take the rules, so that they measure nothing)."""
    dataset, model_cfg, batch, lr = WORKLOADS[model]
    raw = {
        "seed": seed,
        "dataset": {"name": dataset, "partition": {"name": "iid", "num_clients": NUM_CLIENTS}},
        "model": {**model_cfg, "precision": precision},
        "algorithm": {"name": "fedavg", "server_learning_rate": SERVER_LR},
        "client": {"optimizer": "sgd", "learning_rate": lr, "batch_size": batch, "local_steps": local_steps},
        "rounds": {"num_rounds": 1000, "clients_per_round": cohort, "layout": layout},
        "eval": {"every": 1000, "per_client": False},
    }
    if chunk_size:
        raw["rounds"]["chunk_size"] = chunk_size
    return raw


def examples_per_round(model: str, cohort: int, local_steps: int) -> int:
    return cohort * local_steps * WORKLOADS[model][2]


# ------------------------------------------------------------------------------------------------------------
# Worker side (each configuration runs in a fresh subprocess)
# ------------------------------------------------------------------------------------------------------------

def build(model: str, cohort: int, local_steps: int, seed: int = 0, chunk_size: int | None = None,
          precision: str = "float32", layout: str = "measure"):
    """``build_experiment(validate(raw))``; when the builder refuses the default cohort layout for memory (a
    big model with the whole cohort vmapped on a GPU), the largest chunk size that it accepts."""
    from fedjax_lab.experiments import validate
    from fedjax_lab.experiments.build import build_experiment
    from fedjax_lab.experiments.config import ConfigError

    try:
        return build_experiment(validate(raw_config(model, cohort, local_steps, seed, chunk_size, precision,
                                                    layout)))
    except ConfigError as exc:
        if chunk_size is not None or "chunk_size" not in str(exc):
            raise
        log(f"default cohort layout refused ({str(exc)[:120]}...); trying smaller chunks")
    for chunk in sorted({d for d in range(1, cohort) if cohort % d == 0}, reverse=True):
        try:
            return build_experiment(validate(raw_config(model, cohort, local_steps, seed, chunk, precision,
                                                        layout)))
        except ConfigError as exc:
            if "chunk_size" not in str(exc):
                raise
    raise RuntimeError("no chunk size fits")


def cost_flops(compiled) -> float | None:
    """``cost_analysis()['flops']`` of a compiled JAX program (a dict, or a list of dicts in some
    versions)."""
    return compiled_cost(compiled)[0]


def compiled_cost(compiled) -> tuple[float | None, float | None]:
    """``(flops, bytes accessed)`` from XLA's ``cost_analysis()`` of a compiled program (``None`` where it
    has none)."""
    try:
        analysis = compiled.cost_analysis()
    except Exception as exc:  # noqa: BLE001 - not every backend has a cost model
        log(f"no cost analysis: {exc}")
        return None, None
    entries = analysis if isinstance(analysis, (list, tuple)) else [analysis]

    def total(key: str) -> float | None:
        values = [float(e[key]) for e in entries if e and e.get(key) is not None]
        return sum(values) if values else None

    return total("flops"), total("bytes accessed")


def step_min_bytes(experiment) -> float:
    """The fewest bytes one client step moves through memory: the float32 parameters read by the forward and
    the backward pass and written by the update, and the batch's inputs (activations and a momentum, if any,
    left out). It bounds a step's time from below by ``bytes / bandwidth``: the MLP's bound, whose products
    are too small to keep the arithmetic units busy."""
    import jax

    params = jax.eval_shape(experiment.classifier.init, jax.random.key(0))
    num_params = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(params))
    inputs = math.prod(experiment.dataset.input_shape) * experiment.config.client.batch_size
    return 4.0 * (3 * num_params + inputs)


def step_cost(experiment) -> tuple[float | None, float]:
    """``(FLOPs, bytes)`` of one client step (one batch: forward, backward, optimiser update): XLA's FLOPs
    with its own convolution (the model's FLOPs, not those of the banded CPU lowering), and
    :func:`step_min_bytes`."""
    import dataclasses

    import jax

    from fedjax_lab.engine import ClientData, LocalSchedule, randomness, train_locally
    from fedjax_lab.experiments.algorithms import build_client_optimizer

    clf = experiment.classifier
    if hasattr(clf.module, "lowering"):
        clf = dataclasses.replace(clf, module=clf.module.clone(lowering="xla"))
    cfg = experiment.config
    schedule = LocalSchedule(cfg.client.batch_size, local_steps=1,
                             min_examples=experiment.dataset.min_examples)
    opt = build_client_optimizer(cfg)

    def one_step(params, arrays, ids, counts, key):
        client = ClientData(jax.numpy.int32(0), ids[0], counts[0])
        return train_locally(params, clf.loss, opt, client, arrays, randomness.client_key(key, 0, 0),
                             schedule)[0]

    # Compiled for the CPU whatever the backend: on a GPU, XLA's convolutions are cuDNN calls, which its cost
    # analysis does not count (the H100 run of 2026-11-25 saw 15% of the simple-CNN's FLOPs and 0.6% of
    # ResNet-18's).
    cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    inputs = experiment.inputs
    args = (jax.eval_shape(clf.init, jax.random.key(0)), inputs.train_arrays, inputs.client_example_ids,
            inputs.client_num_examples, inputs.key)
    args = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=cpu), args)
    flops = compiled_cost(jax.jit(one_step).lower(*args).compile())[0]
    return flops, step_min_bytes(experiment)


def engine_call(experiment, rounds: int):
    """``(call, compile_s, xla_run_rounds_flops, xla_temp_mb)``: ``run_rounds`` compiled ahead of time for
    ``rounds`` rounds a call; ``call()`` runs them and blocks (the state is donated, so always replaced)."""
    import jax

    t = time.perf_counter()
    compiled = experiment.run_rounds.lower(jax.eval_shape(experiment.initial_state), experiment.inputs,
                                           num_rounds=rounds).compile()
    compile_s = time.perf_counter() - t
    temp_mb = None
    try:
        analysis = compiled.memory_analysis()
        temp_mb = analysis.temp_size_in_bytes / 2**20 if analysis is not None else None
    except Exception as exc:  # noqa: BLE001 - not every backend reports it
        log(f"no XLA memory analysis: {exc}")
    box = {"state": experiment.initial_state()}

    def call():
        box["state"], metrics = compiled(box["state"], experiment.inputs)
        jax.block_until_ready((box["state"], metrics))

    return call, compile_s, cost_flops(compiled), temp_mb


def torch_device():
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def torch_model(model: str, experiment):
    """The PyTorch model of ``model`` (the MLP and the simple-CNN with the JAX ways' initial weights)."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch import nn

    p = experiment.initial_state().server_state.params["params"]

    def copy_dense(layer, flax_layer):  # flax kernels are [in, out], torch weights [out, in]
        layer.weight.copy_(torch.from_numpy(np.asarray(flax_layer["kernel"]).T.copy()))
        layer.bias.copy_(torch.from_numpy(np.asarray(flax_layer["bias"]).copy()))

    if model == "mlp":
        net = nn.Sequential(nn.Flatten(), nn.Linear(784, 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU(),
                            nn.Linear(200, 10))
        with torch.no_grad():
            for layer, name in zip((net[1], net[3], net[5]), ("hidden_0", "hidden_1", "output")):
                copy_dense(layer, p[name])
        return net
    if model == "simple_cnn":
        class SimpleCNN(nn.Module):  # as fedavg_cnn_throughput.torch_loop_way
            def __init__(self):
                super().__init__()
                self.conv1, self.conv2 = nn.Conv2d(3, 6, 5), nn.Conv2d(6, 16, 5)
                self.fc1, self.fc2, self.fc3 = nn.Linear(400, 120), nn.Linear(120, 84), nn.Linear(84, 10)

            def forward(self, h):
                h = F.max_pool2d(F.relu(self.conv1(h)), 2)
                h = F.max_pool2d(F.relu(self.conv2(h)), 2)
                h = h.permute(0, 2, 3, 1).flatten(1)  # flax flattens NHWC
                return self.fc3(F.relu(self.fc2(F.relu(self.fc1(h)))))

        net = SimpleCNN()
        with torch.no_grad():
            for name in ("conv1", "conv2"):
                conv = getattr(net, name)
                conv.weight.copy_(torch.from_numpy(
                    np.asarray(p[name]["kernel"]).transpose(3, 2, 0, 1).copy()))
                conv.bias.copy_(torch.from_numpy(np.asarray(p[name]["bias"]).copy()))
            for name, src in (("fc1", "fc1"), ("fc2", "fc2"), ("fc3", "output")):
                copy_dense(getattr(net, name), p[src])
        return net
    return torch_resnet18(10)


def torch_resnet18(num_classes: int):
    """``fedjax_lab.models.resnets.resnet18`` in PyTorch: 3x3 stem (64, stride 1, no max-pool), BasicBlocks
    [2, 2, 2, 2] of 64/128/256/512 channels, 1x1 projection shortcuts, bias-free convolutions, BatchNorm
    (momentum 0.1, eps 1e-5), global average pooling, 11,173,962 parameters with 10 classes."""
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.shortcut = nn.Sequential()
            if stride != 1 or cin != cout:
                self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                              nn.BatchNorm2d(cout))

        def forward(self, x):
            h = F.relu(self.bn1(self.conv1(x)))
            return F.relu(self.bn2(self.conv2(h)) + self.shortcut(x))

    class ResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
            blocks, cin = [], 64
            for i, width in enumerate((64, 128, 256, 512)):
                for b in range(2):
                    blocks.append(Block(cin, width, 2 if i > 0 and b == 0 else 1))
                    cin = width
            self.blocks = nn.Sequential(*blocks)
            self.output = nn.Linear(512, num_classes)

        def forward(self, x):
            return self.output(self.blocks(self.stem(x)).mean(dim=(2, 3)))

    return ResNet18()


def torch_loop_way(model: str, experiment, steps: int, rounds: int, threads: int):
    """The conventional PyTorch per-client FedAvg loop (the loop of ``fedavg_cnn_throughput.torch_loop_way``
    for any of the three models): each client copies the global model, takes ``steps`` SGD steps on batches
    cut from fresh per-epoch permutations of its examples, and adds its weighted change of the parameters and
    of the BatchNorm running statistics; the server adds the weighted mean. Same cohorts as the engine."""
    import fedavg_cnn_throughput as cnn_bench
    import jax
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    device = torch_device()
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    cfg, data = experiment.config, experiment.dataset
    x = np.asarray(jax.jit(experiment.classifier.preprocess)(data.train["x"]))  # [N, H, W, C] float32
    X = torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).to(device)  # NCHW (the MLP flattens HWC, C=1: same)
    Y = torch.from_numpy(data.train["y"].astype(np.int64)).to(device)
    del x
    rows = [torch.from_numpy(data.client_train_ids[k, :n].astype(np.int64))
            for k, n in enumerate(data.client_train_counts)]
    net = torch_model(model, experiment).to(device)
    state = list(net.parameters()) + [b for b in net.buffers() if b.is_floating_point()]
    global_state = [t.detach().clone() for t in state]
    opt = torch.optim.SGD(net.parameters(), lr=cfg.client.learning_rate)  # no momentum: stateless, made once
    batch = cfg.client.batch_size
    gen = torch.Generator().manual_seed(cfg.seed)
    plan = cnn_bench.cohorts(experiment, 64)
    box = {"round": 0}
    net.train()

    def one_round(cohort):
        acc, total = [torch.zeros_like(g) for g in global_state], 0.0
        for k in cohort:
            r = rows[int(k)]
            n = len(r)
            with torch.no_grad():
                torch._foreach_copy_(state, global_state)
            epochs = math.ceil(steps * batch / n)
            order = torch.cat([torch.randperm(n, generator=gen) for _ in range(epochs)])[: steps * batch]
            batches = r[order].view(steps, batch).to(device, non_blocking=True)
            for s in range(steps):
                idx = batches[s]
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(net(X[idx]), Y[idx]).backward()
                opt.step()
            with torch.no_grad():
                torch._foreach_add_(acc, torch._foreach_sub(state, global_state), alpha=float(n))
            total += n
        with torch.no_grad():
            torch._foreach_add_(global_state, acc, alpha=SERVER_LR / total)

    def call():
        for _ in range(rounds):
            one_round(plan[box["round"] % len(plan)])
            box["round"] += 1
        if device.type == "cuda":
            torch.cuda.synchronize()

    return call


def torch_func_way(model: str, experiment, steps: int, rounds: int, threads: int, chunk: int | None = None):
    """FedAvg as a PyTorch user who knows ``torch.func`` writes it: the cohort's weights stacked on a leading
    client axis, each local step one ``vmap(grad(loss))`` over the clients (``functional_call`` of the same
    module), SGD on the stacked weights, then the weighted mean of the deltas. Eager, on CUDA when present.
    ``chunk`` clients are vmapped at a time (default the whole cohort). BatchNorm layers
    (ResNet-18) normalise with the batch's statistics and keep no running statistics
    (``torch.func.replace_all_batch_norm_modules_``: in-place updates of the running buffers cannot be
    vmapped), so that model does a little less than the other ways. Same data, cohorts and initial weights
    as ``torch_loop``."""
    import fedavg_cnn_throughput as cnn_bench
    import jax
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch.func import functional_call, grad, replace_all_batch_norm_modules_, vmap

    torch.set_num_threads(threads)
    device = torch_device()
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    cfg, data = experiment.config, experiment.dataset
    x = np.asarray(jax.jit(experiment.classifier.preprocess)(data.train["x"]))
    X = torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).to(device)
    Y = torch.from_numpy(data.train["y"].astype(np.int64)).to(device)
    del x
    counts = [int(n) for n in data.client_train_counts]
    rows = [torch.from_numpy(data.client_train_ids[k, :n].astype(np.int64)) for k, n in enumerate(counts)]
    net = torch_model(model, experiment).to(device)
    replace_all_batch_norm_modules_(net)
    net.train()
    global_params = {name: p.detach().clone() for name, p in net.named_parameters()}
    buffers = {name: b for name, b in net.named_buffers()}
    lr, batch = cfg.client.learning_rate, cfg.client.batch_size

    def loss(params, xb, yb):
        return F.cross_entropy(functional_call(net, (params, buffers), (xb,)), yb)

    client_grads = vmap(grad(loss))
    gen = torch.Generator().manual_seed(cfg.seed)
    plan = cnn_bench.cohorts(experiment, 64)
    box = {"round": 0}

    def train_chunk(clients):
        m = len(clients)
        orders = []
        for k in clients:  # each client's batches: fresh permutations of its rows, as the loop's
            n = counts[k]
            order = torch.cat([torch.randperm(n, generator=gen) for _ in range(math.ceil(steps * batch / n))])
            orders.append(rows[k][order[: steps * batch]].view(steps, batch))
        batches = torch.stack(orders, 1).to(device, non_blocking=True)  # [steps, m, batch]
        params = {name: g.expand(m, *g.shape).clone() for name, g in global_params.items()}
        for s in range(steps):
            idx = batches[s]
            grads = client_grads(params, X[idx], Y[idx])
            params = {name: p - lr * grads[name] for name, p in params.items()}
        weights = torch.tensor([float(counts[k]) for k in clients], device=device)
        return {name: torch.tensordot(weights, p - global_params[name].unsqueeze(0), dims=1)
                for name, p in params.items()}, float(weights.sum())

    def one_round(cohort):
        cohort = [int(k) for k in cohort]
        size = chunk or len(cohort)
        acc, total = {name: torch.zeros_like(g) for name, g in global_params.items()}, 0.0
        with torch.no_grad():
            for start in range(0, len(cohort), size):
                deltas, weight = train_chunk(cohort[start:start + size])
                for name in acc:
                    acc[name] += deltas[name]
                total += weight
            for name, g in global_params.items():
                g.add_(acc[name], alpha=SERVER_LR / total)

    def call():
        for _ in range(rounds):
            one_round(plan[box["round"] % len(plan)])
            box["round"] += 1
        if device.type == "cuda":
            torch.cuda.synchronize()

    return call


def device_peak_bytes(way: str) -> float | None:
    """Peak bytes in use on the accelerator (None on CPU)."""
    if way.startswith("torch"):
        import torch

        return float(torch.cuda.max_memory_allocated()) if torch.cuda.is_available() else None
    import jax

    stats = jax.devices()[0].memory_stats()
    return float(stats["peak_bytes_in_use"]) if stats and "peak_bytes_in_use" in stats else None


def time_call(call, reps: int, min_time: float) -> tuple[float, list[float], list[int]]:
    """``(first_s, seconds_per_call, calls)``: one warm-up call (which compiles, for the ways that compile on
    their first call), then ``reps`` repetitions, each running ``call()`` back to back until ``min_time`` has
    passed (at least once); per repetition the mean seconds per call and the number of calls."""
    t = time.perf_counter()
    call()
    first = time.perf_counter() - t
    per_call, calls = [], []
    for _ in range(reps):
        n, t = 0, time.perf_counter()
        while True:
            call()
            n += 1
            elapsed = time.perf_counter() - t
            if elapsed >= min_time:
                break
        per_call.append(elapsed / n)
        calls.append(n)
    return first, per_call, calls


def run_worker(cfg: dict) -> dict:
    """One configuration: builds the way's callable(s), warms up, times; the result as a dict."""
    import jax

    model, m, steps, rounds, way = cfg["model"], cfg["cohort"], cfg["local_steps"], cfg["rounds"], cfg["way"]
    seeds = list(range(cfg["seed"], cfg["seed"] + cfg["members"]))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    out: dict = {"backend": jax.default_backend()}
    compile_s, variants = None, {}
    if cfg["program"]:
        from fedjax_lab.experiments import validate
        from fedjax_lab.experiments.sweep import build_sweep_program, default_member_chunk, expand

        members = expand(validate(raw_config(model, m, steps, cfg["seed"])), {"seed": seeds})
        chunk = default_member_chunk(len(seeds), jax.default_backend(), model) or 1
        program = build_sweep_program(members, chunk)
        experiments = [program.experiment]
        box = {"states": program.initial_states()}

        def call():
            box["states"], metrics = program.run(box["states"], rounds)
            jax.block_until_ready((box["states"], metrics))

        out.update(member_chunk=chunk, cohort_chunk=program.experiment.plan.chunk_size)
    else:
        precision = "bfloat16" if way == "engine_bf16" else "float32"
        layout = "measure" if way.startswith("engine") else "rules"
        experiments = [build(model, m, steps, seed, cfg.get("chunk_size"), precision, layout)
                       for seed in seeds]
        calls = []
        if way in ("engine", "engine_bf16"):
            compile_s, out["xla_run_rounds_flops"], out["xla_temp_mb"] = 0.0, [], []
            for experiment in experiments:
                c, secs, flops, temp = engine_call(experiment, rounds)
                calls.append(c)
                compile_s += secs
                out["xla_run_rounds_flops"].append(flops)
                out["xla_temp_mb"].append(temp)
            out["chunk_size"] = experiments[0].plan.chunk_size
            out["lowering"] = getattr(experiments[0].classifier.module, "lowering", None)
        elif way == "jax_loop":
            import fedavg_cnn_throughput as cnn_bench

            calls = [cnn_bench.jax_loop_way(e, steps, rounds) for e in experiments]
        elif way == "torch_loop":
            import torch

            calls = [torch_loop_way(model, e, steps, rounds, cores) for e in experiments]
            out["torch_device"] = str(torch_device())
            # On a CPU, 1 thread and all cores (the faster is reported): a busy machine can starve the latter.
            threads = cfg["torch_threads"] or ([1, cores] if torch_device().type == "cpu" and cores > 1
                                               else [cores])
            variants = {t: (lambda t=t: torch.set_num_threads(t)) for t in threads}
        elif way == "torch_func":
            import torch

            calls = [torch_func_way(model, e, steps, rounds, cores, cfg.get("torch_func_chunk"))
                     for e in experiments]
            out["torch_device"] = str(torch_device())
            threads = cfg["torch_threads"] or ([1, cores] if torch_device().type == "cpu" and cores > 1
                                               else [cores])
            variants = {t: (lambda t=t: torch.set_num_threads(t)) for t in threads}
        else:
            raise ValueError(f"unknown way {way!r}")

        def call():
            for c in calls:
                c()

    print("PROGRESS " + json.dumps({"stage": "built", "compile_s": compile_s}), flush=True)
    rss_before = mlp_bench.current_rss_mb()
    examples = len(seeds) * rounds * examples_per_round(model, m, steps)
    timings = {}
    for name, setup in (variants or {None: lambda: None}).items():
        setup()
        first, per_call, calls_per_rep = time_call(call, cfg["reps"], cfg["min_time"])
        timings[name] = dict(mlp_bench.summarise(per_call, examples, len(seeds) * rounds), first_call_s=first,
                             calls_per_rep=calls_per_rep)
    best = max(timings, key=lambda k: timings[k]["examples_per_s"])
    out.update(timings[best])
    if variants:
        out["torch_threads"] = best
        out["torch_threads_tried"] = {str(k): v["examples_per_s"] for k, v in timings.items()}
    if compile_s is None and not way.startswith("torch"):  # the warm-up call compiled, the timed ones did not
        compile_s = max(out["first_call_s"] - min(out["seconds_per_call"]), 0.0)
    out.update(compile_s=compile_s, rounds_per_call=rounds, members=len(seeds), examples_per_call=examples,
               rss_before_mb=rss_before, peak_rss_mb=mlp_bench.peak_rss_mb(),
               device_peak_bytes=device_peak_bytes(way))
    if cfg.get("flops_per_example") is None:
        flops, moved = step_cost(experiments[0])
        out["flops_per_example"] = flops / WORKLOADS[model][2] if flops else None
        out["bytes_per_example"] = moved / WORKLOADS[model][2] if moved else None
    else:
        out["flops_per_example"] = cfg["flops_per_example"]
        out["bytes_per_example"] = cfg.get("bytes_per_example")
    return out


def info_worker() -> dict:
    """Machine and device description (in a subprocess, so that the parent never holds the GPU)."""
    import importlib.metadata as md

    info = mlp_bench.machine_info()
    import jax

    dev = jax.devices()[0]
    info["device_kind"] = dev.device_kind
    info["jax_device_count"] = jax.device_count()
    try:
        import torch

        info["torch_cuda"] = torch.cuda.is_available()
        info["torch_device_name"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
        info["torch_tf32"] = {"matmul": torch.backends.cuda.matmul.allow_tf32,
                              "cudnn": torch.backends.cudnn.allow_tf32}
    except Exception as exc:  # noqa: BLE001
        info["torch_cuda"] = f"unavailable: {exc}"
    try:
        info["versions"]["torch"] = md.version("torch")
    except md.PackageNotFoundError:
        pass
    info["jax_default_matmul_precision"] = str(jax.config.jax_default_matmul_precision)
    if info.get("jax_backend") == "cpu":
        info["device_name"] = f"{info.get('cpu_model')} ({info.get('cores_available')} cores)"
    else:
        info["device_name"] = dev.device_kind
    info["peaks"] = device_peaks(info)
    info["peak_flops"], info["peak_flops_source"] = info["peaks"]["fp32"], info["peaks"]["source"]
    return info


def cpu_clock_hz(text: str) -> tuple[float | None, str]:
    """The nominal clock from the model name ("@ 2.60GHz"), else the largest "cpu MHz" of
    ``/proc/cpuinfo``."""
    match = re.search(r"@\s*([\d.]+)\s*GHz", text)
    if match:
        return float(match.group(1)) * 1e9, "model name"
    mhz = [float(v) for v in re.findall(r"^cpu MHz\s*:\s*([\d.]+)", text, re.MULTILINE)]
    return (max(mhz) * 1e6, "cpu MHz") if mhz else (None, "unknown")


def device_peaks(info: dict) -> dict:
    """The device's peaks: ``fp32`` (FLOP/s) and its ``source``; on a GPU of :data:`GPU_PEAKS` also ``tf32``
    and ``bf16`` (tensor-core FLOP/s) and ``bandwidth`` (bytes/s), ``None`` where unknown."""
    peaks = {"tf32": None, "bf16": None, "bandwidth": None}
    if info.get("jax_backend") not in ("cpu", None):
        name = info.get("device_kind", "")
        for key, fp32, tf32, bf16, bandwidth in GPU_PEAKS:
            if key.lower() in name.lower():
                return {"fp32": fp32, "tf32": tf32, "bf16": bf16, "bandwidth": bandwidth,
                        "source": f"table: {key} (float32 {fp32 / 1e12:g} TFLOP/s without tensor cores)"}
        return {**peaks, "fp32": None, "source": f"no peak known for {name!r}"}
    fp32, source = peak_flops(info)
    return {**peaks, "fp32": fp32, "source": source}


def peak_flops(info: dict) -> tuple[float | None, str]:
    """The CPU's peak float32 FLOP/s, estimated, and how it was obtained (see :func:`device_peaks`)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None, "no /proc/cpuinfo"
    flags = set(re.search(r"^flags\s*:(.*)$", text, re.MULTILINE).group(1).split())
    if "avx512f" in flags:
        per_cycle, simd = 64, "AVX-512 (2 FMA units x 16 lanes x 2)"
    elif "avx2" in flags and "fma" in flags:
        per_cycle, simd = 32, "AVX2 + FMA (2 FMA units x 8 lanes x 2)"
    elif "avx" in flags:
        per_cycle, simd = 16, "AVX (8-lane add + mul)"
    else:
        per_cycle, simd = 8, "SSE (4-lane add + mul)"
    hz, source = cpu_clock_hz(text)
    cores = info.get("cores_available") or os.cpu_count()
    if hz is None:
        return None, "unknown CPU clock"
    peak = cores * hz * per_cycle
    return peak, (f"estimate: {cores} cores x {hz / 1e9:.2f} GHz ({source}) x {per_cycle} FLOP/cycle {simd}; "
                  "logical cores, turbo and AVX-512 down-clocking not accounted for")


# ------------------------------------------------------------------------------------------------------------
# Parent: configurations, subprocesses, skipping, table, JSON, plot
# ------------------------------------------------------------------------------------------------------------

def run_subprocess(args: list[str], timeout: float,
                   env: dict | None = None) -> tuple[dict | None, str, float]:
    """Runs this file with ``args``; ``(RESULT json or None, error text or '', wall seconds)``. On timeout the
    child is killed and the error says so (with what it had reported)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *args]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=str(REPO), text=True,
                                env={**os.environ, **(env or {})})
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        wall = time.perf_counter() - t
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    result = next((json.loads(ln[len("RESULT "):]) for ln in reversed(stdout.splitlines())
                   if ln.startswith("RESULT ")), None)
    if result is not None:
        return result, "", wall
    if proc.returncode == -9 and wall >= timeout:
        progress = [json.loads(ln[len("PROGRESS "):]) for ln in stdout.splitlines()
                    if ln.startswith("PROGRESS ")]
        if not progress:
            return None, f"timeout {timeout:.0f} s, while building", wall
        compiled = progress[-1].get("compile_s")
        done = f"compiled in {compiled:.1f} s, " if compiled is not None else ""
        return None, f"timeout {timeout:.0f} s, {done}in its first call", wall
    return None, f"exit {proc.returncode}: {stderr.strip()[-1500:]}", wall


def predicted_seconds(row: dict, cohort: int, reps: int) -> float | None:
    """The wall time of a (model, way) at ``cohort``, extrapolated linearly in the cohort from ``row``."""
    if row.get("status") != "ok":
        return None
    scale = cohort / row["cohort"]
    per_call = sorted(row["seconds_per_call"])[len(row["seconds_per_call"]) // 2]
    timed = row["first_call_s"] + sum(s * n for s, n in zip(row["seconds_per_call"], row["calls_per_rep"]))
    overhead = max(row["subprocess_wall_s"] - timed * len(row.get("torch_threads_tried") or [0]), 0.0)
    return overhead + (1 + reps) * per_call * scale * len(row.get("torch_threads_tried") or [0])


def human(v: float | None, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    for div, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.3g} {prefix}{unit}"
    return f"{v:.3g} {unit}".strip()


def model_label(row: dict) -> str:
    return f"{row['model']} sweep x{row['members']}" if row.get("sweep") else row["model"]


def finish_rows(rows: list[dict], peaks: dict) -> None:
    """FLOP/s and bytes/s, their share of the device's peaks, and the engine / way ratios (within these rows,
    i.e. one invocation). The tensor-core peak of a row is bfloat16's for ``engine_bf16``, TF32's otherwise
    (float32 matrix products may run on TF32 tensor cores)."""
    def percent(value, peak):
        return 100 * value / peak if value and peak else None

    for r in rows:
        if r.get("status") != "ok":
            continue
        fpe, bpe = r.get("flops_per_example"), r.get("bytes_per_example")
        r["flops_per_round"] = (fpe * examples_per_round(r["model"], r["cohort"], r["local_steps"]) if fpe
                                else None)
        r["flops_per_s"] = fpe * r["examples_per_s"] if fpe else None
        r["bytes_per_s"] = bpe * r["examples_per_s"] if bpe else None
        r["percent_of_peak"] = percent(r["flops_per_s"], peaks.get("fp32"))
        tensor = peaks.get("bf16" if r["way"] == "engine_bf16" else "tf32")
        r["percent_of_tensor_peak"] = percent(r["flops_per_s"], tensor)
        r["percent_of_bandwidth"] = percent(r["bytes_per_s"], peaks.get("bandwidth"))
    for r in rows:
        if r.get("status") != "ok":
            continue
        eng = next((e for e in rows if e.get("status") == "ok" and e["way"] == "engine"
                    and e["model"] == r["model"]
                    and e["cohort"] == r["cohort"] and e.get("sweep") == r.get("sweep")), None)
        r["engine_over_way"] = (eng["examples_per_s"] / r["examples_per_s"] if eng and r["way"] != "engine"
                                else None)


def way_detail(row: dict) -> str:
    """How a way ran: the engine's cohort chunk (and the sweep's member chunk), PyTorch's device and
    threads."""
    if row.get("status") != "ok":
        return ""
    if row["way"].startswith("engine"):
        chunk = row.get("cohort_chunk", row.get("chunk_size"))
        text = f"chunk {'all' if chunk is None else chunk}"
        return f" ({text}, {row['member_chunk']} members at once)" if "member_chunk" in row else f" ({text})"
    if row["way"] in ("torch_loop", "torch_func"):
        dev = row.get("torch_device", "cpu")
        threads = row.get("torch_threads")
        return f" ({dev}, {threads} thread{'s' if threads != 1 else ''})" if dev == "cpu" else f" ({dev})"
    return ""


def markdown_table(rows: list[dict], gpu: bool) -> str:
    """The rows as a table: speed, memory, the engine's ratio, and FLOP/s and bytes/s against the peaks (on a
    GPU: float32, the tensor cores' TF32 or bfloat16, the memory bandwidth)."""
    head = ("| model | cohort | way | examples/s | rounds/s | compile s | peak memory | engine÷way | FLOP/s "
            "| % of fp32 peak |")
    extra = " % of tensor-core peak | bytes/s | % of bandwidth |" if gpu else ""
    lines = [head + extra, "| --- | ---: | --- |" + " ---: |" * (7 + 3 * gpu)]

    def pct(value):
        return "-" if value is None else f"{value:.2f}%"

    for r in rows:
        lead = f"| {model_label(r)} | {r['cohort']} | {r['way']}{way_detail(r)} |"
        if r.get("status") != "ok":
            lines.append(f"{lead} {r['status']} ({r['note']}) |" + " - |" * (6 + 3 * gpu))
            continue
        if gpu and r.get("device_peak_bytes") is not None:
            mem = f"{r['device_peak_bytes'] / 2**30:.2f} GiB dev"
        else:
            mem = f"{r['peak_rss_mb']:,.0f} MB RSS"
        ratio = "-" if r.get("engine_over_way") is None else f"{r['engine_over_way']:.2f}x"
        compile_s = "-" if r.get("compile_s") is None else f"{r['compile_s']:.1f}"
        line = (f"{lead} {r['examples_per_s']:,.0f} | {r['rounds_per_s']:.3g} | {compile_s} | {mem} | "
                f"{ratio} | {human(r.get('flops_per_s'), 'FLOP/s')} | {pct(r.get('percent_of_peak'))} |")
        if gpu:
            line += (f" {pct(r.get('percent_of_tensor_peak'))} | {human(r.get('bytes_per_s'), 'B/s')} | "
                     f"{pct(r.get('percent_of_bandwidth'))} |")
        lines.append(line)
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.get("status") == "ok"]
    models = [m for m in MODELS if any(r["model"] == m and not r.get("sweep") for r in ok)]
    sweep = [r for r in ok if r.get("sweep")]
    panels = len(models) + (1 if sweep else 0)
    if not panels:
        log("nothing to plot")
        return
    fig, axes = plt.subplots(1, panels, figsize=(4.6 * panels, 3.8), squeeze=False)
    colors = {"engine": "C0", "engine_runs": "C3", "jax_loop": "C1", "torch_loop": "C2", "torch_func": "C4"}
    for ax, model in zip(axes[0], models):
        for way in ("engine", "jax_loop", "torch_loop", "torch_func"):
            pts = sorted((r["cohort"], r["examples_per_s"]) for r in ok
                         if r["model"] == model and r["way"] == way and not r.get("sweep"))
            if pts:
                ax.plot(*zip(*pts), "o-", label=way, color=colors[way])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("clients per round")
        ax.set_ylabel("examples/s")
        ax.set_title(model)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    if sweep:
        ax = axes[0][-1]
        names = {"engine": "engine\n(one program)", "engine_runs": "engine\n(separate runs)"}
        ax.bar([names.get(r["way"], r["way"] + "\n(separate runs)") for r in sweep],
               [r["examples_per_s"] for r in sweep], color=[colors.get(r["way"], "C4") for r in sweep])
        ax.set_ylabel("examples/s (all members)")
        ax.tick_params(axis="x", labelsize=8)
        ax.set_title(f"{model_label(sweep[0])}, cohort {sweep[0]['cohort']}")
        ax.grid(True, axis="y", which="both", alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    log(f"wrote {path}")


def slug(text: str) -> str:
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]+", "-",
                                     text.lower().replace("(r)", "").replace("(tm)", ""))).strip("-")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=None, choices=MODELS)
    ap.add_argument("--cohorts", type=int, nargs="+", default=None,
                    help="clients per round (default 10 100 1000)")
    ap.add_argument("--ways", nargs="+", default=list(WAYS), choices=WAYS)
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds per timed call (engine: scanned in one call)")
    ap.add_argument("--local-steps", type=int, default=None,
                    help="SGD steps per client per round (default 10)")
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions (median reported)")
    ap.add_argument("--min-time", type=float, default=2.0, help="seconds a timed repetition lasts at least")
    ap.add_argument("--sweep-seeds", type=int, default=None,
                    help="members of the MLP sweep at cohort 10 (default 8; 0: no sweep; needs --models mlp)")
    ap.add_argument("--torch-func-chunk", type=int, default=None,
                    help="clients the torch_func way vmaps at once (default: the whole cohort)")
    ap.add_argument("--torch-threads", type=int, nargs="+", default=None,
                    help="PyTorch CPU thread counts to try, the fastest reported (default: 1 and all cores)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=None, help="seconds per configuration (default 600)")
    ap.add_argument("--skip-slow", action=argparse.BooleanOptionalAction, default=True,
                    help="skip configurations predicted (from a smaller cohort) to exceed --timeout")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: mlp and simple_cnn, cohort 10, 2 local steps, 1 rep, a 2-seed sweep")
    ap.add_argument("--plot", action="store_true", help="write docs/accelerator_<backend>.png")
    ap.add_argument("--fresh", action="store_true",
                    help="overwrite the day's JSON instead of merging into it")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"), help="directory for the JSON")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--info-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.info_worker:
        print("RESULT " + json.dumps(info_worker()), flush=True)
        return
    if args.worker is not None:
        print("RESULT " + json.dumps(run_worker(json.loads(args.worker))), flush=True)
        return

    q = args.quick
    models = args.models or (["mlp", "simple_cnn"] if q else list(MODELS))
    cohorts = sorted(args.cohorts or ([10] if q else [10, 100, 1000]))
    steps = args.local_steps or (2 if q else 10)
    reps = 1 if q else args.reps
    min_time = 0.3 if q else args.min_time
    timeout = args.timeout or (150.0 if q else 600.0)
    sweep_seeds = args.sweep_seeds if args.sweep_seeds is not None else (2 if q else 8)
    t0 = time.perf_counter()
    started = _dt.datetime.now()
    command = shlex.join(["python", "benchmarks/accelerator.py", *(sys.argv[1:] if argv is None else argv)])

    info, err, _ = run_subprocess(["--info-worker"], 300)
    if info is None:
        raise SystemExit(f"could not describe the machine: {err}")
    backend, gpu = info["jax_backend"], info["jax_backend"] != "cpu"
    peak = info["peak_flops"]
    log(f"device: {info['device_name']}, backend {backend}; peak {human(peak, 'FLOP/s')} "
        f"({info['peak_flops_source']}); jax {info['versions'].get('jax')}, torch "
        f"{info['versions'].get('torch')}")

    base = {"local_steps": steps, "rounds": args.rounds, "reps": reps, "min_time": min_time,
            "seed": args.seed, "torch_threads": args.torch_threads, "sweep": False, "members": 1,
            "torch_func_chunk": args.torch_func_chunk}
    configs = [dict(base, model=model, cohort=m, way=way) for model in models for m in cohorts
               for way in args.ways]
    if "mlp" in models and sweep_seeds > 0:
        ways = ((["engine", "engine_runs"] if "engine" in args.ways else [])
                + [w for w in args.ways if w not in ("engine", "engine_bf16")])
        configs += [dict(base, model="mlp", cohort=10, way=way, sweep=True, members=sweep_seeds)
                    for way in ways]

    rows: list[dict] = []
    run_id = started.isoformat(timespec="seconds")

    def save(final: bool) -> tuple[Path, dict]:
        """Writes the rows so far (after every configuration, so a run cut off keeps what it measured)."""
        finish_rows(rows, info["peaks"])
        for r in rows:
            r["run"] = run_id
        table = markdown_table(rows, gpu)
        header = (f"FedAvg, {steps} local steps a client, {args.rounds} round(s) a call, median of {reps}; "
                  f"device {info['device_name']} ({backend}); jax {info['versions'].get('jax')}, torch "
                  f"{info['versions'].get('torch')}; peak {human(peak, 'FLOP/s')} "
                  f"({info['peak_flops_source']})")
        if final:
            print(f"\n{header}\n\n{table}\n")

        device_slug = slug(info["device_name"].replace(" cores)", "core)"))
        name = f"accelerator-{backend}-{device_slug}-{started.strftime('%Y%m%d')}{'-quick' if q else ''}.json"
        path = Path(args.out) / name
        payload = {"benchmark": "accelerator", "machine": info, "runs": [], "rows": []}
        if path.exists() and not args.fresh:
            payload = json.loads(path.read_text())
            keys = {(r["model"], r["cohort"], r["way"], r.get("sweep"), r.get("local_steps")) for r in rows}
            payload["rows"] = [r for r in payload["rows"]
                               if (r["model"], r["cohort"], r["way"], r.get("sweep"),
                                   r.get("local_steps")) not in keys]
            payload["machine"] = info
        payload["runs"] = [r for r in payload["runs"] if r["run"] != run_id]
        payload["runs"].append({"run": run_id, "command": command, "wall_s": time.perf_counter() - t0,
                                "args": vars(args), "local_steps": steps, "reps": reps,
                                "min_time_s": min_time, "timeout_s": timeout,
                                "table": f"{header}\n\n{table}"})
        payload["rows"] += rows
        payload["device"] = {"name": info["device_name"], "backend": backend, "peak_flops": peak,
                             "peak_flops_source": info["peak_flops_source"], "peaks": info["peaks"]}
        payload["versions"] = info["versions"]
        payload["workloads"] = {m: {"dataset": d, "model": c, "batch_size": b, "client_lr": lr,
                                    "num_clients": NUM_CLIENTS, "partition": "iid",
                                    "server": f"fedavg (sgd, lr {SERVER_LR})",
                                    "raw_config": raw_config(m, 10, steps)}
                                for m, (d, c, b, lr) in WORKLOADS.items()}
        payload["notes"] = ("examples/s = rounds x cohort x local_steps x batch / seconds (median rep); "
                            "FLOP/s = XLA's one-step flops / batch x examples/s; engine_over_way compares "
                            "rows of one run.")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(payload, indent=1))
        os.replace(tmp, path)  # never a half-written file, even when the run is killed
        if final:
            log(f"wrote {path} ({time.perf_counter() - t0:.0f} s)")
        return path, payload

    flops_cache: dict[str, float] = {}
    for i, cfg in enumerate(configs, 1):
        label = f"{model_label(cfg)} cohort {cfg['cohort']} {cfg['way']}"
        row = {"model": cfg["model"], "cohort": cfg["cohort"], "way": cfg["way"], "sweep": cfg["sweep"],
               "members": cfg["members"], "local_steps": steps, "batch_size": WORKLOADS[cfg["model"]][2],
               "config": cfg}
        same = [r for r in rows if r["model"] == cfg["model"] and r["way"] == cfg["way"] and not r["sweep"]
                and not cfg["sweep"] and r["cohort"] < cfg["cohort"]]
        timed_out = next((r for r in same if r["status"] == "skipped" and r["note"].startswith("timeout")),
                         None)
        predicted = predicted_seconds(same[-1], cfg["cohort"], reps) if same and args.skip_slow else None
        if timed_out is not None:
            row.update(status="skipped", note=f"timeout {timeout:.0f} s at cohort {timed_out['cohort']}")
        elif predicted is not None and predicted > timeout:
            row.update(status="skipped", note=f"est. {predicted:,.0f} s > timeout {timeout:.0f} s",
                       predicted_s=predicted)
        if "status" in row:
            log(f"[{i}/{len(configs)}] {label}: {row['status']} ({row['note']})")
            rows.append(row)
            save(final=False)
            continue
        log(f"[{i}/{len(configs)}] {label} ...")
        # A sweep's engine row is one program; its other rows are separate runs, one per seed.
        cfg_run = dict(cfg, flops_per_example=flops_cache.get(cfg["model"], (None, None))[0],
                       bytes_per_example=flops_cache.get(cfg["model"], (None, None))[1],
                       way="engine" if cfg["way"] == "engine_runs" else cfg["way"],
                       program=cfg["sweep"] and cfg["way"] == "engine")
        # The torch worker builds its data with JAX on the CPU, leaving the GPU to PyTorch.
        env = {"JAX_PLATFORMS": "cpu"} if cfg["way"].startswith("torch") and gpu else None
        res, err, wall = run_subprocess(["--worker", json.dumps(cfg_run)], timeout, env)
        if res is None:
            status = "skipped" if err.startswith("timeout") else "error"
            row.update(status=status, note=err if status == "skipped" else err[-300:], subprocess_wall_s=wall)
            log(f"    {status}: {err}")
        else:
            row.update(status="ok", subprocess_wall_s=wall, **res)
            if res.get("flops_per_example"):
                flops_cache.setdefault(cfg["model"], (res["flops_per_example"], res.get("bytes_per_example")))
            compiled = "-" if res["compile_s"] is None else f"{res['compile_s']:.1f}"
            log(f"    {res['examples_per_s']:,.0f} examples/s, {res['rounds_per_s']:.3g} rounds/s, compile "
                f"{compiled} s, peak RSS {res['peak_rss_mb']:,.0f} MB  [{wall:.0f} s, "
                f"{time.perf_counter() - t0:.0f} s elapsed]")
        rows.append(row)
        save(final=False)

    _, payload = save(final=True)
    if args.plot:
        plotted = [r for r in payload["rows"] if r.get("local_steps") == steps]
        plot(plotted, REPO / "docs" / f"accelerator_{backend}.png",
             f"FedAvg examples/s, {steps} local steps, {info['device_name']} ({backend})")


if __name__ == "__main__":
    main()
