"""The statistics behind the reproductions' verdicts: Student-t quantiles against the published table, paired
intervals against a direct computation, and the verdict rule."""

import math

import numpy as np
import pytest

from fedjax_lab.experiments.statistics import (
    describe,
    mean_std,
    paired_difference,
    t_cdf,
    t_quantile,
    verdict,
)


@pytest.mark.parametrize("df, expected", [(1, 12.7062), (2, 4.3027), (4, 2.7764), (9, 2.2622), (29, 2.0452),
                                          (10**7, 1.9600)])
def test_t_quantiles_match_the_published_table(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=1e-4)
    assert t_quantile(0.025, df) == pytest.approx(-expected, abs=1e-4)


def test_t_cdf_is_a_distribution_function():
    assert t_cdf(0.0, 3) == pytest.approx(0.5)
    assert t_cdf(1.0, 1) == pytest.approx(0.75)  # the Cauchy distribution: 1/2 + atan(1)/pi
    assert t_cdf(-2.0, 5) == pytest.approx(1 - t_cdf(2.0, 5))
    assert t_cdf(2.5, 3) < t_cdf(2.5, 30)


def test_the_paired_interval_is_mean_plus_minus_t_times_the_standard_error():
    method, base = [0.62, 0.65, 0.60, 0.66], [0.60, 0.61, 0.60, 0.62]
    d = np.subtract(method, base)
    got = paired_difference(method, base)
    half = 3.1824 * np.std(d, ddof=1) / math.sqrt(4)  # t_{0.975, 3}, from the table
    assert (got.mean, got.std, got.n) == (pytest.approx(d.mean()), pytest.approx(np.std(d, ddof=1)), 4)
    assert (got.low, got.high) == (pytest.approx(d.mean() - half, abs=1e-6),
                                   pytest.approx(d.mean() + half, abs=1e-6))
    assert mean_std([1.0, 2.0, 4.0])[1] == pytest.approx(np.std([1, 2, 4], ddof=1))
    assert mean_std([3.0]) == (3.0, None)
    with pytest.raises(ValueError, match="equally many"):
        paired_difference([0.1, 0.2], [0.1])


@pytest.mark.parametrize("method, paper_gain, expected", [
    ([0.03, 0.04, 0.05], 0.04, "held"),          # a gain, interval above zero
    ([0.009, 0.01, 0.011], 0.04, "held"),         # a smaller gain is still a gain in the paper's direction
    ([-0.01, 0.0, 0.01], 0.04, "not held"),      # around zero, and the paper's +4 points is ruled out
    ([-0.02, 0.05, 0.01], 0.04, "unresolved"),   # wide: zero and +4 both inside
    ([-0.03, -0.04, -0.05], -0.04, "held"),      # a claimed loss (a baseline below the base) also holds
    ([0.04], 0.04, "unresolved"),                # one seed decides nothing
])
def test_the_verdict_follows_the_interval(method, paper_gain, expected):
    assert verdict(paired_difference(method, [0.0] * len(method)), paper_gain) == expected


def test_a_difference_is_described_in_points_with_its_interval():
    assert describe(paired_difference([0.03, 0.04, 0.05], [0.0, 0.0, 0.0])) == "+4.0 [+1.5, +6.5]"
    assert describe(paired_difference([0.03], [0.0])) == "+3.0 (one seed)"
