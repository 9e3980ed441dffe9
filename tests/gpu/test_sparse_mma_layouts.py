"""The operand layouts of FP8 x FP8 `wgmma.mma_async.sp` (e4m3, m64nNk64) that csrc/gemm_ws.cuh relies on, checked
on the GPU with one warpgroup against the fp32 product. The PTX ISA draws these layouts only for the warp-level
`mma.sp`; this test is what says they hold for the warpgroup form (docs/design.md, "FP8 activations").

One wgmma per 64-input k-step, two k-steps, 64 weight rows x 64 tokens: A (the compressed 2:4 weights) from
registers, B (tokens x inputs, K-major) from 128-byte-swizzled shared memory exactly as the kernel's FP8 B tile
(BTile8 in csrc/tiles.cuh), the metadata from registers. Every candidate layout is tried, so a failure names the
one the hardware uses.
"""

import itertools

import numpy as np
import pytest
import torch

PROBE = r"""
extern "C" __global__ void __launch_bounds__(128) probe(const unsigned* __restrict__ a_regs,
    const unsigned* __restrict__ meta, const uint4* __restrict__ b, float* __restrict__ d_out) {
  __shared__ __align__(1024) uint4 tile[64 * 8];
  const int tid = threadIdx.x;
  for (int i = tid; i < 64 * 8; i += 128) {  // token n, 16-byte chunk c: the kernel's 128-byte swizzle
    const int n = i / 8, c = i % 8;
    tile[n * 8 + (c ^ (n & 7))] = b[i];
  }
  __syncthreads();
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  float d[32];
  for (int i = 0; i < 32; ++i) d[i] = 0.0f;
  for (int j = 0; j < 2; ++j) {
    const unsigned addr = (unsigned)__cvta_generic_to_shared(&tile[4 * j]);
    const unsigned long long desc = (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) |
                                    ((1024ull >> 4) << 32) | (1ull << 62);
    const unsigned* a = a_regs + (tid * 2 + j) * 4;
    const unsigned a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3], e = meta[tid * 2 + j];
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sp.sync.aligned.m64n64k64.f32.e4m3.e4m3 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,"
      "%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, %37, 0, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(e));
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  }
  for (int i = 0; i < 32; ++i) d_out[tid * 32 + i] = d[i];
}
"""


def _pack(byte_rows: np.ndarray) -> np.ndarray:
    """[..., 4] uint8 -> [...] uint32, the first byte lowest."""
    return byte_rows.astype(np.uint32) @ (np.uint32(1) << np.arange(0, 32, 8, dtype=np.uint32))


