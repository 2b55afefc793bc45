// Element types shared by the built-in kernels, and the X-macro that lists them with the suffix each
// kernel entry point carries (fill_f32, fill_bf16, ...). Entry points are extern "C" so that the
// runtime finds them by plain name, without NVRTC name expressions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace pygpukit {

using index_t = long long;

// float8_e5m2 has infinities: values beyond its range become +-inf, as in NumPy (ml_dtypes), PyTorch
// and the other IEEE-like formats. cuda_fp8.h's constructors saturate to +-57344 instead, so every
// kernel converts through these. (float8_e4m3fn has no infinity: its constructors' saturation to
// +-448 is our rule there.)
__device__ __forceinline__ __nv_fp8_e5m2 e5m2_from(float v) {
  __nv_fp8_e5m2 r;
  r.__x = __nv_cvt_float_to_fp8(v, __NV_NOSAT, __NV_E5M2);
  return r;
}
__device__ __forceinline__ __nv_fp8_e5m2 e5m2_from(double v) {
  __nv_fp8_e5m2 r;
  r.__x = __nv_cvt_double_to_fp8(v, __NV_NOSAT, __NV_E5M2);
  return r;
}

}  // namespace pygpukit

// X(c_type, suffix) for every element type a GPUArray can hold.
#define PYGPUKIT_FOR_EACH_ELEMENT_TYPE(X) \
  X(double, f64)                          \
  X(float, f32)                           \
  X(__half, f16)                          \
  X(__nv_bfloat16, bf16)                  \
  X(__nv_fp8_e4m3, f8e4m3)                \
  X(__nv_fp8_e5m2, f8e5m2)                \
  X(signed char, i8)                      \
  X(short, i16)                           \
  X(int, i32)                             \
  X(long long, i64)                       \
  X(unsigned char, u8)                    \
  X(unsigned short, u16)                  \
  X(unsigned int, u32)                    \
  X(unsigned long long, u64)              \
  X(bool, b8)
