"""One MoE forward on the GPU: buffers, the layer's MoEParams, and the launches the plan names.

Kernels run on torch's current stream with no host synchronisation, so vLLM captures them in CUDA graphs:
1. the routing index (one small kernel; three for large batches): slots (token, j) sorted by expert, and a tile map
   of up to token_tile slots of one expert per tile, sized from the shapes alone;
2. GEMM 1 (gate and up, SiLU(gate) * up fused) reading the tokens' rows of x in place through the index;
3. GEMM 2 (down, routing weight fused) writing each slot's output row;
4. the sum over the top-k slots of each token (a fixed order: deterministic).
One token takes two kernels instead (csrc/one_token.cuh): GEMM 1 and GEMM 2 read topk_ids themselves and add their
warps' parts in shared memory, so there is no index, no split-K partial and no slot sum.
With FP8 values, Hopper's ws kernel multiplies FP8 copies of its activations (e4m3 bytes and a scale per row, made
by one small kernel before each GEMM: csrc/quantize.cuh) unless a kernel config says otherwise.
From Hopper on, each launch is a programmatic dependent launch: its blocks may start while the kernel before it
still runs, and wait inside the kernel where they read what that kernel wrote (csrc/ptx.cuh), so a launch's start
and what it can do early (GEMM 2's first weight stages, the copy of x in FP8) overlap the kernel before.
Batches too small to fill the GPU split K over blockIdx.z into fp32 partials, which the SiLU kernel after GEMM 1
and step 4 reduce. SAMOYEDS_POISON=1 (tests) fills the intermediate activations with NaN before GEMM 1, so an
element the kernels fail to write shows up in the output.

vLLM runs steps past its largest CUDA graph (a serving step that prefills several prompts) eagerly, where the
host's time per layer bounds the step: so what one forward asks of the host beyond the plan is cached per plan
(`_Forward`: the kernels' CUfunctions, grids and the scratch buffers' offsets in one workspace), and a forward
allocates its scratch buffers as that one workspace and packs one parameter struct.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import SamoyedsError
from ..format import PackedWeight, Pattern
from . import build
from .geometry import ELEMENTWISE_THREADS, MAX_EXPERTS, MAX_ROUTED_LOGITS, ROUTE_THREADS, template_name
from .params import MoEParams, PackedExperts, ptr, to_kernel_arg
from .plan import LayerShape, MoEPlan, device_of, one_token_planned, plan_moe
from .weights import check_weights, dense_shape

WORKSPACE_ALIGN = 256  # bytes: every scratch buffer starts on a 256-byte boundary (16-byte vector loads and more)


@dataclass(frozen=True)
class Workspace:
    """Byte offsets of a forward's scratch buffers in one allocation (None: not needed by this plan)."""

    index: int  # tiles [num_tiles, 4] int32, sorted_slot [slots] int32, sorted_weight [slots] fp32,
    # chunk_counts [chunks, E] int32
    act: int  # [slots, I] of the activations' dtype: SiLU(gate) * up
    gate_up_partial: int | None  # fp32 [splits, slots, 2I]: GEMM 1's split-K partials
    y: int  # [splits, slots, H]: GEMM 2's rows per slot (fp32 partials under split-K, else the activations' dtype)
    x_fp8: int | None  # e4m3 copy of x [T, H] ...
    x_scale: int | None  # ... and its fp32 row scales [T]
    act_fp8: int | None  # e4m3 copy of act [slots, I] ...
    act_scale: int | None  # ... and its fp32 row scales [slots]
    nbytes: int


