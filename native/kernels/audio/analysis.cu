// Analysis kernels of pygpukit.audio: YIN pitch (pitch.py), the onset-strength flux (onset.py), second-order
// IIR sections and the frame gate (dynamics.py). Sums are accumulated in double for both element types.
#include "complex.cuh"

namespace pygpukit {
namespace audio {

// -- YIN: one block per frame (grid-stride over frames). frames contiguous (n, frame_length), already padded
// and framed (frame_signal). work (n, max_period + 1) doubles: first the difference function of librosa 0.11,
// d(0) = 0, d(k) = 2 (acf(0) - acf(k)) - sum_{m<k} x[m]^2 except that d(1) has no energy term (librosa
// overwrites that cumsum entry in place before reading it) (acf(k) = sum_n x[n] x[n + k]), then in place the
// cumulative mean normalised difference c(k) = d(k) / (mean_{1..k} d + tiny) for k >= min_period. Thread 0
// then picks the first trough below `threshold` (localmin: c[j] < c[j-1] and c[j] <= c[j+1], edge-padded;
// the first lag: c0 < c1), else the global minimum, refines it by librosa's parabolic shift and writes
// f0 = sr / period.
template <typename T>
__device__ void yin_frames(const T* __restrict__ frames, double* __restrict__ work, T* __restrict__ f0,
                           index_t n, int frame_length, int min_period, int max_period, double threshold,
                           double sr, double tiny) {
  const index_t lags = static_cast<index_t>(max_period) + 1;
  for (index_t fr = blockIdx.x; fr < n; fr += gridDim.x) {
    const T* x = frames + fr * frame_length;
    double* w = work + fr * lags;
    for (int k = threadIdx.x; k <= max_period; k += blockDim.x) {
      double acf0 = 0.0, acfk = 0.0, head = 0.0;
      for (int m = 0; m < frame_length; ++m) {
        const double v = static_cast<double>(x[m]);
        acf0 += v * v;
        if (m + k < frame_length) acfk += v * static_cast<double>(x[m + k]);
        if (m < k && k >= 2) head += v * v;  // librosa zeroes the k = 1 energy term (in-place cumsum)
      }
      w[k] = k == 0 ? 0.0 : 2.0 * (acf0 - acfk) - head;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      double total = 0.0;
      for (int k = 1; k <= max_period; ++k) {
        const double d = w[k];
        total += d;
        if (k >= min_period) w[k] = d / (total / k + tiny);
      }
      const double* c = w + min_period;
      const int count = max_period - min_period + 1;
      int best = -1, lowest = 0;
      for (int j = 0; j < count; ++j) {
        if (c[j] < c[lowest]) lowest = j;
        bool trough;
        if (j == 0) {
          trough = c[0] < c[1];
        } else if (j == count - 1) {
          trough = c[j] < c[j - 1];  // librosa's localmin pads by the edge value
        } else {
          trough = c[j] < c[j - 1] && c[j] <= c[j + 1];
        }
        if (best < 0 && trough && c[j] < threshold) best = j;
      }
      const int j = best >= 0 ? best : lowest;
      double shift = 0.0;
      if (j > 0 && j < count - 1) {
        const double a = c[j + 1] + c[j - 1] - 2.0 * c[j];
        const double b = (c[j + 1] - c[j - 1]) / 2.0;
        shift = fabs(b) >= fabs(a) ? 0.0 : -b / a;
      }
      f0[fr] = static_cast<T>(sr / (static_cast<double>(min_period + j) + shift));
    }
    __syncthreads();
  }
}

// -- Cascaded second-order sections (scipy.signal.sosfilt, transposed direct form II, zero initial state):
// one thread per row walks its samples in order. sos (n_sections, 6): b0 b1 b2 a0 a1 a2 with a0 = 1.
template <typename T>
__device__ void sos_filter(const T* __restrict__ x, T* __restrict__ out, const double* __restrict__ sos,
                           index_t rows, index_t length, int n_sections) {
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t r = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows; r += stride) {
    double z[2 * 16];
    for (int s = 0; s < 2 * n_sections; ++s) z[s] = 0.0;
    const T* xr = x + r * length;
    T* o = out + r * length;
    for (index_t t = 0; t < length; ++t) {
      double v = static_cast<double>(xr[t]);
      for (int s = 0; s < n_sections; ++s) {
        const double* c = sos + 6 * s;
        const double y = c[0] * v + z[2 * s];
        z[2 * s] = c[1] * v - c[4] * y + z[2 * s + 1];
        z[2 * s + 1] = c[2] * v - c[5] * y;
        v = y;
      }
      o[t] = static_cast<T>(v);
    }
  }
}

// -- Onset strength (librosa.onset.onset_strength): S contiguous (rows, n_freq, n_frames) in dB. out (rows,
// n_frames): 0 for t < pad, else the mean (aggregate 0) or median (1) over bins of max(0, S[f, u + lag] -
// ref[f, u]), u = t - pad, ref = S maximum-filtered over max_size bins (scipy's "reflect" edges).
template <typename T>
__device__ double flux_at(const T* s, int f, index_t u, int n_freq, index_t n_frames, int lag, int max_size) {
  double ref = static_cast<double>(s[static_cast<index_t>(f) * n_frames + u]);
  const int lo = f - max_size / 2;
  for (int g = lo; g < lo + max_size; ++g) {
    int h = g;
    while (h < 0 || h >= n_freq) h = h < 0 ? -h - 1 : 2 * n_freq - h - 1;
    const double v = static_cast<double>(s[static_cast<index_t>(h) * n_frames + u]);
    ref = v > ref ? v : ref;
  }
  const double diff = static_cast<double>(s[static_cast<index_t>(f) * n_frames + u + lag]) - ref;
  return diff > 0.0 ? diff : 0.0;
}

template <typename T>
__device__ void onset_flux(const T* __restrict__ S, T* __restrict__ out, index_t rows, int n_freq,
                           index_t n_frames, int lag, int max_size, index_t pad, int aggregate) {
  const index_t total = rows * n_frames;
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const index_t r = i / n_frames;
    const index_t t = i - r * n_frames;
    const index_t u = t - pad;
    if (u < 0 || u + lag >= n_frames) {
      out[i] = static_cast<T>(0);
      continue;
    }
    const T* s = S + r * n_freq * n_frames;
    double value = 0.0;
    if (aggregate == 0) {
      for (int f = 0; f < n_freq; ++f) value += flux_at(s, f, u, n_freq, n_frames, lag, max_size);
      value /= n_freq;
    } else {  // median: the order statistics (n - 1) / 2 and n / 2, found by counting
      const int k_lo = (n_freq - 1) / 2, k_hi = n_freq / 2;
      double lo_v = 0.0, hi_v = 0.0;
      for (int f = 0; f < n_freq; ++f) {
        const double v = flux_at(s, f, u, n_freq, n_frames, lag, max_size);
        int less = 0, equal = 0;
        for (int g = 0; g < n_freq; ++g) {
          const double w = flux_at(s, g, u, n_freq, n_frames, lag, max_size);
          less += w < v;
          equal += w == v;
        }
        if (less <= k_lo && k_lo < less + equal) lo_v = v;
        if (less <= k_hi && k_hi < less + equal) hi_v = v;
      }
      value = 0.5 * (lo_v + hi_v);
    }
    out[i] = static_cast<T>(value);
  }
}

