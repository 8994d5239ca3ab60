"""Pearson's chi-square goodness-of-fit test, and its power: how many samples a test needs.

``chi_square_pvalue`` is the test the distribution tests run (p-value from torch's incomplete gamma;
a test passes when the p-value is above ``ALPHA``, so ``ALPHA`` is its false-failure rate for a
correct sampler).  Its power against a wrong sampler whose law is ``wrong`` instead of ``probs``
is that of the noncentral chi-square: with the same pooling of small cells, the statistic of n
draws is approximately chi-square with ``dof`` degrees of freedom and noncentrality
``lambda = n * sum((wrong - probs)^2 / probs)`` over the pooled cells.  A draw in a cell that
``probs`` gives probability 0 fails the test outright, which ``power`` adds.  ``sample_size`` is
the smallest n whose power reaches a goal.  A wrong sampler whose law has no closed form (a whole
engine with a bug put in) is given by the counts of many draws from it (``draws``): lambda is then
estimated without bias from them.  Checked against simulation: for ``residual_is_p`` on the 6 tokens
of test_distribution's "close" case, 2,000 simulated tests each reject at rates 0.48, 0.95, 0.999
for n = 2,000, 4,000, 6,000, where ``power`` says 0.47, 0.93, 0.997.
"""

import math

import torch

ALPHA = 1e-3        # every distribution test's p-value threshold: its false-failure rate
POWER = 0.99        # the power each test is sized for, against its named wrong sampler


def _pooled(x: torch.Tensor, big: torch.Tensor) -> torch.Tensor:
    """x [n] with the cells outside ``big`` summed into one last cell."""
    return torch.cat([x[big], x[~big].sum().view(1)])


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """p-value of observing ``counts`` [n] under ``probs`` [n].

    Cells with expected count below ``min_expected`` are pooled into one cell; a draw in a cell of
    probability zero returns 0.0 (impossible outcome).
    """
    counts, probs = counts.double(), probs.double()
    total = counts.sum()
    if bool(((probs <= 0) & (counts > 0)).any()):
        return 0.0
    expected = probs * total
    big = expected >= min_expected
    obs, exp = _pooled(counts, big), _pooled(expected, big)
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = ((obs - exp) ** 2 / exp).sum()
    dof = obs.numel() - 1
    if dof < 1:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), stat / 2))


def _chi2_sf(x: float, dof: torch.Tensor) -> torch.Tensor:
    """P(chi-square(dof) > x), elementwise over dof."""
    return torch.special.gammaincc(dof.double() / 2, torch.tensor(x / 2, dtype=torch.float64))


def critical_value(dof: int, alpha: float = ALPHA) -> float:
    """The statistic whose p-value is alpha (the test fails at or above it), by bisection."""
    lo, hi = 0.0, dof + 20.0 * math.sqrt(2 * dof) + 100.0
    d = torch.tensor([float(dof)])
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if float(_chi2_sf(mid, d)) > alpha else (lo, mid)
    return hi


def noncentral_sf(x: float, dof: int, lam: float) -> float:
    """P(noncentral chi-square(dof, lam) > x): a Poisson(lam / 2) mixture of central chi-squares."""
    half = lam / 2
    width = 12 * math.sqrt(half) + 30
    j = torch.arange(max(0, int(half - width)), int(half + width) + 1, dtype=torch.float64)
    weights = torch.exp(-half + j * math.log(half) - torch.lgamma(j + 1)) if half > 0 else (j == 0).double()
    return float((weights * _chi2_sf(x, dof + 2 * j)).sum().clamp(0, 1))


def noncentrality(probs: torch.Tensor, wrong: torch.Tensor, n: int, min_expected: float = 5.0,
                  draws: int | None = None) -> tuple[float, int]:
    """(lambda, dof) of the test of n draws from ``wrong`` against ``probs``, with the test's pooling
    (cells where ``probs`` is 0 left out: ``power`` counts them apart).  ``draws``: ``wrong`` is not
    a law but the counts of that many draws from the wrong sampler; lambda is then estimated without
    bias, sum over pooled cells of [(f - p)^2 - f (1 - f) / (draws - 1)] / p (f: the frequencies)."""
    probs, wrong = probs.double(), wrong.double()
    live = probs > 0
    probs, wrong = probs[live], wrong[live] / wrong[live].sum()
    big = probs * n >= min_expected
    p, w = _pooled(probs, big), _pooled(wrong, big)
    keep = p > 0
    p, w = p[keep], w[keep]
    d2 = (w - p) ** 2
    if draws is not None:
        d2 = d2 - w * (1 - w) / (draws - 1)
    return max(0.0, float(n * (d2 / p).sum())), p.numel() - 1


def power(probs: torch.Tensor, wrong: torch.Tensor, n: int, alpha: float = ALPHA, min_expected: float = 5.0,
          draws: int | None = None) -> float:
    """P(the test of n draws from ``wrong`` fails), i.e. its p-value is at most alpha; ``draws`` as
    for ``noncentrality``."""
    wrong = wrong.double() / wrong.double().sum()
    impossible = float(wrong[probs <= 0].sum())                     # mass where probs is 0: certain failure
    if impossible >= 1:
        return 1.0
    lam, dof = noncentrality(probs, wrong, n, min_expected, draws)
    chi = noncentral_sf(critical_value(dof, alpha), dof, lam) if dof >= 1 else 0.0
    return 1 - (1 - impossible) ** n * (1 - chi)


def sample_size(probs: torch.Tensor, wrong: torch.Tensor, goal: float = POWER, alpha: float = ALPHA,
                min_expected: float = 5.0, draws: int | None = None, most: int = 10 ** 7) -> int:
    """The smallest n (to 1%) whose power reaches ``goal``, checked to stay reached at 1.1, 1.25 and 2
    times it (power is not quite monotone in n: the pooling of small cells changes with n); ``most``
    when even that many draws fall short."""
    def ok(m: int) -> bool:
        return power(probs, wrong, m, alpha, min_expected, draws) >= goal
    hi = 16
    while not ok(hi):
        hi *= 2
        if hi > most:
            return most
    lo = hi // 2
    while hi - lo > max(1, lo // 100):
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    while hi < most and not all(ok(m) for m in (int(hi * 1.1), int(hi * 1.25), hi * 2)):
        hi = int(hi * 1.1) + 1
    return min(hi, most)
