"""Feddle's Table 5 (small CNN from scratch), its Table 3 ablation and its lambda and M trends, at CPU scale
or the paper's.

Every method of Table 5 on ``configs/feddle/cpu_<dataset>{,_ood}.yaml`` (the federation of
``configs/async/cpu_<dataset>.yaml``: 500 clients, 10 dispatched a round, the small CNN, Adam clients with 5
steps of 32, 100 rounds), in the paper's two groups:

* with in-domain server data (1000 test rows, evaluation on the rest): Center, Fed+FT, HFCL, FedDF-ID,
  Feddle-ID;
* without: FedAvg, FedAsync, FedBuff, CA2FL, and with out-of-domain server data FedDF-OOD, Feddle-OOD.

FedDF at two rates of the paper's grid: 1e-3, its top, and 1e-5, its best here (``--part feddf_lr``); at the
paper's scale also at 1e-5 with FedBuff's tuned server rate (``feddf_id_tuned``, ``feddf_ood_tuned``).

A cell is the best of the last five evaluations (every 10 rounds), mean ± std (the sample standard deviation,
ddof 1) over the seeds, as the paper reports. Runs go to
``runs/feddle/<dataset>/dir<alpha>/N<sigma>/<method>/seed<k>``; finished runs are reused, and several copies
of the script share the work (a claim file per run). Writes ``docs/reproductions/feddle_tables.md`` and its
figures, and ``docs/reproductions/feddle_claims.md``: each claim of the paper the tables test ("Feddle
consistently outperforms all baselines", per column; the ablation's steps), judged by the paired difference
over seeds and its 95 % interval (held, not held or unresolved).

``--scale paper`` runs the paper's client work instead: 2 local epochs of 32 and 200 rounds (a GPU's job),
into ``runs/feddle_paper`` with its records in ``feddle_paper.jsonl.gz`` and its pages
``feddle_paper_tables.md`` and ``feddle_paper_claims.md``; the summary page judges a claim there once two
seeds pair. There FedBuff, CA2FL, FedAsync and Feddle's FedBuff fallback take the settings tuned on the
paper's grids (``TUNING``, ``--part tune``: each point's runs in a folder of their own), as the paper tuned
each method once on CIFAR-10.

Usage::

    python benchmarks/feddle_table.py                             # Fashion-MNIST, Dir(0.1), N(20) and N(5)
    python benchmarks/feddle_table.py --reverse                   # a second copy, from the other end
    python benchmarks/feddle_table.py --part ablation trends      # Table 3 and the lambda / M trends (seed 0)
    python benchmarks/feddle_table.py --part feddf_lr             # FedDF on the paper's lr grid (seed 0)
    python benchmarks/feddle_table.py --datasets cifar10 cifar100 --alphas 0.1 0.3   # the rest of Table 5
    python benchmarks/feddle_table.py --report                    # the report from finished runs only
    python benchmarks/feddle_table.py --claims                    # only the claims page
    python benchmarks/feddle_table.py --scale paper --datasets cifar10 --alphas 0.1 0.3 --sigmas 20
    python benchmarks/feddle_table.py --scale paper --part tune   # the server-rate grid (seed 0)
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from records import Keep
from table_runs import (
    CLAIMS_RULE,
    Claim,
    Decisive,
    Records,
    SeedValues,
    at_either_scale,
    backends,
    claims_table,
    collect,
    datasets_on_disk,
    evaluations,
    finished,
    has_runs,
    mean_std,
    metrics,
    ours_at_either_scale,
    plot_bands,
    records_of,
    run_once,
    run_script,
    seed_curves,
    seed_values,
    seeds_on_disk,
    write_report,
)

from fedjax_lab.experiments import load_config

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs" / "feddle"
# What the records keep beside the evaluated rows: the per-round metrics the report reads (the
# negative-coefficient figure, the probe cosines and FedDF's step norms, at the rounds with a server step).
KEEP = Keep(rounds=("server_steps", "update_norm", "feddle_negative_fraction", "feddle_probe_cosine",
                    "feddf_step_norm"))


def feddf(learning_rate: float) -> str:
    """FedDF's override: 10 distillation steps a server step at ``learning_rate`` (the paper's grid:
    FEDDF_RATES)."""
    return f"algorithm={{name: feddf, steps: 10, learning_rate: {learning_rate}}}"


# the grid's top rate, the table's first FedDF rows; 1e-5 is the grid's best (see feddf_lr)
FEDDF = feddf(1e-3)
# FedBuff's server rate tuned at the paper's scale (TUNING). FedDF buffers its updates as FedBuff does, so at
# the paper's scale its tuned rows take this eta_g with the best distillation rate; at CPU scale every method
# keeps eta_g = 1, so those rows exist at the paper's scale only (PAPER_SCALE_ONLY).
FEDBUFF_TUNED = ["algorithm.server_learning_rate=0.1"]


@dataclass(frozen=True)
class Scale:
    """A scale the tables run at: the overrides on the CPU-scale configs, and where its runs, records and
    pages go (``runs/<runs>``, ``<runs>.jsonl.gz``, ``<runs>_tables.md``, ``<runs>_claims.md``)."""

    name: str
    runs: str
    overrides: tuple[str, ...]
    work: str  # the clients' work and rounds, for the tables page
    ours: str  # the summary page's "ours"
    tuned: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # method -> settings (TUNING)

    @property
    def tables(self) -> str:
        return f"{self.runs}_tables.md"

    @property
    def claims(self) -> str:
        return f"{self.runs}_claims.md"


SCALES = {
    "cpu": Scale("cpu", "feddle", (),
                 "Adam clients (5 steps of 32, lr 1e-3), 100 rounds (the paper: 200 rounds, 2 epochs)",
                 "the paper's federation, delays and model, 100 rounds of 5 local steps: 34 % of its client "
                 "steps (2 epochs of B = 32 average 7.3 steps over its Dirichlet(0.1) clients)"),
    "paper": Scale("paper", "feddle_paper", ("client.local_steps=null", "client.local_epochs=2",
                                             "rounds.num_rounds=200"),
                   "Adam clients (2 local epochs of 32, lr 1e-3), 200 rounds (the paper's scale); FedBuff, "
                   "CA2FL, FedAsync and Feddle's FedBuff fallback at the settings tuned below",
                   "the paper's federation, delays, model and client work (100 % of its client steps)",
                   tuned={"fedbuff": FEDBUFF_TUNED,
                          "ca2fl": ["algorithm.server_learning_rate=0.1"],
                          "fedasync": ["algorithm.alpha=0.8", "algorithm.a=0.9"],
                          "feddle_id": ["algorithm.fallback_learning_rate=0.1"],
                          "feddle_ood": ["algorithm.fallback_learning_rate=0.1"]}),
}


@dataclass(frozen=True)
class Grid:
    """One method's tuning grid at the paper's scale: each point sets ``settings`` to its values."""

    method: str
    settings: tuple[str, ...]
    points: tuple[tuple[float, ...], ...]
    folder: str  # a point's runs folder, formatted with its values

    def runs(self, point: tuple[float, ...]) -> str:
        """The runs folder of ``point``."""
        return self.folder.format(*point)

    def overrides(self, point: tuple[float, ...]) -> list[str]:
        """The settings of ``point``, as ``--set`` overrides."""
        return [f"{setting}={value}" for setting, value in zip(self.settings, point)]


# The server settings tuned at the paper's scale, as the paper tuned each method once on CIFAR-10 (App. D;
# the grid {0.01, 0.1, 1} of FedBuff's and CA2FL's eta_g, buffer 10; FedAsync's alpha {0.2, 0.4, 0.8} by a
# {0.1, 0.5, 0.9}), on Dir(0.1)/N(20), seed 0, the best of the last five evaluations deciding. Feddle's
# fallback is FedBuff (its eta_g unreported): the grid's two upper rates. Each point's runs have a folder (and
# records) of their own; the table's seed-0 cells at the tuned points hold copies of the grid's records.
ETA_G = ("algorithm.server_learning_rate",)
TUNING = [Grid("fedbuff", ETA_G, ((0.01,), (0.1,), (1.0,)), "feddle_paper_eta{}"),
          Grid("ca2fl", ETA_G, ((0.1,), (1.0,)), "feddle_paper_eta{}"),
          Grid("feddle_id", ("algorithm.fallback_learning_rate",), ((0.1,), (1.0,)), "feddle_paper_fb{}"),
          Grid("fedasync", ("algorithm.alpha", "algorithm.a"),
               tuple((alpha, a) for alpha in (0.2, 0.4, 0.8) for a in (0.1, 0.5, 0.9)),
               "feddle_paper_fedasync_alpha{}_a{}")]
PAPER_SCALE_ONLY = ("feddf_id_tuned", "feddf_ood_tuned")
# method -> (label, server data: id | ood | none, overrides)
METHODS = {
    "center": ("Center", "id", ["algorithm={name: server_only}", "asynchrony=null",
                                "rounds.clients_per_round=1"]),
    "fedft": ("Fed+FT", "id", ["algorithm={name: fedft}"]),
    "hfcl": ("HFCL", "id", ["algorithm={name: hfcl}"]),
    "feddf_id": ("FedDF-ID (lr 1e-3)", "id", [FEDDF]),
    "feddf_id_lr1e-5": ("FedDF-ID (lr 1e-5)", "id", [feddf(1e-5)]),
    "feddf_id_tuned": ("FedDF-ID (lr 1e-5, eta_g 0.1)", "id", [feddf(1e-5), *FEDBUFF_TUNED]),
    "feddle_id": ("**Feddle-ID**", "id", []),
    "fedavg": ("FedAvg", "none", ["algorithm={name: fedavg}"]),
    "fedasync": ("FedAsync", "none", ["algorithm={name: fedasync}"]),
    "fedbuff": ("FedBuff", "none", ["algorithm={name: fedbuff}"]),
    "ca2fl": ("CA2FL", "none", ["algorithm={name: ca2fl}"]),
    "feddf_ood": ("FedDF-OOD (lr 1e-3)", "ood", [FEDDF]),
    "feddf_ood_lr1e-5": ("FedDF-OOD (lr 1e-5)", "ood", [feddf(1e-5)]),
    "feddf_ood_tuned": ("FedDF-OOD (lr 1e-5, eta_g 0.1)", "ood", [feddf(1e-5), *FEDBUFF_TUNED]),
    "feddle_ood": ("**Feddle-OOD**", "ood", []),
}
COLUMNS = [(0.1, 20), (0.1, 5), (0.3, 20), (0.3, 5)]
LABELS = {"fashion_mnist": "Fashion-MNIST", "cifar10": "CIFAR-10", "cifar100": "CIFAR-100 superclasses"}
# "Feddle consistently outperforms all baselines" (App. F.2), bold per data availability: Feddle-ID against
# every method with in-domain data and every asynchronous baseline, Feddle-OOD against every method without
# in-domain data (the paper concedes Center beats it on CIFAR-10 Dir(0.1)/N(20)).
RIVALS = {"feddle_id": ["center", "fedft", "hfcl", "feddf_id", "feddf_id_lr1e-5", "feddf_id_tuned", "fedavg",
                        "fedasync", "fedbuff", "ca2fl"],
          "feddle_ood": ["fedavg", "fedasync", "fedbuff", "ca2fl", "feddf_ood", "feddf_ood_lr1e-5",
                         "feddf_ood_tuned"]}


def shown(method: str, scale: Scale) -> bool:
    """Whether ``method`` is a row of Table 5 at ``scale`` (see PAPER_SCALE_ONLY)."""
    return method not in PAPER_SCALE_ONLY or scale.name == "paper"


PAPER = {  # Table 5: dataset -> method -> the four columns (Center: one number)
    "cifar10": {
        "center": ["42.1±0.1"], "fedft": ["44.3±0.5", "47.4±0.2", "46.9±0.6", "51.3±0.6"],
        "hfcl": ["44.7±0.5", "47.1±0.4", "47.6±0.1", "51.2±1.1"],
        "feddf_id": ["18.0±1.0", "19.8±2.0", "37.3±1.2", "39.5±1.3"],
        "feddle_id": ["51.2±1.4", "52.9±0.3", "51.5±1.1", "53.3±0.6"],
        "fedavg": ["31.0±1.3", "35.0±3.8", "37.2±1.2", "52.0±2.6"],
        "fedasync": ["35.5±1.4", "40.4±0.2", "43.2±0.8", "45.7±3.1"],
        "fedbuff": ["26.8±3.3", "33.2±7.6", "32.6±4.1", "44.0±7.2"],
        "ca2fl": ["27.6±6.9", "36.6±2.7", "37.1±3.4", "43.9±4.5"],
        "feddf_ood": ["18.5±1.9", "19.4±1.9", "35.1±0.2", "39.3±1.4"],
        "feddle_ood": ["37.6±4.5", "42.3±1.6", "44.5±0.8", "53.1±2.5"]},
    "cifar100": {
        "center": ["23.3±0.5"], "fedft": ["26.2±0.7", "29.7±0.3", "27.0±0.3", "30.3±0.3"],
        "hfcl": ["28.9±0.4", "30.8±0.3", "29.3±0.4", "31.9±0.5"],
        "feddf_id": ["28.7±0.5", "29.3±0.6", "28.9±0.1", "29.1±0.2"],
        "feddle_id": ["32.7±0.6", "38.6±1.6", "38.0±0.7", "40.3±0.8"],
        "fedavg": ["21.7±2.2", "27.7±1.9", "25.9±1.2", "32.1±0.7"],
        "fedasync": ["24.3±1.2", "30.8±0.7", "27.0±1.1", "33.0±0.4"],
        "fedbuff": ["22.5±2.2", "31.5±2.4", "24.9±4.4", "31.1±2.5"],
        "ca2fl": ["22.3±0.7", "29.9±3.8", "25.2±3.2", "32.0±2.8"],
        "feddf_ood": ["24.1±0.4", "29.8±0.5", "27.1±0.4", "33.3±0.9"],
        "feddle_ood": ["31.9±1.8", "37.2±1.7", "36.9±1.4", "40.4±0.6"]},
    "fashion_mnist": {
        "center": ["82.6±0.9"], "fedft": ["84.5±0.2", "86.1±0.2", "85.1±0.0", "87.1±0.0"],
        "hfcl": ["84.4±0.4", "86.2±0.1", "85.2±0.3", "87.1±0.2"],
        "feddf_id": ["48.9±5.8", "44.0±5.0", "72.9±0.9", "71.7±4.9"],
        "feddle_id": ["86.5±0.2", "87.3±0.0", "86.4±0.2", "87.1±0.1"],
        "fedavg": ["60.8±4.4", "80.7±1.0", "81.1±0.7", "86.6±0.1"],
        "fedasync": ["78.4±2.2", "80.9±1.8", "83.4±0.6", "85.4±1.0"],
        "fedbuff": ["79.4±1.0", "82.4±1.5", "81.6±4.6", "85.4±1.0"],
        "ca2fl": ["78.9±0.9", "85.4±0.7", "82.1±2.7", "85.5±0.6"],
        "feddf_ood": ["47.4±6.8", "54.7±5.3", "71.9±0.4", "79.1±2.6"],
        "feddle_ood": ["81.4±2.4", "86.1±2.0", "85.1±0.8", "88.2±1.3"]},
}
for _rows in PAPER.values():  # the paper reports FedDF once, at its tuned rate: beside both of our rates
    for _rate in ("lr1e-5", "tuned"):
        _rows[f"feddf_id_{_rate}"], _rows[f"feddf_ood_{_rate}"] = _rows["feddf_id"], _rows["feddf_ood"]
NO_SEARCH_START = ["algorithm.fallback_init=false", "algorithm.regularization=0.0"]
ABLATION = [
    # Table 3, cumulative; the paper (ResNet18, CIFAR-10, Dir(0.1)/N(20)): (in-domain, out-of-domain)
    ("Base (FIFO, no normalisation, c from 0, lambda 0)",
     NO_SEARCH_START + ["algorithm.normalize=false", "algorithm.eviction=fifo"], ("81.9±0.7", "10.9±0.4")),
    ("+ anchor normalisation", NO_SEARCH_START + ["algorithm.eviction=fifo"], ("83.1±0.4", "7.7±0.4")),
    ("+ importance eviction", NO_SEARCH_START, ("84.2±0.1", "9.3±0.1")),
    ("+ fallback initialisation", ["algorithm.regularization=0.0"], ("86.3±0.4", "81.0±1.2")),
    ("+ fallback regularisation (lambda 0.01)", ["algorithm.regularization=0.01"], ("86.3±0.2", "82.2±1.4")),
]
LAMBDAS = [0.0, 0.01, 0.1]
ATLAS_SIZES = [10, 20, 40]
FEDDF_RATES = [1e-5, 1e-4, 1e-3]  # the paper's grid for FedDF's distillation (App. D); 1e-3 is the table's
PROBE = "algorithm.probe_examples=512"


def cell(values: list[float] | SeedValues, of: int | None = None) -> str:
    """A table cell: mean ± the sample standard deviation (ddof 1) over seeds, and how many runs failed
    (``table_runs.mean_std``)."""
    return mean_std(values, of=of, ddof=1)


def paper_mean(text: str) -> float:
    """The mean of a cell of the paper ("51.2±1.4" -> 51.2)."""
    return float(text.split("±")[0])


def cell_name(dataset: str, alpha: float, sigma: int) -> str:
    return f"{dataset}/dir{alpha}/N{sigma}"


def config_for(dataset: str, data: str) -> Path:
    if data == "none":
        return REPO / "configs" / "async" / f"cpu_{dataset}.yaml"
    return CONFIGS / f"cpu_{dataset}{'_ood' if data == 'ood' else ''}.yaml"


def run(runs: Path, name: str, config: Path, overrides: list[str], scale: Scale = SCALES["cpu"]) -> None:
    """Runs one experiment unless it has finished or another copy of this script claimed it."""
    done = run_once(runs, name, load_config(config, [*scale.overrides, *overrides]), KEEP)
    if done:
        print(f"{name:<60} test acc {done[0]['final']['test_accuracy']:.4f} ({done[1]:.0f} s)", flush=True)


def table_jobs(datasets, alphas, sigmas, seeds, methods, tuned: dict[str, list[str]] | None = None):
    """Table 5's runs: ``(name, config, overrides)``; ``tuned``: a scale's settings per method."""
    for seed in seeds:
        for dataset in datasets:
            for alpha in alphas:
                for sigma in sigmas:
                    for method in methods:
                        if method == "center" and (alpha, sigma) != (alphas[0], sigmas[0]):
                            continue  # Center uses no client: one run per seed
                        _, data, overrides = METHODS[method]
                        yield (f"{cell_name(dataset, alpha, sigma)}/{method}/seed{seed}",
                               config_for(dataset, data),
                               [f"dataset.partition.alpha={alpha}", f"asynchrony.sigma={sigma}",
                                f"seed={seed}", *overrides, *(tuned or {}).get(method, [])])


def tuning_jobs(dataset: str = "cifar10"):
    """The server-rate grid (:data:`TUNING`) on Dir(0.1)/N(20), seed 0: ``(runs folder, name, config,
    overrides)``."""
    for grid in TUNING:
        (name, config, overrides), = table_jobs([dataset], [0.1], [20], [0], [grid.method])
        for point in grid.points:
            yield grid.runs(point), name, config, [*overrides, *grid.overrides(point)]


def study_jobs(dataset: str, parts):
    """Table 3 and the trends on Dir(0.1)/N(20), seed 0, with the probe cosine (Fig. 7) on."""
    for data in ("id", "ood"):
        config = config_for(dataset, data)
        if "ablation" in parts:
            for k, (_, overrides, _) in enumerate(ABLATION):
                yield f"{dataset}/ablation/{data}/step{k}", config, overrides + [PROBE]
        if "trends" in parts or "lambda" in parts:
            for lam in LAMBDAS:
                if trend_run(dataset, "lambda", data, lam).startswith(f"{dataset}/lambda"):
                    yield (trend_run(dataset, "lambda", data, lam), config,
                           [f"algorithm.regularization={lam}", PROBE])
        if "trends" in parts or "atlas" in parts:
            for m in ATLAS_SIZES:
                if trend_run(dataset, "atlas", data, m).startswith(f"{dataset}/atlas"):
                    yield trend_run(dataset, "atlas", data, m), config, [f"algorithm.atlas_size={m}", PROBE,
                                                                         f"algorithm.regularization={REGULARIZATION[data]}"]


REGULARIZATION = {"id": 0.0, "ood": 0.01}  # the paper's defaults


def feddf_jobs(dataset: str):
    """FedDF on the paper's learning-rate grid, Dir(0.1)/N(20), seed 0 (lr 1e-3 and 1e-5 are Table 5's
    runs)."""
    for data in ("id", "ood"):
        for lr in FEDDF_RATES:
            yield (feddf_run(dataset, data, lr), config_for(dataset, data),
                   ["dataset.partition.alpha=0.1", "asynchrony.sigma=20", "seed=0", feddf(lr)])


def feddf_run(dataset: str, data: str, lr: float) -> str:
    """The run of FedDF at ``lr``: Table 5's seed-0 cell for the rates it has rows for, else the grid's
    own."""
    rows = [m for m, (_, server, overrides) in METHODS.items() if server == data and overrides == [feddf(lr)]]
    return f"{cell_name(dataset, 0.1, 20)}/{rows[0]}/seed0" if rows else f"{dataset}/feddf_lr/{data}/{lr}"


def trend_run(dataset: str, study: str, data: str, value) -> str:
    """A trend's run, or the ablation's run with the same settings (lambda 0 / 0.01 are its last two steps,
    and M 20 at the default lambda one of them)."""
    if study == "lambda" and value in (0.0, 0.01):
        return f"{dataset}/ablation/{data}/step{3 if value == 0.0 else 4}"
    if study == "atlas" and value == 20:
        return f"{dataset}/ablation/{data}/step{3 if data == 'id' else 4}"
    return f"{dataset}/{study}/{data}/{value}"


def paper_metric(run_dir: Path) -> tuple[float, float] | None:
    """(best of the last five evaluations, final accuracy), in %; ``None`` for an unfinished run."""
    if (rows := evaluations(run_dir)) is None:
        return None
    accuracies = [r["test_accuracy"] for r in rows]
    return 100 * max(accuracies[-5:]), 100 * accuracies[-1]


def series(run_dir: Path, key: str) -> tuple[np.ndarray, np.ndarray]:
    rows = [r for r in metrics(run_dir) if key in r]
    return np.array([r["round"] for r in rows]), np.array([r[key] for r in rows])


def center_metric(runs: Path, dataset: str, seed: int) -> tuple[float, float] | None:
    """Center's ``paper_metric``: it uses no client, so it runs once per seed, under the first column the
    script was asked for, whichever that was."""
    found = (paper_metric(runs / f"{cell_name(dataset, a, s)}/center/seed{seed}") for a, s in COLUMNS)
    return next((m for m in found if m is not None), None)


PRE_RECORDS = {  # ran at CPU scale before records were kept: (its runs' folder, what, the rerun's arguments)
    "fashion_mnist": [
        ("dir0.1/N20", "Table 5's Dir(0.1)/N(20) column", "--alphas 0.1 --sigmas 20"),
        ("dir0.1/N5", "Table 5's Dir(0.1)/N(5) column", "--alphas 0.1 --sigmas 5"),
        ("dir0.3/N20", "Table 5's Dir(0.3)/N(20) column", "--alphas 0.3 --sigmas 20"),
        ("ablation", "Table 3's ablation", "--part ablation"),
        ("atlas", "the M trend", "--part atlas"),
        ("lambda", "the lambda trend", "--part lambda"),
    ],
}
PRE_RECORDS_COMMIT = "59e9a7b"  # the last commit that wrote those numbers into feddle_tables.md


def pre_records_note(runs: Path, dataset: str, scale: Scale) -> list[str]:
    """A note naming what of ``dataset``'s CPU-scale page ran before records were kept and has no run with a
    record yet (a column counts once a method other than Center has run in it), with the commit that shows
    its numbers and the command that reruns it; nothing where all has rerun, or at the paper's scale."""
    if scale.name != "cpu":
        return []
    def rerun(folder: str) -> bool:
        if folder.startswith("dir"):  # a Table 5 column: by its methods (Center's runs sit in one column)
            return any(has_runs(runs / dataset / folder, f"{m}/*") for m in METHODS if m != "center")
        return has_runs(runs / dataset / folder, "*/*")  # a study: <id|ood>/<step or value>

    missing = [(what, args) for folder, what, args in PRE_RECORDS.get(dataset, []) if not rerun(folder)]
    if not missing:
        return []
    return [(f"Not in the committed records yet, run on {dataset} before records were kept: "
             f"{'; '.join(what for what, _ in missing)}. Their numbers are in this page's history "
             f"(`git show {PRE_RECORDS_COMMIT}:docs/reproductions/feddle_tables.md`); each reruns with "
             f"records by `python benchmarks/feddle_table.py --datasets {dataset}` with, in turn, "
             + ", ".join(f"`{args}`" for _, args in missing) + "."), ""]


