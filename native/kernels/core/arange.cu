// arange_<suffix>(out, start, step, n): out[i] = start + i * step. Floating types compute in double
// (then round once to the element type); integer types compute exactly in 64-bit integers.
#include "../common/convert.cuh"

#define PYGPUKIT_ARANGE_FLOAT(T, SUFFIX)                                                                    \
  extern "C" __global__ void arange_##SUFFIX(T* __restrict__ out, double start, double step, long long n) { \
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;                                \
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) { \
      out[i] = pygpukit::from_double<T>(start + static_cast<double>(i) * step);                             \
    }                                                                                                       \
  }
#define PYGPUKIT_ARANGE_INT(T, SUFFIX)                                                                      \
  extern "C" __global__ void arange_##SUFFIX(T* __restrict__ out, long long start, long long step,          \
                                             long long n) {                                                 \
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;                                \
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) { \
      out[i] = static_cast<T>(start + i * step);                                                            \
    }                                                                                                       \
  }
PYGPUKIT_ARANGE_FLOAT(double, f64)
PYGPUKIT_ARANGE_FLOAT(float, f32)
PYGPUKIT_ARANGE_FLOAT(__half, f16)
PYGPUKIT_ARANGE_FLOAT(__nv_bfloat16, bf16)
PYGPUKIT_ARANGE_FLOAT(__nv_fp8_e4m3, f8e4m3)
PYGPUKIT_ARANGE_FLOAT(__nv_fp8_e5m2, f8e5m2)
PYGPUKIT_ARANGE_INT(signed char, i8)
PYGPUKIT_ARANGE_INT(short, i16)
PYGPUKIT_ARANGE_INT(int, i32)
PYGPUKIT_ARANGE_INT(long long, i64)
PYGPUKIT_ARANGE_INT(unsigned char, u8)
PYGPUKIT_ARANGE_INT(unsigned short, u16)
PYGPUKIT_ARANGE_INT(unsigned int, u32)
PYGPUKIT_ARANGE_INT(unsigned long long, u64)
#undef PYGPUKIT_ARANGE_FLOAT
#undef PYGPUKIT_ARANGE_INT
