"""FedAvg throughput on CIFAR-10 with the NIID-Bench simple-CNN: the engine vs per-client JAX and PyTorch
loops.

Workload: ``configs/cifar10_fedavg.yaml`` (real CIFAR-10 from ../shared/data, 100 clients from Dirichlet(0.5),
cohorts of 10, batch 64, SGD lr 0.01 momentum 0.9, per-channel standardisation) with a fixed number of local
steps per client (``--steps``, default 8 and 40) so that every way does the same work:
``examples/round = 10 clients x steps x 64``.

Ways, same data, partition, cohorts, initial weights and hyper-parameters:

* ``engine``: ``build_experiment`` of the config as a user runs it (rounds scanned inside one ``jax.jit``);
  ``model.lowering=auto`` picks the banded convolution on CPU, ``rounds.chunk_size`` picks the cohort loop.
* ``engine_naive``: the same engine with XLA's convolution and the whole cohort vmapped (what a direct JAX
  port does; vmapped per-client convolutions become grouped convolutions).
* ``jax_loop``: a Python loop over the cohort calling one jitted ``train_locally`` per client (banded
  convolutions), then a jitted server update.
* ``torch_loop``: the same per-client loop in PyTorch (CPU), data standardised into a float tensor once,
  outside the timed region, with 1 and with 2 intra-op threads (``--torch-threads``); ratios are against the
  faster of the two. (With another process busy on the machine, 2-thread PyTorch collapses to about 180
  examples/s: run this benchmark on an otherwise idle machine.)

Ways are timed in interleaved repetitions (each repetition times every way once), so slow drifts of a shared
machine hit all of them alike; the table reports medians. This is a benchmark, not a test.

Usage::

    python benchmarks/fedavg_cnn_throughput.py                 # about 10 minutes on 2 cores
    python benchmarks/fedavg_cnn_throughput.py --steps 8 --reps 2 --rounds 2   # quick
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fedavg_mlp_throughput import machine_info, machine_kind

from fedjax_lab.engine import ClientData, LocalSchedule, randomness, sampling, train_locally
from fedjax_lab.experiments import load_config
from fedjax_lab.experiments.build import build_experiment
from fedjax_lab.methods.fedavg import apply_server_optimizer, init_server_state

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "cifar10_fedavg.yaml"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def build(steps: int, lowering: str, chunk: int | None):
    overrides = ["client.local_epochs=null", f"client.local_steps={steps}", f"model.lowering={lowering}"]
    if chunk:
        overrides.append(f"rounds.chunk_size={chunk}")
    return build_experiment(load_config(CONFIG, overrides))


def engine_way(experiment, rounds: int):
    """A callable running ``rounds`` engine rounds (state carried across calls)."""
    box = {"state": experiment.initial_state()}

    def call():
        state, metrics = experiment.run_rounds(box["state"], experiment.inputs, num_rounds=rounds)
        jax.block_until_ready((state, metrics))
        box["state"] = state

    return call


def cohorts(experiment, count: int) -> list[np.ndarray]:
    """The engine's own cohorts for rounds ``0..count-1`` (same sampling, same keys)."""
    plan, key = experiment.plan, experiment.inputs.key
    return [np.asarray(sampling.sample_cohort(randomness.round_key(key, r, randomness.Purpose.COHORT),
                                              plan.num_clients, plan.cohort_size)) for r in range(count)]


def jax_loop_way(experiment, steps: int, rounds: int):
    """Per-client Python loop over a jitted ``train_locally`` (the engine's keys), jitted server update."""
    cfg = experiment.config
    schedule = LocalSchedule(cfg.client.batch_size, local_steps=steps,
                             min_examples=experiment.dataset.min_examples)
    client_opt = optax.sgd(cfg.client.learning_rate, momentum=cfg.client.momentum)
    server_opt = optax.sgd(1.0)
    inputs, loss = experiment.inputs, experiment.classifier.loss

    @jax.jit
    def client(params, acc, k, r):
        data = ClientData(k, inputs.client_example_ids[k], inputs.client_num_examples[k])
        new, _ = train_locally(params, loss, client_opt, data, inputs.train_arrays,
                               randomness.client_key(inputs.key, r, k), schedule)
        w = data.num_examples.astype(jnp.float32)
        return jax.tree.map(lambda a, n, p: a + w * (n - p), acc, new, params), w

    @jax.jit
    def server(state, acc, total):
        return apply_server_optimizer(server_opt, state, jax.tree.map(lambda a: a / total, acc))

    box = {"state": init_server_state(server_opt, experiment.initial_state().server_state.params), "round": 0}
    plan = cohorts(experiment, 64)

    def call():
        for _ in range(rounds):
            r = box["round"]
            params = box["state"].params
            acc, total = jax.tree.map(jnp.zeros_like, params), 0.0
            for k in plan[r % len(plan)]:
                acc, w = client(params, acc, jnp.int32(k), jnp.int32(r))
                total += w
            box["state"] = server(box["state"], acc, total)
            box["round"] = r + 1
        jax.block_until_ready(box["state"])

    return call