// -- Frame gate: out[r, t] = x[r, t] * (level[r, k] >= threshold ? 1 : floor_gain), k the frame centred
// nearest to t (min((t + hop / 2) / hop, n_frames - 1)); level (rows, n_frames).
template <typename T>
__device__ void frame_gate(const T* __restrict__ x, const T* __restrict__ level, T* __restrict__ out,
                           index_t rows, index_t length, index_t n_frames, int hop, double threshold,
                           double floor_gain) {
  const index_t total = rows * length;
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const index_t r = i / length;
    const index_t t = i - r * length;
    index_t k = (t + hop / 2) / hop;
    if (k > n_frames - 1) k = n_frames - 1;
    const double gain = static_cast<double>(level[r * n_frames + k]) >= threshold ? 1.0 : floor_gain;
    out[i] = static_cast<T>(static_cast<double>(x[i]) * gain);
  }
}

// -- Viterbi decoding (librosa.sequence.viterbi, pyin's decoder): one block per row. log_prob (rows,
// n_frames, n_states), log_trans (n_states, n_states) (from, to); value scratch (rows, 2, n_states) doubles;
// ptr (rows, n_frames, n_states) ints; states (rows, n_frames) ints. Frame by frame each thread takes a
// target state j and finds the first i maximising value[i] + log_trans[i, j] (NumPy's argmax), in librosa's
// order of additions; thread 0 then picks the first best final state and follows the back pointers.
template <typename T>
__device__ void viterbi(const T* __restrict__ log_prob, const T* __restrict__ log_trans,
                        double* __restrict__ value, int* __restrict__ ptr, int* __restrict__ states,
                        index_t rows, index_t n_frames, int n_states, double log_init) {
  for (index_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* lp = log_prob + r * n_frames * n_states;
    double* v = value + r * 2 * n_states;
    int* p = ptr + r * n_frames * n_states;
    for (int j = threadIdx.x; j < n_states; j += blockDim.x) v[j] = static_cast<double>(lp[j]) + log_init;
    __syncthreads();
    for (index_t t = 1; t < n_frames; ++t) {
      const double* prev = v + ((t - 1) & 1) * n_states;
      double* cur = v + (t & 1) * n_states;
      for (int j = threadIdx.x; j < n_states; j += blockDim.x) {
        double best = prev[0] + static_cast<double>(log_trans[j]);
        int arg = 0;
        for (int i = 1; i < n_states; ++i) {
          const double score =
              prev[i] + static_cast<double>(log_trans[static_cast<index_t>(i) * n_states + j]);
          if (score > best) {
            best = score;
            arg = i;
          }
        }
        cur[j] = static_cast<double>(lp[t * n_states + j]) + best;
        p[t * n_states + j] = arg;
      }
      __syncthreads();
    }
    if (threadIdx.x == 0 && n_frames > 0) {
      const double* last = v + ((n_frames - 1) & 1) * n_states;
      int arg = 0;
      for (int j = 1; j < n_states; ++j)
        if (last[j] > last[arg]) arg = j;
      int* s = states + r * n_frames;
      s[n_frames - 1] = arg;
      for (index_t t = n_frames - 2; t >= 0; --t) s[t] = p[(t + 1) * n_states + s[t + 1]];
    }
    __syncthreads();
  }
}

}  // namespace audio
}  // namespace pygpukit

