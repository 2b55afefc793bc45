// Spectral kernels of pygpukit.audio (pygpukit/audio/spectral.py, features.py, effects.py): framing and
// windowing for the STFT, overlap-add for the ISTFT, power spectra, decibels, per-frame spectral statistics,
// RMS and zero crossings, pre- and de-emphasis, Savitzky-Golay deltas, and the finiteness check of inputs.
//
// Signals are rows of T samples (row r starts at r * x_row, unit stride). Frame f of a row covers padded
// positions f * hop + j, j < frame length; padded position p reads sample p - pad_left, and positions
// outside [0, T) follow codes::PadMode (numpy.pad's constant, reflect, edge, symmetric and wrap).
// Per-frame reductions use one warp per frame and sum in the element type's precision (float32 for float32
// signals, as librosa does on float32 arrays).
#include "complex.cuh"
#include "padding.cuh"

namespace pygpukit {
namespace audio {

constexpr int kWarp = 32;

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

template <typename T>
__device__ __forceinline__ T warp_max(T v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// -- finiteness
// ---------------------------------------------------------------------------------------------------
template <typename T>
__device__ void count_nonfinite(const T* __restrict__ x, index_t n, unsigned long long* __restrict__ count) {
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  unsigned long long mine = 0;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    mine += isfinite(x[i]) ? 0ull : 1ull;
  }
  if (mine) atomicAdd(count, mine);
}

// -- STFT framing: out[r, f, j] = window[j] * padded(x_r, f * hop + j - pad_left), out contiguous
// ---------------
template <typename T>
__device__ void frame_signal(const T* __restrict__ x, T* __restrict__ out, const T* __restrict__ window,
                             index_t rows, index_t length, index_t x_row, index_t n_frames, int frame_length,
                             int hop, index_t pad_left, int pad_mode) {
  const index_t per_row = n_frames * frame_length;
  const index_t total = rows * per_row;
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const index_t r = i / per_row;
    const index_t rest = i - r * per_row;
    const index_t f = rest / frame_length;
    const int j = static_cast<int>(rest - f * frame_length);
    T v = padded(x + r * x_row, f * hop + j - pad_left, length, pad_mode);
    if (window) v *= window[j];
    out[i] = v;
  }
}

// -- ISTFT overlap-add: out[r, t] = sum_f w[p - f hop] frames[r, f, p - f hop] / sum_f w[p - f hop]^2 with
// p = t + start, over frames f < n_frames covering p; the division only where the sum of squares exceeds
// `tiny` (librosa's window_sumsquare normalisation). frames contiguous (rows, n_frames, frame_length).
template <typename T>
__device__ void overlap_add(const T* __restrict__ frames, const T* __restrict__ window, T* __restrict__ out,
                            index_t rows, index_t n_frames, int frame_length, int hop, index_t start,
                            index_t out_len, double tiny) {
  const index_t total = rows * out_len;
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const index_t r = i / out_len;
    const index_t p = i - r * out_len + start;
    index_t f_hi = p / hop;
    if (f_hi > n_frames - 1) f_hi = n_frames - 1;
    index_t f_lo = p - frame_length + 1;
    f_lo = f_lo <= 0 ? 0 : (f_lo + hop - 1) / hop;
    T acc = T(0);
    T wss = T(0);
    const T* base = frames + r * n_frames * frame_length;
    for (index_t f = f_lo; f <= f_hi; ++f) {
      const int j = static_cast<int>(p - f * hop);
      const T w = window[j];
      acc += w * base[f * frame_length + j];
      wss += w * w;
    }
    out[i] = wss > static_cast<T>(tiny) ? acc / wss : acc;
  }
}

// -- |S|^power of contiguous complex values
// -----------------------------------------------------------------------
template <typename T>
__device__ void spectrum_power(const Cx<T>* __restrict__ s, T* __restrict__ out, index_t n, double power) {
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  const T p = static_cast<T>(power);
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const T m2 = norm2(s[i]);
    out[i] = power == 2.0 ? m2 : power == 1.0 ? sqrt(m2) : pow(m2, p / T(2));
  }
}

