// What the built-in GEMM and GEMV kernels share: the fused epilogue activations (applied in float
// before the one rounding to the output; codes from common/codes.cuh, the one definition Python reads
// too), conversions between the stored element types and float, and the m16n8k16 tensor-core
// instruction.
#pragma once

#include "../common/codes.cuh"
#include "../common/convert.cuh"

namespace pygpukit {
namespace ops {
namespace matmul {

// The element conversions are convert.cuh's (one definition for every kernel), under the names the
// GEMM, GEMV, conv1d and attention kernels call them by.
using pygpukit::from_float;
using pygpukit::to_float;

// The accurate library functions rather than approximations: the epilogue runs once per output
// element, so its cost does not show next to the K loop, and a float output keeps full precision.
__device__ __forceinline__ float activate(float v, int activation) {
  switch (activation) {
    case codes::kActRelu:
      return fmaxf(v, 0.0f);
    case codes::kActGeluTanh: {
      const float inner = 0.7978845608028654f * (v + 0.044715f * v * v * v);
      return 0.5f * v * (1.0f + tanhf(inner));
    }
    case codes::kActSilu:
      return v / (1.0f + expf(-v));
    case codes::kActGelu:
      return 0.5f * v * (1.0f + erff(v * 0.7071067811865476f));
    default:
      return v;
  }
}

// d += a * b for one m16n8k16 tile with float accumulators: a holds this lane's part of the 16 x 16
// row-major A fragment, b0 and b1 its part of the 16 x 8 column-major B fragment.
template <typename T>
struct Mma;

template <>
struct Mma<__nv_bfloat16> {
  __device__ __forceinline__ static void run(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                             unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <>
struct Mma<__half> {
  __device__ __forceinline__ static void run(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                             unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

}  // namespace matmul
}  // namespace ops
}  // namespace pygpukit
