"""Why FedImpro's table runs diverge under Dirichlet(0.05): each diverged run, rerun from its committed
record's config round by round until its model update blows up, and then, from some rounds before that,
again with the shared features' weight set to 0 (FedAvg from that round on) and with half the client
learning rate.

If the run blows up with FedImpro's term on and stays finite with it off, from the same state, the term
drives the instability; if it blows up either way, the state was already lost; a NaN in FedImpro's
statistics with a finite model would point to a bug in them. The rerun must be the recorded run: its test
accuracy at each of the record's evaluations is compared with the record's (the same CPU kind and core count
give the same floats; ``matches`` counts the agreements).

A round's update "blows up" when its norm (``update_norm``, the server's step) is not finite or exceeds
``FACTOR`` times the median of the rounds before it. The records are kept in
``benchmarks/results/fedimpro_divergence.json``; ``--report`` writes
``docs/reproductions/fedimpro_divergence.md`` and its figure from them.

Usage::

    taskset -c 0 python benchmarks/fedimpro_divergence.py --dataset fashion_mnist --seeds 0 1 2
    python benchmarks/fedimpro_divergence.py --report
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
RECORDS = REPO / "benchmarks" / "results" / "fedimpro_divergence.json"
PAGE = "fedimpro_divergence.md"
FACTOR = 10.0
BRANCHES = {  # name -> overrides of the recorded config, given the client learning rate
    "as run": lambda lr: [],
    "weight 0": lambda lr: ["algorithm.weight=0.0"],
    "half the rate": lambda lr: [f"client.learning_rate={lr / 2}"],
}


def blown_up(norms: list[float], factor: float = FACTOR) -> bool:
    """Whether the last of the update norms is not finite or exceeds ``factor`` times the median of those
    before it (with at least three before it)."""
    last = norms[-1]
    if not math.isfinite(last):
        return True
    return len(norms) > 3 and last > factor * float(np.median(norms[:-1]))


def build(raw: dict, overrides: list[str]):
    """The experiment of the recorded config ``raw`` with ``overrides``, on the hand rules' layout (the
    table's)."""
    from fedjax_lab.experiments.build import build_experiment
    from fedjax_lab.experiments.config import apply_override, validate

    raw = copy.deepcopy(raw)
    for override in [*overrides, "rounds.layout=rules"]:
        apply_override(raw, override)
    return build_experiment(validate(raw))


def step(experiment, host_state, evaluate: bool):
    """One round from a host copy of the loop state: the next host state, its update norm and training loss,
    and the test accuracy after it (when ``evaluate``)."""
    import jax

    state, metrics = experiment.run_rounds(jax.device_put(host_state), experiment.inputs, num_rounds=1)
    row = {"update_norm": float(np.asarray(metrics["update_norm"])[-1]),
           "train_loss": float(np.asarray(metrics["train_loss"])[-1])}
    if evaluate:
        params = experiment.algorithm.evaluated_params(state.server_state)
        row["test_accuracy"] = float(experiment.evaluate_params(params)["test_accuracy"])
    return jax.device_get(state), row


def trace(record, before: int, after: int) -> dict:
    """The rerun of ``record`` to its blow-up round, and the branches from ``before`` rounds earlier for
    ``after`` rounds (see the module docstring)."""
    import jax

    experiment = build(record.config, [])
    recorded = {row["round"]: row["test_accuracy"] for row in record.evaluations()}
    states, rows = [jax.device_get(experiment.initial_state())], []
    matches = 0
    while not rows or not blown_up([r["update_norm"] for r in rows]):
        if len(rows) == experiment.config.rounds.num_rounds:
            break
        state, row = step(experiment, states[-1], evaluate=len(rows) + 1 in recorded)
        states, rows = states[-before - 1:] + [state], rows + [row]
        if "test_accuracy" in row:
            matches += same_float(row["test_accuracy"], recorded[len(rows)])
    blowup = len(rows)
    start = max(0, blowup - before)
    lr = experiment.config.client.learning_rate
    branches = {}
    for name, overrides in BRANCHES.items():
        branch, host = build(record.config, overrides(lr)), states[start - blowup - 1]
        branches[name] = []
        for _ in range(after):
            host, row = step(branch, host, evaluate=True)
            branches[name].append(row)
    algorithm = experiment.config.algorithm
    ramp = (blowup - 1) / algorithm.ramp_rounds if algorithm.weight_schedule == "ramp" else 1.0
    return {"rows": rows, "blowup_round": blowup, "weight_then": algorithm.weight * ramp,
            "branch_round": start, "branches": branches,
            "matches": matches, "compared": sum(1 for r in recorded if 0 < r <= blowup)}


