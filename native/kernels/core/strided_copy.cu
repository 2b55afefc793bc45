// strided_copy_<suffix>(dst, src, n, layout): copies an n-element view of up to 8 dimensions between
// arbitrary (element) strides (offsets from common/strided.cuh). Used to make strided views
// contiguous on the device. Layout arguments travel by value in one struct (StridedLayout, declared
// for Python as pygpukit.core.builtins.STRIDED_LAYOUT) so a launch needs no device buffer.
#include "../common/strided.cuh"

namespace pygpukit {

constexpr int kMaxDims = 8;

struct StridedLayout {
  int ndim;
  index_t shape[kMaxDims];
  index_t src_strides[kMaxDims];  // in elements, may be negative or zero (broadcast)
  index_t dst_strides[kMaxDims];
};

template <typename T>
__device__ __forceinline__ void strided_copy(T* __restrict__ dst, const T* __restrict__ src, index_t n,
                                             const StridedLayout& layout) {
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  const bool small = n <= kSmallSpace;
  for (index_t linear = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; linear < n;
       linear += stride) {
    index_t offsets[2];  // dst, src
    strided_offsets<2>(
        linear, layout.ndim, layout.shape,
        [&](int k, int d) { return k == 0 ? layout.dst_strides[d] : layout.src_strides[d]; }, small, offsets);
    dst[offsets[0]] = src[offsets[1]];
  }
}

}  // namespace pygpukit

#define PYGPUKIT_STRIDED_COPY_ENTRY(T, SUFFIX)                                                     \
  extern "C" __global__ void strided_copy_##SUFFIX(T* __restrict__ dst, const T* __restrict__ src, \
                                                   long long n, pygpukit::StridedLayout layout) {  \
    pygpukit::strided_copy<T>(dst, src, n, layout);                                                \
  }
PYGPUKIT_FOR_EACH_ELEMENT_TYPE(PYGPUKIT_STRIDED_COPY_ENTRY)
#undef PYGPUKIT_STRIDED_COPY_ENTRY
