// Packed int4 (pygpukit.int4): two signed 4-bit values per byte, element 2i in the low nibble of byte
// i and element 2i + 1 in the high nibble (an odd count leaves the last high nibble zero).
//
//   int4_unpack_<suffix>(src, dst, n)  n packed int4 values -> n elements of <suffix> (exact)
//   int4_pack_<suffix>(src, dst, n)    n elements of <suffix> -> ceil(n / 2) packed bytes
//
// for int8 and the float types. Packing follows pygpukit.core.dtypes.int4_values, the host rule:
// int8 keeps its low four bits (two's complement wrapping, as NumPy narrows integers); a float is
// truncated toward zero and keeps the low four bits of that integer, except that NaN, infinities and
// truncations outside int32 give 0 (what ml_dtypes' conversion gives on x86). One thread handles one
// byte (two elements) per grid-stride step.
#include "../common/convert.cuh"

namespace pygpukit {

__device__ __forceinline__ int int4_nibble_value(unsigned int nibble) {
  return nibble >= 8u ? static_cast<int>(nibble) - 16 : static_cast<int>(nibble);
}

template <typename T>
__device__ __forceinline__ unsigned int int4_nibble_of(T v) {
  if constexpr (SameType<T, signed char>::value) {
    return static_cast<unsigned int>(static_cast<int>(v)) & 15u;
  } else {
    const double t = trunc(to_double(v));
    if (!(fabs(t) < 2147483648.0)) return 0u;  // NaN, +-inf, |t| >= 2^31
    return static_cast<unsigned int>(static_cast<long long>(t)) & 15u;
  }
}

template <typename Dst>
__device__ __forceinline__ void int4_unpack(const unsigned char* __restrict__ src, Dst* __restrict__ dst,
                                            index_t n) {
  const index_t bytes = (n + 1) / 2;
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < bytes; i += stride) {
    const unsigned int byte = src[i];
    dst[2 * i] = convert<Dst>(static_cast<signed char>(int4_nibble_value(byte & 15u)));
    if (2 * i + 1 < n) dst[2 * i + 1] = convert<Dst>(static_cast<signed char>(int4_nibble_value(byte >> 4)));
  }
}

template <typename Src>
__device__ __forceinline__ void int4_pack(const Src* __restrict__ src, unsigned char* __restrict__ dst,
                                          index_t n) {
  const index_t bytes = (n + 1) / 2;
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < bytes; i += stride) {
    const unsigned int low = int4_nibble_of(src[2 * i]);
    const unsigned int high = 2 * i + 1 < n ? int4_nibble_of(src[2 * i + 1]) : 0u;
    dst[i] = static_cast<unsigned char>(low | (high << 4));
  }
}

}  // namespace pygpukit

#define PYGPUKIT_INT4_ENTRY(T, SUFFIX)                                                                      \
  extern "C" __global__ void int4_unpack_##SUFFIX(const unsigned char* __restrict__ src,                    \
                                                  T* __restrict__ dst, long long n) {                       \
    pygpukit::int4_unpack<T>(src, dst, n);                                                                  \
  }                                                                                                         \
  extern "C" __global__ void int4_pack_##SUFFIX(const T* __restrict__ src, unsigned char* __restrict__ dst, \
                                                long long n) {                                              \
    pygpukit::int4_pack<T>(src, dst, n);                                                                    \
  }
PYGPUKIT_INT4_ENTRY(signed char, i8)
PYGPUKIT_INT4_ENTRY(double, f64)
PYGPUKIT_INT4_ENTRY(float, f32)
PYGPUKIT_INT4_ENTRY(__half, f16)
PYGPUKIT_INT4_ENTRY(__nv_bfloat16, bf16)
PYGPUKIT_INT4_ENTRY(__nv_fp8_e4m3, f8e4m3)
PYGPUKIT_INT4_ENTRY(__nv_fp8_e5m2, f8e5m2)
#undef PYGPUKIT_INT4_ENTRY
