"""What the reproduction scripts (``benchmarks/*_table.py``) share: running each cell once, with several copies
of a script sharing the work, and finding what has run.

A run goes to ``<runs>/<name>``. It is skipped when its ``summary.json`` exists (it finished before) or when another
copy of the script holds its claim file ``<runs>/.claims/<name with / as __>``. A claim is released when its run
ends, also when it fails, so an interrupted script leaves nothing that blocks a later one; a copy killed outright
leaves its claim behind, and ``rm -r <runs>/.claims`` clears it.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from fedjax_lab.experiments import Config, run_experiment


def run_once(runs: Path, name: str, config: Config) -> tuple[dict[str, Any], float] | None:
    """Runs ``config`` into ``runs/name`` unless it has finished or another copy claimed it.

    Returns:
      ``(summary, seconds)`` of a run made now, or None when it was skipped.
    """
    run_dir = runs / name
    if (run_dir / "summary.json").is_file():
        return None
    claim = runs / ".claims" / name.replace("/", "__")
    claim.parent.mkdir(parents=True, exist_ok=True)
    try:
        claim.open("x").close()
    except FileExistsError:
        return None
    start = time.perf_counter()
    try:
        summary = run_experiment(config, run_dir, overwrite=True, progress=False)
    finally:
        claim.unlink(missing_ok=True)
    return summary, time.perf_counter() - start


def seeds_on_disk(runs: Path, default: list[int]) -> list[int]:
    """Every seed with a finished run under ``runs`` (``.../seed<k>/summary.json``), or ``default`` if none: the
    report covers what has run, not only what one invocation asked for."""
    found = {int(m.group(1)) for path in runs.glob("**/seed*/summary.json")
             if (m := re.fullmatch(r"seed(\d+)", path.parent.name))}
    return sorted(found) or list(default)


def datasets_on_disk(runs: Path, known) -> list[str]:
    """The datasets of ``known`` (in its order) with a folder of runs under ``runs``."""
    return [d for d in known if (runs / d).is_dir()]
