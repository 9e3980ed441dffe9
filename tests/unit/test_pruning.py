"""Pruning onto a pattern: the kept mask is the best one for the scores, and Wanda's scores change the choice."""

import itertools

import pytest
import torch
from helpers import weights
from hypothesis import given, settings
from hypothesis import strategies as st

from samoyeds_vllm.format import Pattern, prune, prune_mask
from samoyeds_vllm.tools.pruning import wanda_scores


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