// -- decibels: 10 log10(max(amin, x)) - 10 log10(max(amin, ref)), floored at (its maximum - top_db) when
// top_db >= 0. ref is *ref_ptr when given (the input's maximum, ref="max"), else ref_value; *max_ptr is the
// input's maximum (top_db).
// -------------------------------------------------------------------------------------
template <typename T>
__device__ void apply_scale_db(const T* __restrict__ x, T* __restrict__ out, index_t n, double amin,
                               double ref_value, const T* __restrict__ ref_ptr, double top_db,
                               const T* __restrict__ max_ptr) {
  const T a = static_cast<T>(amin);
  const T ref = ref_ptr ? *ref_ptr : static_cast<T>(ref_value);
  const T ref_db = T(10) * log10(max(a, ref));
  const T floor_db = top_db >= 0.0 ? T(10) * log10(max(a, *max_ptr)) - ref_db - static_cast<T>(top_db) : T(0);
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    T v = T(10) * log10(max(a, x[i])) - ref_db;
    if (top_db >= 0.0) v = max(v, floor_db);
    out[i] = v;
  }
}

// -- per-frame spectral statistics over n_freq bins (one warp per frame)
// -------------------------------------------- Frame row r = (outer r / inner, inner r % inner) starts at
// that pair's offsets; bins at stride s_elem. mode 0 centroid, 1 bandwidth (p = param; normalise when norm),
// 2 rolloff (param = roll percent), 3 flatness (p = power, param = amin), 4 rms from a magnitude spectrogram
// (param = frame length).
template <typename T>
__device__ void spectral_moments(const T* __restrict__ s, const T* __restrict__ freq, T* __restrict__ out,
                                 index_t rows, index_t inner, index_t s_outer, index_t s_inner,
                                 index_t s_elem, int n_freq, int mode, double p, double param, int norm,
                                 double tiny) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const index_t warps = static_cast<index_t>(gridDim.x) * (blockDim.x / kWarp);
  for (index_t r = static_cast<index_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp; r < rows;
       r += warps) {
    const T* row = s + (r / inner) * s_outer + (r % inner) * s_inner;
    T result = T(0);
    if (mode == 0 || mode == 1) {
      T total = T(0);
      T weighted = T(0);
      for (int k = lane; k < n_freq; k += kWarp) {
        const T v = row[k * s_elem];
        total += abs(v);
        weighted += freq[k] * v;
      }
      total = warp_sum(total);
      weighted = warp_sum(weighted);
      const T div = total < static_cast<T>(tiny) ? T(1) : total;
      const T centroid = weighted / div;
      result = centroid;
      if (mode == 1) {
        const T pp = static_cast<T>(p);
        const T scale = norm ? div : T(1);
        T acc = T(0);
        for (int k = lane; k < n_freq; k += kWarp) {
          const T dev = abs(freq[k] - centroid);
          const T powered = pp == T(2) ? dev * dev : pp == T(1) ? dev : pow(dev, pp);
          acc += row[k * s_elem] / scale * powered;
        }
        acc = warp_sum(acc);
        result = pp == T(2) ? sqrt(acc) : pp == T(1) ? acc : pow(acc, T(1) / pp);
      }
    } else if (mode == 2) {
      T total = T(0);
      for (int k = lane; k < n_freq; k += kWarp) total += row[k * s_elem];
      total = warp_sum(total);
      const T threshold = static_cast<T>(param) * total;
      // The first bin whose cumulative energy reaches the threshold, chunk by chunk of 32 bins.
      T carry = T(0);
      int found = n_freq - 1;
      for (int k0 = 0; k0 < n_freq; k0 += kWarp) {
        const int k = k0 + lane;
        T v = k < n_freq ? row[k * s_elem] : T(0);
#pragma unroll
        for (int offset = 1; offset < kWarp; offset *= 2) {
          const T up = __shfl_up_sync(0xffffffffu, v, offset);
          if (lane >= offset) v += up;
        }
        const T cumulative = carry + v;
        const unsigned hit = __ballot_sync(0xffffffffu, k < n_freq && cumulative >= threshold);
        if (hit) {
          found = k0 + __ffs(hit) - 1;
          break;
        }
        carry += __shfl_sync(0xffffffffu, v, kWarp - 1);
      }
      result = freq[found];
    } else if (mode == 3) {
      const T amin = static_cast<T>(param);
      const T pp = static_cast<T>(p);
      T logs = T(0);
      T sum = T(0);
      for (int k = lane; k < n_freq; k += kWarp) {
        const T v = row[k * s_elem];
        const T powered = pp == T(2) ? v * v : pp == T(1) ? v : pow(v, pp);
        const T clipped = max(amin, powered);
        logs += log(clipped);
        sum += clipped;
      }
      logs = warp_sum(logs);
      sum = warp_sum(sum);
      result = exp(logs / T(n_freq)) / (sum / T(n_freq));
    } else {  // mode 4: rms from a magnitude spectrogram
      const int frame_length = static_cast<int>(param);
      T acc = T(0);
      for (int k = lane; k < n_freq; k += kWarp) {
        const T v = row[k * s_elem];
        T x2 = v * v;
        if (k == 0 || (k == n_freq - 1 && frame_length % 2 == 0)) x2 *= T(0.5);
        acc += x2;
      }
      acc = warp_sum(acc);
      result = sqrt(T(2) * acc / (T(frame_length) * T(frame_length)));
    }
    if (lane == 0) out[r] = result;
  }
}

