// atan2 of two float arrays (pygpukit/ops/atan2_op.py), C's atan2f in float, one rounding to T at the
// store. Kokoro's harmonic source takes the phase of an STFT with it.
//
//   atan2_kernel<T>(args)  out[i] = atan2f(y[i], x[i]) over contiguous y, x and out of ``total`` elements.
#include "../common/layout.cuh"

namespace pygpukit {
namespace ops {
namespace phase {

// pygpukit/ops/atan2_op.py declares it as a KernelStruct (the compile check asserts the layout).
struct Atan2Args {
  const void* y;
  const void* x;
  void* out;
  index_t total;
};

template <typename T>
__global__ void atan2_kernel(Atan2Args a) {
  const T* y = static_cast<const T*>(a.y);
  const T* x = static_cast<const T*>(a.x);
  T* out = static_cast<T*>(a.out);
  for (index_t i = global_thread(); i < a.total; i += grid_threads()) {
    out[i] = from_float<T>(atan2f(to_float(y[i]), to_float(x[i])));
  }
}

}  // namespace phase
}  // namespace ops
}  // namespace pygpukit
