// The per-channel epilogue of scaled_matmul's device fallback (pygpukit/ops/gemm/scaled.py): where the
// loaded cuBLASLt has no outer-vector fp8 scaling (OUTER_VEC_32F), the fp8 product with unit scales comes
// back in float32 and this kernel scales, biases and rounds it into the result in one pass:
//
//   channel_epilogue<T>(acc, sa, sb, bias, d, m, n)
//       d[i, j] = T(acc[i, j] * sa[i] * sb[j] + bias[j]) for i < m, j < n; acc and d row-major and
//       contiguous, bias in T or null; T float, __half or __nv_bfloat16 (one rounding of the float sum).
//
// A thread per 4 consecutive outputs of a row, grid-stride: one 16-byte load of acc when n is a multiple
// of 4 (acc then 16-byte aligned, as every pool allocation is), element by element otherwise.
#include "../common/types.cuh"

namespace pygpukit {
namespace ops {
namespace scaled {

constexpr int kQuad = 4;

template <typename T>
__global__ void __launch_bounds__(256)
    channel_epilogue(const float* __restrict__ acc, const float* __restrict__ sa,
                     const float* __restrict__ sb, const T* __restrict__ bias, T* __restrict__ d, int m,
                     int n) {
  const long long quads = (static_cast<long long>(n) + kQuad - 1) / kQuad;
  const long long total = quads * m;
  const bool vector = (n % kQuad) == 0;
  for (long long t = global_thread(); t < total; t += grid_threads()) {
    const long long i = t / quads;
    const int j0 = static_cast<int>(t - i * quads) * kQuad;
    const float si = __ldg(sa + i);
    const float* row = acc + i * n;
    T* out = d + i * n;
    float v[kQuad];
    if (vector) {
      const float4 q = *reinterpret_cast<const float4*>(row + j0);
      v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else {
#pragma unroll
      for (int j = 0; j < kQuad; ++j) v[j] = j0 + j < n ? row[j0 + j] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kQuad; ++j) {
      if (j0 + j >= n) break;
      float y = v[j] * si * __ldg(sb + j0 + j);
      if (bias != nullptr) y += to_float(bias[j0 + j]);
      out[j0 + j] = from_float<T>(y);
    }
  }
}

}  // namespace scaled
}  // namespace ops
}  // namespace pygpukit
