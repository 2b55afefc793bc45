// Strided iteration spaces of the op kernels. A Layout describes one broadcast shape of up to 8
// dimensions (after the host merged every dimension it could) and, per operand, its element strides
// in that shape (0 along broadcast dimensions; operand 0 is the output). It travels by value as a
// kernel argument, so a launch needs no device-side metadata.
#pragma once

#include "types.cuh"

namespace pygpukit {
namespace ops {

constexpr int kMaxDims = 8;
constexpr int kMaxOperands = 4;

struct Layout {
  int ndim;
  index_t shape[kMaxDims];
  index_t strides[kMaxOperands][kMaxDims];
};

// Element offsets of the element with C-order index `linear` in the first N operands. Index
// arithmetic runs in 32 bits when the whole space fits (a 64-bit division costs several times more).
template <int N>
__device__ __forceinline__ void layout_offsets(const Layout& layout, index_t linear, bool small,
                                               index_t (&offsets)[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k) offsets[k] = 0;
  if (small) {
    unsigned rest = static_cast<unsigned>(linear);
    for (int d = layout.ndim - 1; d >= 0; --d) {
      const unsigned size = static_cast<unsigned>(layout.shape[d]);
      const unsigned next = rest / size;
      const index_t i = static_cast<index_t>(rest - next * size);
      rest = next;
#pragma unroll
      for (int k = 0; k < N; ++k) offsets[k] += i * layout.strides[k][d];
    }
  } else {
    index_t rest = linear;
    for (int d = layout.ndim - 1; d >= 0; --d) {
      const index_t next = rest / layout.shape[d];
      const index_t i = rest - next * layout.shape[d];
      rest = next;
#pragma unroll
      for (int k = 0; k < N; ++k) offsets[k] += i * layout.strides[k][d];
    }
  }
}

constexpr index_t kSmallSpace = 0x7fffffffLL;

}  // namespace ops
}  // namespace pygpukit
