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
  __device__ static __nv_fp8_e5m2 from_double(double v) { return e5m2_from(v); }
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

// Floating types of at most 32 bits convert exactly to float, and float converts to each of them with
// one correct rounding, so between two of them float is as exact as double and much cheaper.
template <typename T>
struct IsSmallFloat {
  static constexpr bool value = false;
};
#define PYGPUKIT_SMALL_FLOAT(T)         \
  template <>                           \
  struct IsSmallFloat<T> {              \
    static constexpr bool value = true; \
  };
PYGPUKIT_SMALL_FLOAT(float)
PYGPUKIT_SMALL_FLOAT(__half)
PYGPUKIT_SMALL_FLOAT(__nv_bfloat16)
PYGPUKIT_SMALL_FLOAT(__nv_fp8_e4m3)
PYGPUKIT_SMALL_FLOAT(__nv_fp8_e5m2)
#undef PYGPUKIT_SMALL_FLOAT

template <typename T>
__device__ __forceinline__ float small_to_float(T v) {
  return static_cast<float>(v);
}
template <>
__device__ __forceinline__ float small_to_float<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float small_to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T small_from_float(float v) {
  return T(v);
}
template <>
__device__ __forceinline__ float small_from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half small_from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 small_from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __nv_fp8_e5m2 small_from_float<__nv_fp8_e5m2>(float v) {
  return e5m2_from(v);
}

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
  } else if constexpr (IsSmallFloat<Src>::value && IsSmallFloat<Dst>::value) {
    return small_from_float<Dst>(small_to_float<Src>(v));
  } else {
    return Convert<Dst>::from_double(Convert<Src>::to_double(v));
  }
}

template <typename T, int N>
struct alignas(sizeof(T) * N) Chunk {
  T v[N];
};

// 16-byte chunks (of the wider type) per thread when both pointers allow, then single elements.
template <typename Src, typename Dst>
__global__ void cast(const Src* __restrict__ src, Dst* __restrict__ dst, long long n) {
  constexpr int N = 16 / (sizeof(Src) > sizeof(Dst) ? sizeof(Src) : sizeof(Dst));
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool aligned = reinterpret_cast<unsigned long long>(src) % (sizeof(Src) * N) == 0 &&
                       reinterpret_cast<unsigned long long>(dst) % (sizeof(Dst) * N) == 0;
  const long long chunks = aligned ? n / N : 0;
  for (long long c = first; c < chunks; c += stride) {
    const Chunk<Src, N> in = reinterpret_cast<const Chunk<Src, N>*>(src)[c];
    Chunk<Dst, N> out;
#pragma unroll
    for (int j = 0; j < N; ++j) out.v[j] = convert<Src, Dst>(in.v[j]);
    reinterpret_cast<Chunk<Dst, N>*>(dst)[c] = out;
  }
  for (long long i = chunks * N + first; i < n; i += stride) dst[i] = convert<Src, Dst>(src[i]);
}

}  // namespace pygpukit
