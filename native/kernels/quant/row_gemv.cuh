// The decode GEMV skeleton shared by the weight formats whose rows are plain arrays of packed values
// (wo_gemv.cu: FP8/INT8 with per-channel scales; fp8_block_gemv.cu: FP8 with 2-D block scales;
// nvf4_gemv.cu: e2m1 with e4m3 scales per 16):
//
//   row_gemv<D, T, M, Unroll>(d, x, y, bias, rows, n, k, ldx, ldy, vector)
//       y[m, r] = d.out_scale(r) * sum_c x[m, c] * W[r, c] (+ bias[r]) for m < rows <= M and r < n, in
//       T (float, __half, __nv_bfloat16) with float32 accumulation.
//
// One warp per row of W, eight rows per block of 256 threads (blockDim.x = kThreads). With `vector`
// (W, x and their row strides 16-byte aligned, k a multiple of D::kChunk, and whatever else the format
// needs) lane l takes chunks l, l + 32, ...: one 16-byte load of D::kChunk packed values (16 one-byte
// values or 32 nibbles), decoded to float by d.chunk, `Unroll` chunks' loads in flight; the matching x
// is read with 16-byte loads, and each 16-value partial dot product is multiplied by its scale
// d.scale16(r, c, h) (h-th 16 values of chunk c) before it is added; otherwise (and for the tail past
// the last whole chunk) element by element, value d.element(r, e) (its scale included). Lane sums are
// reduced with warp shuffles (a fixed order: bitwise deterministic); the result is
// fmaf(sum, d.out_scale(r), bias[r]).
//
// A decoder D (made per row by the calling kernel, holding that row's pointers) has: static constexpr
// int kChunk (16 or 32); void chunk(uint4 raw, float* wf) (kChunk values); float scale16(int c, int h);
// float element(int e); float out_scale(int r).
#pragma once

#include "../common/types.cuh"

namespace pygpukit {
namespace ops {
namespace rowgemv {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// 8 consecutive elements of x as float, with one 16-byte load (two for float).
template <typename T>
__device__ __forceinline__ void load_x8(const T* p, float* v) {
  if constexpr (sizeof(T) == 4) {
    const float4 a = *reinterpret_cast<const float4*>(p);
    const float4 c = *reinterpret_cast<const float4*>(p + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = c.x, v[5] = c.y, v[6] = c.z, v[7] = c.w;
  } else {
    const Pack<T, 8> pack = *reinterpret_cast<const Pack<T, 8>*>(p);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = to_float(pack.v[j]);
  }
}

template <typename D, typename T, int M, int Unroll>
__device__ __forceinline__ void row_gemv(D d, const T* __restrict__ x, const void* __restrict__ w_row,
                                         T* __restrict__ y, const T* __restrict__ bias, int rows, int row,
                                         int k, long long ldx, long long ldy, int vector) {
  constexpr int kChunk = D::kChunk;
  static_assert(kChunk == 16 || kChunk == 32, "16 one-byte values or 32 nibbles per 16-byte load");
  const int lane = static_cast<int>(threadIdx.x) & 31;

  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;

  const int chunks = vector != 0 ? k / kChunk : 0;  // whole chunks (kChunk is a power of two)
#pragma unroll Unroll
  for (int c = lane; c < chunks; c += 32) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(w_row) + c);
    float wf[kChunk];
    d.chunk(raw, wf);
    float s[kChunk / 16];
#pragma unroll
    for (int h = 0; h < kChunk / 16; ++h) s[h] = d.scale16(c, h);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if (m < rows) {
        const T* xp = x + m * ldx + static_cast<long long>(kChunk) * c;
#pragma unroll
        for (int h = 0; h < kChunk / 16; ++h) {
          float dot = 0.0f;
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            float xv[8];
            load_x8(xp + 16 * h + 8 * q, xv);
#pragma unroll
            for (int j = 0; j < 8; ++j) dot = fmaf(xv[j], wf[16 * h + 8 * q + j], dot);
          }
          acc[m] = fmaf(dot, s[h], acc[m]);
        }
      }
    }
  }
  for (int e = kChunk * chunks + lane; e < k; e += 32) {
    const float wf = d.element(e);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if (m < rows) acc[m] = fmaf(to_float(x[m * ldx + e]), wf, acc[m]);
    }
  }

#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int delta = 16; delta > 0; delta >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], delta);
  }
  if (lane == 0) {
    const float g = d.out_scale(row);
    const float b = bias != nullptr ? to_float(bias[row]) : 0.0f;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if (m < rows) y[m * ldy + row] = from_float<T>(fmaf(acc[m], g, b));
    }
  }
}

}  // namespace rowgemv
}  // namespace ops
}  // namespace pygpukit
