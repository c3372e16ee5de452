"""FedAvg throughput on CIFAR-10 with the NIID-Bench simple-CNN: the engine vs per-client JAX and PyTorch
loops.

Workload: ``configs/cifar10_fedavg.yaml`` (real CIFAR-10 from ../shared/data, 100 clients from Dirichlet(0.5),
cohorts of 10, batch 64, SGD lr 0.01 momentum 0.9, weight decay 1e-5, per-channel standardisation), with

* a fixed number of local steps per client (``--steps``, default 8 and 40), so that every client does the
  same work: ``examples/round = 10 clients x steps x 64``;
* NIID-Bench's own budget, local epochs (``--epochs``, default 1): client k takes ``ceil(n_k / 64)`` steps,
  the last on a partial batch, so the clients of a round do unequal work (their sizes range over about 30x).
  ``examples/round`` is the sum of the cohort's ``n_k``, the examples every way trains on; each timed call
  runs the same rounds (the same cohorts) in every way.

Ways, same data, partition, cohorts, initial weights and hyper-parameters:

* ``engine``: ``build_experiment`` of the config as a user runs it (rounds scanned inside one ``jax.jit``);
  the layout (``model.lowering``, ``rounds.chunk_size``, ``rounds.cpu_matmul``) chosen by measurement on
  the first build (``fedjax_lab/experiments/layout.py``; ``FEDJAX_LAB_LAYOUT=rules`` for the hand rules),
  and in its own process (the default) the cohort split over one CPU device per core, as ``fedjax-lab run``
  splits it (``parallel.devices: auto``; ``FEDJAX_LAB_CPU_DEVICES=1`` for one device).
* ``engine_naive``: the same engine with XLA's convolution and the whole cohort vmapped (what a direct JAX
  port does; vmapped per-client convolutions become grouped convolutions).
* ``jax_loop``: a Python loop over the cohort calling one jitted ``train_locally`` per client (banded
  convolutions), then a jitted server update.
* ``torch_loop``: the same per-client loop in PyTorch (CPU), data standardised into a float tensor once,
  outside the timed region, with 1 and with 2 intra-op threads (``--torch-threads``); ratios are against the
  faster of the two. (With another process busy on the machine, 2-thread PyTorch collapses to about 180
  examples/s: run this benchmark on an otherwise idle machine.)

Ways are timed in interleaved repetitions (each repetition times every way once), so slow drifts of a shared
machine hit all of them alike; the table reports medians. Before and after each repetition every core is timed
on a fixed loop (``alternating.core_speeds``); the medians leave out the repetitions where the slowest core
ran below 0.8x the fastest (a VM's vCPUs can differ for minutes, and a cohort split waits for the slower),
unless every repetition did; the result file keeps each repetition's figures and balance. Each way runs in a
process of its own, waiting on a pipe while the others run (``--in-process`` puts them in one: there PyTorch's
OpenMP threads, spinning after each operation, slowed the engine by about a third). This is a benchmark, not a
test.

Usage::

    python benchmarks/fedavg_cnn_throughput.py                 # about 10 minutes on 2 cores
    python benchmarks/fedavg_cnn_throughput.py --steps 8 --reps 2 --rounds 2   # quick
    python benchmarks/fedavg_cnn_throughput.py --steps --epochs 1 --ways engine torch_loop  # epochs only
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from alternating import core_balance, core_speeds, even_repetitions
from fedavg_mlp_throughput import machine_info

from fedjax_lab.engine import ClientData, LocalSchedule, randomness, sampling, train_locally
from fedjax_lab.experiments import load_config
from fedjax_lab.experiments.build import build_experiment
from fedjax_lab.methods.fedavg import apply_server_optimizer, init_server_state

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "cifar10_fedavg.yaml"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclasses.dataclass(frozen=True)
class Budget:
    """A client's local budget: ``steps`` steps for every client, or ``epochs`` passes over its data."""

    steps: int | None = None
    epochs: int | None = None

    @property
    def name(self) -> str:
        return f"{self.steps}" if self.steps is not None else f"E{self.epochs}"

    def overrides(self) -> list[str]:
        if self.steps is not None:
            return ["client.local_epochs=null", f"client.local_steps={self.steps}"]
        return ["client.local_steps=null", f"client.local_epochs={self.epochs}"]

    def client_steps(self, num_examples: int, batch_size: int) -> int:
        return self.steps if self.steps is not None else self.epochs * -(-num_examples // batch_size)


def build(budget: Budget, lowering: str, chunk: int | None):
    overrides = [*budget.overrides(), f"model.lowering={lowering}"]
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


def examples_per_call(experiment, budget: Budget, rounds: int, calls: int) -> list[int]:
    """The examples each of the first ``calls`` calls of ``rounds`` rounds trains on (every way runs the same
    rounds, so the same cohorts, in its n-th call)."""
    batch, counts = experiment.config.client.batch_size, experiment.dataset.client_train_counts
    plan = cohorts(experiment, rounds * calls)

    def examples(k):  # the rows client k's steps read: its epochs, or `steps` batches of B
        n = int(counts[k])
        return budget.epochs * n if budget.epochs is not None else budget.steps * batch

    return [sum(examples(k) for r in range(c * rounds, (c + 1) * rounds) for k in plan[r])
            for c in range(calls)]


def epoch_round_rates(calls: int, rounds: int = 3) -> dict:
    """The engine on the one-epoch workload under the rules' layout: a warm-up call, then ``calls`` timed
    calls of ``rounds`` rounds, each call's examples a second (the worker of ``band_height.py`` and
    ``training_pages.py``, after their patch)."""
    budget = Budget(epochs=1)
    experiment = build_experiment(load_config(CONFIG, [*budget.overrides(), "rounds.layout=rules"]))
    call = engine_way(experiment, rounds)
    call()
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    examples = examples_per_call(experiment, budget, rounds, calls + 1)[1:]  # the first call was the warm-up
    return {"examples_per_s": [n / s for n, s in zip(examples, seconds)], "devices": jax.device_count(),
            "chunk_size": experiment.plan.chunk_size, "cpu_matmul": experiment.cpu_matmul}


def jax_loop_way(experiment, steps: int | None, rounds: int, epochs: int | None = None):
    """Per-client Python loop over a jitted ``train_locally`` (the engine's keys), jitted server update;
    ``steps`` local steps, or ``epochs`` local epochs when ``steps`` is None."""
    cfg = experiment.config
    schedule = LocalSchedule(cfg.client.batch_size, local_steps=steps, local_epochs=epochs,
                             min_examples=experiment.dataset.min_examples)
    client_opt = optax.chain(optax.add_decayed_weights(cfg.client.weight_decay),
                             optax.sgd(cfg.client.learning_rate, momentum=cfg.client.momentum))
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


def torch_loop_way(experiment, steps: int | None, rounds: int, threads: int, epochs: int | None = None):
    """The conventional PyTorch per-client loop with the same model, data, cohorts and initial weights:
    ``steps`` SGD steps a client, or ``epochs`` epochs of ``ceil(n_k / B)`` batches (the last one partial, as
    a ``DataLoader`` without ``drop_last``) when ``steps`` is None."""
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
            opt = torch.optim.SGD(params, lr=cfg.client.learning_rate, momentum=cfg.client.momentum,
                                  weight_decay=cfg.client.weight_decay)
            per_epoch = -(-len(r) // batch)
            num_steps = steps if steps is not None else epochs * per_epoch
            order = torch.cat([torch.randperm(len(r), generator=gen)
                               for _ in range(-(-num_steps // per_epoch))])
            for s in range(num_steps):
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


def make_way(name: str, engine, budget: Budget, args):
    """``(call, rounds per call)`` of one way, built on ``engine`` (the experiment every way shares)."""
    steps, epochs = budget.steps, budget.epochs
    if name == "engine":
        return engine_way(engine, args.rounds), args.rounds
    if name == "engine_naive":
        return engine_way(build(budget, "xla", engine.plan.cohort_size), args.naive_rounds), args.naive_rounds
    if name == "jax_loop":
        return jax_loop_way(engine, steps, args.rounds, epochs=epochs), args.rounds
    if name.startswith("torch_loop_"):
        threads = int(name.removeprefix("torch_loop_").removesuffix("t"))
        return torch_loop_way(engine, steps, args.rounds, threads, epochs=epochs), args.rounds
    raise ValueError(f"unknown way {name!r}")


def way_names(args) -> list[str]:
    names = [w for w in args.ways if w != "torch_loop"]
    if "torch_loop" in args.ways:
        names += [f"torch_loop_{t}t" for t in args.torch_threads]
    return names


def worker(args) -> None:
    """One way in a process of its own: builds it, makes its first call, then times one call for every
    ``run`` line on stdin, answering with a JSON line on stdout."""
    kind, _, value = args.worker_budget.partition(":")
    budget = Budget(**{kind: int(value)})
    if args.worker.startswith("engine"):  # as `fedjax-lab run`: the cohort split over one CPU device per core
        from fedjax_lab.engine.sharding import use_cpu_cores

        use_cpu_cores()
    engine = build(budget, "auto", args.chunk)
    call, rounds = make_way(args.worker, engine, budget, args)
    examples = examples_per_call(engine, budget, rounds, args.reps + 1)
    start = time.perf_counter()
    call()
    first = time.perf_counter() - start
    print(json.dumps({"first_call_s": first, "rounds": rounds, "examples": examples,
                      "cohort": engine.plan.cohort_size, "chunk_size": engine.plan.chunk_size,
                      "cohort_devices": engine.plan.num_devices,
                      "lowering": engine.classifier.module.lowering, "cpu_matmul": engine.cpu_matmul}),
          flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        start = time.perf_counter()
        call()
        print(json.dumps({"seconds": time.perf_counter() - start}), flush=True)


class Worker:
    """A subprocess running :func:`worker` for one way."""

    def __init__(self, name: str, budget: Budget, args):
        kind = "steps" if budget.steps is not None else "epochs"
        value = budget.steps if budget.steps is not None else budget.epochs
        command = [sys.executable, str(Path(__file__).resolve()), "--worker", name,
                   "--worker-budget", f"{kind}:{value}", "--rounds", str(args.rounds),
                   "--naive-rounds", str(args.naive_rounds), "--reps", str(args.reps)]
        command += ["--chunk", str(args.chunk)] if args.chunk else []
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ready = self._answer()

    def _answer(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the worker {self.process.args[3]} stopped (exit {self.process.wait()})")
        return json.loads(line)

    def time_call(self) -> float:
        self.process.stdin.write("run\n")
        self.process.stdin.flush()
        return self._answer()["seconds"]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def measure(budget: Budget, args) -> dict:
    """Every way's examples/s, timed in interleaved repetitions: each repetition times one call of every way
    in turn. Each way runs in a process of its own unless ``--in-process``: a PyTorch thread pool in the
    engine's process (its OpenMP threads spin after each operation) slowed the engine by a third."""
    log(f"building the ways (local budget {budget.name}{'' if budget.steps is not None else ' epochs'})")
    names = way_names(args)
    if args.in_process:
        engine = build(budget, "auto", args.chunk)
        built = {name: make_way(name, engine, budget, args) for name in names}
        ready, timers = {}, {}
        for name, (call, rounds) in built.items():
            start = time.perf_counter()
            call()
            ready[name] = {"first_call_s": time.perf_counter() - start, "rounds": rounds,
                           "examples": examples_per_call(engine, budget, rounds, args.reps + 1),
                           "cohort": engine.plan.cohort_size, "chunk_size": engine.plan.chunk_size,
                           "lowering": engine.classifier.module.lowering, "cpu_matmul": engine.cpu_matmul}

            def timer(call=call):
                start = time.perf_counter()
                call()
                return time.perf_counter() - start

            timers[name] = timer
        workers = []
    else:
        workers = [Worker(name, budget, args) for name in names]
        ready = {name: w.ready for name, w in zip(names, workers)}
        timers = {name: w.time_call for name, w in zip(names, workers)}
    for name in names:
        log(f"  {name}: first call (compile + run) {ready[name]['first_call_s']:.1f} s")
    times, balances = {name: [] for name in names}, []
    for rep in range(args.reps):
        before = core_balance(core_speeds())
        for name in names:
            times[name].append(timers[name]())
        balances.append(min(before, core_balance(core_speeds())))
        log(f"  rep {rep + 1}/{args.reps}: " + ", ".join(
            f"{n} {ready[n]['examples'][rep + 1] / times[n][-1]:,.0f} ex/s" for n in names)
            + f"; slowest core {balances[-1]:.2f}x the fastest")
    for w in workers:
        w.close()
    kept = even_repetitions(balances)  # the medians leave out repetitions timed on uneven cores
    out = {}
    for name in names:
        rates = [e / t for e, t in zip(ready[name]["examples"][1:], times[name])]
        out[name] = {"examples_per_s": statistics.median(rates[i] for i in kept),
                     "examples_per_s_best": max(rates[i] for i in kept), "examples_per_s_each": rates,
                     "seconds_per_round": (statistics.median(times[name][i] for i in kept)
                                           / ready[name]["rounds"]),
                     "first_call_s": ready[name]["first_call_s"], "rounds_per_call": ready[name]["rounds"],
                     "seconds_per_call": times[name], "examples_per_call": ready[name]["examples"][1:]}
    # The baseline is the faster of the PyTorch thread settings.
    torch_eps = max((r["examples_per_s"] for n, r in out.items() if n.startswith("torch_loop")), default=None)
    for name, result in out.items():
        result["vs_torch"] = result["examples_per_s"] / torch_eps if torch_eps else None
    engine = ready["engine"] if "engine" in ready else next(iter(ready.values()))
    out["_workload"] = {"steps": budget.steps, "epochs": budget.epochs, "cohort": engine["cohort"],
                        "chunk_size": engine["chunk_size"], "lowering": engine["lowering"],
                        "cpu_matmul": engine.get("cpu_matmul"),
                        "isolated": not args.in_process, "core_balance": balances, "repetitions_kept": kept}
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, nargs="*", default=[8, 40], help="local steps per client")
    ap.add_argument("--epochs", type=int, nargs="*", default=[1], help="local epochs per client (NIID-Bench)")
    ap.add_argument("--ways", nargs="+", default=["engine", "engine_naive", "jax_loop", "torch_loop"])
    ap.add_argument("--rounds", type=int, default=3, help="rounds per timed call")
    ap.add_argument("--naive-rounds", type=int, default=1, help="rounds per timed call of engine_naive")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=None,
                    help="engine rounds.chunk_size (default: the builder's)")
    ap.add_argument("--torch-threads", type=int, nargs="+", default=[1, 2],
                    help="PyTorch intra-op threads; the ratio is against the fastest")
    ap.add_argument("--in-process", action="store_true",
                    help="every way in this process (by default each way runs in a subprocess of its own)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-budget", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    info = machine_info()
    budgets = [*(Budget(steps=n) for n in args.steps), *(Budget(epochs=n) for n in args.epochs)]
    import fedjax_lab  # which checkout ran (a worktree on PYTHONPATH measures another commit)

    info["fedjax_lab"] = str(Path(fedjax_lab.__file__).parent)
    log(f"fedjax_lab from {info['fedjax_lab']}")
    results = {"benchmark": "fedavg_cnn_throughput", "date": _dt.date.today().isoformat(), "machine": info,
               "args": vars(args), "results": {b.name: measure(b, args) for b in budgets}}
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
    from alternating import save

    save("cifar10_cnn", results, args.out)


if __name__ == "__main__":
    main()
