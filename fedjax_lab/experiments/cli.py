"""The command line: ``fedjax-lab run CONFIG [key=value ...]``, ``fedjax-lab partition CONFIG [key=value ...]``
and ``fedjax-lab plot RUN_DIR ...``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedjax_lab.experiments.config import ConfigError, load_config


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedjax-lab", description="Federated-learning simulations in JAX.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run (or resume) an experiment from a YAML config")
    run.add_argument("config", help="path to a YAML config, e.g. configs/synthetic_fedavg.yaml")
    run.add_argument("overrides", nargs="*", help="dotted.key=value overrides, e.g. client.learning_rate=0.05")
    run.add_argument("--run-dir", help="where results go (default: runs/<config name>)")
    run.add_argument("--resume", action="store_true", help="continue from the run directory's latest checkpoint")
    run.add_argument("--overwrite", action="store_true", help="replace an existing run in the run directory")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    part = sub.add_parser("partition", help="build a config's clients and report them, without training")
    part.add_argument("config", help="path to a YAML config")
    part.add_argument("overrides", nargs="*", help="dotted.key=value overrides, e.g. dataset.partition.alpha=0.1")
    part.add_argument("--out", default="partition", help="folder for partition.{npz,md,png} (default: partition/)")
    plot = sub.add_parser("plot", help="overlay the learning curves of one or more runs")
    plot.add_argument("run_dirs", nargs="+", help="run directories")
    plot.add_argument("--out", default="curves.png", help="output PNG (default: curves.png)")
    plot.add_argument("--labels", nargs="*", help="legend labels, one per run directory")
    return parser


def _run(args) -> int:
    config = load_config(args.config, args.overrides)  # validated before anything is built or compiled
    run_dir = Path(args.run_dir or Path("runs") / Path(args.config).stem)
    from fedjax_lab.experiments.runner import run_experiment  # imports JAX; deferred so bad configs fail fast

    summary = run_experiment(config, run_dir, resume=args.resume, overwrite=args.overwrite,
                             progress=not args.no_progress)
    final = summary["final"]
    print(f"round {summary['rounds']}: test accuracy {final['test_accuracy']:.4f}, test loss "
          f"{final['test_loss']:.4f}; best {summary['best_test_accuracy']:.4f} at round {summary['best_round']}; "
          f"{summary['rounds_per_second']:.2f} rounds/s on {summary['backend']}")
    print(f"results in {run_dir}/ (metrics.jsonl, summary.json, curves.png)")
    return 0


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
        raise ConfigError(f"--labels needs one label per run directory ({len(args.run_dirs)}), got {len(args.labels)}")
    for run_dir in args.run_dirs:
        if not (Path(run_dir) / "metrics.jsonl").exists():
            raise ConfigError(f"{run_dir} holds no metrics.jsonl; is it a run directory?")
    print(plot_runs(args.run_dirs, args.out, args.labels))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return {"run": _run, "partition": _partition, "plot": _plot}[args.command](args)
    except ConfigError as error:
        print(f"fedjax-lab: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
