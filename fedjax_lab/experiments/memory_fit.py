"""Fitting a run to its device's memory before it runs: the budget, the estimate from shapes, the cohort chunk
sized from XLA's memory analysis when ``rounds.chunk_size`` is unset, and the refusal that names what to
change.

Compiling (not running) a round is the measurement: :func:`fit_chunk_to_budget` compiles rounds with chunks of
the default, 1 and 2 clients only when the shapes alone come within a quarter of the budget, and
:func:`check_memory` compiles the run's block of rounds then.
"""

from __future__ import annotations

import dataclasses
import typing

import jax

from fedjax_lab.engine import make_run_rounds, memory
from fedjax_lab.engine.memory import device_memory_bytes
from fedjax_lab.engine.simulation import message_shapes
from fedjax_lab.experiments import layout
from fedjax_lab.experiments.config import Config, ConfigError

if typing.TYPE_CHECKING:
    from fedjax_lab.experiments.build import Experiment


def memory_budget(config: Config) -> int:
    """``parallel.memory_budget_gb`` in bytes, or 90% of the device's memory."""
    if config.parallel.memory_budget_gb is not None:
        return int(config.parallel.memory_budget_gb * memory.GiB)
    return int(0.9 * device_memory_bytes())


def estimate_memory(experiment: Experiment) -> memory.StaticEstimate:
    """The per-device :class:`~fedjax_lab.engine.memory.StaticEstimate` of a round, from shapes only."""
    plan = experiment.plan
    params = experiment.classifier.variable_shapes
    state = jax.eval_shape(experiment.initial_state)
    share = plan.cohort_size // plan.num_devices
    in_flight = plan.chunk_size or share
    held = (plan.capacity if plan.asynchronous
            else (in_flight if plan.streams(experiment.algorithm) else share))
    messages = experiment.messages
    if messages is None:
        messages = message_shapes(experiment.algorithm, params, experiment.inputs)
    return memory.static_estimate(state, experiment.inputs, messages, params, plan.num_clients, held,
                                  in_flight)


def _compiled_need(experiment: Experiment, chunk_size: int | None) -> int:
    plan = dataclasses.replace(experiment.plan, chunk_size=chunk_size)
    run_rounds = _run_rounds(experiment, plan)
    lowered = run_rounds.lower(jax.eval_shape(experiment.initial_state), experiment.inputs, num_rounds=1)
    return memory.compiled_estimate(lowered.compile())


def fit_chunk_to_budget(experiment: Experiment, budget: int | None = None) -> Experiment:
    """The experiment with ``rounds.chunk_size`` sized from the memory budget when it was left unset: the
    default chunk (the whole share on an accelerator) if it fits, else the largest divisor of each device's
    share that does. The fit is linear in the chunk, from XLA's memory analysis of rounds compiled (not run)
    with chunks of 1 and 2; nothing is compiled when the shapes alone are well inside the budget."""
    plan = experiment.plan
    budget = memory_budget(experiment.config) if budget is None else budget
    if estimate_memory(experiment).total <= budget / 4:
        return experiment
    share = plan.cohort_size // plan.num_devices
    if _compiled_need(experiment, plan.chunk_size) <= budget or share == 1:
        return experiment
    one, two = _compiled_need(experiment, 1), _compiled_need(experiment, 2 if share % 2 == 0 else None)
    per_client = (two - one) / (1 if share % 2 == 0 else share - 1)
    fits = [c for c in range(1, share + 1) if share % c == 0 and one + (c - 1) * per_client <= budget]
    if not fits:
        return experiment  # check_memory refuses it, with the estimate
    plan = dataclasses.replace(plan, chunk_size=max(fits))
    return dataclasses.replace(experiment, plan=plan,
                               run_rounds=_run_rounds(experiment, plan))


def _run_rounds(experiment: Experiment, plan):
    return make_run_rounds(experiment.algorithm_at, plan, donate=True,
                           compiler_options=layout.compiler_options(experiment.cpu_matmul),
                           client_update=experiment.client_update)


def check_memory(experiment: Experiment, budget: int | None = None) -> None:
    """Refuses a run that cannot fit in ``budget`` bytes a device (default :func:`memory_budget`), naming the
    setting to change and the estimate: first from shapes, before anything is compiled; then, when that comes
    within a quarter of the budget, from XLA's memory analysis of the compiled block of rounds.

    Raises:
      ConfigError: the estimate exceeds the budget.
    """
    config, plan = experiment.config, experiment.plan
    budget = memory_budget(config) if budget is None else budget
    estimate = estimate_memory(experiment)
    where = f"more than the budget of {budget / memory.GiB:.2f} GiB a device (parallel.memory_budget_gb)"
    if estimate.client_states + estimate.server_and_inputs > budget:
        raise ConfigError(
            f"dataset.num_clients={plan.num_clients}: the population's per-client state alone needs "
            f"{estimate.client_states / memory.GiB:.2f} GiB ({estimate.per_client_state / 2**20:.3f} MiB "
            f"a client for {config.algorithm.name}), {where}; fewer clients fit, or a method without "
            f"per-client state. Estimate: {memory.describe(estimate)}")
    if estimate.total > budget:
        raise ConfigError(
            f"rounds.chunk_size={plan.chunk_size}: a round needs about {estimate.total / memory.GiB:.2f} "
            f"GiB, {where}; train fewer clients at once (rounds.chunk_size), stream the aggregation "
            f"(parallel.aggregation=streaming), or split the cohort over parallel.devices. "
            f"Estimate: {memory.describe(estimate)}")
    if estimate.total > budget / 4:
        state = jax.eval_shape(experiment.initial_state)
        compiled = experiment.run_rounds.lower(state, experiment.inputs,
                                               num_rounds=config.eval.every).compile()
        need = memory.compiled_estimate(compiled)
        if need > budget:
            raise ConfigError(
                f"rounds.chunk_size={plan.chunk_size}: XLA's memory analysis of the compiled rounds needs "
                f"{need / memory.GiB:.2f} GiB, {where}; train fewer clients at once (rounds.chunk_size), "
                f"stream the aggregation (parallel.aggregation=streaming) or split the cohort over "
                f"parallel.devices. Shapes alone: {memory.describe(estimate)}")

