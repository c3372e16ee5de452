"""Why runs of FedImpro's tables diverge: each diverged run, rerun from its committed record's config round by
round until its model update blows up, and then, from some rounds before that, again with its method's term
changed and with half the client learning rate. FedImpro under Dirichlet(0.05): the shared features'
weight set to 0 (FedAvg from that round on). SCAFFOLD at its Table 5 rate: FedAvg from the same global
model, and the global control's deltas divided by all N clients (its paper's and NIID-Bench's form) instead
of the cohort's |S| (FedImpro's code's, the table's).

If the run blows up as run and stays finite with the term changed, from the same state, the term drives the
instability; if it blows up either way, the state was already lost; a NaN in a method's statistics with a
finite model would point to a bug in them. The rerun must be the recorded run: its test accuracy at each of
the record's evaluations is compared with the record's (the same CPU kind and core count give the same
floats; ``matches`` counts the agreements).

A round's update "blows up" when its norm (``update_norm``, the server's step) is not finite or exceeds
``FACTOR`` times the median of the rounds before it. The records are kept in
``benchmarks/results/fedimpro_divergence.json``; ``--report`` writes
``docs/reproductions/fedimpro_divergence.md`` and its figure from them.

Usage::

    taskset -c 0 python benchmarks/fedimpro_divergence.py --dataset fashion_mnist --seeds 0 1 2
    taskset -c 0 python benchmarks/fedimpro_divergence.py --method scaffold --setting a0.1_E1_M10 --seeds 1 2
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


def fedavg_keeping_the_server(config) -> list[str]:
    """FedAvg in place of ``config``'s method, with the fields every base method shares (the server
    optimiser, the weighting, the plug-ins) as recorded: only the method's own term goes."""
    from fedjax_lab.methods.registry import AlgorithmFields

    shared = config.algorithm.model_dump(mode="json", include=set(AlgorithmFields.model_fields))
    return [f"algorithm={json.dumps({**shared, 'name': 'fedavg'})}"]


def half_the_rate(config) -> list[str]:
    """``config``'s method as run, at half its client learning rate."""
    return [f"client.learning_rate={config.client.learning_rate / 2}"]


BRANCHES = {  # method -> branch name -> overrides of the recorded config (given it, validated)
    "fedimpro": {"as run": lambda config: [], "weight 0": lambda config: ["algorithm.weight=0.0"],
                 "half the rate": half_the_rate},
    "scaffold": {"as run": lambda config: [], "FedAvg from there": fedavg_keeping_the_server,
                 "control deltas over N": lambda config: ["algorithm.control_average=all"],
                 "half the rate": half_the_rate},
}
DEFAULT_SETTING = {"fedimpro": "a0.05_E1_M10", "scaffold": "a0.1_E1_M10"}


def blown_up(norms: list[float], factor: float = FACTOR) -> bool:
    """Whether the last of the update norms is not finite or exceeds ``factor`` times the median of those
    before it (with at least three before it)."""
    last = norms[-1]
    if not math.isfinite(last):
        return True
    return len(norms) > 3 and last > factor * float(np.median(norms[:-1]))


def build_config(raw: dict, overrides: list[str]):
    """The recorded config ``raw`` with ``overrides``, on the hand rules' layout (the table's), validated."""
    from fedjax_lab.experiments.config import apply_override, validate

    raw = copy.deepcopy(raw)
    for override in [*overrides, "rounds.layout=rules"]:
        apply_override(raw, override)
    return validate(raw)


