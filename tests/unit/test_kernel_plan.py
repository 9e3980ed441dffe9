"""The launch plan the GPU kernels take from shapes alone (split-K, token tiles, block shapes) and from kernel
configs (tuned tables, overrides): pure functions, run on CPU.

The expected split factors are the choices the H100 sweeps picked (benchmarks/tune_kernels.py).
"""

import json

import pytest
import torch

from samoyeds_vllm.errors import SamoyedsError
from samoyeds_vllm.format import PackedWeight, Pattern
from samoyeds_vllm.kernels import GemmConfig, KernelConfig, LayerShape, override_config, plan_moe, prepare_weights
from samoyeds_vllm.kernels import plan as kernel_plan
from samoyeds_vllm.kernels.geometry import BlockShape
from samoyeds_vllm.kernels.plan import (
    Device,
    compiled_kernels,
    quantize_grid,
    quantize_row_warps,
    splits_heuristic,
    token_tile_heuristic,
)

SMS = 132  # H100 SXM
H100 = Device("NVIDIA H100 80GB HBM3", (9, 0), SMS, "sm_90a")
A100 = Device("NVIDIA A100-SXM4-80GB", (8, 0), 108, "sm_80")
H200 = Device("NVIDIA H200", (9, 0), 132, "sm_90a")  # the GPU of the shipped tables in configs/kernels/
QWEN3 = dict(top_k=8, num_experts=128, hidden=2048, inter=768)
SAMOYEDS, TWO_FOUR = Pattern.parse("samoyeds"), Pattern.parse("2:4")
GENERAL = KernelConfig(one_token=False)  # one token through the general path (routing index, split-K, slot sum)


@pytest.mark.parametrize(
    "samoyeds, row_blocks, slots, experts, k_tiles, expected",
    [
        (True, 6, 8, 128, 16, 4),  # Qwen3 samoyeds gate/up at T = 1: 53 blocks for 132 SMs
        (False, 12, 8, 128, 16, 2),  # Qwen3 2:4 gate/up at T = 1: 105 blocks
        (True, 16, 8, 128, 6, 1),  # Qwen3 samoyeds down at T = 1: 141 blocks fill the SMs
        (True, 6, 32, 128, 16, 1),  # Qwen3 samoyeds gate/up at T = 4: 195 blocks
        (True, 32, 2, 8, 112, 6),  # Mixtral samoyeds down at T = 1: 68 blocks of a long K (wants two per SM)
        (False, 64, 2, 8, 112, 3),  # Mixtral 2:4 down at T = 1: 136 blocks, still under two per SM
    ],
)
def test_split_k_choices(samoyeds, row_blocks, slots, experts, k_tiles, expected):
    bn = token_tile_heuristic(slots, experts, samoyeds)
    assert splits_heuristic(row_blocks, slots, experts, bn, k_tiles, SMS) == expected


@pytest.mark.parametrize("slots", [1, 8, 64, 512, 4096, 131072])
@pytest.mark.parametrize("k_tiles", [4, 6, 11, 16, 32, 112])
def test_splits_keep_four_k_tiles_and_stop_at_full_gpus(slots, k_tiles):
    """Every split keeps at least four k tiles for the pipeline (or none is made), and a GEMM with a block per SM
    (two for long K) is never split."""
    for row_blocks in (1, 6, 32, 112):
        z = splits_heuristic(row_blocks, slots, 128, 8, k_tiles, SMS)
        assert 1 <= z <= kernel_plan.MAX_SPLITS
        assert z == 1 or k_tiles // z >= 4
    wanted = SMS * (2 if k_tiles >= kernel_plan.LONG_K_TILES else 1)
    assert splits_heuristic(wanted, slots, 128, 8, k_tiles, SMS) == 1  # at least one expert: >= wanted blocks


MIXTRAL = dict(top_k=2, num_experts=8, hidden=4096, inter=14336)
DEEPSEEK_V3 = dict(top_k=8, num_experts=256, hidden=7168, inter=2048)


@pytest.mark.parametrize(
    "shape, pattern, tokens, expected",
    [  # the winners of the H200 tile search (token_tile_heuristic), where the rule picks them
        (QWEN3, SAMOYEDS, 2, 8),
        (QWEN3, SAMOYEDS, 128, 16),  # 8 slots per expert
        (QWEN3, SAMOYEDS, 192, 16),
        (QWEN3, SAMOYEDS, 256, 64),  # 16 slots per expert: the ws kernel from here
        (QWEN3, SAMOYEDS, 512, 64),
        (MIXTRAL, SAMOYEDS, 32, 16),
        (MIXTRAL, SAMOYEDS, 64, 64),
        (DEEPSEEK_V3, SAMOYEDS, 512, 64),
        (QWEN3, TWO_FOUR, 192, 16),  # no 32-token tiles on Hopper
        (QWEN3, TWO_FOUR, 256, 64),
        (QWEN3, TWO_FOUR, 1024, 128),  # 64 slots per expert, twice that past 64: the 128-token ws tiles
        (MIXTRAL, TWO_FOUR, 48, 16),
    ],
)
def test_hopper_token_tiles(shape, pattern, tokens, expected):
    assert plan_moe(LayerShape(tokens, **shape), pattern, torch.bfloat16, H100, fp8=True).token_tile == expected


def test_token_tiles_before_hopper_keep_the_32_token_tiles():
    assert plan_moe(LayerShape(512, **QWEN3), SAMOYEDS, torch.bfloat16, A100).token_tile == 32
    assert plan_moe(LayerShape(256, **QWEN3), TWO_FOUR, torch.bfloat16, A100).token_tile == 32


