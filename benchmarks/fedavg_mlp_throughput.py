"""FedAvg throughput benchmark: fedjax_lab's vectorised engine vs per-client JAX and PyTorch loops.

Workload: the FedAvg paper's 784-200-200-10 MLP ("2NN") on MNIST, 1000 IID clients with 60 training
examples each, client batch size 10, client SGD (lr 0.05) for ``local_steps=50`` steps (500 examples per
client per round), FedAvg server (sgd, lr 1.0), cohorts of 10, 100 and 1000 clients per round.

Three ways, same data, same initial weights and hyper-parameters:

* ``engine``: ``fedjax_lab.engine.make_run_rounds`` (rounds scanned inside one ``jax.jit``), in several
  execution variants (``CohortPlan.chunk_size`` x ``LocalSchedule.unroll``).
* ``jax_loop``: a Python loop over the cohort calling one jitted ``train_locally`` per client (the weighted
  delta is accumulated inside the same jitted call), then a jitted server update.
* ``torch_loop``: the same per-client loop in PyTorch (CPU, ``torch.set_num_threads(2)``); data pre-converted
  to a float32 tensor once, outside the timed region.

Every configuration runs in a fresh subprocess (clean peak-RSS numbers). Throughput is
``examples/s = rounds * cohort * 50 * 10 / seconds``. Each configuration is warmed up (compiled) first, then
timed ``--reps`` times; each timed repetition runs as many back-to-back calls as needed to last
``--min-time`` seconds. The headline number is the median repetition; the best is recorded too.

This is a benchmark, not a test: it asserts nothing about speed.

Usage::

    python benchmarks/fedavg_mlp_throughput.py --cohorts 10 100 1000 --out benchmarks/results/
    python benchmarks/fedavg_mlp_throughput.py --quick        # ~1-2 minute smoke run
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "mnist" / "mnist.npz"

NUM_CLIENTS = 1000
EXAMPLES_PER_CLIENT = 60
BATCH_SIZE = 10
LOCAL_STEPS = 50
CLIENT_LR = 0.05
SERVER_LR = 1.0
EXAMPLES_PER_CLIENT_ROUND = BATCH_SIZE * LOCAL_STEPS  # 500

# Engine execution variants (chunk_size, unroll) per cohort size; chunk_size None = whole-cohort vmap.
DEFAULT_VARIANTS = {
    10: [(None, 1), (None, 5), (5, 1), (2, 1), (1, 1)],
    100: [(None, 1), (None, 5), (None, 10), (10, 1), (10, 5), (5, 1), (2, 1), (2, 5), (1, 1)],
    1000: [(None, 1), (10, 1), (5, 1), (2, 1)],
}
# Rounds per jitted call (engine) / per timed call (loops).
DEFAULT_ROUNDS = {10: 30, 100: 3, 1000: 1}
LOOP_ROUNDS = {10: 3, 100: 1, 1000: 1}

# Cohorts of the loop ways are sampled (with the engine's sampler and keys) before timing, for this many
# rounds.
PRESAMPLED_ROUNDS = 128

QUICK_VARIANTS = {10: [(None, 1), (2, 1)], 100: [(None, 1), (2, 1)], 1000: [(2, 1)]}
QUICK_ROUNDS = {10: 4, 100: 1, 1000: 1}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------------------
# Shared helpers (run inside the worker subprocesses)
# ------------------------------------------------------------------------------------------------------------

def current_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # ru_maxrss is in KiB on Linux


def load_data(path: str | None, seed: int):
    """MNIST training arrays (uint8 images [60000, 28, 28, 1], labels) or random arrays of the same shape."""
    import numpy as np

    p = Path(path) if path else DEFAULT_DATA
    if p.exists():
        with np.load(p) as d:
            x, y = d["x_train"], d["y_train"]
        if x.ndim == 3:
            x = x[..., None]
        source = f"mnist ({p})"
    else:
        rng = np.random.default_rng(seed)
        x = rng.integers(0, 256, (60000, 28, 28, 1), dtype=np.uint8)
        y = rng.integers(0, 10, (60000,), dtype=np.uint8)
        source = f"random uint8 (no file at {p})"
    return x, y.astype(np.int32), source


def client_rows(seed: int, num_examples: int):
    """IID split: a seeded permutation of the pooled examples cut into 1000 clients of 60."""
    import numpy as np

    perm = np.random.default_rng(seed).permutation(num_examples)
    n = EXAMPLES_PER_CLIENT
    return [perm[k * n:(k + 1) * n] for k in range(NUM_CLIENTS)]


def timed_reps(call, reps: int, min_time: float):
    """Times ``call()`` (which must block until its work is done). Returns (seconds per call list, calls per
    rep, first call seconds)."""
    t = time.perf_counter()
    call()
    first = time.perf_counter() - t
    calls = max(1, math.ceil(min_time / max(first, 1e-6)))
    per_call = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(calls):
            call()
        per_call.append((time.perf_counter() - t) / calls)
    return per_call, calls, first


def summarise(per_call, examples_per_call: float, rounds_per_call: float) -> dict:
    import statistics

    med, best = statistics.median(per_call), min(per_call)
    return {
        "seconds_per_call": per_call,
        "examples_per_s": examples_per_call / med,
        "examples_per_s_best": examples_per_call / best,
        "rounds_per_s": rounds_per_call / med,
        "rounds_per_s_best": rounds_per_call / best,
    }


def summarise_loop(per_call, calls: int, first: float, m: int, timed_clients: int, rounds: int, box: dict,
                   **extra) -> dict:
    """:func:`summarise` for a per-client loop, scaled up when only ``timed_clients`` of the ``m`` were
    timed."""
    scale = m / timed_clients
    out = summarise([s * scale for s in per_call], rounds * m * EXAMPLES_PER_CLIENT_ROUND, rounds)
    out.update({
        "first_call_s": first * scale,
        "calls_per_rep": calls,
        "rounds_per_call": rounds,
        "clients_timed_per_round": timed_clients,
        "extrapolated": timed_clients < m,
        "per_client_s": min(per_call) / timed_clients / rounds,
        "first_round_train_loss": box["first_loss"],
        "last_train_loss": box["loss"],
        "rounds_run": box["round"],
        **extra,
    })
    return out


def flax_init_params(seed: int):
    import jax

    from fedjax_lab.models import MLP, Classifier

    clf = Classifier(MLP(10, (200, 200)), (28, 28, 1))
    return clf, clf.init(jax.random.key(seed))


# ------------------------------------------------------------------------------------------------------------
# Way 1: the engine
# ------------------------------------------------------------------------------------------------------------

def run_engine(cfg: dict) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from fedjax_lab.data import index_table
    from fedjax_lab.engine import (
        CohortPlan,
        LocalSchedule,
        RoundInputs,
        init_loop_state,
        make_run_rounds,
        randomness,
    )
    from fedjax_lab.methods.fedavg import fedavg
    from fedjax_lab.methods.server_optimizers import fedavg_server
    from fedjax_lab.models import cross_entropy_loss

    m, chunk, unroll, rounds = cfg["cohort"], cfg["chunk_size"], cfg["unroll"], cfg["rounds"]
    x, y, source = load_data(cfg["data"], cfg["seed"])
    ids, counts = index_table(client_rows(cfg["seed"], len(y)))
    clf, params = flax_init_params(cfg["seed"])
    loss = cross_entropy_loss(clf.predict)
    schedule = LocalSchedule(batch_size=BATCH_SIZE, local_steps=LOCAL_STEPS, min_examples=EXAMPLES_PER_CLIENT,
                             unroll=unroll)
    algorithm = fedavg(loss, optax.sgd(CLIENT_LR), fedavg_server(SERVER_LR), schedule)
    plan = CohortPlan(num_clients=NUM_CLIENTS, cohort_size=m, chunk_size=chunk)
    inputs = RoundInputs(randomness.base_key(cfg["seed"]), jax.device_put({"x": x, "y": y}),
                         jnp.asarray(ids), jnp.asarray(counts), {})
    state = init_loop_state(algorithm, params, NUM_CLIENTS)
    jax.block_until_ready((state, inputs))
    rss_before = current_rss_mb()

    run_rounds = make_run_rounds(algorithm, plan)
    t = time.perf_counter()
    compiled = run_rounds.lower(state, inputs, num_rounds=rounds).compile()
    compile_s = time.perf_counter() - t
    xla_temp_mb = None
    try:
        ma = compiled.memory_analysis()
        if ma is not None:
            xla_temp_mb = ma.temp_size_in_bytes / 2**20
    except Exception as e:  # noqa: BLE001 - not every backend reports it
        log(f"no XLA memory analysis: {e}")

    box = {"state": state, "metrics": None, "first_loss": None}

    def call():
        box["state"], box["metrics"] = compiled(box["state"], inputs)
        jax.block_until_ready(box["state"])
        if box["first_loss"] is None:
            box["first_loss"] = float(np.asarray(box["metrics"]["train_loss"])[0])

    per_call, calls, first = timed_reps(call, cfg["reps"], cfg["min_time"])
    out = summarise(per_call, rounds * m * EXAMPLES_PER_CLIENT_ROUND, rounds)
    steady = min(per_call)
    out.update({
        "compile_s": compile_s,
        "first_call_s": first,
        "first_call_minus_steady_s": first - steady,
        "time_to_first_result_s": compile_s + first,
        "calls_per_rep": calls,
        "rounds_per_call": rounds,
        "first_round_train_loss": box["first_loss"],
        "last_train_loss": float(np.asarray(box["metrics"]["train_loss"])[-1]),
        "rounds_run": int(box["state"].round),
        "xla_temp_mb": xla_temp_mb,
        "rss_before_mb": rss_before,
        "data": source,
    })
    return out


# ------------------------------------------------------------------------------------------------------------
# Way 2: per-client Python loop over a jitted train_locally
# ------------------------------------------------------------------------------------------------------------

def cohorts_for(cfg: dict, num_rounds: int):
    """The engine's cohorts for rounds 0..num_rounds-1 (same sampler and keys as the engine)."""
    import jax
    import numpy as np

    from fedjax_lab.engine import randomness
    from fedjax_lab.engine.sampling import sample_cohort

    base = randomness.base_key(cfg["seed"])
    sample = jax.jit(lambda r: sample_cohort(randomness.round_key(base, r, randomness.Purpose.COHORT),
                                             NUM_CLIENTS, cfg["cohort"]))
    return [np.asarray(sample(r)) for r in range(num_rounds)]


