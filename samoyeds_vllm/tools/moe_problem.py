"""Random MoE layer problems of real model shapes, and their fp32 dense reference: what the GPU tests check the
kernels on and what `bench moe` times (the layer-level counterpart of the model maker).

A problem holds dense expert weights ~ N(0, 1/fan_in) (pruned onto the pattern when one is given, and then also
packed as the plugin stores them after loading, with FP8 values when asked: the dense weights are then the
dequantized ones, float32), activations ~ N(0, 1) and a routing of one of a few kinds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import kernels
from ..format import PackedWeight, Pattern, compress, decompress, prune, quantize
from ..plugin.ops import moe_experts, moe_reference
from ..plugin.routing import softmax_topk_ops
from .architectures import MoEShape

ROUTINGS = ("balanced", "skewed", "sparse", "one-hot")


@dataclass
class MoEProblem:
    x: torch.Tensor  # [T, H]
    topk_weights: torch.Tensor  # [T, k]
    topk_ids: torch.Tensor  # [T, k]
    w13: torch.Tensor  # [E, 2I, H] dense weights (pruned onto `pattern` when it is set; dequantized FP8 values)
    w2: torch.Tensor  # [E, H, I]
    pattern: Pattern | None
    packed13: PackedWeight | None  # w13 and w2 packed in the kernels' layout (kernels.prepare_weights)
    packed2: PackedWeight | None


def random_routing(tokens: int, shape: MoEShape, kind: str, generator: torch.Generator, device) -> tuple:
    """(weights, ids) for `kind`: "balanced" (random logits), "skewed" (a few experts get most tokens),
    "sparse" (half the experts get nothing), "one-hot" (expert 0 is in every token's top-k); vLLM's softmax top-k
    in tensor ops (int64 ids), so that making a problem imports no vLLM (`bench moe --no-vllm`, ab_moe)."""
    logits = torch.randn(tokens, shape.num_experts, generator=generator, device=device)
    if kind == "skewed":
        logits[:, : max(1, shape.num_experts // 16)] += 4.0
    elif kind == "sparse":
        logits[:, shape.num_experts // 2 :] = -1e4
    elif kind == "one-hot":
        logits[:, 0] = 1e4
    elif kind != "balanced":
        raise ValueError(f"unknown routing {kind!r}; choose one of {', '.join(ROUTINGS)}")
    return softmax_topk_ops(logits, shape.top_k, renormalize=True)


def make_problem(
    shape: MoEShape,
    pattern: Pattern | None,
    tokens: int,
    dtype: torch.dtype = torch.bfloat16,
    routing: str = "balanced",
    seed: int = 0,
    device: str = "cuda",
    values: torch.dtype | None = None,
) -> MoEProblem:
    """A random problem; `pattern` None keeps the weights dense (the dense peer of the same problem: the same seed
    gives the same activations, routing and, before quantization, weights); `values` FP8 quantizes the kept values
    (format.quantize)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    e, h, i = shape.num_experts, shape.hidden, shape.intermediate
    w13 = _random_weights((e, 2 * i, h), h**-0.5, gen, dtype, device)
    w2 = _random_weights((e, h, i), i**-0.5, gen, dtype, device)
    packed13 = packed2 = None
    if pattern is not None:
        (w13, packed13), (w2, packed2) = (_prune_and_pack(w, pattern, values) for w in (w13, w2))
    x = torch.randn(tokens, h, generator=gen, device=device).to(dtype)
    weights, ids = random_routing(tokens, shape, routing, gen, device)
    return MoEProblem(x, weights, ids, w13, w2, pattern, packed13, packed2)


def _random_weights(
    shape: tuple[int, int, int],
    scale: float,
    gen: torch.Generator,
    dtype: torch.dtype,
    device,
    chunk_bytes: int = 1 << 30,
) -> torch.Tensor:
    """Normal weights times `scale` in `dtype`, drawn a few experts at a time: drawn whole, DeepSeek-V3's gate/up
    weights pass through 28 GiB of float32, which an 80 GB H100 whose memory the earlier problems of a bench moe
    run had cut up could not place."""
    out = torch.empty(shape, dtype=dtype, device=device)
    step = max(1, chunk_bytes // (out[0].numel() * 4))
    for start in range(0, shape[0], step):
        part = out[start : start + step]
        part.copy_(torch.randn(part.shape, generator=gen, device=device) * scale)
    return out


def _prune_and_pack(
    w: torch.Tensor, pattern: Pattern, values: torch.dtype | None = None, chunk_bytes: int = 1 << 30
) -> tuple[torch.Tensor, PackedWeight]:
    """`w` pruned onto the pattern (in place) and packed in the kernels' layout, a few experts at a time: pruning
    holds fp32 scores and int64 top-k positions, ~8x the bf16 weights, which for DeepSeek-V3's 15 GB gate/up
    weights is more than one GPU has. Pruning and packing act on rows, so the result is that of the whole tensor.
    `values` quantizes the packed values; `w` then becomes their dequantized weights (float32)."""
    step = max(1, chunk_bytes // (w[0].numel() * w.element_size()))
    parts = []
    for start in range(0, w.shape[0], step):
        w[start : start + step] = prune(w[start : start + step], pattern)
        part = compress(w[start : start + step], pattern)
        parts.append(part if values is None else quantize(part, pattern, values))
    packed = _joined(parts)
    if values is not None:
        w = decompress(packed, pattern)
    return w, kernels.prepare_weights(packed)


def _joined(parts: list[PackedWeight]) -> PackedWeight:
    """Packed weights of consecutive experts as one."""
    return PackedWeight(*(None if t[0] is None else torch.cat(t) for t in zip(*parts, strict=True)))


def quantized_by_experts(
    packed: PackedWeight, pattern: Pattern, values: torch.dtype, chunk_bytes: int = 1 << 30
) -> PackedWeight:
    """`packed` (either layout) quantized to `values` in the format's layout, a few experts at a time: quantizing
    passes through float32, which for DeepSeek-V3's 2:4 gate/up values whole is 14 GiB (more than an 80 GB GPU had
    left beside the problem). Scales are per output row, so the result is that of the whole tensor."""
    step = max(1, chunk_bytes // (packed.values[0].numel() * 4))
    return _joined(
        [
            quantize(
                kernels.checkpoint_layout(PackedWeight(*(t if t is None else t[s : s + step] for t in packed))),
                pattern,
                values,
            )
            for s in range(0, packed.values.shape[0], step)
        ]
    )


def run_sparse(p: MoEProblem) -> torch.Tensor:
    """The problem through the samoyeds op (the GPU kernels on CUDA tensors)."""
    return moe_experts(p.x, p.topk_weights, p.topk_ids, p.packed13, p.packed2, p.pattern)


def reference(p: MoEProblem, fp8_activations: tuple[bool, bool] = (False, False)) -> torch.Tensor:
    """The layer in fp32 from the dense (pruned) weights, expert by expert. fp8_activations: GEMM 1 / GEMM 2 read
    their activations quantized as the kernels' FP8 x FP8 path does (x per token, and the intermediate activation,
    stored in x's dtype first, per slot; planned_fp8_activations says when the kernels do)."""
    if not any(fp8_activations):
        return moe_reference(p.x, p.topk_weights, p.topk_ids, lambda expert: (p.w13[expert], p.w2[expert]))
    quantize_x, quantize_act = fp8_activations
    x = quantize_rows(p.x) if quantize_x else p.x.float()
    out = torch.zeros(p.x.shape, dtype=torch.float32, device=p.x.device)
    ids, weights = p.topk_ids.reshape(-1), p.topk_weights.reshape(-1).float()
    token_of = torch.arange(p.x.shape[0], device=p.x.device).repeat_interleave(p.topk_ids.shape[1])
    for expert in ids[ids >= 0].unique().tolist():
        slots = (ids == expert).nonzero().squeeze(1)
        gate, up = (x[token_of[slots]] @ p.w13[expert].float().T).chunk(2, dim=-1)
        act = (torch.nn.functional.silu(gate) * up).to(p.x.dtype)
        act = quantize_rows(act) if quantize_act else act.float()
        out.index_add_(0, token_of[slots], (act @ p.w2[expert].float().T) * weights[slots, None])
    return out


def quantize_rows(rows: torch.Tensor) -> torch.Tensor:
    """What csrc/quantize.cuh makes of a GEMM's activation rows, dequantized (fp32): float8 e4m3 values with one
    scale per row, its largest magnitude / 448."""
    r = rows.float()
    amax = r.abs().amax(dim=-1, keepdim=True)
    inv = torch.where(amax > 0, 448.0 / amax, torch.zeros_like(amax))
    return (r * inv).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float() * (amax / 448.0)


def planned_fp8_activations(p: MoEProblem) -> tuple[bool, bool]:
    """Whether the kernels' plan for this problem (on its GPU, under any override_config) quantizes the activations
    of GEMM 1 and of GEMM 2: FP8 values in Hopper's ws kernel, or in its decode tiles where a config asks."""
    if p.packed13 is None or p.packed13.scale is None or not p.x.is_cuda:
        return False, False
    shape = kernels.LayerShape(p.x.shape[0], p.topk_ids.shape[1], p.w13.shape[0], p.x.shape[1], p.w2.shape[2])
    plan = kernels.plan_moe(shape, p.pattern, p.x.dtype, kernels.device_of(p.x.device), fp8=True)
    return plan.gate_up.fp8_activations, plan.down.fp8_activations


# What the kernels may differ from reference(p, planned_fp8_activations(p)) by, relative. bf16 operands and a bf16
# intermediate with fp32 accumulation: 1e-3 .. 1e-2. FP8 x FP8: the FP8 tensor cores add with fewer bits than fp32
# (~2^-12), so some intermediate activations land on the other side of an e4m3 rounding step than in the reference
# (one step is 1/8 of the value): 1.1-1.3e-2 measured with both GEMMs FP8 x FP8, below 1e-2 with one.
BF16_TOLERANCE = 1e-2
FP8_ACTIVATIONS_TOLERANCE = 2e-2


def tolerance(fp8_activations: tuple[bool, bool]) -> float:
    return FP8_ACTIVATIONS_TOLERANCE if any(fp8_activations) else BF16_TOLERANCE


def error_against_plan(
    p: MoEProblem, out: torch.Tensor, refs: dict[tuple[bool, bool], torch.Tensor] | None = None
) -> tuple[float, float]:
    """out's relative error against the fp32 reference of what the kernels' plan for p computes (under any
    override_config: the activations quantized where it quantizes them), and the tolerance for it. refs caches the
    references by planned_fp8_activations across configs of one problem."""
    fp8_activations = planned_fp8_activations(p)
    refs = {} if refs is None else refs
    if fp8_activations not in refs:
        refs[fp8_activations] = reference(p, fp8_activations)
    return relative_error(out, refs[fp8_activations]), tolerance(fp8_activations)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref||, NaN when out has a non-finite value."""
    if not torch.isfinite(out).all():
        return float("nan")
    return float((out.float() - ref).norm() / ref.norm())
