"""The command line: ``fedjax-lab run CONFIG [key=value ...]``, ``fedjax-lab sweep CONFIG key=v1,v2 ...``,
``fedjax-lab partition CONFIG [key=value ...]`` and ``fedjax-lab plot RUN_DIR ...``."""

from __future__ import annotations

import argparse
import math
import shlex
import signal
import sys
from pathlib import Path

from fedjax_lab.experiments import signals
from fedjax_lab.experiments.config import ConfigError, distributed_settings, load_config, split_grid_args
from fedjax_lab.experiments.signals import RunInterrupted

LARGE_GRID = 256
"""Grids with more members than this run only with ``--yes``."""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedjax-lab", description="Federated-learning simulations in JAX.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run (or resume) an experiment from a YAML config")
    run.add_argument("config", help="path to a YAML config, e.g. configs/synthetic_fedavg.yaml")
    run.add_argument("overrides", nargs="*", help="dotted.key=value overrides, e.g. "
                                                  "client.learning_rate=0.05")
    run.add_argument("--run-dir", help="where results go (default: runs/<config name>)")
    run.add_argument("--resume", action="store_true", help="continue from the run directory's latest "
                                                           "checkpoint")
    run.add_argument("--overwrite", action="store_true", help="replace an existing run in the run directory")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    sweep = sub.add_parser("sweep", help="run a grid of seeds and hyper-parameters, as one program where it "
                                         "can")
    sweep.add_argument("config", help="path to a YAML config")
    sweep.add_argument("items", nargs="*", help="grid axes key=v1,v2,... (e.g. seed=0,1,2,3 "
                                                "client.learning_rate=0.01,0.05) and plain key=value "
                                                "overrides")
    sweep.add_argument("--sweep-dir", help="where the members' run directories and the table go "
                                           "(default: runs/<config name>_sweep)")
    sweep.add_argument("--resume", action="store_true", help="continue every member from its latest "
                                                             "checkpoint")
    sweep.add_argument("--overwrite", action="store_true", help="replace an existing sweep")
    sweep.add_argument("--chunk", type=_positive_int, help="members vmapped at once, >= 1 (default: the "
                                                           "fastest way, measured once and cached; with "
                                                           "rounds.layout=rules all on an accelerator, on "
                                                           "CPU 8 for dense models, separate runs for CNNs)")
    sweep.add_argument("--yes", action="store_true", help=f"run a grid of more than {LARGE_GRID} members")
    sweep.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    part = sub.add_parser("partition", help="build a config's clients and report them, without training")
    part.add_argument("config", help="path to a YAML config")
    part.add_argument("overrides", nargs="*", help="dotted.key=value overrides, e.g. "
                                                   "dataset.partition.alpha=0.1")
    part.add_argument("--out", default="partition", help="folder for partition.{npz,md,png} (default: "
                                                         "partition/)")
    plot = sub.add_parser("plot", help="overlay the learning curves of one or more runs")
    plot.add_argument("run_dirs", nargs="+", help="run directories")
    plot.add_argument("--out", default="curves.png", help="output PNG (default: curves.png)")
    plot.add_argument("--labels", nargs="*", help="legend labels, one per run directory")
    plot.add_argument("--staleness", action="store_true", help="also plot the asynchronous runs' arrivals "
                                                              "and staleness (OUT_staleness.png)")
    data = sub.add_parser("data", help="build the offline dataset archives from the official files")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    prepare = data_sub.add_parser("prepare", help="build NAME's archive from its official files, verified by "
                                                  "MD5")
    prepare.add_argument("name", help="mnist, fashion_mnist, cifar10 or cifar100")
    prepare.add_argument("--from", dest="source", help="a folder holding the official files (or the one "
                                                       "file); default: download them")
    prepare.add_argument("--data-dir", help="where the archive goes (default: $FEDJAX_LAB_DATA or "
                                            "../shared/data); runs read it with dataset.data_dir=DIR")
    prepare.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    reference = sub.add_parser("reference", help="print the config fields (configs) or the methods (methods)")
    reference.add_argument("what", choices=["configs", "methods"])
    return parser


