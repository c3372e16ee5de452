"""Where the test suite's time goes: each test's wall time and JAX's compilation events, by test and file.

A pytest plugin (the xdist workers load it too) and a report. Tests that run JAX operations one by one (eager)
compile a small program per operation; they show as tests with many compilations and are made fast by
compiling their computations whole (``jax.jit``). Time spent in subprocesses (notebooks, the CLI under a
signal) shows as wall time without compilations::

    PYTHONPATH=benchmarks python -m pytest -p suite_profile -p no:cacheprovider   # writes suite_profile.jsonl
    python benchmarks/suite_profile.py suite_profile.jsonl                          # the report

``SUITE_PROFILE`` names another output file.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import time
from pathlib import Path

import pytest

COMPILE = "/jax/core/compile/backend_compile_duration"
STAGES = {"trace": "/jax/core/compile/jaxpr_trace_duration",
          "lower": "/jax/core/compile/jaxpr_to_mlir_module_duration", "compile": COMPILE}
_events: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
_listening = False


def _listen(event: str, duration: float, **_) -> None:
    _events[event][0] += 1
    _events[event][1] += duration


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Times the test (setup, call and teardown) and appends its line with the compilation events."""
    global _listening
    if not _listening:
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(_listen)
        _listening = True
    _events.clear()
    start = time.perf_counter()
    yield
    line = {"test": item.nodeid, "wall": time.perf_counter() - start,
            "events": {k: v for k, v in _events.items() if k in STAGES.values()}}
    with open(os.environ.get("SUITE_PROFILE", "suite_profile.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\n")


def report(path: Path, top: int = 25) -> str:
    """The files by wall time (with their compilations' count and seconds by stage), then the tests with the
    most compilations."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    count = lambda r: r["events"].get(COMPILE, [0, 0])[0]
    seconds = lambda r, stage: r["events"].get(STAGES[stage], [0, 0.0])[1]
    files: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in rows:
        f = files[r["test"].split("::")[0]]
        f.update({"wall": r["wall"], "compilations": count(r), **{s: seconds(r, s) for s in STAGES}})
    total = sum(r["wall"] for r in rows)
    out = [f"{len(rows)} tests, {total:.0f} worker-seconds", "",
           "| file | wall s | compilations | trace s | lower s | compile s |",
           "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, f in sorted(files.items(), key=lambda kv: -kv[1]["wall"]):
        stages = " | ".join(f"{f[s]:.1f}" for s in STAGES)
        out.append(f"| {name} | {f['wall']:.1f} | {f['compilations']} | {stages} |")
    out += ["", "| test | wall s | compilations |", "| --- | ---: | ---: |"]
    for r in sorted(rows, key=lambda r: -count(r))[:top]:
        out.append(f"| {r['test']} | {r['wall']:.1f} | {count(r)} |")
    return "\n".join(out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path, nargs="?", default=Path("suite_profile.jsonl"))
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    print(report(args.path, args.top))