def run_jax_loop(cfg: dict) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from fedjax_lab.data import index_table
    from fedjax_lab.engine import ClientData, LocalSchedule, randomness, train_locally
    from fedjax_lab.methods.fedavg import apply_server_optimizer, init_server_state
    from fedjax_lab.methods.server_optimizers import fedavg_server
    from fedjax_lab.models import cross_entropy_loss

    m, rounds = cfg["cohort"], cfg["rounds"]
    timed_clients = min(m, cfg["max_clients"])
    x, y, source = load_data(cfg["data"], cfg["seed"])
    ids, counts = index_table(client_rows(cfg["seed"], len(y)))
    clf, params = flax_init_params(cfg["seed"])
    loss = cross_entropy_loss(clf.predict)
    schedule = LocalSchedule(batch_size=BATCH_SIZE, local_steps=LOCAL_STEPS, min_examples=EXAMPLES_PER_CLIENT,
                             unroll=cfg["unroll"])
    client_opt, server_opt = optax.sgd(CLIENT_LR), fedavg_server(SERVER_LR)
    arrays = jax.device_put({"x": x, "y": y})
    table, num_examples = jnp.asarray(ids), jnp.asarray(counts)
    base = randomness.base_key(cfg["seed"])

    @jax.jit
    def client_step(global_params, acc, client_id, round_index):
        # One client: the engine's own train_locally with the engine's key derivation; the weighted delta is
        # accumulated in the same call (one dispatch per client).
        client = ClientData(client_id, table[client_id], num_examples[client_id])
        key = randomness.client_key(base, round_index, client_id)
        new_params, stats = train_locally(global_params, loss, client_opt, client, arrays, key, schedule)
        w = client.num_examples.astype(jnp.float32)
        acc = jax.tree.map(lambda a, p, g: a + w * (p - g), acc, new_params, global_params)
        return acc, stats.mean_loss

    @jax.jit
    def server_step(server_state, acc, total_weight):
        mean_delta = jax.tree.map(lambda a: a / total_weight, acc)
        return apply_server_optimizer(server_opt, server_state, mean_delta)

    zeros = jax.jit(lambda p: jax.tree.map(jnp.zeros_like, p))
    server_state = init_server_state(server_opt, params)
    jax.block_until_ready(server_state)
    rss_before = current_rss_mb()

    # Compile (first client call) and measure one steady call.
    acc = zeros(params)
    t = time.perf_counter()
    jax.block_until_ready(client_step(params, acc, 0, 0))
    first_client_s = time.perf_counter() - t
    t = time.perf_counter()
    jax.block_until_ready(client_step(params, acc, 1, 0))
    steady_client_s = time.perf_counter() - t
    jax.block_until_ready(server_step(server_state, acc, jnp.float32(1.0)))

    # The engine's cohorts, sampled outside the timed region; rounds past the list reuse it cyclically.
    cohorts = cohorts_for(cfg, PRESAMPLED_ROUNDS)
    box = {"server": server_state, "round": 0, "loss": float("nan"), "first_loss": None}

    def one_round():
        r = box["round"]
        ids_r = cohorts[r % len(cohorts)][:timed_clients]
        acc = zeros(box["server"].params)
        losses = []
        for k in ids_r:
            acc, loss_k = client_step(box["server"].params, acc, int(k), r)
            losses.append(loss_k)
        total = float(np.sum(counts[ids_r]))
        box["server"] = server_step(box["server"], acc, jnp.float32(total))
        jax.block_until_ready(box["server"])
        box["loss"] = float(jnp.mean(jnp.stack(losses)))
        if box["first_loss"] is None:
            box["first_loss"] = box["loss"]
        box["round"] = r + 1

    def call():
        for _ in range(rounds):
            one_round()

    per_call, calls, first = timed_reps(call, cfg["reps"], cfg["min_time"])
    return summarise_loop(per_call, calls, first, m, timed_clients, rounds, box,
                          compile_s=first_client_s - steady_client_s, rss_before_mb=rss_before, data=source)


