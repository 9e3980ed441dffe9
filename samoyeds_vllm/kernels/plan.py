"""The launch plan of one MoE forward: token tile, block shape and split-K factor of each GEMM, grids, threads and
shared memory, all from the shapes alone (no host synchronisation, so vLLM captures the forward in CUDA graphs).

The choices are data: a KernelConfig names any of them (a field left None keeps the heuristic's choice). Configs
come from, first to last: `override_config` (experiments, benchmarks), a tuned table for this GPU and layer shape
(JSON under configs/kernels/ of the package, or under $SAMOYEDS_KERNEL_CONFIG_DIR; format in
configs/kernels/README.md, keyed like vLLM's fused-MoE configs), and the heuristics below, which are the defaults.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

import torch

from ..errors import SamoyedsError
from ..format import Pattern
from .geometry import (
    BK,
    ELEMENTWISE_THREADS,
    FEW_TOKEN_SLOTS,
    FEW_TOKENS,
    MAX_EXPERTS,
    MAX_SPLITS,
    QUANTIZE_CHUNKS_IN_FLIGHT,
    ROUTE_CHUNK,
    SLAB_ROWS,
    SUM_VEC,
    BlockShape,
    template_name,
)

LONG_K_TILES = 64  # GEMMs this long (k tiles) want two blocks per SM before they are left unsplit
NARROW_TILES = (8, 16, 32)  # token tiles of decode batches (mma.sp)
WIDE_BN = 64  # token tiles this wide take the larger block shapes (wgmma on Hopper)
WS_WIDE_BN = 128  # 2:4 token tiles on Hopper (ws kernel) for batches past WIDE_BN slots per expert
TAIL_FROM_WAVES = 1.05  # decode grids past this many waves of the preferred block shape may take another (decode_block)
TAIL_GAIN = 0.95  # ... if its ceil(waves) / waves is below this fraction of the preferred shape's
ELEMENTWISE_BLOCKS_PER_SM = 8  # 2048 threads per SM in blocks of 256: the most that fit, and CPU plans' count
HOPPER_WIDE_FROM = 16  # average slots per expert from which Hopper takes WIDE_BN tiles (token_tile_heuristic)
ROUTE_CHUNKED_FROM = 4 * ROUTE_CHUNK  # batches with at least this many slots count and scatter over many blocks
MIN_ROW_BLOCK = SLAB_ROWS * 4  # the smallest block (4 warps, one slab): weight rows come in whole blocks of it
#: Warps of the one-token kernels' blocks (csrc/one_token.cuh), by GEMM (gate/up or not): GEMM 1's warps split one
#: expert's k tiles, GEMM 2's the token's slots (each a share of its k tiles), so its blocks take top-k up to this.
#: With 16-row slabs this keeps the warps of the general path's decode grids (Qwen3-30B-A3B: 192 x 4 and 64 x 8).
ONE_TOKEN_WARPS = {True: 4, False: 8}
# (kernel name, threads, dynamic shared bytes) -> blocks of it that one SM holds at once (build.occupancy: the
# driver's calculator, from the compiled kernel's registers and shared memory). Plans are cached with it, so it must
# be hashable and give the same answers for the life of the process.
Occupancy = Callable[[str, int, int], int]
CONFIG_DIR_ENV = "SAMOYEDS_KERNEL_CONFIG_DIR"
ARCH_ENV = "SAMOYEDS_KERNEL_ARCH"


# ------------------------------------------------------------------------------------------------ inputs


@dataclass(frozen=True)
class LayerShape:
    """What the plan depends on, besides the pattern, dtype and GPU."""

    tokens: int
    top_k: int
    num_experts: int
    hidden: int  # H: GEMM 1's inputs, GEMM 2's outputs
    inter: int  # I: GEMM 1's outputs per half, GEMM 2's inputs

    @property
    def slots(self) -> int:
        return self.tokens * self.top_k

    def packed_rows(self, pattern: Pattern) -> tuple[int, int]:
        """Condensed rows per expert of w13 (gate and up) and w2."""
        rows_per_out = 2 if pattern.is_samoyeds else 1
        return 2 * self.inter // rows_per_out, self.hidden // rows_per_out


@dataclass(frozen=True)
class Device:
    name: str  # torch.cuda.get_device_name, as in tuned table file names
    capability: tuple[int, int]
    sms: int
    arch: str  # the NVRTC target: sm_90a on Hopper (for wgmma), sm_XY elsewhere

    @property
    def hopper(self) -> bool:
        return self.arch == "sm_90a"


def device_of(device: torch.device) -> Device:
    """The GPU of `device`. $SAMOYEDS_KERNEL_ARCH names another NVRTC target for the kernels (tests: sm_90 on a
    Hopper GPU runs the kernels that GPUs before Hopper run)."""
    found = _device(device)
    arch = os.environ.get(ARCH_ENV)
    return replace(found, arch=arch) if arch else found


@functools.cache
def _device(device: torch.device) -> Device:
    """Looked up once: the forward asks on every decode step."""
    major, minor = torch.cuda.get_device_capability(device)
    return Device(
        torch.cuda.get_device_name(device),
        (major, minor),
        torch.cuda.get_device_properties(device).multi_processor_count,
        f"sm_{major}{minor}" + ("a" if major == 9 else ""),
    )


@dataclass(frozen=True)
class GemmConfig:
    """One GEMM's choices: its block shape (kind, warps and slabs together, or none of them), split-K factor, and
    for FP8 values on Hopper's ws kernel whether the activations are quantized to FP8 too (FP8 x FP8 MMAs)."""

    kind: str | None = None
    warps: int | None = None
    slabs: int | None = None
    splits: int | None = None
    fp8_activations: bool | None = None

    @property
    def block(self) -> BlockShape | None:
        given = [v is not None for v in (self.kind, self.warps, self.slabs)]
        if any(given) and not all(given):
            raise SamoyedsError(f"kernel config {self}: give kind, warps and slabs together")
        return BlockShape(self.kind, self.warps, self.slabs) if all(given) else None


