"""FedCOG's Table 1 (every method) and Table 3 (X and X + FedCOG for five bases), at CPU or the paper's scale.

The federation is the paper's (``configs/fedcog/cpu_<dataset>.yaml``: 10 clients all taking part, the
simple-CNN, SGD lr 0.01 with momentum 0.9 and weight decay 1e-5, crop + flip) with 50 local iterations instead
of 400 and 30 rounds instead of 70; FedCOG runs FedAvg for 20 rounds, then FedAvg + FedCOG for 10 (the paper:
50 + 20), generating N = 128 inputs in 50 steps (the paper: 256 in 100). NIID-1 is Dirichlet(0.1), NIID-2 the
code's deterministic class blocks (2 classes a client; 10 on CIFAR-100). Each baseline has the
hyper-parameters the paper (or, where it gives none, its code) sets: ``METHODS`` below.

Table 3 at this scale: 20 rounds of X, then one more round of X (x) or of X + FedCOG (v).

``--scale paper`` runs the paper's own scale instead (``configs/fedcog/paper_<dataset>.yaml``: 400 local
iterations, 70 rounds, FedCOG from round 50 with N = 256 and S = 100; Table 3: 50 rounds of X, then one more),
into ``runs/fedcog_paper`` with its records in ``fedcog_paper.jsonl.gz`` and its pages
``fedcog_paper_tables.md`` and ``fedcog_paper_claims.md``. A Fashion-MNIST run takes about 15 minutes on one
core of a 2-core VM; a GPU runs many at once (``benchmarks/gpu_tables.sh``).

A cell is the final round's test accuracy, mean ± std (the sample standard deviation, ddof 1) over the seeds
(the paper does not say whether it reports the final or the best round). Runs go to
``runs/fedcog/<dataset>/<niid>/<method>/seed<k>`` and
``runs/fedcog/<dataset>/<niid>/table3/<base>{,_fedcog}/seed<k>``; finished runs are reused, and several copies
of the script share the work (a claim file per run). Writes ``docs/reproductions/fedcog_tables.md`` and
``docs/reproductions/fedcog_claims.md``: each claim of the paper the tables test, judged by the paired
difference over seeds and its 95 % interval (held, not held or unresolved). The claims read the CIFAR-10 rerun
of FedAvg, FedCOG and its size weighting on one VM too (``--weighting-runs``, records
``fedcog_weighting.jsonl.gz``).

Usage::

    python benchmarks/fedcog_table.py                                       # Fashion-MNIST, NIID-1 and NIID-2
    python benchmarks/fedcog_table.py --part table3 --datasets cifar10      # Table 3's rows
    python benchmarks/fedcog_table.py --report                              # the report from finished runs
    python benchmarks/fedcog_table.py --claims                              # only the claims page
    python benchmarks/fedcog_table.py --scale paper --methods fedavg fedcog  # the paper's scale
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from records import Keep
from table_runs import (
    CLAIMS_RULE,
    Claim,
    Decisive,
    SeedValues,
    at_either_scale,
    claims_table,
    collect,
    datasets_on_disk,
    evaluations,
    has_runs,
    mean_std,
    plot_bands,
    run_once,
    run_script,
    seed_curves,
    seed_values,
    seeds_on_disk,
    summary,
    write_report,
)

from fedjax_lab.experiments import load_config

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Scale:
    """A scale the tables run at: its configs (``configs/fedcog/<name>_<dataset>.yaml``), FedCOG's schedule
    there, and where its runs, records and pages go."""

    name: str
    start: int  # FedCOG's start round (Table 3: rounds of X before the one compared)
    num_samples: int  # FedCOG's generated inputs N
    steps: int  # and its generation steps S
    runs: str  # runs/<runs>, records benchmarks/results/records/<runs>.jsonl.gz
    setup: str  # the tables page's opening sentence
    ours: str  # the summary page's "ours"

    @property
    def tables(self) -> str:
        return f"{self.runs}_tables.md"

    @property
    def claims(self) -> str:
        return f"{self.runs}_claims.md"

    def plugin(self, **fields) -> str:
        """FedCOG's plug-in at this scale, with ``fields`` besides."""
        extra = "".join(f", {k}: {v}" for k, v in fields.items())
        return (f"{{name: fedcog, start_round: {self.start}, num_samples: {self.num_samples}, "
                f"steps: {self.steps}{extra}}}")