#define PYGPUKIT_AUDIO_ANALYSIS_ENTRIES(T, SUFFIX)                                                          \
  extern "C" __global__ void yin_frames_##SUFFIX(const void* frames, void* work, void* f0, long long n,     \
                                                 int frame_length, int min_period, int max_period,          \
                                                 double threshold, double sr, double tiny) {                \
    pygpukit::audio::yin_frames<T>(static_cast<const T*>(frames), static_cast<double*>(work),               \
                                   static_cast<T*>(f0), n, frame_length, min_period, max_period, threshold, \
                                   sr, tiny);                                                               \
  }                                                                                                         \
  extern "C" __global__ void sos_filter_##SUFFIX(const void* x, void* out, const void* sos, long long rows, \
                                                 long long length, int n_sections) {                        \
    pygpukit::audio::sos_filter<T>(static_cast<const T*>(x), static_cast<T*>(out),                          \
                                   static_cast<const double*>(sos), rows, length, n_sections);              \
  }                                                                                                         \
  extern "C" __global__ void onset_flux_##SUFFIX(const void* S, void* out, long long rows, int n_freq,      \
                                                 long long n_frames, int lag, int max_size, long long pad,  \
                                                 int aggregate) {                                           \
    pygpukit::audio::onset_flux<T>(static_cast<const T*>(S), static_cast<T*>(out), rows, n_freq, n_frames,  \
                                   lag, max_size, pad, aggregate);                                          \
  }                                                                                                         \
  extern "C" __global__ void viterbi_##SUFFIX(const void* log_prob, const void* log_trans, void* value,     \
                                              void* ptr, void* states, long long rows, long long n_frames,  \
                                              int n_states, double log_init) {                              \
    pygpukit::audio::viterbi<T>(static_cast<const T*>(log_prob), static_cast<const T*>(log_trans),          \
                                static_cast<double*>(value), static_cast<int*>(ptr),                        \
                                static_cast<int*>(states), rows, n_frames, n_states, log_init);             \
  }                                                                                                         \
  extern "C" __global__ void frame_gate_##SUFFIX(const void* x, const void* level, void* out,               \
                                                 long long rows, long long length, long long n_frames,      \
                                                 int hop, double threshold, double floor_gain) {            \
    pygpukit::audio::frame_gate<T>(static_cast<const T*>(x), static_cast<const T*>(level),                  \
                                   static_cast<T*>(out), rows, length, n_frames, hop, threshold,            \
                                   floor_gain);                                                             \
  }

PYGPUKIT_AUDIO_ANALYSIS_ENTRIES(float, f32)
PYGPUKIT_AUDIO_ANALYSIS_ENTRIES(double, f64)
#undef PYGPUKIT_AUDIO_ANALYSIS_ENTRIES