def _data(args) -> int:
    from fedjax_lab.data.files import DataFileError
    from fedjax_lab.data.prepare import OFFICIAL, prepare

    if args.name not in OFFICIAL:
        raise ConfigError(f"data prepare: no official files known for {args.name!r}; known: "
                          f"{', '.join(OFFICIAL)}")
    try:
        out = prepare(args.name, args.source, args.data_dir, progress=not args.no_progress)
    except DataFileError as error:
        raise ConfigError(str(error)) from None
    where = f" dataset.data_dir={args.data_dir}" if args.data_dir else ""
    print(f"wrote {out}; runs read it with dataset.name={args.name}{where}")
    return 0


def _reference(args) -> int:
    from fedjax_lab.experiments.reference import config_reference, methods_reference

    print({"configs": config_reference, "methods": methods_reference}[args.what](), end="")
    return 0


def _use_cpu_cores(args) -> None:
    """One CPU device per core (``parallel.devices: auto`` splits the cohort over them), in a process of our
    own only: a test or a notebook calling :func:`main` keeps the devices it has."""
    if args.own_process:
        from fedjax_lab.engine.sharding import use_cpu_cores

        use_cpu_cores()


def _run(args) -> int:
    config = load_config(args.config, args.overrides)  # validated before anything is built or compiled
    distributed_settings(config.parallel)  # the environment's settings too
    run_dir = Path(args.run_dir or Path("runs") / Path(args.config).stem)
    _use_cpu_cores(args)
    from fedjax_lab.experiments.runner import run_experiment  # imports JAX; deferred so bad configs fail fast

    summary = run_experiment(config, run_dir, resume=args.resume, overwrite=args.overwrite,
                             progress=not args.no_progress)
    final = summary["final"]
    if summary.get("diverged"):
        print(f"fedjax-lab: the run diverged ({summary['diverged']}); best test accuracy before that "
              f"{summary['best_test_accuracy']:.4f} at round {summary['best_round']}; results in {run_dir}/",
              file=sys.stderr)
        return EXIT_DIVERGED
    if failed := summary.get("collapsed") or summary.get("at_chance"):
        print(f"fedjax-lab: warning: {failed}; best test accuracy "
              f"{summary['best_test_accuracy']:.4f} at round {summary['best_round']}", file=sys.stderr)
    speed = (f"{summary['rounds_per_second']:.2f} rounds/s" if summary.get("rounds_per_second")
             else "no rounds run")
    print(f"round {summary['rounds']}: test accuracy {final['test_accuracy']:.4f}, test loss "
          f"{final['test_loss']:.4f}; best {summary['best_test_accuracy']:.4f} at round "
          f"{summary['best_round']}; {speed} on {summary['backend']}")
    print(f"results in {run_dir}/ (metrics.jsonl, summary.json, curves.png)")
    return 0


def _sweep(args) -> int:
    grid, overrides = split_grid_args(args.items)
    config = load_config(args.config, overrides)
    distributed_settings(config.parallel)
    sweep_dir = Path(args.sweep_dir or Path("runs") / f"{Path(args.config).stem}_sweep")
    if not grid:
        raise ConfigError("sweep: give at least one grid axis key=v1,v2,..., e.g. seed=0,1,2")
    size = math.prod(len(values) for values in grid.values())
    if size > LARGE_GRID and not args.yes:
        raise ConfigError(f"sweep: the grid has {size} members "
                          f"({' x '.join(str(len(v)) for v in grid.values())}), more than {LARGE_GRID}; pass "
                          "--yes to run them all")
    if (sweep_dir / "sweep.json").exists() and not (args.resume or args.overwrite):
        raise ConfigError(f"sweep directory {sweep_dir} already holds a sweep; pass --resume or --overwrite")
    _use_cpu_cores(args)
    from fedjax_lab.experiments.sweep import expand, run_sweep

    expand(config, grid)  # every member validated (and distinct) before JAX starts
    try:
        summary = run_sweep(config, grid, sweep_dir, resume=args.resume, overwrite=args.overwrite,
                            progress=not args.no_progress, member_chunk=args.chunk)
    except RunInterrupted as interrupted:
        options = [*(["--chunk", str(args.chunk)] if args.chunk else []), *(["--yes"] if args.yes else [])]
        command = " ".join(shlex.quote(a) for a in ["fedjax-lab", "sweep", args.config, *args.items,
                                                    "--sweep-dir", str(sweep_dir), *options, "--resume"])
        raise RunInterrupted(interrupted.run_dir, interrupted.last_round, interrupted.signum,
                             resume=command) from None
    print((sweep_dir / "sweep.md").read_text())
    print(f"results in {sweep_dir}/ (one run directory per member, sweep.md, sweep.json, curves.png)")
    return EXIT_DIVERGED if any(m["diverged"] for m in summary["members"]) else 0


