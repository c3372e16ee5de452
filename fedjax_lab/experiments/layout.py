"""The round's layout chosen by measurement: the convolution lowering, the cohort chunk and, on a CPU, the
library of the matrix products.

None of them changes what a run computes (beyond float rounding), only how fast. Which is fastest depends on
the backend, the model and the cohort: on one H100, ResNet-18 at cohort 10 ran 2.1x faster with ``im2col``
than with XLA's convolution, while the simple-CNN at cohort 100 ran faster with XLA's; on a 2-core CPU one
client at a time beats the whole cohort vmapped for CNNs (docs/benchmarks.md). So when ``rounds.layout`` is
``measure`` (the default) and ``model.lowering`` is ``auto``, ``rounds.chunk_size`` unset or
``rounds.cpu_matmul`` ``auto``, the builder compiles the candidate layouts, times a round of each with a short
local budget (10 steps a client), and keeps the fastest, where it beats the rules' layout by 5 % or more
(closer is timing noise). A probe comes first: one round of 2 local steps in the rules' layout; when it takes
over a second (ResNet-18 on a CPU), the rules stand, as timing every candidate would take minutes.

1. the lowerings (XLA's convolution, ``im2col`` and ``banded``; convolutional models only) at the chunk the
   rules give;
2. then chunks of 1, 2 and 10 clients and the whole share (the divisors of the share among them) with the
   fastest lowering;
3. then, on a CPU, the library of the matrix products, XLA's default (YNNPACK's) or its Eigen kernels, in the
   fastest of those (:func:`compiler_options`): on a 2-core AMD EPYC the simple-CNN's training step ran about
   6 % faster with Eigen's and the MLP's 11 % slower, so the rules give the convolutional models Eigen's
   (docs/benchmarks.md). Called inside another trace, a round drops the option
   (:func:`~fedjax_lab.engine.simulation.jit_with_options`).

With local epochs over clients of unequal size a chunk runs its heaviest client's steps (the others are
masked) and a device its busiest share, which a round of equal steps does not show: there each chunk
candidate's time is scaled to the steps a real round's busiest device takes, in expectation over cohorts
drawn from the population (:class:`UnequalWork`), past the round's fixed cost (separated by the rules'
rounds of 2 and 10 steps). On a 2-core VM this chose one client at a time for the
README's main job (logistic regression, 20 epochs over clients of 45 to 4,645 examples), 1.8x
faster than the whole share that equal steps favour.

An explicit setting is never overridden: only the unset ones are measured. A candidate that fails to build or
to fit the memory budget is skipped, with the reason. The choice, every candidate's time and the reason are
kept in a cache (``$FEDJAX_LAB_CACHE_DIR/layouts.json``, default ``~/.cache/fedjax_lab``), keyed by what
decides the speed: the backend, the device kind and count, the versions of jax and fedjax_lab (and a digest
of fedjax_lab's source, so that a changed lowering is measured again), the model
section, the input shape, the batch size, the cohort share, the method and its plug-ins, the values of the
layout settings given (so a choice made with one explicit chunk never answers for another), and with unequal
steps a digest of them. The next build with the same key reads it and compiles nothing more. The runner
writes the choice to the run directory (``layout.json``).

``rounds.layout: rules`` (or ``FEDJAX_LAB_LAYOUT=rules`` in the environment, which sets the default; the test
suite does) keeps the hand rules: ``default_chunk_size`` and ``default_lowering``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fedjax_lab.engine.cohort_loop import balanced_order
from fedjax_lab.experiments.config import Config, ConfigError

LOWERINGS = ("xla", "im2col", "banded")
CHUNKS = (1, 2, 10)  # besides the whole share
MEASURED_STEPS = 10  # local steps a client takes in a measured round
PROBE_STEPS = 2  # local steps of the probe round, the rules' layout timed once before anything else
MAX_PROBE_SECONDS = 1.0  # a slower probe round keeps the rules: timing every candidate would take minutes
MARGIN = 1.05  # a candidate replaces the rules' layout only when this much faster (timing noise)
MIN_SECONDS = 0.2  # each candidate's round is called until this much time has passed (at least twice)
CPU_MATMULS = ("ynnpack", "eigen")


def compiler_options(cpu_matmul: str | None) -> dict[str, str] | None:
    """The XLA compiler options that give a training program's matrix products to ``cpu_matmul``'s library:
    ``eigen`` leaves YNNPACK the reductions only (``xla_cpu_experimental_ynn_fusion_type``), so that every
    ``dot`` takes XLA's Eigen kernels; ``ynnpack`` and ``None`` (not a CPU) keep XLA's defaults, which in
    jaxlib 0.10 give the products and reductions to YNNPACK. The two sum a product's terms in other orders:
    results differ at float rounding."""
    if cpu_matmul == "eigen":
        return {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_REDUCE"}
    return None


@dataclasses.dataclass(frozen=True)
class Layout:
    """A round's layout: the convolution lowering (``None`` for a model without convolutions), the clients
    each device trains at once (its whole share of the cohort at most) and, on a CPU, the library of the
    matrix products (``None`` elsewhere)."""

    lowering: str | None
    chunk_size: int
    cpu_matmul: str | None = None

    def label(self) -> str:
        parts = [self.lowering, f"chunk {self.chunk_size}",
                 None if self.cpu_matmul is None else f"{self.cpu_matmul} matmul"]
        return ", ".join(part for part in parts if part is not None)


@dataclasses.dataclass(frozen=True, eq=False)
class UnequalWork:
    """The local steps of a population whose clients take unequal numbers of them (local epochs), and how a
    round splits its cohort: what a chunk candidate's measured round of equal steps is scaled by.

    Attributes:
      client_steps: ``[N]`` each client's local steps in a round.
      cohort_size: clients a round trains.
      num_devices: devices the cohort is split over.
      balanced: whether the round reorders its cohort (:func:`~fedjax_lab.engine.cohort_loop.balanced_order`).
      draws: cohorts drawn (uniformly, without replacement, from a fixed seed) for the expectation.
    """

    client_steps: np.ndarray
    cohort_size: int
    num_devices: int
    balanced: bool
    draws: int = 32

    def digest(self) -> str:
        """What the expectation depends on, hashed (part of the cache key)."""
        digest = hashlib.sha256(np.asarray(self.client_steps, np.int64).tobytes())
        digest.update(f"|{self.cohort_size}|{self.num_devices}|{self.balanced}|{self.draws}".encode())
        return digest.hexdigest()[:16]

    @functools.cache  # noqa: B019 - a handful of chunk sizes, for the life of the measurement
    def busiest_chunk_steps(self, chunk_size: int) -> float:
        """The expected steps of a round on its busiest device, counting a chunk's steps once (each chunk
        steps as long as its heaviest client): ``E[max_d sum_{chunks of d} max_{k in chunk} K_k]``."""
        rng = np.random.default_rng(0)
        steps = np.asarray(self.client_steps, np.int32)
        cohorts = np.stack([np.sort(rng.choice(len(steps), self.cohort_size, replace=False))
                            for _ in range(self.draws)])
        work = steps[cohorts]
        if self.balanced:
            order = jax.jit(jax.vmap(functools.partial(balanced_order, num_devices=self.num_devices,
                                                       chunk_size=chunk_size)))(work)
            work = np.take_along_axis(work, np.asarray(order), axis=1)
        chunks = work.reshape(self.draws, self.num_devices, -1, chunk_size)
        return float(chunks.max(axis=3).sum(axis=2).max(axis=1).mean())

    def scale(self, chunk_size: int, share: int, measured_steps: int = MEASURED_STEPS) -> float:
        """A real round's time over a measured one's (every client ``measured_steps`` steps) with chunks of
        ``chunk_size``: the busiest device's chunk steps over the measured round's ``share / chunk_size *
        measured_steps``."""
        return self.busiest_chunk_steps(chunk_size) / (share // chunk_size * measured_steps)


def cache_path() -> Path:
    """The layout cache, ``$FEDJAX_LAB_CACHE_DIR/layouts.json`` (default ``~/.cache/fedjax_lab``)."""
    root = os.environ.get("FEDJAX_LAB_CACHE_DIR") or Path.home() / ".cache" / "fedjax_lab"
    return Path(root) / "layouts.json"


@functools.cache
def source_digest() -> str:
    """A digest of fedjax_lab's own source files: a changed lowering or round changes the speeds measured,
    so a cached choice answers only for the code that measured it (the version number alone stays put between
    releases)."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def layout_key(config: Config, input_shape: tuple[int, ...], share: int,
               work: UnequalWork | None = None) -> str:
    """The cache key: everything the layout's speed depends on, as one JSON string."""
    import fedjax_lab

    device = jax.devices()[0]
    plugins = [p.name for p in getattr(config.algorithm, "plugins", ()) or ()]
    model = config.model.model_dump(mode="json")
    model.pop("lowering", None)
    return json.dumps({
        "backend": jax.default_backend(), "device": getattr(device, "device_kind", str(device)),
        "devices": config.parallel.devices, "device_count": len(jax.devices()), "jax": jax.__version__,
        "fedjax_lab": fedjax_lab.__version__, "source": source_digest(),
        "model": model, "input_shape": list(input_shape), "batch_size": config.client.batch_size,
        "share": share, "algorithm": config.algorithm.name, "plugins": plugins,
        "aggregation": config.parallel.aggregation,
        # what was left to measure, and what was set: a choice made with a dimension fixed (at one value) does
        # not answer one without it (or with another value)
        "set": {"lowering": config.model.lowering, "chunk_size": config.rounds.chunk_size,
                "cpu_matmul": config.rounds.cpu_matmul},
        "work": None if work is None else work.digest(),
    }, sort_keys=True)


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def read_cache(key: str) -> dict | None:
    """The cached choice for ``key``, or ``None`` (also when the cache is unreadable)."""
    path = cache_path()
    try:
        return json.loads(path.read_text()).get(key)
    except (OSError, ValueError):
        return None


