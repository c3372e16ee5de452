"""Privacy accounting with Google's ``dp-accounting`` library: no formula here is written by hand.

A round of DP-FedAvg is one subsampled Gaussian mechanism on the clients (one user = one client, all of its
data): :func:`round_event` names it as a ``DpEvent`` for the sampling the round uses, and the accountant
composes it over rounds.

* Poisson sampling, add-or-remove-one neighbours: ``TruncatedSubsampledGaussianDpEvent`` (a round with more
  clients than the cohort's slots keeps a random subset of them; Zhang et al. 2025, arXiv 2508.15089), or
  ``PoissonSampledDpEvent`` when the slots hold everyone. The sum of clipped updates has sensitivity C.
* Fixed-size sampling without replacement, replace-one neighbours (the population size is public):
  ``SampledWithoutReplacementDpEvent``, whose Gaussian is counted in units of the replace-one sensitivity 2C,
  so its noise multiplier is ``z / 2`` (Wang, Balle, Kasiviswanathan 2019, which the RDP accountant
  implements; the PLD accountant has no such event).

Imports no JAX.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import numbers
import threading
from collections.abc import Iterator, Mapping

import dp_accounting
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

TRUNCATION_TAIL = 1e-6
"""Poisson sampling's default slots: the fewest whose count is exceeded with at most this probability."""


@dataclasses.dataclass(frozen=True)
class Mechanism:
    """What the accountant needs of a run: the population, the sampling, the noise, the accountant.

    Attributes:
      num_clients: N, the population (users).
      sampling: ``'poisson'`` or ``'fixed'``.
      clients_per_round: the expected cohort ``q N`` (Poisson) or the cohort (fixed).
      slots: Poisson: the cohort's slots (the truncation); fixed: the cohort.
      noise_multiplier: z, in units of the add-or-remove sensitivity C of the sum.
      accountant: ``'pld'`` or ``'rdp'``.
    """

    num_clients: int
    sampling: str
    clients_per_round: int
    slots: int
    noise_multiplier: float
    accountant: str = "pld"

    @property
    def sampling_rate(self) -> float:
        """q: a client's probability of taking part in a round."""
        return self.clients_per_round / self.num_clients


def default_slots(num_clients: int, rate: float, tail: float = TRUNCATION_TAIL) -> int:
    """The fewest slots ``s`` with ``P(Binomial(N, q) > s) <= tail``: Poisson sampling's default
    truncation."""
    if rate >= 1.0:
        return num_clients
    log_q, log_p = math.log(rate), math.log1p(-rate)
    above = 1.0
    for k in range(num_clients + 1):
        log_pmf = (math.lgamma(num_clients + 1) - math.lgamma(k + 1) - math.lgamma(num_clients - k + 1)
                   + k * log_q + (num_clients - k) * log_p)
        above -= math.exp(log_pmf)
        if above <= tail:
            return max(k, 1)
    return num_clients


def round_event(mechanism: Mechanism, noise_multiplier: float | None = None) -> dp_event.DpEvent:
    """The ``DpEvent`` of one round (see the module docstring), at ``noise_multiplier`` (default the
    mechanism's)."""
    z = mechanism.noise_multiplier if noise_multiplier is None else noise_multiplier
    n, q = mechanism.num_clients, mechanism.sampling_rate
    if mechanism.sampling == "fixed":
        return dp_event.SampledWithoutReplacementDpEvent(n, mechanism.clients_per_round,
                                                         dp_event.GaussianDpEvent(z / 2.0))
    if mechanism.slots >= n:
        return dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z))
    return dp_event.TruncatedSubsampledGaussianDpEvent(dataset_size=n, sampling_probability=q,
                                                       truncated_batch_size=mechanism.slots,
                                                       noise_multiplier=z)