def test_plans_of_the_qwen3_layer_on_an_h100():
    """The heuristics' plan end to end: decode takes split mma.sp blocks, prefill the warp-specialised kernel, 2:4
    with 128-token tiles; grids, threads and shared memory follow from the block shapes."""
    with override_config(GENERAL):
        decode = plan_moe(LayerShape(1, **QWEN3), SAMOYEDS, torch.bfloat16, H100)
    assert decode.token_tile == 8 and decode.chunks == 0
    assert decode.gate_up.block == BlockShape("mma", 4, 2) and decode.gate_up.splits == 4
    assert decode.gate_up.grid == (384 // 64, decode.num_tiles, 4) and decode.gate_up.threads == 128
    assert decode.gate_up.kernel == "samoyeds::moe_gemm<__nv_bfloat16, false, true, 128, 8, true, 4, 2, false, false>"
    assert decode.sum_kernel == "samoyeds::sum_slots<__nv_bfloat16, __nv_bfloat16, 1>"
    assert decode.silu_kernel == "samoyeds::silu_mul_splits<__nv_bfloat16>"

    prefill = plan_moe(LayerShape(16384, **QWEN3), SAMOYEDS, torch.bfloat16, H100)
    assert prefill.token_tile == 64 and prefill.chunks == 16384 * 8 // 2048
    assert prefill.gate_up.block == BlockShape("ws", 8, 2) and prefill.gate_up.grid[0] == SMS
    assert prefill.gate_up.threads == 384 and prefill.gate_up.shared_bytes == 4 * (64 * 256 + 256 * 144) + 1024
    assert prefill.gate_up.kernel == "samoyeds::moe_gemm_ws<__nv_bfloat16, false, true, 128, 64, true, false>"
    assert prefill.silu_kernel is None and prefill.sum_kernel.endswith(", 8>")
    # between: pairs where scalars would take more than one pass of the largest wave (T * 2048 > 8 * 256 * SMs)
    assert plan_moe(LayerShape(128, **QWEN3), SAMOYEDS, torch.bfloat16, H100).sum_kernel.endswith(", 1>")
    assert plan_moe(LayerShape(256, **QWEN3), SAMOYEDS, torch.bfloat16, H100).sum_kernel.endswith(", 2>")

    two_four = plan_moe(LayerShape(16384, **QWEN3), TWO_FOUR, torch.float16, H100)
    assert (
        two_four.token_tile == 128
        and two_four.down.kernel == "samoyeds::moe_gemm_ws<__half, false, false, 128, 128, false, false>"
    )
    before_hopper = plan_moe(LayerShape(16384, **QWEN3), SAMOYEDS, torch.bfloat16, A100)
    assert before_hopper.gate_up.block == BlockShape("mma", 8, 2)


def test_fp8_values_run_the_same_kernels_with_their_flag():
    """FP8 values take the same token tiles and block shapes (the ws kernel on Hopper's wide tiles, 128 tokens for
    2:4), with half the A tile's shared memory, deeper ws pipelines, and names that carry the FP8 flag. The ws
    kernel multiplies FP8 copies of the activations (half the B tile), made by quantize_rows before each GEMM."""
    prefill = plan_moe(LayerShape(16384, **QWEN3), TWO_FOUR, torch.bfloat16, H100, fp8=True)
    assert prefill.token_tile == 128 and prefill.gate_up.block == BlockShape("ws", 8, 2)
    assert prefill.gate_up.fp8_activations and prefill.down.fp8_activations
    assert prefill.gate_up.kernel == "samoyeds::moe_gemm_ws<__nv_bfloat16, true, false, 128, 128, true, true>"
    assert prefill.gate_up.shared_bytes == 4 * (128 * 128 + 256 * 64 + 256 * 16) + 1024
    assert prefill.gate_up.quantize_kernel == "samoyeds::quantize_rows<__nv_bfloat16, true, 1>"
    assert prefill.gate_up.quantize_grid == (16384 // 8, 1, 1)  # a warp per row, 8 per block
    assert prefill.down.quantize_grid == (16 * SMS, 1, 1)  # 8 x 16384 rows: at most 16 blocks per SM
    assert prefill.down.quantize_kernel == "samoyeds::quantize_rows<__nv_bfloat16, false, 1>"
    samoyeds = plan_moe(LayerShape(16384, **QWEN3), SAMOYEDS, torch.bfloat16, H100, fp8=True)
    assert samoyeds.down.kernel == "samoyeds::moe_gemm_ws<__nv_bfloat16, true, true, 128, 64, false, true>"
    assert samoyeds.down.shared_bytes == 6 * (64 * 128 + 256 * 64 + 256 * 16) + 1024
    with override_config(KernelConfig(gate_up=GemmConfig(fp8_activations=False))):
        values_only = plan_moe(LayerShape(16384, **QWEN3), SAMOYEDS, torch.bfloat16, H100, fp8=True)
    assert values_only.gate_up.kernel == "samoyeds::moe_gemm_ws<__nv_bfloat16, true, true, 128, 64, true, false>"
    assert values_only.gate_up.quantize_kernel is None and values_only.down.fp8_activations
    assert values_only.gate_up.shared_bytes == 6 * (64 * 256 + 256 * 64 + 256 * 16) + 1024
    with override_config(KernelConfig(64, GemmConfig("wgmma", 4, 2))):
        one_warpgroup = plan_moe(LayerShape(16384, **QWEN3), TWO_FOUR, torch.bfloat16, H100, fp8=True)
    one_warpgroup_kernel = "samoyeds::moe_gemm<__nv_bfloat16, true, false, 128, 64, true, 4, 2, true, false>"
    assert one_warpgroup.gate_up.kernel == one_warpgroup_kernel
    assert one_warpgroup.gate_up.shared_bytes == 3 * (64 * 256 + 128 * 64 + 128 * 16) + 1024
    with override_config(GENERAL):
        decode = plan_moe(LayerShape(1, **QWEN3), SAMOYEDS, torch.bfloat16, H100, fp8=True)
    assert decode.gate_up.kernel == "samoyeds::moe_gemm<__nv_bfloat16, true, true, 128, 8, true, 4, 2, false, false>"
    assert not decode.gate_up.fp8_activations and decode.gate_up.quantize_kernel is None


def test_decode_tiles_multiply_fp8_activations_where_a_config_asks():
    """The decode tiles' mma kernel can multiply FP8 copies of the activations (e4m3 wgmma.sp on Hopper, FP8 values):
    in its 16-token tiles by default, in the 8-token ones where a kernel config (a tuned table, tune_kernels.py)
    asks, with 1-byte B tiles and the quantize kernels; GEMM 1 of a few tokens then waits for the routing index
    instead of mapping itself (x's copy comes after it)."""
    for pattern in (SAMOYEDS, TWO_FOUR):
        sixteen = plan_moe(LayerShape(128, **QWEN3), pattern, torch.bfloat16, H100, fp8=True, occupancy=_h100_occupancy)
        assert sixteen.token_tile == 16 and sixteen.gate_up.block.kind == "mma" and sixteen.down.block.kind == "mma"
        assert sixteen.gate_up.fp8_activations and sixteen.down.fp8_activations
        bf16_values = plan_moe(LayerShape(128, **QWEN3), pattern, torch.bfloat16, H100, occupancy=_h100_occupancy)
        assert not bf16_values.gate_up.fp8_activations and not bf16_values.down.fp8_activations
        ampere = plan_moe(LayerShape(128, **QWEN3), pattern, torch.bfloat16, A100, fp8=True)
        assert not ampere.gate_up.fp8_activations and not ampere.down.fp8_activations
    acts = KernelConfig(gate_up=GemmConfig(fp8_activations=True), down=GemmConfig(fp8_activations=True))
    for tokens in (4, 16):
        shape = LayerShape(tokens, **QWEN3)
        default = plan_moe(shape, SAMOYEDS, torch.bfloat16, H100, fp8=True, occupancy=_h100_occupancy)
        assert not default.gate_up.fp8_activations and not default.down.fp8_activations
        with override_config(acts):
            plan = plan_moe(shape, SAMOYEDS, torch.bfloat16, H100, fp8=True, occupancy=_h100_occupancy)
        assert plan.gate_up.block.kind == "mma" and plan.down.block.kind == "mma"
        assert plan.gate_up.fp8_activations and plan.down.fp8_activations
        assert plan.gate_up.kernel.endswith(", false, true>") and plan.down.kernel.endswith(", false, true>")
        # Qwen3's rows (2048 and 768 inputs) are one warp's round: a warp a row
        assert plan.gate_up.quantize_kernel == "samoyeds::quantize_rows<__nv_bfloat16, true, 1>"
        assert plan.down.quantize_kernel == "samoyeds::quantize_rows<__nv_bfloat16, false, 1>"
        b_tile = plan.token_tile * 128  # one byte per input
        block = plan.gate_up.block
        assert plan.gate_up.shared_bytes == 3 * (b_tile + block.a_rows * (64 + 16)) + 1024
        assert not plan.few_token_map
        assert default.few_token_map == (tokens <= 8 and default.token_tile == 8)
    for device, fp8 in [(A100, True), (H100, False)]:
        with override_config(acts), pytest.raises(SamoyedsError, match="FP8 activations"):
            plan_moe(LayerShape(16, **QWEN3), SAMOYEDS, torch.bfloat16, device, fp8)
    hopper = compiled_kernels(torch.bfloat16, SAMOYEDS, "sm_90a", fp8=True)
    assert "samoyeds::moe_gemm<__nv_bfloat16, true, true, 128, 8, true, 4, 2, false, true>" in hopper
    ampere = compiled_kernels(torch.bfloat16, SAMOYEDS, "sm_80", fp8=True)
    assert not [name for name in ampere if name.endswith(", true>") and "moe_gemm<" in name]


def test_quantize_rows_takes_a_block_a_row_for_a_few_long_rows():
    """quantize_rows: a block (8 warps) a row for rows longer than one warp's round (2048 inputs) while one block a
    row fits one wave (4 blocks an SM), else a warp a row in blocks of 8 rows, at most 16 blocks per SM."""
    rows = (1, 32, 4 * SMS, 4 * SMS + 1, 16384)
    assert [quantize_row_warps(r, 14336, SMS) for r in rows] == [8, 8, 8, 1, 1]  # Mixtral's intermediate
    assert [quantize_row_warps(r, 2048, SMS) for r in rows] == [1] * 5  # one warp's round: read once either way
    assert quantize_row_warps(16, 4096, SMS) == 8
    assert quantize_grid(32, 14336, SMS) == (32, 1, 1) and quantize_grid(4 * SMS, 4096, SMS) == (4 * SMS, 1, 1)
    assert quantize_grid(32, 768, SMS) == (4, 1, 1)
    assert quantize_grid(4 * SMS + 1, 4096, SMS) == (-(-(4 * SMS + 1) // 8), 1, 1)
    assert quantize_grid(16384 * 8, 4096, SMS) == (16 * SMS, 1, 1)


def test_fp8_activations_only_where_the_fp8_mmas_run():
    """FP8 x FP8 needs FP8 values on Hopper, the ws kernel (or the decode tiles' mma kernel, above) and segments of
    whole 64-input k-steps: a config asking for it elsewhere is refused, and only Hopper's FP8 modules compile those
    kernels."""
    shape = LayerShape(16384, **QWEN3)
    for pattern, fp8, config in [
        (SAMOYEDS, False, GemmConfig(fp8_activations=True)),
        (SAMOYEDS, True, GemmConfig("wgmma", 4, 2, fp8_activations=True)),
        (Pattern.parse("samoyeds", 32), True, GemmConfig(fp8_activations=True)),
    ]:
        with override_config(KernelConfig(gate_up=config)), pytest.raises(SamoyedsError, match="FP8 activations"):
            plan_moe(shape, pattern, torch.bfloat16, H100, fp8)
    assert not plan_moe(shape, Pattern.parse("samoyeds", 32), torch.bfloat16, H100, True).gate_up.fp8_activations
    hopper = compiled_kernels(torch.bfloat16, SAMOYEDS, "sm_90a", fp8=True)
    assert "samoyeds::moe_gemm_ws<__nv_bfloat16, true, true, 128, 64, true, true>" in hopper
    assert "samoyeds::quantize_rows<__nv_bfloat16, false, 1>" in hopper
    assert "samoyeds::quantize_rows<__nv_bfloat16, false, 8>" in hopper
    for arch, fp8 in [("sm_90a", False), ("sm_80", True)]:
        names = compiled_kernels(torch.bfloat16, SAMOYEDS, arch, fp8)
        assert not [k for k in names if "quantize_rows" in k or ("moe_gemm_ws" in k and k.endswith(", true>"))]


def _h100_occupancy(name: str, threads: int, shared_bytes: int) -> int:
    """Blocks per SM as shared memory allows on an H100 (228 KB, 1 KB per block for the driver, the kernel's static
    ~0.4 KB): what the driver's calculator gave for the FP8 decode kernels there (5 / 3 for gate/up blocks of 4 / 8
    warps at 8-token tiles, 9 / 5 for down blocks of one / two slabs)."""
    return 233472 // (shared_bytes + 1024 + 416)


@pytest.mark.parametrize(
    "tokens, gate_up, down",
    [
        (1, BlockShape("mma", 4, 2), BlockShape("mma", 4, 1)),  # within one wave: the preferred shapes
        (4, BlockShape("mma", 4, 2), BlockShape("mma", 4, 1)),
        (16, BlockShape("mma", 4, 2), BlockShape("mma", 4, 2)),  # down: 1294 blocks of one slab are 1.09 waves
        (32, BlockShape("mma", 4, 2), BlockShape("mma", 4, 1)),  # gate/up: 1.006 waves, within the margin
        (64, BlockShape("mma", 8, 2), BlockShape("mma", 4, 1)),  # gate/up: 770 blocks of 4 warps are 1.17 waves
    ],
)
def test_decode_blocks_fill_whole_waves(tokens, gate_up, down):
    """With the kernels' occupancy, samoyeds decode tiles with FP8 values on Hopper take the block shape whose grid
    wastes least on a partial last wave; without it, the first compiled shape."""
    shape = LayerShape(tokens, **QWEN3)
    with override_config(GENERAL):
        plan = plan_moe(shape, SAMOYEDS, torch.bfloat16, H100, True, _h100_occupancy)
        blind = plan_moe(shape, SAMOYEDS, torch.bfloat16, H100, True)
    assert (plan.gate_up.block, plan.down.block) == (gate_up, down)
    assert (blind.gate_up.block, blind.down.block) == (BlockShape("mma", 4, 2), BlockShape("mma", 4, 1))


def test_decode_block_rule_only_where_measured_and_never_over_a_forced_or_unfitting_shape():
    preferred = (BlockShape("mma", 4, 2), BlockShape("mma", 4, 1))
    t64 = LayerShape(64, **QWEN3)
    for pattern, fp8, device in [(SAMOYEDS, False, H100), (TWO_FOUR, True, H100), (SAMOYEDS, True, A100)]:
        plan = plan_moe(t64, pattern, torch.bfloat16, device, fp8, _h100_occupancy)
        assert (plan.gate_up.block, plan.down.block) == preferred
        assert len(kernel_plan.block_shapes(8, True, pattern.is_samoyeds, device.hopper, fp8)) == 1
    for device, pattern, fp8 in [(H100, SAMOYEDS, True), (A100, SAMOYEDS, True), (A100, TWO_FOUR, False)]:
        for tokens in (256, 1024, 4096, 16384):  # wide tiles keep their measured order, whatever the occupancy
            shape = LayerShape(tokens, **QWEN3)
            ordered = plan_moe(shape, pattern, torch.bfloat16, device, fp8)
            # one block per SM: on the A100 at T = 1024 the wave rule would trade 8-warp gate/up blocks for 4-warp
            for occupancy in (_h100_occupancy, lambda name, threads, shared_bytes: 1):
                plan = plan_moe(shape, pattern, torch.bfloat16, device, fp8, occupancy)
                assert (plan.token_tile, plan.gate_up, plan.down) == (ordered.token_tile, ordered.gate_up, ordered.down)
    with override_config(KernelConfig(gate_up=GemmConfig(fp8_activations=True))):  # which only the ws shape runs
        forced = plan_moe(LayerShape(2048, **QWEN3), SAMOYEDS, torch.bfloat16, H100, True, _h100_occupancy)
    assert forced.gate_up.block == BlockShape("ws", 8, 2) and forced.gate_up.fp8_activations
    with override_config(KernelConfig(gate_up=GemmConfig("mma", 4, 2))):
        assert plan_moe(t64, SAMOYEDS, torch.bfloat16, H100, True, _h100_occupancy).gate_up.block == preferred[0]

    def no_room_for_8_warps(name: str, threads: int, shared_bytes: int) -> int:
        return 0 if threads == 256 else _h100_occupancy(name, threads, shared_bytes)

    plan = plan_moe(t64, SAMOYEDS, torch.bfloat16, H100, True, no_room_for_8_warps)
    assert plan.gate_up.block == preferred[0]


def test_expected_tiles():
    # Qwen3 at T = 64: 4 slots per expert on average, 8-token tiles: about one tile per expert (the routing of the
    # H100 run gave 130)
    assert kernel_plan.expected_tiles(512, 128, 8) == pytest.approx(128.4, abs=0.1)
    assert kernel_plan.expected_tiles(1, 128, 8) == pytest.approx(1.0, abs=0.01)
    assert kernel_plan.expected_tiles(200 * 8, 8, 16) == 200 * 8 / 16 + 4  # past the Poisson sum


def test_rows_off_the_ws_blocks_fall_back_to_the_one_warpgroup_kernel():
    """Qwen1.5's 704 gate rows per half (samoyeds: 352) are not whole 128-row blocks: wgmma, 64-row blocks."""
    plan = plan_moe(LayerShape(4096, 4, 60, 2048, 1408), SAMOYEDS, torch.bfloat16, H100)
    assert plan.gate_up.block == BlockShape("wgmma", 4, 2) and plan.down.block == BlockShape("ws", 8, 2)


@pytest.mark.parametrize("device", [H100, A100], ids=["h100", "a100"])
def test_gemm1_maps_itself_for_a_few_tokens_in_the_narrowest_mma_tile(device):
    """csrc/few_tokens.cuh: up to 8 tokens and 32 slots (one lane each), where the plan takes the 8-token mma tile for
    GEMM 1."""
    cases = [(1, QWEN3, True), (4, QWEN3, True), (5, QWEN3, False), (8, MIXTRAL, True), (9, MIXTRAL, False)]
    for tokens, shape, expected in cases:  # Qwen3 is top-8: 5 tokens make 40 slots
        with override_config(GENERAL):
            plan = plan_moe(LayerShape(tokens, **shape), SAMOYEDS, torch.bfloat16, device)
        assert plan.few_token_map == expected, (tokens, shape)
        assert not expected or (plan.token_tile == 8 and plan.gate_up.block.kind == "mma")
    with override_config(KernelConfig(16)):  # another tile at one token (a tuned table could pick one)
        assert not plan_moe(LayerShape(1, **QWEN3), SAMOYEDS, torch.bfloat16, device).few_token_map


def test_override_config_picks_any_compiled_choice_and_refuses_the_rest():
    shape = LayerShape(1024, **QWEN3)
    default = plan_moe(shape, SAMOYEDS, torch.bfloat16, H100)
    config = KernelConfig(64, GemmConfig("wgmma", 4, 2, 2), GemmConfig(splits=3))
    with override_config(config):
        forced = plan_moe(shape, SAMOYEDS, torch.bfloat16, H100)
    assert forced.gate_up.block == BlockShape("wgmma", 4, 2) and forced.gate_up.splits == 2
    assert forced.down.block == default.down.block and forced.down.splits == 3
    assert plan_moe(shape, SAMOYEDS, torch.bfloat16, H100) == default  # only inside the block
    for bad, words in [
        (KernelConfig(128), "token tile 128 is not compiled"),
        (KernelConfig(64, GemmConfig("mma", 4, 2)), "is not compiled for token tile 64"),
        (KernelConfig(gate_up=GemmConfig(splits=9)), "splits 9 not in 1..8"),
        (KernelConfig(gate_up=GemmConfig(kind="ws")), "give kind, warps and slabs together"),
    ]:
        with override_config(bad), pytest.raises(SamoyedsError, match=words):
            plan_moe(shape, SAMOYEDS, torch.bfloat16, H100)


def test_tuned_tables_are_read_by_gpu_and_shape_and_take_the_nearest_token_count(tmp_path, monkeypatch):
    shape = LayerShape(100, **QWEN3)
    name = kernel_plan.table_name(shape, SAMOYEDS, torch.bfloat16, H100)
    assert name == (
        "E=128,H=2048,I=768,top_k=8,pattern=samoyeds128,dtype=bfloat16,device_name=NVIDIA_H100_80GB_HBM3.json"
    )
    table = {
        "16": KernelConfig(gate_up=GemmConfig(splits=2)).to_json(),
        "128": KernelConfig(down=GemmConfig(splits=3)).to_json(),
    }
    (tmp_path / name).write_text(json.dumps(table))
    monkeypatch.setenv(kernel_plan.CONFIG_DIR_ENV, str(tmp_path))
    kernel_plan._read_table.cache_clear()
    try:
        assert plan_moe(shape, SAMOYEDS, torch.bfloat16, H100).down.splits == 3  # 100 is nearest 128
        assert plan_moe(LayerShape(20, **QWEN3), SAMOYEDS, torch.bfloat16, H100).gate_up.splits == 2
        past = LayerShape(129, **QWEN3)  # past the table: the heuristics
        assert plan_moe(past, SAMOYEDS, torch.bfloat16, H100) == kernel_plan._plan(
            past, SAMOYEDS, torch.bfloat16, H100, KernelConfig()
        )
        assert plan_moe(shape, SAMOYEDS, torch.bfloat16, A100) == plan_moe(  # another GPU: no table, heuristics
            shape, SAMOYEDS, torch.bfloat16, A100
        )
        (tmp_path / name).write_text(json.dumps({"16": {"gate_up": {"blocks": 2}}}))
        kernel_plan._read_table.cache_clear()
        with pytest.raises(SamoyedsError, match="not a kernel config"):
            plan_moe(shape, SAMOYEDS, torch.bfloat16, H100)
    finally:
        kernel_plan._read_table.cache_clear()


def test_config_json_round_trip():
    config = KernelConfig(32, GemmConfig("mma", 4, 2, 4), GemmConfig(splits=1))
    assert KernelConfig.from_json(json.loads(json.dumps(config.to_json()))) == config
    assert KernelConfig().to_json() == {}


def test_prepare_weights_stores_rowsel_segment_major_with_the_same_values():
    """The kernels copy a stage's row selections of 16 rows with one 16-byte copy: rowsel [E, R, K/V] must be
    stored segment-major. prepare_weights gives that layout (same shape and values) and leaves such a tensor as is."""
    rowsel = torch.randint(0, 2, (3, 64, 8), dtype=torch.uint8)
    packed = PackedWeight(torch.zeros(3, 128, 512), torch.zeros(3, 128, 64, dtype=torch.int16), rowsel)
    stored = prepare_weights(packed)
    assert torch.equal(stored.rowsel, rowsel) and stored.rowsel.shape == rowsel.shape
    assert stored.rowsel.stride() == (64 * 8, 1, 64)  # segment s of row r at byte s * R + r of the expert
    assert prepare_weights(stored).rowsel is stored.rowsel
    assert prepare_weights(packed._replace(rowsel=None)).rowsel is None


@pytest.mark.parametrize("fp8", [False, True])
def test_prepared_values_and_metadata_are_tiled_stage_major(fp8):
    """Values and metadata in the kernels' layout: [E, R / 64, K / 128, 64, PER], the element (row, stage, i) at
    csrc/tiles.cuh's tiled_offset; checkpoint_layout gives the format's tensors back exactly."""
    from samoyeds_vllm.format import FP8, compress, prune, quantize
    from samoyeds_vllm.kernels import checkpoint_layout

    pattern = Pattern.parse("samoyeds")
    w = prune(torch.randn(2, 256, 512, generator=torch.Generator().manual_seed(1)).bfloat16(), pattern)
    packed = compress(w, pattern)
    if fp8:
        packed = quantize(packed, pattern, FP8)
    stored = prepare_weights(packed)
    assert stored.values.shape == (2, 128 // 64, 512 // 128, 64, 64) and stored.meta.shape == (2, 2, 4, 64, 8)
    assert prepare_weights(stored) is stored
    back = checkpoint_layout(stored)
    assert back.values.dtype == packed.values.dtype and torch.equal(back.meta, packed.meta)
    assert torch.equal(back.values.view(torch.uint8), packed.values.view(torch.uint8))
    expert, row, stage, i = 1, 70, 3, 5  # tiled_offset(expert * R + row, stage, K) + i
    r = expert * 128 + row
    assert (
        stored.meta.reshape(-1)[((r // 64) * 4 + stage) * 64 * 8 + (r % 64) * 8 + i]
        == packed.meta[expert, row, stage * 8 + i]
    )


def test_the_shipped_deepseek_v3_table_takes_64_token_tiles_where_measured(monkeypatch):
    """configs/kernels/ holds the H200 table of DeepSeek-V3's FP8 samoyeds layer: 64-token tiles from T = 192 to
    512 (the H200 search's winners), the heuristics below, and past its largest entry."""
    monkeypatch.delenv(kernel_plan.CONFIG_DIR_ENV, raising=False)
    kernel_plan._read_table.cache_clear()

    def tile(tokens: int, fp8: bool = True, device: Device = H200) -> int:
        return plan_moe(LayerShape(tokens, **DEEPSEEK_V3), SAMOYEDS, torch.bfloat16, device, fp8).token_tile

    assert [tile(t) for t in (2, 64, 128, 192, 256, 384, 512, 1024)] == [8, 8, 8, 64, 64, 64, 64, 64]
    assert tile(256, fp8=False) == tile(256, device=H100) == 16  # bf16 values, another GPU: the heuristics
    kernel_plan._read_table.cache_clear()


def test_the_shipped_h200_tables_split_k_at_decode_where_measured(monkeypatch):
    """configs/kernels/ holds H200 decode entries for Qwen3-30B-A3B's and Mixtral-8x7B's FP8 samoyeds layers where a
    choice clearly beat the heuristics (benchmarks/results/decode-splits-h200/, decode-tables-h200/): split-K
    factors, 16-token tiles where the heuristics pick 8-token ones (Mixtral T = 5, 12, 16), FP8 copies of the
    activations in the 8-token tiles (Mixtral T = 2-8). The other measured sizes take the heuristics' factors (the
    same as a GPU of the H200's SMs without a table); sizes between take the nearest entry, ties the smaller."""
    monkeypatch.delenv(kernel_plan.CONFIG_DIR_ENV, raising=False)
    kernel_plan._read_table.cache_clear()
    untuned = Device("an H200 without tables", (9, 0), 132, "sm_90a")

    def splits(tokens: int, shape: dict, device: Device = H200) -> tuple[int, int]:
        plan = plan_moe(LayerShape(tokens, **shape), SAMOYEDS, torch.bfloat16, device, True)
        return plan.gate_up.splits, plan.down.splits

    def tile_and_acts(tokens: int) -> tuple[int, bool, bool]:
        plan = plan_moe(LayerShape(tokens, **MIXTRAL), SAMOYEDS, torch.bfloat16, H200, True)
        return plan.token_tile, plan.gate_up.fp8_activations, plan.down.fp8_activations

    assert splits(3, QWEN3) == (4, 1) and splits(4, QWEN3) == (2, 1)
    for tokens in (1, 2, 5, 6, 8, 16):
        assert splits(tokens, QWEN3) == splits(tokens, QWEN3, untuned), tokens
    measured = {3: (4, 3), 4: (4, 3), 5: (1, 3), 8: (1, 3), 12: (1, 3), 16: (1, 3), 24: (1, 3)}  # 24: 16's entry
    assert {t: splits(t, MIXTRAL) for t in measured} == measured
    assert splits(10, MIXTRAL) == (1, 3) and splits(7, MIXTRAL) == splits(7, MIXTRAL, untuned)  # ties: the smaller
    for tokens in (1, 2, 6, 32):
        assert splits(tokens, MIXTRAL) == splits(tokens, MIXTRAL, untuned), tokens
    # the 16-token tiles take FP8 copies by default; the 8-token tiles where the table says
    assert {t: tile_and_acts(t) for t in (2, 3, 5, 6, 8, 12, 16)} == {
        2: (8, True, True),
        3: (8, False, True),
        5: (16, True, True),
        6: (8, False, True),
        8: (8, True, True),
        12: (16, True, True),
        16: (16, True, True),
    }
    kernel_plan._read_table.cache_clear()


def test_the_shipped_h200_tables_take_16_token_tiles_where_they_won(monkeypatch):
    """Qwen3-235B-A22B samoyeds and Mixtral-8x7B 2:4 (FP8 values, H200): 16-token tiles at the token counts where
    they beat the heuristics' 8-token tiles by 5-13% (benchmarks/results/decode-tables-h200/); one token keeps the
    one-token kernels, and the sizes measured without a gain take the heuristics."""
    monkeypatch.delenv(kernel_plan.CONFIG_DIR_ENV, raising=False)
    kernel_plan._read_table.cache_clear()
    untuned = Device("an H200 without tables", (9, 0), 132, "sm_90a")
    qwen3_235b = dict(top_k=8, num_experts=128, hidden=4096, inter=1536)

    def plan(tokens: int, shape: dict, pattern: Pattern, device: Device = H200):
        return plan_moe(LayerShape(tokens, **shape), pattern, torch.bfloat16, device, True)

    for shape, pattern, tiled, heuristic in [
        (qwen3_235b, SAMOYEDS, (12, 16), (2, 4, 8, 24)),
        (MIXTRAL, TWO_FOUR, (4, 8, 16), ()),
    ]:
        assert plan(1, shape, pattern).one_token
        for tokens in tiled:
            assert plan(tokens, shape, pattern).token_tile == 16 > plan(tokens, shape, pattern, untuned).token_tile
        for tokens in heuristic:
            assert plan(tokens, shape, pattern) == plan(tokens, shape, pattern, untuned), tokens
    kernel_plan._read_table.cache_clear()


def test_the_shipped_h100_table_takes_16_token_tiles_for_mixtral_at_16_tokens(monkeypatch):
    """Mixtral-8x7B samoyeds, FP8 values, H100: 16-token tiles with the down projection split 3 ways at T = 16
    (1.10x the heuristics' 8-token tiles, benchmarks/results/moe-peers-h100/decode-search/), the heuristics at the
    sizes around it and past 32 tokens."""
    monkeypatch.delenv(kernel_plan.CONFIG_DIR_ENV, raising=False)
    kernel_plan._read_table.cache_clear()
    untuned = Device("an H100 without tables", (9, 0), SMS, "sm_90a")

    def plan(tokens: int, device: Device = H100):
        return plan_moe(LayerShape(tokens, **MIXTRAL), SAMOYEDS, torch.bfloat16, device, True)

    for tokens in (13, 16, 24):  # the heuristics take 8-token tiles to 16 tokens, 16-token tiles unsplit from 17
        tuned, rule = plan(tokens), plan(tokens, untuned)
        assert (
            (tuned.token_tile, tuned.gate_up.splits, tuned.down.splits)
            == (16, 1, 3)
            != (
                rule.token_tile,
                rule.gate_up.splits,
                rule.down.splits,
            )
        )
    for tokens in (1, 4, 8, 12, 32, 64, 256):
        assert plan(tokens) == plan(tokens, untuned), tokens
    kernel_plan._read_table.cache_clear()


def test_the_shipped_mixtral_table_keeps_bf16_activations_in_the_down_projection_where_measured(monkeypatch):
    """configs/kernels/ holds the H200 table of Mixtral-8x7B's FP8 samoyeds layer: at T = 64-128 the down projection
    multiplies bf16 activations (the ws kernel, FP8 values), gate/up FP8 copies; the heuristics elsewhere."""
    monkeypatch.delenv(kernel_plan.CONFIG_DIR_ENV, raising=False)
    kernel_plan._read_table.cache_clear()

    def acts(tokens: int, device: Device = H200) -> tuple[bool, bool]:
        plan = plan_moe(LayerShape(tokens, **MIXTRAL), SAMOYEDS, torch.bfloat16, device, True)
        return plan.gate_up.fp8_activations, plan.down.fp8_activations

    assert [acts(t) for t in (1, 64, 128, 256, 1024)] == [
        (False, False),  # decode tiles (mma.sp) keep bf16 activations
        (True, False),
        (True, False),
        (True, True),
        (True, True),
    ]
    assert acts(64, H100) == (True, True)  # another GPU: the heuristics
    kernel_plan._read_table.cache_clear()


@pytest.mark.parametrize("tokens", [1, 16, 64, 256, 4096, 16384])
@pytest.mark.parametrize("pattern, fp8", [(SAMOYEDS, False), (SAMOYEDS, True), (TWO_FOUR, True)])
def test_workspace_holds_each_scratch_buffer_aligned_and_apart(tokens, pattern, fp8):
    """One allocation per forward holds the scratch buffers a plan needs, each on a 256-byte boundary and none
    overlapping another; split-K partials and FP8 copies only where the plan runs them."""
    from samoyeds_vllm.kernels.launch import WORKSPACE_ALIGN, workspace_layout

    shape = LayerShape(tokens, **QWEN3)
    with override_config(GENERAL):
        plan = plan_moe(shape, pattern, torch.bfloat16, H100, fp8)
    space = workspace_layout(plan, shape, torch.bfloat16)
    slots, hidden, inter = shape.slots, shape.hidden, shape.inter
    z1, z2 = plan.gate_up.splits, plan.down.splits
    wanted = {
        "index": 4 * (slots + 3 * plan.num_tiles + plan.chunks * shape.num_experts),
        "act": 2 * slots * inter,
        "gate_up_partial": 4 * z1 * slots * 2 * inter if z1 > 1 else None,
        "y": (4 if z2 > 1 else 2) * z2 * slots * hidden,
        "x_fp8": tokens * hidden if plan.gate_up.fp8_activations else None,
        "x_scale": 4 * tokens if plan.gate_up.fp8_activations else None,
        "act_fp8": slots * inter if plan.down.fp8_activations else None,
        "act_scale": 4 * slots if plan.down.fp8_activations else None,
    }
    spans = []
    for name, size in wanted.items():
        offset = getattr(space, name)
        assert (offset is None) == (size is None), name
        if size is not None:
            assert offset % WORKSPACE_ALIGN == 0 and offset + size <= space.nbytes, name
            spans.append((offset, offset + size))
    spans.sort()
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:], strict=False))
    assert space.nbytes < spans[-1][1] + WORKSPACE_ALIGN
    if tokens == 16384:
        assert space.x_fp8 is not None if fp8 else space.x_fp8 is None
    if tokens == 1:
        assert space.gate_up_partial is not None  # split-K at batch 1


@pytest.mark.parametrize("tokens", [1, 16384])  # split-K partials; routing chunks and FP8 copies
def test_forward_params_point_where_the_workspace_holds_each_buffer(tokens):
    """moe_params against the workspace cut into views: the routing index split as its kernels read it
    (the tile records, sorted_slot, sorted_weight, chunk_counts), each other buffer at its offset or null,
    the tensors' own addresses, the shapes and the plan's choices."""
    from samoyeds_vllm.kernels.launch import moe_params, workspace_layout

    shape = LayerShape(tokens, **QWEN3)
    with override_config(GENERAL):
        plan = plan_moe(shape, SAMOYEDS, torch.bfloat16, H100, True)
    space = workspace_layout(plan, shape, torch.bfloat16)
    workspace = torch.empty(space.nbytes, dtype=torch.uint8)
    x, out = torch.empty(tokens, shape.hidden, dtype=torch.bfloat16), torch.empty(tokens, shape.hidden)
    ids, weights = torch.zeros(shape.slots, dtype=torch.int64), torch.zeros(shape.slots)
    w13, w2 = (PackedWeight(*(torch.empty(4) for _ in range(4))) for _ in range(2))
    base = workspace.data_ptr()
    p = moe_params(plan, shape, SAMOYEDS, space, base, x, ids, weights, w13, w2, out)

    sizes = [4 * plan.num_tiles, shape.slots, shape.slots, plan.chunks * shape.num_experts]
    index = workspace[space.index : space.index + 4 * sum(sizes)].view(torch.int32)
    views = index.split(sizes)
    assert (p.tiles, p.sorted_slot, p.sorted_weight, p.chunk_counts) == tuple(v.data_ptr() for v in views)
    assert p.tiles % 16 == 0  # the kernels read a tile's record in one 16-byte load
    for name in ("act", "gate_up_partial", "y", "x_fp8", "x_scale", "act_fp8", "act_scale"):
        offset = getattr(space, name)
        assert getattr(p, name) == (0 if offset is None else base + offset), name
    assert (p.x, p.out, p.topk_ids, p.topk_weights) == tuple(t.data_ptr() for t in (x, out, ids, weights))
    assert (p.w13.values, p.w13.rowsel, p.w2.meta, p.w2.scale) == (
        w13.values.data_ptr(),
        w13.rowsel.data_ptr(),
        w2.meta.data_ptr(),
        w2.scale.data_ptr(),
    )
    assert (p.w13.rows, p.w2.rows) == shape.packed_rows(SAMOYEDS)
    assert (p.tokens, p.slots, p.num_tiles, p.chunks, p.token_tile) == (
        tokens,
        shape.slots,
        plan.num_tiles,
        plan.chunks,
        plan.token_tile,
    )
    assert (p.gate_up_splits, p.down_splits) == (plan.gate_up.splits, plan.down.splits)
    if tokens == 1:
        assert p.gate_up_partial and not p.x_fp8 and p.few_token_map == 1
    else:
        assert plan.chunks and p.x_fp8 and p.act_scale and not p.gate_up_partial and p.few_token_map == 0


def test_elementwise_grids_are_one_wave_of_the_blocks_that_fit():
    """The slot sum and the split-K SiLU loop over their elements with one wave of the blocks an SM holds: the
    kernel's occupancy where the GPU gives it (at most 8 blocks of 256 threads), 8 per SM without it (CPU)."""

    def six_sum_blocks(name: str, threads: int, shared_bytes: int) -> int:
        return 6 if "sum_slots" in name else _h100_occupancy(name, threads, shared_bytes)

    mixtral = LayerShape(16384, **MIXTRAL)  # far past one wave
    for occupancy, per_sm in ((None, 8), (_h100_occupancy, 8), (six_sum_blocks, 6)):
        assert plan_moe(mixtral, SAMOYEDS, torch.bfloat16, H100, True, occupancy).sum_grid == (per_sm * SMS, 1, 1)
    with override_config(GENERAL):
        decode = plan_moe(LayerShape(1, **QWEN3), SAMOYEDS, torch.bfloat16, H100, True, six_sum_blocks)
    assert decode.sum_grid == (2048 // 256, 1, 1)  # fewer elements than one wave: one thread each


def test_one_token_takes_the_two_one_token_kernels():
    """csrc/one_token.cuh: at one token GEMM 1's blocks are (16-row slab, slot) of 4 warps, GEMM 2's 16-row slabs of
    8 warps, each warp with its own ring of stages; no routing index, split-K SiLU or slot sum."""
    from samoyeds_vllm.kernels.geometry import ONE_TOKEN_STAGES, one_token_stage_bytes
    from samoyeds_vllm.kernels.launch import workspace_layout

    shape = LayerShape(1, **QWEN3)
    plan = plan_moe(shape, SAMOYEDS, torch.bfloat16, H100, fp8=True)
    assert plan.one_token and not plan.few_token_map and plan.chunks == 0
    assert plan.sum_kernel is None and plan.silu_kernel is None
    gate_up, down = plan.gate_up, plan.down
    assert gate_up.kernel == "samoyeds::moe_one_token<__nv_bfloat16, true, true, 128, true, 4>"
    assert down.kernel == "samoyeds::moe_one_token<__nv_bfloat16, true, true, 128, false, 8>"
    assert gate_up.grid == (384 // 16, 8, 1) and gate_up.threads == 128 and gate_up.splits == 1
    assert down.grid == (1024 // 16, 1, 1) and down.threads == 256 and down.splits == 1
    assert gate_up.shared_bytes == 4 * ONE_TOKEN_STAGES * one_token_stage_bytes(2, 1)
    assert down.shared_bytes == 8 * ONE_TOKEN_STAGES * one_token_stage_bytes(1, 1)
    two_four = plan_moe(shape, TWO_FOUR, torch.float16, A100)  # bf16 / fp16 values, any sparse tensor cores
    assert two_four.one_token and two_four.gate_up.grid == (768 // 16, 8, 1) and two_four.down.grid == (128, 1, 1)
    assert two_four.down.shared_bytes == 8 * ONE_TOKEN_STAGES * one_token_stage_bytes(1, 2)
    space = workspace_layout(plan, shape, torch.bfloat16)
    assert space.act is not None and space.gate_up_partial is None and space.x_fp8 is None
    names = compiled_kernels(torch.bfloat16, SAMOYEDS, "sm_90a", True)
    assert gate_up.kernel in names and down.kernel in names


def test_one_token_only_where_its_kernels_run_and_the_config_allows():
    top10 = LayerShape(1, top_k=10, num_experts=64, hidden=2048, inter=768)  # more slots than GEMM 2's warps
    assert kernel_plan.one_token_refusal(top10) and not plan_moe(top10, SAMOYEDS, torch.bfloat16, H100).one_token
    assert not plan_moe(LayerShape(2, **QWEN3), SAMOYEDS, torch.bfloat16, H100).one_token
    assert plan_moe(LayerShape(1, **MIXTRAL), SAMOYEDS, torch.bfloat16, H100).one_token  # top-2: 4 warps a slot
    for config in (GENERAL, KernelConfig(16), KernelConfig(gate_up=GemmConfig(splits=2))):
        with override_config(config):  # a choice of the general path takes it
            assert not plan_moe(LayerShape(1, **QWEN3), SAMOYEDS, torch.bfloat16, H100).one_token
    with override_config(KernelConfig(16, one_token=True)):
        assert plan_moe(LayerShape(1, **QWEN3), SAMOYEDS, torch.bfloat16, H100).one_token
    for shape in (LayerShape(2, **QWEN3), top10):  # true: where they run (a table's entry serves nearby counts)
        with override_config(KernelConfig(16, one_token=True)):
            plan = plan_moe(shape, SAMOYEDS, torch.bfloat16, H100)
        assert not plan.one_token and plan.token_tile == 16
    assert KernelConfig.from_json({"one_token": False}) == GENERAL and GENERAL.to_json() == {"one_token": False}


def test_router_logits_reach_the_kernels_only_where_the_plan_takes_the_one_token_kernels(monkeypatch):
    """kernels.routes_logits (the op's choice to let the one-token kernels take vLLM's softmax top-k): one token,
    logits of x's dtype over the layer's experts, top_k of them at most, and no kernel config asking for the general
    path (a tuned table that chose it for one token is kept)."""
    from samoyeds_vllm.format import compress, prune
    from samoyeds_vllm.kernels import launch

    monkeypatch.setattr(launch, "device_of", lambda device: H200)
    pattern, gen = Pattern.parse("samoyeds"), torch.Generator().manual_seed(3)
    w13 = compress(prune(torch.randn(8, 2 * 128, 256, generator=gen).to(torch.bfloat16), pattern), pattern)
    x = torch.randn(1, 256, generator=gen).to(torch.bfloat16)
    logits = torch.randn(1, 8, generator=gen).to(torch.bfloat16)
    assert launch.routes_logits(x, logits, 2, w13, pattern)
    for config in (KernelConfig(one_token=False), KernelConfig(token_tile=8)):
        with override_config(config):
            assert not launch.routes_logits(x, logits, 2, w13, pattern), config
    assert not launch.routes_logits(x, logits, 9, w13, pattern)  # more slots than experts
    assert not launch.routes_logits(x.expand(2, -1), logits.expand(2, -1), 2, w13, pattern)
    assert not launch.routes_logits(x, logits.float(), 2, w13, pattern)
    assert not launch.routes_logits(x, logits[:, :4], 2, w13, pattern)  # expert parallelism's local experts
