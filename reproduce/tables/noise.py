"""Seed noise of a change from base: the 95% confidence half-width of a difference of two means
(Welch's t interval: unequal variances, degrees of freedom by Welch-Satterthwaite).

With three seeds a side, 2 standard errors (a normal interval) would be a ~88% interval: Student's
t with ~4 degrees of freedom puts the 97.5% point at 2.78, not 1.96. Plain Python: the t quantile
by Newton's method on its CDF, integrated with Simpson's rule (no scipy among the dependencies).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

LEVEL = 0.95


def t_density(df: float) -> Callable[[float], float]:
    """The density of Student's t with ``df`` degrees of freedom, its constant computed once."""
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def pdf(t: float) -> float:
        return math.exp(log_norm - (df + 1) / 2 * math.log1p(t * t / df))

    return pdf


def t_cdf(x: float, df: float, intervals: int = 400) -> float:
    """P(T <= x) for Student's t with ``df`` (> 0, not necessarily whole) degrees of freedom."""
    if x < 0:
        return 1.0 - t_cdf(-x, df, intervals)
    pdf = t_density(df)
    h = x / intervals
    odd = sum(pdf((2 * k - 1) * h) for k in range(1, intervals // 2 + 1))
    even = sum(pdf(2 * k * h) for k in range(1, intervals // 2))
    return 0.5 + h / 3 * (pdf(0.0) + 4 * odd + 2 * even + pdf(x))


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile (0.5 <= p < 1) of Student's t with ``df`` degrees of freedom: Newton's
    steps on the CDF from 0. The CDF is concave there, so each step lands between the last point
    and the quantile, never past it: a few CDF evaluations where bisection took forty (a rendered
    Table 3 asks for hundreds of quantiles)."""
    pdf = t_density(df)
    x, below = 0.0, p - 0.5
    for _ in range(200):
        step = below / pdf(x)
        x += step
        if step <= 1e-13 * x:
            break
        below = p - t_cdf(x, df)
    return x


def difference_noise(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> float:
    """Half-width of the ``level`` confidence interval of mean(a) - mean(b) (Welch): a change
    inside it is within seed noise. Needs at least 2 values a side; 0 when neither varies."""
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se2 = va + vb
    if se2 == 0:
        return 0.0
    df = se2 ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return t_quantile(0.5 + level / 2, df) * math.sqrt(se2)