def _problem(seed: int):
    """A 2:4 weight tile [64, 128] and tokens [64, 128] of e4m3 values, with the compressed tile and the positions."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(64, 128, generator=gen).to(torch.float8_e4m3fn)
    x = torch.randn(64, 128, generator=gen).to(torch.float8_e4m3fn)
    scores = torch.rand(64, 32, 4, generator=gen)
    pos = scores.topk(2, dim=-1).indices.sort(dim=-1).values  # [64 rows, 32 groups, 2] kept positions p0 < p1
    dense_bytes = w.view(torch.uint8).reshape(64, 32, 4)
    compressed = dense_bytes.gather(2, pos).reshape(64, 64).numpy()  # [rows, 64 compressed bytes]
    mask = torch.zeros(64, 32, 4, dtype=torch.bool).scatter_(2, pos, True).reshape(64, 128)
    w_dense = torch.where(mask, w.float(), torch.zeros(()))
    nibbles = (pos[..., 0] | (pos[..., 1] << 2)).numpy().astype(np.uint32)  # [rows, groups]
    return w_dense, x, compressed, nibbles


# A fragment candidates: (row offset, compressed column offset) of registers a0..a3 of thread (g, t) in a k-step of 32
# compressed bytes; each register holds 4 consecutive compressed bytes starting at column offset + 4 t.
FRAGMENTS = {
    "g|g+8, then +16": [(0, 0), (8, 0), (0, 16), (8, 16)],  # mma.sp m16n8k64's (as m16n8k32 int8, dense)
    "cols 0|16, then g+8": [(0, 0), (0, 16), (8, 0), (8, 16)],
}


# Metadata candidates: for lane t, the (row offset, first group) of its low and high 16 bits (4 groups each), groups
# counted within the 16 groups of 4 inputs of a k-step.
def _meta_quarters(t: int) -> dict[str, list[tuple[int, int]]]:
    hi, lo = t >> 1, t & 1
    return {
        "lane t: groups 4t..4t+3, row g low, g+8 high": [(0, 4 * t), (8, 4 * t)],
        "lane t: permuted quarters (0, 2, 1, 3)": [(0, 4 * [0, 2, 1, 3][t]), (8, 4 * [0, 2, 1, 3][t])],
        "lanes 0,1 row g, lanes 2,3 row g+8, 8 groups each": [(8 * hi, 8 * lo), (8 * hi, 8 * lo + 4)],
        "lanes 0,2 row g, lanes 1,3 row g+8, 8 groups each": [(8 * lo, 8 * hi), (8 * lo, 8 * hi + 4)],
    }


META_NAMES = list(_meta_quarters(0))
# What the hardware uses (H100, 2026-11-25): the A fragment of mma.sp m16n8k64, and metadata words that each hold
# 8 consecutive groups of one row (lane t: row g + 8 (t & 1), groups 8 (t >> 1) ..), unlike bf16's 4 groups of
# two rows; all four lanes of a quad carry metadata (no selector).
KERNEL_LAYOUT = ("g|g+8, then +16", "lanes 0,2 row g, lanes 1,3 row g+8, 8 groups each")


def _registers(compressed, nibbles, fragment, meta_name):
    a = np.zeros((128, 2, 4), np.uint32)
    e = np.zeros((128, 2), np.uint32)
    for tid in range(128):
        w, lane = divmod(tid, 32)
        g, t = divmod(lane, 4)
        for j in range(2):
            for r, (row_off, col_off) in enumerate(FRAGMENTS[fragment]):
                col = 32 * j + col_off + 4 * t
                a[tid, j, r] = _pack(compressed[16 * w + g + row_off, col : col + 4])
            word = 0
            for half, (row_off, group0) in enumerate(_meta_quarters(t)[meta_name]):
                for q in range(4):
                    word |= int(nibbles[16 * w + g + row_off, 16 * j + group0 + q]) << (16 * half + 4 * q)
            e[tid, j] = word
    return a, e


def _accumulators(d: np.ndarray) -> np.ndarray:
    """[128 threads, 32] -> [64 rows, 64 tokens]: d[4 j + i] of thread (w, g, t) is row 16 w + g + 8 (i / 2),
    token 8 j + 2 t + i % 2, as for bf16 wgmma."""
    out = np.zeros((64, 64), np.float32)
    for tid in range(128):
        w, lane = divmod(tid, 32)
        g, t = divmod(lane, 4)
        for j in range(8):
            for i in range(4):
                out[16 * w + g + 8 * (i // 2), 8 * j + 2 * t + i % 2] = d[tid, 4 * j + i]
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fp8_wgmma_sp_layouts(seed):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs a Hopper GPU (sm_90a)")
    import cupy

    kernel = cupy.RawKernel(PROBE, "probe", options=("--gpu-architecture=sm_90a", "-std=c++17"))
    w_dense, x, compressed, nibbles = _problem(seed)
    expected = (w_dense @ x.float().T).numpy()
    b = cupy.asarray(x.view(torch.uint8).numpy().reshape(-1).view(np.uint32))
    errors = {}
    for fragment, meta_name in itertools.product(FRAGMENTS, META_NAMES):
        a, e = _registers(compressed, nibbles, fragment, meta_name)
        d = cupy.zeros((128, 32), cupy.float32)
        kernel((1,), (128,), (cupy.asarray(a), cupy.asarray(e), b, d))
        got = _accumulators(cupy.asnumpy(d))
        errors[fragment, meta_name] = float(np.abs(got - expected).max() / np.abs(expected).max())
    report = "\n".join(f"{err:.2e}  A: {f}; meta: {m}" for (f, m), err in sorted(errors.items(), key=lambda kv: kv[1]))
    # The products of e4m3 values are exact, but Hopper's FP8 tensor cores add them with fewer bits than fp32 (about
    # 2^-12 of the largest output here, 2.6e-4 on an H100; the others are off by ~1).
    assert errors[KERNEL_LAYOUT] < 1e-3, f"the kernel's layout mismatches; all candidates:\n{report}"
