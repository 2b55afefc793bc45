// Phase vocoder of pygpukit.audio (pygpukit/audio/phase.py): librosa.phase_vocoder's loop over output frames.
//
// The spectrogram is frame-major: row r holds n_in frames of n_freq complex bins (frame k of row r starts at
// (r * n_in + k) * n_freq). One thread per (row, bin) walks the n_out output frames in order: output frame t
// reads input frames i = floor(t * rate) and i + 1 (zeros past the end), interpolates their magnitudes by
// alpha = t * rate - i, takes the accumulated phase, and advances it by phi[bin] plus the wrapped phase
// difference of the two frames (numpy's round-half-to-even: rint). Phases and magnitudes are computed in
// double for both element types.
#include "complex.cuh"

namespace pygpukit {
namespace audio {

template <typename T>
__device__ void phase_vocoder(const Cx<T>* __restrict__ d, const T* __restrict__ phi, Cx<T>* __restrict__ out,
                              index_t rows, index_t n_in, index_t n_out, int n_freq, double rate) {
  const double two_pi = 6.283185307179586476925286766559;
  const index_t total = rows * n_freq;
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const index_t r = i / n_freq;
    const index_t f = i - r * n_freq;
    const Cx<T>* row = d + r * n_in * n_freq + f;
    Cx<T>* o = out + r * n_out * n_freq + f;
    const double advance = static_cast<double>(phi[f]);
    double acc = atan2(static_cast<double>(row[0].im), static_cast<double>(row[0].re));
    for (index_t t = 0; t < n_out; ++t) {
      const double step = static_cast<double>(t) * rate;
      const index_t k = static_cast<index_t>(step);
      const double alpha = step - floor(step);
      double are = 0.0, aim = 0.0, bre = 0.0, bim = 0.0;
      if (k < n_in) {
        const Cx<T> a = row[k * n_freq];
        are = a.re;
        aim = a.im;
      }
      if (k + 1 < n_in) {
        const Cx<T> b = row[(k + 1) * n_freq];
        bre = b.re;
        bim = b.im;
      }
      const double mag = (1.0 - alpha) * hypot(are, aim) + alpha * hypot(bre, bim);
      double s, c;
      sincos(acc, &s, &c);
      o[t * n_freq] = cx<T>(static_cast<T>(mag * c), static_cast<T>(mag * s));
      double dphase = atan2(bim, bre) - atan2(aim, are) - advance;
      dphase = dphase - two_pi * rint(dphase / two_pi);
      acc += advance + dphase;
    }
  }
}

}  // namespace audio
}  // namespace pygpukit

#define PYGPUKIT_AUDIO_PHASE_ENTRIES(T, SUFFIX)                                                              \
  extern "C" __global__ void phase_vocoder_##SUFFIX(const void* d, const void* phi, void* out,               \
                                                    long long rows, long long n_in, long long n_out,         \
                                                    int n_freq, double rate) {                               \
    pygpukit::audio::phase_vocoder<T>(static_cast<const pygpukit::audio::Cx<T>*>(d),                         \
                                      static_cast<const T*>(phi), static_cast<pygpukit::audio::Cx<T>*>(out), \
                                      rows, n_in, n_out, n_freq, rate);                                      \
  }

PYGPUKIT_AUDIO_PHASE_ENTRIES(float, f32)
PYGPUKIT_AUDIO_PHASE_ENTRIES(double, f64)
#undef PYGPUKIT_AUDIO_PHASE_ENTRIES
