// Pieces shared by the RoPE kernels (rope.cu's rope_apply and rope_kv.cu's rope_kv_append), so the two
// compute the same rotation term for term.
#pragma once

#include "../common/layout.cuh"

namespace pygpukit {
namespace ops {

// N consecutive table entries (N-aligned) widened to float, in loads of at most 16 bytes.
template <typename C, int N>
__device__ __forceinline__ void rope_table(const C* __restrict__ p, float (&out)[N]) {
  constexpr int kChunk = (N * static_cast<int>(sizeof(C)) > 16) ? 16 / static_cast<int>(sizeof(C)) : N;
#pragma unroll
  for (int c = 0; c < N; c += kChunk) {
    const Pack<C, kChunk> pack = *reinterpret_cast<const Pack<C, kChunk>*>(p + c);
#pragma unroll
    for (int j = 0; j < kChunk; ++j) out[c + j] = convert<float>(pack.v[j]);
  }
}

// Rotate W pairs held in two packs, in float: a holds the first W values and z the next W of the
// pairs' span (NeoX: a from the first half, z from the second; GPT-J: two neighbouring packs, pair j
// at 2j and 2j + 1). Pair (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), rounded once to T.
template <typename T, int kGptj, int W>
__device__ __forceinline__ void rope_rotate(Pack<T, W>& a, Pack<T, W>& z, const float (&c)[W],
                                            const float (&sn)[W]) {
  float x[2 * W];
#pragma unroll
  for (int j = 0; j < W; ++j) {
    x[j] = convert<float>(a.v[j]);
    x[W + j] = convert<float>(z.v[j]);
  }
  float y[2 * W];
#pragma unroll
  for (int j = 0; j < W; ++j) {
    const int i1 = kGptj ? 2 * j : j;
    const int i2 = kGptj ? 2 * j + 1 : W + j;
    y[i1] = x[i1] * c[j] - x[i2] * sn[j];
    y[i2] = x[i2] * c[j] + x[i1] * sn[j];
  }
#pragma unroll
  for (int j = 0; j < W; ++j) {
    a.v[j] = convert<T>(y[j]);
    z.v[j] = convert<T>(y[W + j]);
  }
}

}  // namespace ops
}  // namespace pygpukit
