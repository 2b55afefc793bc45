// strided_copy_<suffix>(dst, src, n, ndim, shape, src_strides, dst_strides): copies an n-element view
// of up to 8 dimensions between arbitrary (element) strides. Used to make strided views contiguous
// on the device. Layout arguments travel by value in one struct so a launch needs no device buffer.
#include "../common/element_types.cuh"

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
  for (index_t linear = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; linear < n;
       linear += stride) {
    index_t rest = linear;
    index_t src_offset = 0;
    index_t dst_offset = 0;
    for (int d = layout.ndim - 1; d >= 0; --d) {
      const index_t i = rest % layout.shape[d];
      rest /= layout.shape[d];
      src_offset += i * layout.src_strides[d];
      dst_offset += i * layout.dst_strides[d];
    }
    dst[dst_offset] = src[src_offset];
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