# ------------------------------------------------------------------------------------------------------------
# Way 3: per-client PyTorch loop
# ------------------------------------------------------------------------------------------------------------

def run_torch_loop(cfg: dict) -> dict:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.set_num_threads(cfg["torch_threads"])
    m, rounds = cfg["cohort"], cfg["rounds"]
    timed_clients = min(m, cfg["max_clients"])
    x, y, source = load_data(cfg["data"], cfg["seed"])
    rows = client_rows(cfg["seed"], len(y))
    # Pre-converted once, outside the timed region (the conventional way, fair to torch).
    X = torch.from_numpy(x.reshape(len(x), -1)).float().div_(255.0)
    Y = torch.from_numpy(y.astype(np.int64))
    client_rows_t = [torch.from_numpy(r.astype(np.int64)) for r in rows]
    cohorts = cohorts_for(cfg, PRESAMPLED_ROUNDS)  # the engine's cohorts (reused cyclically past the list)

    # Same initial weights as the JAX ways (flax kernels are [in, out]; torch weights are [out, in]).
    _, fparams = flax_init_params(cfg["seed"])
    fp = fparams["params"]
    model = nn.Sequential(nn.Linear(784, 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU(), nn.Linear(200, 10))
    with torch.no_grad():
        for lin, name in zip((model[0], model[2], model[4]), ("hidden_0", "hidden_1", "output")):
            lin.weight.copy_(torch.from_numpy(np.asarray(fp[name]["kernel"]).T.copy()))
            lin.bias.copy_(torch.from_numpy(np.asarray(fp[name]["bias"]).copy()))
    params = list(model.parameters())
    global_params = [p.detach().clone() for p in params]
    opt = torch.optim.SGD(params, lr=CLIENT_LR)
    gen = torch.Generator().manual_seed(cfg["seed"])
    rss_before = current_rss_mb()

    box = {"round": 0, "loss": float("nan"), "first_loss": None}
    steps, bsz = LOCAL_STEPS, BATCH_SIZE

    def one_round(cohort_ids):
        acc = [torch.zeros_like(g) for g in global_params]
        total, losses = 0.0, []
        for k in cohort_ids:
            r = client_rows_t[int(k)]
            n = len(r)
            assert n % bsz == 0, "this workload has equal clients whose size is a multiple of the batch"
            with torch.no_grad():
                for p, g in zip(params, global_params):
                    p.copy_(g)
            # Cycle through fresh per-epoch permutations of the client's examples (like the engine).
            epochs = math.ceil(steps * bsz / n)
            order = torch.cat([torch.randperm(n, generator=gen) for _ in range(epochs)])[: steps * bsz]
            batches = r[order].view(steps, bsz)
            loss_sum = 0.0
            for s in range(steps):
                idx = batches[s]
                opt.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(X[idx]), Y[idx])
                loss.backward()
                opt.step()
                loss_sum += loss.detach()
            losses.append(loss_sum / steps)
            with torch.no_grad():
                torch._foreach_add_(acc, torch._foreach_sub(params, global_params), alpha=float(n))
            total += n
        with torch.no_grad():
            torch._foreach_add_(global_params, acc, alpha=SERVER_LR / total)
        box["loss"] = float(torch.stack(losses).mean())
        if box["first_loss"] is None:
            box["first_loss"] = box["loss"]

    def call():
        for _ in range(rounds):
            r = box["round"]
            one_round(cohorts[r % len(cohorts)][:timed_clients])
            box["round"] = r + 1

    per_call, calls, first = timed_reps(call, cfg["reps"], cfg["min_time"])
    return summarise_loop(per_call, calls, first, m, timed_clients, rounds, box, compile_s=None,
                          torch_threads=torch.get_num_threads(), rss_before_mb=rss_before, data=source)


