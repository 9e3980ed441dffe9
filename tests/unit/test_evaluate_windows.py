"""The windows `eval` scores: every token of a document exactly once, each with as much context as promised."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from samoyeds_vllm.errors import SamoyedsError
from samoyeds_vllm.tools.evaluate import windows


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 300), st.integers(2, 64), st.data())
def test_every_token_scored_once_with_context(length, window, data):
    stride = data.draw(st.integers(1, window))
    ids = list(range(100, 100 + length))
    sep = 7
    seq = [sep, *ids]
    scored = []
    for w in windows(ids, sep, window, stride):
        assert 1 <= w.scored <= len(w.tokens) - 1 + (w.tokens[0] != sep) and len(w.tokens) <= window
        start = seq.index(w.tokens[0]) if w.tokens[0] != sep else 0
        assert seq[start : start + len(w.tokens)] == w.tokens
        first = start + len(w.tokens) - w.scored
        scored += range(first, start + len(w.tokens))
        # A token past the first window sees at least window - stride tokens before it.
        if start > 0:
            assert first - start >= window - stride
    assert scored == list(range(1, length + 1))  # the separator is context, never scored


def test_bad_window_or_stride():
    for window, stride in [(1, 1), (8, 0), (8, 9)]:
        with pytest.raises(SamoyedsError, match="window"):
            windows([1, 2, 3], 0, window, stride)