// -- frame RMS and zero crossings of a signal (one warp per frame; out contiguous (rows, n_frames))
// -----------------
template <typename T>
__device__ void frame_rms(const T* __restrict__ x, T* __restrict__ out, index_t rows, index_t length,
                          index_t x_row, index_t n_frames, int frame_length, int hop, index_t pad_left,
                          int pad_mode) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const index_t warps = static_cast<index_t>(gridDim.x) * (blockDim.x / kWarp);
  const index_t total = rows * n_frames;
  for (index_t w = static_cast<index_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp; w < total;
       w += warps) {
    const index_t r = w / n_frames;
    const index_t f = w - r * n_frames;
    const T* row = x + r * x_row;
    T acc = T(0);
    for (int j = lane; j < frame_length; j += kWarp) {
      const T v = padded(row, f * hop + j - pad_left, length, pad_mode);
      acc += v * v;
    }
    acc = warp_sum(acc);
    if (lane == 0) out[w] = sqrt(acc / T(frame_length));
  }
}

// Crossings between samples j - 1 and j of a frame (edge padding), samples with |v| <= threshold taken as 0;
// the sign is the sign bit (zero_pos: 0 counts as positive) or sign(v) in {-1, 0, 1}. out = crossings /
// length.
template <typename T>
__device__ __forceinline__ int sign_class(T v, T threshold, int zero_pos) {
  if (threshold > T(0) && abs(v) <= threshold) v = T(0);
  if (zero_pos) return signbit(v) ? 1 : 0;
  return v > T(0) ? 1 : v < T(0) ? -1 : 0;
}

template <typename T>
__device__ void zero_crossings(const T* __restrict__ x, T* __restrict__ out, index_t rows, index_t length,
                               index_t x_row, index_t n_frames, int frame_length, int hop, index_t pad_left,
                               int pad_mode, double threshold, int zero_pos) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const index_t warps = static_cast<index_t>(gridDim.x) * (blockDim.x / kWarp);
  const index_t total = rows * n_frames;
  const T thr = static_cast<T>(threshold);
  for (index_t w = static_cast<index_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp; w < total;
       w += warps) {
    const index_t r = w / n_frames;
    const index_t f = w - r * n_frames;
    const T* row = x + r * x_row;
    const index_t first = f * hop - pad_left;
    int count = 0;
    for (int j = 1 + lane; j < frame_length; j += kWarp) {
      const int a = sign_class(padded(row, first + j - 1, length, pad_mode), thr, zero_pos);
      const int b = sign_class(padded(row, first + j, length, pad_mode), thr, zero_pos);
      count += a != b ? 1 : 0;
    }
#pragma unroll
    for (int offset = kWarp / 2; offset > 0; offset /= 2)
      count += __shfl_xor_sync(0xffffffffu, count, offset);
    if (lane == 0) out[w] = static_cast<T>(count) / static_cast<T>(frame_length);
  }
}

