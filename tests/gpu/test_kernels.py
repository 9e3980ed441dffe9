"""The CUDA kernels against the fp32 dense matmul of the pruned weights.

Every model shape in configs/models, token counts from 1 to 16384, balanced / skewed / half-empty / one-expert
routing, both patterns, every compiled block shape and split (through kernel configs). Internal buffers are
poisoned with NaN (conftest.py) so an unwritten element fails.
"""

import pytest
import torch

from samoyeds_vllm import kernels
from samoyeds_vllm.errors import SamoyedsError
from samoyeds_vllm.format import FP8, Pattern
from samoyeds_vllm.kernels import GemmConfig, KernelConfig, LayerShape
from samoyeds_vllm.kernels import launch as kernel_launch
from samoyeds_vllm.kernels.plan import block_shapes, device_of, fitting_block_shapes, token_tiles
from samoyeds_vllm.tools.moe_problem import (
    BF16_TOLERANCE,
    FP8_ACTIVATIONS_TOLERANCE,
    error_against_plan,
    make_problem,
    planned_fp8_activations,
    reference,
    relative_error,
    run_sparse,
)
from samoyeds_vllm.tools.presets import available_presets, preset_shape


def one_preset_per_expert_shape() -> list[str]:
    """The kernels see an expert's shape; more experts of it only cost memory, so each shape is tested on its preset
    with the fewest experts (Kimi-K2 has DeepSeek-V3's experts, 384 of them; Llama-4 Maverick has Scout's, 128
    of them, whose weights would not fit an 80 GB GPU)."""
    presets: dict[tuple[int, int, int], tuple[int, str]] = {}
    for name in sorted(available_presets()):
        if not name.startswith("tiny-"):
            shape = preset_shape(name)
            key = (shape.hidden, shape.intermediate, shape.top_k)
            presets[key] = min(presets.get(key, (shape.num_experts, name)), (shape.num_experts, name))
    return [name for _, name in presets.values()]


SHAPES = one_preset_per_expert_shape()
PATTERNS = {"samoyeds": Pattern.parse("samoyeds"), "2:4": Pattern.parse("2:4")}
# Shapes of the FP8-value tests: packing DeepSeek-V3's 2:4 problem (256 experts) with FP8 values, after the tests
# before it in one process, ran out of an H200's memory (141 GB)
FP8_SHAPES = ["qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v2-lite"]


def check(shape, pattern, tokens, routing="balanced", dtype=torch.bfloat16, seed=0, values=None):
    """Against the fp32 reference of the problem's weights, with the activations quantized wherever the plan
    multiplies FP8 copies of them (so the kernels' own error only)."""
    problem = make_problem(shape, pattern, tokens, dtype, routing=routing, seed=seed, values=values)
    out = run_sparse(problem)
    torch.cuda.synchronize()
    err, tol = error_against_plan(problem, out)
    assert out.dtype == dtype and out.shape == problem.x.shape
    assert err < tol, f"relative error {err}"


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("tokens", [1, 7, 64, 300, 4096])
@pytest.mark.parametrize("shape", SHAPES)
def test_every_shape(shape, tokens, pattern):
    check(preset_shape(shape), PATTERNS[pattern], tokens, seed=tokens)


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("routing", ["skewed", "sparse", "one-hot"])
@pytest.mark.parametrize("tokens", [3, 200, 2048])
def test_routings(routing, tokens, pattern):
    check(preset_shape("qwen3-30b-a3b"), PATTERNS[pattern], tokens, routing=routing, seed=1)


@pytest.mark.parametrize("values", [None, FP8], ids=["values-bf16", "values-fp8"])
@pytest.mark.parametrize("shape", ["mixtral-8x7b", "qwen3-30b-a3b"])
def test_largest_token_count(shape, values):
    check(preset_shape(shape), PATTERNS["samoyeds"], 16384, seed=5, values=values)


@pytest.mark.parametrize("tokens", [1, 100, 1024])  # one token, narrow token tiles (mma.sp), wide (wgmma on Hopper)
@pytest.mark.parametrize("segment", [32, 64])
def test_other_segments_and_fp16(segment, tokens):
    check(preset_shape("olmoe-1b-7b"), Pattern.parse("samoyeds", segment), tokens, dtype=torch.float16, seed=2)