SCALES = {
    "cpu": Scale("cpu", start=20, num_samples=128, steps=50, runs="fedcog",
                 setup=("50 local iterations (the paper: 400) and 30 rounds (the paper: 70); FedCOG = 20 "
                        "FedAvg rounds then 10 FedAvg + FedCOG rounds (the paper: 50 + 20) with N = 128, "
                        "S = 50 (the paper: 256, 100)"),
                 ours=("the paper's federation and model, 30 rounds of 50 local steps (FedCOG from round "
                       "20): 5.4 % of its client steps")),
    "paper": Scale("paper", start=50, num_samples=256, steps=100, runs="fedcog_paper",
                   setup=("the paper's scale: 400 local iterations and 70 rounds; FedCOG = 50 FedAvg rounds "
                          "then 20 FedAvg + FedCOG rounds with N = 256, S = 100"),
                   ours="the paper's federation, model and client work (100 % of its client steps)"),
}
NIID = {"niid1": [], "niid2": ["dataset.partition={name: class_blocks, num_clients: 10, classes: 2}"]}
NIID2_CIFAR100 = ["dataset.partition={name: class_blocks, num_clients: 10, classes: 10}"]
# method -> (label, algorithm) with the paper's hyper-parameters (Sec. 6.1, App. A.4; its code where it gives
# none)
METHODS = {
    "fedavg": ("FedAvg", "{name: fedavg}"),
    "fedavgm": ("FedAvgM", "{name: fedavgm, server_optimizer: momentum_fedcog, server_momentum: 0.1}"),
    "fedprox": ("FedProx", "{name: fedprox, mu: 0.01}"),
    "scaffold": ("SCAFFOLD", "{name: scaffold}"),
    "moon": ("MOON", "{name: moon, mu: 0.01, temperature: 0.5}"),
    "fedsam": ("FedSAM", "{name: fedsam, rho: 0.5}"),
    # rho 0.5 (the paper's) collapses every CIFAR run to a constant predictor; 0.05 is its code's value.
    "fedsam_code": ("FedSAM, rho 0.05 (its code)", "{name: fedsam, rho: 0.05}"),
    "vhl": ("VHL", "{name: vhl}"),
    "fedexp": ("FedExP", "{name: fedexp, epsilon: 0.001}"),
    "feddecorr": ("FedDecorr", "{name: feddecorr, beta: 0.01}"),
    "fedreg": ("FedReg", "{name: fedreg, gamma: 0.5, p_iters: 10, pt_eta: 0.001}"),
    # FedGen's code steps plain SGD; under this protocol's momentum 0.9 (10x the step) its MNIST weights alpha
    # = beta = 10 diverge on NIID-2, so they are scaled by 1 - momentum.
    "fedgen": ("FedGen", "{name: fedgen, alpha: 1.0, beta: 1.0}"),
    "fedcog": ("**FedCOG**", None),  # the config's own: FedAvg, then FedAvg + FedCOG from round 20
    # The same with App. A.2.2's weights (CE n / (n + N_gen), KD N_gen / (n + N_gen)), which its code uses;
    # the paper does not say which weighting its tables used (docs/fedcog.md).
    "fedcog_size": ("FedCOG, size weighting", None),
}
KEEP = Keep()  # what the records keep: the report reads the evaluated rows only
BASES = ["fedavg", "fedavgm", "fedprox", "scaffold", "moon"]
PAPER_T1 = {  # Table 1: method -> (FMNIST NIID-1, NIID-2, CIFAR-10 NIID-1, NIID-2, CIFAR-100 NIID-1, NIID-2)
    "fedavg": ("73.07±0.08", "64.11±0.78", "64.36±0.11", "50.55±0.45", "39.07±0.36", "30.93±0.23"),
    "fedavgm": ("76.81±0.48", "67.73±0.65", "64.36±0.33", "51.32±0.74", "39.21±0.19", "30.97±0.11"),
    "fedprox": ("73.35±0.07", "64.44±1.36", "63.91±0.36", "53.51±0.32", "38.81±0.03", "30.76±0.21"),
    "scaffold": ("77.02±0.63", "58.47±3.05", "64.36±0.43", "48.35±1.86", "42.25±0.40", "34.27±0.22"),
    "moon": ("73.21±0.28", "63.11±1.08", "63.65±0.04", "51.01±1.54", "39.34±0.18", "31.17±0.13"),
    "fedsam": ("76.44±0.06", "68.14±0.60", "61.38±0.23", "50.76±0.36", "37.97±0.26", "30.75±0.11"),
    "vhl": ("73.08±0.89", "70.26±1.79", "60.81±1.33", "51.60±0.98", "37.55±1.06", "28.41±0.48"),
    "fedexp": ("65.03±1.14", "59.49±1.69", "48.96±2.11", "37.97±1.75", "35.14±1.25", "22.47±0.29"),
    "feddecorr": ("72.77±0.70", "60.70±4.59", "63.40±0.29", "47.53±1.99", "37.68±0.40", "27.08±0.29"),
    "fedreg": ("70.75±0.23", "69.89±0.74", "55.40±0.33", "46.64±0.42", "30.95±0.39", "23.70±0.31"),
    "fedgen": ("72.64±1.27", "61.34±2.44", "62.45±0.40", "49.12±0.51", "37.99±0.23", "26.93±0.15"),
    "fedcog": ("77.34±0.07", "73.68±0.38", "64.83±0.12", "54.00±0.84", "42.88±0.02", "34.80±0.42"),
}
DATASET_COLUMN = {"fashion_mnist": 0, "cifar10": 2, "cifar100": 4}
LABELS = {"fashion_mnist": "Fashion-MNIST", "cifar10": "CIFAR-10", "cifar100": "CIFAR-100", "niid1": "NIID-1",
          "niid2": "NIID-2"}