// -- pre-emphasis: y[0] = x[0] + zi, y[t] = x[t] - coef x[t - 1] (scipy.signal.lfilter([1, -coef], [1]) with
// initial state zi; zi of row r is zi_ptr[r], or 2 x[0] - x[1] (librosa's default) when zi_ptr is null)
// ----------
template <typename T>
__device__ void preemphasis(const T* __restrict__ x, T* __restrict__ out, index_t rows, index_t length,
                            double coef, const T* __restrict__ zi) {
  const index_t total = rows * length;
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  const T c = static_cast<T>(coef);
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const index_t r = i / length;
    const index_t t = i - r * length;
    const T* row = x + r * length;
    T v;
    if (t > 0) {
      v = row[t] - c * row[t - 1];
    } else {
      const T z = zi ? zi[r] : (length > 1 ? T(2) * row[0] - row[1] : row[0]);
      v = row[0] + z;
    }
    out[i] = v;
  }
}

// -- de-emphasis: y[t] = x[t] + coef y[t - 1] with y[0] = x[0] + init (scipy.signal.lfilter([1], [1, -coef])
// with initial state init): y = y0 + init coef^t, y0 the zero-state output. init = zi[r], or librosa's
// -((2 - coef) x[0] - x[1]) / (3 - coef) when default_zi. zf[r] (when zf is given) = coef times the last
// output of the filter librosa runs: y0 with the default, y with a given zi. One block per row, tiles of
// kScanThreads * kChunk samples: each thread runs the recurrence over its kChunk samples from zero, an
// inclusive block scan joins the chunks (S_t = sum_(s <= t) e_s M^(t - s), M = coef^kChunk) and each sample
// adds the carry into its chunk times coef^(k + 1).
// ----------------------------------------------------------------------
constexpr int kChunk = 8;
constexpr int kScanThreads = 256;

template <typename T>
__device__ void deemphasis(const T* __restrict__ x, T* __restrict__ out, T* __restrict__ zf, index_t rows,
                           index_t length, double coef, const T* __restrict__ zi, int default_zi) {
  __shared__ T scan[kScanThreads];
  __shared__ T tile_carry;
  const T c = static_cast<T>(coef);
  const int tid = static_cast<int>(threadIdx.x);
  const T m = pow(c, static_cast<T>(kChunk));
  const T m_before = pow(c, static_cast<T>(kChunk * tid));          // M^tid
  const T m_block = pow(c, static_cast<T>(kChunk * kScanThreads));  // M^threads
  for (index_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = x + r * length;
    T* dst = out + r * length;
    if (tid == 0) tile_carry = T(0);  // y0 just before the tile
    __syncthreads();
    const index_t tile = static_cast<index_t>(kScanThreads) * kChunk;
    for (index_t start = 0; start < length; start += tile) {
      const index_t first = start + static_cast<index_t>(tid) * kChunk;
      T local[kChunk];
      T acc = T(0);
#pragma unroll
      for (int k = 0; k < kChunk; ++k) {
        const index_t t = first + k;
        acc = (t < length ? row[t] : T(0)) + c * acc;
        local[k] = acc;
      }
      scan[tid] = acc;
      __syncthreads();
      T mult = m;
      for (int offset = 1; offset < kScanThreads; offset *= 2) {
        const T before = tid >= offset ? scan[tid - offset] : T(0);
        __syncthreads();
        if (tid >= offset) scan[tid] += before * mult;
        __syncthreads();
        mult *= mult;
      }
      const T incoming = tile_carry;
      const T carry = (tid > 0 ? scan[tid - 1] : T(0)) + incoming * m_before;
      T factor = c;
#pragma unroll
      for (int k = 0; k < kChunk; ++k) {
        const index_t t = first + k;
        if (t < length) dst[t] = local[k] + carry * factor;
        factor *= c;
      }
      __syncthreads();
      if (tid == 0) tile_carry = scan[kScanThreads - 1] + incoming * m_block;
      __syncthreads();
    }
    T init = zi ? zi[r] : T(0);
    if (default_zi) init = -((T(2) - c) * row[0] - (length > 1 ? row[1] : T(0))) / (T(3) - c);
    if (tid == 0 && zf) {
      const T last = dst[length - 1];
      zf[r] = c * (default_zi ? last : last + init * pow(c, static_cast<T>(length - 1)));
    }
    __syncthreads();
    for (index_t t = tid; t < length; t += kScanThreads) dst[t] += init * pow(c, static_cast<T>(t));
    __syncthreads();
  }
}

