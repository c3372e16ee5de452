"""BHerd's experiments (Luo et al. 2024, Fig. 2-4) at a scale that runs on a 2-core CPU.

Parts:

* ``svm``: squared-hinge SVM on MNIST even/odd at the paper's scale (60,000 rows, 5 clients, E = 1, B = 100,
  tau = 101-176, 500 rounds), cases 1-3: centralised SGD, FedAvg, FedAvg with the fixed order, GraB-FedAvg,
  BHerd (alpha 0.5), FedNova, SCAFFOLD, BHerd-FedNova and BHerd-SCAFFOLD (Fig. 2a-b).
* ``svm_lr``: the same at a learning rate of 0.001 (the paper's value is unreadable: "1 x 10^?"; at 0.01 every
  method reaches the SVM's optimum within about 10 rounds in case 1).
* ``alpha``: BHerd's alpha sweep {0.1, 0.3, 0.5, 0.7, 1.0} on the SVM, cases 1-3 (Fig. 3a).
* ``cnn``: the reference CNN on MNIST (10 classes) at a reduced scale: the first 1,000 training rows, B = 5 so
  that tau = 40 (the paper's order of magnitude is 100), 40 rounds, cases 1-3, the same methods (Fig. 2a-b,
  second row).
* ``cifar``: the reference CNN on CIFAR-10, case 3 only, the same reduced scale (Fig. 2a third row).

Baselines reshuffle their batches every round (the paper: "with RR"); BHerd, GraB and the BHerd combinations
keep one order per client (non-RR). Every run evaluates the global model on all training rows (the paper's
loss) and on the test set. Writes ``docs/reproductions/bherd_results.md`` and its figures after every part,
reusing finished runs; several copies of the script share the work (``--reverse``). The tables and claims
cover every seed that ran (``report_seeds``): more seeds where a claim stays unresolved.

Usage::

    python benchmarks/bherd_table.py --parts svm alpha          # about 40 min on 2 cores
    python benchmarks/bherd_table.py --parts cnn cifar --seeds 0 1
    python benchmarks/bherd_table.py --parts cnn_full --cases 3 --methods fedavg bherd  # all of MNIST, case 3
    python benchmarks/bherd_table.py --report                   # tables and figures from finished runs only
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import sys
from pathlib import Path

import numpy as np
from records import Keep
from table_runs import (
    CLAIMS_RULE,
    Claim,
    Decisive,
    SeedValues,
    arrays,
    claims_table,
    collect,
    evaluations,
    failure,
    failure_counts,
    finished,
    has_runs,
    plot_bands,
    run_once,
    run_script,
    seed_curves,
    seed_values,
    seeds_on_disk,
    sizes,
    summary,
    write_report,
)
from table_runs import config as run_config

from fedjax_lab.experiments import load_config

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs" / "bherd"
RR, FIXED = "client.batch_order=reshuffle", "client.batch_order=fixed"
METHODS = {
    "centralized": ["algorithm={name: centralized}", RR],
    "fedavg": ["algorithm={name: fedavg}", RR],
    "fedavg_fixed": ["algorithm={name: fedavg}", FIXED],
    "grab": ["algorithm={name: grab}", FIXED],
    "bherd": ["algorithm={name: bherd, alpha: 0.5}", FIXED],
    "bherd_rr": ["algorithm={name: bherd, alpha: 0.5}", RR],
    "fednova": ["algorithm={name: fednova}", RR],
    "scaffold": ["algorithm={name: scaffold}", RR],
    "bherd_fednova": ["algorithm={name: fednova, plugins: [{name: bherd, alpha: 0.5}]}", FIXED],
    "bherd_scaffold": ["algorithm={name: scaffold, plugins: [{name: bherd, alpha: 0.5}]}", FIXED],
}
LABELS = {"centralized": "Centralised SGD", "fedavg": "FedAvg (RR)", "fedavg_fixed": "FedAvg (fixed order)",
          "grab": "GraB-FedAvg", "bherd": "BHerd-FedAvg (alpha 0.5)",
          "bherd_rr": "BHerd-FedAvg, reshuffled (Fig. 4e)", "fednova": "FedNova (RR)",
          "scaffold": "SCAFFOLD (RR)", "bherd_fednova": "BHerd-FedNova", "bherd_scaffold": "BHerd-SCAFFOLD"}
ALPHAS = (0.1, 0.3, 0.5, 0.7, 1.0)
SCALED = ["dataset.subset=1000", "client.batch_size=5", "rounds.num_rounds=40", "eval.every=5"]
# The largest CNN run a 2-core CPU affords with 3 seeds (about 15 min a run on one core): a tenth of MNIST's
# rows at B = 25 (tau = 40 to 60 steps a round; the paper's B = 100 on all rows gives 101 to 176), for 150
# rounds (the paper: 500), case 3 only. B = 10 (tau near the paper's) measured 4x slower a row on this CPU.
TENTH = ["dataset.subset=6000", "client.batch_size=25", "rounds.num_rounds=150", "eval.every=10"]
# The CNN at the paper's federation and local work: all 60,000 rows, B = 100 (tau = 101 to 176), for 150 of
# its 500 rounds (30 % of its client work): about 50 s a round on one core of the Intel VM since 2026-12-01
# (docs/benchmarks.md: it was 4 minutes a BHerd round), two hours a run.
FULL = ["rounds.num_rounds=150", "eval.every=10", "checkpoint.every_blocks=1"]
PARTS = {  # part: (config, cases, extra overrides)
    "svm": ("svm_mnist.yaml", (1, 2, 3), []),
    "svm_lr": ("svm_mnist.yaml", (1, 2, 3), ["client.learning_rate=0.001"]),
    "cnn": ("cnn_mnist.yaml", (1, 2, 3), SCALED),
    "cnn10": ("cnn_mnist.yaml", (3,), TENTH),
    "cnn_full": ("cnn_mnist.yaml", (1, 2, 3), FULL),
    "cifar": ("cnn_cifar10.yaml", (3,), SCALED),
}


EXCLUSION_ROUNDS = 20  # the selection counts of the "never sent" table are over a run's last 20 rounds
SELECTION_MAPS = r"svm/case\d/bherd/seed0"  # the runs whose selection maps and distances the figure draws


def kept_arrays(name: str, found: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Of a BHerd run's array metrics, what the report reads: the selection maps and client ids of the last
    ``EXCLUSION_ROUNDS`` rounds, and of the figure's runs (``SELECTION_MAPS``) every round's and the
    distances."""
    if "bherd_selected" not in found:
        return {}
    if re.fullmatch(SELECTION_MAPS, name):
        return {k: found[k] for k in ("round", "bherd_client_ids", "bherd_selected", "bherd_distance")}
    return {k: found[k][-EXCLUSION_ROUNDS:] for k in ("round", "bherd_client_ids", "bherd_selected")}


