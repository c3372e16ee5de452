"""FedWalk's experiments at CPU scale: Table 2 (FedAvg, SCAFFOLD, FedProx, FedNova, each alone and "+
FedWalk", CIFAR-10 Dirichlet(0.1) and "IID" Dirichlet(10), several seeds), the tau sweep of Fig. 3 for the LH,
MH and HH leashes, and the pre-training ablation of Fig. 4. Writes ``docs/reproductions/fedwalk_results.md``
after every run, so that an interrupted job leaves usable tables, and ``docs/reproductions/fedwalk_tau.png``
once a sweep has run.

Also FedAvg and FedWalk from a model pre-trained on the leash (the paper starts from ImageNet weights).
The scale is that of ``configs/fedwalk/cifar10_dir0.1.yaml`` (simple-CNN, 100 clients, 20 per round, 5 steps
of batch 32, lr 0.05, 50 rounds). Finished runs are reused; run it again to continue.

Usage::

    python benchmarks/fedwalk_table.py                  # everything: 83 runs of 1-4 min, about 2 h on 2 cores
    python benchmarks/fedwalk_table.py --parts table --seeds 0
    python benchmarks/fedwalk_table.py --reverse &      # a second process shares the jobs (more throughput)
    python benchmarks/fedwalk_table.py --parts table100 # the CIFAR-100 columns
    python benchmarks/fedwalk_table.py --parts table300 # Table 2 at 300 rounds with the paper's lr schedule
    python benchmarks/fedwalk_table.py --parts table_pretrained --set model.name=resnet18 model.norm=group \
        --runs runs/fedwalk_resnet18 --out docs/reproductions/fedwalk_resnet18   # a GPU's job

``--parts table_pretrained`` is Table 2 as the paper runs it: 300 rounds with its schedule, from a pre-trained
backbone. Ours is pre-trained on the leash set (the 20 CIFAR-100 classes of the LH leash, 10,000 images,
``PRETRAINED_STEPS`` steps of 64) in place of ImageNet, which this project cannot load: both arms of a pair
pre-train the same steps from the same initialisation (the base with ``fedwalk.mode: pretrain``, which then
trains without the leash). ``--set`` adds overrides to every run (on a GPU: the paper's ResNet-18 with
GroupNorm); the records keep them. A table of another model goes to runs of its own (``--runs``, so records
of their own) and pages of its own (``--out``): a cell kept under the same name as another model's stops the
script (``table_runs.check_same_experiment``). The summary page takes Table 2 from ``RESNET_RUNS`` once its
pre-trained table is complete.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
from pathlib import Path

import numpy as np
from records import Keep
from table_runs import (
    CLAIMS_RULE,
    Claim,
    Decisive,
    SeedValues,
    claims_table,
    collect,
    failure,
    failure_counts,
    metrics,
    plot_bands,
    run_once,
    run_script,
    seeds_on_disk,
)
from table_runs import record as run_record
from table_runs import summary as run_summary
from table_runs import write_report as write_markdown

from fedjax_lab.experiments import load_config
from fedjax_lab.experiments.run_directory import read_metrics

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs" / "fedwalk"
KEEP = Keep(rounds=("leash_steps_taken",))  # beside the evaluated rows: the leash steps of the last round
# SCAFFOLD diverged at lr 0.05 in this setting (20% participation, Dir(0.1): its test loss exploded near round
# 20 with and without the leash); it runs at 0.01, the top of the paper's grid (the leash follows, gamma =
# eta).
TABLE_SEEDS = (0, 1, 2)
"""The seeds every cell of a table has before the table counts as complete (:func:`decisive_table`). More
seeds, where a claim stays unresolved, join the tables and the claims where they ran."""
BASES = {"fedavg": ["algorithm.weighting=uniform"],
         "scaffold": ["algorithm.weighting=num_examples", "client.learning_rate=0.01"],
         "fedprox": ["algorithm.weighting=num_examples", "algorithm.mu=0.01"],
         "fednova": ["algorithm.weighting=num_examples"]}
RESNET_RUNS = "fedwalk_resnet18"  # the GPU's table with the paper's model: its runs, records and pages
MODEL_NAMES = {"simple_cnn": "simple-CNN", "resnet18": "ResNet-18"}  # as the papers name them
SETTINGS = {"dir0.1": "cifar10_dir0.1.yaml", "iid": "cifar10_iid.yaml"}
SETTINGS100 = {"c100_dir0.01": "cifar100_dir0.01.yaml", "c100_iid": "cifar100_iid.yaml"}
GRADES = {"LH": "cifar10_dir0.1.yaml", "MH": "cifar10_dir0.1_mh.yaml", "HH": "cifar10_dir0.1_hh.yaml"}
# Our leash starts from a random head and the model from scratch, so Ls stays near 4x Lc (log ratio about -2)
# and every tau >= -1 keeps the gate open in every round; the grid covers where the gate acts, plus tau = 1.
TAUS = (-3.0, -2.5, -2.0, -1.5, -1.0, 1.0)
STRONGER = (5, 20)  # leash steps per open round for the LH leash at tau = 1 (the paper: 1)
# With T_s = 1 the leash barely moves the model at this scale (the LH sweep above is flat), so the sweep over
# the three grades runs with 20 leash steps per open round, where the leash's effect is measurable;
# pre-training gets the same budget (50 rounds x 20 steps).
STRONG_STEPS = 20
STRONG_TAUS = (-3.0, -2.5, -2.0, -1.0, 0.0, 1.0)
PAPER = {  # Table 2, test accuracy (%), CIFAR-10: (Dir(0.1), IID)
    "fedavg": (88.06, 95.58), "scaffold": (82.84, 94.99), "fedprox": (85.23, 95.48),
    "fednova": (86.32, 95.46),
    "fedavg+fedwalk": (91.45, 95.88), "scaffold+fedwalk": (86.48, 96.58), "fedprox+fedwalk": (91.41, 95.82),
    "fednova+fedwalk": (91.89, 95.82)}
PAPER100 = {  # Table 2, test accuracy (%), CIFAR-100: (Dir(0.01), IID)
    "fedavg": (58.53, 80.03), "scaffold": (52.66, 78.59), "fedprox": (58.72, 80.13),
    "fednova": (60.12, 80.11),
    "fedavg+fedwalk": (61.35, 80.38), "scaffold+fedwalk": (57.04, 82.46), "fedprox+fedwalk": (61.65, 80.84),
    "fednova+fedwalk": (63.27, 80.84)}


def run(runs: Path, name: str, config_file: str, overrides: list[str]) -> None:
    """Runs one experiment unless it has finished before or another copy of this script claimed it, and prints
    its result."""
    run_dir = runs / name
    start = time.perf_counter()
    run_once(runs, name, load_config(CONFIGS / config_file, overrides), KEEP)
    if not (run_dir / "summary.json").is_file():
        print(f"{name:<40} kept from before or claimed by another process; skipped", flush=True)
        return
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = read_metrics(run_dir)
    print(f"{name:<40} final {summary['final']['test_accuracy']:.4f} best "
          f"{summary['best_test_accuracy']:.4f} leash steps {rows[-1].get('leash_steps_taken', 0):.0f} "
          f"({time.perf_counter() - start:.0f} s)", flush=True)


def table_jobs(seeds, settings=SETTINGS, prefix="table", bases=tuple(BASES), extra_overrides=lambda base: ()):
    for setting, config_file in settings.items():
        for seed in seeds:
            for base in bases:
                for walk in (False, True):
                    method = f"{base}+fedwalk" if walk else base
                    yield (f"{prefix}/{setting}/{method}/seed{seed}", config_file,
                           [f"algorithm.name={base}", f"seed={seed}", *BASES[base], *extra_overrides(base)]
                           + ([] if walk else ["algorithm.plugins=[]"]))


PAPER_ROUNDS, DROP_ROUND, DROPPED_RATE = 300, 100, 1e-5


def paper_schedule(base: str) -> list[str]:
    """The paper's 300 rounds with its learning-rate schedule: the clients' rate (and the leash's, gamma =
    eta) drops to 1e-5 at round 100; evaluated every 10 rounds."""
    rate = 0.01 if base == "scaffold" else 0.05
    return [f"rounds.num_rounds={PAPER_ROUNDS}", "eval.every=10",
            f"client.schedule={{name: step, boundaries: [{DROP_ROUND}], factor: {DROPPED_RATE / rate:g}}}"]


def table300_jobs(seeds, bases):
    return table_jobs(seeds, SETTINGS, "table300", bases, paper_schedule)


def table_pretrained_jobs(seeds, bases):
    """Table 2 at the paper's 300 rounds and schedule, both arms from a model pre-trained on the leash set
    (``PRETRAINED_STEPS`` leash steps before round 0): X + FedWalk keeps the leash during FL, X trains
    without it (``fedwalk.mode: pretrain``)."""
    for setting, config_file in SETTINGS.items():
        for seed in seeds:
            for base in bases:
                for walk in (False, True):
                    yield (f"table_pt/{setting}/{base}{'+fedwalk' if walk else ''}/seed{seed}", config_file,
                           [f"algorithm.name={base}", f"seed={seed}", *BASES[base], *paper_schedule(base),
                            f"algorithm.plugins.fedwalk.pretrain_steps={PRETRAINED_STEPS}"]
                           + ([] if walk else ["algorithm.plugins.fedwalk.mode=pretrain"]))


def strong_sweep_key(grade: str, tau: float) -> str:
    # LH at tau = 1 is the same run as the T_s = 20 point of the leash-strength series.
    return (f"steps/LH/steps{STRONG_STEPS}" if (grade, tau) == ("LH", 1.0)
            else f"sweep{STRONG_STEPS}/{grade}/tau{tau:g}")


def sweep_jobs(grades):
    for tau in TAUS:
        yield f"sweep/LH/tau{tau:g}", GRADES["LH"], [f"algorithm.plugins.fedwalk.tau={tau}"]
    yield "pretrain/LH", GRADES["LH"], ["algorithm.plugins.fedwalk.mode=pretrain"]
    for steps in STRONGER:
        yield f"steps/LH/steps{steps}", GRADES["LH"], ["algorithm.plugins.fedwalk.tau=1",
                                                       f"algorithm.plugins.fedwalk.steps={steps}"]
    for grade in grades:
        for tau in STRONG_TAUS:
            yield (strong_sweep_key(grade, tau), GRADES[grade],
                   [f"algorithm.plugins.fedwalk.tau={tau}",
                    f"algorithm.plugins.fedwalk.steps={STRONG_STEPS}"])
        yield (f"pretrain{STRONG_STEPS}/{grade}", GRADES[grade],
               ["algorithm.plugins.fedwalk.mode=pretrain",
                f"algorithm.plugins.fedwalk.pretrain_steps={50 * STRONG_STEPS}"])


PRETRAINED_STEPS = 2000  # about 13 epochs of the 10,000-image LH leash set


def pretrained_jobs(seeds):
    """FedAvg and FedWalk (LH) from a model pre-trained on the leash, standing in for the paper's ImageNet
    start."""
    for seed in seeds:
        yield (f"pretrained/fedavg/seed{seed}", GRADES["LH"],
               [f"seed={seed}", "algorithm.plugins.fedwalk.mode=pretrain",
                f"algorithm.plugins.fedwalk.pretrain_steps={PRETRAINED_STEPS}"])
        yield (f"pretrained/fedavg+fedwalk/seed{seed}", GRADES["LH"],
               [f"seed={seed}", f"algorithm.plugins.fedwalk.pretrain_steps={PRETRAINED_STEPS}"])


def finished(runs: Path, jobs) -> dict:
    """The finished runs among ``jobs`` (whoever ran them), read from their kept records."""
    runs = collect(runs, KEEP)
    out = {}
    for name, _, _ in jobs:
        if (summary := run_summary(runs / name)) is not None:
            out[name] = {"summary": summary, "rows": metrics(runs / name),
                         "config": run_record(runs / name).config}
    return out


def mean_std(summaries: list[dict], best: bool = False) -> str:
    """The runs' final (or ``best``) test accuracy in %, mean ± sample std (ddof 1); one value alone (no
    spread to show), '–' for none; and how many of the runs failed (``table_runs.failure``): "(1
    diverged)"."""
    values = [100 * (s["best_test_accuracy"] if best else s["final"]["test_accuracy"]) for s in summaries]
    if not values:
        return "–"
    text = f"{values[0]:.1f}" if len(values) == 1 else f"{np.mean(values):.1f} ± {np.std(values, ddof=1):.1f}"
    notes = failure_counts(failure(s) for s in summaries)
    return text + (f" ({'; '.join(notes)})" if notes else "")


