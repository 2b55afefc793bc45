// Music kernels of pygpukit.audio (pygpukit/audio/decompose.py, music.py, constantq.py): the median filters
// and soft masks of harmonic-percussive separation, the sorted-band statistics of spectral contrast, the
// per-frame normalisation of chroma, and the stacking of constant-Q octaves.
//
// Arrays are dense; an element's neighbours along the filtered axis are `stride` elements apart and the
// axis has `len` entries, so element i sits at position (i / stride) % len of that axis. The median takes
// the value whose stable rank in its window (smaller values plus equal values before it: its index in a
// stable sort) is k // 2, so ties give scipy's result exactly; spectral contrast sorts each band in shared
// memory (a bitonic sort), whose sums do not depend on the order of ties.
#include "complex.cuh"

namespace pygpukit {
namespace audio {

// scipy.ndimage's "reflect" (numpy.pad's "symmetric"): d c b a | a b c d | d c b a.
__device__ __forceinline__ index_t reflect_index(index_t t, index_t n) {
  if (t >= 0 && t < n) return t;
  const index_t period = 2 * n;
  index_t m = t % period;
  if (m < 0) m += period;
  return m < n ? m : period - 1 - m;
}

// scipy.ndimage.median_filter(x, size=k, mode="reflect") along one axis: the value of rank k // 2 among
// positions p - k // 2 .. p - k // 2 + k - 1.
template <typename T>
__device__ void median_filter(const T* __restrict__ x, T* __restrict__ out, index_t n, index_t stride,
                              index_t len, int k) {
  const int half = k / 2;
  for (index_t i = blockIdx.x * (index_t)blockDim.x + threadIdx.x; i < n;
       i += (index_t)gridDim.x * blockDim.x) {
    const index_t pos = (i / stride) % len;
    const T* base = x + (i - pos * stride);
    T found = x[i];
    for (int a = 0; a < k; ++a) {
      const T va = base[reflect_index(pos - half + a, len) * stride];
      int rank = 0;
      for (int b = 0; b < k; ++b) {
        const T vb = base[reflect_index(pos - half + b, len) * stride];
        rank += (vb < va) || (vb == va && b < a);
      }
      if (rank == half) {
        found = va;
        break;
      }
    }
    out[i] = found;
  }
}

// librosa.util.softmask(X, X_ref, power, split_zeros) in double.
__device__ __forceinline__ double softmask(double X, double ref, double power, int split_zeros, double tiny) {
  if (isinf(power)) return X > ref ? 1.0 : 0.0;
  const double z = fmax(X, ref);
  if (z < tiny) return split_zeros ? 0.5 : 0.0;
  const double m = pow(X / z, power);
  const double r = pow(ref / z, power);
  return m / (m + r);
}

// The masks of librosa.decompose.hpss from the magnitude S and its median filters harm and perc.
// mode 0: the masks; mode 1: S * mask (real S); mode 2: D * mask for the complex spectrogram D.
template <typename T>
__device__ void hpss_mask(const T* __restrict__ s, const T* __restrict__ harm, const T* __restrict__ perc,
                          const Cx<T>* __restrict__ d, T* __restrict__ out_h, T* __restrict__ out_p,
                          index_t n, double margin_h, double margin_p, double power, int split_zeros,
                          int mode, double tiny) {
  for (index_t i = blockIdx.x * (index_t)blockDim.x + threadIdx.x; i < n;
       i += (index_t)gridDim.x * blockDim.x) {
    const double h = static_cast<double>(harm[i]);
    const double p = static_cast<double>(perc[i]);
    const double mh = softmask(h, p * margin_h, power, split_zeros, tiny);
    const double mp = softmask(p, h * margin_p, power, split_zeros, tiny);
    if (mode == 0) {
      out_h[i] = static_cast<T>(mh);
      out_p[i] = static_cast<T>(mp);
    } else if (mode == 1) {
      const double v = static_cast<double>(s[i]);
      out_h[i] = static_cast<T>(v * mh);
      out_p[i] = static_cast<T>(v * mp);
    } else {
      const Cx<T> v = d[i];
      reinterpret_cast<Cx<T>*>(out_h)[i] = cx<T>(static_cast<T>(v.re * mh), static_cast<T>(v.im * mh));
      reinterpret_cast<Cx<T>*>(out_p)[i] = cx<T>(static_cast<T>(v.re * mp), static_cast<T>(v.im * mp));
    }
  }
}

// Spectral contrast: block (frame, band, row) sorts the band's bins of one frame (a bitonic sort in shared
// memory, padded with +infinity to `padded`, a power of two) and writes the means of its `count` smallest
// (valley) and largest (peak) values. bands holds (first bin, number of bins, count) per band. S element
// (r, f, t) is at r*s_row + f*s_freq + t*s_frame; the outputs are (rows, n_bands, n_frames) contiguous.
template <typename T>
__device__ void band_contrast(const T* __restrict__ s, const T* __restrict__ bands, T* __restrict__ peak,
                              T* __restrict__ valley, index_t n_frames, int n_bands, index_t s_row,
                              index_t s_freq, index_t s_frame) {
  extern __shared__ unsigned char shared_raw[];
  T* values = reinterpret_cast<T*>(shared_raw);
  __shared__ double sums[2][32];
  const index_t t = blockIdx.x;
  const int band = blockIdx.y;
  const index_t r = blockIdx.z;
  const int first = static_cast<int>(bands[3 * band]);
  const int len = static_cast<int>(bands[3 * band + 1]);
  int count = static_cast<int>(bands[3 * band + 2]);
  if (count > len) count = len;
  int padded = 1;
  while (padded < len) padded <<= 1;
  const T* col = s + r * s_row + t * s_frame;
  for (int j = threadIdx.x; j < padded; j += blockDim.x)
    values[j] =
        j < len ? col[(first + j) * s_freq] : static_cast<T>(__longlong_as_double(0x7ff0000000000000LL));
  __syncthreads();
  for (int k = 2; k <= padded; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < padded; i += blockDim.x) {
        const int partner = i ^ j;
        if (partner > i) {
          const T a = values[i], b = values[partner];
          const bool ascending = (i & k) == 0;
          if ((a > b) == ascending) {
            values[i] = b;
            values[partner] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  double low = 0.0, high = 0.0;
  for (int a = threadIdx.x; a < len; a += blockDim.x) {
    const double v = static_cast<double>(values[a]);
    if (a < count) low += v;
    if (a >= len - count) high += v;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    low += __shfl_xor_sync(0xffffffffu, low, offset);
    high += __shfl_xor_sync(0xffffffffu, high, offset);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sums[0][warp] = low;
    sums[1][warp] = high;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double lo = 0.0, hi = 0.0;
    for (int w = 0; w < (int)(blockDim.x + 31) / 32; ++w) {
      lo += sums[0][w];
      hi += sums[1][w];
    }
    const index_t o = (r * n_bands + band) * n_frames + t;
    valley[o] = static_cast<T>(lo / count);
    peak[o] = static_cast<T>(hi / count);
  }
}

// librosa.util.normalize along contiguous rows of `width` values (norm_code 0: max |x|, 1: sum |x|, 2: the
// Euclidean norm, 3: (sum |x|^p)^(1/p)); values below `floor` become 0 first (chroma_cqt's threshold, when
// floor > 0); rows whose norm is below `tiny` are left as they are (divided by 1), as librosa's fill=None.
template <typename T>
__device__ void normalize_rows(const T* __restrict__ x, T* __restrict__ out, index_t rows, int width,
                               int norm_code, double p, double floor, double tiny) {
  for (index_t r = blockIdx.x * (index_t)blockDim.x + threadIdx.x; r < rows;
       r += (index_t)gridDim.x * blockDim.x) {
    const T* row = x + r * width;
    double length = 0.0;
    for (int j = 0; j < width; ++j) {
      double v = static_cast<double>(row[j]);
      if (floor > 0.0 && v < floor) v = 0.0;
      const double a = fabs(v);
      if (norm_code == 0)
        length = fmax(length, a);
      else if (norm_code == 1)
        length += a;
      else if (norm_code == 2)
        length += a * a;
      else
        length += pow(a, p);
    }
    if (norm_code == 2)
      length = sqrt(length);
    else if (norm_code == 3)
      length = pow(length, 1.0 / p);
    if (length < tiny) length = 1.0;
    for (int j = 0; j < width; ++j) {
      double v = static_cast<double>(row[j]);
      if (floor > 0.0 && v < floor) v = 0.0;
      out[r * width + j] = static_cast<T>(v / length);
    }
  }
}

// dst[g, t, dst_off + j] = src[g, t, src_off + j] for g < groups, t < n_frames, j < width: one octave of a
// constant-Q transform (frame-major, complex values counted as two) copied into the stacked result.
template <typename T>
__device__ void stack_block(const T* __restrict__ src, T* __restrict__ dst, index_t groups, index_t n_frames,
                            index_t src_frames, index_t src_width, index_t dst_width, index_t src_off,
                            index_t dst_off, index_t width) {
  const index_t n = groups * n_frames * width;
  for (index_t i = blockIdx.x * (index_t)blockDim.x + threadIdx.x; i < n;
       i += (index_t)gridDim.x * blockDim.x) {
    const index_t j = i % width;
    const index_t t = (i / width) % n_frames;
    const index_t g = i / (width * n_frames);
    dst[(g * n_frames + t) * dst_width + dst_off + j] = src[(g * src_frames + t) * src_width + src_off + j];
  }
}

// The spectrum scipy.signal.resample keeps when it shortens rows of n_in samples to n_out: the first
// dst_bins = n_out // 2 + 1 of the src_bins complex values of each row, times `scale`, with the unpaired bin
// (index `doubled`, or -1 for none) doubled.
template <typename T>
__device__ void spectrum_crop(const Cx<T>* __restrict__ src, Cx<T>* __restrict__ dst, index_t rows,
                              index_t src_bins, index_t dst_bins, double scale, index_t doubled) {
  const index_t n = rows * dst_bins;
  for (index_t i = blockIdx.x * (index_t)blockDim.x + threadIdx.x; i < n;
       i += (index_t)gridDim.x * blockDim.x) {
    const index_t k = i % dst_bins;
    const Cx<T> v = src[(i / dst_bins) * src_bins + k];
    const double f = k == doubled ? 2.0 * scale : scale;
    dst[i] = cx<T>(static_cast<T>(v.re * f), static_cast<T>(v.im * f));
  }
}

}  // namespace audio
}  // namespace pygpukit

#define PYGPUKIT_AUDIO_MUSIC_ENTRIES(T, SUFFIX)                                                              \
  extern "C" __global__ void median_filter_##SUFFIX(const void* x, void* out, long long n, long long stride, \
                                                    long long len, int k) {                                  \
    pygpukit::audio::median_filter<T>(static_cast<const T*>(x), static_cast<T*>(out), n, stride, len, k);    \
  }                                                                                                          \
  extern "C" __global__ void hpss_mask_##SUFFIX(                                                             \
      const void* s, const void* harm, const void* perc, const void* d, void* out_h, void* out_p,            \
      long long n, double margin_h, double margin_p, double power, int split_zeros, int mode, double tiny) { \
    pygpukit::audio::hpss_mask<T>(                                                                           \
        static_cast<const T*>(s), static_cast<const T*>(harm), static_cast<const T*>(perc),                  \
        static_cast<const pygpukit::audio::Cx<T>*>(d), static_cast<T*>(out_h), static_cast<T*>(out_p), n,    \
        margin_h, margin_p, power, split_zeros, mode, tiny);                                                 \
  }                                                                                                          \
  extern "C" __global__ void band_contrast_##SUFFIX(const void* s, const void* bands, void* peak,            \
                                                    void* valley, long long n_frames, int n_bands,           \
                                                    long long s_row, long long s_freq, long long s_frame) {  \
    pygpukit::audio::band_contrast<T>(static_cast<const T*>(s), static_cast<const T*>(bands),                \
                                      static_cast<T*>(peak), static_cast<T*>(valley), n_frames, n_bands,     \
                                      s_row, s_freq, s_frame);                                               \
  }                                                                                                          \
  extern "C" __global__ void normalize_rows_##SUFFIX(const void* x, void* out, long long rows, int width,    \
                                                     int norm_code, double p, double floor, double tiny) {   \
    pygpukit::audio::normalize_rows<T>(static_cast<const T*>(x), static_cast<T*>(out), rows, width,          \
                                       norm_code, p, floor, tiny);                                           \
  }                                                                                                          \
  extern "C" __global__ void stack_block_##SUFFIX(                                                           \
      const void* src, void* dst, long long groups, long long n_frames, long long src_frames,                \
      long long src_width, long long dst_width, long long src_off, long long dst_off, long long width) {     \
    pygpukit::audio::stack_block<T>(static_cast<const T*>(src), static_cast<T*>(dst), groups, n_frames,      \
                                    src_frames, src_width, dst_width, src_off, dst_off, width);              \
  }                                                                                                          \
  extern "C" __global__ void spectrum_crop_##SUFFIX(const void* src, void* dst, long long rows,              \
                                                    long long src_bins, long long dst_bins, double scale,    \
                                                    long long doubled) {                                     \
    pygpukit::audio::spectrum_crop<T>(static_cast<const pygpukit::audio::Cx<T>*>(src),                       \
                                      static_cast<pygpukit::audio::Cx<T>*>(dst), rows, src_bins, dst_bins,   \
                                      scale, doubled);                                                       \
  }

PYGPUKIT_AUDIO_MUSIC_ENTRIES(float, f32)
PYGPUKIT_AUDIO_MUSIC_ENTRIES(double, f64)
#undef PYGPUKIT_AUDIO_MUSIC_ENTRIES
