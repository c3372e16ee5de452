"""A sweep as one program vs the same runs one after another: FedAvg, MNIST MLP, N seeds.

Workload (the FedAvg paper's 2NN, as ``fedavg_mlp_throughput.py``): MNIST, 784-200-200-10 MLP, 1000 IID
clients of 60 examples, 10 clients per round, client SGD (lr 0.05) for 50 local steps of batch 10, FedAvg
server. Each member trains ``5,000`` examples a round.

Ways, each in a fresh subprocess (clean peak RSS):

* ``sequential``: ``build_experiment`` and ``run_rounds`` for each seed in turn, as separate runs do (each
  compiles its own program); the default cohort layout of a single run.
* ``program chunk=C cohort=K``: ``fedjax_lab.experiments.sweep.build_sweep_program``: all seeds in one
  program, ``C`` members vmapped at a time, the cohort ``K`` clients at a time.

Reported: steady examples/s over all members (median of ``--reps`` timed calls after a warm-up call), compile
time (the first call, summed over the runs for ``sequential``), peak RSS. A benchmark, not a test.

Usage::

    python benchmarks/sweep_throughput.py --seeds 8 --rounds 5     # about 5 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RAW = {
    "dataset": {"name": "mnist", "partition": {"name": "iid", "num_clients": 1000}},
    "model": {"name": "mlp", "hidden": [200, 200]},
    "algorithm": {"name": "fedavg"},
    "client": {"optimizer": "sgd", "learning_rate": 0.05, "batch_size": 10, "local_steps": 50},
    "rounds": {"num_rounds": 1000, "clients_per_round": 10},
    "eval": {"every": 1000, "per_client": False},
}
EXAMPLES_PER_ROUND = 10 * 50 * 10


def _time(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def worker(way: str, seeds: int, rounds: int, reps: int) -> dict:
    import jax

    from fedjax_lab.experiments import build_experiment, validate
    from fedjax_lab.experiments.sweep import build_sweep_program, expand

    config = validate(RAW)
    members = expand(config, {"seed": list(range(seeds))})
    if way == "sequential":
        compile_s, steady = 0.0, []
        for member in members:
            experiment = build_experiment(member.config)
            state = experiment.initial_state()
            start = time.perf_counter()
            state, _ = experiment.run_rounds(state, experiment.inputs, num_rounds=rounds)
            jax.block_until_ready(state)
            compile_s += time.perf_counter() - start

            box = {"state": state}

            def call(experiment=experiment, box=box):  # run_rounds donates the state it is given
                box["state"], _ = jax.block_until_ready(experiment.run_rounds(box["state"], experiment.inputs,
                                                                              num_rounds=rounds))

            steady.append(_time(call, reps))
        seconds = [sum(run[i] for run in steady) for i in range(reps)]
    else:
        chunk, cohort = (int(part.split("=")[1]) for part in way.split()[1:])
        program = build_sweep_program(members, chunk, cohort)
        states = program.initial_states()
        start = time.perf_counter()
        jax.block_until_ready(program.run(states, rounds))
        compile_s = time.perf_counter() - start
        seconds = _time(lambda: jax.block_until_ready(program.run(states, rounds)), reps)
    median = sorted(seconds)[len(seconds) // 2]
    return {"way": way, "examples_per_s": seeds * rounds * EXAMPLES_PER_ROUND / median, "seconds": seconds,
            "compile_s": compile_s, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5, help="rounds per timed call")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ways", nargs="+", default=["sequential", "program chunk=8 cohort=1",
                                                  "program chunk=8 cohort=2", "program chunk=8 cohort=5",
                                                  "program chunk=8 cohort=10", "program chunk=4 cohort=1",
                                                  "program chunk=2 cohort=1", "program chunk=1 cohort=2"])
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.seeds, args.rounds, args.reps)))
        return
    import platform

    import jax

    results = []
    for way in args.ways:
        out = subprocess.run([sys.executable, __file__, "--worker", way, "--seeds", str(args.seeds),
                              "--rounds", str(args.rounds), "--reps", str(args.reps)], capture_output=True,
                             text=True, check=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = results[-1]
        print(f"{way:<28} {r['examples_per_s']:>9,.0f} ex/s  compile {r['compile_s']:5.1f} s  "
              f"peak RSS {r['peak_rss_mb']:,.0f} MB", flush=True)
    base = results[0]["examples_per_s"] if results[0]["way"] == "sequential" else None
    if base:
        for r in results[1:]:
            print(f"{r['way']:<28} {r['examples_per_s'] / base:.2f}x sequential")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / f"sweep-{jax.default_backend()}-{time.strftime('%Y%m%d')}.json"
    path.write_text(json.dumps({"machine": platform.processor() or platform.machine(), "seeds": args.seeds,
                                "rounds": args.rounds, "results": results}, indent=1))
    print(f"saved {path}")


if __name__ == "__main__":
    main()
