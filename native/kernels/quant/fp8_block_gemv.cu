// FP8 e4m3 weights with 2-D block scales (pygpukit/ops/quant/fp8_block.py), the layout of HF "fp8"
// block-quantized checkpoints (DeepSeek-V3, Qwen3-FP8: weight (n, k) float8_e4m3fn and
// weight_scale_inv (ceil(n / bn), ceil(k / bk)) float32, W[r, c] = w[r, c] * s[r / bn, c / bk]):
//
//   fp8_block_gemv<T, M>(x, w, s, y, bias, rows, n, k, ldx, ldw, ldy, lds, bn, bk, vector)
//       y[m, r] = sum_c x[m, c] * w[r, c] * s[r / bn, c / bk] (+ bias[r]) for m < rows <= M, r < n;
//       x, y, bias in T (float, __half, __nv_bfloat16); float32 accumulation (W8A16 decode).
//   fp8_block_dequant<T>(w, s, out, n, k, ldw, lds, bn, bk)
//       out[r, c] = T(float(w[r, c]) * s[r / bn, c / bk]) (row-major, ld k): prefill's GEMM operand.
//
// The GEMV has wo_gemv.cu's structure: one warp per row of W, eight rows per block of 256 threads.
// With `vector` (W, x and their row strides 16-byte aligned, k and bk multiples of 16) each lane
// reads 16 weights with one 16-byte load, the matching x with 16-byte loads, four such loads in
// flight, and scales each 16-element partial dot product by its block's scale (a 16-aligned chunk
// never straddles a block when bk is a multiple of 16); otherwise element by element. Lane sums are
// reduced with warp shuffles.
#include "../common/types.cuh"

namespace pygpukit {
namespace ops {
namespace fp8block {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 4;

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

template <typename T, int M>
__global__ void __launch_bounds__(kThreads)
    fp8_block_gemv(const T* __restrict__ x, const __nv_fp8_e4m3* __restrict__ w, const float* __restrict__ s,
                   T* __restrict__ y, const T* __restrict__ bias, int rows, int n, int k, long long ldx,
                   long long ldw, long long ldy, long long lds, int bn, int bk, int vector) {
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int row = static_cast<int>(blockIdx.x) * kWarps + warp;
  if (row >= n) return;  // no block-wide synchronisation below
  const __nv_fp8_e4m3* wr = w + static_cast<long long>(row) * ldw;
  const float* sr = s + static_cast<long long>(row / bn) * lds;

  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;

  const int chunks = vector != 0 ? k >> 4 : 0;  // whole 16-element chunks
#pragma unroll kUnroll
  for (int c = lane; c < chunks; c += 32) {
    union {
      uint4 v;
      __nv_fp8_e4m3 e[16];
    } raw;
    raw.v = __ldg(reinterpret_cast<const uint4*>(wr) + c);
    const float scale = __ldg(sr + (16 * c) / bk);
    float wf[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) wf[j] = narrow_to_float(raw.e[j]);
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
        acc[m] = fmaf(dot, scale, acc[m]);
      }
    }
  }
  for (int e = 16 * chunks + lane; e < k; e += 32) {
    const float wf = narrow_to_float(wr[e]) * __ldg(sr + e / bk);
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
    const float b = bias != nullptr ? to_float(bias[row]) : 0.0f;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if (m < rows) y[m * ldy + row] = from_float<T>(acc[m] + b);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    fp8_block_dequant(const __nv_fp8_e4m3* __restrict__ w, const float* __restrict__ s, T* __restrict__ out,
                      int n, int k, long long ldw, long long lds, int bn, int bk) {
  const long long total = static_cast<long long>(n) * k;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const long long r = i / k;
    const int c = static_cast<int>(i - r * k);
    const float v = narrow_to_float(w[r * ldw + c]) * __ldg(s + (r / bn) * lds + c / bk);
    out[i] = from_float<T>(v);
  }
}

}  // namespace fp8block
}  // namespace ops
}  // namespace pygpukit