def build(raw: dict, overrides: list[str]):
    """The experiment of the recorded config ``raw`` with ``overrides`` (:func:`build_config`)."""
    from fedjax_lab.experiments.build import build_experiment

    return build_experiment(build_config(raw, overrides))


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
    blowup = len(rows)  # the last round run: the blow-up's, or the run's last if it never blew up
    start = max(0, blowup - before)
    algorithm = experiment.config.algorithm
    branches = {}
    for name, overrides in BRANCHES[algorithm.name].items():
        branch = build(record.config, overrides(experiment.config))
        host = carried(states[start - blowup - 1], branch, algorithm.name)
        branches[name] = []
        for _ in range(after):
            host, row = step(branch, host, evaluate=True)
            branches[name].append(row)
    return {"rows": rows, "blowup_round": blowup, "blew_up": blown_up([r["update_norm"] for r in rows]),
            "weight_then": weight_then(algorithm, blowup),
            "branch_round": start, "branches": branches,
            "matches": matches, "compared": sum(1 for r in recorded if 0 < r <= blowup)}


def carried(host, experiment, method: str):
    """``host`` as ``experiment``'s start: itself where it runs ``method``; else the global model, the server
    optimiser's state and the round moved into ``experiment``'s own fresh state (its clients' and
    components' states fresh: the other method from there)."""
    if experiment.config.algorithm.name == method:
        return host
    import jax

    fresh = jax.device_get(experiment.initial_state())
    server = host.server_state
    server = fresh.server_state._replace(params=server.params, opt_state=server.opt_state)
    return fresh._replace(server_state=server, round=host.round)


def weight_then(algorithm, blowup: int) -> float | None:
    """FedImpro's feature weight in the blow-up round (``None`` for another method)."""
    if algorithm.name != "fedimpro":
        return None
    ramp = (blowup - 1) / algorithm.ramp_rounds if algorithm.weight_schedule == "ramp" else 1.0
    return algorithm.weight * ramp


