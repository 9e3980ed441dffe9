"""The GPU implementation of `samoyeds::moe_experts`, over the kernels in csrc/samoyeds_moe.cu.

The CUDA source is compiled at first use for the running GPU (NVRTC through CuPy, so no compiler is needed at
install time) and CuPy caches the result on disk (`CUPY_CACHE_DIR`, default ~/.cupy/kernel_cache). Kernels run on
torch's current stream with no host synchronisation, so vLLM can capture them in CUDA graphs.

One MoE forward:
1. routing index (one small kernel; three for large batches): slots (token, j) sorted by expert, and a tile map
   of up to BN slots of one expert per tile, sized from the shapes alone;
2. GEMM 1 (gate and up, SiLU(gate) * up fused) reading the tokens' rows of x in place through the index;
3. GEMM 2 (down, routing weight fused) writing each slot's output row;
4. sum over the top-k slots of each token (a fixed order: deterministic).
Batches too small to fill the GPU split K over blockIdx.z into fp32 partials, which a SiLU kernel after GEMM 1
and step 4 reduce. SAMOYEDS_POISON=1 (tests) fills the intermediate activations with NaN before GEMM 1, so an
element the kernels fail to write shows up in the output. SAMOYEDS_LINEINFO=1 (profiling) compiles with -lineinfo, so
Nsight Compute's source page maps SASS to csrc lines (benchmarks/ncu_moe.py).
"""

from __future__ import annotations

import functools
import math
import os
from importlib import resources

import numpy as np
import torch

from .errors import SamoyedsError

BM = 64  # condensed weight rows of a 4-warp slab (csrc: WARPS * 16); wide token tiles take larger blocks
WIDE_BN = 64  # token tiles this wide take the larger block shapes of _tilings (wgmma on Hopper)
MAX_SPLITS = 8  # split-K factor cap
LONG_K_TILES = 64  # GEMMs this long (k tiles) want two blocks per SM before they are left unsplit
BK = 128  # dense inputs per pipeline stage
STAGES = 3
WS_STAGES = {64: 4, 128: 3}  # pipeline depth of the warp-specialised Hopper kernel by token tile (csrc: ws::STAGES)
WS_WIDE_BN = 128  # 2:4 token-tile width on Hopper (ws kernel) for batches past WIDE_BN slots per expert
SUM_VEC = 8  # elements per thread of the slot sum for large batches (16 bytes of bf16 / fp16)
MAX_EXPERTS = 1024  # csrc: shared-memory counters of the routing index
ROUTING_KERNEL = "samoyeds::build_routing_index"
ROUTE_CHUNK = 2048  # slots per block of the multi-block count and scatter (csrc: 256 threads x ROUTE_ILP)
ROUTE_CHUNKED_FROM = 4 * ROUTE_CHUNK  # batches with at least this many slots count and scatter over many blocks
_CTYPES = {torch.bfloat16: "__nv_bfloat16", torch.float16: "__half"}
SUPPORTED_DTYPES = tuple(_CTYPES)


def _check_gpu(device: torch.device) -> None:
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        raise SamoyedsError(f"samoyeds GPU kernels need sparse tensor cores (compute capability 8.0 or newer); "
                            f"{torch.cuda.get_device_name(device)} is {major}.{minor}")


def _token_tile(slots: int, num_experts: int, samoyeds: bool, widest: int = WIDE_BN) -> int:
    """Tokens per tile, from the average slots per expert (a shape, so no host sync); small for decode. 2:4 leaves
    room for twice the average: routing is uneven, and an expert whose tokens spill into a second tile reads its
    weights twice (H100, Mixtral 2:4 at T = 64, 16 slots per expert: 16-token tiles 765 µs, 32-token tiles 600).
    samoyeds weights are half the bytes, and there the wider tiles measured slower (same case: 330 vs 352 µs).
    widest: WS_WIDE_BN where the Hopper kernel takes 128-token tiles (2:4: half the weight re-reads from L2)."""
    per_expert = (1 if samoyeds else 2) * slots / max(num_experts, 1)
    for bn in (8, 16, 32, WIDE_BN):
        if per_expert <= bn or bn == widest:
            return bn
    return widest


def _token_tiles(samoyeds: bool, hopper: bool) -> tuple[int, ...]:
    """Every token-tile width a module compiles kernels for."""
    return (8, 16, 32, WIDE_BN) + ((WS_WIDE_BN,) if hopper and not samoyeds else ())