def report(runs: Path, datasets, seeds, out: Path, scale: Scale = SCALES["cpu"]) -> None:
    """Table 5 beside the paper's rows per dataset, Table 3, the trends, and the figures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    title, command = (("CPU scale", "") if scale.name == "cpu"
                      else ("the paper's scale", f" --scale {scale.name}"))
    lines = [f"# Feddle at {title} (generated by `benchmarks/feddle_table.py{command}`)", "",
             f"Small CNN from scratch (`feddle_cnn`), 500 clients, 10 dispatched a round, {scale.work}. "
             "In-domain server data: "
             "1000 test rows, evaluation on the other 9000. Out-of-domain: 10,000 images of another dataset "
             "(MNIST for Fashion-MNIST, CIFAR-100 for CIFAR-10, CIFAR-10 for CIFAR-100) in place of the "
             "paper's ImageNet subset. FedDF distils for 10 Adam steps of 64 a server step. A cell: paper | "
             "ours, the best of the last five evaluations, mean ± std over seeds "
             + ", ".join(map(str, seeds)) + " (ours: the sample standard "
             "deviation, ddof 1); '-' is not run. Each claim judged over the seeds: "
             f"[{scale.claims}]({scale.claims}).", ""]
    if scale.tuned:
        lines += tuning_report()
    for dataset in datasets:
        if not has_runs(runs / dataset, "dir*"):
            lines += study_report(runs, dataset, out, plt, scale)
            continue
        lines += [f"## Table 5, {dataset}", "", (f"Runs: {backends(runs / dataset)} (each record's summary "
                  "names its backend; a GPU sums floats in another order, which moves a run by about what "
                  "a seed does)."), "",
                  *pre_records_note(runs, dataset, scale),
                  "| method | ID | " + " | ".join(f"Dir({a})/N({s}) paper | ours" for a, s in COLUMNS) + " |",
                  "|---|---|" + "---|---|" * len(COLUMNS)]
        for method, (label, data, _) in METHODS.items():
            if not shown(method, scale):
                continue
            row = []
            for k, (a, s) in enumerate(COLUMNS):
                paper = PAPER[dataset][method]
                if method == "center" and k:
                    row.append(" | ")
                    continue
                row.append(f"{paper[k]} | {cell(scores(runs, dataset, a, s, method, seeds), of=len(seeds))}")
            lines.append(f"| {label} | {'yes' if data == 'id' else 'no'} | " + " | ".join(row) + " |")
        lines.append("")
        figure = out.parent / f"{scale.runs}_negative_{dataset}.png"
        found = [(a, s, m) for a, s in COLUMNS for m in ("feddle_id", "feddle_ood")
                 if finished(runs / f"{cell_name(dataset, a, s)}/{m}/seed{seeds[0]}")]
        if found:
            fig, ax = plt.subplots(figsize=(7, 3.6))
            for a, s, m in found:
                x, y = series(runs / f"{cell_name(dataset, a, s)}/{m}/seed{seeds[0]}",
                              "feddle_negative_fraction")
                ax.plot(x, y, label=f"{METHODS[m][0].strip('*')} Dir({a})/N({s})", lw=1)
            ax.set(xlabel="round", ylabel="fraction of c < 0", title=f"Negative coefficients, {dataset}, "
                   f"seed {seeds[0]} (Fig. 6)", ylim=(0, 1))
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
            fig.tight_layout()
            fig.savefig(figure, dpi=110)
            plt.close(fig)
            lines += [f"![negative coefficients]({figure.name})", ""]
        lines += study_report(runs, dataset, out, plt, scale)
    written = write_report(out, "\n".join(lines) + "\n")
    print(f"wrote {written}")


def tuning_report() -> list[str]:
    """The tuning grid (:data:`TUNING`): each point's score and final accuracy, the tuned one marked."""
    lines = ["## Server settings, tuned on CIFAR-10 Dir(0.1)/N(20), seed 0", "",
             ("The paper tuned each method once on CIFAR-10 and reports neither the values nor the client "
              "recipe (App. D); ours: FedBuff's and CA2FL's eta_g on its grid {0.01, 0.1, 1} (buffer 10), "
              "Feddle's FedBuff fallback on the grid's upper two, and FedAsync's alpha {0.2, 0.4, 0.8} by a "
              "{0.1, 0.5, 0.9}, at the table's client recipe, the best of the last five evaluations "
              "deciding. FedAvg takes the full step (eta_g 1), as the paper writes it (Eq. 2). Each point's "
              "runs: `runs/<folder>` with `--runs runs/<folder> --set <setting>=<value>`, or all of them by "
              "`--scale paper --part tune`."), "",
             "| method | setting | value | best of last five | final | records | tuned |",
             "|---|---|---|---|---|---|---|"]
    for grid in TUNING:
        chosen = SCALES["paper"].tuned.get(grid.method, [])
        (name, _, _), = table_jobs(["cifar10"], [0.1], [20], [0], [grid.method])
        for point in grid.points:
            folder = grid.runs(point)
            got = paper_metric(Records(records_of(Path(folder))) / name)
            score = (f"{got[0]:.1f} | {got[1]:.1f}" if got else "- | -")
            tuned = "yes" if chosen and set(grid.overrides(point)) <= set(chosen) else ""
            lines.append(f"| {METHODS[grid.method][0].strip('*')} | "
                         f"{', '.join(f'`{k}`' for k in grid.settings)} | "
                         f"{', '.join(f'{v:g}' for v in point)} | {score} | `{folder}` | {tuned} |")
    return [*lines, ""]


