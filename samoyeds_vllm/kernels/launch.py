"""One MoE forward on the GPU: buffers, the layer's MoEParams, and the launches the plan names.

Kernels run on torch's current stream with no host synchronisation, so vLLM captures them in CUDA graphs:
1. the routing index (one small kernel; three for large batches): slots (token, j) sorted by expert, and a tile map
   of up to token_tile slots of one expert per tile, sized from the shapes alone;
2. GEMM 1 (gate and up, SiLU(gate) * up fused) reading the tokens' rows of x in place through the index;
3. GEMM 2 (down, routing weight fused) writing each slot's output row;
4. the sum over the top-k slots of each token (a fixed order: deterministic).
With FP8 values, Hopper's ws kernel multiplies FP8 copies of its activations (e4m3 bytes and a scale per row, made
by one small kernel before each GEMM: csrc/quantize.cuh) unless a kernel config says otherwise.
Batches too small to fill the GPU split K over blockIdx.z into fp32 partials, which the SiLU kernel after GEMM 1
and step 4 reduce. SAMOYEDS_POISON=1 (tests) fills the intermediate activations with NaN before GEMM 1, so an
element the kernels fail to write shows up in the output.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from ..errors import SamoyedsError
from ..format import PackedWeight, Pattern
from . import build
from .geometry import ELEMENTWISE_THREADS, MAX_EXPERTS, ROUTE_THREADS, template_name
from .params import MoEParams, PackedExperts, ptr, to_kernel_arg
from .plan import LayerShape, device_of, plan_moe
from .weights import check_weights, dense_shape


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
    shape = LayerShape(x.shape[0], topk_ids.shape[1], num_experts, x.shape[1], dense_shape(w2)[1])
    fp8 = w13.scale is not None
    import cupy

    with cupy.cuda.Device(x.device.index):  # the occupancy of kernels compiled in this device's context
        plan = plan_moe(shape, pattern, x.dtype, device, fp8, build.occupancy(x.dtype, pattern, device.arch, fp8))
    slots = shape.slots

    x = x.contiguous()
    ids = topk_ids.reshape(-1).to(torch.int64).contiguous()
    weights = topk_weights.reshape(-1).float().contiguous()
    index = torch.empty(slots + 3 * plan.num_tiles + plan.chunks * num_experts, dtype=torch.int32, device=x.device)
    sorted_slot, tiles, chunk_counts = index.split([slots, 3 * plan.num_tiles, plan.chunks * num_experts])
    tile_expert, tile_start, tile_rows = tiles.view(3, plan.num_tiles)
    act = torch.empty(slots, shape.inter, dtype=x.dtype, device=x.device)
    if os.environ.get("SAMOYEDS_POISON"):  # tests: an element the kernels fail to write shows up as NaN
        act.fill_(float("nan"))
    z1, z2 = plan.gate_up.splits, plan.down.splits
    gate_up_partial = torch.empty(z1, slots, 2 * shape.inter, dtype=torch.float32, device=x.device) if z1 > 1 else None
    y = torch.empty(z2, slots, shape.hidden, dtype=torch.float32 if z2 > 1 else x.dtype, device=x.device)
    # FP8 activations: e4m3 copies of x and act with a scale per row (quantize_rows), for the GEMMs that read them
    x_fp8, x_scale = _fp8_copy(plan.gate_up.fp8_activations, shape.tokens, shape.hidden, x.device)
    act_fp8, act_scale = _fp8_copy(plan.down.fp8_activations, slots, shape.inter, x.device)
    out = torch.empty(shape.tokens, shape.hidden, dtype=x.dtype, device=x.device)

    rows13, rows2 = shape.packed_rows(pattern)
    params = to_kernel_arg(
        MoEParams(
            topk_ids=ptr(ids),
            topk_weights=ptr(weights),
            tokens=shape.tokens,
            top_k=shape.top_k,
            slots=slots,
            num_experts=num_experts,
            hidden=shape.hidden,
            inter=shape.inter,
            sorted_slot=ptr(sorted_slot),
            tile_expert=ptr(tile_expert),
            tile_start=ptr(tile_start),
            tile_rows=ptr(tile_rows),
            chunk_counts=ptr(chunk_counts),
            token_tile=plan.token_tile,
            num_tiles=plan.num_tiles,
            chunks=plan.chunks,
            w13=PackedExperts(ptr(w13.values), ptr(w13.meta), ptr(w13.rowsel), ptr(w13.scale), rows13),
            x=ptr(x),
            x_fp8=ptr(x_fp8),
            x_scale=ptr(x_scale),
            act=ptr(act),
            gate_up_partial=ptr(gate_up_partial),
            gate_up_splits=z1,
            w2=PackedExperts(ptr(w2.values), ptr(w2.meta), ptr(w2.rowsel), ptr(w2.scale), rows2),
            act_fp8=ptr(act_fp8),
            act_scale=ptr(act_scale),
            y=ptr(y),
            down_splits=z2,
            out=ptr(out),
        )
    )

    # cuLaunchKernel's kernelParams: the address of each argument (one: the struct, passed by value)
    arg_addresses = np.array([params.ctypes.data], dtype=np.uintp)
    stream = torch.cuda.current_stream(x.device).cuda_stream

    def launch(name: str, grid: tuple, threads: int, shared_bytes: int = 0) -> None:
        function = build.kernel(x.dtype, pattern, device.arch, fp8, name, shared_bytes)
        build.launch(function, grid, threads, shared_bytes, stream, arg_addresses.ctypes.data)

    with cupy.cuda.Device(x.device.index):  # the kernels' module belongs to this device's context
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
        launch(plan.sum_kernel, plan.sum_grid, ELEMENTWISE_THREADS)
    return out


def _fp8_copy(wanted: bool, rows: int, cols: int, device: torch.device) -> tuple[torch.Tensor | None, ...]:
    """The e4m3 bytes [rows, cols] and fp32 row scales quantize_rows writes, or (None, None)."""
    if not wanted:
        return None, None
    return (
        torch.empty(rows, cols, dtype=torch.uint8, device=device),
        torch.empty(rows, dtype=torch.float32, device=device),
    )
