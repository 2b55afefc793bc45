// NVF4 (NVFP4) weights (pygpukit/ops/quant/nvf4.py): e2m1 values, two per byte (element 2i in the low
// nibble), one float8_e4m3 scale per 16 values and one float32 per-tensor scale g:
// W[r, c] = e2m1(w[r, c]) * float(s[r, c / 16]) * g.
//
//   nvf4_gemv<T, M>(x, w, s, y, bias, g, rows, n, k, ldx, ldw, ldy, lds, vector)
//       y[m, r] = g * sum_c x[m, c] * W[r, c] (+ bias[r]) for m < rows <= M and r < n; x, y, bias in T
//       (float, __half, __nv_bfloat16); ldw and lds in bytes (packed values, scales); float32
//       accumulation.
//   nvf4_dequant<T>(w, s, out, g, n, k, ldw, lds)
//       out[r, c] = T(W[r, c]) (row-major, ld k): prefill's GEMM operand.
//
// A dequantizing kernel for SM80-90 (and any later architecture), row_gemv.cuh's skeleton (shared
// with wo_gemv.cu and fp8_block_gemv.cu): one warp per row of W, eight rows
// per block of 256 threads. With `vector` (x's rows and W's rows 16-byte aligned, k a multiple of 32)
// each lane reads 32 values with one 16-byte load plus their two scales, decodes each nibble to float
// with integer operations (no table), and scales each 16-value partial dot product once; otherwise
// element by element. Native SM100/SM120 block-scaled FP4 tensor-core kernels are not written.
#include "row_gemv.cuh"

namespace pygpukit {
namespace ops {
namespace nvf4 {

constexpr int kThreads = rowgemv::kThreads;
constexpr int kWarps = rowgemv::kWarps;
constexpr int kUnroll = 2;

// The e2m1 value of the low four bits of c: sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0;
// exponent 0 is subnormal (0 or 0.5). Magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
__device__ __forceinline__ float e2m1(unsigned c) {
  const unsigned e = (c >> 1) & 3u;
  const unsigned m = c & 1u;
  const float mag = e != 0u ? __uint_as_float(((e + 126u) << 23) | (m << 22)) : 0.5f * static_cast<float>(m);
  return (c & 8u) != 0u ? -mag : mag;
}

__device__ __forceinline__ float scale_of(const unsigned char* s, long long i) {
  return narrow_to_float(reinterpret_cast<const __nv_fp8_e4m3*>(s)[i]);
}

// row_gemv's decoder: 32 e2m1 values per load (16 bytes), two e4m3 scales, g at the end.
struct Decoder {
  static constexpr int kChunk = 32;
  const unsigned char* wr;
  const unsigned char* sr;
  float g;
  __device__ void chunk(uint4 raw, float* wf) const {
    const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int j = 0; j < 32; ++j) wf[j] = e2m1(words[j >> 3] >> (4 * (j & 7)));
  }
  __device__ float scale16(int c, int h) const { return scale_of(sr, 2 * c + h); }
  __device__ float element(int e) const {
    return e2m1(static_cast<unsigned>(wr[e >> 1]) >> (4 * (e & 1))) * scale_of(sr, e >> 4);
  }
  __device__ float out_scale(int) const { return g; }
};

template <typename T, int M>
__global__ void __launch_bounds__(kThreads)
    nvf4_gemv(const T* __restrict__ x, const unsigned char* __restrict__ w,
              const unsigned char* __restrict__ s, T* __restrict__ y, const T* __restrict__ bias, float g,
              int rows, int n, int k, long long ldx, long long ldw, long long ldy, long long lds,
              int vector) {
  const int row = static_cast<int>(blockIdx.x) * kWarps + (static_cast<int>(threadIdx.x) >> 5);
  if (row >= n) return;  // no block-wide synchronisation below
  const unsigned char* wr = w + static_cast<long long>(row) * ldw;
  const Decoder d{wr, s + static_cast<long long>(row) * lds, g};
  rowgemv::row_gemv<Decoder, T, M, kUnroll>(d, x, wr, y, bias, rows, row, k, ldx, ldy, vector);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    nvf4_dequant(const unsigned char* __restrict__ w, const unsigned char* __restrict__ s,
                 T* __restrict__ out, float g, int n, int k, long long ldw, long long lds) {
  const long long total = static_cast<long long>(n) * k;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const long long r = i / k;
    const int c = static_cast<int>(i - r * k);
    const float v =
        e2m1(static_cast<unsigned>(w[r * ldw + (c >> 1)]) >> (4 * (c & 1))) * scale_of(s + r * lds, c >> 4);
    out[i] = from_float<T>(v * g);
  }
}

}  // namespace nvf4
}  // namespace ops
}  // namespace pygpukit