@dataclass(frozen=True)
class KernelConfig:
    """The choices of one forward that a tuned table entry or an experiment may fix; None keeps the heuristic's."""

    token_tile: int | None = None
    gate_up: GemmConfig = field(default_factory=GemmConfig)
    down: GemmConfig = field(default_factory=GemmConfig)
    # One token: the one-token kernels (csrc/one_token.cuh) where they run (one token, top-k up to 8), or with false
    # the general path; None: the one-token kernels unless the config fixes a choice of the general path (a token
    # tile, or any of a GEMM's)
    one_token: bool | None = None

    @classmethod
    def from_json(cls, data: dict, where: str = "kernel config") -> KernelConfig:
        try:
            return cls(
                data.get("token_tile"),
                GemmConfig(**data.get("gate_up", {})),
                GemmConfig(**data.get("down", {})),
                data.get("one_token"),
            )
        except (TypeError, AttributeError) as e:
            raise SamoyedsError(f"{where}: not a kernel config ({e}); see configs/kernels/README.md") from None

    @property
    def general_path(self) -> bool:
        """Whether the config fixes a choice only the general path has."""
        return self.token_tile is not None or self.gate_up != GemmConfig() or self.down != GemmConfig()

    def to_json(self) -> dict:
        def gemm(c: GemmConfig) -> dict:
            return {k: v for k, v in vars(c).items() if v is not None}

        out = {
            "token_tile": self.token_tile,
            "gate_up": gemm(self.gate_up),
            "down": gemm(self.down),
            "one_token": self.one_token,
        }
        return {k: v for k, v in out.items() if v not in (None, {})}


_override: contextvars.ContextVar[KernelConfig | None] = contextvars.ContextVar("samoyeds_kernel_config", default=None)


@contextlib.contextmanager
def override_config(config: KernelConfig) -> Iterator[None]:
    """Forwards in this block use `config` (over tuned tables and heuristics), e.g. to time one choice."""
    token = _override.set(config)
    try:
        yield
    finally:
        _override.reset(token)


# ------------------------------------------------------------------------------------------------ tuned tables


def table_name(shape: LayerShape, pattern: Pattern, dtype: torch.dtype, device: Device, fp8: bool = False) -> str:
    """The file name of the tuned table for a layer shape on a GPU, in vLLM's style (`E=..,N=..,device_name=..`)."""
    spec = ("2of4" if not pattern.is_samoyeds else f"samoyeds{pattern.segment}") + ("-fp8" if fp8 else "")
    return (
        f"E={shape.num_experts},H={shape.hidden},I={shape.inter},top_k={shape.top_k},pattern={spec},"
        f"dtype={str(dtype).removeprefix('torch.')},device_name={device.name.replace(' ', '_')}.json"
    )


@functools.cache
def _read_table(name: str) -> dict[int, KernelConfig] | None:
    """token count -> config, from $SAMOYEDS_KERNEL_CONFIG_DIR/name or the package's configs/kernels/name."""
    folders = [Path(os.environ[CONFIG_DIR_ENV])] if os.environ.get(CONFIG_DIR_ENV) else []
    for folder in [*folders, resources.files("samoyeds_vllm.configs") / "kernels"]:
        path = folder / name
        if path.is_file():
            try:
                data = json.loads(path.read_text())
                return {int(t): KernelConfig.from_json(c, f"{path}, tokens {t}") for t, c in data.items()}
            except (ValueError, AttributeError) as e:
                raise SamoyedsError(f"{path}: not a kernel config table ({e})") from None
    return None


def nearest_token_count(counts: Iterable[int], tokens: int) -> int | None:
    """The token count of a table whose entry a forward of `tokens` takes: the nearest (as vLLM picks its fused-MoE
    configs; a tie takes the one listed first), or None past the largest (a table tuned for decode says nothing
    about prefill) or without any."""
    counts = list(counts)
    if not counts or tokens > max(counts):
        return None
    return min(counts, key=lambda t: abs(t - tokens))


