"""User-level differential privacy: DP-FedAvg's clipping and noise, adaptive clipping, and the accountant.

Three modules, each with one job:

* this one: :class:`PrivacyConfig`, the ``privacy:`` section of a config, with its checks. It imports no JAX,
  so a bad setting is refused in a fraction of a second;
* ``mechanism.py``: the mechanism inside the compiled round, a component that clips each client's update as it
  leaves the client and adds Gaussian noise to their sum on the server (McMahan et al. 2018), with the
  clipping norm optionally tracking a quantile of the update norms (Andrew et al. 2021);
* ``accounting.py``: epsilon from the ``dp-accounting`` library (PLD or RDP) for the sampling the round uses,
  the noise multiplier that meets a target epsilon, and the run's epsilon curve.

``docs/privacy.md`` says what is private, at which level, under which assumptions, and what is not.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from fedjax_lab.methods.registry import Fields


class PrivacyConfig(Fields):
    """DP-FedAvg with user-level (ε, δ)-differential privacy; see ``docs/privacy.md``."""

    clip_norm: PositiveFloat = Field(
        1.0, description="C: each client's update is clipped to this l2 norm (the first round's, with "
        "adaptive clipping)")
    noise_multiplier: float | None = Field(
        None, ge=0, description="z: the server adds Gaussian noise of standard deviation z C to the sum of "
        "the clipped updates; unset: the smallest z that meets target_epsilon")
    delta: float = Field(1e-5, gt=0, lt=1, description="the δ of (ε, δ)-DP (keep it below 1 / number of "
                                                       "clients)")
    target_epsilon: PositiveFloat | None = Field(
        None, description="with noise_multiplier unset: find z so that the run ends at this ε; with it "
        "set: a budget, and a run that would exceed it is refused")
    accountant: Literal["pld", "rdp"] = Field(
        "pld", description="dp-accounting's privacy loss distributions (tight) or Rényi DP (an upper "
        "bound, fast)")
    sampling: Literal["poisson", "fixed"] = Field(
        "poisson", description="poisson: each client joins a round with probability clients_per_round / N "
        "(add-or-remove-one neighbours); fixed: clients_per_round drawn without replacement (replace-one "
        "neighbours, rdp only)")
    max_clients: PositiveInt | None = Field(
        None, description="poisson: the cohort's slots; a round with more clients keeps a random subset, "
        "which the pld accountant counts; default the count exceeded with probability below 1e-6 (pld), "
        "all clients (rdp)")
    estimator: Literal["fixed", "clipped"] = Field(
        "fixed", description="the average: fixed = noisy sum / expected clients; clipped = sum / "
        "max(expected clients, sampled clients), whose noise is doubled (McMahan et al. 2018, f_f and f_c)")
    adaptive_quantile: float | None = Field(
        None, gt=0, lt=1, description="adaptive clipping: the quantile of the update norms C tracks (Andrew "
        "et al.: 0.5); unset: C is fixed")
    clip_learning_rate: PositiveFloat = Field(
        0.2, description="adaptive clipping: eta_C of the geometric update C <- C exp(-eta_C (b - quantile))")
    count_noise: PositiveFloat | None = Field(
        None, description="adaptive clipping: sigma_b, the noise on the count of unclipped updates; default "
        "expected clients / 20")

    @model_validator(mode="after")
    def _consistent(self):
        if self.noise_multiplier is None and self.target_epsilon is None:
            raise ValueError("privacy.noise_multiplier: give a noise multiplier, or privacy.target_epsilon "
                             "to find the smallest one that meets it")
        if self.sampling == "fixed" and self.accountant == "pld":
            raise ValueError("privacy.accountant: pld accounts for Poisson sampling; with privacy.sampling: "
                             "fixed use accountant: rdp")
        if self.sampling == "fixed" and self.estimator == "clipped":
            raise ValueError("privacy.estimator: with a fixed number of clients the average's denominator is "
                             "that number; 'clipped' needs privacy.sampling: poisson")
        if self.sampling == "fixed" and self.max_clients is not None:
            raise ValueError("privacy.max_clients: slots for Poisson sampling; with privacy.sampling: fixed "
                             "the cohort is rounds.clients_per_round")
        return self

    @property
    def adaptive(self) -> bool:
        """Whether the clipping norm adapts (Andrew et al. 2021)."""
        return self.adaptive_quantile is not None