def workspace_layout(plan: MoEPlan, shape: LayerShape, dtype: torch.dtype) -> Workspace:
    """Where each scratch buffer of a forward with this plan lies in its workspace."""
    item = torch.empty((), dtype=dtype).element_size()
    slots, z1, z2 = shape.slots, plan.gate_up.splits, plan.down.splits
    sizes = {
        "index": 4 * (4 * plan.num_tiles + 2 * slots + plan.chunks * shape.num_experts),
        "act": item * slots * shape.inter,
        "gate_up_partial": 4 * z1 * slots * 2 * shape.inter if z1 > 1 else None,
        "y": (4 if z2 > 1 else item) * z2 * slots * shape.hidden,
        "x_fp8": shape.tokens * shape.hidden if plan.gate_up.fp8_activations else None,
        "x_scale": 4 * shape.tokens if plan.gate_up.fp8_activations else None,
        "act_fp8": slots * shape.inter if plan.down.fp8_activations else None,
        "act_scale": 4 * slots if plan.down.fp8_activations else None,
    }
    offsets, end = {}, 0
    for name, size in sizes.items():
        if size is None:
            offsets[name] = None
            continue
        offsets[name] = end
        end += -(-size // WORKSPACE_ALIGN) * WORKSPACE_ALIGN
    return Workspace(**offsets, nbytes=max(end, WORKSPACE_ALIGN))


@dataclass(frozen=True)
class _Forward:
    """What a plan asks of the host on every forward, looked up once: the launches in order, as (CUfunction,
    CUlaunchConfig), and the workspace."""

    launches: tuple[tuple[int, build.LaunchConfig], ...]
    workspace: Workspace


@functools.lru_cache(maxsize=4096)
def _forward(
    plan: MoEPlan, shape: LayerShape, dtype: torch.dtype, pattern: Pattern, arch: str, fp8: bool, gpu: int
) -> _Forward:
    """Run inside cupy.cuda.Device(gpu): a CUfunction belongs to the context it was loaded in."""
    launches = []
    dependent = build.dependent_launches(arch)

    def launch(name: str, grid: tuple, threads: int, shared_bytes: int = 0) -> None:
        function = build.kernel(dtype, pattern, arch, fp8, name, shared_bytes).kernel.ptr
        launches.append((function, build.launch_config((*grid, 1, 1)[:3], threads, shared_bytes, dependent)))

    if not plan.one_token:  # the one-token kernels read topk_ids themselves
        if plan.chunks:
            launch(template_name("count_slots"), (plan.chunks,), ROUTE_THREADS)
        launch(template_name("build_routing_index"), (1,), plan.routing_threads)
        if plan.chunks:
            launch(template_name("scatter_slots"), (plan.chunks,), ROUTE_THREADS)
    for gemm in (plan.gate_up, plan.down):
        if gemm.quantize_kernel:
            launch(gemm.quantize_kernel, gemm.quantize_grid, ELEMENTWISE_THREADS)
        launch(gemm.kernel, gemm.grid, gemm.threads, gemm.shared_bytes)
        if gemm.gate_up and plan.silu_kernel:
            launch(plan.silu_kernel, plan.silu_grid, ELEMENTWISE_THREADS)
    if plan.sum_kernel:
        launch(plan.sum_kernel, plan.sum_grid, ELEMENTWISE_THREADS)
    return _Forward(tuple(launches), workspace_layout(plan, shape, dtype))


def moe_experts(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13: PackedWeight,
    w2: PackedWeight,
    pattern: Pattern,
) -> torch.Tensor:
    """sum_k topk_weights * expert(x) on the GPU: x [T, H] bf16 / fp16, routing [T, k] (ids of experts on other
    ranks outside [0, E)), packed weights in the kernels' layout (weights.prepare_weights): values of x's dtype, or
    FP8 values with their scales."""
    ids = topk_ids.reshape(-1).to(torch.int64).contiguous()
    weights = topk_weights.reshape(-1).float().contiguous()
    return _forward_on_gpu(x, topk_ids.shape[1], w13, w2, pattern, ids, weights)


def routes_logits(
    x: torch.Tensor, router_logits: torch.Tensor, top_k: int, w13: PackedWeight, pattern: Pattern
) -> bool:
    """Whether moe_experts_from_logits runs: the plan takes the one-token kernels (one token, top-k up to 8, no kernel
    config asking for the general path), which take the top-k themselves from logits of x's dtype over at most
    MAX_ROUTED_LOGITS experts, at least top_k of them. One logit per expert of w13: the caller routes first under
    expert parallelism (the method: no expert map), whose global expert ids these kernels do not map."""
    num_experts = w13.values.shape[0]
    shape = LayerShape(1, top_k, num_experts, x.shape[1], dense_shape(w13)[0] // 2)
    return (
        x.shape[0] == 1
        and router_logits.shape == (1, num_experts)
        and router_logits.dtype == x.dtype
        and top_k <= num_experts <= MAX_ROUTED_LOGITS
        and one_token_planned(shape, pattern, x.dtype, device_of(x.device), w13.scale is not None)
    )


def moe_experts_from_logits(
    x: torch.Tensor,
    router_logits: torch.Tensor,
    top_k: int,
    renormalize: bool,
    w13: PackedWeight,
    w2: PackedWeight,
    pattern: Pattern,
) -> torch.Tensor:
    """moe_experts with the routing of vLLM's softmax top-k (topk_softmax: softmax in fp32, the top_k largest, ties
    to the lower expert id, renormalised on request) taken inside the one-token kernels from the router's logits,
    where routes_logits says they can: a launch fewer than routing first."""
    if not routes_logits(x, router_logits, top_k, w13, pattern):
        raise SamoyedsError("moe_experts_from_logits: routes_logits refuses these inputs (route first)")
    return _forward_on_gpu(
        x, top_k, w13, w2, pattern, router_logits=router_logits.contiguous(), renormalize=renormalize
    )


def _forward_on_gpu(
    x: torch.Tensor,
    top_k: int,
    w13: PackedWeight,
    w2: PackedWeight,
    pattern: Pattern,
    ids: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
    router_logits: torch.Tensor | None = None,
    renormalize: bool = False,
) -> torch.Tensor:
    """One forward, routed by flat int64 ids and fp32 weights, or by the router's logits (the one-token kernels)."""
    device = device_of(x.device)
    if device.capability < (8, 0):
        raise SamoyedsError(
            "samoyeds GPU kernels need sparse tensor cores (compute capability 8.0 or newer); "
            f"{device.name} is {device.capability[0]}.{device.capability[1]}"
        )
    check_weights(w13=w13, w2=w2)
    num_experts = w13.values.shape[0]
    if num_experts > MAX_EXPERTS:
        raise SamoyedsError(f"the routing index handles at most {MAX_EXPERTS} experts per layer, not {num_experts}")
    shape = LayerShape(x.shape[0], top_k, num_experts, x.shape[1], dense_shape(w2)[1])
    fp8 = w13.scale is not None
    gpu = x.device.index
    import cupy

    with cupy.cuda.Device(gpu):  # the kernels' module (and their occupancy) belongs to this device's context
        plan = plan_moe(shape, pattern, x.dtype, device, fp8, build.occupancy(x.dtype, pattern, device.arch, fp8))
        if router_logits is not None and not plan.one_token:  # routes_logits asked the same: a plan out of step
            raise SamoyedsError("the router's logits reached a plan without the one-token kernels (route first)")
        forward = _forward(plan, shape, x.dtype, pattern, device.arch, fp8, gpu)

        x = x.contiguous()
        space = forward.workspace
        workspace = torch.empty(space.nbytes, dtype=torch.uint8, device=x.device)
        out = torch.empty(shape.tokens, shape.hidden, dtype=x.dtype, device=x.device)
        if os.environ.get("SAMOYEDS_POISON"):  # tests: an element the kernels fail to write shows up as NaN, and
            # so does a row of another rank's slot (never written) that the slot sum reads but must leave out
            act_bytes = shape.slots * shape.inter * x.element_size()
            workspace[space.act : space.act + act_bytes].view(x.dtype).fill_(float("nan"))
            y_dtype = torch.float32 if plan.down.splits > 1 else x.dtype
            y_bytes = plan.down.splits * shape.slots * shape.hidden * y_dtype.itemsize
            workspace[space.y : space.y + y_bytes].view(y_dtype).fill_(float("nan"))
        base = workspace.data_ptr()
        params = to_kernel_arg(
            moe_params(plan, shape, pattern, space, base, x, ids, weights, w13, w2, out, router_logits, renormalize)
        )
        # cuLaunchKernel's kernelParams: the address of each argument (one: the struct, passed by value)
        arg_addresses = np.array([params.ctypes.data], dtype=np.uintp)
        # the raw handle of torch's current stream, as the code torch.compile generates reads it (torch.cuda's
        # current_stream builds a Stream object per call)
        stream = torch._C._cuda_getCurrentRawStream(gpu)
        for function, config in forward.launches:
            build.launch(function, config, stream, arg_addresses.ctypes.data)
    return out


def moe_params(
    plan: MoEPlan,
    shape: LayerShape,
    pattern: Pattern,
    space: Workspace,
    base: int,
    x: torch.Tensor,
    ids: torch.Tensor | None,
    weights: torch.Tensor | None,
    w13: PackedWeight,
    w2: PackedWeight,
    out: torch.Tensor,
    router_logits: torch.Tensor | None = None,
    renormalize: bool = False,
) -> MoEParams:
    """The forward's MoEParams: the routing (flat ids and weights, or the router's logits) and weights' tensors,
    the scratch buffers at their offsets from the workspace's address `base` (0 for those the plan does not need),
    the shapes and the plan's choices."""

    def at(offset: int | None) -> int:
        return 0 if offset is None else base + offset

    # the routing index: the tile records first (16-byte loads: the workspace's alignment), then sorted_slot,
    # sorted_weight and chunk_counts
    tiles = at(space.index)
    sorted_slot = tiles + 16 * plan.num_tiles
    sorted_weight = sorted_slot + 4 * shape.slots
    rows13, rows2 = shape.packed_rows(pattern)
    return MoEParams(
        topk_ids=ptr(ids),
        topk_weights=ptr(weights),
        router_logits=ptr(router_logits),
        renormalize=int(renormalize),
        tokens=shape.tokens,
        top_k=shape.top_k,
        slots=shape.slots,
        num_experts=shape.num_experts,
        hidden=shape.hidden,
        inter=shape.inter,
        sorted_slot=sorted_slot,
        sorted_weight=sorted_weight,
        tiles=tiles,
        chunk_counts=sorted_weight + 4 * shape.slots if plan.chunks else 0,
        token_tile=plan.token_tile,
        num_tiles=plan.num_tiles,
        chunks=plan.chunks,
        few_token_map=int(plan.few_token_map),
        w13=PackedExperts(ptr(w13.values), ptr(w13.meta), ptr(w13.rowsel), ptr(w13.scale), rows13),
        x=ptr(x),
        x_fp8=at(space.x_fp8),
        x_scale=at(space.x_scale),
        act=at(space.act),
        gate_up_partial=at(space.gate_up_partial),
        gate_up_splits=plan.gate_up.splits,
        w2=PackedExperts(ptr(w2.values), ptr(w2.meta), ptr(w2.rowsel), ptr(w2.scale), rows2),
        act_fp8=at(space.act_fp8),
        act_scale=at(space.act_scale),
        y=at(space.y),
        down_splits=plan.down.splits,
        out=ptr(out),
    )
