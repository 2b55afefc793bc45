// Decode GEMV over weight-only quantized weights with per-channel scales on the tensor cores
// (pygpukit/ops/quant/weight_only.py):
//
//   wo_gemv_mma<W, T>(x, w, scale, y, bias, rows, n, k, ldx, ldw, ldy, vector)
//       y[m, r] = scale[r] * sum_k x[m, k] * W[r, k] (+ bias[r]) for m < rows <= 8 and r < n: W (n, k)
//       of W = __nv_fp8_e4m3 (FP8 W8A16) or signed char (INT8), rows ldw bytes apart, W and ldw
//       16-byte aligned, k a multiple of 64; scale float32 (n,); x, y, bias fp16 or bf16.
//
// mma_gemv.cuh's scheme with one scale per row: any k slot may hold any element, so each lane reads
// 16 consecutive weights of rows g and g + 8 with one 16-byte load each (lane t: elements 16t .. 16t + 15
// of a 64-element chunk; the four lanes of a row read 64 contiguous bytes) and multiplies them in four
// k16 steps of four elements. A block of 8 warps owns 16 rows; warp w takes the chunks w, w + 8, ...,
// four chunks' loads in flight. The weights become exact fp16 / bf16 values in registers:
//   FP8 e4m3: the sign to bit 15, exponent and mantissa shifted under the 16-bit type's (bf16: << 4,
//     fp16: << 7), then one packed multiply by 2^120 (bf16) or 2^8 (fp16) restores the exponent bias;
//     e4m3's subnormals land on the 16-bit type's subnormals and come out exact too (the NaN pattern
//     0x7f is not special-cased: a checkpoint's weights are finite);
//   INT8: as Q8_0 (16 h + l in bf16, two mma; 1024 + u in fp16, one).
// The row scale multiplies the block's sum once, in the epilogue.
#include "mma_gemv.cuh"

namespace pygpukit {
namespace ops {
namespace qgemv {

constexpr int kWoWarps = 8;
constexpr int kWoChunk = 64;  // elements of a row per warp step
constexpr int kWoInFlight = 4;

template <typename W>
struct IsSigned {
  static constexpr bool value = false;
};
template <>
struct IsSigned<signed char> {
  static constexpr bool value = true;
};

template <typename T>
struct Fp8Bits;

template <>
struct Fp8Bits<__nv_bfloat16> {
  static constexpr unsigned kScale = 0x7b807b80u;                    // 2^120
  __device__ __forceinline__ static unsigned widen(unsigned pair) {  // two e4m3 bytes in 16-bit lanes
    const unsigned v = ((pair << 8) & 0x80008000u) | ((pair << 4) & 0x07f007f0u);
    unsigned r;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(v), "r"(kScale), "r"(0x80008000u));
    return r;
  }
};

template <>
struct Fp8Bits<__half> {
  static constexpr unsigned kScale = 0x5c005c00u;  // 2^8
  __device__ __forceinline__ static unsigned widen(unsigned pair) {
    const unsigned v = ((pair << 8) & 0x80008000u) | ((pair << 7) & 0x3f803f80u);
    unsigned r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(v), "r"(kScale), "r"(0x80008000u));
    return r;
  }
};

// dot += one k16 step of weight words wa, wb (rows g and g + 8; bytes 0 .. 3 = elements e0 .. e3).
template <typename W, typename T>
__device__ __forceinline__ void wo_mma(unsigned wa, unsigned wb, unsigned b0, unsigned b1, float (&dot)[4]) {
  if constexpr (sizeof(W) == 1 && !IsSigned<W>::value) {  // FP8 e4m3
    const unsigned a[4] = {Fp8Bits<T>::widen(wa & 0x00ff00ffu), Fp8Bits<T>::widen(wb & 0x00ff00ffu),
                           Fp8Bits<T>::widen((wa >> 8) & 0x00ff00ffu),
                           Fp8Bits<T>::widen((wb >> 8) & 0x00ff00ffu)};
    matmul::Mma<T>::run(dot, a, b0, b1);
  } else {
    q8_mma<T>(wa, wb, b0, b1, dot);
  }
}

template <typename W, typename T>
__global__ void __launch_bounds__(kWoWarps * 32)
    wo_gemv_mma(const T* __restrict__ x, const W* __restrict__ w, const float* __restrict__ scale,
                T* __restrict__ y, const T* __restrict__ bias, int rows, int n, int k, long long ldx,
                long long ldw, long long ldy, int vector) {
  __shared__ float partial[kWoWarps * kMmaTileRows * kMmaMaxRows];
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int row0 = static_cast<int>(blockIdx.x) * kMmaTileRows;
  const unsigned char* wa = reinterpret_cast<const unsigned char*>(w) + ldw * min(row0 + g, n - 1) + 16 * t;
  const unsigned char* wb =
      reinterpret_cast<const unsigned char*>(w) + ldw * min(row0 + g + 8, n - 1) + 16 * t;
  const bool has_x = g < rows;
  const T* xr = x + (has_x ? static_cast<long long>(g) * ldx : 0) + 16 * t;
  const bool vec = vector != 0;
  const int chunks = k / kWoChunk;

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 1
  for (int c0 = warp; c0 < chunks; c0 += kWoWarps * kWoInFlight) {
    uint4 ra[kWoInFlight], rb[kWoInFlight];
#pragma unroll
    for (int u = 0; u < kWoInFlight; ++u) {
      const int c = c0 + u * kWoWarps;
      if (c < chunks) {
        ra[u] = __ldg(reinterpret_cast<const uint4*>(wa + static_cast<long long>(c) * kWoChunk));
        rb[u] = __ldg(reinterpret_cast<const uint4*>(wb + static_cast<long long>(c) * kWoChunk));
      }
    }
#pragma unroll
    for (int u = 0; u < kWoInFlight; ++u) {
      const int c = c0 + u * kWoWarps;
      if (c < chunks) {  // uniform over the warp
        const T* xc = xr + static_cast<long long>(c) * kWoChunk;
        const unsigned wa4[4] = {ra[u].x, ra[u].y, ra[u].z, ra[u].w};
        const unsigned wb4[4] = {rb[u].x, rb[u].y, rb[u].z, rb[u].w};
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          unsigned b0, b1;
          x_quad(xc + 4 * s, has_x, vec, b0, b1);
          wo_mma<W, T>(wa4[s], wb4[s], b0, b1, acc);
        }
      }
    }
  }
  store_tile(acc, partial, y, bias, rows, n, ldy, row0, scale);
}

}  // namespace qgemv
}  // namespace ops
}  // namespace pygpukit