# What the records keep: of each evaluated row the training objective and test accuracy (what the reports
# read; an SVM run evaluates every one of its 500 rounds), the selection arrays above and each client's number
# of rows (its steps a round).
KEEP = Keep(arrays=kept_arrays, sizes=True, evaluated=("full_train_loss",))
TABLE_SEEDS = (0, 1, 2)
"""The seeds a case of the CNN on all of MNIST needs before it replaces the tenth of MNIST
(:func:`decisive_cnn`). More seeds, where a claim stays unresolved, join the tables and the claims where they
ran."""


def report_seeds(runs, asked=()) -> list[int]:
    """The seeds the tables and claims cover: every seed with a finished run under ``runs`` (a folder of run
    directories, or records as ``collect`` returns them) and those ``asked``, ``TABLE_SEEDS`` at least. Each
    claim pairs the seeds both of its arms ran; each table row says how many it averages."""
    return sorted(set(seeds_on_disk(runs, list(TABLE_SEEDS))) | set(TABLE_SEEDS) | set(asked))


def run(runs: Path, name: str, config_file: str, overrides: list[str]) -> None:
    """Runs one experiment unless it has finished or another copy of this script claimed it."""
    done = run_once(runs, name, load_config(CONFIGS / config_file, overrides), KEEP)
    if done:
        found, seconds = done
        print(f"{name:<45} test acc {found['final']['test_accuracy']:.4f} "
              f"train loss {found['final'].get('full_train_loss', float('nan')):.4f} ({seconds:.0f} s)",
              flush=True)