PAPER_T3 = {  # Table 3, CIFAR-10: niid -> base -> (x, v)
    "niid1": {"fedavg": (63.34, 64.47), "fedavgm": (61.71, 64.63), "fedprox": (64.15, 64.87),
              "scaffold": (63.67, 65.36), "moon": (62.56, 63.24)},
    "niid2": {"fedavg": (49.30, 49.50), "fedavgm": (44.73, 45.14), "fedprox": (50.35, 50.89),
              "scaffold": (46.47, 51.26), "moon": (49.64, 50.72)},
}


def cell(values: list[float] | SeedValues, of: int | None = None) -> str:
    """A table cell: mean ± the sample standard deviation (ddof 1) over seeds, and how many runs failed
    (``table_runs.mean_std``)."""
    return mean_std(values, of=of, ddof=1)


def paper_mean(method: str, column: int) -> float:
    """The mean of a Table 1 cell of the paper ("73.07±0.08" -> 73.07)."""
    return float(PAPER_T1[method][column].split("±")[0])


def partition(dataset: str, niid: str) -> list[str]:
    return NIID2_CIFAR100 if dataset == "cifar100" and niid == "niid2" else NIID[niid]


def table1_jobs(datasets, niids, seeds, methods, scale: Scale = SCALES["cpu"]):
    for seed in seeds:
        for dataset in datasets:
            for niid in niids:
                for method in methods:
                    algorithm = METHODS[method][1]
                    overrides = [*partition(dataset, niid), f"seed={seed}"]
                    if algorithm is not None:
                        overrides.append(f"algorithm={algorithm}")
                    if method == "fedcog_size":
                        overrides.append(f"algorithm.plugins=[{scale.plugin(kd_weighting='size')}]")
                    if method == "fedgen" and dataset != "fashion_mnist":  # its code's CIFAR generator
                        overrides += ["algorithm.noise_dim=64", "algorithm.hidden=512",
                                      "algorithm.generator_learning_rate=0.0001"]
                    yield f"{dataset}/{niid}/{method}/seed{seed}", dataset, overrides