@functools.cache
def _module(ctype: str, samoyeds: bool, segment: int, arch: str):
    """The compiled kernels of one dtype and pattern: every token-tile size of both GEMMs, and the helpers."""
    try:
        import cupy
    except ImportError:
        raise SamoyedsError("samoyeds GPU kernels are compiled at first use with CuPy: pip install cupy-cuda13x "
                            "(or cupy-cuda12x to match your CUDA)") from None
    source = (resources.files("samoyeds_vllm.csrc") / "samoyeds_moe.cu").read_text()
    names = [_gemm_name(ctype, samoyeds, segment, bn, gate_up, warps, slabs, kind)
             for bn in _token_tiles(samoyeds, arch == "sm_90a") for gate_up in (True, False)
             for warps, slabs, kind in _tilings(bn, gate_up, samoyeds, arch == "sm_90a")]
    names += [ROUTING_KERNEL, "samoyeds::count_slots", "samoyeds::scatter_slots",
              f"samoyeds::silu_mul_splits<{ctype}>"]
    names += [_sum_slots_name(ctype, src, vec) for src in (ctype, "float") for vec in (1, SUM_VEC)]
    try:
        options = (f"--gpu-architecture={arch}", "-std=c++17") + (
            ("-lineinfo",) if os.environ.get("SAMOYEDS_LINEINFO") else ())
        module = cupy.RawModule(code=source, options=options, name_expressions=names)
        module.compile()
    except cupy.cuda.compiler.CompileException as e:
        raise SamoyedsError(f"compiling csrc/samoyeds_moe.cu for {arch} failed:\n{e}") from None
    return module


@functools.cache
def _arch(device: torch.device) -> str:
    """The NVRTC target of a GPU (sm_90a on Hopper, for wgmma); asked on every forward, so looked up once."""
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}" + ("a" if major == 9 else "")


@functools.cache
def _function(dtype: torch.dtype, samoyeds: bool, segment: int, device: torch.device, name: str):
    """One kernel of the compiled module, looked up once (the forward runs on every decode step)."""
    return _module(_CTYPES[dtype], samoyeds, segment, _arch(device)).get_function(name)


def _gemm_name(ctype: str, samoyeds: bool, segment: int, bn: int, gate_up: bool, warps: int, slabs: int,
               kind: str) -> str:
    flags = f"{ctype}, {str(samoyeds).lower()}, {segment}"
    if kind == "ws":
        return f"samoyeds::moe_gemm_ws<{flags}, {bn}, {str(gate_up).lower()}>"
    return (f"samoyeds::moe_gemm<{flags}, {bn}, {str(gate_up).lower()}, {warps}, {slabs}, "
            f"{str(kind == 'wgmma').lower()}>")


def _tilings(bn: int, gate_up: bool, samoyeds: bool, hopper: bool) -> list[tuple[int, int, str]]:
    """The (MMA warps, slabs, kind) block shapes compiled for a token tile, preferred first. A slab is 16 condensed
    rows per warp; GATE_UP always has two (gate and up), GEMM 2 stacks two on wide batches so each B fragment feeds
    two MMAs, as in GATE_UP. kind "mma": mma.sp; "wgmma": wgmma.mma_async.sp in the same kernel (one warpgroup);
    "ws": the warp-specialised persistent Hopper kernel (a copying warpgroup and two MMA warpgroups). Measured on
    an H100 (Qwen3 shape, T = 16384, µs of the whole layer, benchmarks/compare_tilings.py): ws 2049 vs wgmma
    2221-2331 (samoyeds), 3282 vs 3425-3610 (2:4); before ws: wgmma GATE_UP 4 warps 2836 vs 8 warps 2896, GEMM 2
    2 slabs 2896 vs 1 slab 3569; mma.sp GEMM 2 2 slabs 3417 vs 1 slab 4001; mma.sp GATE_UP 8 warps 3438 vs 4 warps
    3491 for samoyeds, 5214 vs 5000 for 2:4. Decode keeps small 4-warp blocks, so more of them fill the GPU."""
    if bn < WIDE_BN:
        return [(4, 2 if gate_up else 1, "mma")]
    if bn == WS_WIDE_BN:
        return [(8, 2, "ws")]
    if hopper:  # the warp-specialised kernel where 128-row blocks divide the rows (not Qwen1.5's 704 gate rows)
        return [(8, 2, "ws"), (4, 2, "wgmma")] if gate_up else [(8, 2, "ws"), (4, 2, "wgmma"), (4, 1, "wgmma")]
    if gate_up:
        return [(8, 2, "mma"), (4, 2, "mma")] if samoyeds else [(4, 2, "mma")]
    return [(4, 2, "mma"), (4, 1, "mma")]


