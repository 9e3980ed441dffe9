"""Pruning onto a pattern: the kept mask is the best one for the scores, Wanda's scores change the choice, and
SparseGPT's updates lower the output error further."""

import itertools

import pytest
import torch
from helpers import weights
from hypothesis import given, settings
from hypothesis import strategies as st

from samoyeds_vllm.format import Pattern, prune, prune_mask, satisfies
from samoyeds_vllm.tools.pruning import output_error, sparsegpt, wanda_scores


def _best_2of4(scores_row):
    """Reference: total of the 2 largest scores in each group of 4, by brute force."""
    total = 0.0
    for g in range(0, len(scores_row), 4):
        total += max(scores_row[g + a] + scores_row[g + b] for a, b in itertools.combinations(range(4), 2))
    return total


@settings(max_examples=40, deadline=None)
@given(weights(), st.booleans())
def test_prune_keeps_the_largest_scores(case, use_wanda):
    """The kept mask has the largest total score of any pattern-valid mask (checked by brute force)."""
    pattern, w = case
    scores = w.abs().float()
    if use_wanda:
        norms = torch.rand(w.shape[-1], generator=torch.Generator().manual_seed(1)) * 10
        scores = wanda_scores(w, norms)
        assert torch.allclose(scores, w.abs().float() * norms)
    mask = prune_mask(scores, pattern)
    s = scores.reshape(-1, *scores.shape[-2:])
    mk = mask.reshape(-1, *mask.shape[-2:])
    for e in range(s.shape[0]):
        kept_total = float(s[e][mk[e]].sum())
        if pattern.is_samoyeds:
            v = pattern.segment
            best = 0.0
            for r in range(0, s.shape[1], 2):
                for c in range(0, s.shape[2], v):
                    best += max(_best_2of4(s[e, r, c : c + v].tolist()), _best_2of4(s[e, r + 1, c : c + v].tolist()))
        else:
            best = sum(_best_2of4(row.tolist()) for row in s[e])
        assert kept_total == pytest.approx(best, rel=1e-5, abs=1e-5)


def test_wanda_changes_the_choice():
    """Scaling an input channel's activation norm makes Wanda keep it where magnitude would not."""
    w = torch.tensor([[1.0, 0.75, 0.125, 0.0625] * 8])
    pattern = Pattern.parse("2:4")
    norms = torch.ones(32)
    norms[2::4] = 100.0
    by_magnitude = prune(w, pattern)
    by_wanda = prune(w, pattern, scores=wanda_scores(w, norms))
    assert by_magnitude[0, :4].tolist() == [1.0, 0.75, 0.0, 0.0]
    assert by_wanda[0, :4].tolist() == [1.0, 0.0, 0.125, 0.0]


def _correlated_problem(seed: int, experts: int = 3, m: int = 32, k: int = 256, n: int = 1024):
    """Weights and inputs with correlated, unequally scaled channels (as real activations have)."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(k, k, generator=g) / k**0.5
    x = torch.randn(experts, n, k, generator=g) @ mix + torch.randn(experts, 1, k, generator=g) * 3 * torch.rand(
        k, generator=g
    )
    w = torch.randn(experts, m, k, generator=g) / k**0.5
    return w, x


@pytest.mark.parametrize("pattern", [Pattern.parse("2:4"), Pattern.parse("samoyeds", 64), Pattern.parse("samoyeds")])
def test_sparsegpt_output_error_below_wanda_and_magnitude(pattern):
    """On the inputs it was calibrated on, SparseGPT's ||XW - XP|| is below Wanda's, which is below magnitude's;
    its weights satisfy the pattern."""
    w, x = _correlated_problem(0)
    hessian = x.transpose(-1, -2) @ x
    pruned = {
        "magnitude": prune(w, pattern),
        "wanda": prune(w, pattern, scores=wanda_scores(w, x.norm(dim=1))),
        "sparsegpt": sparsegpt(w, hessian, pattern),
    }
    assert satisfies(pruned["sparsegpt"], pattern)
    error = {}
    for method, p in pruned.items():
        err, ref = output_error(w, p, hessian)
        direct = (x @ (w - p).transpose(-1, -2)).square().sum() / (x @ w.transpose(-1, -2)).square().sum()
        assert err / ref == pytest.approx(float(direct), rel=1e-3)  # the Hessian form is the real output error
        error[method] = err / ref
    assert error["sparsegpt"] < error["wanda"] < error["magnitude"]


def test_sparsegpt_is_deterministic_and_handles_dead_inputs():
    w, x = _correlated_problem(1, experts=2)
    x[..., :8] = 0  # inputs never seen: their weights are dropped, and the Hessian is singular there
    hessian = x.transpose(-1, -2) @ x
    a = sparsegpt(w, hessian, Pattern.parse("samoyeds", 32))
    b = sparsegpt(w, hessian, Pattern.parse("samoyeds", 32))
    assert torch.equal(a, b)
    assert torch.isfinite(a).all()
    assert (a[..., :8] == 0).all()