def same_float(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def record_of(dataset: str, setting: str, seed: int):
    sys.path.insert(0, str(REPO / "benchmarks"))
    import records as record_files

    name = f"{dataset}/{setting}/fedimpro/seed{seed}"
    found = record_files.read(REPO / "benchmarks" / "results" / "records" / "fedimpro.jsonl.gz").get(name)
    if found is None:
        raise SystemExit(f"no committed record of {name}")
    return name, found


def run(dataset: str, setting: str, seeds, before: int, after: int) -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    import records as record_files

    from fedjax_lab.experiments.runner import machine

    kept = json.loads(RECORDS.read_text()) if RECORDS.is_file() else {}
    for seed in seeds:
        name, record = record_of(dataset, setting, seed)
        result = trace(record, before=before, after=after)
        kept[name] = {"commit": record_files.code_commit(), "machine": machine(), "record_cpu":
                      [record.summary.get("cpu"), record.summary.get("cpu_threads")], **result}
        RECORDS.write_text(json.dumps(kept, indent=1) + "\n")
        print(f"{name}: blew up at round {result['blowup_round']}, branched at {result['branch_round']}, "
              f"{result['matches']}/{result['compared']} evaluations as recorded", flush=True)


def branch_cell(rows: list[dict]) -> str:
    """A branch in words: blown up at its n-th round, or finite with its largest update and final accuracy."""
    norms = [r["update_norm"] for r in rows]
    for n in range(1, len(norms) + 1):
        if not math.isfinite(norms[n - 1]) or (n > 1 and blown_up(norms[:n])):
            return f"blows up in its round {n}"
    return f"finite; largest update {max(norms):.2f}, accuracy {100 * rows[-1]['test_accuracy']:.1f}"


def report(out: Path) -> None:
    """The page and its figure from the kept records."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kept = json.loads(RECORDS.read_text())
    title = ("# FedImpro's divergence under Dirichlet(0.05) (generated by "
             "`python benchmarks/fedimpro_divergence.py --report`)")
    header = "| run | blew up in round (the features' weight) | rerun as recorded | branched after round | "
    lines = [title, "", __doc__.split("\n\n")[0].replace("\n", " "), "",
             header + " | ".join(BRANCHES) + " |", "|---|---|---|---|" + "---|" * len(BRANCHES)]
    fig, axes = plt.subplots(1, len(kept), figsize=(4 * len(kept), 3.2), squeeze=False)
    for ax, (name, k) in zip(axes[0], sorted(kept.items())):
        cells = [branch_cell(k["branches"][b]) for b in BRANCHES]
        rerun = f"{k['matches']} of {k['compared']} evaluations"
        if k["matches"] < k["compared"]:
            cpus = k["record_cpu"][0] or "not recorded", k["machine"]["cpu"]
            rerun += " (the record's CPU: {}; this rerun's: {})".format(*cpus)
        lines.append(f"| {name} | {k['blowup_round']} ({k['weight_then']:.2f}) | {rerun} | "
                     f"{k['branch_round']} | " + " | ".join(cells) + " |")
        norms = [r["update_norm"] for r in k["rows"]]
        ax.semilogy(range(1, len(norms) + 1), norms, color="0.6", label="the rerun")
        for b in BRANCHES:
            ys = [r["update_norm"] for r in k["branches"][b]]
            ax.semilogy(range(k["branch_round"] + 1, k["branch_round"] + 1 + len(ys)), ys, label=b)
        ax.set(title=name.replace("/fedimpro/", ", "), xlabel="round", ylabel="update norm")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=80)
    lines += ["", f"![the update norm per round]({out.with_suffix('.png').name})", "",
              ("Each record names the commit and the CPU it ran on, and the CPU of the table's run it "
               "reran (`benchmarks/results/fedimpro_divergence.json`).")]
    out.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="fashion_mnist", choices=["fashion_mnist", "cifar10"])
    parser.add_argument("--setting", default="a0.05_E1_M10")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--before", type=int, default=9, help="branch this many rounds before the blow-up")
    parser.add_argument("--after", type=int, default=12, help="rounds each branch runs")
    parser.add_argument("--report", action="store_true", help="only write the page from the kept records")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "reproductions",
                        help="the folder of the page")
    args = parser.parse_args(argv)
    if not args.report:
        run(args.dataset, args.setting, args.seeds, before=args.before, after=args.after)
    report(args.out / PAGE)


if __name__ == "__main__":
    main()
