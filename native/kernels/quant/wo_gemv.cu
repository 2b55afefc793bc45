// Decode GEMV over weight-only quantized weights with per-channel scales (pygpukit/ops/quant/weight_only.py):
//
//   wo_gemv<W, T, M>(x, w, scale, y, bias, rows, n, k, ldx, ldw, ldy, vector)
//       y[m, r] = scale[r] * sum_k x[m, k] * W[r, k] (+ bias[r]) for m < rows <= M and r < n: W (n, k)
//       of W = __nv_fp8_e4m3 (FP8 W8A16) or signed char (INT8 weight-only), row stride ldw elements;
//       scale float32 (n,); x, y, bias in T (float, __half, __nv_bfloat16); float32 accumulation.
//
// One warp per row of W, eight rows per block of 256 threads. With `vector` (W, x and their row strides
// 16-byte aligned, k a multiple of 16) each lane reads 16 weights with one 16-byte load and the matching
// x with 16-byte loads, four such loads in flight; otherwise (and for the tail past the last whole 16)
// element by element. Lane sums are reduced with warp shuffles; the scale is applied once per row.
#include "../common/types.cuh"

namespace pygpukit {
namespace ops {
namespace wogemv {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 4;

__device__ __forceinline__ float weight(signed char v) { return static_cast<float>(v); }
__device__ __forceinline__ float weight(__nv_fp8_e4m3 v) { return narrow_to_float(v); }

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

template <typename W, typename T, int M>
__global__ void __launch_bounds__(kThreads)
    wo_gemv(const T* __restrict__ x, const W* __restrict__ w, const float* __restrict__ scale,
            T* __restrict__ y, const T* __restrict__ bias, int rows, int n, int k, long long ldx,
            long long ldw, long long ldy, int vector) {
  static_assert(sizeof(W) == 1, "one-byte weights");
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int row = static_cast<int>(blockIdx.x) * kWarps + warp;
  if (row >= n) return;  // no block-wide synchronisation below
  const W* wr = w + static_cast<long long>(row) * ldw;

  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;

  const int chunks = vector != 0 ? k >> 4 : 0;  // whole 16-element chunks
#pragma unroll kUnroll
  for (int c = lane; c < chunks; c += 32) {
    union {
      uint4 v;
      W e[16];
    } raw;
    raw.v = __ldg(reinterpret_cast<const uint4*>(wr) + c);
    float wf[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) wf[j] = weight(raw.e[j]);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if (m < rows) {
        const T* xp = x + m * ldx + 16 * c;
        float xv[8];
        load_x8(xp, xv);
        float dot = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) dot = fmaf(xv[j], wf[j], dot);
        load_x8(xp + 8, xv);
#pragma unroll
        for (int j = 0; j < 8; ++j) dot = fmaf(xv[j], wf[8 + j], dot);
        acc[m] += dot;
      }
    }
  }
  for (int e = 16 * chunks + lane; e < k; e += 32) {
    const float wf = weight(wr[e]);
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
    const float s = scale[row];
    const float b = bias != nullptr ? to_float(bias[row]) : 0.0f;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if (m < rows) y[m * ldy + row] = from_float<T>(fmaf(acc[m], s, b));
    }
  }
}

}  // namespace wogemv
}  // namespace ops
}  // namespace pygpukit