def jobs(part: str, seeds, methods, cases=None):
    """The runs of ``part``: (name, config file, overrides) for each case, seed and method, case by case.

    ``cases`` keeps some of the part's partition cases (all of them by default), e.g. ``cnn_full``'s case 3,
    the one the paper discusses, alone."""
    if part == "alpha":
        for case in cases or (1, 2, 3):
            for seed in seeds:
                for alpha in ALPHAS:
                    overrides = [f"dataset.partition.case={case}", f"seed={seed}",
                                 f"algorithm={{name: bherd, alpha: {alpha}}}", FIXED]
                    name = (f"svm/case{case}/bherd/seed{seed}" if alpha == 0.5
                            else f"alpha/case{case}/a{alpha}/seed{seed}")
                    yield name, "svm_mnist.yaml", overrides
        return
    config, part_cases, extra = PARTS[part]
    for case in (c for c in part_cases if not cases or c in cases):
        for seed in seeds:
            for method in methods:
                yield (f"{part}/case{case}/{method}/seed{seed}", config,
                       [f"dataset.partition.case={case}", f"seed={seed}", *METHODS[method], *extra])


# ----------------------------------------------------------------------------------------------- the report
def run_name(part: str, case: int, method: str) -> str:
    """A method of ``part`` and ``case``, or a run path pattern with ``{case}`` (the alpha sweep's)."""
    return method.format(case=case) if "{case}" in method else f"{part}/case{case}/{method}"


def label(method: str) -> str:
    if method in LABELS:
        return LABELS[method]
    if "/a" in method:
        return "BHerd alpha " + method.rsplit("/a", 1)[1]
    return {"bherd": "BHerd alpha 0.5", "fedavg": "FedAvg (RR)"}[method.rsplit("/", 1)[1]]


def curves(runs: Path, prefix: str, seeds) -> dict[int, tuple[np.ndarray, dict[str, np.ndarray]]]:
    """Per seed that has finished: rounds and metric arrays of the evaluated rounds."""
    out = {}
    for seed in seeds:
        rows = evaluations(runs / f"{prefix}/seed{seed}")
        if rows is None:
            continue
        out[seed] = (np.array([r["round"] for r in rows]),
                     {k: np.array([r.get(k, np.nan) for r in rows])
                      for k in ("full_train_loss", "test_accuracy")})
    return out


def rounds_to(rounds: np.ndarray, values: np.ndarray, target: float, below: bool) -> float:
    """The first evaluated round whose value reaches ``target`` (``nan`` if never)."""
    hit = values <= target if below else values >= target
    return float(rounds[np.argmax(hit)]) if hit.any() else np.nan


def fmt(values, scale=1.0, digits=4) -> str:
    values = np.asarray([v for v in values if not math.isnan(v)], float) * scale
    if not len(values):
        return "-"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{values.mean():.{digits}f} ± {values.std(ddof=1):.{digits}f}"


def fmt_rounds(values, total: int) -> str:
    reached = [v for v in values if not math.isnan(v)]
    if not values:
        return "-"
    text = f"{np.mean(reached):.0f}" if reached else f"> {total}"
    return text + (f" ({len(reached)}/{len(values)} seeds)" if len(reached) < len(values) else "")


LOSS_SLACK, ACC_FRACTION = 0.05, 0.99


def seeds_cell(runs: Path, name: str, seeds) -> str:
    """How many seeds a row averages, and how many of their runs failed (``table_runs.failure``): "3 (1
    diverged)"."""
    notes = failure_counts(failure(summary(runs / f"{name}/seed{seed}")) for seed in seeds)
    return f"{len(seeds)}" + (f" ({'; '.join(notes)})" if notes else "")