@pytest.mark.parametrize("tokens", [1, 100, 1024])  # one token; narrow tiles; 128-token tiles (ws kernel, Hopper)
def test_2of4_fp16(tokens):
    check(preset_shape("olmoe-1b-7b"), PATTERNS["2:4"], tokens, dtype=torch.float16, seed=4)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_kernels_of_gpus_before_hopper(pattern, monkeypatch):
    """The wide-tile mma.sp kernels that GPUs before Hopper run, here on any GPU (built for plain sm_XY)."""
    major, minor = torch.cuda.get_device_capability()
    monkeypatch.setenv("SAMOYEDS_KERNEL_ARCH", f"sm_{major}{minor}")
    check(preset_shape("qwen3-30b-a3b"), PATTERNS[pattern], 2048, seed=3)


def _every_block_shape(pattern: Pattern, gate_up: bool, fp8: bool) -> list[tuple[int, GemmConfig]]:
    hopper = device_of(torch.device("cuda")).hopper
    tiles = token_tiles(pattern.is_samoyeds, hopper)
    return [
        (bn, GemmConfig(b.kind, b.warps, b.slabs))
        for bn in tiles
        for b in block_shapes(bn, gate_up, pattern.is_samoyeds, hopper, fp8)
    ]


@pytest.mark.parametrize("values", [None, FP8], ids=["values-bf16", "values-fp8"])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_every_block_shape_through_kernel_configs(pattern, values):
    """Each compiled block shape of each GEMM at each token tile, forced by override_config, is correct (the shapes
    a tuned table or the decode blocks' wave rule may pick), for values of the activations' dtype and FP8 values."""
    shape, pattern = preset_shape("qwen3-30b-a3b"), PATTERNS[pattern]
    problem = make_problem(shape, pattern, 1024, seed=6, values=values)
    refs = {}  # by the GEMMs that quantize their activations (FP8 values in ws blocks)
    for gate_up in (True, False):
        for token_tile, gemm in _every_block_shape(pattern, gate_up, values is not None):
            config = KernelConfig(token_tile, gate_up=gemm) if gate_up else KernelConfig(token_tile, down=gemm)
            with kernels.override_config(config):
                err, tol = error_against_plan(problem, run_sparse(problem), refs)
            assert err < tol, f"{config}: relative error {err}"


@pytest.mark.parametrize("splits", [(1, 1), (2, 3), (4, 1), (8, 6)])
def test_split_k_through_kernel_configs(splits):
    """Forced split-K factors of both GEMMs at decode sizes give the same layer (the split epilogues are right)."""
    shape, pattern = preset_shape("mixtral-8x7b"), PATTERNS["samoyeds"]
    problem = make_problem(shape, pattern, 4, seed=7)
    config = KernelConfig(gate_up=GemmConfig(splits=splits[0]), down=GemmConfig(splits=splits[1]))
    with kernels.override_config(config):
        plan = kernels.plan_moe(
            LayerShape(4, shape.top_k, shape.num_experts, shape.hidden, shape.intermediate),
            pattern,
            torch.bfloat16,
            device_of(torch.device("cuda")),
        )
        assert (plan.gate_up.splits, plan.down.splits) == splits
        err = relative_error(run_sparse(problem), reference(problem))
    assert err < BF16_TOLERANCE, f"splits {splits}: relative error {err}"


@pytest.mark.parametrize(
    ("shape", "dtype"), [("mixtral-8x7b", torch.bfloat16), ("olmoe-1b-7b", torch.float16)], ids=["bf16", "fp16"]
)
def test_slot_sum_in_pairs(shape, dtype):
    """Between decode and large batches the slot sum takes pairs of elements (plan.sum_vec): at Mixtral's T = 256 the
    heuristics split GEMM 2 (float partials in pairs, on CPU plans), OLMoE's sums its fp16 output."""
    shape, pattern = preset_shape(shape), PATTERNS["samoyeds"]
    plan = kernels.plan_moe(
        LayerShape(256, shape.top_k, shape.num_experts, shape.hidden, shape.intermediate),
        pattern,
        dtype,
        device_of(torch.device("cuda")),
    )
    assert plan.sum_kernel.endswith(", 2>"), plan.sum_kernel
    check(shape, pattern, 256, dtype=dtype, seed=9)


