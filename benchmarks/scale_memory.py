"""Memory and devices at scale (issue 18): what a cohort, a population and a second device cost.

Each measurement runs in a fresh process (so its peak resident memory is its own) and prints one JSON line;
the parent collects them into ``benchmarks/results/scale-<backend>-<date>.json`` and prints a table.

* ``cohort``: the MNIST MLP (784-200-200-10, 199,210 parameters) with a cohort of 1000 of 1000 clients,
  trained 2 at a time, with every message stacked (the engine before streaming) and streamed: XLA's memory
  analysis of the compiled round, the process's peak resident memory and seconds a round.
* ``devices``: the same MLP at a cohort of 100, the cohort split over 1 and 2 (forced host) devices.
* ``population``: FedAvg over 10^5 clients (Gaussian mixture, 20 examples each, the same MLP shape on 20
  features).
* ``models``: each model's parameters, message, working memory of one more client in a vmapped cohort and
  training FLOPs an example, from XLA's memory and cost analyses of a compiled round (docs/scale.md derives
  accelerator estimates from them).
* ``remat``: ResNet-18's working memory and FLOPs per client, its residual blocks stored and rematerialised
  (``model.remat: off`` and ``blocks``): what ``remat: auto`` weighs when the budget cuts a cohort's chunk.
* ``scaffold``: SCAFFOLD's per-client state for the MNIST MLP, the largest population the budget holds by the
  engine's estimate, and a run at ``--scaffold-clients`` clients to show the estimate holds.

Usage::

    python benchmarks/scale_memory.py                       # all, about 10 minutes on 2 cores
    python benchmarks/scale_memory.py --only cohort devices
    python benchmarks/scale_memory.py --only remat          # the GPU suite's rematerialisation row
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MLP = {"name": "mlp", "hidden": [200, 200]}


def mnist(num_clients: int, cohort: int, **rounds) -> dict:
    return {"seed": 0, "dataset": {"name": "mnist", "partition": {"name": "iid", "num_clients": num_clients}},
            "model": MLP, "algorithm": {"name": "fedavg"},
            "client": {"optimizer": "sgd", "learning_rate": 0.05, "batch_size": 10, "local_steps": 5},
            "rounds": {"num_rounds": 2, "clients_per_round": cohort, **rounds},
            "eval": {"every": 1, "per_client": False}}


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _measure(raw: dict, rounds: int = 2) -> dict:
    """Builds ``raw``, compiles a round (XLA's memory analysis), runs ``rounds`` rounds (the first
    compiles)."""
    import jax

    from fedjax_lab.engine import memory
    from fedjax_lab.experiments.build import build_experiment
    from fedjax_lab.experiments.config import validate
    from fedjax_lab.experiments.memory_fit import estimate_memory

    start = time.perf_counter()
    experiment = build_experiment(validate(raw))
    build_s = time.perf_counter() - start
    shapes = jax.eval_shape(experiment.initial_state)
    start = time.perf_counter()
    compiled = experiment.run_rounds.lower(shapes, experiment.inputs, num_rounds=1).compile()
    stats = compiled.memory_analysis()
    compile_s = time.perf_counter() - start
    state = experiment.initial_state()
    state, _ = jax.block_until_ready(experiment.run_rounds(state, experiment.inputs, num_rounds=1))
    start = time.perf_counter()
    for _ in range(rounds - 1):
        state, _ = jax.block_until_ready(experiment.run_rounds(state, experiment.inputs, num_rounds=1))
    estimate = estimate_memory(experiment)
    return {"build_s": build_s, "compile_s": compile_s,
            "round_s": (time.perf_counter() - start) / max(rounds - 1, 1),
            "xla_temp_gib": stats.temp_size_in_bytes / memory.GiB,
            "xla_argument_gib": stats.argument_size_in_bytes / memory.GiB,
            "xla_total_gib": memory.compiled_estimate(compiled) / memory.GiB,
            "static_estimate_gib": estimate.total / memory.GiB,
            "per_client_state_mib": estimate.per_client_state / 2**20,
            "peak_rss_gib": _peak_rss_gib(), "devices": experiment.plan.num_devices,
            "streams": experiment.plan.streams(experiment.algorithm)}


def child(kind: str, arg: str) -> dict:
    if kind == "cohort":
        return {"aggregation": arg, **_measure({**mnist(1000, 1000, chunk_size=2),
                                                "parallel": {"aggregation": arg}})}
    if kind == "devices":
        return {"devices": int(arg), **_measure({**mnist(1000, 100), "parallel": {"devices": int(arg)}},
                                                rounds=4)}
    if kind == "population":
        raw = {"seed": 0, "dataset": {"name": "gaussian_mixture", "num_clients": int(arg),
                                      "examples_per_client": 20, "dimension": 20, "num_classes": 10,
                                      "train_fraction": 0.5},
               "model": MLP, "algorithm": {"name": "fedavg"},
               "client": {"optimizer": "sgd", "learning_rate": 0.05, "batch_size": 10, "local_steps": 5},
               "rounds": {"num_rounds": 4, "clients_per_round": 100},
               "eval": {"every": 1, "per_client": False}}
        return {"num_clients": int(arg), **_measure(raw, rounds=4)}
    if kind == "models":
        return model_costs(arg)
    if kind == "remat":
        return {"remat": arg, **model_costs("resnet18", remat=arg)}
    if kind == "scaffold":
        raw = {**mnist(int(arg), 100), "algorithm": {"name": "scaffold"}}
        return {"num_clients": int(arg), **_measure(raw, rounds=3)}
    raise ValueError(kind)


MODELS = {"mlp": ("mnist", 10), "simple_cnn": ("cifar10", 64), "resnet18": ("cifar10", 64)}


def model_costs(name: str, remat: str = "off") -> dict:
    """One model's memory and FLOPs per client, from XLA's analyses of a compiled round (not run): the whole
    cohort vmapped with XLA's convolutions, as on an accelerator; per-client figures are the difference
    between cohorts of 20 and 10, so what every round holds once (data, server state) drops out."""
    import jax

    from fedjax_lab.engine import memory
    from fedjax_lab.experiments.build import build_experiment
    from fedjax_lab.experiments.config import validate

    dataset, batch = MODELS[name]
    out = {"model": name, "dataset": dataset, "batch_size": batch}
    for cohort in (10, 20):
        raw = {**mnist(100, cohort), "dataset": {"name": dataset,
                                                 "partition": {"name": "iid", "num_clients": 100}},
               "model": {**MLP, "name": name, "lowering": "xla",
                         **({"remat": remat} if name.startswith("resnet") else {})},
               "client": {"optimizer": "sgd", "learning_rate": 0.05, "batch_size": batch, "local_steps": 1}}
        raw["rounds"]["chunk_size"] = cohort
        experiment = build_experiment(validate(raw))
        compiled = experiment.run_rounds.lower(jax.eval_shape(experiment.initial_state), experiment.inputs,
                                               num_rounds=1).compile()
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        out[f"temp_gib_{cohort}"] = compiled.memory_analysis().temp_size_in_bytes / memory.GiB
        out[f"flops_{cohort}"] = float(cost["flops"])
        params = jax.eval_shape(experiment.classifier.init, jax.random.key(0))
        out["parameters"] = sum(x.size for x in jax.tree.leaves(params["params"]))
    out["message_mib"] = 4 * out["parameters"] / 2**20
    out["client_working_mib"] = (out["temp_gib_20"] - out["temp_gib_10"]) / 10 * 1024
    out["train_flops_per_example"] = (out["flops_20"] - out["flops_10"]) / (10 * batch)
    return out


def run_child(kind: str, arg: str, devices: int = 1) -> dict:
    env = dict(os.environ)
    if devices > 1:
        env["XLA_FLAGS"] = env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}"
    out = subprocess.run([sys.executable, __file__, "--child", kind, arg], check=False, env=env, cwd=REPO,
                         text=True, capture_output=True)
    if out.returncode:
        return {"kind": kind, "arg": arg, "error": out.stderr[-2000:]}
    return {"kind": kind, **json.loads(out.stdout.strip().splitlines()[-1])}


def scaffold_capacity(budget_gib: float) -> dict:
    """The largest SCAFFOLD population of the MNIST MLP whose loop state fits ``budget_gib``, by the engine's
    static estimate (its per-client state and everything else measured at 1000 clients)."""
    import jax

    from fedjax_lab.engine import memory
    from fedjax_lab.experiments.build import build_experiment
    from fedjax_lab.experiments.config import validate
    from fedjax_lab.experiments.memory_fit import estimate_memory

    estimate = estimate_memory(build_experiment(validate({**mnist(1000, 100),
                                                          "algorithm": {"name": "scaffold"}})))
    rest = estimate.total - estimate.client_states
    largest = int((budget_gib * memory.GiB - rest) // estimate.per_client_state)
    del jax
    return {"kind": "scaffold_capacity", "budget_gib": budget_gib,
            "per_client_state_mib": estimate.per_client_state / 2**20, "rest_gib": rest / memory.GiB,
            "largest_population": largest}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+",
                    choices=["cohort", "devices", "population", "scaffold", "models", "remat"],
                    default=["cohort", "devices", "population", "scaffold", "models"])
    ap.add_argument("--population", type=int, default=100_000)
    ap.add_argument("--scaffold-clients", type=int, default=20_000)
    ap.add_argument("--budget-gib", type=float, default=24.0 * 0.9, help="SCAFFOLD's budget (90%% of 24 GiB)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    rows = []
    if "cohort" in args.only:
        rows += [run_child("cohort", a) for a in ("stacked", "streaming")]
    if "devices" in args.only:
        rows += [run_child("devices", str(d), devices=d) for d in (1, 2)]
    if "population" in args.only:
        rows.append(run_child("population", str(args.population)))
    if "scaffold" in args.only:
        rows.append(scaffold_capacity(args.budget_gib))
        rows.append(run_child("scaffold", str(args.scaffold_clients)))
    if "models" in args.only:
        rows += [run_child("models", name) for name in MODELS]
    if "remat" in args.only:
        rows += [run_child("remat", remat) for remat in ("off", "blocks")]
    for row in rows:
        print(json.dumps(row))
    import jax

    backend = jax.default_backend()
    stamp = datetime.date.today().strftime("%Y%m%d")
    path = Path(args.out) / f"scale-{backend}-{stamp}.json"
    path.write_text(json.dumps({"benchmark": "scale_memory", "command": " ".join(["python"] + sys.argv),
                                "machine": f"{platform.processor() or platform.machine()}, "
                                           f"{os.cpu_count()} cores",
                                "jax": jax.__version__, "rows": rows}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