def tuned_config(
    shape: LayerShape, pattern: Pattern, dtype: torch.dtype, device: Device, fp8: bool = False
) -> KernelConfig | None:
    """The table entry of the nearest token count (nearest_token_count), or None."""
    table = _read_table(table_name(shape, pattern, dtype, device, fp8)) or {}
    nearest = nearest_token_count(table, shape.tokens)
    return None if nearest is None else table[nearest]


# ------------------------------------------------------------------------------------------------ heuristics


def token_tile_heuristic(
    slots: int, num_experts: int, samoyeds: bool, widest: int = WIDE_BN, hopper: bool = False
) -> int:
    """Tokens per tile, from the average slots per expert (a shape, so no host sync); small for decode.
    widest: WS_WIDE_BN where the Hopper kernel takes 128-token tiles (2:4: half the weight re-reads from L2).

    Hopper: the warp-specialised kernel's 64-token tiles win from 16 slots per expert on average, and the 32-token
    mma.sp tiles never won (H200, FP8 values, µs of the layer, `tune_kernels.py --search tiles`: Qwen3 samoyeds
    T = 256 / 512 100 / 116 with 64-token tiles against 114 / 184 with 16 / 32; Mixtral samoyeds T = 64 / 128
    198 / 232 against 216 / 342; DeepSeek-V3 samoyeds T = 512 1041 against 1624; Qwen3 2:4 T = 256 150 against 181;
    bf16 values: a tie at 16 slots, Qwen3 samoyeds T = 512 147 against 183). Below that, 8- or 16-token tiles with
    room for twice the average: routing is uneven, and an expert whose tokens spill into a second tile reads its
    weights twice (Mixtral samoyeds T = 32, 8 slots per expert: 161 with 16-token tiles against 203 with 8).

    Other GPUs (not re-measured since): 2:4 leaves room for twice the average (H100, Mixtral 2:4 at T = 64, 16
    slots per expert: 16-token tiles 765 µs, 32-token tiles 600), samoyeds the average (its weights are half the
    bytes, and there the wider tiles measured slower: 330 vs 352 µs)."""
    per_expert = slots / max(num_experts, 1)
    if hopper:
        if per_expert >= HOPPER_WIDE_FROM:
            return WIDE_BN if samoyeds or 2 * per_expert <= WIDE_BN else widest
        return NARROW_TILES[0] if 2 * per_expert <= NARROW_TILES[0] else NARROW_TILES[1]
    per_expert *= 1 if samoyeds else 2
    for bn in (*NARROW_TILES, WIDE_BN):
        if per_expert <= bn or bn == widest:
            return bn
    return widest


def token_tiles(samoyeds: bool, hopper: bool) -> tuple[int, ...]:
    """Every token-tile width a module compiles kernels for (of either value type)."""
    return (*NARROW_TILES, WIDE_BN) + ((WS_WIDE_BN,) if hopper and not samoyeds else ())


def block_shapes(token_tile: int, gate_up: bool, samoyeds: bool, hopper: bool, fp8: bool = False) -> list[BlockShape]:
    """The block shapes compiled for a token tile, preferred first. GEMM 2 stacks two slabs on wide batches so each
    B fragment feeds two MMAs, as in GEMM 1; decode prefers small 4-warp blocks, so more of them fill the GPU.
    The order is measured (H100, Qwen3 shape, T = 16384, µs of the whole layer; `benchmarks/tune_kernels.py
    --search blocks` times it again): ws 2049 against wgmma 2221-2331 (samoyeds), 3282 against 3425-3610 (2:4);
    among the wgmma shapes GEMM 1 4 warps 2836 against 8 warps 2896, GEMM 2 2 slabs 2896 against 1 slab 3569;
    mma.sp GEMM 2 2 slabs 3417 against 1 slab 4001, mma.sp GEMM 1 8 warps 3438 against 4 warps 3491 for samoyeds,
    5214 against 5000 for 2:4. FP8 values run the same shapes (their A fragments made in registers).
    Samoyeds decode tiles with FP8 values on Hopper, where it was measured, compile a second shape per GEMM, of 128
    rows, for the plan to size its grid's waves with (decode_block); six kernels more for that module to compile."""
    if token_tile < WIDE_BN:
        wave_sized = samoyeds and hopper and fp8
        if gate_up:
            return [BlockShape("mma", 4, 2)] + ([BlockShape("mma", 8, 2)] if wave_sized else [])
        return [BlockShape("mma", 4, 1)] + ([BlockShape("mma", 4, 2)] if wave_sized else [])
    if token_tile == WS_WIDE_BN:
        return [BlockShape("ws", 8, 2)]
    if hopper:  # the warp-specialised kernel where 128-row blocks divide the rows (not Qwen1.5's 704 gate rows)
        wgmma = [BlockShape("wgmma", 4, 2)] + ([] if gate_up else [BlockShape("wgmma", 4, 1)])
        return [BlockShape("ws", 8, 2), *wgmma]
    if gate_up:
        return [BlockShape("mma", 8, 2), BlockShape("mma", 4, 2)] if samoyeds else [BlockShape("mma", 4, 2)]
    return [BlockShape("mma", 4, 2), BlockShape("mma", 4, 1)]


