"""The numbers the CUDA kernels and this host code share, read from csrc/config.cuh (their only definition), and
the mapping of a Pattern and a dtype onto the kernels' template arguments."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import torch

from ..format import Pattern

_CONSTANT = re.compile(r"^constexpr int (\w+) = (\d+);", re.M)


def _read_constants() -> dict[str, int]:
    text = (resources.files("samoyeds_vllm.csrc") / "config.cuh").read_text()
    return {name: int(value) for name, value in _CONSTANT.findall(text)}


CONSTANTS = _read_constants()
BK = CONSTANTS["BK"]  # dense inputs per pipeline stage
STAGES = CONSTANTS["STAGES"]  # pipeline depth of moe_gemm
SLAB_ROWS = CONSTANTS["SLAB_ROWS"]  # condensed weight rows per warp in a slab
TILE_ROWS = CONSTANTS["TILE_ROWS"]  # rows of a tile of the stored values and metadata (kernels/weights.py)
#: ws pipeline depth by (token tile, FP8 values)
WS_STAGES = {
    (64, False): CONSTANTS["WS_STAGES_BN64"],
    (128, False): CONSTANTS["WS_STAGES_BN128"],
    (64, True): CONSTANTS["WS_STAGES_BN64_FP8"],
    (128, True): CONSTANTS["WS_STAGES_BN128_FP8"],
}
WS_THREADS = 128 * (CONSTANTS["WS_CONSUMERS"] + 1)  # one copying warpgroup and the MMA warpgroups
MAX_EXPERTS = CONSTANTS["MAX_EXPERTS"]
ROUTE_THREADS = CONSTANTS["ROUTE_THREADS"]
ROUTE_CHUNK = CONSTANTS["ROUTE_CHUNK"]
SUM_VEC = CONSTANTS["SUM_VEC"]
MAX_SPLITS = CONSTANTS["MAX_SPLITS"]  # split-K factor cap
ELEMENTWISE_THREADS = CONSTANTS["ELEMENTWISE_THREADS"]
# 16-byte chunks of a row each thread of quantize_rows loads together
QUANTIZE_CHUNKS_IN_FLIGHT = CONSTANTS["QUANTIZE_CHUNKS_IN_FLIGHT"]
FEW_TOKENS = CONSTANTS["FEW_TOKENS"]  # batches whose GEMM 1 may map itself (csrc/few_tokens.cuh) ...
FEW_TOKEN_SLOTS = CONSTANTS["FEW_TOKEN_SLOTS"]  # ... with at most these slots
ONE_TOKEN_STAGES = CONSTANTS["ONE_TOKEN_STAGES"]  # depth of each warp's ring in the layer of one token
MAX_ROUTED_LOGITS = CONSTANTS["MAX_ROUTED_LOGITS"]  # experts whose top-k the one-token kernels take from logits

#: The activation (and packed value) dtypes the kernels are compiled for, with their CUDA type names.
CTYPES = {torch.bfloat16: "__nv_bfloat16", torch.float16: "__half"}
SUPPORTED_DTYPES = tuple(CTYPES)


def pattern_template_args(pattern: Pattern) -> tuple[bool, int]:
    """(SAMOYEDS, V) of the GEMM templates: 2:4 runs as one segment per stage (V = BK), never folded."""
    return pattern.is_samoyeds, pattern.segment if pattern.is_samoyeds else BK


def stage_bytes(token_tile: int, a_rows: int, value_bytes: int = 2, act_bytes: int = 2) -> int:
    """sizeof(Stage<BN, A_ROWS, VALUE_BYTES, ACT8>) of csrc/tiles.cuh: the B tile (BN x 128 inputs of act_bytes:
    2, or 1 for FP8 activations), the A tile (A_ROWS x 64 values of value_bytes: 2, or 1 for FP8) and the metadata
    tile (A_ROWS x 8 halfwords)."""
    return token_tile * BK * act_bytes + a_rows * (BK // 2) * value_bytes + a_rows * (BK // 16) * 2


def one_token_stage_bytes(slabs: int, value_bytes: int = 2) -> int:
    """sizeof(OneTokenStage<MT, VALUE_BYTES>) of csrc/one_token.cuh: `slabs` m16 tiles of weight rows (64 values of
    value_bytes each), their metadata, the token's BK inputs (2 bytes each) and room for BK / 32 segments' row
    selections."""
    rows = slabs * SLAB_ROWS
    return rows * (BK // 2) * value_bytes + rows * (BK // 16) * 2 + BK * 2 + (BK // 32) * rows


def template_name(kernel: str, *args) -> str:
    """The C++ name of a kernel of csrc/ (an NVRTC name expression): `samoyeds::kernel<args>`. bools become
    true / false, dtypes their CUDA type names (torch.float32: float), ints themselves. Every kernel name is made
    here."""
    if not args:
        return f"samoyeds::{kernel}"
    return f"samoyeds::{kernel}<{', '.join(map(_template_arg, args))}>"


def _template_arg(arg) -> str:
    if isinstance(arg, bool):
        return "true" if arg else "false"
    if isinstance(arg, torch.dtype):
        return {**CTYPES, torch.float32: "float"}[arg]
    if isinstance(arg, int):
        return str(arg)
    raise TypeError(f"no template argument for {arg!r}")


@dataclass(frozen=True)
class BlockShape:
    """The block of one GEMM kernel: `warps` MMA warps, each owning `slabs` m16 tiles of condensed rows (GEMM 1
    always has two, the same rows of gate and of up), run as `kind`: "mma" (mma.sp, moe_gemm), "wgmma" (one
    warpgroup's wgmma.sp, moe_gemm on sm_90a), "ws" (gemm_ws.cuh: a copying warpgroup and two MMA warpgroups) or
    "one_token" (one_token.cuh: every warp on the same slab, each with its own share of the k tiles)."""

    kind: str
    warps: int
    slabs: int

    def rows(self, gate_up: bool) -> int:
        """Condensed rows per block: of one half for gate/up (gate and up are read together), else all slabs."""
        if self.kind == "one_token":
            return SLAB_ROWS
        return SLAB_ROWS * self.warps * (1 if gate_up else self.slabs)

    @property
    def a_rows(self) -> int:
        """Rows of the block's A tile (gate and up rows together for gate/up)."""
        return SLAB_ROWS * self.warps * self.slabs

    @property
    def threads(self) -> int:
        return WS_THREADS if self.kind == "ws" else 32 * self.warps

    def stages(self, token_tile: int, fp8: bool = False) -> int:
        if self.kind == "one_token":
            return ONE_TOKEN_STAGES
        return WS_STAGES[token_tile, fp8] if self.kind == "ws" else STAGES

    def shared_bytes(self, token_tile: int, fp8: bool = False, fp8_activations: bool = False) -> int:
        """Dynamic shared memory: the pipeline's stages, plus 1 KB to align them (aligned_stages in tiles.cuh); one
        token: each warp's ring."""
        if self.kind == "one_token":
            return self.warps * ONE_TOKEN_STAGES * one_token_stage_bytes(self.slabs, 1 if fp8 else 2)
        stage = stage_bytes(token_tile, self.a_rows, 1 if fp8 else 2, 1 if fp8_activations else 2)
        return self.stages(token_tile, fp8) * stage + 1024

    def kernel_name(
        self,
        dtype: torch.dtype,
        pattern: Pattern,
        token_tile: int,
        gate_up: bool,
        fp8: bool = False,
        fp8_activations: bool = False,
    ) -> str:
        """dtype: the activations'; fp8: the values are FP8; fp8_activations: the kernel multiplies FP8 copies of
        the activations (FP8 x FP8: the ws kernel, or the mma kernel's decode tiles)."""
        samoyeds, segment = pattern_template_args(pattern)
        if self.kind == "one_token":
            return template_name("moe_one_token", dtype, fp8, samoyeds, segment, gate_up, self.warps)
        if self.kind == "ws":
            return template_name("moe_gemm_ws", dtype, fp8, samoyeds, segment, token_tile, gate_up, fp8_activations)
        return template_name(
            "moe_gemm",
            dtype,
            fp8,
            samoyeds,
            segment,
            token_tile,
            gate_up,
            self.warps,
            self.slabs,
            self.kind == "wgmma",
            fp8_activations,
        )
