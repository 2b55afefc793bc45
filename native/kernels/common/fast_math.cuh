// Single special-function-unit instructions, for kernels whose accuracy budget allows them (each
// use says why it does).
#pragma once

namespace pygpukit {

// 2^x, relative error about 2^-22; results below float's normal range flush to 0, 2^-inf = 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 1 / x within one ulp for normal x.
__device__ __forceinline__ float fast_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace pygpukit
