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
// The GEMV is row_gemv.cuh's skeleton (shared with wo_gemv.cu): one warp per row of W, eight rows per block
// of 256 threads. With `vector` (W, x and their row strides 16-byte aligned, k and bk multiples of 16) each
// lane reads 16 weights with one 16-byte load, the matching x with 16-byte loads, four such loads in flight,
// and scales each 16-element partial dot product by its block's scale (a 16-aligned chunk never straddles a
// block when bk is a multiple of 16); otherwise element by element. Lane sums are reduced with warp shuffles.
#include "row_gemv.cuh"

namespace pygpukit {
namespace ops {
namespace fp8block {

constexpr int kThreads = rowgemv::kThreads;
constexpr int kWarps = rowgemv::kWarps;
constexpr int kUnroll = 4;

// row_gemv's decoder: 16 e4m3 weights per load, each 16-aligned chunk inside one block of bk columns.
struct Decoder {
  static constexpr int kChunk = 16;
  const __nv_fp8_e4m3* wr;
  const float* sr;  // the row's block-row of scales
  int bk;
  __device__ void chunk(uint4 raw, float* wf) const {
    union {
      uint4 v;
      __nv_fp8_e4m3 e[16];
    } u;
    u.v = raw;
#pragma unroll
    for (int j = 0; j < 16; ++j) wf[j] = narrow_to_float(u.e[j]);
  }
  __device__ float scale16(int c, int) const { return __ldg(sr + (16 * c) / bk); }
  __device__ float element(int e) const { return narrow_to_float(wr[e]) * __ldg(sr + e / bk); }
  __device__ float out_scale(int) const { return 1.0f; }
};

template <typename T, int M>
__global__ void __launch_bounds__(kThreads)
    fp8_block_gemv(const T* __restrict__ x, const __nv_fp8_e4m3* __restrict__ w, const float* __restrict__ s,
                   T* __restrict__ y, const T* __restrict__ bias, int rows, int n, int k, long long ldx,
                   long long ldw, long long ldy, long long lds, int bn, int bk, int vector) {
  const int row = static_cast<int>(blockIdx.x) * kWarps + (static_cast<int>(threadIdx.x) >> 5);
  if (row >= n) return;  // no block-wide synchronisation below
  const __nv_fp8_e4m3* wr = w + static_cast<long long>(row) * ldw;
  const Decoder d{wr, s + static_cast<long long>(row / bn) * lds, bk};
  rowgemv::row_gemv<Decoder, T, M, kUnroll>(d, x, wr, y, bias, rows, row, k, ldx, ldy, vector);
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
