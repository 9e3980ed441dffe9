"""The sparse format: pattern invariants, exact round trips, the packed layout, errors."""

import pytest
import torch
from helpers import PATTERNS, weights
from hypothesis import given, settings

from samoyeds_vllm.errors import PatternError
from samoyeds_vllm.format import (
    FP8,
    FP8_MAX,
    PackedWeight,
    Pattern,
    check,
    check_packed,
    compress,
    decompress,
    prune,
    prune_mask,
    quantize,
    satisfies,
)
from samoyeds_vllm.kernels.weights import fp8_checkpoint_order, fp8_kernel_order

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA tensors need a GPU")),
]


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(INT_VIEW[a.dtype]), b.view(INT_VIEW[b.dtype]))


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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pattern", PATTERNS, ids=str)
def test_pruning_breaks_ties_the_same_way_everywhere(pattern, device):
    """Equal magnitudes (FP8 checkpoints are full of them) keep the earlier weights of a group, on every device, so
    sparsify-on-load on a GPU keeps what the converter kept on a CPU."""
    levels = torch.randint(0, 3, (64, 256), generator=torch.Generator().manual_seed(0)).float()  # many ties
    w = levels.to(device)
    groups = w.reshape(64, 64, 4)
    keys = groups * 4 + (3 - torch.arange(4, device=device))  # the same order, ties broken by position
    first_two = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, keys.topk(2, dim=-1).indices, True)
    mask = prune_mask(w, pattern)
    if pattern.is_samoyeds:  # the kept rows' 2:4 choice, nothing elsewhere
        assert not (mask & ~first_two.reshape(64, 256)).any()
    else:
        assert torch.equal(mask, first_two.reshape(64, 256))
    assert torch.equal(mask.cpu(), prune_mask(w.cpu(), pattern))


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


def test_metadata_layout_is_the_documented_one():
    """Pins format version 1: group c's nibble p0 | p1 << 2 at bits 4c, int16 per 16 inputs; row pairs."""
    pattern = Pattern.parse("2:4")
    row = torch.zeros(1, 32)
    kept = [(0, 1), (2, 3), (0, 3), (1, 2), (0, 2), (1, 3), (0, 1), (2, 3)]
    for g, (a, b) in enumerate(kept):
        row[0, 4 * g + a], row[0, 4 * g + b] = 10 * g + 1, 10 * g + 2
    packed = compress(row, pattern)
    nibbles = [a | b << 2 for a, b in kept]
    words = [sum(n << 4 * c for c, n in enumerate(nibbles[i : i + 4])) for i in (0, 4)]
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
    assert torch.equal(
        packed.values, torch.cat([compress(w[1:, :32], pattern).values, compress(w[:1, 32:], pattern).values], dim=1)
    )


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


# ------------------------------------------------------------------------------------------- FP8 values


@pytest.mark.parametrize("pattern", [Pattern.parse("2:4"), Pattern.parse("samoyeds", 32), Pattern.parse("samoyeds")])
def test_fp8_values_keep_positions_and_scale_each_output_row(pattern):
    w = prune(torch.randn(3, 64, 256, generator=torch.Generator().manual_seed(0)).bfloat16(), pattern)
    packed = compress(w, pattern)
    q = quantize(packed, pattern)
    assert q.values.dtype == FP8 and q.scale.shape == (3, 64) and q.scale.dtype == torch.float32
    assert torch.equal(q.meta, packed.meta) and (q.rowsel is None or torch.equal(q.rowsel, packed.rowsel))
    check_packed(q, pattern, tuple(w.shape))
    dense = decompress(q, pattern)
    # each row's largest kept magnitude maps to FP8_MAX, so it comes back (to float32 rounding of scale * 448)
    assert torch.allclose(dense.abs().amax(-1), w.float().abs().amax(-1), rtol=1e-6, atol=0)
    assert bool(((dense != 0) <= (w != 0)).all())  # nothing outside the pattern
    assert float((dense - w.float()).norm() / w.float().norm()) < 0.035  # e4m3: 3 mantissa bits
    assert float(q.values.float().abs().max()) == FP8_MAX


def test_fp8_rows_without_weights_get_scale_one():
    w = torch.zeros(2, 32, 64)
    q = quantize(compress(w, Pattern.parse("2:4")), Pattern.parse("2:4"))
    assert bool((q.scale == 1).all()) and not bool(decompress(q, Pattern.parse("2:4")).any())


@pytest.mark.parametrize("bad, words", [(0.0, "not finite and positive"), (float("nan"), "not finite"), (-1.0, "")])
def test_damaged_fp8_scales_are_refused(bad, words):
    pattern = Pattern.parse("samoyeds")
    w = prune(torch.randn(4, 256, dtype=torch.bfloat16), pattern)
    q = quantize(compress(w, pattern), pattern)
    q.scale[2] = bad
    with pytest.raises(PatternError, match=f"w13: 1 scales are {words}"):
        check_packed(q, pattern, tuple(w.shape), name="w13")
    with pytest.raises(PatternError, match="packed scale has shape"):
        check_packed(q._replace(scale=q.scale[:3]), pattern, tuple(w.shape), name="w13")


def test_fp8_kernel_order_round_trips_and_groups_each_threads_columns():
    values = (torch.randn(2, 5, 256) * 20).to(FP8)
    ordered = fp8_kernel_order(values)
    assert ordered.dtype == torch.uint8
    assert torch.equal(fp8_checkpoint_order(ordered).view(torch.uint8), values.view(torch.uint8))
    row, stored = values.view(torch.uint8)[1, 3, 64:128], ordered[1, 3, 64:128]
    for t in range(4):  # thread t's 16 bytes: for each k-step, columns 2t, 2t + 1, 2t + 8, 2t + 9
        for ks in range(4):
            cols = [16 * ks + 2 * t, 16 * ks + 2 * t + 1, 16 * ks + 2 * t + 8, 16 * ks + 2 * t + 9]
            assert stored[16 * t + 4 * ks : 16 * t + 4 * ks + 4].tolist() == row[cols].tolist()