def case_table(runs: Path, part: str, case: int, seeds, methods, checkpoints) -> list[str]:
    """One case: per method, the training objective at a few rounds, the final test accuracy, and the rounds
    to reach two targets set by FedAvg (seed means): 95% of its decrease of the training objective from round
    0 to its last round, and 99% of its final test accuracy."""
    base = curves(runs, f"{part}/case{case}/fedavg", seeds)
    if not base:
        return [f"(case {case}: FedAvg has not finished yet)"]
    total = int(max(r[-1] for r, _ in base.values()))
    start = float(np.mean([m["full_train_loss"][0] for _, m in base.values()]))
    final = float(np.mean([m["full_train_loss"][-1] for _, m in base.values()]))
    loss_target = final + LOSS_SLACK * (start - final)
    acc_target = ACC_FRACTION * float(np.mean([m["test_accuracy"][-1] for _, m in base.values()]))
    head = ("| method | " + " | ".join(f"train loss @{c}" for c in checkpoints) +
            f" | test acc @{total} (%) | rounds to loss {loss_target:.4f} | rounds to acc "
            f"{100 * acc_target:.2f}% | seeds |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for method in methods:
        got = curves(runs, run_name(part, case, method), seeds)
        if not got:
            continue
        at = [[m["full_train_loss"][np.searchsorted(r, c)] if c <= r[-1] else np.nan for r, m in got.values()]
              for c in checkpoints]
        to_loss = [rounds_to(r, m["full_train_loss"], loss_target, True) for r, m in got.values()]
        to_acc = [rounds_to(r, m["test_accuracy"], acc_target, False) for r, m in got.values()]
        lines.append(f"| {label(method)} | " + " | ".join(fmt(a) for a in at) +
                     f" | {fmt([m['test_accuracy'][-1] for _, m in got.values()], 100, 2)} | "
                     f"{fmt_rounds(to_loss, total)} | {fmt_rounds(to_acc, total)} | "
                     f"{seeds_cell(runs, run_name(part, case, method), got)} |")
    return lines


def plot_cases(runs: Path, part: str, cases, seeds, methods, out: Path) -> bool:
    """Fig. 2-style curves: training objective and test accuracy against rounds, one column per case with
    runs (seed means). Returns whether any of ``methods`` had runs to draw; with none, nothing is written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = {(case, method): curves(runs, run_name(part, case, method), seeds)
             for case in cases for method in methods}
    cases = [case for case in cases if any(found[case, method] for method in methods)]
    if not cases:
        return False
    fig, axes = plt.subplots(2, len(cases), figsize=(4.6 * len(cases), 6.4), squeeze=False)
    for j, case in enumerate(cases):
        for method in methods:
            got = found[case, method]
            if not got:
                continue
            length = min(len(r) for r, _ in got.values())
            rounds = next(iter(got.values()))[0][:length]
            for i, key in enumerate(("full_train_loss", "test_accuracy")):
                axes[i, j].plot(rounds, np.mean([m[key][:length] for _, m in got.values()], 0),
                                label=label(method), lw=1.2, color=f"C{list(methods).index(method)}")
        axes[0, j].set_title(f"case {case}: training objective")
        axes[0, j].set_yscale("log")
        axes[1, j].set_title(f"case {case}: test accuracy")
        for ax in axes[:, j]:
            ax.set_xlabel("round")
            ax.grid(alpha=0.3)
    drawn = {}  # one legend for every method drawn in any case, each in its colour in every case
    for ax in axes[0]:
        drawn.update(zip(*reversed(ax.get_legend_handles_labels())))
    axes[0, 0].legend(drawn.values(), drawn.keys(), fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return True


def exclusion(run_dir: Path, last: int = EXCLUSION_ROUNDS) -> tuple[float, float] | None:
    """Over the last ``last`` rounds of a BHerd run, the fractions of the clients' steps whose batch was never
    sent and always sent (a fixed batch order puts the same batch at the same step every round); ``None``
    without selection maps."""
    if (rows := sizes(run_dir)) is None or "bherd_selected" not in (kept := arrays(run_dir)):
        return None
    ids, selected = kept["bherd_client_ids"][-last:], kept["bherd_selected"][-last:]
    counts = np.zeros((ids.max() + 1, selected.shape[-1]))
    np.add.at(counts, ids, selected)
    batch = run_config(run_dir)["client"]["batch_size"]
    tau = np.array([max(n // batch, 1) for n in rows])  # E = 1, remainders dropped
    valid = np.arange(selected.shape[-1])[None, :] < tau[:, None]
    return (float(((counts == 0) & valid).sum() / valid.sum()),
            float(((counts == last) & valid).sum() / valid.sum()))


def plot_selection(runs: Path, out: Path) -> None:
    """Fig. 4a-d: for each case, client 0's and the last client's selected step indices over rounds (heat
    maps) and every client's distance between the selected and the full mean gradient."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 3, figsize=(14, 9.5))
    for i, case in enumerate((1, 2, 3)):
        run_dir = runs / f"svm/case{case}/bherd/seed0"
        if not finished(run_dir):
            continue
        kept = arrays(run_dir)
        ids, selected, distance = kept["bherd_client_ids"], kept["bherd_selected"], kept["bherd_distance"]
        for j, client in enumerate((0, ids.shape[1] - 1)):
            position = np.argmax(ids == client, axis=1)
            mask = selected[np.arange(len(ids)), position]
            axes[i, j].imshow(mask.T, aspect="auto", origin="lower", cmap="Greys", interpolation="nearest")
            axes[i, j].set_title(f"case {case}, client {client + 1}: selected steps")
            axes[i, j].set_xlabel("round")
            axes[i, j].set_ylabel("local step")
        for client in range(ids.shape[1]):
            position = np.argmax(ids == client, axis=1)
            axes[i, 2].plot(kept["round"], distance[np.arange(len(ids)), position], lw=0.8,
                            label=f"client {client + 1}")
        axes[i, 2].set_yscale("log")
        axes[i, 2].set_title(f"case {case}: ||selected mean - full mean|| (gradient)")
        axes[i, 2].set_xlabel("round")
        axes[i, 2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


SECTIONS = [  # part, title, cases, the rounds its tables show (the first: where "faster" is judged)
    ("svm", "SVM on MNIST even/odd, paper scale (500 rounds)", (1, 2, 3), (10, 50, 100, 500)),
    ("svm_lr", "SVM on MNIST even/odd, paper scale, learning rate 0.001", (1, 2, 3), (10, 50, 100, 500)),
    ("cnn_full", "CNN on all of MNIST, B = 100, 150 rounds (the paper: 500)", (1, 2, 3), (20, 50, 100, 150)),
    ("cnn10", "CNN on MNIST, 6,000 training rows (10 %), B = 25, 150 rounds", (3,), (20, 50, 100, 150)),
    ("cnn", "CNN on MNIST, 1,000 training rows, B = 5, 40 rounds", (1, 2, 3), (10, 20, 40)),
    ("cifar", "CNN on CIFAR-10, 1,000 training rows, B = 5, 40 rounds", (3,), (10, 20, 40)),
]


def value_at(run, key: str, at: int | None) -> float | None:
    """A finished run's ``key`` at the evaluated round ``at`` (None: its last evaluation); None if it has not
    finished or never evaluated that round."""
    rows = evaluations(run)
    if not rows:
        return None
    if at is None:
        return rows[-1].get(key)
    return next((r.get(key) for r in rows if r["round"] == at), None)


def by_seed(runs, name: str, seeds, key: str, at: int | None = None, sign: float = 1.0) -> SeedValues:
    """``sign`` times ``key`` at round ``at`` of each seed's finished run of ``name``; NaN where it
    diverged."""
    def value(run) -> float | None:
        got = value_at(run, key, at)
        return None if got is None else sign * float(got) if math.isfinite(got) else math.nan

    return seed_values(runs, name, seeds, value)


# the early rounds "faster" is judged over
EARLY = {"svm": 10, "svm_lr": 10, "cnn_full": 50, "cnn10": 50, "cnn": 20, "cifar": 20}


def early_mean(runs, name: str, seeds, until: int) -> SeedValues:
    """Minus the mean training objective over the evaluated rounds 1 to ``until`` of each seed's run of
    ``name`` (the area under the early curve: lower is faster; negated so that "more" is the paper's
    direction)."""
    def value(run) -> float | None:
        values = [r["full_train_loss"] for r in evaluations(run) or ()
                  if 0 < r["round"] <= until and "full_train_loss" in r]
        return (-float(np.mean(values)) if np.all(np.isfinite(values)) else math.nan) if values else None

    return seed_values(runs, name, seeds, value)


def faster(runs, part: str, case: int, seeds, method: str, base: str, until: int) -> Claim:
    """"``method`` converges faster than ``base``": its training objective averaged over the evaluated rounds
    1 to ``until`` (the early curve) is lower. The paired difference is ``base``'s mean minus ``method``'s
    (positive: ``method`` lower); the paper prints no number."""
    return Claim(f"{label(method)} lower than {label(base)} over rounds 1-{until}, case {case}", 0.0,
                 early_mean(runs, f"{part}/case{case}/{method}", seeds, until),
                 early_mean(runs, f"{part}/case{case}/{base}", seeds, until), direction_only=True,
                 our_digits=4)


def higher_accuracy(runs, part: str, case: int, seeds, method: str, base: str) -> Claim:
    """"``method`` reaches a higher final accuracy than ``base``", in points of test accuracy."""
    return Claim(f"{label(method)} ends above {label(base)}, case {case}", 0.0,
                 by_seed(runs, f"{part}/case{case}/{method}", seeds, "test_accuracy", sign=100.0),
                 by_seed(runs, f"{part}/case{case}/{base}", seeds, "test_accuracy", sign=100.0),
                 direction_only=True, our_digits=2)


def fig2a_claims(runs, seeds, part: str, cases=None) -> tuple[list[Claim], list[Claim]]:
    """Fig. 2a's claims on one part: BHerd-FedAvg converges faster than FedAvg (its objective lower over the
    part's early rounds, ``EARLY``) and reaches a higher final accuracy, in each of ``cases`` (default: the
    part's)."""
    cases = cases or next(s for s in SECTIONS if s[0] == part)[2]
    return ([faster(runs, part, case, seeds, "bherd", "fedavg", EARLY[part]) for case in cases],
            [higher_accuracy(runs, part, case, seeds, "bherd", "fedavg") for case in cases])


def decisive_cnn(runs, seeds=TABLE_SEEDS) -> tuple[str, tuple[int, ...]]:
    """The CNN part and cases the decisive claims and curves use: the CNN on all of MNIST in the cases where
    FedAvg and BHerd-FedAvg have finished every seed of ``seeds``, else the tenth of MNIST's case 3 (so a
    case half-run on all of MNIST never replaces a complete smaller one)."""
    full = tuple(case for case in (1, 2, 3)
                 if all(has_runs(runs / "cnn_full", f"case{case}/{method}/seed{seed}")
                        for method in ("fedavg", "bherd") for seed in seeds))
    return ("cnn_full", full) if full else ("cnn10", (3,))


def decisive(records=None, seeds=None) -> Decisive:
    """Fig. 2a's "BHerd-FedAvg converges clearly faster than FedAvg": the SVM at the paper's scale, and the
    CNN on all of MNIST in the cases whose seeds have all finished, else on a tenth of it (``decisive_cnn``).
    ``records``: as ``collect`` returns them, or a folder of run directories (default: the committed records,
    with any finished run under ``runs/bherd`` added); ``seeds``: those the claims pair (default: every seed
    that ran, ``report_seeds``)."""
    records = collect(REPO / "runs" / "bherd", KEEP) if records is None else records
    seeds = report_seeds(records) if seeds is None else seeds
    cnn, cnn_cases = decisive_cnn(records)
    parts = (("svm", "SVM", None), (cnn, "CNN", cnn_cases))
    found = [dataclasses.replace(c, text=f"{model}: {c.text}")
             for part, model, cases in parts if has_runs(records / part)
             for c in fig2a_claims(records, seeds, part, cases)[0]]
    named = "case " + str(cnn_cases[0]) if len(cnn_cases) == 1 else "cases " + ", ".join(map(str, cnn_cases))
    ours = (f"the CNN on all 60,000 rows at B = 100 for 150 of its 500 rounds, {named} (30 % of its client "
            "work)" if cnn == "cnn_full" else "the CNN on 6,000 of the 60,000 rows at B = 25 for 150 rounds, "
            "case 3 (3 % of its client work)")
    return Decisive("BHerd (Beneficial Herd of Local Gradients), Fig. 2a", "bherd_claims.md",
                    "MNIST, 5 clients, partition cases 1-3, B = 100, one local epoch, 500 rounds: an SVM "
                    "and a CNN", f"the SVM at the paper's scale (100 %); {ours}", found,
                    unit="training objective, FedAvg's minus BHerd's",
                    at_scale="BHerd's SVM" if has_runs(records / "svm") else "")


def claims(runs, seeds, out: Path) -> Path:
    """The claims of the paper's text about Fig. 2 and 3a (digest section 7), each judged by the paired
    difference over seeds (``table_runs.judge``), from the finished runs. The paper prints no number, so each
    is a claim of direction: held when the interval lies on the paper's side of 0, not held when it lies on
    the other."""
    lines = ["# BHerd's claims, judged over seeds (generated by `benchmarks/bherd_table.py`)", "",
             CLAIMS_RULE, "",
             ("The paper has no table and prints no number: every claim is one of direction (\"converges "
              "faster\", \"a higher final accuracy\"), so **not held** here means the interval "
              "lies wholly on the other side of 0. \"Faster\" is judged by the global model's training "
              "objective on all training rows (the paper's loss plots) averaged over the early rounds (1-10 "
              "of the SVM, 1-50 of the CNN: the area under the early curve), as the base's mean minus the "
              "method's (positive: the method is lower); accuracy by the last round's test accuracy, in "
              "points. From the runs' records (`benchmarks/results/records/bherd.jsonl.gz`); the tables and "
              "curves: [bherd_results.md](bherd_results.md). Not judged: GraB-FedAvg \"does not speed up "
              "FedAvg\" and Fig. 4e's \"little difference\" with reshuffling (claims of no difference, which "
              "an interval cannot establish at 3 seeds)."),
             ""]
    for part, title, cases, checkpoints in SECTIONS:
        if not has_runs(runs / part):
            continue
        loss, accuracy = fig2a_claims(runs, seeds, part)
        combined = [faster(runs, part, case, seeds, f"bherd_{base}", base, EARLY[part])
                    for base in ("fednova", "scaffold") for case in cases]
        lines += [f"## {title}", "", ("Fig. 2a, \"BHerd-FedAvg converges clearly faster than FedAvg\": the "
                  "training objective"), "", *claims_table(loss, unit="objective"), "",
                  "Fig. 2a, \"and reaches a higher final accuracy\"", "", *claims_table(accuracy), ""]
        if any(c.method for c in combined):
            lines += ["Fig. 2b, \"BHerd speeds up FedNova and SCAFFOLD\": the training objective", "",
                      *claims_table(combined, unit="objective"), ""]
    if has_runs(runs / "alpha"):
        lowered = [Claim(f"alpha 0.3 lower than alpha 1.0 over rounds 1-10, case {case}", 0.0,
                         early_mean(runs, f"alpha/case{case}/a0.3", seeds, EARLY["svm"]),
                         early_mean(runs, f"alpha/case{case}/a1.0", seeds, EARLY["svm"]),
                         direction_only=True, our_digits=4) for case in (1, 2, 3)]
        lines += ["## Fig. 3a (SVM), \"lowering alpha from 1.0 to 0.3 speeds up convergence\"", "",
                  *claims_table(lowered, unit="objective"), ""]
    if plot_decisive_curves(runs, seeds, out.with_name("bherd_curves.png")):
        lines += ["## The decisive curves", "", "![BHerd-FedAvg and FedAvg](bherd_curves.png)", "",
                  ("Fig. 2a: the training objective on all training rows against rounds (log scale), mean "
                   f"over the seeds each ran (of {', '.join(map(str, seeds))}) with a band of one sample "
                   "standard deviation (ddof 1)."), ""]
    return write_report(out, "\n".join(lines) + "\n")


def plot_decisive_curves(runs, seeds, out: Path) -> bool:
    """Fig. 2a's decisive comparison: FedAvg (RR), BHerd-FedAvg and its reshuffled variant, the training
    objective per case of the SVM and of the CNN the decisive claims use (``decisive_cnn``), with bands over
    seeds."""
    cnn, cnn_cases = decisive_cnn(runs)
    names = {"svm": "SVM", "cnn_full": "CNN, all of MNIST", "cnn10": "CNN, 10 % of MNIST"}
    panels = [(f"{names[part]}, case {case}",
               [(label(m), seed_curves(runs / f"{part}/case{case}/{m}", seeds))
                for m in ("fedavg", "bherd", "bherd_rr")])
              for part, cases in (("svm", (1, 2, 3)), (cnn, cnn_cases)) for case in cases]
    return plot_bands(panels, out, key="full_train_loss", scale=1.0, ylabel="training objective", log=True)


def report(runs: Path, seeds, out_dir: Path) -> Path:
    methods = list(METHODS)
    intro = ("Written by `python benchmarks/bherd_table.py` (see its docstring for the parts and the scale). "
             "Each cell is the mean ± sample standard deviation (ddof 1) over the seeds listed; a seed "
             "changes the batch orders (and the CNN's initialisation). Training loss: the global model's "
             "training objective on all training rows (the SVM's includes its l2 term), the quantity of the "
             "paper's loss plots. The targets are FedAvg's (RR) in the same case: 95% of its decrease of the "
             "training objective from round 0 to its last round, and 99% of its final test accuracy; rounds "
             "to a target are the first evaluated round that reaches it (the SVM evaluates every round, the "
             "CNNs every 5), averaged over the seeds that reach it.")
    lines = ["# BHerd at CPU scale: results", "", intro, "", ("Each claim of the paper judged over the "
             "seeds: [bherd_claims.md](bherd_claims.md)."), ""]
    missing = [part for part, *_ in SECTIONS if not has_runs(runs / part) and part != "cnn_full"] + (
        [] if has_runs(runs / "alpha") else ["alpha"])
    if missing:
        lines += [("Not in the committed records yet (run before records were kept; their numbers are in "
                   "this page's history up to commit 494a880): "
                   + "; ".join(f"`python benchmarks/bherd_table.py --parts {part}`" for part in missing)
                   + "."), ""]
    if not has_runs(runs / "cnn_full"):
        lines += [("Not run yet: the CNN on all of MNIST (`python benchmarks/bherd_table.py --parts cnn_full "
                   "--methods fedavg bherd bherd_rr`; about two hours a run on a CPU core, "
                   "[running.md](running.md))."), ""]
    for part, title, cases, checkpoints in SECTIONS:
        if not has_runs(runs / part):
            continue
        lines += [f"## {title}", ""]
        for case in cases:
            lines += [f"### Case {case}", "", *case_table(runs, part, case, seeds, methods, checkpoints), ""]
        if plot_cases(runs, part, cases, seeds, ["centralized", "fedavg", "grab", "bherd", "bherd_rr"],
                      out_dir / f"bherd_{part}.png"):
            lines += [f"![{part}: FedAvg, GraB, BHerd (fixed order and reshuffled)](bherd_{part}.png)", ""]
        if plot_cases(runs, part, cases, seeds, ["fednova", "bherd_fednova", "scaffold", "bherd_scaffold"],
                      out_dir / f"bherd_{part}_combined.png"):
            lines += [f"![{part}: FedNova, SCAFFOLD and their BHerd versions](bherd_{part}_combined.png)", ""]
    alpha_methods = ["svm/case{case}/fedavg"] + [f"alpha/case{{case}}/a{a}" if a != 0.5
                                                 else "svm/case{case}/bherd"
                                                 for a in ALPHAS]
    if has_runs(runs / "alpha"):
        lines += ["## Alpha sweep (SVM, Fig. 3a)", ""]
        for case in (1, 2, 3):
            lines += [f"### Case {case}", "", *case_table(runs, "svm", case, seeds, alpha_methods,
                                                          (10, 50, 100, 500)), ""]
        plot_cases(runs, "alpha", (1, 2, 3), seeds, alpha_methods, out_dir / "bherd_alpha.png")
    caption = ("With one batch order per client, the same batch sits at the same step every round, and "
               "herding keeps choosing similar steps (Fig. 4a-c): the share of a client's steps whose batch "
               "BHerd never sent in the last 20 rounds, and always sent (seed means). For the reshuffled run "
               "the same count is over step positions, which carry a different batch every round.")
    lines += ["## Batches a fixed order never sends", "", caption, "",
              "| run | never sent (%) | always sent (%) | seeds |", "|---|---|---|---|"]
    for part, cases in (("svm", (1, 2, 3)), ("svm_lr", (1, 2, 3)), ("cnn_full", (1, 2, 3)), ("cnn10", (3,)),
                        ("cnn", (1, 2, 3)), ("cifar", (3,))):
        for case in cases:
            for method in ("bherd", "bherd_rr", "bherd_scaffold", "bherd_fednova"):
                got = [e for seed in seeds
                       if (e := exclusion(runs / f"{part}/case{case}/{method}/seed{seed}"))]
                if got:
                    never, always = np.mean(got, 0) * 100
                    lines.append(f"| {part}, case {case}, {label(method)} | {never:.1f} | {always:.1f} | "
                                 f"{len(got)} |")
    lines.append("")
    plot_selection(runs, out_dir / "bherd_selection.png")
    lines += ["![alpha sweep](bherd_alpha.png)", ""] if has_runs(runs / "alpha") else []
    lines += ["## Selection maps and distances (Fig. 4a-d, seed 0)", "",
              "![selected steps and distance to the mean](bherd_selection.png)", ""]
    return write_report(out_dir / "bherd_results.md", "\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=["svm", "alpha"],
                        choices=["svm", "svm_lr", "alpha", "cnn_full", "cnn10", "cnn", "cifar"])
    parser.add_argument("--seeds", nargs="+", type=int, default=list(TABLE_SEEDS),
                        help="the seeds to run (the report covers every seed that ran)")
    parser.add_argument("--cases", nargs="+", type=int, choices=[1, 2, 3],
                        help="run only these partition cases of each part (default: all the part has)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--runs", type=Path, default=REPO / "runs" / "bherd")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "reproductions")
    parser.add_argument("--reverse", action="store_true",
                        help="take the jobs in reverse order (a second process)")
    parser.add_argument("--report", action="store_true", help="only write the tables and figures")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="overrides for every run (the records keep them)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.report:
        for part in args.parts:
            todo = list(jobs(part, args.seeds, args.methods, args.cases))
            for name, config, overrides in (reversed(todo) if args.reverse else todo):
                run(args.runs, name, config, overrides + args.set)
            records = collect(args.runs, KEEP)
            report(records, report_seeds(records, args.seeds), args.out)
    records = collect(args.runs, KEEP)
    seeds = report_seeds(records, args.seeds)
    print(f"wrote {report(records, seeds, args.out)}")
    print(f"wrote {claims(records, seeds, args.out / 'bherd_claims.md')}")


if __name__ == "__main__":
    sys.exit(run_script(main))