def _partition(args) -> int:
    config = load_config(args.config, args.overrides)
    from fedjax_lab.data.report import write_partition_report
    from fedjax_lab.experiments.datasets import build_dataset

    dataset = build_dataset(config)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(dataset.summary())
    print(write_partition_report(dataset, out, {"seed": config.seed}))
    print(f"written: {out}/partition.npz (reload with dataset.partition.file), partition.md, partition.png")
    return 0


def _plot(args) -> int:
    from fedjax_lab.experiments.plots import plot_runs

    if args.labels and len(args.labels) != len(args.run_dirs):
        raise ConfigError(f"--labels needs one label per run directory ({len(args.run_dirs)}), got "
                          f"{len(args.labels)}")
    for run_dir in args.run_dirs:
        if not (Path(run_dir) / "metrics.jsonl").exists():
            raise ConfigError(f"{run_dir} holds no metrics.jsonl; is it a run directory?")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    print(plot_runs(args.run_dirs, args.out, args.labels))
    if args.staleness:
        from fedjax_lab.experiments.plots import plot_staleness

        print(plot_staleness(args.run_dirs, Path(args.out).with_name(Path(args.out).stem + "_staleness.png"),
                             args.labels))
    return 0


EXIT_CONFIG, EXIT_DIVERGED, EXIT_RUN_FAILED, EXIT_INTERRUPTED = 2, 3, 4, 130


def main(argv: list[str] | None = None) -> int:
    """The ``fedjax-lab`` command; returns the exit status (0 done, 2 bad input, 3 diverged, 4 the run could
    not go on: a file could not be written or read back, 130 interrupted by Ctrl-C, 143 by SIGTERM;
    docs/reliability.md).
    """
    program = argv is None  # the process is ours (not a test or a notebook calling main)
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    signals.EXIT_ON_SECOND_SIGNAL = program
    args.own_process = program
    # Overrides may also come after options (``run c.yaml --no-progress seed=3``); argparse leaves those over.
    listed = "overrides" if hasattr(args, "overrides") else "items" if hasattr(args, "items") else None
    stray = [item for item in extra if item.startswith("-") or "=" not in item or listed is None]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if extra:
        setattr(args, listed, [*getattr(args, listed), *extra])
    try:
        return {"run": _run, "sweep": _sweep, "partition": _partition, "plot": _plot, "data": _data,
                "reference": _reference}[args.command](args)
    except ConfigError as error:
        print(f"fedjax-lab: error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    except RunInterrupted as interrupted:
        for signum in signals.SIGNALS if program else ():  # results written: a further Ctrl-C ends it at once
            signal.signal(signum, signals.exit_at_once)
        print(f"fedjax-lab: {interrupted}", file=sys.stderr)
        return 128 + interrupted.signum
    except KeyboardInterrupt:  # before a run started (its own Ctrl-C becomes RunInterrupted)
        print("fedjax-lab: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as error:
        where = f" at {error.filename}" if error.filename else ""
        resume = " and continue with --resume" if args.command in ("run", "sweep") else ""
        print(f"fedjax-lab: error: {error.strerror or error}{where}; "
              f"free space (or fix the permissions){resume}", file=sys.stderr)
        return EXIT_RUN_FAILED
    except Exception as error:
        from fedjax_lab.experiments.run_directory import RunDirectoryError

        if isinstance(error, RunDirectoryError):
            print(f"fedjax-lab: error: {error}", file=sys.stderr)
            return EXIT_RUN_FAILED
        raise


if __name__ == "__main__":
    sys.exit(main())