def torch_loop_way(experiment, steps: int, rounds: int, threads: int):
    """The conventional PyTorch per-client loop with the same model, data, cohorts and initial weights."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.set_num_threads(threads)
    cfg, data = experiment.config, experiment.dataset
    std = experiment.classifier.preprocess
    x = np.asarray(std(jnp.asarray(data.train["x"]))).transpose(0, 3, 1, 2).copy()
    X, Y = torch.from_numpy(x), torch.from_numpy(data.train["y"].astype(np.int64))
    rows = [torch.from_numpy(data.client_train_ids[k, :n].astype(np.int64))
            for k, n in enumerate(data.client_train_counts)]

    class SimpleCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(3, 6, 5), nn.Conv2d(6, 16, 5)
            self.fc1, self.fc2, self.fc3 = nn.Linear(400, 120), nn.Linear(120, 84), nn.Linear(84, 10)

        def forward(self, h):
            h = F.max_pool2d(F.relu(self.conv1(h)), 2)
            h = F.max_pool2d(F.relu(self.conv2(h)), 2)
            h = h.permute(0, 2, 3, 1).flatten(1)  # flax flattens NHWC
            return self.fc3(F.relu(self.fc2(F.relu(self.fc1(h)))))

    model = SimpleCNN()
    p = experiment.initial_state().server_state.params["params"]
    with torch.no_grad():
        for name in ("conv1", "conv2"):
            getattr(model, name).weight.copy_(torch.from_numpy(
                np.asarray(p[name]["kernel"]).transpose(3, 2, 0, 1).copy()))
            getattr(model, name).bias.copy_(torch.from_numpy(np.array(p[name]["bias"])))
        for name, src in (("fc1", "fc1"), ("fc2", "fc2"), ("fc3", "output")):
            getattr(model, name).weight.copy_(torch.from_numpy(np.asarray(p[src]["kernel"]).T.copy()))
            getattr(model, name).bias.copy_(torch.from_numpy(np.array(p[src]["bias"])))
    params = list(model.parameters())
    global_params = [q.detach().clone() for q in params]
    batch = cfg.client.batch_size
    gen = torch.Generator().manual_seed(cfg.seed)
    plan = cohorts(experiment, 64)
    box = {"round": 0}

    def one_round(cohort):
        acc, total = [torch.zeros_like(g) for g in global_params], 0.0
        for k in cohort:
            r = rows[int(k)]
            with torch.no_grad():
                for q, g in zip(params, global_params):
                    q.copy_(g)
            opt = torch.optim.SGD(params, lr=cfg.client.learning_rate, momentum=cfg.client.momentum)
            epochs = -(-steps * batch // len(r))
            order = torch.cat([torch.randperm(len(r), generator=gen) for _ in range(epochs + 1)])
            per_epoch = -(-len(r) // batch)
            for s in range(steps):
                e, i = divmod(s, per_epoch)
                idx = r[order[e * len(r):(e + 1) * len(r)][i * batch:(i + 1) * batch]]
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(X[idx]), Y[idx]).backward()
                opt.step()
            with torch.no_grad():
                torch._foreach_add_(acc, torch._foreach_sub(params, global_params), alpha=float(len(r)))
            total += len(r)
        with torch.no_grad():
            torch._foreach_add_(global_params, acc, alpha=1.0 / total)

    def call():
        for _ in range(rounds):
            one_round(plan[box["round"] % len(plan)])
            box["round"] += 1

    return call


def measure(steps: int, args) -> dict:
    log(f"building the experiment ({steps} local steps)")
    engine = build(steps, "auto", args.chunk)
    ways = {"engine": engine_way(engine, args.rounds)}
    if "engine_naive" in args.ways:
        ways["engine_naive"] = engine_way(build(steps, "xla", engine.plan.cohort_size), args.naive_rounds)
    if "jax_loop" in args.ways:
        ways["jax_loop"] = jax_loop_way(engine, steps, args.rounds)
    if "torch_loop" in args.ways:
        for threads in args.torch_threads:
            ways[f"torch_loop_{threads}t"] = torch_loop_way(engine, steps, args.rounds, threads)
    rounds = {name: (args.naive_rounds if name == "engine_naive" else args.rounds) for name in ways}
    examples_per_round = engine.plan.cohort_size * steps * engine.config.client.batch_size
    first, times = {}, {name: [] for name in ways}
    for name, call in ways.items():
        t = time.perf_counter()
        call()
        first[name] = time.perf_counter() - t
        log(f"  {name}: first call (compile + run) {first[name]:.1f} s")
    for rep in range(args.reps):
        for name, call in ways.items():
            t = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t)
        log(f"  rep {rep + 1}/{args.reps}: " + ", ".join(
            f"{n} {rounds[n] * examples_per_round / times[n][-1]:,.0f} ex/s" for n in ways))
    out = {}
    for name in ways:
        med, best = statistics.median(times[name]), min(times[name])
        out[name] = {"examples_per_s": rounds[name] * examples_per_round / med,
                     "examples_per_s_best": rounds[name] * examples_per_round / best,
                     "seconds_per_round": med / rounds[name], "first_call_s": first[name],
                     "rounds_per_call": rounds[name], "seconds_per_call": times[name]}
    # The baseline is the faster of the PyTorch thread settings.
    torch_eps = max((r["examples_per_s"] for n, r in out.items() if n.startswith("torch_loop")), default=None)
    for name, result in out.items():
        result["vs_torch"] = result["examples_per_s"] / torch_eps if torch_eps else None
    out["_workload"] = {"steps": steps, "examples_per_round": examples_per_round,
                        "cohort": engine.plan.cohort_size, "chunk_size": engine.plan.chunk_size,
                        "lowering": engine.classifier.module.lowering}
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[8, 40], help="local steps per client")
    ap.add_argument("--ways", nargs="+", default=["engine", "engine_naive", "jax_loop", "torch_loop"])
    ap.add_argument("--rounds", type=int, default=3, help="rounds per timed call")
    ap.add_argument("--naive-rounds", type=int, default=1, help="rounds per timed call of engine_naive")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=None,
                    help="engine rounds.chunk_size (default: the builder's)")
    ap.add_argument("--torch-threads", type=int, nargs="+", default=[1, 2],
                    help="PyTorch intra-op threads; the ratio is against the fastest")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    args = ap.parse_args(argv)
    info = machine_info()
    results = {"benchmark": "fedavg_cnn_throughput", "date": _dt.date.today().isoformat(), "machine": info,
               "args": vars(args), "results": {str(s): measure(s, args) for s in args.steps}}
    print(f"\nFedAvg, simple-CNN, CIFAR-10, cohort 10, batch 64 on {info.get('cpu_model')} "
          f"({info.get('cores_available')} cores), jax {info['versions']['jax']}, torch "
          f"{info['versions']['torch']}")
    print(f"{'steps':>5} {'way':<16} {'ex/s':>9} {'best':>9} {'s/round':>8} {'vs torch':>9}")
    for steps, res in results["results"].items():
        for name, r in res.items():
            if not name.startswith("_"):
                ratio = f"{r['vs_torch']:.2f}x" if r["vs_torch"] else "-"
                print(f"{steps:>5} {name:<16} {r['examples_per_s']:>9,.0f} {r['examples_per_s_best']:>9,.0f} "
                      f"{r['seconds_per_round']:>8.2f} {ratio:>9}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"cifar10_cnn-{machine_kind(info)}-{results['date'].replace('-', '')}.json"
    path.write_text(json.dumps(results, indent=1))
    print(f"saved {path}")


if __name__ == "__main__":
    main()
