"""The launch choices the GPU kernels make from shapes alone (split-K, token tiles): pure functions, run on CPU.

The expected values are the choices the H100 sweeps picked (benchmarks/results/h100-2026-11-22-s4/splits-*.json).
"""

import pytest

from samoyeds_vllm import kernels

SMS = 132  # H100 SXM


@pytest.mark.parametrize("samoyeds, row_tiles, slots, experts, k_tiles, expected", [
    (True, 6, 8, 128, 16, 4),     # Qwen3 samoyeds gate/up at T = 1: 53 blocks for 132 SMs
    (False, 12, 8, 128, 16, 2),   # Qwen3 2:4 gate/up at T = 1: 105 blocks
    (True, 16, 8, 128, 6, 1),     # Qwen3 samoyeds down at T = 1: 141 blocks fill the SMs
    (True, 6, 32, 128, 16, 1),    # Qwen3 samoyeds gate/up at T = 4: 195 blocks
    (True, 32, 2, 8, 112, 6),     # Mixtral samoyeds down at T = 1: 68 blocks of a long K (wants two per SM)
    (False, 64, 2, 8, 112, 3),    # Mixtral 2:4 down at T = 1: 136 blocks, still under two per SM
])
def test_split_k_choices(samoyeds, row_tiles, slots, experts, k_tiles, expected):
    bn = kernels._token_tile(slots, experts, samoyeds)
    assert kernels._splits(row_tiles, slots, experts, bn, k_tiles, SMS) == expected


@pytest.mark.parametrize("slots", [1, 8, 64, 512, 4096, 131072])
@pytest.mark.parametrize("k_tiles", [4, 6, 11, 16, 32, 112])
def test_splits_keep_four_k_tiles_and_stop_at_full_gpus(slots, k_tiles):
    """Every split keeps at least four k tiles for the pipeline (or none is made), and a GEMM with a block per SM
    (two for long K) is never split."""
    for row_tiles in (1, 6, 32, 112):
        z = kernels._splits(row_tiles, slots, 128, 8, k_tiles, SMS)
        assert 1 <= z <= kernels.MAX_SPLITS
        assert z == 1 or k_tiles // z >= 4
    wanted = SMS * (2 if k_tiles >= kernels.LONG_K_TILES else 1)
    assert kernels._splits(wanted, slots, 128, 8, k_tiles, SMS) == 1  # at least one expert: >= wanted blocks


def test_kernel_rowsel_is_segment_major_with_the_same_values():
    """The kernels copy a stage's row selections of 16 rows with one 16-byte copy: rowsel [E, R, K/V] must be
    stored segment-major. kernel_rowsel gives that layout (same shape and values) and leaves such a tensor as is."""
    import torch

    rowsel = torch.randint(0, 2, (3, 64, 8), dtype=torch.uint8)
    stored = kernels.kernel_rowsel(rowsel)
    assert torch.equal(stored, rowsel) and stored.shape == rowsel.shape
    assert stored.stride() == (64 * 8, 1, 64)  # segment s of row r at byte s * R + r of the expert
    assert kernels.kernel_rowsel(stored) is stored
    assert kernels.kernel_rowsel(None) is None
