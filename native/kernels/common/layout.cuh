// Strided iteration spaces of the op kernels. A Layout describes one broadcast shape of up to 8
// dimensions (after the host merged every dimension it could) and, per operand, its element strides
// in that shape (0 along broadcast dimensions; operand 0 is the output). It travels by value as a
// kernel argument, so a launch needs no device-side metadata.
#pragma once

#include "strided.cuh"
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

// Element offsets of the element with C-order index `linear` in the first N operands (strided.cuh;
// `small`: the space has at most kSmallSpace elements, 32-bit index arithmetic).
template <int N>
__device__ __forceinline__ void layout_offsets(const Layout& layout, index_t linear, bool small,
                                               index_t (&offsets)[N]) {
  strided_offsets<N>(
      linear, layout.ndim, layout.shape, [&](int k, int d) { return layout.strides[k][d]; }, small, offsets);
}

using pygpukit::kSmallSpace;

}  // namespace ops
}  // namespace pygpukit
