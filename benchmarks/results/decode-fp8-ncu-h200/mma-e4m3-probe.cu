// One warp-level e4m3 mma.sp (m16n8k64): what ptxas makes of it on sm_90a (Hopper) and on sm_89 (Ada).
extern "C" __global__ void probe(const unsigned* a, const unsigned* b, const unsigned* e, float* d_out) {
  const int lane = threadIdx.x;
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  asm volatile(
      "mma.sp::ordered_metadata.sync.aligned.m16n8k64.row.col.f32.e4m3.e4m3.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9,%10,%11}, {%0,%1,%2,%3}, %12, 0x0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[4 * lane]), "r"(a[4 * lane + 1]), "r"(a[4 * lane + 2]), "r"(a[4 * lane + 3]), "r"(b[4 * lane]),
        "r"(b[4 * lane + 1]), "r"(b[4 * lane + 2]), "r"(b[4 * lane + 3]), "r"(e[lane]));
  for (int i = 0; i < 4; ++i) d_out[4 * lane + i] = d[i];
}
