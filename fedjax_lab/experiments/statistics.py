"""Statistics that decide a reproduction's claims: means with sample standard deviations, and each claim
judged by the paired difference over seeds and its Student-t interval.

A claim "method beats base by the paper's gain ``g``" is, over seeds run in pairs (the same seed for both
arms):

* **held** when the 95 % interval of the mean paired difference excludes zero on the paper's side (a gain in
  the paper's direction, possibly smaller than the paper's: the interval says how large);
* **not held** when it does not, and it excludes ``g`` (the data rule out the paper's gain);
* **unresolved** otherwise (the interval holds both zero and ``g``: more seeds or a larger scale are needed).

A single pair decides nothing: its interval is undefined and the verdict is ``unresolved``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, NamedTuple

Verdict = Literal["held", "not held", "unresolved"]


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """The mean and the sample standard deviation (ddof 1; ``None`` for a single value)."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_std needs at least one value")
    mean = math.fsum(values) / n
    if n == 1:
        return mean, None
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function ``I_x(a, b)``, by its continued fraction (modified Lentz)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    # the fraction converges fast below this point; use the symmetry above it
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _incomplete_beta(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x)
                     + b * math.log1p(-x)) / a
    # 1 / (1 + d_1 / (1 + d_2 / ...)): with b_0 = 0, f starts at (and c at) a tiny stand-in for zero.
    tiny, d = 1e-300, 0.0
    f = c = tiny
    for i in range(400):
        m = i // 2
        if i == 0:
            numerator = 1.0
        elif i % 2 == 0:
            numerator = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            numerator = -((a + m) * (a + b + m) * x) / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + numerator * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + numerator / c
        c = c if abs(c) > tiny else tiny
        f *= c * d
        if abs(1.0 - c * d) < 1e-15:
            break
    return front * f


def t_cdf(t: float, df: float) -> float:
    """``P(T <= t)`` for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on :func:`t_cdf`)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2.0
    for _ in range(200):
        middle = (low + high) / 2.0
        low, high = (middle, high) if t_cdf(middle, df) < p else (low, middle)
    return (low + high) / 2.0


class PairedDifference(NamedTuple):
    """The mean over seeds of ``method - base``, its sample standard deviation, the number of pairs and the
    two-sided interval (``None`` bounds for a single pair)."""

    mean: float
    std: float | None
    n: int
    low: float | None
    high: float | None
    confidence: float


def paired_difference(method: Sequence[float], base: Sequence[float], *,
                      confidence: float = 0.95) -> PairedDifference:
    """``method[i] - base[i]`` over pairs run with the same seed: mean, ddof-1 standard deviation and the
    Student-t interval ``mean ± t_{(1+confidence)/2, n-1} std / sqrt(n)``.

    Raises:
      ValueError: the two arms have different numbers of runs, or none.
    """
    if len(method) != len(base) or not method:
        raise ValueError(f"paired_difference needs equally many runs of each arm, got {len(method)} and "
                         f"{len(base)}")
    differences = [m - b for m, b in zip(method, base)]
    mean, std = mean_std(differences)
    n = len(differences)
    if std is None:
        return PairedDifference(mean, None, n, None, None, confidence)
    half = t_quantile((1.0 + confidence) / 2.0, n - 1) * std / math.sqrt(n)
    return PairedDifference(mean, std, n, mean - half, mean + half, confidence)


def verdict(difference: PairedDifference, paper_gain: float) -> Verdict:
    """Whether the paper's claim of a gain ``paper_gain`` (its sign gives the claimed direction) holds here:
    see the module docstring."""
    if difference.low is None:
        return "unresolved"
    sign = 1.0 if paper_gain >= 0 else -1.0
    low, high = sorted((sign * difference.low, sign * difference.high))
    if low > 0:
        return "held"
    if high < abs(paper_gain):
        return "not held"
    return "unresolved"


def describe(difference: PairedDifference, digits: int = 1, scale: float = 100.0) -> str:
    """``+1.2 [-0.3, +2.7]`` (the mean and interval, times ``scale``: accuracies as points)."""
    mean = f"{scale * difference.mean:+.{digits}f}"
    if difference.low is None:
        return f"{mean} (one seed)"
    return f"{mean} [{scale * difference.low:+.{digits}f}, {scale * difference.high:+.{digits}f}]"