def table3_jobs(datasets, niids, seeds, scale: Scale = SCALES["cpu"]):
    for seed in seeds:
        for dataset in datasets:
            for niid in niids:
                for base in BASES:
                    algorithm = METHODS[base][1][:-1]  # '{name: ...' without its closing brace
                    common = [*partition(dataset, niid), f"seed={seed}",
                              f"rounds.num_rounds={scale.start + 1}", f"eval.every={scale.start + 1}"]
                    yield (f"{dataset}/{niid}/table3/{base}/seed{seed}", dataset,
                           common + [f"algorithm={algorithm}}}"])
                    yield (f"{dataset}/{niid}/table3/{base}_fedcog/seed{seed}", dataset,
                           common + [f"algorithm={algorithm}, plugins: [{scale.plugin()}]}}"])


FORKABLE = ("fedavg", "fedcog", "fedcog_size")
"""The Table 1 arms that share their rounds before FedCOG's start round bit for bit."""


def run(runs: Path, name: str, dataset: str, overrides: list[str], scale: Scale = SCALES["cpu"],
        fork: bool = False) -> None:
    """Runs one experiment unless it has finished or another copy of this script claimed it. With ``fork``,
    a Table 1 arm of ``FORKABLE`` starts from a finished FedCOG arm's checkpoint at FedCOG's start round when
    one is on disk (``table_runs.fork``), and so trains the shared rounds once instead of three times."""
    config = load_config(REPO / "configs" / "fedcog" / f"{scale.name}_{dataset}.yaml", overrides)
    parts = name.split("/")  # Table 1: dataset/niid/method/seed
    fork_from = None
    if fork and len(parts) == 4 and parts[2] in FORKABLE:
        dataset_, niid, method, seed = parts
        fork_from = ([f"{dataset_}/{niid}/{m}/{seed}" for m in ("fedcog", "fedcog_size") if m != method],
                     scale.start)
    done = run_once(runs, name, config, KEEP, fork_from=fork_from)
    if done:
        print(f"{name:<52} test acc {done[0]['final']['test_accuracy']:.4f} ({done[1]:.0f} s)", flush=True)


def final_accuracy(run_dir: Path) -> float | None:
    """The last evaluation's test accuracy in %, ``None`` for an unfinished run."""
    rows = evaluations(run_dir)
    return None if rows is None else 100 * rows[-1]["test_accuracy"]


def accuracies(runs: Path, name: str, seeds) -> SeedValues:
    """The final accuracy (%) of each seed's finished run of ``name``, with the runs that failed (a table
    cell says how many)."""
    return seed_values(runs, name, seeds, final_accuracy)


def by_seed(runs: Path, name: str, seeds) -> SeedValues:
    """The final accuracy (%) of each seed's finished run of ``name``; NaN for a run that diverged (its final
    model is at chance: the claims pair nothing with it)."""
    def value(run) -> float | None:
        a = final_accuracy(run)
        return float("nan") if a is not None and (summary(run) or {}).get("diverged") else a

    return seed_values(runs, name, seeds, value)


def gain(runs: Path, name: str, seed: int, plugged: str | None = None) -> str:
    """``plugged``'s final accuracy minus ``name``'s on one seed, in points, or '-' if either has not
    finished; ``plugged`` defaults to X + FedCOG for the base X of ``name`` (``<name>_fedcog``)."""
    plugged = plugged or f"{name}_fedcog"
    base, other = final_accuracy(runs / f"{name}/seed{seed}"), final_accuracy(runs / f"{plugged}/seed{seed}")
    return "-" if base is None or other is None else f"{other - base:+.1f}"


