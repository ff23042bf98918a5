"""The noise of a change from base: the 95% confidence half-width of a difference of two means.

Two sources: seeds (Welch's t interval: unequal variances, degrees of freedom by
Welch-Satterthwaite) and, where the records keep per-sentence evidence, the sample of sentences
(``sentence_noise``: the variance of the difference over resamples of the sentences). The two
variances add; the interval takes Student's t with Satterthwaite's degrees of freedom, the
sentence term counted as known (a thousand resamples: its own degrees of freedom are many).

With three seeds a side, 2 standard errors (a normal interval) would be a ~88% interval: Student's
t with ~4 degrees of freedom puts the 97.5% point at 2.78, not 1.96. Plain Python: the t quantile
by Newton's method on its CDF, integrated with Simpson's rule (no scipy among the dependencies).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

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


@dataclass(frozen=True)
class Noise:
    """The ``LEVEL`` half-width of a change from base, and what each source alone would give."""

    half_width: float
    seeds: float | None  # Welch's half-width alone; None with fewer than 2 seeds a side
    sentences: float | None  # the sentences' alone (normal); None: no per-sentence evidence

    @property
    def dominant(self) -> str:
        """Which source is the larger: "seeds" or "sentences" (the only one there is)."""
        if self.sentences is None:
            return "seeds"
        return "sentences" if self.seeds is None or self.sentences > self.seeds else "seeds"


def change_noise(a: Sequence[float], b: Sequence[float], sentence_variance: float | None = None,
                 level: float = LEVEL) -> Noise | None:
    """The noise of mean(a) - mean(b): seed variance (with 2 or more values a side) and
    ``sentence_variance`` (``sentence_noise.sentence_variance``) added; None with neither."""
    seeded = len(a) >= 2 and len(b) >= 2
    if not seeded and sentence_variance is None:
        return None
    va, vb = ((statistics.variance(a) / len(a), statistics.variance(b) / len(b)) if seeded
              else (0.0, 0.0))
    sentences = sentence_variance or 0.0
    total = va + vb + sentences
    normal = NormalDist().inv_cdf(0.5 + level / 2)
    spread = va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1) if seeded else 0.0
    df = total ** 2 / spread if spread > 0 else math.inf
    quantile = normal if df > 1e6 else t_quantile(0.5 + level / 2, df)
    return Noise(quantile * math.sqrt(total),
                 difference_noise(a, b, level) if seeded else None,
                 normal * math.sqrt(sentences) if sentence_variance is not None else None)