def test_weights_in_another_layout_are_refused():
    """Values, metadata and row selections must be stored as the plugin stores them after loading; the op never
    copies them."""
    problem = make_problem(preset_shape("olmoe-1b-7b"), PATTERNS["samoyeds"], 8, seed=8)
    prepared = problem.packed13
    problem.packed13 = prepared._replace(rowsel=prepared.rowsel.contiguous())
    with pytest.raises(SamoyedsError, match="w13_rowsel .* is not stored segment-major"):
        run_sparse(problem)
    problem.packed13 = kernels.checkpoint_layout(prepared)
    with pytest.raises(SamoyedsError, match="w13: values and metadata in the checkpoint's order"):
        run_sparse(problem)


def test_fresh_inputs_every_run():
    """The same kernels on new random inputs give new, still correct, outputs (no stale state)."""
    shape, pattern = preset_shape("qwen1.5-moe-a2.7b"), PATTERNS["samoyeds"]
    for seed in range(3):
        check(shape, pattern, 33, seed=seed)


@pytest.mark.parametrize("values", [None, FP8], ids=["values-bf16", "values-fp8"])
@pytest.mark.parametrize("ids", ["some-remote", "all-remote", "repeated"])
@pytest.mark.parametrize("tokens", [1, 3, 4, 8])  # Qwen3 (top-8): 4 tokens fill the 32 slots, 8 take the index
@pytest.mark.parametrize("shape", ["qwen3-30b-a3b", "mixtral-8x7b"])  # Mixtral: 8 experts, several tokens each
@pytest.mark.parametrize("pattern", PATTERNS)
def test_few_tokens_with_experts_elsewhere_or_repeated(pattern, shape, tokens, ids, values):
    """Up to 8 tokens and 32 slots GEMM 1 works its tile map out from topk_ids while the routing index is built
    (csrc/few_tokens.cuh): experts on another rank (id -1: expert parallelism) are skipped as the index skips them,
    and a token routed twice to one expert, which no top-k does, takes the index's map; both match the reference.
    One token runs it twice: the one-token kernels (csrc/one_token.cuh), which read topk_ids themselves, and the
    general path."""
    problem = make_problem(preset_shape(shape), PATTERNS[pattern], tokens, seed=21, values=values)
    if ids == "some-remote":
        problem.topk_ids[:, ::2] = -1
    elif ids == "all-remote":
        problem.topk_ids.fill_(-1)
    else:
        problem.topk_ids[0, 1] = problem.topk_ids[0, 0]
    for config in [KernelConfig(), KernelConfig(one_token=False)][: 2 if tokens == 1 else 1]:
        with kernels.override_config(config):
            out = run_sparse(problem)
            torch.cuda.synchronize()
            if ids == "all-remote":
                assert torch.equal(out, torch.zeros_like(out)), config
            else:
                err, tol = error_against_plan(problem, out)
                assert err < tol, f"{config}: relative error {err}"


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize(
    "shape, values",
    [(shape, None) for shape in SHAPES] + [(shape, FP8) for shape in FP8_SHAPES],
    ids=[f"{shape}-values-bf16" for shape in SHAPES] + [f"{shape}-values-fp8" for shape in FP8_SHAPES],
)
def test_one_token_kernels_and_the_general_path(shape, values, pattern):
    """At one token the plan takes the one-token kernels (csrc/one_token.cuh) where they run (top-k up to 8): every
    expert shape (FP8 values: the FP8 tests' shapes), both patterns, against the reference and against the general
    path's output."""
    moe = preset_shape(shape)
    problem = make_problem(moe, PATTERNS[pattern], 1, seed=5, values=values)
    layer = LayerShape(1, moe.top_k, moe.num_experts, moe.hidden, moe.intermediate)
    plan = kernels.plan_moe(layer, PATTERNS[pattern], problem.x.dtype, device_of(problem.x.device), values is not None)
    outs = {}
    for name, config in (("one token", KernelConfig()), ("general", KernelConfig(one_token=False))):
        with kernels.override_config(config):
            outs[name] = run_sparse(problem)
            torch.cuda.synchronize()
            err, tol = error_against_plan(problem, outs[name])
            assert err < tol, f"{name}: relative error {err}"
    assert plan.one_token == (moe.top_k <= 8)
    assert relative_error(outs["one token"], outs["general"]) < BF16_TOLERANCE


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("values", [None, FP8], ids=["values-bf16", "values-fp8"])
@pytest.mark.parametrize("shape", ["qwen3-30b-a3b", "mixtral-8x7b", "olmoe-1b-7b"])
def test_one_token_routes_its_logits_as_vllm_does(shape, values, renormalize):
    """At one token the kernels take vLLM's softmax top-k of the router's logits themselves
    (kernels.moe_experts_from_logits): the output of routing with vLLM's topk_softmax kernel first, on random
    logits, all-equal logits (the lowest ids), a tie at the top-k's edge and -0 against +0 (equal)."""
    from samoyeds_vllm.plugin.routing import softmax_topk

    pattern = PATTERNS["samoyeds"]
    moe = preset_shape(shape)
    problem = make_problem(moe, pattern, 1, seed=9, values=values)
    x, top_k = problem.x, moe.top_k
    generator = torch.Generator(device=x.device).manual_seed(10)
    for case in ("random", "equal", "edge tie", "signed zeros"):
        logits = torch.randn(1, moe.num_experts, generator=generator, device=x.device).to(x.dtype)
        if case == "equal":
            logits.fill_(0.5)
        elif case == "edge tie":  # the k-th and (k+1)-th largest equal
            order = logits[0].float().argsort(descending=True)
            logits[0, order[top_k]] = logits[0, order[top_k - 1]]
        elif case == "signed zeros":  # the largest are 2 top_k zeros, -0 at the lower ids: vLLM takes those
            logits = -1.0 - logits.abs()
            zeros = torch.randperm(moe.num_experts, generator=generator, device=x.device)[: 2 * top_k].sort().values
            logits[0, zeros[:top_k]] = -0.0
            logits[0, zeros[top_k:]] = 0.0
        assert kernels.routes_logits(x, logits, top_k, problem.packed13, pattern)
        out = kernels.moe_experts_from_logits(x, logits, top_k, renormalize, problem.packed13, problem.packed2, pattern)
        weights, ids = softmax_topk(logits, top_k, renormalize)
        routed = kernels.moe_experts(x, weights, ids, problem.packed13, problem.packed2, pattern)
        torch.cuda.synchronize()
        assert relative_error(out, routed) < 1e-3, case
    # in a CUDA graph (as vLLM runs it), replayed on new logits: GEMM 2 reads them before its wait (ptx.cuh)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = kernels.moe_experts_from_logits(
            x, logits, top_k, renormalize, problem.packed13, problem.packed2, pattern
        )
    for _ in range(3):
        logits.copy_(torch.randn(logits.shape, generator=generator, device=x.device))
        graph.replay()
        eager = kernels.moe_experts_from_logits(
            x, logits, top_k, renormalize, problem.packed13, problem.packed2, pattern
        )
        torch.cuda.synchronize()
        assert torch.equal(captured, eager)


