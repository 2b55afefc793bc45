// Decode GEMV over weight-only quantized weights with per-channel scales (pygpukit/ops/quant/weight_only.py):
//
//   wo_gemv<W, T, M>(x, w, scale, y, bias, rows, n, k, ldx, ldw, ldy, vector)
//       y[m, r] = scale[r] * sum_k x[m, k] * W[r, k] (+ bias[r]) for m < rows <= M and r < n: W (n, k)
//       of W = __nv_fp8_e4m3 (FP8 W8A16) or signed char (INT8 weight-only), row stride ldw elements;
//       scale float32 (n,); x, y, bias in T (float, __half, __nv_bfloat16); float32 accumulation.
//
// row_gemv.cuh's skeleton: one warp per row of W, eight rows per block of 256 threads. With `vector`
// (W, x and their row strides 16-byte aligned, k a multiple of 16) each lane reads 16 weights with one
// 16-byte load and the matching x with 16-byte loads, four such loads in flight; otherwise (and for
// the tail past the last whole 16) element by element. Lane sums are reduced with warp shuffles; the
// scale is applied once per row.
#include "row_gemv.cuh"

namespace pygpukit {
namespace ops {
namespace wogemv {

constexpr int kThreads = rowgemv::kThreads;
constexpr int kWarps = rowgemv::kWarps;
constexpr int kUnroll = 4;

__device__ __forceinline__ float weight(signed char v) { return static_cast<float>(v); }
__device__ __forceinline__ float weight(__nv_fp8_e4m3 v) { return narrow_to_float(v); }

// row_gemv's decoder: 16 one-byte weights per load, no scale inside a row, the row's scale at the end.
template <typename W>
struct Decoder {
  static constexpr int kChunk = 16;
  const W* wr;
  const float* scale;
  __device__ void chunk(uint4 raw, float* wf) const {
    union {
      uint4 v;
      W e[16];
    } u;
    u.v = raw;
#pragma unroll
    for (int j = 0; j < 16; ++j) wf[j] = weight(u.e[j]);
  }
  __device__ float scale16(int, int) const { return 1.0f; }
  __device__ float element(int e) const { return weight(wr[e]); }
  __device__ float out_scale(int r) const { return scale[r]; }
};

template <typename W, typename T, int M>
__global__ void __launch_bounds__(kThreads)
    wo_gemv(const T* __restrict__ x, const W* __restrict__ w, const float* __restrict__ scale,
            T* __restrict__ y, const T* __restrict__ bias, int rows, int n, int k, long long ldx,
            long long ldw, long long ldy, int vector) {
  static_assert(sizeof(W) == 1, "one-byte weights");
  const int row = static_cast<int>(blockIdx.x) * kWarps + (static_cast<int>(threadIdx.x) >> 5);
  if (row >= n) return;  // no block-wide synchronisation below
  const W* wr = w + static_cast<long long>(row) * ldw;
  rowgemv::row_gemv<Decoder<W>, T, M, kUnroll>(Decoder<W>{wr, scale}, x, wr, y, bias, rows, row, k, ldx, ldy,
                                               vector);
}

}  // namespace wogemv
}  // namespace ops
}  // namespace pygpukit
