// fill_<suffix>(out, value, n): out[i] = value for i < n, over a contiguous buffer. The value arrives
// as raw bits in a 64-bit word so one launch signature serves every element type.
#include "../common/element_types.cuh"

namespace pygpukit {

template <typename T>
__device__ __forceinline__ T from_bits(unsigned long long bits) {
  T value;
  memcpy(&value, &bits, sizeof(T));  // little-endian: the low bytes hold the value
  return value;
}

template <typename T>
__device__ __forceinline__ void fill_grid_stride(T* __restrict__ out, unsigned long long bits, index_t n) {
  const T value = from_bits<T>(bits);
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = value;
  }
}

}  // namespace pygpukit

#define PYGPUKIT_FILL_ENTRY(T, SUFFIX)                                                                  \
  extern "C" __global__ void fill_##SUFFIX(T* __restrict__ out, unsigned long long bits, long long n) { \
    pygpukit::fill_grid_stride<T>(out, bits, n);                                                        \
  }
PYGPUKIT_FOR_EACH_ELEMENT_TYPE(PYGPUKIT_FILL_ENTRY)
#undef PYGPUKIT_FILL_ENTRY