// -- Savitzky-Golay derivative along rows (librosa.feature.delta, mode "interp"): coefs = [center (width),
// left (half x width), right (half x width)]; outputs t < half fit the first `width` samples, t >= length -
// half the last `width`, the rest the centred window. Row r = (r / inner, r % inner) with strides; out
// contiguous. ----
template <typename T>
__device__ void savgol_delta(const T* __restrict__ x, T* __restrict__ out, const T* __restrict__ coefs,
                             index_t rows, index_t inner, index_t x_outer, index_t x_inner, index_t x_elem,
                             index_t length, int width) {
  const int half = width / 2;
  const index_t total = rows * length;
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const index_t r = i / length;
    const index_t t = i - r * length;
    const T* row = x + (r / inner) * x_outer + (r % inner) * x_inner;
    const T* c;
    index_t first;
    if (t < half) {
      c = coefs + width + t * width;
      first = 0;
    } else if (t >= length - half) {
      c = coefs + width + (half + (t - (length - half))) * width;
      first = length - width;
    } else {
      c = coefs;
      first = t - half;
    }
    T acc = T(0);
    for (int k = 0; k < width; ++k) acc += c[k] * row[(first + k) * x_elem];
    out[i] = acc;
  }
}

}  // namespace audio
}  // namespace pygpukit