def _fitting_tilings(bn: int, gate_up: bool, samoyeds: bool, hopper: bool,
                     rows: int) -> list[tuple[int, int, str, int]]:
    """(MMA warps, slabs, kind, condensed rows per block) of the shapes in _tilings whose blocks divide the rows
    (GATE_UP: the rows of one half), preferred first."""
    shapes = [(warps, slabs, kind, 16 * warps * (1 if gate_up else slabs))
              for warps, slabs, kind in _tilings(bn, gate_up, samoyeds, hopper)]
    return [shape for shape in shapes if rows % shape[3] == 0]


def _tiling(bn: int, gate_up: bool, samoyeds: bool, hopper: bool, rows: int) -> tuple[int, int, str, int]:
    """The first of _fitting_tilings."""
    fitting = _fitting_tilings(bn, gate_up, samoyeds, hopper, rows)
    if not fitting:
        raise AssertionError(f"{rows} rows are not whole {BM}-row blocks (supports() admits only those)")
    return fitting[0]


@functools.cache
def _kernel(dtype: torch.dtype, samoyeds: bool, segment: int, bn: int, gate_up: bool, warps: int, slabs: int,
            kind: str, device: torch.device):
    """The kernel of one block shape, its threads and its dynamic shared memory (csrc: Stage, ws::STAGES)."""
    kernel = _function(dtype, samoyeds, segment, device,
                       _gemm_name(_CTYPES[dtype], samoyeds, segment, bn, gate_up, warps, slabs, kind))
    a_rows = 16 * warps * slabs
    stages = WS_STAGES[bn] if kind == "ws" else STAGES
    smem = stages * (a_rows * 128 + a_rows * 16 + bn * 256) + 1024  # + 1 KB to align the stages
    kernel.max_dynamic_shared_size_bytes = smem
    return kernel, 32 * warps + (128 if kind == "ws" else 0), smem


class _StreamHandle:
    """A raw cudaStream_t through the CUDA stream protocol, which CuPy's Stream.from_external takes."""

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return 0, self.handle


@functools.lru_cache(maxsize=64)
def _cupy_stream(handle: int, device: int):
    """CuPy's view of a torch stream, made once per stream (ExternalStream before CuPy 14, deprecated since)."""
    import cupy

    if not hasattr(cupy.cuda.Stream, "from_external"):
        return cupy.cuda.ExternalStream(handle, device)
    with cupy.cuda.Device(device):
        return cupy.cuda.Stream.from_external(_StreamHandle(handle))


def _ptr(t: torch.Tensor | None) -> np.uint64:
    return np.uint64(0 if t is None else t.data_ptr())


def kernel_rowsel(rowsel: torch.Tensor | None) -> torch.Tensor | None:
    """rowsel [E, R, K/V] stored as the kernels read it: segment-major ([E, K/V, R] in memory), so the selections of
    a block's rows for one stage are contiguous bytes, copied into shared memory with the stage. The same values
    and shape; the tensor itself when already so stored (the plugin stores it so after loading), else a copy."""
    if rowsel is None or rowsel.transpose(-1, -2).is_contiguous():
        return rowsel
    return rowsel.transpose(-1, -2).contiguous().transpose(-1, -2)


def supports(dtype: torch.dtype, w13_values: torch.Tensor, w2_values: torch.Tensor) -> bool:
    """Whether the kernels handle these activations and packed weights (else the reference implementation runs):
    bf16 / fp16, whole 64-row weight tiles and whole 128-input k tiles."""
    return (dtype in SUPPORTED_DTYPES and w13_values.dtype == dtype
            and w13_values.shape[1] % (2 * BM) == 0 and w2_values.shape[1] % BM == 0
            and (w13_values.shape[2] * 2) % BK == 0 and (w2_values.shape[2] * 2) % BK == 0)