def study_report(runs: Path, dataset: str, out: Path, plt, scale: Scale = SCALES["cpu"]) -> list[str]:
    """Table 3, the lambda and M trends and the probe-cosine figure (Fig. 7), where their runs exist."""
    def acc(name):
        got = paper_metric(runs / name)
        return f"{got[0]:.1f}" if got else "-"

    def cosine(name):
        y = [r["feddle_probe_cosine"] for r in metrics(runs / name) if r.get("server_steps", 0) > 0]
        return f"{np.mean(y):.2f}" if len(y) else "-"

    lines = []
    if has_runs(runs / f"{dataset}/ablation", "*/*"):
        lines += [f"## Table 3 (ablation), {dataset}, Dir(0.1)/N(20), seed 0", "",
                  ("| configuration | ID paper | ID ours | ID probe cosine | OOD paper | OOD ours | "
                   "OOD probe cosine |"),
                  "|---|---|---|---|---|---|---|"]
        for k, (label, _, (pid, pood)) in enumerate(ABLATION):
            lines.append(f"| {label} | {pid} | {acc(f'{dataset}/ablation/id/step{k}')} | "
                         f"{cosine(f'{dataset}/ablation/id/step{k}')} | {pood} | "
                         f"{acc(f'{dataset}/ablation/ood/step{k}')} | "
                         f"{cosine(f'{dataset}/ablation/ood/step{k}')} |")
        lines.append("")
        fig, axes = plt.subplots(1, 2, figsize=(12, 3.8), sharey=True)
        for ax, data, title in zip(axes, ("ood", "id"), ("out-of-domain search", "in-domain search")):
            for k in (0, 3, 4):
                rows = [r for r in metrics(runs / f"{dataset}/ablation/{data}/step{k}")
                        if r.get("server_steps", 0) > 0]
                if rows:
                    ax.plot([r["round"] for r in rows], [r["feddle_probe_cosine"] for r in rows], ".", ms=3,
                            label=ABLATION[k][0][:40])
            ax.set(xlabel="round", ylim=(-1.05, 1.05),
                   title=f"{title}: cos(search dc, test-rows dc) (Fig. 7)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        axes[0].set_ylabel("cosine at the search's start")
        fig.tight_layout()
        fig.savefig(out.parent / f"{scale.runs}_probe_cosine_{dataset}.png", dpi=110)
        plt.close(fig)
        lines += [f"![probe cosine]({scale.runs}_probe_cosine_{dataset}.png)", ""]
    for study, values, field in (("lambda", LAMBDAS, "lambda"), ("atlas", ATLAS_SIZES, "M")):
        if has_runs(runs / f"{dataset}/{study}", "*/*") or study == "lambda" and has_runs(
                runs / f"{dataset}/ablation", "*/*"):
            lines += [f"## {field} trend, {dataset}, Dir(0.1)/N(20), seed 0", "",
                      f"| {field} | " + " | ".join(map(str, values)) + " |", "|---|" + "---|" * len(values)]
            for data in ("id", "ood"):
                lines.append(f"| Feddle-{data.upper()} | "
                             + " | ".join(acc(trend_run(dataset, study, data, v)) for v in values) + " |")
            lines.append("")
    if has_runs(runs / f"{dataset}/feddf_lr", "*/*"):
        lines += [f"## FedDF's distillation learning rate, {dataset}, Dir(0.1)/N(20), seed 0", "",
                  ("A fresh Adam a server step takes steps of about the learning rate in every parameter, "
                   "also where the distillation loss is already near 0: the mean distance distillation moves "
                   "the model a server step, beside the mean norm of the buffered update it follows."), "",
                  "| FedDF | lr | accuracy | distillation's step (L2) | buffered update (L2) |",
                  "|---|---|---|---|---|"]
        for data in ("id", "ood"):
            for lr in FEDDF_RATES:
                name = feddf_run(dataset, data, lr)
                rows = [r for r in metrics(runs / name) if r.get("server_steps", 0) > 0]
                step = (f"{np.mean([r['feddf_step_norm'] for r in rows]):.2f}"
                        if rows and "feddf_step_norm" in rows[0] else "-")
                update = f"{np.mean([r['update_norm'] for r in rows]):.2f}" if rows else "-"
                lines.append(f"| {data.upper()} | {lr:g} | {acc(name)} | {step} | {update} |")
        lines.append("")
    return lines


def scores(runs: Path, dataset: str, alpha: float, sigma: int, method: str, seeds) -> SeedValues:
    """The table's number (best of the last five evaluations, %) of each seed's finished run of ``method`` in
    the column (alpha, sigma); Center's from whichever column it ran under."""
    if method == "center":
        return SeedValues({seed: got[0] for seed in seeds if (got := center_metric(runs, dataset, seed))})
    return seed_values(runs, f"{cell_name(dataset, alpha, sigma)}/{method}", seeds,
                       lambda run: None if (got := paper_metric(run)) is None else got[0])


ASYNCHRONOUS = ("fedavg", "fedasync", "fedbuff", "ca2fl")  # the baselines that see only the clients' updates


def plot_decisive_curves(runs, seeds, out: Path, dataset: str = "cifar10") -> bool:
    """Table 5's decisive comparison as curves: Feddle-ID and Feddle-OOD against the asynchronous baselines,
    one panel per column, with bands over seeds. Returns whether anything was drawn."""
    return plot_bands([(f"{LABELS[dataset]} Dir({a}), N({s})",
                        [(METHODS[m][0].strip("*"), seed_curves(runs / cell_name(dataset, a, s) / m, seeds))
                         for m in ("feddle_id", "feddle_ood", *ASYNCHRONOUS)]) for a, s in COLUMNS], out)


def decisive(records=None, paper=None) -> Decisive:
    """Table 5 on CIFAR-10: Feddle-ID and Feddle-OOD against the asynchronous baselines, in each column, at
    the paper's scale where two seeds or more pair there, else at CPU scale (``table_runs.at_either_scale``).
    ``records`` and ``paper``: the CPU and paper-scale records as ``collect`` returns them, or folders of run
    directories (default: the committed records)."""
    records = collect(REPO / "runs" / SCALES["cpu"].runs, KEEP) if records is None else records
    paper = collect(REPO / "runs" / SCALES["paper"].runs, KEEP) if paper is None else paper

    def table5(source) -> list[Claim]:
        seeds = seeds_on_disk(source / "cifar10", [0, 1, 2])
        return [Claim(f"{METHODS[method][0].strip('*')} beats {METHODS[rival][0]}, Dir({a})/N({s})",
                      paper_mean(PAPER["cifar10"][method][k]) - paper_mean(PAPER["cifar10"][rival][k]),
                      scores(source, "cifar10", a, s, method, seeds),
                      scores(source, "cifar10", a, s, rival, seeds), digits=1)
                for method in ("feddle_id", "feddle_ood") for k, (a, s) in enumerate(COLUMNS)
                for rival in ASYNCHRONOUS]

    found, from_paper = at_either_scale(table5(paper), table5(records))
    some = any(from_paper)
    ours = ours_at_either_scale(SCALES["paper"].ours, SCALES["cpu"].ours, from_paper)
    return Decisive("Feddle (Federated Dual Learning), Table 5, CIFAR-10",
                    SCALES["paper" if some else "cpu"].claims,
                    "500 clients, 10 dispatched a round, half-normal delays, CNN, 200 rounds of 2 "
                    "local epochs", ours, found,
                    at_scale="Feddle's CIFAR-10 Table 5 (in part)" if some else "")


def claims(runs: Path, datasets, seeds, out: Path, scale: Scale = SCALES["cpu"]) -> None:
    """Table 5's claims (Feddle against every baseline of its group, per column) and the ablation's (each
    component adds accuracy where the paper's Table 3 says it does), each judged by the paired difference over
    seeds (``table_runs.judge``), from the runs that have finished."""
    at, command = ("", "") if scale.name == "cpu" else (" at the paper's scale", f" --scale {scale.name}")
    lines = [f"# Feddle's claims{at}, judged over seeds (generated by `benchmarks/feddle_table.py{command}`)",
             "", CLAIMS_RULE, "",
             (f"Ours ({scale.work}): the best of the last five evaluations (%), the number "
              f"[{scale.tables}]({scale.tables}) shows, from the runs' records "
              f"(`benchmarks/results/records/{scale.runs}.jsonl.gz`). Center uses no client: its seed-k run "
              "pairs with every column's seed k. Claims no seed pairs for are listed under their table: "
              f"their runs predate the records or have not run (their cells in {scale.tables} come from "
              "those runs)."), ""]
    for dataset in datasets:
        if not has_runs(runs / dataset, "dir*"):
            continue
        for method, rivals in RIVALS.items():
            found = []
            for k, (a, s) in enumerate(COLUMNS):
                ours = scores(runs, dataset, a, s, method, seeds)
                for rival in filter(lambda m: shown(m, scale), rivals):
                    gain = paper_mean(PAPER[dataset][method][k]) - paper_mean(PAPER[dataset][rival][
                        0 if rival == "center" else k])
                    found.append(Claim(f"{METHODS[method][0].strip('*')} beats {METHODS[rival][0]}, "
                                       f"Dir({a})/N({s})",
                                       gain, ours, scores(runs, dataset, a, s, rival, seeds), digits=1))
            group = ("every method with in-domain data and every asynchronous baseline"
                     if method == "feddle_id" else "every method without in-domain data")
            lines += [f"## Table 5, {LABELS[dataset]}: {METHODS[method][0].strip('*')} beats {group}", "",
                      *claims_table(found), ""]
    for dataset in datasets:
        if not has_runs(runs / f"{dataset}/ablation", "*/*"):
            continue
        found = []
        for i, data in enumerate(("id", "ood")):
            for k in range(1, len(ABLATION)):
                gain = paper_mean(ABLATION[k][2][i]) - paper_mean(ABLATION[k - 1][2][i])
                if gain <= 0:
                    continue  # the paper's own table has this step level or lower: no claim
                now, before = (paper_metric(runs / f"{dataset}/ablation/{data}/step{j}") for j in (k, k - 1))
                found.append(Claim(f"{ABLATION[k][0]} beats the step before, "
                                   f"{'in' if data == 'id' else 'out of'} domain", gain,
                                   {0: now[0]} if now else {}, {0: before[0]} if before else {},
                                   digits=1, paper_note="(ResNet18, CIFAR-10)"))
        lines += [(f"## Table 3 (ablation), {LABELS[dataset]}, Dir(0.1)/N(20): each component adds accuracy "
                   "(seed 0; the steps where the paper's table shows a gain)"), "", *claims_table(found), ""]
    figure = out.with_name(f"{scale.runs}_curves.png")
    if plot_decisive_curves(runs, seeds, figure):
        lines += ["## The decisive curves", "",
                  f"![Feddle against the asynchronous baselines]({figure.name})", "",
                  (f"CIFAR-10, test accuracy against rounds, mean over seeds {', '.join(map(str, seeds))} "
                   "with a band of one sample standard deviation (ddof 1)."), ""]
    written = write_report(out, "\n".join(lines) + "\n")
    print(f"wrote {written}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=["fashion_mnist"], choices=list(PAPER))
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.1])
    parser.add_argument("--sigmas", type=int, nargs="+", default=[20, 5])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--part", nargs="+", default=["table"],
                        choices=["table", "ablation", "trends", "lambda", "atlas", "feddf_lr", "tune"],
                        help="tune: the server-rate grid of the paper's scale (TUNING), CIFAR-10")
    parser.add_argument("--scale", default="cpu", choices=list(SCALES),
                        help="cpu: 5 local steps, 100 rounds; paper: 2 local epochs, 200 rounds")
    parser.add_argument("--runs", help="default: runs/feddle (cpu) or runs/feddle_paper (paper)")
    parser.add_argument("--out", help="the tables page (default: docs/reproductions/<runs>_tables.md)")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="overrides for every run, e.g. a layout (the records keep them)")
    parser.add_argument("--reverse", action="store_true",
                        help="take the jobs in reverse order (a second copy)")
    parser.add_argument("--report", action="store_true", help="only write the report from finished runs")
    parser.add_argument("--claims", action="store_true", help="only write the claims page from finished runs")
    parser.add_argument("--claims-out", help="the claims page (default: docs/reproductions/<runs>_claims.md)")
    args = parser.parse_args(argv)
    scale = SCALES[args.scale]
    runs = Path(args.runs or REPO / "runs" / scale.runs)
    pages = REPO / "docs" / "reproductions"
    if not (args.report or args.claims):
        jobs = []
        if "tune" in args.part:
            if scale.name != "paper":
                parser.error("--part tune: the server-rate grid is the paper's scale's (--scale paper)")
            jobs += [(runs.parent / folder, *job) for folder, *job in tuning_jobs()]
        if "table" in args.part:
            methods = [m for m in args.methods if shown(m, scale)]
            if args.methods != list(METHODS) and methods != args.methods:
                parser.error(f"--methods: {[m for m in args.methods if m not in methods]} run at the paper's "
                             "scale only (--scale paper)")
            jobs += [(runs, *job) for job in table_jobs(args.datasets, args.alphas, args.sigmas, args.seeds,
                                                        methods, scale.tuned)]
        for dataset in args.datasets:
            jobs += [(runs, *job) for job in study_jobs(dataset, args.part)]
            jobs += [(runs, *job) for job in feddf_jobs(dataset)] if "feddf_lr" in args.part else []
        for where, name, config, overrides in reversed(jobs) if args.reverse else jobs:
            run(where, name, config, overrides + args.set, scale=scale)
    # One report for everything that has run, not only what this invocation asked for.
    grid = {g.runs(point) for g in TUNING for point in g.points} if scale.tuned else set()
    for folder in sorted(grid):
        collect(runs.parent / folder, KEEP)  # the grid's runs made here (or by hand) join their records
    records = collect(runs, KEEP)
    datasets, seeds = datasets_on_disk(records, PAPER), seeds_on_disk(records, args.seeds)
    if not args.claims:
        report(records, datasets, seeds, Path(args.out or pages / scale.tables), scale)
    claims(records, datasets, seeds, Path(args.claims_out or pages / scale.claims), scale)


if __name__ == "__main__":
    sys.exit(run_script(main))