def worker(cfg: dict) -> None:
    fn = {"engine": run_engine, "jax_loop": run_jax_loop, "torch_loop": run_torch_loop}[cfg["way"]]
    out = fn(cfg)
    out["peak_rss_mb"] = peak_rss_mb()
    out["rss_growth_mb"] = out["peak_rss_mb"] - out["rss_before_mb"]
    print("RESULT " + json.dumps(out), flush=True)


# ------------------------------------------------------------------------------------------------------------
# Parent: machine info, scheduling of the subprocesses, table and JSON
# ------------------------------------------------------------------------------------------------------------

def machine_info() -> dict:
    import importlib.metadata as md

    info = {"platform": platform.platform(), "python": platform.python_version(), "hostname_hidden": True}
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        models = [ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")]
        flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), [])
        caches = [ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("cache size")]
        info["cpu_model"] = models[0] if models else platform.processor()
        info["cpu_logical_cores"] = len(models) or os.cpu_count()
        info["cpu_cache_size"] = caches[0] if caches else None
        info["cpu_simd"] = [f for f in ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile")
                            if f in flags]
    except OSError:
        info["cpu_model"] = platform.processor()
        info["cpu_logical_cores"] = os.cpu_count()
    info["cores_available"] = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                               else os.cpu_count())
    try:
        with open("/proc/meminfo") as f:
            info["mem_total_gb"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    versions = {}
    for pkg in ("jax", "jaxlib", "flax", "optax", "numpy", "torch", "fedjax_lab"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = None
    info["versions"] = versions
    try:
        import jax

        info["jax_backend"] = jax.default_backend()
        info["jax_devices"] = [str(d) for d in jax.devices()]
    except Exception as e:  # noqa: BLE001
        info["jax_backend"] = f"unavailable: {e}"
    info["xla_flags"] = os.environ.get("XLA_FLAGS", "")
    from records import code_commit  # the benchmarks' own folder is on sys.path

    info["commit"] = code_commit()
    return info


def machine_kind(info: dict) -> str:
    """A result file's machine tag: ``cpu-<vendor>-<widest SIMD>-<cores>core`` (``cpu-amd-avx2-1core``), so
    that two VM kinds measured on the same day do not write the same file; else the backend and device."""
    backend = info.get("jax_backend", "cpu")
    if backend == "cpu":
        model = (info.get("cpu_model") or "").lower()
        vendor = next((v for v in ("intel", "amd", "arm") if v in model), "")
        flags = info.get("cpu_simd", [])
        simd = next((s for s in ("avx512", "avx2") if any(f.startswith(s) for f in flags)), "")
        return "-".join(["cpu", *filter(None, (vendor, simd)), f"{info.get('cores_available')}core"])
    dev = (info.get("jax_devices") or ["dev"])[0]
    return f"{backend}-" + "".join(c if c.isalnum() else "-" for c in dev).strip("-").lower()


def run_config(cfg: dict, timeout: float) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(cfg)]
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(REPO),
                              check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f}s"}
    wall = time.perf_counter() - t
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            res = json.loads(line[len("RESULT "):])
            res["subprocess_wall_s"] = wall
            return res
    return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-2000:]}"}