def report(runs: Path, datasets, seeds, out: Path, scale: Scale = SCALES["cpu"]) -> None:
    """Table 1 and Table 3 beside the paper's rows, from the runs that have finished."""
    title = "CPU scale" if scale.name == "cpu" else "the paper's scale"
    command = "benchmarks/fedcog_table.py" + ("" if scale.name == "cpu" else f" --scale {scale.name}")
    lines = [f"# FedCOG at {title} (generated by `{command}`)", "",
             "10 clients all taking part, simple-CNN, SGD 0.01 / momentum 0.9 / wd 1e-5, crop + flip; "
             f"{scale.setup}. A cell: paper | ours, the final round's test accuracy, mean ± std over seeds "
             + ", ".join(map(str, seeds)) +
             " (ours: the sample standard deviation, ddof 1); '-' is not run. Each claim judged over the "
             f"seeds: [{scale.claims}]({scale.claims}).", ""]
    unrun = [label for method, (label, _) in METHODS.items() if "fashion_mnist" in datasets
             and scale.name == "cpu"
             and not any(accuracies(runs, f"fashion_mnist/{niid}/{method}", seeds) for niid in NIID)]
    if scale.name != "cpu":
        lines += [("Only the methods that have run at this scale are listed; every row of the paper is in "
                   f"[{SCALES['cpu'].tables}]({SCALES['cpu'].tables}) beside our CPU-scale runs."), ""]
    if unrun:  # Table 1's first Fashion-MNIST runs predate the records
        lines += [(f"Fashion-MNIST's {', '.join(unrun)} ran before records were kept: their cells show '-' "
                   "until rerun (`python benchmarks/fedcog_table.py`); their earlier numbers are in this "
                   "page's history up to commit 529b9f0."), ""]
    for dataset in datasets:
        column = DATASET_COLUMN[dataset]
        lines += [f"## Table 1, {dataset}", "",
                  "| method | NIID-1 paper | NIID-1 ours | NIID-2 paper | NIID-2 ours |",
                  "|---|---|---|---|---|"]
        for method, (label, _) in METHODS.items():
            ours = [cell(accuracies(runs, f"{dataset}/{niid}/{method}", seeds), of=len(seeds))
                    for niid in NIID]
            if scale.name != "cpu" and set(ours) == {"-"}:
                continue  # at the paper's scale only what has run: its table grows as GPUs come
            paper = PAPER_T1.get(method, ("-",) * 6)  # the paper has one FedCOG row (its weighting unstated)
            row = [f"{paper[column + k]} | {ours[k]}" for k in range(len(NIID))]
            lines.append(f"| {label} | " + " | ".join(row) + " |")
        # Table 1's FedCOG is FedAvg for its first scale.start rounds, bit for bit (tested): the seeds pair.
        paper = ", ".join(f"{niid.upper()} "
                          f"{paper_mean('fedcog', column + k) - paper_mean('fedavg', column + k):+.2f}"
                          for k, niid in enumerate(NIID))
        lines += ["", ("FedCOG's gain over FedAvg, seed by seed (points; seeds "
                       f"{' / '.join(map(str, seeds))}; the paper's: {paper}):"), "",
                  "| weighting | " + " | ".join(niid.upper() for niid in NIID) + " |",
                  "|---|" + "---|" * len(NIID)]
        for method, weighting in (("fedcog", "fixed (lambda_kd 0.01)"), ("fedcog_size", "size (App. A.2.2)")):
            lines.append(f"| {weighting} | " + " | ".join(" / ".join(
                gain(runs, f"{dataset}/{niid}/fedavg", s, f"{dataset}/{niid}/{method}") for s in seeds)
                for niid in NIID) + " |")
        lines.append("")
        if has_runs(runs / dataset, "*/table3/*/*"):
            lines += [(f"## Table 3, {dataset}: {scale.start} rounds of X, then one round of X (x) or X "
                       "+ FedCOG (v)"), "",
                      "| setting | " + " | ".join(f"{METHODS[b][0]} x | {METHODS[b][0]} v" for b in BASES)
                      + " |",
                      "|---|" + "---|---|" * len(BASES)]
            for niid in NIID:
                if dataset == "cifar10":
                    lines.append(f"| paper {niid.upper()} | " + " | ".join(
                        f"{PAPER_T3[niid][b][0]:.2f} | {PAPER_T3[niid][b][1]:.2f}" for b in BASES) + " |")
                ours = []
                for b in BASES:
                    plain = accuracies(runs, f"{dataset}/{niid}/table3/{b}", seeds)
                    plugged = accuracies(runs, f"{dataset}/{niid}/table3/{b}_fedcog", seeds)
                    ours.append(f"{cell(plain, of=len(seeds))} | {cell(plugged, of=len(seeds))}")
                lines.append(f"| ours {niid.upper()} | " + " | ".join(ours) + " |")
            lines += ["", "The gain of X + FedCOG over X, seed by seed (points; seeds "
                      + " / ".join(map(str, seeds)) +
                      "; '-' where a run has not finished):", "",
                      "| base | " + " | ".join(n.upper() for n in NIID) + " |", "|---|" + "---|" * len(NIID)]
            for b in BASES:
                lines.append(f"| {METHODS[b][0]} | " + " | ".join(
                    " / ".join(gain(runs, f"{dataset}/{niid}/table3/{b}", s) for s in seeds) for niid in NIID)
                             + " |")
            lines.append("")
    written = write_report(out, "\n".join(lines) + "\n")
    print(f"wrote {written}")


