// Polyphase windowed-sinc resampling of pygpukit.audio (pygpukit/audio/resample.py).
//
// Rows of T input samples (row r starts at r * length) are resampled by L / M (the rates divided by their
// gcd): output sample n of a row sits at input time n * M / L = i0 + p / L (i0 = n * M / L rounded down,
// phase p = n * M mod L) and is the dot product of the taps input samples i0 - left + k, k < taps, (zeros
// outside the row) with row p of the filter table (L rows of taps coefficients, the Kaiser-windowed sinc
// evaluated at p / L + left - k, built in float64 on the host and rounded once). One thread per output
// sample; the sum runs in the element type's precision.
//
// resample_direct serves ratios that are not a ratio of whole rates (or need too many phases): output n
// sits at input time n * step and its taps are the windowed sinc evaluated in double for each input sample
// within `half` samples of that time: gain * cutoff * sinc(cutoff * tau) * I0(beta sqrt(1 - (tau / half)^2))
// / I0(beta).
#include "complex.cuh"

namespace pygpukit {
namespace audio {

template <typename T>
__device__ void resample_poly(const T* __restrict__ x, const T* __restrict__ table, T* __restrict__ out,
                              index_t rows, index_t length, index_t out_len, index_t up, index_t down,
                              int taps, index_t left) {
  const index_t total = rows * out_len;
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const index_t r = i / out_len;
    const index_t n = i - r * out_len;
    const index_t num = n * down;
    const index_t i0 = num / up;
    const index_t p = num - i0 * up;
    const T* row = x + r * length;
    const T* h = table + p * taps;
    const index_t first = i0 - left;
    const int k0 = first < 0 ? static_cast<int>(-first) : 0;
    const index_t room = length - first;
    const int k1 = room < taps ? static_cast<int>(room < 0 ? 0 : room) : taps;
    T acc = T(0);
    for (int k = k0; k < k1; ++k) acc += h[k] * row[first + k];
    out[i] = acc;
  }
}

template <typename T>
__device__ void resample_direct(const T* __restrict__ x, T* __restrict__ out, index_t rows, index_t length,
                                index_t out_len, double step, double cutoff, double half, double beta,
                                double gain) {
  const double pi = 3.141592653589793238462643383279;
  const double norm = gain * cutoff / cyl_bessel_i0(beta);
  const index_t total = rows * out_len;
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const index_t r = i / out_len;
    const index_t n = i - r * out_len;
    const double t = static_cast<double>(n) * step;
    index_t j0 = static_cast<index_t>(floor(t - half));
    index_t j1 = static_cast<index_t>(ceil(t + half));
    if (j0 < 0) j0 = 0;
    if (j1 > length - 1) j1 = length - 1;
    const T* row = x + r * length;
    double acc = 0.0;
    for (index_t j = j0; j <= j1; ++j) {
      const double tau = t - static_cast<double>(j);
      if (fabs(tau) >= half) continue;
      const double u = tau / half;
      const double z = cutoff * tau;
      const double sinc = z == 0.0 ? 1.0 : sinpi(z) / (pi * z);
      acc += static_cast<double>(row[j]) * sinc * cyl_bessel_i0(beta * sqrt(1.0 - u * u));
    }
    out[i] = static_cast<T>(acc * norm);
  }
}

}  // namespace audio
}  // namespace pygpukit

#define PYGPUKIT_AUDIO_RESAMPLE_ENTRIES(T, SUFFIX)                                                        \
  extern "C" __global__ void resample_poly_##SUFFIX(                                                      \
      const void* x, const void* table, void* out, long long rows, long long length, long long out_len,   \
      long long up, long long down, int taps, long long left) {                                           \
    pygpukit::audio::resample_poly<T>(static_cast<const T*>(x), static_cast<const T*>(table),             \
                                      static_cast<T*>(out), rows, length, out_len, up, down, taps, left); \
  }

#define PYGPUKIT_AUDIO_RESAMPLE_DIRECT(T, SUFFIX)                                                     \
  extern "C" __global__ void resample_direct_##SUFFIX(                                                \
      void const* x, void* out, long long rows, long long length, long long out_len, double step,     \
      double cutoff, double half, double beta, double gain) {                                         \
    pygpukit::audio::resample_direct<T>(static_cast<const T*>(x), static_cast<T*>(out), rows, length, \
                                        out_len, step, cutoff, half, beta, gain);                     \
  }

PYGPUKIT_AUDIO_RESAMPLE_DIRECT(float, f32)
PYGPUKIT_AUDIO_RESAMPLE_DIRECT(double, f64)
#undef PYGPUKIT_AUDIO_RESAMPLE_DIRECT
PYGPUKIT_AUDIO_RESAMPLE_ENTRIES(float, f32)
PYGPUKIT_AUDIO_RESAMPLE_ENTRIES(double, f64)
#undef PYGPUKIT_AUDIO_RESAMPLE_ENTRIES
