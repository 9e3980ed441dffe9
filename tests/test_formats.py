"""The sparse formats: pattern invariants, exact round trips, pruning optimality, the packed layout, errors."""

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from samoyeds_vllm.errors import PatternError
from samoyeds_vllm.formats import (
    PackedWeight,
    Pattern,
    check,
    check_packed,
    compress,
    decompress,
    prune,
    prune_mask,
    satisfies,
    wanda_scores,
)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
PATTERNS = [Pattern.parse("2:4")] + [Pattern.parse("samoyeds", v) for v in (32, 64, 128)]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                reason="CUDA tensors need a GPU"))]


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(INT_VIEW[a.dtype]), b.view(INT_VIEW[b.dtype]))


@st.composite
def weights(draw, pattern=None):
    """A random dense weight [experts?, m, k] whose shape fits a (drawn) pattern."""
    pattern = pattern or draw(st.sampled_from(PATTERNS))
    unit = pattern.segment if pattern.is_samoyeds else 32
    m = 2 * draw(st.integers(1, 12))
    k = unit * draw(st.integers(1, 4))
    lead = draw(st.sampled_from([(), (1,), (3,)]))
    dtype = draw(st.sampled_from(DTYPES))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(*lead, m, k, generator=gen).to(dtype)
    # Sprinkle exact zeros so groups with fewer than two non-zeros occur too.
    zero_frac = draw(st.sampled_from([0.0, 0.3, 0.9]))
    w[torch.rand(w.shape, generator=gen) < zero_frac] = 0
    return pattern, w


@settings(max_examples=60, deadline=None)
@given(weights())
def test_prune_compress_decompress_round_trip(case):
    pattern, w = case
    pruned = prune(w, pattern)
    assert satisfies(pruned, pattern)
    # Pruning only zeroes entries; every kept entry is the original value.
    kept = pruned != 0
    assert torch.equal(pruned[kept], w[kept])
    # No more than the pattern's density survives, exactly that when nothing was zero to begin with.
    if bool((w != 0).all()):
        assert int(kept.sum()) == int(pattern.density * w.numel())
    else:
        assert int(kept.sum()) <= int(pattern.density * w.numel())
    packed = compress(pruned, pattern)
    shapes = pattern.packed_shapes(w.shape)
    assert {k: tuple(getattr(packed, k).shape) for k in shapes} == shapes
    check_packed(packed, pattern, tuple(w.shape))
    assert bit_equal(decompress(packed, pattern), pruned)


@settings(max_examples=30, deadline=None)
@given(weights())
def test_satisfying_tensor_is_kept_bit_for_bit(case):
    """A tensor already on the pattern is neither changed by prune nor by the pack round trip, even where a
    kept value is -0.0."""
    pattern, w = case
    on_pattern = prune(w, pattern)
    kept = (on_pattern != 0).nonzero()
    on_pattern[tuple(kept[::2].T)] = -0.0
    assert bit_equal(prune(on_pattern, pattern), on_pattern)
    assert bit_equal(decompress(compress(on_pattern, pattern), pattern), on_pattern)


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
                    best += max(_best_2of4(s[e, r, c:c + v].tolist()), _best_2of4(s[e, r + 1, c:c + v].tolist()))
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


def test_metadata_layout_is_the_documented_one():
    """Pins format version 1: group c's nibble p0 | p1 << 2 at bits 4c, int16 per 16 inputs; row pairs."""
    pattern = Pattern.parse("2:4")
    row = torch.zeros(1, 32)
    kept = [(0, 1), (2, 3), (0, 3), (1, 2), (0, 2), (1, 3), (0, 1), (2, 3)]
    for g, (a, b) in enumerate(kept):
        row[0, 4 * g + a], row[0, 4 * g + b] = 10 * g + 1, 10 * g + 2
    packed = compress(row, pattern)
    nibbles = [a | b << 2 for a, b in kept]
    words = [sum(n << 4 * c for c, n in enumerate(nibbles[i:i + 4])) for i in (0, 4)]
    assert [w & 0xFFFF for w in packed.meta[0].tolist()] == words
    assert packed.values[0].tolist() == [v for g in range(8) for v in (10 * g + 1, 10 * g + 2)]
    # An all-zero group still names a valid pair, the lowest positions.
    assert compress(torch.zeros(1, 32), pattern).meta[0].tolist() == [0x4444, 0x4444]

    samoyeds = Pattern.parse("samoyeds", 32)
    w = torch.zeros(2, 64)
    w[1, :32] = prune(torch.randn(1, 32), pattern)  # segment 0: row 1 kept
    w[0, 32:] = prune(torch.randn(1, 32), pattern)  # segment 1: row 0 kept
    packed = compress(w, samoyeds)
    assert packed.rowsel.tolist() == [[1, 0]]
    assert torch.equal(packed.values, torch.cat([compress(w[1:, :32], pattern).values,
                                                 compress(w[:1, 32:], pattern).values], dim=1))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pattern", PATTERNS, ids=str)
