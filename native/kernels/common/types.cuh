// Element-type machinery shared by the op kernels: limits, dtype codes for operands whose type is
// only known at run time (mixed-dtype and strided launches), and aligned packs for 128-bit memory
// access. The conversions between element types (convert<To>, to_float, from_float, ...) and the
// compute-type traits live in convert.cuh, shared with the core kernels; they are visible here as
// pygpukit::ops names too.
#pragma once

#include "codes.cuh"
#include "convert.cuh"

namespace pygpukit {
namespace ops {

using pygpukit::convert;
using pygpukit::from_double;
using pygpukit::from_float;
using pygpukit::is_floating;
using pygpukit::is_integer;
using pygpukit::Kind;
using pygpukit::narrow_from_double;
using pygpukit::narrow_from_float;
using pygpukit::narrow_to_float;
using pygpukit::SameType;
using pygpukit::to_double;
using pygpukit::to_float;
using pygpukit::Traits;

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

// -- run-time dtype codes (codes::DType: the order of PYGPUKIT_FOR_EACH_ELEMENT_TYPE) ---------------
constexpr int kCodeScalar = -1;  // the operand is the kernel's scalar argument
constexpr int kCodeAbsent = -2;  // an optional operand that was not given (clamp without a bound)

// Element `offset` of an array of dtype `code` at `base`, converted to C.
template <typename C>
__device__ __noinline__ C load_as(const void* base, int code, index_t offset) {
  switch (code) {
    case codes::kF64:
      return convert<C>(static_cast<const double*>(base)[offset]);
    case codes::kF32:
      return convert<C>(static_cast<const float*>(base)[offset]);
    case codes::kF16:
      return convert<C>(static_cast<const __half*>(base)[offset]);
    case codes::kBF16:
      return convert<C>(static_cast<const __nv_bfloat16*>(base)[offset]);
    case codes::kF8E4M3:
      return convert<C>(static_cast<const __nv_fp8_e4m3*>(base)[offset]);
    case codes::kF8E5M2:
      return convert<C>(static_cast<const __nv_fp8_e5m2*>(base)[offset]);
    case codes::kI8:
      return convert<C>(static_cast<const signed char*>(base)[offset]);
    case codes::kI16:
      return convert<C>(static_cast<const short*>(base)[offset]);
    case codes::kI32:
      return convert<C>(static_cast<const int*>(base)[offset]);
    case codes::kI64:
      return convert<C>(static_cast<const long long*>(base)[offset]);
    case codes::kU8:
      return convert<C>(static_cast<const unsigned char*>(base)[offset]);
    case codes::kU16:
      return convert<C>(static_cast<const unsigned short*>(base)[offset]);
    case codes::kU32:
      return convert<C>(static_cast<const unsigned int*>(base)[offset]);
    case codes::kU64:
      return convert<C>(static_cast<const unsigned long long*>(base)[offset]);
    default:
      return convert<C>(static_cast<const bool*>(base)[offset]);
  }
}

// Store `value` converted to dtype `code` as element `offset` of the array at `base`.
template <typename V>
__device__ __noinline__ void store_as(void* base, int code, index_t offset, V value) {
  switch (code) {
    case codes::kF64:
      static_cast<double*>(base)[offset] = convert<double>(value);
      break;
    case codes::kF32:
      static_cast<float*>(base)[offset] = convert<float>(value);
      break;
    case codes::kF16:
      static_cast<__half*>(base)[offset] = convert<__half>(value);
      break;
    case codes::kBF16:
      static_cast<__nv_bfloat16*>(base)[offset] = convert<__nv_bfloat16>(value);
      break;
    case codes::kF8E4M3:
      static_cast<__nv_fp8_e4m3*>(base)[offset] = convert<__nv_fp8_e4m3>(value);
      break;
    case codes::kF8E5M2:
      static_cast<__nv_fp8_e5m2*>(base)[offset] = convert<__nv_fp8_e5m2>(value);
      break;
    case codes::kI8:
      static_cast<signed char*>(base)[offset] = convert<signed char>(value);
      break;
    case codes::kI16:
      static_cast<short*>(base)[offset] = convert<short>(value);
      break;
    case codes::kI32:
      static_cast<int*>(base)[offset] = convert<int>(value);
      break;
    case codes::kI64:
      static_cast<long long*>(base)[offset] = convert<long long>(value);
      break;
    case codes::kU8:
      static_cast<unsigned char*>(base)[offset] = convert<unsigned char>(value);
      break;
    case codes::kU16:
      static_cast<unsigned short*>(base)[offset] = convert<unsigned short>(value);
      break;
    case codes::kU32:
      static_cast<unsigned int*>(base)[offset] = convert<unsigned int>(value);
      break;
    case codes::kU64:
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
