"""The engine: types, randomness, cohort sampling, local training, aggregation, the round loop, evaluation.

The engine imports no method; methods are built from its pieces.
"""

from fedjax_lab.engine.aggregation import cohort_weights, weighted_mean
from fedjax_lab.engine.components import ClientView, Component, LocalResult, ServerView
from fedjax_lab.engine.evaluation import Evaluator
from fedjax_lab.engine.local_training import LocalHooks, LocalSchedule, LocalStats, StepRecord, train_locally
from fedjax_lab.engine.simulation import (
    AlgorithmAt,
    CohortPlan,
    RoundInputs,
    init_loop_state,
    make_run_rounds,
    run_round,
)
from fedjax_lab.engine.types import Algorithm, ClientData, Cohort, LoopState, ServerContext

__all__ = [
    "Algorithm", "AlgorithmAt", "ClientData", "ClientView", "Cohort", "CohortPlan", "Component", "Evaluator",
    "LocalHooks", "LocalResult", "LocalSchedule", "LocalStats", "LoopState", "RoundInputs", "ServerContext",
    "ServerView", "StepRecord", "cohort_weights", "init_loop_state", "make_run_rounds", "run_round",
    "train_locally", "weighted_mean",
]