def write_cache(key: str, entry: dict) -> None:
    """Adds ``entry`` under ``key`` (a locked read-modify-write, replaced atomically); a cache that cannot be
    written is skipped, not an error."""
    path = cache_path()
    try:
        with _locked(path):
            try:
                table = json.loads(path.read_text())
            except (OSError, ValueError):
                table = {}
            table[key] = entry
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
            os.replace(tmp, path)
    except OSError:
        pass


def seconds_per_round(experiment, min_calls: int = 2) -> float:
    """The fastest of repeated calls of one round (after a first call, which compiles it): at least
    ``min_calls`` calls, and more until :data:`MIN_SECONDS` have passed."""
    return timed_calls(lambda state: experiment.run_rounds(state, experiment.inputs, num_rounds=1),
                       experiment.initial_state(), min_calls)[1]


def timed_calls(step: Callable[[Any], Any], state: Any, min_calls: int = 2) -> tuple[float, float]:
    """``(first, fastest)``: the seconds of the first call ``state, _ = step(state)`` (compiling it and
    running once) and the fastest of the calls after it: at least ``min_calls``, and more until
    :data:`MIN_SECONDS` have passed (exactly one with ``min_calls=1``)."""
    start = time.perf_counter()
    state, metrics = step(state)
    jax.block_until_ready((state, metrics))
    first = time.perf_counter() - start
    times, spent = [], 0.0
    while len(times) < min_calls or (spent < MIN_SECONDS and min_calls > 1):
        start = time.perf_counter()
        state, metrics = step(state)
        jax.block_until_ready((state, metrics))
        times.append(time.perf_counter() - start)
        spent += times[-1]
    return first, min(times)


