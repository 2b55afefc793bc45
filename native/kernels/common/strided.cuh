// Strided index arithmetic, the one definition every kernel uses (core kernels included: this header
// needs nothing but element_types.cuh): which element of an array, or of several arrays walked
// together, a C-order linear index names.
//
//   take_index(rest, size)   the index along the current (fastest-varying) dimension of size `size`
//                            and, in `rest`, the linear index over the slower ones: rest % size and
//                            rest / size with one division
//   strided_offset(linear, ndim, shape, strides)
//                            the element offset of C-order index `linear` in a space of `ndim`
//                            dimensions of sizes shape[0..ndim) that steps strides[d] elements along
//                            dimension d (any sign, 0 for broadcast dimensions)
//   strided_offsets<N>(linear, ndim, shape, stride, small, offsets)
//                            the same for N operands walked together: operand k steps stride(k, d)
//                            elements along dimension d (a callable, so any struct layout of the
//                            strides reads as directly as a plain array). `small`: the whole space
//                            has at most kSmallSpace elements, so the index arithmetic runs in 32
//                            bits (a 64-bit division costs several times more)
#pragma once

#include "element_types.cuh"

namespace pygpukit {

// Index spaces of at most this many elements take 32-bit index arithmetic.
constexpr index_t kSmallSpace = 0x7fffffffLL;

template <typename I>
__device__ __forceinline__ I take_index(I& rest, I size) {
  const I next = rest / size;
  const I i = rest - next * size;
  rest = next;
  return i;
}

__device__ __forceinline__ index_t strided_offset(index_t linear, int ndim, const index_t* shape,
                                                  const index_t* strides) {
  index_t offset = 0;
  for (int d = ndim - 1; d >= 0; --d) offset += take_index(linear, shape[d]) * strides[d];
  return offset;
}

template <int N, typename Stride>
__device__ __forceinline__ void strided_offsets(index_t linear, int ndim, const index_t* shape, Stride stride,
                                                bool small, index_t (&offsets)[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k) offsets[k] = 0;
  if (small) {
    unsigned rest = static_cast<unsigned>(linear);
    for (int d = ndim - 1; d >= 0; --d) {
      const index_t i = static_cast<index_t>(take_index(rest, static_cast<unsigned>(shape[d])));
#pragma unroll
      for (int k = 0; k < N; ++k) offsets[k] += i * stride(k, d);
    }
  } else {
    index_t rest = linear;
    for (int d = ndim - 1; d >= 0; --d) {
      const index_t i = take_index(rest, shape[d]);
#pragma unroll
      for (int k = 0; k < N; ++k) offsets[k] += i * stride(k, d);
    }
  }
}

}  // namespace pygpukit