@pytest.mark.parametrize("values", [None, FP8], ids=["values-bf16", "values-fp8"])
@pytest.mark.parametrize("tokens", [1, 16, 256])
@pytest.mark.parametrize("shape", ["qwen3-30b-a3b", "mixtral-8x7b"])
def test_cuda_graph_replays_match_eager_calls(shape, tokens, values, monkeypatch):
    """In a CUDA graph (as vLLM and the benchmarks run the layer) the launches keep their programmatic dependency
    on the kernel before (kernels/build.py, dependent_launches): the graph replayed on new inputs gives the bits of
    an eager call on them, with dependent launches and in plain stream order."""
    pattern = PATTERNS["samoyeds"]
    problem = make_problem(preset_shape(shape), pattern, tokens, seed=13, values=values)
    x, weights, ids = problem.x.clone(), problem.topk_weights.clone(), problem.topk_ids.clone()

    def layer():
        return kernels.moe_experts(x, weights, ids, problem.packed13, problem.packed2, pattern)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compiles and plans outside the capture
        layer()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer()
    generator = torch.Generator(device=x.device).manual_seed(14)
    num_experts, top_k = problem.packed13.values.shape[0], ids.shape[1]
    for _ in range(3):
        x.copy_(torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype))
        scores = torch.rand(tokens, num_experts, generator=generator, device=x.device)
        top = scores.topk(top_k, dim=1)
        ids.copy_(top.indices)
        weights.copy_(top.values / top.values.sum(dim=1, keepdim=True))
        graph.replay()
        eager = layer()
        monkeypatch.setenv("SAMOYEDS_DEPENDENT_LAUNCH", "0")
        kernel_launch._forward.cache_clear()  # the launches' configs are made once per plan
        in_stream_order = layer()
        monkeypatch.delenv("SAMOYEDS_DEPENDENT_LAUNCH")
        kernel_launch._forward.cache_clear()
        torch.cuda.synchronize()
        assert torch.equal(out, eager) and torch.equal(out, in_stream_order)