def short_budget(config: Config, steps: int = MEASURED_STEPS) -> Config:
    """``config`` with each client taking ``steps`` local steps (a measured round)."""
    client = config.client.model_copy(update={"local_steps": steps, "local_epochs": None})
    return config.model_copy(update={"client": client})


def measured_config(config: Config, layout: Layout, steps: int = MEASURED_STEPS) -> Config:
    """``config`` with ``layout`` set explicitly, the hand rules, and a short local budget (``steps`` steps
    a client)."""
    return with_layout(short_budget(config, steps), layout)


def with_layout(config: Config, layout: Layout) -> Config:
    """``config`` with ``layout``'s lowering and CPU matmul (when it has them) and chunk set explicitly, and
    the rules."""
    model = config.model if layout.lowering is None else config.model.model_copy(
        update={"lowering": layout.lowering})
    update = {"chunk_size": layout.chunk_size, "layout": "rules"}
    if layout.cpu_matmul is not None:
        update["cpu_matmul"] = layout.cpu_matmul
    rounds = config.rounds.model_copy(update=update)
    return config.model_copy(update={"model": model, "rounds": rounds})


def candidate_chunks(share: int, rule: int) -> list[int]:
    """The rule's chunk, 1, 2, 10 and the whole share, those that divide the share, in that order."""
    found: list[int] = []
    for chunk in (rule, *CHUNKS, share):
        if chunk <= share and share % chunk == 0 and chunk not in found:
            found.append(chunk)
    return found


