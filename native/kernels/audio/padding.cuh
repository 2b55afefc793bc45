// Padded reads of signal rows, shared by the framing kernels (spectral.cu) and the STFT's fused first FFT
// stage (fft.cu): padded position t of a row of T samples reads sample t when 0 <= t < T, else follows
// codes::PadMode (numpy.pad's constant, reflect, edge, symmetric and wrap).
#pragma once

#include "complex.cuh"

namespace pygpukit {
namespace audio {

// The sample a padded position reads: its index in [0, T), or -1 for a zero (constant padding).
__device__ __forceinline__ index_t pad_index(index_t t, index_t T, int mode) {
  if (t >= 0 && t < T) return t;
  switch (mode) {
    case codes::kPadConstant:
      return -1;
    case codes::kPadEdge:
      return t < 0 ? 0 : T - 1;
    case codes::kPadReflect: {
      if (T == 1) return 0;
      const index_t period = 2 * (T - 1);
      index_t m = t % period;
      if (m < 0) m += period;
      return m < T ? m : period - m;
    }
    case codes::kPadSymmetric: {
      const index_t period = 2 * T;
      index_t m = t % period;
      if (m < 0) m += period;
      return m < T ? m : period - 1 - m;
    }
    default: {  // kPadWrap
      index_t m = t % T;
      return m < 0 ? m + T : m;
    }
  }
}

template <typename T>
__device__ __forceinline__ T padded(const T* __restrict__ row, index_t t, index_t length, int mode) {
  const index_t i = pad_index(t, length, mode);
  return i < 0 ? T(0) : row[i];
}

}  // namespace audio
}  // namespace pygpukit