def test_batched_experts_match_per_expert(pattern, device):
    """Packing [E, m, k] at once equals packing each expert alone, on CPU and CUDA tensors."""
    w = prune(torch.randn(4, 64, 256, dtype=torch.bfloat16, device=device), pattern)
    batched = compress(w, pattern)
    for e in range(4):
        single = compress(w[e], pattern)
        for part in PackedWeight._fields:
            if single._asdict()[part] is not None:
                assert torch.equal(getattr(batched, part)[e], getattr(single, part))
    assert batched.values.device.type == device
    assert bit_equal(decompress(batched, pattern), w)


@pytest.mark.parametrize(
    "pattern, shape, words",
    [
        (Pattern.parse("samoyeds"), (7, 128), "out_features 7 is odd"),
        (Pattern.parse("samoyeds"), (8, 192), "not a multiple of the segment size 128"),
        (Pattern.parse("samoyeds", 64), (8, 96), "not a multiple of the segment size 64"),
        (Pattern.parse("2:4"), (8, 48), "not a multiple of 32"),
        (Pattern.parse("2:4"), (64,), "is not a matrix"),
    ],
)
def test_shapes_that_do_not_fit_name_tensor_and_rule(pattern, shape, words):
    for fn in (prune, compress, satisfies):
        with pytest.raises(PatternError, match=words) as err:
            fn(torch.randn(shape), pattern, name="layers.3.experts.1.w2.weight")
        assert "layers.3.experts.1.w2.weight" in str(err.value)


def test_bad_pattern_arguments():
    with pytest.raises(PatternError, match="unknown sparsity pattern"):
        Pattern.parse("1:8")
    with pytest.raises(PatternError, match="segment must be one of"):
        Pattern.parse("samoyeds", 48)
    with pytest.raises(PatternError, match="only applies to the samoyeds"):
        Pattern.parse("2:4", 128)
    with pytest.raises(PatternError, match="dtype torch.int32 is not supported"):
        prune(torch.ones(2, 32, dtype=torch.int32), Pattern.parse("2:4"))


def test_compress_refuses_a_tensor_off_the_pattern():
    w = torch.randn(2, 4, 256)
    with pytest.raises(PatternError, match=r"w13 does not satisfy the 2:4 pattern: expert 0, row 0"):
        compress(w, Pattern.parse("2:4"), name="w13")
    almost = prune(w, Pattern.parse("samoyeds"))
    almost[1, 2, 130] = almost[1, 3, 130] = 1.0  # both rows of pair 1 now used in segment 1
    with pytest.raises(PatternError, match=r"expert 1, rows 2 and 3 both have non-zeros in inputs 128..255"):
        check(almost, Pattern.parse("samoyeds"), name="w13")


def test_check_packed_finds_corruption():
    pattern = Pattern.parse("samoyeds")
    w = prune(torch.randn(8, 256), pattern)
    packed = compress(w, pattern)
    check_packed(packed, pattern, (8, 256), name="x.weight")
    bad_meta = packed.meta.clone()
    bad_meta[0, 0] = 0  # nibble 0b0000: positions (0, 0)
    with pytest.raises(PatternError, match="invalid position pair"):
        check_packed(packed._replace(meta=bad_meta), pattern, (8, 256), name="x.weight")
    bad_sel = packed.rowsel.clone()
    bad_sel[1, 1] = 2
    with pytest.raises(PatternError, match="row selectors must be uint8 values 0 or 1"):
        check_packed(packed._replace(rowsel=bad_sel), pattern, (8, 256), name="x.weight")
    with pytest.raises(PatternError, match=r"packed values has shape \(4, 64\), expected \(4, 128\)"):
        check_packed(packed._replace(values=packed.values[:, :64]), pattern, (8, 256), name="x.weight")
    with pytest.raises(PatternError, match="packed rowsel tensor is missing"):
        check_packed(packed._replace(rowsel=None), pattern, (8, 256), name="x.weight")
