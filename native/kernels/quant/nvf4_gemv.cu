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
// A dequantizing kernel for SM80-90 (and any later architecture): one warp per row of W, eight rows
// per block of 256 threads. With `vector` (x's rows and W's rows 16-byte aligned, k a multiple of 32)
// each lane reads 32 values with one 16-byte load plus their two scales, decodes each nibble to float
// with integer operations (no table), and scales each 16-value partial dot product once; otherwise
// element by element. Native SM100/SM120 block-scaled FP4 tensor-core kernels are not written.
#include "../common/types.cuh"

namespace pygpukit {
namespace ops {
namespace nvf4 {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 2;

// The e2m1 value of the low four bits of c: sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0;
// exponent 0 is subnormal (0 or 0.5). Magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
__device__ __forceinline__ float e2m1(unsigned c) {
  const unsigned e = (c >> 1) & 3u;
  const unsigned m = c & 1u;
  const float mag = e != 0u ? __uint_as_float(((e + 126u) << 23) | (m << 22)) : 0.5f * static_cast<float>(m);
  return (c & 8u) != 0u ? -mag : mag;
}

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

__device__ __forceinline__ float scale_of(const unsigned char* s, long long i) {
  return narrow_to_float(reinterpret_cast<const __nv_fp8_e4m3*>(s)[i]);
}

template <typename T, int M>
__global__ void __launch_bounds__(kThreads)
    nvf4_gemv(const T* __restrict__ x, const unsigned char* __restrict__ w,
              const unsigned char* __restrict__ s, T* __restrict__ y, const T* __restrict__ bias, float g,
              int rows, int n, int k, long long ldx, long long ldw, long long ldy, long long lds,
              int vector) {
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int row = static_cast<int>(blockIdx.x) * kWarps + warp;
  if (row >= n) return;  // no block-wide synchronisation below
  const unsigned char* wr = w + static_cast<long long>(row) * ldw;
  const unsigned char* sr = s + static_cast<long long>(row) * lds;

  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;

  const int chunks = vector != 0 ? k >> 5 : 0;  // whole 32-value chunks (16 bytes)
#pragma unroll kUnroll
  for (int c = lane; c < chunks; c += 32) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(wr) + c);
    const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
    float wf[32];
#pragma unroll
    for (int j = 0; j < 32; ++j) wf[j] = e2m1(words[j >> 3] >> (4 * (j & 7)));
    const float s0 = scale_of(sr, 2 * c);
    const float s1 = scale_of(sr, 2 * c + 1);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if (m < rows) {
        const T* xp = x + m * ldx + 32 * c;
        float half[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float dot = 0.0f;
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            float xv[8];
            load_x8(xp + 16 * h + 8 * q, xv);
#pragma unroll
            for (int j = 0; j < 8; ++j) dot = fmaf(xv[j], wf[16 * h + 8 * q + j], dot);
          }
          half[h] = dot;
        }
        acc[m] = fmaf(half[0], s0, fmaf(half[1], s1, acc[m]));
      }
    }
  }
  for (int e = 32 * chunks + lane; e < k; e += 32) {
    const float wf = e2m1(static_cast<unsigned>(wr[e >> 1]) >> (4 * (e & 1))) * scale_of(sr, e >> 4);
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
      if (m < rows) y[m * ldy + row] = from_float<T>(fmaf(acc[m], g, b));
    }
  }
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
