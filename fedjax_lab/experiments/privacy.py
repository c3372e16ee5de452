"""A config's privacy settings made concrete for a run, before anything compiles: the accountant's view of the
run (:class:`~fedjax_lab.privacy.accounting.Mechanism`), the noise multiplier found for a target epsilon, the
budget check, and the epsilon reported beside the metrics."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from fedjax_lab.experiments.config import Config, ConfigError

if TYPE_CHECKING:
    from fedjax_lab.privacy import accounting

# ``accounting`` is imported where a config has privacy settings: dp-accounting brings SciPy's signal and
# optimisation modules, about 2.5 s, which a run without privacy (and each process that builds one) need not
# pay.


def mechanism_of(config: Config, num_clients: int,
                 noise_multiplier: float | None = None) -> accounting.Mechanism:
    """The accountant's view of ``config``'s run over ``num_clients`` clients (the noise multiplier given,
    else the config's)."""
    from fedjax_lab.privacy import accounting

    p = config.privacy
    expected = config.rounds.clients_per_round
    if p.sampling == "fixed":
        slots = expected
    elif p.max_clients is not None:
        slots = p.max_clients
    elif p.accountant == "rdp":
        slots = num_clients
    else:
        slots = accounting.default_slots(num_clients, expected / num_clients)
    z = p.noise_multiplier if noise_multiplier is None else noise_multiplier
    return accounting.Mechanism(num_clients, p.sampling, expected, slots, float(z or 0.0), p.accountant)


def resolve(config: Config, num_clients: int) -> Config:
    """``config`` with ``privacy.noise_multiplier`` set: the smallest that meets ``privacy.target_epsilon``
    when unset; checks a set one against that budget.

    Raises:
      ConfigError: no noise multiplier meets the target, or the run would exceed its budget.
    """
    p, rounds = config.privacy, config.rounds.num_rounds
    if p is None:
        return config
    from fedjax_lab.privacy import accounting

    if p.noise_multiplier is None:
        try:
            z = accounting.calibrate(mechanism_of(config, num_clients, 1.0), rounds, p.target_epsilon,
                                     p.delta)
        except accounting.CalibrationError as exc:
            raise ConfigError(f"privacy.target_epsilon: {exc}; allow a larger epsilon, or fewer rounds or "
                              "clients per round") from None
        return config.model_copy(update={"privacy": p.model_copy(update={"noise_multiplier": z})})
    if p.target_epsilon is not None:
        spent = accounting.epsilon(mechanism_of(config, num_clients), rounds, p.delta)
        if spent > p.target_epsilon:
            raise ConfigError(f"privacy.target_epsilon: the run would spend ε = {spent:.4g} at "
                              f"δ = {p.delta:g} in {rounds} rounds, over its budget of "
                              f"{p.target_epsilon:g}; raise privacy.noise_multiplier (or unset it to find "
                              "the one that fits), or run fewer rounds")
    return config


def epsilons(config: Config, num_clients: int) -> Mapping[int, float]:
    """ε at ``privacy.delta`` after every round of a resolved config, counted in the background as the run
    goes (none without noise: ε is infinite, and the run's summary says so)."""
    if config.privacy is None or not config.privacy.noise_multiplier:
        return {}
    from fedjax_lab.privacy import accounting

    return accounting.epsilon_curve(mechanism_of(config, num_clients), config.rounds.num_rounds,
                                    config.privacy.delta)


def privacy_summary(config: Config, num_clients: int) -> dict | None:
    """What a run's summary says of its privacy: ε (``None``: infinite, no noise) at δ after all its rounds,
    and the settings it was counted under.

    ε is the accountant's for the rounds composed at once, the number the budget check and the calibration
    use; the ``epsilon`` column's last value (composed a round at a time) agrees with it to about 1e-6.
    """
    if config.privacy is None:
        return None
    from fedjax_lab.privacy import accounting

    p, mechanism = config.privacy, mechanism_of(config, num_clients)
    spent = accounting.epsilon(mechanism, config.rounds.num_rounds, p.delta) if p.noise_multiplier else None
    return {"epsilon": spent, "delta": p.delta,
            "noise_multiplier": p.noise_multiplier, "clip_norm": p.clip_norm, "accountant": p.accountant,
            "sampling": p.sampling, "sampling_rate": mechanism.sampling_rate, "slots": mechanism.slots,
            "num_clients": num_clients, "adaptive_quantile": p.adaptive_quantile}