def variant_name(chunk, unroll) -> str:
    return f"chunk={'all' if chunk is None else chunk},unroll={unroll}"


def parse_variant(text: str):
    chunk, unroll = text.split(":")
    return (None if chunk.lower() in ("none", "all") else int(chunk)), int(unroll)


def fmt(v, spec=",.0f"):
    return "-" if v is None else format(v, spec)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cohorts", type=int, nargs="+", default=None, help="cohort sizes (default 10 100 1000)")
    ap.add_argument("--ways", nargs="+", default=["engine", "jax_loop", "torch_loop"],
                    choices=["engine", "jax_loop", "torch_loop"])
    ap.add_argument("--engine-variants", nargs="+", default=None, metavar="CHUNK:UNROLL",
                    help="engine variants for every cohort, e.g. none:1 2:1 10:5 (default: a per-cohort set)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="engine rounds per jitted call (default per cohort)")
    ap.add_argument("--reps", type=int, default=3,
                    help="timed repetitions per configuration (median reported)")
    ap.add_argument("--min-time", type=float, default=2.5, help="seconds a timed repetition lasts at least")
    ap.add_argument("--torch-max-clients", type=int, default=100,
                    help="time at most this many clients of a torch cohort and extrapolate "
                         "(marked in output)")
    ap.add_argument("--jax-loop-max-clients", type=int, default=1000,
                    help="time at most this many clients of a jax_loop cohort and extrapolate")
    ap.add_argument("--torch-threads", type=int, default=2)
    ap.add_argument("--data", default=None,
                    help=f"mnist .npz (default {DEFAULT_DATA}; random data if absent)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"), help="directory for the JSON")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per configuration subprocess")
    ap.add_argument("--quick", action="store_true",
                    help="short smoke run (cohort 10, few variants, short timings)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker is not None:
        worker(json.loads(args.worker))
        return

    cohorts = args.cohorts or ([10] if args.quick else [10, 100, 1000])
    reps = 2 if args.quick else args.reps
    min_time = 0.3 if args.quick else args.min_time
    torch_max = min(args.torch_max_clients, 10) if args.quick else args.torch_max_clients
    jax_loop_max = min(args.jax_loop_max_clients, 20) if args.quick else args.jax_loop_max_clients

    info = machine_info()
    log(f"machine: {info['cpu_model']}, {info['cores_available']} cores, backend {info.get('jax_backend')}, "
        f"versions {info['versions']}")

    configs = []
    for m in cohorts:
        rounds = args.rounds or (QUICK_ROUNDS if args.quick else DEFAULT_ROUNDS).get(m, max(1, 3000 // m))
        loop_rounds = 1 if args.quick else LOOP_ROUNDS.get(m, max(1, 30 // m))
        base = {"cohort": m, "seed": args.seed, "data": args.data, "reps": reps, "min_time": min_time}
        if "engine" in args.ways:
            if args.engine_variants:
                variants = [parse_variant(v) for v in args.engine_variants]
            else:
                table = QUICK_VARIANTS if args.quick else DEFAULT_VARIANTS
                variants = table.get(m, [(None, 1), (2, 1)])
            for chunk, unroll in variants:
                if chunk is not None and (m % chunk or chunk > m):
                    log(f"skip engine {variant_name(chunk, unroll)} at cohort {m}: chunk must "
                        "divide the cohort")
                    continue
                configs.append(dict(base, way="engine", chunk_size=chunk, unroll=unroll, rounds=rounds))
        if "jax_loop" in args.ways:
            configs.append(dict(base, way="jax_loop", unroll=1, rounds=loop_rounds, max_clients=jax_loop_max))
        if "torch_loop" in args.ways:
            configs.append(dict(base, way="torch_loop", rounds=loop_rounds, max_clients=torch_max,
                                torch_threads=args.torch_threads))

    results = []
    t0 = time.perf_counter()
    for i, cfg in enumerate(configs, 1):
        label = cfg["way"] + (f" {variant_name(cfg['chunk_size'], cfg['unroll'])}" if cfg["way"] == "engine"
                              else "")
        log(f"[{i}/{len(configs)}] cohort {cfg['cohort']}: {label} ...")
        res = run_config(cfg, args.timeout)
        row = {"way": cfg["way"], "cohort": cfg["cohort"], "config": cfg, **res}
        if cfg["way"] == "engine":
            row["variant"] = variant_name(cfg["chunk_size"], cfg["unroll"])
        results.append(row)
        if "error" in res:
            log(f"    ERROR: {res['error']}")
        else:
            extra = (f" (extrapolated from {res['clients_timed_per_round']} clients)"
                     if res.get("extrapolated") else "")
            log(f"    {res['examples_per_s']:,.0f} ex/s median ({res['examples_per_s_best']:,.0f} best), "
                f"{res['rounds_per_s']:.3f} rounds/s, peak RSS {res['peak_rss_mb']:,.0f} MB{extra}  "
                f"[{time.perf_counter() - t0:.0f}s elapsed]")

    # Ratios per cohort: best engine variant (by median examples/s) over each loop.
    summary = {}
    for m in cohorts:
        ok = [r for r in results if r["cohort"] == m and "error" not in r]
        eng = [r for r in ok if r["way"] == "engine"]
        best = max(eng, key=lambda r: r["examples_per_s"]) if eng else None
        whole = next((r for r in eng if r["config"]["chunk_size"] is None and r["config"]["unroll"] == 1),
                     None)
        loops = {w: next((r for r in ok if r["way"] == w), None) for w in ("jax_loop", "torch_loop")}
        s = {"best_engine_variant": best["variant"] if best else None,
             "best_engine_examples_per_s": best["examples_per_s"] if best else None,
             "default_engine_examples_per_s": whole["examples_per_s"] if whole else None}
        for w, r in loops.items():
            s[f"{w}_examples_per_s"] = r["examples_per_s"] if r else None
            s[f"{w}_extrapolated"] = r.get("extrapolated") if r else None
            s[f"engine_over_{w}"] = best["examples_per_s"] / r["examples_per_s"] if best and r else None
            s[f"default_engine_over_{w}"] = ((whole["examples_per_s"] / r["examples_per_s"]) if whole and r
                                             else None)
        summary[str(m)] = s

    # Table.
    data_source = next((r["data"] for r in results if "data" in r), "?")
    lines = [(f"FedAvg MLP 784-200-200-10 throughput on {info['cpu_model']} ({info['cores_available']} "
              f"cores, backend {info.get('jax_backend')}); data: {data_source}"),
             (f"median of {reps} timed repetitions (best in brackets); * = extrapolated from a subset of "
              "each cohort; loss r0 = mean client train loss of round 0 (same work check)"),
             "",
             (f"{'cohort':>6}  {'way':<10} {'variant':<22} {'examples/s':>18} {'rounds/s':>9} "
              f"{'compile s':>9} {'peak RSS MB':>11} {'RSS growth MB':>13} {'loss r0':>7}")]
    for r in results:
        if "error" in r:
            lines.append(f"{r['cohort']:>6}  {r['way']:<10} {r.get('variant', ''):<22} ERROR "
                         f"{r['error'][:60]}")
            continue
        star = "*" if r.get("extrapolated") else " "
        ex = f"{r['examples_per_s']:,.0f} ({r['examples_per_s_best']:,.0f})"
        lines.append(f"{r['cohort']:>6}  {r['way']:<10} {r.get('variant', ''):<22} {ex:>17}{star} "
                     f"{r['rounds_per_s']:>9.3f} {fmt(r.get('compile_s'), '.1f'):>9} "
                     f"{r['peak_rss_mb']:>11,.0f} {r['rss_growth_mb']:>13,.0f} "
                     f"{fmt(r.get('first_round_train_loss'), '.4f'):>7}")
    lines.append("")
    for m, s in summary.items():
        lines.append(f"cohort {m}: best engine {s['best_engine_variant']} "
                     f"{fmt(s['best_engine_examples_per_s'])} ex/s; engine/jax_loop "
                     f"{fmt(s['engine_over_jax_loop'], '.2f')}x, engine/torch_loop "
                     f"{fmt(s['engine_over_torch_loop'], '.2f')}x (whole-cohort vmap: "
                     f"{fmt(s['default_engine_over_torch_loop'], '.2f')}x torch)")
    table = "\n".join(lines)
    print(table)

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d")
    name = f"{machine_kind(info)}-{stamp}{'-quick' if args.quick else ''}.json"
    payload = {
        "benchmark": "fedavg_mlp_throughput",
        "created": _dt.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, "benchmarks/fedavg_mlp_throughput.py"]
                            + sys.argv[1:]),
        "workload": {"model": "MLP 784-200-200-10 (fedjax_lab.models.MLP(10, (200, 200)))",
                     "num_clients": NUM_CLIENTS, "examples_per_client": EXAMPLES_PER_CLIENT, "split": "IID",
                     "batch_size": BATCH_SIZE, "local_steps": LOCAL_STEPS,
                     "client_optimizer": f"sgd({CLIENT_LR})",
                     "server_optimizer": f"fedavg_server({SERVER_LR})",
                     "examples_per_client_per_round": EXAMPLES_PER_CLIENT_ROUND},
        "timing": {"statistic": "median of reps (best also given)", "reps": reps, "min_time_s": min_time,
                   "examples_per_s": "rounds * cohort * 500 / seconds"},
        "machine": info,
        "results": results,
        "summary": summary,
        "total_wall_s": time.perf_counter() - t0,
        "table": table,
    }
    path = out_dir / name
    path.write_text(json.dumps(payload, indent=1))
    log(f"wrote {path} ({time.perf_counter() - t0:.0f}s total)")


if __name__ == "__main__":
    main()
