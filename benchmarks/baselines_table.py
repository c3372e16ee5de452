"""Every baseline side by side on CIFAR-10 (NIID-Bench setting: 10 clients, all taking part each round,
Dirichlet label skew), over several seeds; writes ``docs/baselines_table.md`` and
``docs/baselines_curves.png``.

Scale (so that the whole table runs on a 2-core CPU): simple-CNN, batch 64, SGD lr 0.01 momentum 0.9, 10 local
steps per client and round, ``--rounds`` rounds (default 30). The centralised reference takes 100 steps a
round on the pooled data (the same examples per round as the 10 clients together). Paper-scale configs are in
``configs/``.

Usage::

    python benchmarks/baselines_table.py --seeds 0 1 2            # about 1 hour on 2 cores
    python benchmarks/baselines_table.py --seeds 0 --alphas 0.5   # a quick look

Finished runs are reused (an interrupted table continues where it stopped), also on a fresh clone: each
finished run's record goes to ``benchmarks/results/records/<runs' folder name>.jsonl.gz`` (``table_runs.py``),
which the table and the figure are read from; ``--rerun METHOD ...`` runs those methods again.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from records import Keep
from table_runs import Records, collect, finished, keep, metrics, records_of
from table_runs import summary as run_summary

from fedjax_lab.experiments import load_config, run_experiment

REPO = Path(__file__).resolve().parents[1]
KEEP = Keep()  # what the records keep: the table and the curves read the summary and the evaluated rows
METHODS = {
    "fedavg": [],
    "fedavgm": ["algorithm.name=fedavgm", "algorithm.server_optimizer=momentum_fedcog",
                "algorithm.server_momentum=0.1"],
    "fedadam": ["algorithm.server_learning_rate=0.01"],
    "fedprox": ["algorithm.mu=0.01"],
    "scaffold": [],
    "fednova": [],
    "feddyn": ["algorithm.alpha=0.01"],
    "moon": ["algorithm.mu=1.0", "algorithm.temperature=0.5"],
    "fedexp": [],
    "fedsam": ["algorithm.rho=0.05"],
    "feddecorr": ["algorithm.beta=0.1"],
    "centralized": ["client.local_steps=100"],
}


LABELS = {"fedavgm": "fedavgm (FedCOG's variant, `momentum_fedcog`, beta 0.1)", "moon": "moon (`mu` 1)"}
"""What a row is, where its name alone would mislead."""


def overrides(method: str, alpha: float, seed: int, rounds: int) -> list[str]:
    base = ["dataset.partition.num_clients=10", f"dataset.partition.alpha={alpha}",
            "rounds.clients_per_round=10", "client.local_epochs=null", "client.local_steps=10",
            f"rounds.num_rounds={rounds}", f"eval.every={max(rounds // 6, 1)}", f"seed={seed}"]
    name = "fedavgm" if method == "fedavgm" else method
    return base + [f"algorithm.name={name}"] + METHODS[method]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", nargs="+", default=list(METHODS))
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.1, 0.5])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--runs", default="runs/baselines")
    ap.add_argument("--rerun", nargs="*", default=[], help="methods to run again even if their runs finished")
    ap.add_argument("--out", default=str(REPO / "docs"))
    args = ap.parse_args(argv)
    results = {}
    runs = Path(args.runs)
    kept = collect(runs, KEEP)  # finished runs, also those made before records were kept
    for alpha in args.alphas:
        for method in args.methods:
            for seed in args.seeds:
                name = f"alpha{alpha}/{method}/seed{seed}"
                start = time.perf_counter()
                if not finished(kept / name) or method in args.rerun:  # else finished earlier: reuse
                    config = load_config(REPO / "configs" / "cifar10_fedavg.yaml",
                                         overrides(method, alpha, seed, args.rounds))
                    run_experiment(config, runs / name, overwrite=True, progress=False)
                    keep(runs / name, records_of(runs), name, KEEP)
                    kept = Records(records_of(runs))
                summary = run_summary(kept / name)
                results[(alpha, method, seed)] = (summary, metrics(kept / name))
                print(f"alpha {alpha} {method:<12} seed {seed}: final "
                      f"{summary['final']['test_accuracy']:.4f} best {summary['best_test_accuracy']:.4f} "
                      f"diverged={summary['diverged']} ({time.perf_counter() - start:.0f} s)", flush=True)
    write_table(results, args)
    plot_curves(results, args)


def write_table(results, args) -> None:
    lines = ["| method | " + " | ".join(f"Dir({a}) final | Dir({a}) best" for a in args.alphas) + " |",
             "|---|" + "---:|---:|" * len(args.alphas)]
    for method in args.methods:
        cells = []
        for alpha in args.alphas:
            finals = [results[(alpha, method, s)][0]["final"]["test_accuracy"] for s in args.seeds]
            bests = [results[(alpha, method, s)][0]["best_test_accuracy"] for s in args.seeds]
            cells += [f"{100 * np.mean(finals):.1f} ± {100 * np.std(finals, ddof=1):.1f}",
                      f"{100 * np.mean(bests):.1f} ± {100 * np.std(bests, ddof=1):.1f}"]
        lines.append(f"| {LABELS.get(method, method)} | " + " | ".join(cells) + " |")
    text = (f"Test accuracy (%) after {args.rounds} rounds, mean ± sample std (ddof 1) over seeds "
            f"{args.seeds}; "
            "`python benchmarks/baselines_table.py "
            + " ".join(f"--{k} {' '.join(map(str, v)) if isinstance(v, list) else v}"
                       for k, v in (("seeds", args.seeds), ("alphas", args.alphas), ("rounds", args.rounds)))
            + "`\n\n")
    Path(args.out, "baselines_table.md").write_text(text + "\n".join(lines) + "\n")
    Path(args.runs, "table.json").write_text(json.dumps(
        {f"{a}/{m}/{s}": r[0] for (a, m, s), r in results.items()}, indent=1, default=str))
    print(text + "\n".join(lines))


def plot_curves(results, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.alphas), figsize=(6 * len(args.alphas), 4), squeeze=False)
    for ax, alpha in zip(axes[0], args.alphas):
        for method in args.methods:
            runs = [[(r["round"], r["test_accuracy"]) for r in results[(alpha, method, s)][1]
                     if "test_accuracy" in r]
                    for s in args.seeds]
            rounds = [x for x, _ in runs[0]]
            mean = np.mean([[y for _, y in run[:len(rounds)]] for run in runs], 0)
            ax.plot(rounds, mean, label=method, linestyle="--" if method == "centralized" else "-")
        ax.set_title(f"CIFAR-10, 10 clients, Dirichlet({alpha})")
        ax.set_xlabel("round")
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(Path(args.out, "baselines_curves.png"), dpi=110)


if __name__ == "__main__":
    main()