def _num_tiles(slots: int, num_experts: int, bn: int) -> int:
    """Upper bound on tiles from the shapes alone: each expert with tokens wastes at most one partial tile."""
    return -(-slots // bn) + min(num_experts, slots)


def _splits(row_tiles: int, slots: int, num_experts: int, bn: int, k_tiles: int, sms: int) -> int:
    """Split-K factor, from the shapes alone. A batch with fewer blocks than SMs (long-K GEMMs: twice as many)
    is split along K into about 1.5 blocks per wanted block, each split keeping at least four k tiles for its
    pipeline; larger batches are not split, since the fp32 partial sums and the extra reduction cost more than
    they save. Measured on an H100 (benchmarks/compare_splits.py, results/h100-2026-11-22-s4/splits-*.json), µs
    of the layer at T = 1 with the rule before (about two waves of three blocks per SM) -> this one: Qwen3
    samoyeds 22.5 -> 20.6, 2:4 32.8 -> 25.3; DeepSeek-V2-Lite 2:4 40.2 -> 36.1; Mixtral samoyeds 96.1 -> 92.3;
    at T = 4 Qwen3 samoyeds 50.9 -> 47.1 (now unsplit). From T = 1 to 16 on all five shapes the choice is within
    6% of the best of the grid (1, 2, 4) x (1, 3) (worst: Qwen1.5 samoyeds T = 2, 26.0 against 24.6)."""
    expected_experts = num_experts * (1 - (1 - 1 / num_experts) ** slots)  # experts with tokens, uniform routing
    blocks = row_tiles * (expected_experts + slots / bn)
    wanted = sms * (2 if k_tiles >= LONG_K_TILES else 1)
    if blocks >= wanted:
        return 1
    return max(1, min(math.ceil(1.5 * wanted / blocks), MAX_SPLITS, k_tiles // 4))


def _routing_threads(slots: int, num_experts: int) -> int:
    """Threads of the one-block routing kernel: one per expert at least (its scans), one per slot up to 1024;
    a decode step's few slots need few warps, and fewer warps make its barriers cheaper."""
    return min(MAX_EXPERTS, 32 * -(-max(num_experts, slots, 128) // 32))


def _sum_slots_name(ctype: str, src: str, vec: int) -> str:
    return f"samoyeds::sum_slots<{ctype}, {src}, {vec}>"


def _sum_vec(elements: int, sms: int) -> int:
    """Elements per thread of the slot sum: 16-byte vectors where the grid still fills the GPU (4 blocks of 256
    per SM), scalars for decode, where more threads hide latency better. H100, Qwen3 shape: scalar at T = 16384
    streamed at 0.95 TB/s (633 µs, ncu); 8-wide at T = 1 was 7.1 against 5.3 µs."""
    return SUM_VEC if elements // SUM_VEC >= 4 * 256 * sms else 1


def _elementwise_grid(n: int, sms: int) -> tuple[int]:
    return (max(1, min(-(-n // 256), 8 * sms)),)


def moe_experts_cuda(x, topk_weights, topk_ids, w13_values, w13_meta, w13_rowsel, w2_values, w2_meta, w2_rowsel,
                     segment: int) -> torch.Tensor:
    _check_gpu(x.device)
    samoyeds = segment != 0
    seg = segment or BK
    tokens, hidden = x.shape
    top_k = topk_ids.shape[1]
    num_experts, r13 = w13_values.shape[:2]
    if num_experts > MAX_EXPERTS:
        raise SamoyedsError(f"the routing index handles at most {MAX_EXPERTS} experts per layer, not {num_experts}")
    r2 = w2_values.shape[1]
    inter = w2_values.shape[2] * 2
    slots = tokens * top_k
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    x = x.contiguous()
    w13_rowsel, w2_rowsel = kernel_rowsel(w13_rowsel), kernel_rowsel(w2_rowsel)
    ids = topk_ids.reshape(-1).to(torch.int64).contiguous()
    weights = topk_weights.reshape(-1).float().contiguous()
    hopper = _arch(x.device) == "sm_90a"
    ws_wide = (hopper and not samoyeds  # the 128-token tiles' ws blocks divide the rows of both GEMMs
               and bool(_fitting_tilings(WS_WIDE_BN, True, samoyeds, hopper, r13 // 2))
               and bool(_fitting_tilings(WS_WIDE_BN, False, samoyeds, hopper, r2)))
    bn = _token_tile(slots, num_experts, samoyeds, WS_WIDE_BN if ws_wide else WIDE_BN)  # both GEMMs' tile map
    n_tiles = _num_tiles(slots, num_experts, bn)
    warps1, slabs1, kind1, block_rows1 = _tiling(bn, True, samoyeds, hopper, r13 // 2)
    warps2, slabs2, kind2, block_rows2 = _tiling(bn, False, samoyeds, hopper, r2)
    row_tiles1, row_tiles2 = r13 // 2 // block_rows1, r2 // block_rows2
    z1 = _splits(row_tiles1, slots, num_experts, bn, hidden // BK, sms)
    z2 = _splits(row_tiles2, slots, num_experts, bn, inter // BK, sms)
    chunks = -(-slots // ROUTE_CHUNK) if slots >= ROUTE_CHUNKED_FROM else 0
    index = torch.empty(slots + 3 * n_tiles + chunks * num_experts, dtype=torch.int32, device=x.device)
    sorted_slot, tiles, chunk_counts = index.split([slots, 3 * n_tiles, chunks * num_experts])
    tiles = tiles.view(3, n_tiles)  # expert, first sorted position, slots of each token tile
    act = torch.empty(slots, inter, dtype=x.dtype, device=x.device)
    if os.environ.get("SAMOYEDS_POISON"):  # tests: an element the kernels fail to write shows up as NaN
        act.fill_(float("nan"))
    partial1 = torch.empty(z1, slots, 2 * inter, dtype=torch.float32, device=x.device) if z1 > 1 else None
    y = torch.empty(z2, slots, hidden, dtype=torch.float32 if z2 > 1 else x.dtype, device=x.device)
    out = torch.empty(tokens, hidden, dtype=x.dtype, device=x.device)

    import cupy

    ctype = _CTYPES[x.dtype]
    stream = _cupy_stream(torch.cuda.current_stream(x.device).cuda_stream, x.device.index)
    with cupy.cuda.Device(x.device.index), stream:
        route_args = (_ptr(ids), np.int32(slots), np.int32(num_experts), np.int32(ROUTE_CHUNK), _ptr(chunk_counts))
        if chunks:
            _function(x.dtype, samoyeds, seg, x.device, "samoyeds::count_slots")((chunks,), (256,), route_args)
        _function(x.dtype, samoyeds, seg, x.device, ROUTING_KERNEL)(
            (1,), (_routing_threads(slots, num_experts),),
            (_ptr(ids), np.int32(slots), np.int32(num_experts), _ptr(sorted_slot), _ptr(chunk_counts),
             np.int32(chunks), _ptr(tiles[0]), _ptr(tiles[1]), _ptr(tiles[2]), np.int32(bn), np.int32(n_tiles)))
        if chunks:
            _function(x.dtype, samoyeds, seg, x.device, "samoyeds::scatter_slots")(
                (chunks,), (256,), (*route_args, _ptr(sorted_slot)))
        gemms = ((True, warps1, slabs1, kind1, z1, x, w13_values, w13_meta, w13_rowsel, act, partial1, r13, hidden,
                  inter, row_tiles1),
                 (False, warps2, slabs2, kind2, z2, act, w2_values, w2_meta, w2_rowsel, y, y, r2, inter, hidden,
                  row_tiles2))
        for (gate_up, warps, slabs, kind, z, src, values, meta, rowsel, dst, partial, rows, k, n_out,
             row_tiles) in gemms:
            kernel, threads, smem = _kernel(x.dtype, samoyeds, seg, bn, gate_up, warps, slabs, kind, x.device)
            args = (_ptr(src), _ptr(values), _ptr(meta), _ptr(rowsel), _ptr(dst), _ptr(partial if z > 1 else None),
                    _ptr(tiles[0]), _ptr(tiles[1]), _ptr(tiles[2]), _ptr(sorted_slot), _ptr(weights),
                    np.int32(rows), np.int32(k), np.int32(top_k), np.int32(n_out), np.int32(slots))
            if kind == "ws":  # persistent: one wave of blocks walks all (token tile, row block) items
                items = row_tiles * n_tiles
                grid = (min(items, sms), 1, z)
                args += (np.int32(row_tiles), np.int32(n_tiles))
            else:
                grid = (row_tiles, n_tiles, z)
            kernel(grid, (threads,), args, shared_mem=smem)
            if gate_up and z > 1:
                _function(x.dtype, samoyeds, seg, x.device, f"samoyeds::silu_mul_splits<{ctype}>")(
                    _elementwise_grid(slots * inter, sms), (256,),
                    (_ptr(partial1), _ptr(act), np.int32(z), np.int32(slots), np.int32(inter)))
        vec = _sum_vec(tokens * hidden, sms)
        reduce = _sum_slots_name(ctype, "float" if z2 > 1 else ctype, vec)
        _function(x.dtype, samoyeds, seg, x.device, reduce)(
            _elementwise_grid(tokens * hidden // vec, sms), (256,),
            (_ptr(y), _ptr(ids), np.int32(num_experts), _ptr(out), np.int32(z2), np.int32(tokens),
             np.int32(top_k), np.int32(hidden)))
    return out