def claims(runs: Path, weighting: Path | None, datasets, seeds, out: Path,
           scale: Scale = SCALES["cpu"]) -> None:
    """The claims Table 1 and Table 3 test, each judged by the paired difference over seeds
    (``table_runs.judge``), from the runs that have finished; ``weighting``: the one-VM rerun of FedAvg,
    FedCOG and its size weighting, if any."""
    table1, size, best, table3 = [], [], [], []
    for dataset in datasets:
        column = DATASET_COLUMN[dataset]
        for k, niid in enumerate(NIID):
            where, prefix = f"{LABELS[dataset]} {LABELS[niid]}", f"{dataset}/{niid}"
            gain = paper_mean("fedcog", column + k) - paper_mean("fedavg", column + k)
            fedavg = by_seed(runs, f"{prefix}/fedavg", seeds)
            table1.append(Claim(f"FedCOG beats FedAvg, {where}", gain,
                                by_seed(runs, f"{prefix}/fedcog", seeds), fedavg))
            # Where the one-VM rerun holds the cell, the size weighting is judged there (each seed's three
            # runs share a machine and so their first 20 rounds); elsewhere against Table 1's FedAvg.
            rerun = weighting is not None and has_runs(weighting / prefix, "fedcog_size/*")
            if rerun:
                table1.append(Claim(f"FedCOG beats FedAvg, {where}, one-VM rerun", gain,
                                    by_seed(weighting, f"{prefix}/fedcog", seeds),
                                    by_seed(weighting, f"{prefix}/fedavg", seeds)))
            source = weighting if rerun else runs
            size.append(Claim("FedCOG, size weighting, beats FedAvg, "
                              f"{where}{', one-VM rerun' if rerun else ''}",
                              gain, by_seed(source, f"{prefix}/fedcog_size", seeds),
                              by_seed(source, f"{prefix}/fedavg", seeds)))
            fedcog = by_seed(runs, f"{prefix}/fedcog", seeds)
            for method in [*PAPER_T1, "fedsam_code"]:
                if method not in ("fedavg", "fedcog"):
                    paper_row = "fedsam" if method == "fedsam_code" else method  # the paper's one FedSAM row
                    over = paper_mean("fedcog", column + k) - paper_mean(paper_row, column + k)
                    baseline = by_seed(runs, f"{prefix}/{method}", seeds)
                    best.append(Claim(f"FedCOG beats {METHODS[method][0]}, {where}", over, fedcog, baseline))
                    split = runs / dataset / niid
                    if has_runs(split, f"{method}/*") and has_runs(split, "fedcog_size/*"):
                        size.append(Claim(f"FedCOG, size weighting, beats {METHODS[method][0]}, {where}",
                                          over, by_seed(runs, f"{prefix}/fedcog_size", seeds), baseline))
            if has_runs(runs / dataset, "*/table3/*/*"):
                for b in BASES:
                    plain, plugged = PAPER_T3[niid][b]
                    table3.append(Claim(f"{METHODS[b][0]} + FedCOG beats {METHODS[b][0]}, {where}",
                                        plugged - plain, by_seed(runs, f"{prefix}/table3/{b}_fedcog", seeds),
                                        by_seed(runs, f"{prefix}/table3/{b}", seeds),
                                        paper_note="" if dataset == "cifar10" else "(CIFAR-10's)"))
    command = "benchmarks/fedcog_table.py" + ("" if scale.name == "cpu" else f" --scale {scale.name}")
    at = "" if scale.name == "cpu" else " at the paper's scale"
    rerun = "; the one-VM rerun of CIFAR-10: `fedcog_weighting.jsonl.gz`" if weighting is not None else ""
    lines = [f"# FedCOG's claims{at}, judged over seeds (generated by `{command}`)", "",
             CLAIMS_RULE, "",
             (f"Ours ({scale.setup}): the final round's test accuracy (%), the number "
              f"[{scale.tables}]({scale.tables}) shows, from the runs' records "
              f"(`benchmarks/results/records/{scale.runs}.jsonl.gz`{rerun}); a run not yet finished "
              "is left out."), "",
             "## Table 1: \"FedCOG improves on FedAvg\"", "", *claims_table(table1), "",
             ("## Table 1 with the code's size weighting (App. A.2.2; the paper does not say which weighting "
              "its table used, so its FedCOG gain is the reference)"), "", *claims_table(size), "",
             "## Table 1: \"FedCOG is the best method in every column\"", "", *claims_table(best), ""]
    if table3:
        lines += [("## Table 3: \"one round of X + FedCOG beats one round of X\" "
                   f"({scale.start} rounds of X first; the paper's Table 3 is CIFAR-10's, and its gains are "
                   "the reference on Fashion-MNIST too)"),
                  "", *claims_table(table3), ""]
    figure = out.with_name(f"{scale.runs}_curves.png")
    if plot_decisive_curves(runs, datasets, seeds, figure, mark=scale.start):
        lines += ["## The decisive curves", "", (f"![FedAvg, FedCOG and its size weighting]({figure.name})"),
                  "",
                  (f"Test accuracy against rounds, mean over seeds {', '.join(map(str, seeds))} with a band "
                   "of one sample standard deviation (ddof 1); FedCOG starts generating at the dashed line."),
                  ""]
    written = write_report(out, "\n".join(lines) + "\n")
    print(f"wrote {written}")