#define PYGPUKIT_AUDIO_SPECTRAL_ENTRIES(T, SUFFIX)                                                           \
  extern "C" __global__ void count_nonfinite_##SUFFIX(const void* x, long long n, void* count) {             \
    pygpukit::audio::count_nonfinite<T>(static_cast<const T*>(x), n,                                         \
                                        static_cast<unsigned long long*>(count));                            \
  }                                                                                                          \
  extern "C" __global__ void frame_signal_##SUFFIX(                                                          \
      const void* x, void* out, const void* window, long long rows, long long length, long long x_row,       \
      long long n_frames, int frame_length, int hop, long long pad_left, int pad_mode) {                     \
    pygpukit::audio::frame_signal<T>(static_cast<const T*>(x), static_cast<T*>(out),                         \
                                     static_cast<const T*>(window), rows, length, x_row, n_frames,           \
                                     frame_length, hop, pad_left, pad_mode);                                 \
  }                                                                                                          \
  extern "C" __global__ void overlap_add_##SUFFIX(                                                           \
      const void* frames, const void* window, void* out, long long rows, long long n_frames,                 \
      int frame_length, int hop, long long start, long long out_len, double tiny) {                          \
    pygpukit::audio::overlap_add<T>(static_cast<const T*>(frames), static_cast<const T*>(window),            \
                                    static_cast<T*>(out), rows, n_frames, frame_length, hop, start, out_len, \
                                    tiny);                                                                   \
  }                                                                                                          \
  extern "C" __global__ void spectrum_power_##SUFFIX(const void* s, void* out, long long n, double power) {  \
    pygpukit::audio::spectrum_power<T>(static_cast<const pygpukit::audio::Cx<T>*>(s), static_cast<T*>(out),  \
                                       n, power);                                                            \
  }                                                                                                          \
  extern "C" __global__ void apply_scale_db_##SUFFIX(const void* x, void* out, long long n, double amin,     \
                                                     double ref_value, const void* ref_ptr, double top_db,   \
                                                     const void* max_ptr) {                                  \
    pygpukit::audio::apply_scale_db<T>(static_cast<const T*>(x), static_cast<T*>(out), n, amin, ref_value,   \
                                       static_cast<const T*>(ref_ptr), top_db,                               \
                                       static_cast<const T*>(max_ptr));                                      \
  }                                                                                                          \
  extern "C" __global__ void spectral_moments_##SUFFIX(                                                      \
      const void* s, const void* freq, void* out, long long rows, long long inner, long long s_outer,        \
      long long s_inner, long long s_elem, int n_freq, int mode, double p, double param, int norm,           \
      double tiny) {                                                                                         \
    pygpukit::audio::spectral_moments<T>(static_cast<const T*>(s), static_cast<const T*>(freq),              \
                                         static_cast<T*>(out), rows, inner, s_outer, s_inner, s_elem,        \
                                         n_freq, mode, p, param, norm, tiny);                                \
  }                                                                                                          \
  extern "C" __global__ void frame_rms_##SUFFIX(const void* x, void* out, long long rows, long long length,  \
                                                long long x_row, long long n_frames, int frame_length,       \
                                                int hop, long long pad_left, int pad_mode) {                 \
    pygpukit::audio::frame_rms<T>(static_cast<const T*>(x), static_cast<T*>(out), rows, length, x_row,       \
                                  n_frames, frame_length, hop, pad_left, pad_mode);                          \
  }                                                                                                          \
  extern "C" __global__ void zero_crossings_##SUFFIX(                                                        \
      const void* x, void* out, long long rows, long long length, long long x_row, long long n_frames,       \
      int frame_length, int hop, long long pad_left, int pad_mode, double threshold, int zero_pos) {         \
    pygpukit::audio::zero_crossings<T>(static_cast<const T*>(x), static_cast<T*>(out), rows, length, x_row,  \
                                       n_frames, frame_length, hop, pad_left, pad_mode, threshold,           \
                                       zero_pos);                                                            \
  }                                                                                                          \
  extern "C" __global__ void preemphasis_##SUFFIX(const void* x, void* out, long long rows,                  \
                                                  long long length, double coef, const void* zi) {           \
    pygpukit::audio::preemphasis<T>(static_cast<const T*>(x), static_cast<T*>(out), rows, length, coef,      \
                                    static_cast<const T*>(zi));                                              \
  }                                                                                                          \
  extern "C" __global__ void deemphasis_##SUFFIX(const void* x, void* out, void* zf, long long rows,         \
                                                 long long length, double coef, const void* zi,              \
                                                 int default_zi) {                                           \
    pygpukit::audio::deemphasis<T>(static_cast<const T*>(x), static_cast<T*>(out), static_cast<T*>(zf),      \
                                   rows, length, coef, static_cast<const T*>(zi), default_zi);               \
  }                                                                                                          \
  extern "C" __global__ void savgol_delta_##SUFFIX(                                                          \
      const void* x, void* out, const void* coefs, long long rows, long long inner, long long x_outer,       \
      long long x_inner, long long x_elem, long long length, int width) {                                    \
    pygpukit::audio::savgol_delta<T>(static_cast<const T*>(x), static_cast<T*>(out),                         \
                                     static_cast<const T*>(coefs), rows, inner, x_outer, x_inner, x_elem,    \
                                     length, width);                                                         \
  }

PYGPUKIT_AUDIO_SPECTRAL_ENTRIES(float, f32)
PYGPUKIT_AUDIO_SPECTRAL_ENTRIES(double, f64)
#undef PYGPUKIT_AUDIO_SPECTRAL_ENTRIES
