"""Pearson's chi-square goodness-of-fit test, with the p-value from torch's incomplete gamma."""

import torch


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
    obs = torch.cat([counts[big], counts[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = ((obs - exp) ** 2 / exp).sum()
    dof = obs.numel() - 1
    if dof < 1:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), stat / 2))