def decisive(records=None, paper=None, weighting=None) -> Decisive:
    """Table 1's "FedCOG improves on FedAvg" in every dataset and split, for the summary page, with the fixed
    lambda_kd and with the code's size weighting (the paper does not say which its table used): each at the
    paper's scale where two seeds or more pair there, else at CPU scale (``table_runs.at_either_scale``); a
    size-weighting claim with no runs at either scale is left out. ``records``, ``paper`` and ``weighting``:
    the CPU-scale, paper-scale and one-VM rerun's records as ``collect`` returns them, or folders of run
    directories (default: the committed records); at CPU scale the size weighting is judged in the rerun
    where it holds the cell, as on the claims page."""
    records = collect(REPO / "runs" / SCALES["cpu"].runs, KEEP) if records is None else records
    paper = collect(REPO / "runs" / SCALES["paper"].runs, KEEP) if paper is None else paper
    weighting = collect(REPO / "runs" / "fedcog_weighting", KEEP) if weighting is None else weighting
    arms = (("fedcog", "FedCOG"), ("fedcog_size", "FedCOG, size weighting,"))

    def table1(source, rerun=None) -> list[Claim]:
        claims = []
        for dataset, column in DATASET_COLUMN.items():
            for k, niid in enumerate(NIID):
                cell = f"{dataset}/{niid}"
                for method, label in arms:
                    use = rerun if (method == "fedcog_size" and rerun is not None
                                    and has_runs(rerun / cell, "fedcog_size/*")) else source
                    seeds = seeds_on_disk(use, [0, 1, 2])
                    claims.append(Claim(f"{label} beats FedAvg, {LABELS[dataset]} {LABELS[niid]}",
                                        paper_mean("fedcog", column + k) - paper_mean("fedavg", column + k),
                                        by_seed(use, f"{cell}/{method}", seeds),
                                        by_seed(use, f"{cell}/fedavg", seeds)))
        return claims

    chosen, chosen_from_paper = at_either_scale(table1(paper), table1(records, weighting))
    kept = [(c, p) for c, p in zip(chosen, chosen_from_paper)
            if c.method or not c.text.startswith("FedCOG, size")]
    claims, from_paper = [c for c, _ in kept], [p for _, p in kept]
    where = [c.text.split(" beats FedAvg, ")[1].rsplit(", ", 1)[0] for c in claims]
    at_paper = list(dict.fromkeys(w for w, p in zip(where, from_paper) if p))
    at_cpu = list(dict.fromkeys(w for w, p, c in zip(where, from_paper, claims)
                                if not p and c.method))
    ours = SCALES["cpu"].ours
    if at_paper:
        ours = f"{SCALES['paper'].ours} on {', '.join(at_paper)}" + (
            f"; {ours} on {', '.join(at_cpu)}" if at_cpu else "")
    return Decisive("FedCOG (Fake It Till Make It), Table 1",
                    SCALES["paper" if at_paper else "cpu"].claims,
                    "10 clients, simple-CNN, 70 rounds of 400 local steps of 64 (FedCOG from round 50)",
                    ours, [c for c in claims if c.method or c.base],
                    at_scale=f"FedCOG's {', '.join(at_paper)}" if at_paper else "")


