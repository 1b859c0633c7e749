"""
The lab's statistics (studies/ablate.py's tables): how a row compares with another, and what that says of a paper's
claim.

The rows of a table share each seed's data order and, where their shapes allow, its initial state, so a row is
compared with another seed by seed: d_s = x_s - x0_s for each seed s both ran, then the mean of the n differences
and its 95% interval, Student's t with n - 1 degrees of freedom,

    mean(d) ± t(0.975, n - 1) · sd(d) / sqrt(n)        (sd with ddof=1)

A row is told apart from the other where the interval excludes 0. Its half-width is the smallest difference the
seeds could have told apart (the power said beside every "not told apart"); one seed gives no interval.

A claim (studies/claims.py) says which way a row compares with another on one metric: 'lower' or 'higher',
'not_higher' / 'not_lower' (matches or beats), or 'comparable'. Its verdict: holds where the interval lies on the
claimed side of 0 (for 'not_higher': below it), contradicted where it lies on the other, else not told apart at this
budget, with the half-width. A comparable pair is contradicted where the interval excludes 0 on either side, else
not told apart: seeds bound a difference, they never show there is none. A claim of a bound compares the row with a
number instead (against_threshold: d_s = x_s - threshold, the same interval), and a claim whose premise the table
does not show (studies/claims.py's Premise) is untestable here.
"""
import math

import numpy as np


def t_two_sided(t, df):
    """P(|T| <= t) for Student's t with integer df degrees of freedom (Abramowitz and Stegun 26.7.3 and 26.7.4: a
    finite sum in θ = atan(t / sqrt(df)))."""
    theta = math.atan(t / math.sqrt(df))
    c2, term, total = math.cos(theta) ** 2, 1.0, 1.0
    if df % 2:  # odd: (2/π)(θ + sin θ cos θ (1 + 2/3 cos²θ + (2·4)/(3·5) cos⁴θ + ...)), (df - 3)/2 terms after 1
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        return 2 / math.pi * (theta + (math.sin(theta) * math.cos(theta) * total if df > 1 else 0.0))
    for k in range(1, df // 2):  # even: sin θ (1 + 1/2 cos²θ + (1·3)/(2·4) cos⁴θ + ...)
        term *= c2 * (2 * k - 1) / (2 * k)
        total += term
    return math.sin(theta) * total


def t_quantile(level, df):
    """t with P(|T| <= t) = level (0.95: the 97.5th percentile), by bisection on t_two_sided."""
    low, high = 0.0, 1.0
    while t_two_sided(high, df) < level:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if t_two_sided(mid, df) < level else (low, mid)
    return (low + high) / 2


def paired(values, against, level=0.95):
    """How a row's values compare with another row's, seed by seed ({seed: value} each; the seeds both have):
    {'n', 'seeds', 'diffs', 'mean', 'half_width', 'low', 'high', 'apart'}, apart -1 or +1 where the interval lies
    below or above 0, 0 where it holds 0; half_width, low, high and apart None for a single seed."""
    seeds = [s for s in values if s in against]
    diffs = [values[s] - against[s] for s in seeds]
    n = len(diffs)
    mean = float(np.mean(diffs)) if n else None
    if n < 2:
        return {'n': n, 'seeds': seeds, 'diffs': diffs, 'mean': mean, 'half_width': None, 'low': None, 'high': None,
                'apart': None}
    half = t_quantile(level, n - 1) * float(np.std(diffs, ddof=1)) / math.sqrt(n)
    low, high = mean - half, mean + half
    return {'n': n, 'seeds': seeds, 'diffs': diffs, 'mean': mean, 'half_width': half, 'low': low, 'high': high,
            'apart': 1 if low > 0 else -1 if high < 0 else 0}


def against_threshold(values, threshold, level=0.95):
    """paired of a row's values ({seed: value}) against a fixed number: each seed's value − threshold."""
    return paired(values, dict.fromkeys(values, threshold), level)


def verdict(way, comparison):
    """A claim's verdict from its paired comparison (paired): 'holds', 'contradicted', 'not told apart' or 'one
    seed'. way: 'lower' or 'higher' (the row's metric against the other's), 'not_higher' or 'not_lower' (matches or
    beats), 'comparable' (never holds: contradicted where told apart either way)."""
    if comparison['half_width'] is None:
        return 'one seed'
    if not comparison['apart']:
        return 'not told apart'
    if way == 'comparable':
        return 'contradicted'
    side = 'lower' if comparison['apart'] < 0 else 'higher'
    return 'holds' if way in (side, f"not_{'higher' if side == 'lower' else 'lower'}") else 'contradicted'