def fitting_block_shapes(
    token_tile: int, gate_up: bool, samoyeds: bool, hopper: bool, rows: int, fp8: bool = False
) -> list[BlockShape]:
    """The compiled block shapes whose blocks divide the rows (gate/up: the rows of one half), preferred first."""
    shapes = block_shapes(token_tile, gate_up, samoyeds, hopper, fp8)
    return [shape for shape in shapes if rows % shape.rows(gate_up) == 0]


def splits_heuristic(row_blocks: int, slots: int, num_experts: int, token_tile: int, k_tiles: int, sms: int) -> int:
    """Split-K factor, from the shapes alone. A batch with fewer blocks than SMs (long-K GEMMs: twice as many)
    is split along K into about 1.5 blocks per wanted block, each split keeping at least four k tiles for its
    pipeline; larger batches are not split, since the fp32 partial sums and the extra reduction cost more than
    they save. Measured on an H100 over a (1, 2, 4) x (1, 3) grid (`benchmarks/tune_kernels.py --search splits`),
    µs of the layer at T = 1, a rule of about two waves of three blocks per SM -> this one: Qwen3 samoyeds 22.5 ->
    20.6, 2:4 32.8 -> 25.3; DeepSeek-V2-Lite 2:4 40.2 -> 36.1; Mixtral samoyeds 96.1 -> 92.3; at T = 4 Qwen3
    samoyeds 50.9 -> 47.1 (unsplit). From T = 1 to 16 on all five shapes the choice is within 6% of the grid's
    best (worst: Qwen1.5 samoyeds T = 2, 26.0 against 24.6)."""
    expected_experts = num_experts * (1 - (1 - 1 / num_experts) ** slots)  # experts with tokens, uniform routing
    blocks = row_blocks * (expected_experts + slots / token_tile)
    wanted = sms * (2 if k_tiles >= LONG_K_TILES else 1)
    if blocks >= wanted:
        return 1
    return max(1, min(math.ceil(1.5 * wanted / blocks), MAX_SPLITS, k_tiles // 4))


def expected_tiles(slots: int, num_experts: int, token_tile: int) -> float:
    """Token tiles with work under uniform routing: an expert's slots are ~Poisson(slots / E), in ceil(c / tile)
    tiles (a shape, so no host sync; skewed routing makes more)."""
    mean = slots / max(num_experts, 1)
    if mean > 100:  # only partial tiles are left to count, about half a tile per expert
        return slots / token_tile + num_experts / 2
    total, p = 0.0, math.exp(-mean)
    for c in range(1, int(mean + 10 * math.sqrt(mean) + 10)):
        p *= mean / c
        total += p * -(-c // token_tile)
    return num_experts * total


def fp8_activations_allowed(block: BlockShape, pattern: Pattern, fp8: bool, hopper: bool) -> bool:
    """Whether a GEMM can multiply FP8 copies of its activations (e4m3 wgmma.sp, Hopper): FP8 values, segments of
    whole 64-input k-steps, in the ws kernel or in the decode tiles' mma kernel (whole warpgroups; its GEMM 1 then
    waits for the routing index before reading x's copy: maps_itself)."""
    whole_steps = not pattern.is_samoyeds or pattern.segment % 64 == 0
    return fp8 and hopper and whole_steps and (block.kind == "ws" or (block.kind == "mma" and block.warps % 4 == 0))


def fp8_activations_default(block: BlockShape, pattern: Pattern, fp8: bool, hopper: bool, token_tile: int) -> bool:
    """Whether a plan multiplies FP8 copies of the activations unless its config says: in the ws kernel (docs/
    benchmarks.md, "FP8 x FP8 in the warp-specialised kernel") and in the mma kernel's 16-token tiles, where both
    GEMMs FP8 x FP8 made the layer 1.02-1.19x as fast at 13 of 16 cells of six shapes and both patterns (H200,
    `tune_kernels.py --search activations`, benchmarks/results/decode-fp8-activations-h200/: Qwen3-30B-A3B T = 128
    samoyeds 78.4 against 79.8 µs with bf16 activations, Mixtral T = 32 150.1 / 169.4, Qwen3-235B-A22B T = 128
    214.4 / 245.1, Qwen1.5-MoE T = 64 60.5 / 72.0); OLMoE samoyeds tied (0.985x) and DeepSeek-V2-Lite samoyeds lost
    (0.95-0.97x: its tuned table keeps GEMM 1 on bf16 activations). The 8-token tiles keep bf16 activations: with
    the quantize kernels a block a row (quantize_row_warps) both GEMMs FP8 x FP8 there ran 0.87-1.00x as fast on
    Qwen3-30B-A3B (T = 4-32, either pattern), 0.95-1.09x on Qwen3-235B-A22B and 0.99-1.13x on Mixtral (14336-input
    rows), so tuned tables ask for it where it won (docs/benchmarks.md, "Decode tables on an H200")."""
    mma16 = block.kind == "mma" and token_tile == 16
    return (block.kind == "ws" or mma16) and fp8_activations_allowed(block, pattern, fp8, hopper)


def quantize_row_warps(rows: int, k: int, sms: int) -> int:
    """Warps of quantize_rows per row (csrc/quantize.cuh): the whole block's for rows longer than one warp's round
    (32 x QUANTIZE_CHUNKS_IN_FLIGHT chunks of 8: 2048 inputs) while one block a row fits one wave (54-59 registers
    a thread: 4 blocks of ELEMENTWISE_THREADS threads an SM), so a decode step's few long rows get 8x the warps and
    one round each; else one warp a row (a shorter row is read once either way, and many rows fill the GPU alone).
    Under ncu at Mixtral T = 16 (H200), 32 rows of 14336 inputs (its intermediate) took 12.2 µs one warp a row and
    4.2 µs a block a row, 16 rows of 4096 5.7 and 3.7 µs (docs/benchmarks.md, "Decode tables on an H200")."""
    long_rows = k // 8 > 32 * QUANTIZE_CHUNKS_IN_FLIGHT
    return ELEMENTWISE_THREADS // 32 if long_rows and rows <= 4 * sms else 1


def quantize_kernel(dtype: torch.dtype, gate_up: bool, rows: int, k: int, sms: int) -> str:
    return template_name("quantize_rows", dtype, gate_up, quantize_row_warps(rows, k, sms))


def quantize_grid(rows: int, k: int, sms: int) -> tuple[int, int, int]:
    """quantize_rows: quantize_row_warps warps a row, at most 16 blocks per SM (a grid-stride loop over the rest)."""
    rows_per_block = ELEMENTWISE_THREADS // 32 // quantize_row_warps(rows, k, sms)
    return (max(1, min(-(-rows // rows_per_block), 16 * sms)), 1, 1)


def num_tiles(slots: int, num_experts: int, token_tile: int) -> int:
    """Upper bound on token tiles from the shapes alone: each expert with tokens wastes at most one partial tile."""
    return -(-slots // token_tile) + min(num_experts, slots)


def routing_threads(slots: int, num_experts: int) -> int:
    """Threads of the one-block routing kernel: one per expert at least (its scans), one per slot up to 1024;
    a decode step's few slots need few warps, and fewer warps make its barriers cheaper."""
    return min(MAX_EXPERTS, 32 * -(-max(num_experts, slots, 128) // 32))


def sum_vec(elements: int, sms: int) -> int:
    """Elements per thread of the slot sum: 16-byte vectors where the grid still fills the GPU (4 blocks per SM),
    scalars for decode, where more threads hide latency better. H100, Qwen3 shape: scalar at T = 16384 streamed at
    0.95 TB/s (633 µs, ncu); 8-wide at T = 1 was 7.1 against 5.3 µs. Pairs between, where scalars would take more
    than one pass of the largest wave: scalars took 7.6 µs of a Qwen3-30B-A3B layer at T = 256 on an H200 (2.6
    passes of the 6 blocks per SM their registers allow), ~1.1 TB/s from L2; pairs made that layer 1.8% (FP8 values)
    and 1.4% (bf16) faster, 3.8% / 2.4% at T = 512 (benchmarks/results/slot-sum-pairs-h200/)."""
    if elements // SUM_VEC >= 4 * ELEMENTWISE_THREADS * sms:
        return SUM_VEC
    return 2 if elements > ELEMENTWISE_BLOCKS_PER_SM * ELEMENTWISE_THREADS * sms else 1


def elementwise_grid(n: int, sms: int, blocks_per_sm: int) -> tuple[int, int, int]:
    """The grid of a grid-stride loop over n threads' work: at most one wave of blocks_per_sm blocks per SM."""
    return (max(1, min(-(-n // ELEMENTWISE_THREADS), blocks_per_sm * sms)), 1, 1)


# ------------------------------------------------------------------------------------------------ the plan


@dataclass(frozen=True)
class GemmPlan:
    gate_up: bool
    block: BlockShape
    row_blocks: int  # blocks of block.rows(gate_up) condensed rows (per half for gate/up)
    splits: int
    kernel: str  # template name (geometry.template_name)
    grid: tuple[int, int, int]
    threads: int
    shared_bytes: int
    fp8_activations: bool = False  # the GEMM reads FP8 copies of its activations ...
    quantize_kernel: str | None = None  # ... which this kernel makes before it
    quantize_grid: tuple[int, int, int] = (1, 1, 1)


@dataclass(frozen=True)
class MoEPlan:
    token_tile: int
    num_tiles: int
    chunks: int  # routing index blocks of ROUTE_CHUNK slots (0: one block does it all)
    routing_threads: int
    gate_up: GemmPlan
    down: GemmPlan
    sum_kernel: str | None  # the slot sum (None: GEMM 2 writes the output itself)
    sum_grid: tuple[int, int, int]
    silu_kernel: str | None  # finishes GEMM 1 under split-K
    silu_grid: tuple[int, int, int]
    few_token_map: bool = False  # GEMM 1 works its tile map out from topk_ids (csrc/few_tokens.cuh)
    one_token: bool = False  # the two one-token kernels alone (csrc/one_token.cuh): no routing index, no reductions


def plan_moe(
    shape: LayerShape,
    pattern: Pattern,
    dtype: torch.dtype,
    device: Device,
    fp8: bool = False,
    occupancy: Occupancy | None = None,
) -> MoEPlan:
    """The plan of a forward: `override_config`, else the tuned table, else the heuristics (cached per shape).
    dtype: the activations'; fp8: the values are FP8 (else of dtype); occupancy: the compiled kernels' blocks per
    SM, with which decode tiles choose their block shapes (decode_block; without it, the first compiled shape)."""
    return _plan(shape, pattern, dtype, device, _active_config(shape, pattern, dtype, device, fp8), fp8, occupancy)


def _active_config(shape: LayerShape, pattern: Pattern, dtype: torch.dtype, device: Device, fp8: bool) -> KernelConfig:
    return _override.get() or tuned_config(shape, pattern, dtype, device, fp8) or KernelConfig()


def one_token_planned(shape: LayerShape, pattern: Pattern, dtype: torch.dtype, device: Device, fp8: bool) -> bool:
    """Whether plan_moe takes the one-token kernels for this layer (as _plan decides, without planning)."""
    return _wants_one_token(_active_config(shape, pattern, dtype, device, fp8)) and one_token_refusal(shape) is None


def _wants_one_token(config: KernelConfig) -> bool:
    # one_token true means where the one-token kernels run: a table's entry also applies to nearby token counts
    return config.one_token if config.one_token is not None else not config.general_path


@functools.lru_cache(maxsize=4096)
def _plan(
    shape: LayerShape,
    pattern: Pattern,
    dtype: torch.dtype,
    device: Device,
    config: KernelConfig,
    fp8: bool = False,
    occupancy: Occupancy | None = None,
) -> MoEPlan:
    samoyeds, hopper = pattern.is_samoyeds, device.hopper
    rows13, rows2 = shape.packed_rows(pattern)
    slots = shape.slots
    if _wants_one_token(config) and one_token_refusal(shape) is None:
        return _one_token_plan(shape, pattern, dtype, fp8)
    if config.token_tile is not None:
        if config.token_tile not in token_tiles(samoyeds, hopper):
            raise SamoyedsError(
                f"kernel config: token tile {config.token_tile} is not compiled for {pattern} on {device.arch} "
                f"(tiles: {token_tiles(samoyeds, hopper)})"
            )
        token_tile = config.token_tile
    else:
        ws_wide = (
            hopper
            and not samoyeds  # the 128-token tiles' ws blocks divide the rows of both GEMMs
            and bool(fitting_block_shapes(WS_WIDE_BN, True, samoyeds, hopper, rows13 // 2))
            and bool(fitting_block_shapes(WS_WIDE_BN, False, samoyeds, hopper, rows2))
        )
        widest = WS_WIDE_BN if ws_wide else WIDE_BN
        token_tile = token_tile_heuristic(slots, shape.num_experts, samoyeds, widest, hopper)
    tiles = num_tiles(slots, shape.num_experts, token_tile)

    def gemm(gate_up: bool, gemm_config: GemmConfig) -> GemmPlan:
        rows, k = (rows13 // 2, shape.hidden) if gate_up else (rows2, shape.inter)
        fitting = fitting_block_shapes(token_tile, gate_up, samoyeds, hopper, rows, fp8)
        what = "gate/up" if gate_up else "down"
        block = gemm_config.block
        if block is None:
            if not fitting:
                raise SamoyedsError(
                    f"{rows} rows are not whole {MIN_ROW_BLOCK}-row blocks (supports() admits only those)"
                )
            # the rule compares the partial waves of a decode tile's shapes, where it was measured; wide tiles keep
            # their measured order (on Hopper the persistent ws kernel, one wave by construction, then fallbacks
            # for rows off its blocks)
            if occupancy is None or len(fitting) == 1 or token_tile >= WIDE_BN:
                return sized(gate_up, gemm_config, fitting[0], rows, k)
            return decode_block([sized(gate_up, gemm_config, b, rows, k) for b in fitting])
        if block not in fitting:
            raise SamoyedsError(
                f"kernel config: {what} block {block} is not compiled for token tile {token_tile} or does not divide "
                f"its {rows} rows (compiled and fitting: {fitting})"
            )
        return sized(gate_up, gemm_config, block, rows, k)

    def decode_block(candidates: list[GemmPlan]) -> GemmPlan:
        """A decode GEMM whose preferred (first) block shape makes more than TAIL_FROM_WAVES waves of blocks takes
        the other shape if that wastes clearly less on a partial last wave (ceil(waves) / waves below TAIL_GAIN of
        the preferred shape's). The decode GEMMs stream weights, and the few blocks of a last wave leave most of the
        memory system idle (H100, Qwen3 samoyeds FP8 T = 64: 780 gate/up blocks of 4 warps, 5 per SM, 1.18 waves,
        ran at 2.0 TB/s with the SMs active 65% of the time under ncu; 8-warp blocks, 3 per SM, one wave of 390).
        The waves count the tiles uniform routing is expected to keep busy, so a grid just past one wave keeps the
        preferred shape (Qwen3 T = 32: 1.006 waves expected, 0.98 in the run, where 8-warp blocks took 82.1 µs
        against 78.9), and so does a grid within one wave (there the other shape, often with a larger split-K
        factor, was slower: Qwen3 T = 4 35.7 against 33.7). H100, FP8 values, µs of the layer, preferred shapes
        against the rule's: Qwen3 samoyeds T = 16 / 48 / 64 63.2 / 98.7 / 102.3 against 61.5 / 85.3 / 88.8,
        Mixtral T = 8 155.6 against 146.3, Qwen3-235B T = 16 / 64 194.5 / 292.9 against 191.5 / 279.1
        (benchmarks/results/decode-blocks-h100/)."""
        busy_tiles = expected_tiles(slots, shape.num_experts, token_tile)

        def waves(g: GemmPlan) -> float:
            per_sm = max(occupancy(g.kernel, g.threads, g.shared_bytes), 1)
            return g.row_blocks * busy_tiles * g.splits / (per_sm * device.sms)

        def tail_cost(g: GemmPlan) -> float:  # time against the same blocks spread over whole waves
            return math.ceil(waves(g)) / waves(g)

        preferred, others = candidates[0], [g for g in candidates[1:] if occupancy(g.kernel, g.threads, g.shared_bytes)]
        if not others or busy_tiles == 0 or waves(preferred) <= TAIL_FROM_WAVES:
            return preferred
        best = min(others, key=tail_cost)
        return best if tail_cost(best) < TAIL_GAIN * tail_cost(preferred) else preferred

    def sized(gate_up: bool, gemm_config: GemmConfig, block: BlockShape, rows: int, k: int) -> GemmPlan:
        what = "gate/up" if gate_up else "down"
        row_blocks = rows // block.rows(gate_up)
        k_tiles = k // BK
        splits = gemm_config.splits
        if splits is None:
            splits = splits_heuristic(row_blocks, slots, shape.num_experts, token_tile, k_tiles, device.sms)
        elif not 1 <= splits <= min(MAX_SPLITS, k_tiles):
            raise SamoyedsError(f"kernel config: {what} splits {splits} not in 1..{min(MAX_SPLITS, k_tiles)}")
        if block.kind == "ws":  # persistent: one wave of blocks walks all (token tile, row block) items
            grid = (min(row_blocks * tiles, device.sms), 1, splits)
        else:
            grid = (row_blocks, tiles, splits)
        fp8_acts = gemm_config.fp8_activations
        if fp8_acts is None:
            fp8_acts = fp8_activations_default(block, pattern, fp8, hopper, token_tile)
        elif fp8_acts and not fp8_activations_allowed(block, pattern, fp8, hopper):
            raise SamoyedsError(
                f"kernel config: {what} FP8 activations need FP8 values on Hopper in a ws block or an mma block of "
                f"whole warpgroups, and segments of whole 64-input k-steps (here: {'FP8' if fp8 else 'non-FP8'} "
                f"values on {device.arch}, a {block.kind} block of {block.warps} warps, {pattern})"
            )
        # the rows of x or act the GEMM reads (and quantize_rows copies), of b_k inputs
        b_rows, b_k = (shape.tokens, shape.hidden) if gate_up else (slots, shape.inter)
        return GemmPlan(
            gate_up,
            block,
            row_blocks,
            splits,
            block.kernel_name(dtype, pattern, token_tile, gate_up, fp8, fp8_acts),
            grid,
            block.threads,
            block.shared_bytes(token_tile, fp8, fp8_acts),
            fp8_acts,
            quantize_kernel(dtype, gate_up, b_rows, b_k, device.sms) if fp8_acts else None,
            quantize_grid(b_rows, b_k, device.sms),
        )

    gate_up, down = gemm(True, config.gate_up), gemm(False, config.down)
    vec = sum_vec(shape.tokens * shape.hidden, device.sms)
    sum_kernel = template_name("sum_slots", dtype, torch.float32 if down.splits > 1 else dtype, vec)
    silu_kernel = template_name("silu_mul_splits", dtype)

    def resident(kernel: str) -> int:
        """Blocks of an elementwise kernel per SM: its grid-stride loop's grid is one wave of them, since a grid past
        one wave runs its last blocks alone (the decode slot sum's 36 registers fit 6 blocks of 256 threads, not 8;
        not timed apart from the slot sum's loads in flight, docs/benchmarks.md)."""
        per_sm = occupancy(kernel, ELEMENTWISE_THREADS, 0) if occupancy is not None else 0
        return min(per_sm, ELEMENTWISE_BLOCKS_PER_SM) or ELEMENTWISE_BLOCKS_PER_SM

    return MoEPlan(
        token_tile=token_tile,
        num_tiles=tiles,
        chunks=-(-slots // ROUTE_CHUNK) if slots >= ROUTE_CHUNKED_FROM else 0,
        routing_threads=routing_threads(slots, shape.num_experts),
        gate_up=gate_up,
        down=down,
        sum_kernel=sum_kernel,
        sum_grid=elementwise_grid(shape.tokens * shape.hidden // vec, device.sms, resident(sum_kernel)),
        silu_kernel=silu_kernel if gate_up.splits > 1 else None,
        silu_grid=elementwise_grid(slots * shape.inter, device.sms, resident(silu_kernel)),
        few_token_map=maps_itself(shape, token_tile, gate_up),
    )


def one_token_refusal(shape: LayerShape) -> str | None:
    """Why the one-token kernels cannot run this forward (None: they can)."""
    if shape.tokens != 1:
        return f"{shape.tokens} tokens (the one-token kernels run one)"
    warps = ONE_TOKEN_WARPS[False]
    if shape.top_k > warps:
        return f"top-{shape.top_k} routing (a down-projection block's {warps} warps take a slot each)"
    return None


def one_token_block(gate_up: bool) -> BlockShape:
    """A one-token kernel's block: its warps, and its m16 tiles per warp (gate and up, or the output rows)."""
    return BlockShape("one_token", ONE_TOKEN_WARPS[gate_up], 2 if gate_up else 1)


def _one_token_plan(shape: LayerShape, pattern: Pattern, dtype: torch.dtype, fp8: bool) -> MoEPlan:
    """One token (csrc/one_token.cuh): GEMM 1's blocks are (slab of 16 condensed rows, slot), GEMM 2's slabs of 16
    condensed rows; two launches, since the blocks do both reductions themselves: no routing index, split-K
    partials, SiLU kernel or slot sum, each a launch and a round trip through L2 on the general path (Qwen3-30B-A3B
    at T = 1 on an H200: 15.1 -> 10.7 µs, docs/benchmarks.md)."""
    rows13, rows2 = shape.packed_rows(pattern)

    def gemm(gate_up: bool, rows: int) -> GemmPlan:
        block = one_token_block(gate_up)
        row_blocks = rows // block.rows(gate_up)
        return GemmPlan(
            gate_up,
            block,
            row_blocks,
            1,
            block.kernel_name(dtype, pattern, 1, gate_up, fp8),
            (row_blocks, shape.top_k if gate_up else 1, 1),
            block.threads,
            block.shared_bytes(1, fp8),
        )

    return MoEPlan(
        token_tile=1,  # a slot is its own tile
        num_tiles=shape.top_k,
        chunks=0,
        routing_threads=0,
        gate_up=gemm(True, rows13 // 2),
        down=gemm(False, rows2),
        sum_kernel=None,
        sum_grid=(1, 1, 1),
        silu_kernel=None,
        silu_grid=(1, 1, 1),
        one_token=True,
    )


def maps_itself(shape: LayerShape, token_tile: int, gate_up: GemmPlan) -> bool:
    """Whether GEMM 1 works its tile map out from topk_ids instead of waiting for the routing index
    (csrc/few_tokens.cuh): a few tokens in the narrowest tile of the mma kernel (the one kernel that does), with no
    FP8 copy of x made between the index and it (GEMM 1 reads x before its wait)."""
    return (
        shape.tokens <= FEW_TOKENS
        and shape.slots <= FEW_TOKEN_SLOTS
        and token_tile == FEW_TOKENS
        and gate_up.block.kind == "mma"
        and not gate_up.fp8_activations
    )


def compiled_kernels(dtype: torch.dtype, pattern: Pattern, arch: str, fp8: bool = False) -> list[str]:
    """Every kernel of one compiled module (dtype, pattern, GPU architecture, FP8 values or not): the GEMMs of every
    token tile and block shape a plan can choose (with FP8 activations where they can run), the routing index, the
    reductions and the activations' FP8 quantization."""
    samoyeds, hopper = pattern.is_samoyeds, arch == "sm_90a"
    names = [
        block.kernel_name(dtype, pattern, bn, gate_up, fp8, fp8_acts)
        for bn in token_tiles(samoyeds, hopper)
        for gate_up in (True, False)
        for block in block_shapes(bn, gate_up, samoyeds, hopper, fp8)
        for fp8_acts in {False, fp8_activations_allowed(block, pattern, fp8, hopper)}
    ]
    if fp8 and hopper:
        row_warps = {1, ELEMENTWISE_THREADS // 32}
        names += [template_name("quantize_rows", dtype, gate_up, w) for gate_up in (True, False) for w in row_warps]
    names += [one_token_block(gate_up).kernel_name(dtype, pattern, 1, gate_up, fp8) for gate_up in (True, False)]
    names += [template_name(k) for k in ("build_routing_index", "count_slots", "scatter_slots")]
    names.append(template_name("silu_mul_splits", dtype))
    names += [template_name("sum_slots", dtype, src, vec) for src in (dtype, torch.float32) for vec in (1, 2, SUM_VEC)]
    return names


__all__ = [
    "Device",
    "GemmConfig",
    "GemmPlan",
    "KernelConfig",
    "LayerShape",
    "MoEPlan",
    "compiled_kernels",
    "device_of",
    "override_config",
    "plan_moe",
]