def choose_layout(config: Config, *, rules: Layout, conv_model: bool, share: int,
                  input_shape: tuple[int, ...], build: Callable[[Config], Any],
                  lowerings: tuple[str, ...] = LOWERINGS,
                  work: UnequalWork | None = None) -> tuple[Layout, dict]:
    """The fastest layout for ``config`` and what was measured: ``(layout, info)``.

    Args:
      rules: what the hand rules give (the lowering ``None`` for a model without convolutions, the CPU
        matmul ``None`` off a CPU: then it is not measured).
      conv_model: whether the model has convolutions, so a lowering to choose.
      lowerings: the candidate lowerings.
      share: the clients of a cohort each device trains.
      input_shape: one example's input shape (part of the cache key).
      build: builds the experiment of a config (with its layout explicit); it raises ``ConfigError`` when a
        candidate does not fit.
      work: the clients' unequal local steps, to which each candidate's round is scaled (``None``: equal).

    ``info`` says how the layout was chosen (``"how"``: ``explicit``, ``measured`` or ``cached``), why (a
    sentence), the cache key, and every candidate's seconds per measured round (or why it was skipped).
    """
    free_lowering = conv_model and config.model.lowering == "auto"
    free_chunk = config.rounds.chunk_size is None and share > 1
    free_matmul = rules.cpu_matmul is not None and config.rounds.cpu_matmul == "auto"
    if not (free_lowering or free_chunk or free_matmul):
        return rules, {"how": "explicit", "layout": dataclasses.asdict(rules),
                       "why": "model.lowering, rounds.chunk_size and rounds.cpu_matmul are set (or there is "
                              "nothing to choose)"}
    key = layout_key(config, input_shape, share, work)
    cached = read_cache(key)
    if cached is not None:
        layout = Layout(**cached["layout"])
        return layout, {**cached, "how": "cached", "cache": str(cache_path()), "key": json.loads(key)}
    probe = _probe(config, rules, build, min_calls=1 if work is None else 2)
    if probe is not None and probe > MAX_PROBE_SECONDS:
        why = (f"a round of {PROBE_STEPS} local steps took {probe:.1f} s in the rules' {rules.label()}: "
               "timing every candidate would take minutes, so the rules stand (set model.lowering and "
               "rounds.chunk_size to choose)")
        return rules, _kept(key, rules, rules, why, probe_seconds=probe, seconds_per_round={})
    timings: dict[str, Any] = {}
    predicted: dict[str, float] = {}  # a real round's seconds, where the clients' steps are unequal

    def time_round(layout: Layout) -> None:
        label = layout.label()
        if label not in timings:
            try:
                timings[label] = seconds_per_round(build(measured_config(config, layout)))
            except Exception as exc:  # noqa: BLE001 - _skipped raises again what is not a misfit
                timings[label] = _skipped(exc)

    if work is not None and probe is not None:  # the part of a round that its steps do not scale
        time_round(rules)
    overhead = _fixed_seconds(probe, timings.get(rules.label())) if work is not None else 0.0

    def measure(layout: Layout) -> float:
        label = layout.label()
        time_round(layout)
        if work is not None and isinstance(timings[label], float) and label not in predicted:
            steps_part = max(timings[label] - overhead, 0.0)
            predicted[label] = overhead + steps_part * work.scale(layout.chunk_size, share)
        value = predicted.get(label, timings[label])
        return value if isinstance(value, float) else math.inf

    def fastest(candidates: list[Layout], incumbent: Layout) -> Layout:
        best = min(candidates, key=measure)
        return best if measure(best) * MARGIN < measure(incumbent) else incumbent

    best = rules
    if free_lowering:
        best = fastest([dataclasses.replace(rules, lowering=lowering) for lowering in lowerings], best)
    if free_chunk:
        best = fastest([dataclasses.replace(best, chunk_size=chunk)
                        for chunk in candidate_chunks(share, rules.chunk_size)], best)
    if free_matmul:
        best = fastest([dataclasses.replace(best, cpu_matmul=matmul) for matmul in CPU_MATMULS], best)
    if math.isinf(measure(best)):  # nothing could be measured: the rules, whose own build says what is wrong
        best = rules
    why = _why(best, rules, {**timings, **predicted}, unequal=work is not None)
    unequal = {"predicted_seconds_per_round": predicted, "fixed_seconds_per_round": overhead}
    return best, _kept(key, best, rules, why, seconds_per_round=timings, measured_steps=MEASURED_STEPS,
                       probe_seconds=probe, **(unequal if work is not None else {}))


