// Conversions between the element types and float/double: the one definition every kernel uses.
//
//   convert<To>(v)      any element type to any other, NumPy's rules with one rounding: anything to
//                       bool is "!= 0" (NaN is true); narrow floats (fp16, bf16, fp8) widen exactly
//                       through float; 32- and 64-bit values narrow through double; integer to integer
//                       is the C++ conversion (wrapping, like NumPy's astype).
//   to_float(v)         any element type as float (exact for the narrow floats and small integers).
//   to_double(v)        any element type as double (exact except for 64-bit integers beyond 2^53).
//   from_float<T>(v)    float to T with one rounding (convert<T>); fp8 e5m2 keeps our overflow rule
//   from_double<T>(v)   (values beyond its range become +-inf: e5m2_from of element_types.cuh);
//                       fp8 e4m3 saturates to +-448, as cuda_fp8.h's constructors do.
//   float_from_half_bits(u), float_from_bf16_bits(u)
//                       a float16 / bfloat16 given as its 16 bits (for kernels that read raw words).
//   word_to_float2<T>(u), float2_to_word<T>(lo, hi), word_half_to_float<T>(u, high)
//                       two fp16 or bf16 values packed in a 32-bit word (element 0 in the low half, as
//                       consecutive elements sit in memory and in tensor-core fragments) to and from
//                       two floats: one instruction per element or pair.
//
// Compute types (Traits<T>::kind): fp16, bf16 and fp8 are stored narrow and computed in float; float
// in float; double in double; integers and bool in themselves. Narrow floats therefore round once,
// when stored.
#pragma once

#include "element_types.cuh"