def plot_decisive_curves(runs: Path, datasets, seeds, out: Path, mark: int = SCALES["cpu"].start) -> bool:
    """Table 1's decisive comparison as curves: FedAvg, FedCOG and its size weighting, one panel per dataset
    and split, the mean over seeds with a band of one sample standard deviation. Returns whether anything was
    drawn."""
    methods = (("fedavg", "FedAvg"), ("fedcog", "FedCOG"), ("fedcog_size", "FedCOG, size weighting"))
    return plot_bands([(f"{LABELS[d]} {LABELS[n]}",
                        [(label, seed_curves(runs / d / n / m, seeds)) for m, label in methods])
                       for d in datasets for n in NIID
                       if any(has_runs(runs / d / n, f"{m}/*") for m, _ in methods)], out,
                      mark=mark)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=["fashion_mnist"], choices=list(DATASET_COLUMN))
    parser.add_argument("--niids", nargs="+", default=list(NIID), choices=list(NIID))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--part", nargs="+", default=["table1"], choices=["table1", "table3"])
    parser.add_argument("--scale", default="cpu", choices=list(SCALES),
                        help="cpu: 50 local steps x 30 rounds; paper: the paper's 400 x 70")
    parser.add_argument("--runs", help="default: runs/fedcog (cpu) or runs/fedcog_paper (paper)")
    parser.add_argument("--out", help="the tables page (default: docs/reproductions/<runs>_tables.md)")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="overrides for every run, e.g. rounds.chunk_size=2 (a layout for this machine: "
                             "the records keep it)")
    parser.add_argument("--reverse", action="store_true",
                        help="take the jobs in reverse order (a second copy)")
    parser.add_argument("--fork", action="store_true",
                        help="start FedAvg and the FedCOG arms from a finished FedCOG arm's checkpoint at "
                             "the start round where one is on disk (the same results; run fedcog first)")
    parser.add_argument("--report", action="store_true", help="only write the report from finished runs")
    parser.add_argument("--claims", action="store_true", help="only write the claims page from finished runs")
    parser.add_argument("--claims-out", help="the claims page (default: docs/reproductions/<runs>_claims.md)")
    parser.add_argument("--weighting-runs", default=str(REPO / "runs" / "fedcog_weighting"),
                        help="the one-VM rerun of FedAvg, FedCOG and its size weighting the claims read "
                             "(CPU scale only)")
    args = parser.parse_args(argv)
    scale = SCALES[args.scale]
    runs = Path(args.runs or REPO / "runs" / scale.runs)
    pages = REPO / "docs" / "reproductions"
    if not (args.report or args.claims):
        jobs = []
        if "table1" in args.part:
            jobs += list(table1_jobs(args.datasets, args.niids, args.seeds, args.methods, scale))
        if "table3" in args.part:
            jobs += list(table3_jobs(args.datasets, args.niids, args.seeds, scale))
        for name, dataset, overrides in reversed(jobs) if args.reverse else jobs:
            run(runs, name, dataset, overrides + args.set, scale=scale, fork=args.fork)
    # One report for everything that has run, not only what this invocation asked for.
    records = collect(runs, KEEP)
    datasets, seeds = datasets_on_disk(records, DATASET_COLUMN), seeds_on_disk(records, args.seeds)
    if not args.claims:
        report(records, datasets, seeds, Path(args.out or pages / scale.tables), scale)
    weighting = collect(Path(args.weighting_runs), KEEP) if scale.name == "cpu" else None
    claims(records, weighting, datasets, seeds, Path(args.claims_out or pages / scale.claims), scale)


if __name__ == "__main__":
    sys.exit(run_script(main))
