"""The noise of a change from base: the 95% confidence half-width of a difference of two means.

Two sources: seeds (Welch's t interval: unequal variances, degrees of freedom by
Welch-Satterthwaite) and, where the records keep per-sentence evidence, the sample of sentences
(``sentence_noise``: the variance of the difference over resamples of the sentences). The two
variances add; the interval takes Student's t with Satterthwaite's degrees of freedom, the
sentence term counted as known (a thousand resamples: its own degrees of freedom are many).

With three seeds a side, 2 standard errors (a normal interval) would be a ~88% interval: Student's
t with ~4 degrees of freedom puts the 97.5% point at 2.78, not 1.96. Plain Python: the t quantile
by Newton's method on its CDF, the regularized incomplete beta function by its continued fraction
(no scipy among the dependencies).
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


def t_cdf(x: float, df: float) -> float:
    """P(T <= x) for Student's t with ``df`` (> 0, not necessarily whole) degrees of freedom:
    1 - I_z(df/2, 1/2) / 2 for x >= 0, z = df / (df + x^2) (Abramowitz & Stegun 26.7.1 with
    26.5.27), 1 - z computed as x^2 / (df + x^2) so that no digits cancel near 0."""
    if x < 0:
        return 1.0 - t_cdf(-x, df)
    return 1.0 - 0.5 * _incomplete_beta(df / 2, 0.5, df / (df + x * x), x * x / (df + x * x))


def _incomplete_beta(a: float, b: float, z: float, one_minus_z: float) -> float:
    """The regularized incomplete beta function I_z(a, b), by its continued fraction on the side
    of (a + 1) / (a + b + 2) where that converges fast (Numerical Recipes, 2nd ed., 6.4)."""
    if z <= 0.0:
        return 0.0
    if one_minus_z <= 0.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(z)
                     + b * math.log(one_minus_z))
    if z < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, z) / a
    return 1.0 - front * _beta_fraction(b, a, one_minus_z) / b


def _beta_fraction(a: float, b: float, z: float, tiny: float = 1e-300) -> float:
    """The incomplete beta's continued fraction at ``z``, by Lentz's method to double precision."""
    def bounded(v: float) -> float:
        return v if abs(v) >= tiny else tiny

    c, d = 1.0, 1.0 / bounded(1.0 - (a + b) * z / (a + 1))
    fraction = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * z / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * z / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 / bounded(1.0 + numerator * d)
            c = bounded(1.0 + numerator / c)
            fraction *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return fraction


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