namespace pygpukit {

template <typename A, typename B>
struct SameType {
  static constexpr bool value = false;
};
template <typename A>
struct SameType<A, A> {
  static constexpr bool value = true;
};

// kind: how a type behaves in arithmetic.
enum class Kind { kBool, kSigned, kUnsigned, kNarrow, kFloat, kDouble };

template <typename T>
struct Traits;

#define PYGPUKIT_TRAITS(T, KIND, UNSIGNED)   \
  template <>                                \
  struct Traits<T> {                         \
    static constexpr Kind kind = Kind::KIND; \
    using unsigned_type = UNSIGNED;          \
  };
PYGPUKIT_TRAITS(bool, kBool, unsigned char)
PYGPUKIT_TRAITS(signed char, kSigned, unsigned char)
PYGPUKIT_TRAITS(short, kSigned, unsigned short)
PYGPUKIT_TRAITS(int, kSigned, unsigned int)
PYGPUKIT_TRAITS(long long, kSigned, unsigned long long)
PYGPUKIT_TRAITS(unsigned char, kUnsigned, unsigned char)
PYGPUKIT_TRAITS(unsigned short, kUnsigned, unsigned short)
PYGPUKIT_TRAITS(unsigned int, kUnsigned, unsigned int)
PYGPUKIT_TRAITS(unsigned long long, kUnsigned, unsigned long long)
PYGPUKIT_TRAITS(__half, kNarrow, unsigned short)
PYGPUKIT_TRAITS(__nv_bfloat16, kNarrow, unsigned short)
PYGPUKIT_TRAITS(__nv_fp8_e4m3, kNarrow, unsigned char)
PYGPUKIT_TRAITS(__nv_fp8_e5m2, kNarrow, unsigned char)
PYGPUKIT_TRAITS(float, kFloat, unsigned int)
PYGPUKIT_TRAITS(double, kDouble, unsigned long long)
#undef PYGPUKIT_TRAITS

template <typename T>
__host__ __device__ constexpr bool is_integer() {
  return Traits<T>::kind == Kind::kSigned || Traits<T>::kind == Kind::kUnsigned;
}
template <typename T>
__host__ __device__ constexpr bool is_floating() {
  return Traits<T>::kind == Kind::kNarrow || Traits<T>::kind == Kind::kFloat ||
         Traits<T>::kind == Kind::kDouble;
}

// -- narrow floats <-> float/double -----------------------------------------------------------------
__device__ __forceinline__ float narrow_to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float narrow_to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float narrow_to_float(__nv_fp8_e4m3 v) { return static_cast<float>(v); }
__device__ __forceinline__ float narrow_to_float(__nv_fp8_e5m2 v) { return static_cast<float>(v); }

template <typename T>
__device__ __forceinline__ T narrow_from_float(float v);
template <>
__device__ __forceinline__ __half narrow_from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 narrow_from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __nv_fp8_e4m3 narrow_from_float<__nv_fp8_e4m3>(float v) {
  return __nv_fp8_e4m3(v);
}
template <>
__device__ __forceinline__ __nv_fp8_e5m2 narrow_from_float<__nv_fp8_e5m2>(float v) {
  return e5m2_from(v);
}

template <typename T>
__device__ __forceinline__ T narrow_from_double(double v);
template <>
__device__ __forceinline__ __half narrow_from_double<__half>(double v) {
  return __double2half(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 narrow_from_double<__nv_bfloat16>(double v) {
  return __double2bfloat16(v);
}
template <>
__device__ __forceinline__ __nv_fp8_e4m3 narrow_from_double<__nv_fp8_e4m3>(double v) {
  return __nv_fp8_e4m3(v);
}
template <>
__device__ __forceinline__ __nv_fp8_e5m2 narrow_from_double<__nv_fp8_e5m2>(double v) {
  return e5m2_from(v);
}

// -- any element type to any other --------------------------------------------------------------------
template <typename To, typename From>
__device__ __forceinline__ To convert(From v) {
  constexpr Kind from = Traits<From>::kind;
  constexpr Kind to = Traits<To>::kind;
  if constexpr (SameType<To, From>::value) {
    return v;
  } else if constexpr (to == Kind::kBool) {
    if constexpr (from == Kind::kNarrow) {
      return narrow_to_float(v) != 0.0f;
    } else {
      return v != From(0);
    }
  } else if constexpr (from == Kind::kNarrow) {
    const float f = narrow_to_float(v);
    if constexpr (to == Kind::kNarrow) {
      return narrow_from_float<To>(f);
    } else {
      return static_cast<To>(f);
    }
  } else if constexpr (to == Kind::kNarrow) {
    if constexpr (from == Kind::kFloat ||
                  ((from == Kind::kBool || is_integer<From>()) && sizeof(From) <= 2)) {
      return narrow_from_float<To>(static_cast<float>(v));  // exact in float
    } else {
      return narrow_from_double<To>(static_cast<double>(v));
    }
  } else {
    return static_cast<To>(v);
  }
}

template <typename T>
__device__ __forceinline__ float to_float(T v) {
  return convert<float>(v);
}
template <typename T>
__device__ __forceinline__ double to_double(T v) {
  return convert<double>(v);
}
template <typename T>
__device__ __forceinline__ T from_float(float v) {
  return convert<T>(v);
}
template <typename T>
__device__ __forceinline__ T from_double(double v) {
  return convert<T>(v);
}

// -- raw 16-bit floats ----------------------------------------------------------------------------------
__device__ __forceinline__ float float_from_half_bits(unsigned int bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}
__device__ __forceinline__ float float_from_bf16_bits(unsigned int bits) {  // exact: the top half of a float
  return __uint_as_float((bits & 0xffffu) << 16);
}

// -- pairs of fp16 / bf16 in a 32-bit word ------------------------------------------------------------
template <typename T>
__device__ __forceinline__ float2 word_to_float2(unsigned int u);
template <>
__device__ __forceinline__ float2 word_to_float2<__nv_bfloat16>(unsigned int u) {
  return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}
template <>
__device__ __forceinline__ float2 word_to_float2<__half>(unsigned int u) {
  __half2 h;
  memcpy(&h, &u, 4);
  return __half22float2(h);
}

// Both values rounded to nearest even (one cvt.rn.*x2 where the architecture has it).
template <typename T>
__device__ __forceinline__ unsigned int float2_to_word(float lo, float hi);
template <>
__device__ __forceinline__ unsigned int float2_to_word<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  unsigned int u;
  memcpy(&u, &h, 4);
  return u;
}
template <>
__device__ __forceinline__ unsigned int float2_to_word<__half>(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  unsigned int u;
  memcpy(&u, &h, 4);
  return u;
}

// One of the two values of a word (high: the upper half): bf16 by a shift or a mask, fp16 by one cvt.
template <typename T>
__device__ __forceinline__ float word_half_to_float(unsigned int u, bool high);
template <>
__device__ __forceinline__ float word_half_to_float<__nv_bfloat16>(unsigned int u, bool high) {
  return __uint_as_float(high ? u & 0xffff0000u : u << 16);
}
template <>
__device__ __forceinline__ float word_half_to_float<__half>(unsigned int u, bool high) {
  return float_from_half_bits(high ? u >> 16 : u & 0xffffu);
}

}  // namespace pygpukit
