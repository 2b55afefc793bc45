// Element-type machinery shared by the op kernels: which storage types are computed in which type,
// conversions between any two element types, dtype codes for operands whose type is only known at
// run time (mixed-dtype and strided launches), and aligned packs for 128-bit memory access.
//
// Compute types: fp16, bf16 and fp8 are stored narrow and computed in float; float in float; double
// in double; integers and bool in themselves. Narrow floats therefore round once, when stored.
#pragma once

#include "element_types.cuh"

namespace pygpukit {
namespace ops {

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

// Unsigned type at least as wide as int, for wrapping integer arithmetic without signed overflow
// (unsigned short * unsigned short would be computed, and overflow, in int).
template <typename T>
struct Wide {
  using type = unsigned int;
};
template <>
struct Wide<long long> {
  using type = unsigned long long;
};
template <>
struct Wide<unsigned long long> {
  using type = unsigned long long;
};

// Largest and smallest finite value, and infinity where there is one.
template <typename T>
struct Limits {
  __device__ static T lowest() {
    if constexpr (Traits<T>::kind == Kind::kUnsigned) {
      return T(0);
    } else {
      using U = typename Traits<T>::unsigned_type;
      return static_cast<T>(static_cast<U>(static_cast<U>(1) << (8 * sizeof(T) - 1)));
    }
  }
  __device__ static T highest() {
    using U = typename Traits<T>::unsigned_type;
    if constexpr (Traits<T>::kind == Kind::kUnsigned) {
      return static_cast<T>(~static_cast<U>(0));
    } else {
      return static_cast<T>(static_cast<U>(~static_cast<U>(0)) >> 1);
    }
  }
};
template <>
struct Limits<bool> {
  __device__ static bool lowest() { return false; }
  __device__ static bool highest() { return true; }
};
template <>
struct Limits<float> {
  __device__ static float lowest() { return -__int_as_float(0x7f800000); }
  __device__ static float highest() { return __int_as_float(0x7f800000); }
};
template <>
struct Limits<double> {
  __device__ static double lowest() { return -__longlong_as_double(0x7ff0000000000000LL); }
  __device__ static double highest() { return __longlong_as_double(0x7ff0000000000000LL); }
};

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

// convert<To>(v): NumPy's conversion rules with one rounding. Anything to bool is "!= 0" (NaN is
// true); narrow floats widen through float exactly; 32- and 64-bit values narrow through double.
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

// -- run-time dtype codes (the order of PYGPUKIT_FOR_EACH_ELEMENT_TYPE) ------------------------------
constexpr int kCodeScalar = -1;  // the operand is the kernel's scalar argument
constexpr int kCodeAbsent = -2;  // an optional operand that was not given (clamp without a bound)

// Element `offset` of an array of dtype `code` at `base`, converted to C.
template <typename C>
__device__ __noinline__ C load_as(const void* base, int code, index_t offset) {
  switch (code) {
    case 0:
      return convert<C>(static_cast<const double*>(base)[offset]);
    case 1:
      return convert<C>(static_cast<const float*>(base)[offset]);
    case 2:
      return convert<C>(static_cast<const __half*>(base)[offset]);
    case 3:
      return convert<C>(static_cast<const __nv_bfloat16*>(base)[offset]);
    case 4:
      return convert<C>(static_cast<const __nv_fp8_e4m3*>(base)[offset]);
    case 5:
      return convert<C>(static_cast<const __nv_fp8_e5m2*>(base)[offset]);
    case 6:
      return convert<C>(static_cast<const signed char*>(base)[offset]);
    case 7:
      return convert<C>(static_cast<const short*>(base)[offset]);
    case 8:
      return convert<C>(static_cast<const int*>(base)[offset]);
    case 9:
      return convert<C>(static_cast<const long long*>(base)[offset]);
    case 10:
      return convert<C>(static_cast<const unsigned char*>(base)[offset]);
    case 11:
      return convert<C>(static_cast<const unsigned short*>(base)[offset]);
    case 12:
      return convert<C>(static_cast<const unsigned int*>(base)[offset]);
    case 13:
      return convert<C>(static_cast<const unsigned long long*>(base)[offset]);
    default:
      return convert<C>(static_cast<const bool*>(base)[offset]);
  }
}

// Store `value` converted to dtype `code` as element `offset` of the array at `base`.
template <typename V>
__device__ __noinline__ void store_as(void* base, int code, index_t offset, V value) {
  switch (code) {
    case 0:
      static_cast<double*>(base)[offset] = convert<double>(value);
      break;
    case 1:
      static_cast<float*>(base)[offset] = convert<float>(value);
      break;
    case 2:
      static_cast<__half*>(base)[offset] = convert<__half>(value);
      break;
    case 3:
      static_cast<__nv_bfloat16*>(base)[offset] = convert<__nv_bfloat16>(value);
      break;
    case 4:
      static_cast<__nv_fp8_e4m3*>(base)[offset] = convert<__nv_fp8_e4m3>(value);
      break;
    case 5:
      static_cast<__nv_fp8_e5m2*>(base)[offset] = convert<__nv_fp8_e5m2>(value);
      break;
    case 6:
      static_cast<signed char*>(base)[offset] = convert<signed char>(value);
      break;
    case 7:
      static_cast<short*>(base)[offset] = convert<short>(value);
      break;
    case 8:
      static_cast<int*>(base)[offset] = convert<int>(value);
      break;
    case 9:
      static_cast<long long*>(base)[offset] = convert<long long>(value);
      break;
    case 10:
      static_cast<unsigned char*>(base)[offset] = convert<unsigned char>(value);
      break;
    case 11:
      static_cast<unsigned short*>(base)[offset] = convert<unsigned short>(value);
      break;
    case 12:
      static_cast<unsigned int*>(base)[offset] = convert<unsigned int>(value);
      break;
    case 13:
      static_cast<unsigned long long*>(base)[offset] = convert<unsigned long long>(value);
      break;
    default:
      static_cast<bool*>(base)[offset] = convert<bool>(value);
      break;
  }
}

// An operand of a strided launch: an array of run-time dtype, or the scalar when code is kCodeScalar.
template <typename C>
__device__ __forceinline__ C operand(const void* base, int code, index_t offset, C scalar) {
  return code == kCodeScalar ? scalar : load_as<C>(base, code, offset);
}

// -- aligned packs ----------------------------------------------------------------------------------
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// Elements per thread and step of the contiguous kernels: one 16-byte access of the widest operand.
template <typename A, typename B>
__host__ __device__ constexpr int pack_width() {
  return 16 / (sizeof(A) > sizeof(B) ? sizeof(A) : sizeof(B));
}

// Packs each thread moves per tile in the contiguous elementwise kernels (their loads in flight together).
constexpr int kUnroll = 4;

template <typename T>
__device__ __forceinline__ bool aligned_to(const T* p, int bytes) {
  return (reinterpret_cast<unsigned long long>(p) & static_cast<unsigned long long>(bytes - 1)) == 0;
}

__device__ __forceinline__ index_t global_thread() {
  return static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ index_t grid_threads() { return static_cast<index_t>(gridDim.x) * blockDim.x; }

}  // namespace ops
}  // namespace pygpukit