# ---------------------------------------------------------------------------------------------- FP8 values


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("tokens", [1, 7, 64, 300, 4096])
@pytest.mark.parametrize("shape", FP8_SHAPES)
def test_fp8_values(shape, tokens, pattern):
    """FP8 values against the fp32 product of their dequantized weights: the kernels' own error only."""
    check(preset_shape(shape), PATTERNS[pattern], tokens, seed=tokens, values=FP8)


@pytest.mark.parametrize("tokens", [1, 100, 1024])
@pytest.mark.parametrize("segment", [32, 64])
def test_fp8_values_other_segments_and_fp16(segment, tokens):
    check(
        preset_shape("olmoe-1b-7b"), Pattern.parse("samoyeds", segment), tokens, dtype=torch.float16, seed=2, values=FP8
    )


@pytest.mark.parametrize("splits", [(2, 3), (8, 6)])
def test_fp8_values_split_k(splits):
    shape, pattern = preset_shape("mixtral-8x7b"), PATTERNS["samoyeds"]
    problem = make_problem(shape, pattern, 4, seed=7, values=FP8)
    config = KernelConfig(gate_up=GemmConfig(splits=splits[0]), down=GemmConfig(splits=splits[1]))
    with kernels.override_config(config):
        err = relative_error(run_sparse(problem), reference(problem))
    assert err < BF16_TOLERANCE, f"splits {splits}: relative error {err}"


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("tokens", [1024, 4096])
@pytest.mark.parametrize("shape", ["qwen3-30b-a3b", "mixtral-8x7b"])
def test_fp8_values_without_fp8_activations(shape, tokens, pattern):
    """The ws kernel's FP8-values path with activations of their own dtype (a config's fp8_activations = False)."""
    config = GemmConfig(fp8_activations=False)
    with kernels.override_config(KernelConfig(gate_up=config, down=config)):
        problem = make_problem(preset_shape(shape), PATTERNS[pattern], tokens, seed=tokens, values=FP8)
        assert planned_fp8_activations(problem) == (False, False)
        err = relative_error(run_sparse(problem), reference(problem))
    assert err < BF16_TOLERANCE, f"relative error {err}"


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("split", [(True, False), (False, True), (True, True)])
def test_fp8_activations_in_either_gemm(split, pattern):
    """FP8 x FP8 in GEMM 1, GEMM 2 or both, each against the reference quantizing the same activations, and
    close to the layer with unquantized activations (e4m3 keeps 3 mantissa bits: a few % per activation)."""
    config = KernelConfig(gate_up=GemmConfig(fp8_activations=split[0]), down=GemmConfig(fp8_activations=split[1]))
    with kernels.override_config(config):
        problem = make_problem(preset_shape("qwen3-30b-a3b"), PATTERNS[pattern], 2048, seed=11, values=FP8)
        out = run_sparse(problem)
    assert relative_error(out, reference(problem, split)) < FP8_ACTIVATIONS_TOLERANCE
    assert relative_error(out, reference(problem)) < 0.05


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("token_tile", [8, 16, 32])
@pytest.mark.parametrize("shape", FP8_SHAPES)
def test_fp8_activations_in_the_decode_tiles(shape, token_tile, pattern):
    """The decode tiles' mma kernel multiplying FP8 copies of the activations where a config asks (e4m3 wgmma.sp,
    N = 8 to 32 tokens, Hopper), every compiled block shape (two warpgroups in the 8-warp gate/up blocks): against
    the reference quantizing the same activations, in both GEMMs or either, with split-K (the fp32 partials carry
    the columns' scales)."""
    if not device_of(torch.device("cuda")).hopper:
        pytest.skip("FP8 activations need Hopper's e4m3 wgmma.sp")
    moe, samoyeds = preset_shape(shape), PATTERNS[pattern].is_samoyeds
    problem = make_problem(moe, PATTERNS[pattern], 24, seed=token_tile, values=FP8)
    rows13, rows2 = LayerShape(24, moe.top_k, moe.num_experts, moe.hidden, moe.intermediate).packed_rows(
        PATTERNS[pattern]
    )
    both = [
        (b13, b2, (True, True), (1, 1))
        for b13 in fitting_block_shapes(token_tile, True, samoyeds, True, rows13 // 2, fp8=True)
        for b2 in fitting_block_shapes(token_tile, False, samoyeds, True, rows2, fp8=True)
    ]
    b13, b2 = both[0][:2]
    for gate_up, down, acts, splits in both + [(b13, b2, (True, False), (2, 1)), (b13, b2, (False, True), (1, 3))]:
        config = KernelConfig(
            token_tile,
            gate_up=GemmConfig(gate_up.kind, gate_up.warps, gate_up.slabs, splits[0], acts[0]),
            down=GemmConfig(down.kind, down.warps, down.slabs, splits[1], acts[1]),
        )
        with kernels.override_config(config):
            assert planned_fp8_activations(problem) == acts
            out = run_sparse(problem)
            torch.cuda.synchronize()
            err, tol = error_against_plan(problem, out)
        assert err < tol, f"{gate_up} / {down}, FP8 activations {acts}, splits {splits}: relative error {err}"
    assert relative_error(out, reference(problem)) < 0.05  # close to the layer with unquantized activations


def test_fp8_activations_of_zero_rows():
    """A token whose activations are all zero gets scale 0 and zero bytes, not NaN (0 / 0)."""
    problem = make_problem(preset_shape("qwen3-30b-a3b"), PATTERNS["samoyeds"], 1024, seed=12, values=FP8)
    problem.x[::7] = 0
    assert planned_fp8_activations(problem) == (True, True)
    out = run_sparse(problem)
    assert relative_error(out, reference(problem, (True, True))) < FP8_ACTIVATIONS_TOLERANCE
    assert not out[::7].any()


@pytest.mark.parametrize("pattern", PATTERNS)
def test_fp8_values_before_hopper(pattern, monkeypatch):
    major, minor = torch.cuda.get_device_capability()
    monkeypatch.setenv("SAMOYEDS_KERNEL_ARCH", f"sm_{major}{minor}")
    check(preset_shape("qwen3-30b-a3b"), PATTERNS[pattern], 2048, seed=3, values=FP8)


@pytest.mark.parametrize("tokens, bound", [(64, 0.05), (1024, 0.07)])
def test_fp8_values_close_to_their_unquantized_layer(tokens, bound):
    """Quantization error of the whole layer: FP8 values against the same pruned weights in bf16. Decode kernels
    multiply bf16 activations (4.6e-2 measured); the ws kernel FP8 copies of them too (6.5e-2 on an H100), within
    vLLM's FP8 dense MoE against bf16 dense on the same inputs (6.5-7.1e-2, docs/benchmarks.md)."""
    shape, pattern = preset_shape("qwen3-30b-a3b"), PATTERNS["samoyeds"]
    fp8 = make_problem(shape, pattern, tokens, seed=9, values=FP8)
    bf16 = make_problem(shape, pattern, tokens, seed=9)
    assert relative_error(run_sparse(fp8), reference(bf16)) < bound


def test_fp8_values_in_the_checkpoint_order_are_refused():
    problem = make_problem(preset_shape("olmoe-1b-7b"), PATTERNS["2:4"], 8, seed=8, values=FP8)
    problem.packed13 = kernels.checkpoint_layout(problem.packed13)
    with pytest.raises(SamoyedsError, match="w13: float8 values in the checkpoint's order"):
        run_sparse(problem)