def _kept(key: str, best: Layout, rules: Layout, why: str, **measured: Any) -> dict:
    """Caches a measured choice under ``key`` and returns its ``info`` (see :func:`choose_layout`)."""
    entry = {"layout": dataclasses.asdict(best), "rules": dataclasses.asdict(rules), "why": why, **measured,
             "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    write_cache(key, entry)
    return {**entry, "how": "measured", "cache": str(cache_path()), "key": json.loads(key)}


def _fixed_seconds(probe: float | None, measured: Any) -> float:
    """The part of a round that does not grow with the local steps (sampling, aggregation, the step loop's
    setup), from the rules' rounds of :data:`PROBE_STEPS` (``probe``) and :data:`MEASURED_STEPS`
    (``measured``, or why it was skipped): for a small model it is most of a measured round. Assumed the same
    for every layout."""
    if probe is None or not isinstance(measured, float):
        return 0.0
    return max(0.0, (MEASURED_STEPS * probe - PROBE_STEPS * measured) / (MEASURED_STEPS - PROBE_STEPS))


def _skipped(exc: Exception) -> str:
    """Why a candidate was skipped: it did not fit (a ``ConfigError``, a ``MemoryError``, an accelerator's
    out-of-memory ``XlaRuntimeError``); any other error is raised again."""
    if isinstance(exc, (ConfigError, MemoryError)):
        return f"skipped: {exc}"
    if "RESOURCE_EXHAUSTED" in str(exc) or "Out of memory" in str(exc):
        return f"skipped: out of memory ({str(exc).splitlines()[0][:200]})"
    raise exc


def _why(best: Layout, rules: Layout, timings: dict[str, Any], unequal: bool = False) -> str:
    """The sentence saying why ``best`` was chosen from the ``timings`` (measured, or ``unequal``: predicted
    for a real round from the measured ones)."""
    if not isinstance(timings.get(best.label()), float):
        return "no candidate could be measured (see seconds_per_round); the hand rules"
    round_ = (f"a round predicted from one of {MEASURED_STEPS} local steps for the clients' unequal steps"
              if unequal else f"a round of {MEASURED_STEPS} local steps")
    if best == rules:
        others = [(v, k) for k, v in timings.items() if isinstance(v, float) and k != rules.label()]
        return (f"the rules' {rules.label()} ({_ms(timings[rules.label()])} {round_}) stands: none of the "
                f"other {len(timings) - 1} measured layouts was 5 % faster"
                + (f" (the fastest, {min(others)[1]}: {_ms(min(others)[0])})" if others else ""))
    if not isinstance(timings.get(rules.label()), float):
        return f"{best.label()} is the fastest of {len(timings)} measured layouts (the rules' could not run)"
    return (f"{best.label()} ({_ms(timings[best.label()])} {round_}) is the fastest of {len(timings)} "
            f"measured layouts, {timings[rules.label()] / timings[best.label()]:.2f}x the rules' "
            f"{rules.label()}")


def _probe(config: Config, rules: Layout, build: Callable[[Config], Any], min_calls: int = 1) -> float | None:
    """Seconds of one round of :data:`PROBE_STEPS` local steps in the rules' layout, the fastest of
    ``min_calls`` (``None`` when it does not build: the candidates then say why); the start of a
    measurement."""
    print("fedjax-lab: timing the candidate layouts (once per device, model and shapes; rounds.layout=rules "
          "skips this)", file=sys.stderr, flush=True)
    try:
        return seconds_per_round(build(measured_config(config, rules, PROBE_STEPS)), min_calls=min_calls)
    except (ConfigError, MemoryError):
        return None


def _ms(value) -> str:
    return f"{value * 1e3:.1f} ms" if isinstance(value, float) else "not measured"


# ------------------------------------------------------------------------------------------------ sweeps
MEMBER_CHUNKS = (1, 2, 4, 8)  # besides the whole share
SEPARATE = "separate runs"


def candidate_member_chunks(share: int, rule: int | None) -> list[int | None]:
    """The rule's (``None``: separate runs), then members 1, 2, 4 and 8 at a time and the whole share, those
    that divide the share, then separate runs."""
    found: list[int | None] = []
    for chunk in (rule, *MEMBER_CHUNKS, share, None):
        if chunk not in found and (chunk is None or (chunk <= share and share % chunk == 0)):
            found.append(chunk)
    return found


def member_label(chunk: int | None) -> str:
    """How a sweep with ``chunk`` members vmapped at a time runs, in words (``None``: separate runs)."""
    return SEPARATE if chunk is None else f"{chunk} member(s) vmapped at a time"


def choose_member_chunk(key: str, *, rule: int | None, share: int, members: int, rounds: int,
                        steps_ratio: float, time_program: Callable[[int], tuple[float, float]],
                        time_run: Callable[[], tuple[float, float]]) -> tuple[int | None, dict]:
    """The fastest way to run a sweep's members that share one program: ``(chunk, info)``, the members
    vmapped at a time, or ``None`` for separate runs one after another.

    Each way is judged by the sweep's whole predicted time: its compilation (the first call's time less a
    round's) plus ``rounds`` measured rounds scaled by ``steps_ratio`` (the run's local steps over the
    measured ones). One program compiles once; separate runs compile once each, and run ``members`` times one
    member's rounds. As for a run's layout, a way replaces the rule's only when :data:`MARGIN` faster; a
    member's measured round over :data:`MAX_PROBE_SECONDS` keeps the rule untimed; the choice is cached under
    ``key``.

    Args:
      key: the cache key (:func:`layout_key`, the members and the rounds).
      rule: what the hand rules give (``sweep.default_member_chunk``).
      share: the members each device runs.
      members: the number of members.
      rounds: the sweep's rounds.
      steps_ratio: a run round's local steps over a measured round's.
      time_program: ``(first call, round)`` seconds of the sweep program with the given member chunk.
      time_run: ``(first call, round)`` seconds of one member run alone.
    """
    cached = read_cache(key)
    if cached is not None:
        return cached["member_chunk"], {**cached, "how": "cached", "cache": str(cache_path())}
    print("fedjax-lab: timing the sweep's member chunks (once per device, model and shapes; "
          "rounds.layout=rules skips this)", file=sys.stderr, flush=True)

    def predicted(first: float, round_seconds: float, copies: int = 1) -> dict[str, float]:
        compile_seconds = max(first - round_seconds, 0.0)
        total = copies * (compile_seconds + rounds * steps_ratio * round_seconds)
        return {"compile_s": compile_seconds, "round_s": round_seconds, "predicted_s": total}

    timings: dict[str, Any] = {}
    try:
        first, one = time_run()
        timings[SEPARATE] = predicted(first, one, copies=members)
    except Exception as exc:  # noqa: BLE001 - _skipped raises again what is not a misfit
        one, timings[SEPARATE] = 0.0, _skipped(exc)
    if one > MAX_PROBE_SECONDS:
        best, why = rule, (f"a member's round of {MEASURED_STEPS} local steps took {one:.1f} s: timing every "
                           "member chunk would take minutes, so the rules stand (--chunk N chooses)")
    else:
        for chunk in candidate_member_chunks(share, rule):
            if chunk is not None:
                try:
                    timings[member_label(chunk)] = predicted(*time_program(chunk))
                except Exception as exc:  # noqa: BLE001 - as above
                    timings[member_label(chunk)] = _skipped(exc)

        def seconds(chunk):
            value = timings[member_label(chunk)]
            return value["predicted_s"] if isinstance(value, dict) else math.inf

        best = min(candidate_member_chunks(share, rule), key=seconds)
        if not seconds(best) * MARGIN < seconds(rule):
            best = rule
        why = _member_why(best, rule, {k: v["predicted_s"] if isinstance(v, dict) else v
                                       for k, v in timings.items()})
    entry = {"member_chunk": best, "rules": rule, "why": why, "measured": timings,
             "measured_steps": MEASURED_STEPS, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    write_cache(key, entry)
    return best, {**entry, "how": "measured", "cache": str(cache_path())}


def _member_why(best: int | None, rule: int | None, predicted: dict[str, Any]) -> str:
    """The sentence saying why ``best`` was chosen from each way's ``predicted`` seconds."""
    chosen, ruled = predicted.get(member_label(best)), predicted.get(member_label(rule))
    if not isinstance(chosen, float):
        return "no way could be measured (see measured); the hand rules"
    if best == rule:
        return (f"the rules' {member_label(rule)} (predicted {_s(ruled)} for the sweep) stands: none of the "
                f"other {len(predicted) - 1} measured ways was {(MARGIN - 1) * 100:.0f} % faster")
    if not isinstance(ruled, float):
        return (f"{member_label(best)} is the fastest of {len(predicted)} measured ways "
                "(the rules' could not run)")
    return (f"{member_label(best)} (predicted {_s(chosen)} for the sweep, compilation included) is the "
            f"fastest of {len(predicted)} measured ways, {ruled / chosen:.2f}x the rules' "
            f"{member_label(rule)}")


def _s(value) -> str:
    return f"{value:.1f} s" if isinstance(value, float) else "not measured"
