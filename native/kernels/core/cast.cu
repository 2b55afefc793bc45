// cast<Src, Dst>(src, dst, n): element-wise conversion between any two element types, instantiated
// per pair through NVRTC name expressions ("pygpukit::cast<float, __nv_bfloat16>").
// Floating conversions go through double (one rounding to the destination type); integer to integer
// is a plain C++ conversion (exact, wrapping like NumPy); anything to bool is "!= 0".
#include "../common/element_types.cuh"

namespace pygpukit {

template <typename T>
struct Convert {
  __device__ static double to_double(T v) { return static_cast<double>(v); }
  __device__ static T from_double(double v) { return static_cast<T>(v); }
};
template <>
struct Convert<__half> {
  __device__ static double to_double(__half v) { return static_cast<double>(__half2float(v)); }
  __device__ static __half from_double(double v) { return __double2half(v); }
};
template <>
struct Convert<__nv_bfloat16> {
  __device__ static double to_double(__nv_bfloat16 v) { return static_cast<double>(__bfloat162float(v)); }
  __device__ static __nv_bfloat16 from_double(double v) { return __double2bfloat16(v); }
};
template <>
struct Convert<__nv_fp8_e4m3> {
  __device__ static double to_double(__nv_fp8_e4m3 v) { return static_cast<double>(static_cast<float>(v)); }
  __device__ static __nv_fp8_e4m3 from_double(double v) { return __nv_fp8_e4m3(v); }
};
template <>
struct Convert<__nv_fp8_e5m2> {
  __device__ static double to_double(__nv_fp8_e5m2 v) { return static_cast<double>(static_cast<float>(v)); }
  __device__ static __nv_fp8_e5m2 from_double(double v) { return __nv_fp8_e5m2(v); }
};

template <typename T>
struct IsInteger {
  static constexpr bool value = false;
};
#define PYGPUKIT_INTEGER(T)             \
  template <>                           \
  struct IsInteger<T> {                 \
    static constexpr bool value = true; \
  };
PYGPUKIT_INTEGER(signed char)
PYGPUKIT_INTEGER(short)
PYGPUKIT_INTEGER(int)
PYGPUKIT_INTEGER(long long)
PYGPUKIT_INTEGER(unsigned char)
PYGPUKIT_INTEGER(unsigned short)
PYGPUKIT_INTEGER(unsigned int)
PYGPUKIT_INTEGER(unsigned long long)
PYGPUKIT_INTEGER(bool)
#undef PYGPUKIT_INTEGER

template <typename T>
struct IsBool {
  static constexpr bool value = false;
};
template <>
struct IsBool<bool> {
  static constexpr bool value = true;
};

template <typename Src, typename Dst>
__device__ __forceinline__ Dst convert(Src v) {
  if constexpr (IsBool<Dst>::value) {
    if constexpr (IsInteger<Src>::value) {
      return v != 0;
    } else {
      return Convert<Src>::to_double(v) != 0.0;
    }
  } else if constexpr (IsInteger<Src>::value && IsInteger<Dst>::value) {
    return static_cast<Dst>(v);
  } else {
    return Convert<Dst>::from_double(Convert<Src>::to_double(v));
  }
}

template <typename Src, typename Dst>
__global__ void cast(const Src* __restrict__ src, Dst* __restrict__ dst, long long n) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = convert<Src, Dst>(src[i]);
  }
}

}  // namespace pygpukit
