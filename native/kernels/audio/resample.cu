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

// resample_tile: the same sums, each block computing R * span_up consecutive outputs of one row (span_up = s
// * L, a multiple of L, so output q + span_up * m of the tile has the phase of output q and its input window
// starts span_down = s * M samples further on). The block first copies its input window (R * span_down + taps
// samples, zeros outside the row) into shared memory. Thread t then takes q = order[t] (a host-made
// permutation of the tile's q that spreads a warp's window reads over the shared-memory banks and keeps its
// phases close), computes the R outputs of that phase and reads each filter coefficient once, from the
// transposed table (taps rows of L coefficients), for R multiply-adds. Same order of summation (k ascending)
// as resample_poly, hence the same results.
template <typename T, int R>
__device__ void resample_tile(const T* __restrict__ x, const T* __restrict__ table_t,
                              const int* __restrict__ order, T* __restrict__ out, index_t rows,
                              index_t length, index_t out_len, index_t up, index_t down, int taps,
                              index_t left, index_t span_up, index_t span_down, index_t tiles) {
  extern __shared__ __align__(16) unsigned char resample_smem[];
  T* window = reinterpret_cast<T*>(resample_smem);
  const int width = static_cast<int>(R * span_down) + taps;
  const int sd = static_cast<int>(span_down);
  for (index_t b = blockIdx.x; b < rows * tiles; b += gridDim.x) {
    const index_t r = b / tiles;
    const index_t first_out = (b - r * tiles) * (R * span_up);
    const index_t base = first_out / up * down - left;  // first_out is a multiple of up
    const T* row = x + r * length;
    __syncthreads();  // the previous tile's readers are done
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
      const index_t g = base + i;
      window[i] = (g >= 0 && g < length) ? row[g] : T(0);
    }
    __syncthreads();
    for (index_t t = threadIdx.x; t < span_up; t += blockDim.x) {
      const index_t q = order[t];
      const index_t num = q * down;
      const int c = static_cast<int>(num / up);
      const T* h = table_t + (num - (num / up) * up);
      T acc[R];
#pragma unroll
      for (int m = 0; m < R; ++m) acc[m] = T(0);
      const T* w = window + c;
      for (int k = 0; k < taps; ++k, h += up) {
        const T hk = __ldg(h);
#pragma unroll
        for (int m = 0; m < R; ++m) acc[m] += hk * w[m * sd + k];
      }
      T* dst = out + r * out_len + first_out + q;
#pragma unroll
      for (int m = 0; m < R; ++m) {
        if (first_out + q + m * span_up < out_len) dst[m * span_up] = acc[m];
      }
    }
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

#define PYGPUKIT_AUDIO_RESAMPLE_ENTRIES(T, SUFFIX, R)                                                       \
  extern "C" __global__ void resample_poly_##SUFFIX(                                                        \
      const void* x, const void* table, void* out, long long rows, long long length, long long out_len,     \
      long long up, long long down, int taps, long long left) {                                             \
    pygpukit::audio::resample_poly<T>(static_cast<const T*>(x), static_cast<const T*>(table),               \
                                      static_cast<T*>(out), rows, length, out_len, up, down, taps, left);   \
  }                                                                                                         \
  extern "C" __global__ void resample_tile_##SUFFIX(                                                        \
      const void* x, const void* table_t, const int* order, void* out, long long rows, long long length,    \
      long long out_len, long long up, long long down, int taps, long long left, long long span_up,         \
      long long span_down, long long tiles) {                                                               \
    pygpukit::audio::resample_tile<T, R>(static_cast<const T*>(x), static_cast<const T*>(table_t), order,   \
                                         static_cast<T*>(out), rows, length, out_len, up, down, taps, left, \
                                         span_up, span_down, tiles);                                        \
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
// R: outputs of one phase per thread in resample_tile (resampling.py TILE_OUTPUTS).
PYGPUKIT_AUDIO_RESAMPLE_ENTRIES(float, f32, 16)
PYGPUKIT_AUDIO_RESAMPLE_ENTRIES(double, f64, 8)
#undef PYGPUKIT_AUDIO_RESAMPLE_ENTRIES
