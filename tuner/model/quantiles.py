"""Quantiles of the normal and t distributions for intervals and bounds.

They come from scipy.special's ndtri and stdtrit, the functions scipy.stats' `norm.ppf` and
`t.ppf` call for 0 < p < 1 (scipy 1.17: `_norm_ppf`, `t_gen._ppf`), so the figures are the
same to the last bit; importing scipy.stats instead takes about a second of every command's
start-up on two cores, and a command like `recommend` needs only these two quantiles of it.
"""

from __future__ import annotations

import math

from scipy import special


def norm_ppf(p: float) -> float:
    """The standard normal distribution's p-quantile (-inf at 0, inf at 1)."""
    if p <= 0.0:
        return -math.inf
    if p >= 1.0:
        return math.inf
    return float(special.ndtri(p))


def t_ppf(p: float, df: float) -> float:
    """The t distribution's p-quantile for df degrees of freedom (NaN where df is not above
    0, as scipy.stats gives)."""
    if math.isnan(df) or df <= 0:
        return math.nan
    if p <= 0.0:
        return -math.inf
    if p >= 1.0:
        return math.inf
    return float(special.stdtrit(df, p))