def same_float(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def record_of(dataset: str, setting: str, method: str, seed: int):
    sys.path.insert(0, str(REPO / "benchmarks"))
    import records as record_files

    name = f"{dataset}/{setting}/{method}/seed{seed}"
    found = record_files.read(REPO / "benchmarks" / "results" / "records" / "fedimpro.jsonl.gz").get(name)
    if found is None:
        raise SystemExit(f"no committed record of {name}")
    return name, found


def run(dataset: str, setting: str, method: str, seeds, before: int, after: int) -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    import records as record_files

    from fedjax_lab.experiments.run_directory import write_atomically
    from fedjax_lab.experiments.runner import machine

    for seed in seeds:
        name, record = record_of(dataset, setting, method, seed)
        result = trace(record, before=before, after=after)
        with record_files.locked(RECORDS):  # another copy of this script may keep its records meanwhile
            kept = json.loads(RECORDS.read_text()) if RECORDS.is_file() else {}
            kept[name] = {"commit": record_files.code_commit(), "machine": machine(), "record_cpu":
                          [record.summary.get("cpu"), record.summary.get("cpu_threads")], **result}
            write_atomically(RECORDS, json.dumps(kept, indent=1) + "\n")
        print(f"{name}: {blowup_words(result)}, branched at {result['branch_round']}, "
              f"{result['matches']}/{result['compared']} evaluations as recorded", flush=True)


def blowup_words(kept: dict) -> str:
    """When the rerun blew up, or that it ran its rounds without (records before ``blew_up`` all blew up)."""
    if kept.get("blew_up", True):
        return f"blew up at round {kept['blowup_round']}"
    return f"did not blow up in its {kept['blowup_round']} rounds"


def branch_cell(rows: list[dict]) -> str:
    """A branch in words: blown up at its n-th round, or finite with its largest update and final accuracy."""
    norms = [r["update_norm"] for r in rows]
    for n in range(1, len(norms) + 1):
        if not math.isfinite(norms[n - 1]) or (n > 1 and blown_up(norms[:n])):
            return f"blows up in its round {n}"
    return f"finite; largest update {max(norms):.2f}, accuracy {100 * rows[-1]['test_accuracy']:.1f}"


TITLES = {"fedimpro": "FedImpro under Dirichlet(0.05)", "scaffold": "SCAFFOLD at its Table 5 rate"}


def table_lines(method: str, kept: dict) -> list[str]:
    """A method's table: one row a diverged run, a column a branch."""
    names = list(BRANCHES[method])
    weight = " (the features' weight)" if method == "fedimpro" else ""
    header = f"| run | blew up in round{weight} | rerun as recorded | branched after round | "
    lines = [f"## {TITLES[method]}", "", header + " | ".join(names) + " |",
             "|---|---|---|---|" + "---|" * len(names)]
    for name, k in sorted(kept.items()):
        rerun = f"{k['matches']} of {k['compared']} evaluations"
        if k["matches"] < k["compared"]:
            cpus = k["record_cpu"][0] or "not recorded", k["machine"]["cpu"]
            rerun += " (the record's CPU: {}; this rerun's: {})".format(*cpus)
        blowup = str(k["blowup_round"]) if k.get("blew_up", True) else blowup_words(k)
        blowup += f" ({k['weight_then']:.2f})" if weight else ""
        cells = [branch_cell(k["branches"][b]) for b in names]
        lines.append(f"| {name} | {blowup} | {rerun} | {k['branch_round']} | " + " | ".join(cells) + " |")
    return lines


def report(out: Path) -> None:
    """The page and its figure from the kept records: a table and a row of panels per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kept = json.loads(RECORDS.read_text())
    by_method = {m: {n: k for n, k in kept.items() if n.split("/")[2] == m} for m in BRANCHES}
    by_method = {m: runs for m, runs in by_method.items() if runs}
    title = ("# Divergence in FedImpro's tables (generated by "
             "`python benchmarks/fedimpro_divergence.py --report`)")
    lines = [title, "", __doc__.split("\n\n")[0].replace("\n", " ")]
    width = max(map(len, by_method.values()))
    fig, axes = plt.subplots(len(by_method), width, figsize=(4 * width, 3.2 * len(by_method)), squeeze=False)
    for row, (method, runs) in zip(axes, by_method.items()):
        lines += ["", *table_lines(method, runs)]
        for ax, (name, k) in zip(row, sorted(runs.items())):
            norms = [r["update_norm"] for r in k["rows"]]
            ax.semilogy(range(1, len(norms) + 1), norms, color="0.6", label="the rerun")
            for b in BRANCHES[method]:
                ys = [r["update_norm"] for r in k["branches"][b]]
                ax.semilogy(range(k["branch_round"] + 1, k["branch_round"] + 1 + len(ys)), ys, label=b)
            ax.set_title(name.replace(f"/{method}/", f", {method}, ").replace("/", ", "), fontsize=9)
            ax.set(xlabel="round", ylabel="update norm")
        row[0].legend(fontsize=8)
        for ax in row[len(runs):]:
            ax.set_axis_off()
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=80)
    lines += ["", f"![the update norm per round]({out.with_suffix('.png').name})", "",
              ("Each record names the commit and the CPU it ran on, and the CPU of the table's run it "
               "reran (`benchmarks/results/fedimpro_divergence.json`).")]
    out.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="fashion_mnist", choices=["fashion_mnist", "cifar10"])
    parser.add_argument("--method", default="fedimpro", choices=list(BRANCHES))
    parser.add_argument("--setting", help="default: a0.05_E1_M10 for FedImpro, a0.1_E1_M10 for SCAFFOLD")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--before", type=int, default=9, help="branch this many rounds before the blow-up")
    parser.add_argument("--after", type=int, default=12, help="rounds each branch runs")
    parser.add_argument("--report", action="store_true", help="only write the page from the kept records")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "reproductions",
                        help="the folder of the page")
    args = parser.parse_args(argv)
    if not args.report:
        run(args.dataset, args.setting or DEFAULT_SETTING[args.method], args.method, args.seeds,
            before=args.before, after=args.after)
    report(args.out / PAGE)


if __name__ == "__main__":
    main()