class _LeftOutOrders(logging.Filter):
    """Drops the RDP accountant's warnings about fractional orders it leaves out: they do not change the
    bound, which is the minimum over the orders it can compute. A filter on its logger, installed once, where
    setting the logger's level around each call would race with the counting threads."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("_compute_log_a_frac failed to converge")


logging.getLogger("absl").addFilter(_LeftOutOrders())


def make_accountant(mechanism: Mechanism) -> dp_accounting.PrivacyAccountant:
    """A fresh accountant of the mechanism's kind and neighbouring relation."""
    relation = (dp_accounting.NeighboringRelation.REPLACE_ONE if mechanism.sampling == "fixed"
                else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    if mechanism.accountant == "rdp":
        return rdp_privacy_accountant.RdpAccountant(neighboring_relation=relation)
    return pld_privacy_accountant.PLDAccountant(neighboring_relation=relation)


@functools.lru_cache(maxsize=4096)
def epsilon(mechanism: Mechanism, rounds: int, delta: float) -> float:
    """ε at ``delta`` after ``rounds`` rounds (``inf`` without noise, 0 after no round)."""
    if rounds == 0:
        return 0.0
    if mechanism.noise_multiplier == 0:
        return math.inf
    accountant = make_accountant(mechanism)
    accountant.compose(round_event(mechanism), rounds)
    return float(accountant.get_epsilon(delta))


def _epsilons_one_round_at_a_time(mechanism: Mechanism, rounds: int, delta: float) -> Iterator[float]:
    """ε after rounds 1, 2, ..., ``rounds``, as the accountant gives them when it composes one round at a
    time.

    RDP: :func:`epsilon` at each round (a few milliseconds each). PLD: one round's privacy loss distribution
    is built once (most of a second) and composed onto the running one a round at a time, as
    ``PLDAccountant.compose(event)`` would (it rebuilds the round's distribution on every call); a round then
    costs tens of milliseconds, where composing each count from scratch costs a second.
    """
    if mechanism.accountant == "rdp":
        for r in range(1, rounds + 1):
            yield epsilon(mechanism, r, delta)
        return
    one, running = make_accountant(mechanism), make_accountant(mechanism)
    one.compose(round_event(mechanism))
    step = getattr(one, "_pld", None)  # the library keeps its composed distribution here, with no getter
    for _ in range(rounds):
        if step is None:  # a version that keeps it elsewhere: the accountant's own, slower, composition
            running.compose(round_event(mechanism))
        else:
            running._pld = running._pld.compose(step)  # what its compose(event) does
        yield float(running.get_epsilon(delta))


class EpsilonCurve(Mapping[int, float]):
    """ε after each round 1 to ``rounds``, counted by a background thread from the first read on (a build
    that never runs, such as a layout candidate, counts nothing) while the run goes on; reading a round not
    yet counted waits for it.

    An error in the thread is raised where a value is read.
    """

    def __init__(self, mechanism: Mechanism, rounds: int, delta: float):
        self._rounds = rounds
        self._values: dict[int, float] = {}
        self._error: BaseException | None = None
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._fill, args=(mechanism, delta), name="epsilon-curve",
                                        daemon=True)

    def _fill(self, mechanism: Mechanism, delta: float) -> None:
        try:
            for r, value in enumerate(_epsilons_one_round_at_a_time(mechanism, self._rounds, delta), 1):
                with self._changed:
                    self._values[r] = value
                    self._changed.notify_all()
        except BaseException as exc:  # noqa: BLE001 - raised again where the curve is read
            with self._changed:
                self._error = exc
                self._changed.notify_all()

    def __contains__(self, r: object) -> bool:
        return isinstance(r, numbers.Integral) and 1 <= r <= self._rounds

    def __getitem__(self, r: int) -> float:
        if r not in self:
            raise KeyError(r)
        with self._changed:
            if self._thread.ident is None:  # not started yet
                self._thread.start()
            self._changed.wait_for(lambda: r in self._values or self._error is not None)
            if r not in self._values:
                raise RuntimeError(f"counting ε after round {r} failed") from self._error
            return self._values[r]

    def __iter__(self) -> Iterator[int]:
        return iter(range(1, self._rounds + 1))

    def __len__(self) -> int:
        return self._rounds


@functools.lru_cache(maxsize=64)
def epsilon_curve(mechanism: Mechanism, rounds: int, delta: float) -> EpsilonCurve:
    """ε after every round of a run of ``rounds`` rounds (:class:`EpsilonCurve`; runs of a sweep with the
    same mechanism share one)."""
    return EpsilonCurve(mechanism, rounds, delta)


class CalibrationError(ValueError):
    """No noise multiplier within the searched range meets the target."""


MAX_NOISE_MULTIPLIER = 1000.0
"""The largest noise multiplier the calibration tries: beyond it, the noise drowns any update."""


@functools.lru_cache(maxsize=256)
def calibrate(mechanism: Mechanism, rounds: int, target_epsilon: float, delta: float) -> float:
    """The smallest noise multiplier whose ε after ``rounds`` rounds is at most ``target_epsilon`` at
    ``delta`` (``dp_accounting.calibrate_dp_mechanism``, within 1e-3 of it, on the side that meets the
    target).
    The PLD accountant takes tens of seconds here (a PLD per candidate), the RDP one under a second.

    Raises:
      CalibrationError: even ``MAX_NOISE_MULTIPLIER`` exceeds the target.
    """
    def event(z):
        return dp_event.SelfComposedDpEvent(round_event(mechanism, z), rounds)

    def fresh():
        return make_accountant(mechanism)

    top = make_accountant(mechanism)
    top.compose(event(MAX_NOISE_MULTIPLIER))
    if top.get_epsilon(delta) > target_epsilon:
        raise CalibrationError(f"even a noise multiplier of {MAX_NOISE_MULTIPLIER:g} gives ε > "
                               f"{target_epsilon} after {rounds} rounds")
    return float(dp_accounting.calibrate_dp_mechanism(
        fresh, event, target_epsilon, delta, dp_accounting.LowerEndpointAndGuess(0.0, 1.0), tol=1e-3))