def table_lines(results: dict, seeds, settings: dict, paper: dict, columns: tuple[str, str],
                prefix: str = "table") -> list[str]:
    lines = [(f"| method | seeds | {columns[0]} final | {columns[0]} best | paper {columns[0]} | "
             f"{columns[1]} final | {columns[1]} best | paper {columns[1]} |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for base in BASES:
        if not any(k.startswith(f"{prefix}/") and f"/{base}" in k for k in results):
            continue
        for method in (base, f"{base}+fedwalk"):
            cells, counts = [], []
            for i, setting in enumerate(settings):
                done = [results[k] for s in seeds if (k := f"{prefix}/{setting}/{method}/seed{s}") in results]
                counts.append(str(len(done)))
                summaries = [r["summary"] for r in done]
                cells += [mean_std(summaries), mean_std(summaries, best=True),
                          f"{paper[method][i]:.2f}"]
            lines.append(f"| {method} | {' / '.join(counts)} | " + " | ".join(cells) + " |")
    return lines


def write_report(results: dict, args, seeds) -> None:
    """``fedwalk_results.md`` and ``fedwalk_claims.md`` (with their figures) from ``results``, over
    ``seeds``."""
    out = Path(args.out)
    lines = [("Test accuracy (%) of the global model on CIFAR-10 (simple-CNN, 50 rounds): final round and "
              "best round (the paper reports the best), mean ± sample std (ddof 1) over the seeds that have "
              "finished; the paper's Table 2 (ResNet-18 pre-trained on ImageNet, 300 rounds) beside it. "
              "`python benchmarks/fedwalk_table.py`."), "",
             *table_lines(results, seeds, SETTINGS, PAPER, ("Dir(0.1)", "IID"))]
    if any(k.startswith("table300/") for k in results):
        lines += ["", (f"The same rows at the paper's length, {PAPER_ROUNDS} rounds, with its learning-rate "
                       f"schedule (the clients' and the leash's rate drop to {DROPPED_RATE:g} at round "
                       f"{DROP_ROUND}), evaluated every 10 rounds: `python benchmarks/fedwalk_table.py "
                       "--parts table300`."), "",
                  *table_lines(results, seeds, SETTINGS, PAPER, ("Dir(0.1)", "IID"), "table300")]
    if any(k.startswith("table_pt/") for k in results):
        lines += ["", (f"Table 2 as the paper runs it, from a pre-trained backbone: both arms pre-trained "
                       f"{PRETRAINED_STEPS} steps on the leash set (20 CIFAR-100 classes, in place of "
                       f"ImageNet), then {PAPER_ROUNDS} rounds with the paper's schedule: `python "
                       "benchmarks/fedwalk_table.py --parts table_pretrained` (the model: the records' "
                       "config)."), "",
                  *table_lines(results, seeds, SETTINGS, PAPER, ("Dir(0.1)", "IID"), "table_pt")]
    if any(k.startswith("table/c100") for k in results):
        lines += ["", ("CIFAR-100 (the leash is CIFAR-10's training set), same scale: "
                       "`python benchmarks/fedwalk_table.py --parts table100`."), "",
                  *table_lines(results, seeds, SETTINGS100, PAPER100, ("Dir(0.01)", "IID"))]
    def cell(r):
        return "–" if r is None else (f"{100 * r['summary']['final']['test_accuracy']:.1f} / "
                                      f"{100 * r['summary']['best_test_accuracy']:.1f} "
                                      f"({r['rows'][-1].get('leash_steps_taken', 0):.0f})")

    missing = [(part, text) for part, text, found in (
        ("table300", f"Table 2 at {PAPER_ROUNDS} rounds", any(k.startswith("table300/") for k in results)),
        ("table100", "the CIFAR-100 columns", any(k.startswith("table/c100") for k in results)),
        ("sweep", "the tau sweeps and the leash strength",
         any(k.startswith(("sweep", "steps/")) for k in results)),
        ("pretrained", "the runs from a pre-trained model",
         any(k.startswith("pretrained/") for k in results)))
        if not found]
    if missing:
        lines += ["", ("Not in the committed records yet (run before records were kept; their numbers are in "
                       "this page's history up to commit 494a880): " + "; ".join(
                           f"{text} (`python benchmarks/fedwalk_table.py --parts {part}`)"
                           for part, text in missing)
                       + ".")]
    if not any(k.startswith("table_pt/") for k in results):
        lines += ["", ("Not run yet: Table 2 from a pre-trained backbone (`python "
                       "benchmarks/fedwalk_table.py --parts table_pretrained`; with the paper's ResNet-18, "
                       f"`--set model.name=resnet18 model.norm=group --runs runs/{RESNET_RUNS} --out "
                       f"docs/reproductions/{RESNET_RUNS}`, a GPU's job).")]
    swept = any(k.startswith(("sweep", "steps/", "pretrain/", f"pretrain{STRONG_STEPS}/")) for k in results)
    if swept:
        lines += sweep_lines(results, cell)
    pre = {m: [results[k]["summary"] for s in seeds if (k := f"pretrained/{m}/seed{s}") in results]
           for m in ("fedavg", "fedavg+fedwalk")}
    if any(pre.values()):
        lines += ["", (f"From a model pre-trained on the LH leash ({PRETRAINED_STEPS} leash steps before "
                  "round 0; the paper starts from ImageNet weights), Dir(0.1): final / best test accuracy "
                  "(%), mean ± sample std (ddof 1) over seeds."), "", "| method | seeds | final | best |",
                  "|---|---:|---:|---:|"]
        for m, summaries in pre.items():
            lines.append(f"| pre-trained + {m} | {len(summaries)} | "
                         f"{mean_std(summaries)} | {mean_std(summaries, best=True)} |")
    write_markdown(out / "fedwalk_results.md", "\n".join(lines) + "\n")
    write_claims(results, seeds, out / "fedwalk_claims.md")
    if swept:
        plot_sweep(results, out / "fedwalk_tau.png")


def sweep_lines(results: dict, cell) -> list[str]:
    """The tau sweeps and the leash-strength series (seed 0), as the report shows them."""
    lines = ["", ("The paper's leash (T_s = 1), LH, Dir(0.1), seed 0: final / best test accuracy (%) and "
                   "(leash steps taken in 50 rounds); pre-training takes 50 leash steps before FL."), "",
              "| leash | " + " | ".join(f"tau={t:g}" for t in TAUS) + " | pre-training |",
              "|---|" + "---:|" * (len(TAUS) + 1),
              "| LH | " + " | ".join(cell(results.get(f"sweep/LH/tau{t:g}")) for t in TAUS)
              + f" | {cell(results.get('pretrain/LH'))} |"]
    stronger = [(n, results[k]) for n in STRONGER if (k := f"steps/LH/steps{n}") in results]
    if stronger:
        lines += ["", ("A stronger leash (LH, tau = 1, so the gate is always open): leash steps per round "
                  "against final / best test accuracy (%), seed 0."), "",
                  "| leash steps per round | final | best |", "|---:|---:|---:|"]
        lh = results.get("sweep/LH/tau1")
        for n, r in ([(1, lh)] if lh else []) + stronger:
            lines.append(f"| {n} | {100 * r['summary']['final']['test_accuracy']:.1f} | "
                         f"{100 * r['summary']['best_test_accuracy']:.1f} |")
    lines += ["", (f"Tau sweep with {STRONG_STEPS} leash steps per open round, the three grades, Dir(0.1), "
                   "seed 0: final / best (%) and (leash steps taken); pre-training takes "
                   f"{50 * STRONG_STEPS} leash steps before FL. FedAvg alone: see the table."), "",
              "| leash | " + " | ".join(f"tau={t:g}" for t in STRONG_TAUS) + " | pre-training |",
              "|---|" + "---:|" * (len(STRONG_TAUS) + 1)]
    for grade in GRADES:
        lines.append(f"| {grade} | " + " | ".join(cell(results.get(strong_sweep_key(grade, t)))
                                                  for t in STRONG_TAUS)
                     + f" | {cell(results.get(f'pretrain{STRONG_STEPS}/{grade}'))} |")
    return lines


def best_by_seed(results: dict, name: str, seeds) -> SeedValues:
    """The best test accuracy (%, the number the paper reports) of each seed's finished run of ``name``."""
    found = {s: results[k]["summary"] for s in seeds if (k := f"{name}/seed{s}") in results}
    return SeedValues({s: 100 * got["best_test_accuracy"] for s, got in found.items()},
                      {s: why for s, got in found.items() if (why := failure(got))})


TABLES = {  # our table: (its title, the runs' prefix, settings, the paper's numbers, column labels)
    "cifar10": ("Table 2, CIFAR-10, 50 rounds", "table", SETTINGS, PAPER, ("Dir(0.1)", "IID")),
    "cifar10_300": (f"Table 2, CIFAR-10, the paper's {PAPER_ROUNDS} rounds and learning-rate schedule",
                    "table300", SETTINGS, PAPER, ("Dir(0.1)", "IID")),
    "cifar100": ("Table 2, CIFAR-100, 50 rounds", "table", SETTINGS100, PAPER100, ("Dir(0.01)", "IID")),
    "cifar10_pretrained": ((f"Table 2, CIFAR-10, from a backbone pre-trained on the leash set, the "
                            f"paper's {PAPER_ROUNDS} rounds and schedule"), "table_pt", SETTINGS, PAPER,
                           ("Dir(0.1)", "IID")),
}


def table2_claims(results: dict, seeds, table: str) -> list[Claim]:
    """Table 2's claims on one of our ``TABLES``: "X + FedWalk beats X" for each base and column, the paper's
    gain the difference of its two numbers."""
    _, prefix, settings, paper, columns = TABLES[table]
    return [Claim(f"{base} + FedWalk beats {base}, {column}", paper[f"{base}+fedwalk"][i] - paper[base][i],
                  best_by_seed(results, f"{prefix}/{setting}/{base}+fedwalk", seeds),
                  best_by_seed(results, f"{prefix}/{setting}/{base}", seeds))
            for i, (setting, column) in enumerate(zip(settings, columns)) for base in BASES]


def write_claims(results: dict, seeds, out: Path) -> Path:
    """Table 2's claims on each of our tables that has runs, judged by the paired difference over seeds."""
    lines = ["# FedWalk's claims, judged over seeds (generated by `benchmarks/fedwalk_table.py`)", "",
             CLAIMS_RULE, "",
             ("Ours: the best test accuracy over the evaluations (%; the paper reports the best round), the "
              "number [fedwalk_results.md](fedwalk_results.md) shows, from the runs' records "
              "(`benchmarks/results/records/fedwalk.jsonl.gz`). Our scale: a simple-CNN, trained from "
              f"scratch or, in the pre-trained table, from {PRETRAINED_STEPS} leash steps on 20 CIFAR-100 "
              "classes (the paper: ResNet-18 pre-trained on ImageNet), 100 clients, 20 a round, 5 local "
              f"steps of 32, as the paper; 50 or {PAPER_ROUNDS} rounds (the paper: {PAPER_ROUNDS}). Not "
              "judged: the tau sweeps (single-seed ablations)."), ""]
    for table, (title, *_rest) in TABLES.items():
        claims = table2_claims(results, seeds, table)
        if any(c.method for c in claims):
            lines += [f"## {title}", "", *claims_table(claims), ""]
    pretrained = Claim("fedavg + FedWalk beats fedavg, Dir(0.1), both from a model pre-trained on the LH "
                       "leash (our stand-in for the paper's ImageNet start, 50 rounds)",
                       PAPER["fedavg+fedwalk"][0] - PAPER["fedavg"][0],
                       best_by_seed(results, "pretrained/fedavg+fedwalk", seeds),
                       best_by_seed(results, "pretrained/fedavg", seeds))
    if pretrained.method:
        lines += ["## From a pre-trained model", "", *claims_table([pretrained]), ""]
    table = decisive_table(results)
    if plot_decisive_curves(results, seeds, table, out.with_name("fedwalk_curves.png")):
        lines += ["## The decisive curves", "", "![X and X + FedWalk](fedwalk_curves.png)", "",
                  (f"{TABLES[table][0]}: test accuracy against rounds, each base and the base + FedWalk, "
                   f"mean over seeds {', '.join(map(str, seeds))} with a band of one sample standard "
                   "deviation (ddof 1)."), ""]
    return write_markdown(out, "\n".join(lines) + "\n")


def plot_decisive_curves(results: dict, seeds, table: str, out: Path) -> bool:
    """Table 2 as curves: each base and the base + FedWalk, one panel per base and column, with bands over
    seeds. Returns whether anything was drawn."""
    _, prefix, settings, _, columns = TABLES[table]

    def curves(name: str) -> list[list[dict]]:
        return [[r for r in results[k]["rows"] if "test_accuracy" in r] for s in seeds
                if (k := f"{prefix}/{name}/seed{s}") in results]

    return plot_bands([(f"{base}, {column}", [(m, curves(f"{setting}/{m}"))
                                              for m in (base, f"{base}+fedwalk")])
                       for setting, column in zip(settings, columns) for base in BASES], out)


def has_table300(results: dict) -> bool:
    """Whether the 300-round table is complete (every base, alone and + FedWalk, both columns, each of
    ``TABLE_SEEDS``): only then does it replace the 50-round one as the decisive table and curves."""
    return all(name in results for name, _, _ in table300_jobs(TABLE_SEEDS, BASES))


def decisive_table(results: dict) -> str:
    """The table the decisive claims and curves come from: the pre-trained one once complete over
    ``TABLE_SEEDS`` (as the paper runs Table 2), else the 300-round one once complete, else the 50-round
    one."""
    if all(name in results for name, _, _ in table_pretrained_jobs(TABLE_SEEDS, BASES)):
        return "cifar10_pretrained"
    return "cifar10_300" if has_table300(results) else "cifar10"


def decisive(results: dict | None = None, seeds=None, resnet: dict | None = None) -> Decisive:
    """Table 2 on CIFAR-10: "X + FedWalk beats X" for the four bases, at the paper's 300 rounds once that
    table is complete (:func:`has_table300`), else at 50; from the ResNet-18 of ``RESNET_RUNS`` once its
    pre-trained table is complete (the paper's model). ``results`` and ``resnet`` as ``finished`` gives them
    (default: from the committed records); ``seeds``: every seed that ran (default)."""
    if results is None:
        seeds = seeds or report_seeds(REPO / "runs" / "fedwalk")
        jobs = [*table_jobs(seeds), *table300_jobs(seeds, BASES), *table_pretrained_jobs(seeds, BASES)]
        results = finished(REPO / "runs" / "fedwalk", jobs)
        resnet = finished(REPO / "runs" / RESNET_RUNS, table_pretrained_jobs(seeds, BASES))
    seeds = seeds or sorted({int(m.group(1)) for name in results if (m := re.search(r"/seed(\d+)$", name))})
    page = "fedwalk_claims.md"
    if resnet and decisive_table(resnet) == "cifar10_pretrained":
        results, page = resnet, f"{RESNET_RUNS}/fedwalk_claims.md"
    table = decisive_table(results)
    rounds = 50 if table == "cifar10" else PAPER_ROUNDS
    leash = (f"pre-trained {PRETRAINED_STEPS} steps on the leash set (20 CIFAR-100 classes) in place of "
             "ImageNet")
    model = (f"{pretrained_model(results)} {leash}" if table == "cifar10_pretrained" else
             "a simple-CNN trained from scratch in place of the pre-trained ResNet-18")
    claims = table2_claims(results, seeds, table)
    if table != "cifar10_pretrained" and rounds == PAPER_ROUNDS:
        claims, pretrained = prefer_pretrained(claims, table2_claims(results, seeds, "cifar10_pretrained"))
        if pretrained:
            model += f"; {', '.join(pretrained)} from {pretrained_model(results)} {leash}, as the claims say"
    return Decisive("FedWalk (The Dog Walking Theory), Table 2, CIFAR-10", page,
                    "100 clients, 20 a round, 5 local steps of 32, ResNet-18 pre-trained on ImageNet, "
                    f"{PAPER_ROUNDS} rounds",
                    f"the paper's federation and local work, {rounds} rounds "
                    f"({round(100 * rounds / PAPER_ROUNDS)} % of its client steps), {model}",
                    claims)


def pretrained_model(results: dict) -> str:
    """The model the pre-trained table's runs trained, with its article ("a simple-CNN"): each run's
    ``model.name`` (its record's config, nested as in ``config.yaml``), else the one the table's config files
    name."""
    default = load_config(CONFIGS / SETTINGS["dir0.1"]).model.name
    names = sorted({r.get("config", {}).get("model", {}).get("name", default)
                    for name, r in results.items() if name.startswith("table_pt/")} or {default})
    return "a " + " or ".join(MODEL_NAMES.get(n, n) for n in names)


def prefer_pretrained(scratch: list[Claim], pretrained: list[Claim]) -> tuple[list[Claim], list[str]]:
    """Each claim from the pre-trained table where two seeds or more pair there (as the paper runs Table 2),
    else from ``scratch`` (the same claims, in the same order), its text saying which; and the bases taken
    pre-trained. Both tables run the paper's 300 rounds and schedule."""
    chosen, bases = [], []
    for at_scratch, at_pretrained in zip(scratch, pretrained, strict=True):
        pairs = set(at_pretrained.method) & set(at_pretrained.base)
        use = len(pairs) >= 2
        claim = at_pretrained if use else at_scratch
        start = "pre-trained" if use else "from scratch"
        chosen.append(dataclasses.replace(claim, text=f"{claim.text}, {start}"))
        base = claim.text.split(" + ")[0]
        if use and base not in bases:
            bases.append(base)
    if not bases:
        return scratch, []
    return chosen, bases


def plot_sweep(results: dict, path: Path) -> bool:
    """The tau sweeps' best test accuracy against tau, beside FedAvg's (seed 0). Returns whether any sweep
    point was found; with none, nothing is written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweeps = [("T_s = 1 (the paper's)", [("LH", [(t, f"sweep/LH/tau{t:g}") for t in TAUS])]),
              (f"T_s = {STRONG_STEPS}", [(g, [(t, strong_sweep_key(g, t)) for t in STRONG_TAUS])
                                         for g in GRADES])]
    if not any(k in results for _, lines in sweeps for _, points in lines for _, k in points):
        return False
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    series = [(ax, title, lines) for ax, (title, lines) in zip(axes, sweeps)]
    fedavg = results.get("table/dir0.1/fedavg/seed0")
    for ax, title, lines in series:
        for grade, points in lines:
            xy = [(t, results[k]["summary"]["best_test_accuracy"]) for t, k in points if k in results]
            if xy:
                ax.plot(*zip(*xy), marker="o", label=f"FedWalk ({grade})")
        if fedavg:
            ax.axhline(fedavg["summary"]["best_test_accuracy"], color="gray", linestyle="--", label="FedAvg")
        ax.set_xlabel("tau")
        ax.set_title(f"CIFAR-10 Dir(0.1), seed 0, {title}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("best test accuracy")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def all_jobs(seeds) -> list:
    """Every run the report reads, at ``seeds``."""
    return (list(table_jobs(seeds)) + list(sweep_jobs(GRADES)) + list(pretrained_jobs(seeds))
            + list(table_jobs(seeds, SETTINGS100)) + list(table300_jobs(seeds, BASES))
            + list(table_pretrained_jobs(seeds, BASES)))


def report_seeds(runs: Path, asked=()) -> list[int]:
    """The seeds the report covers: every seed with a finished run under ``runs`` (records included) and
    those ``asked``, ``TABLE_SEEDS`` at least."""
    return sorted(set(seeds_on_disk(collect(runs, KEEP), list(TABLE_SEEDS))) | set(TABLE_SEEDS) | set(asked))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", nargs="+", default=["table", "sweep", "pretrained"],
                    choices=["table", "sweep", "pretrained", "table100", "table300", "table_pretrained"])
    ap.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                    help="overrides for every run, e.g. model.name=resnet18 (the records keep them)")
    ap.add_argument("--bases", nargs="+", default=list(BASES), choices=list(BASES),
                    help="the methods of the 300-round table (each alone and + FedWalk)")
    ap.add_argument("--report-only", action="store_true", help="rewrite the report from the finished runs")
    ap.add_argument("--reverse", action="store_true", help="take the jobs last first (for a second process)")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(TABLE_SEEDS),
                    help="the seeds to run (the report covers every seed that ran)")
    ap.add_argument("--runs", default="runs/fedwalk")
    ap.add_argument("--out", default=str(REPO / "docs" / "reproductions"))
    args = ap.parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)

    def report() -> None:
        seeds = report_seeds(Path(args.runs), args.seeds)
        write_report(finished(Path(args.runs), all_jobs(seeds)), args, seeds)

    if args.report_only:
        report()
        return
    table = list(table_jobs(args.seeds)) if "table" in args.parts else []
    sweep = list(sweep_jobs(GRADES)) if "sweep" in args.parts else []
    pretrained = list(pretrained_jobs(args.seeds)) if "pretrained" in args.parts else []
    # Seed 0 of the table and the sweeps first, then the other seeds: an interrupted job still leaves a first
    # look at every figure.
    first = [j for j in table if j[0].endswith("seed0")]
    table100 = list(table_jobs(args.seeds, SETTINGS100)) if "table100" in args.parts else []
    table300 = list(table300_jobs(args.seeds, args.bases)) if "table300" in args.parts else []
    table_pt = (list(table_pretrained_jobs(args.seeds, args.bases)) if "table_pretrained" in args.parts
                else [])
    jobs = first + sweep + pretrained + [j for j in table if j not in first] + table100 + table300 + table_pt
    for name, config_file, overrides in reversed(jobs) if args.reverse else jobs:
        run(Path(args.runs), name, config_file, overrides + args.set)
        report()


if __name__ == "__main__":
    sys.exit(run_script(main))
