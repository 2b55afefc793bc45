// Register-resident FFTs of power-of-two lengths (pygpukit/audio/_fft_plan.py chooses them over fft.cu's
// fft_smem where they apply; the transforms, load and store modes and conventions are fft.cu's).
//
//   fft_reg<E>_<L>_<f32|f64>, E = 8 or 16, L = 64, 128, ..., 4096: rows of a batch, each transformed by
//       L / E threads that hold E elements apiece in registers (the planner picks E). Thread t of a row
//       holds the values at positions t + e L / E, e < E, before the first pass and after the last, so the
//       first pass reads the input and the last writes the output straight from registers where the
//       accesses coalesce; between passes (radix E, the last one L / E^m) the values go through shared
//       memory once per pass. Shared memory holds one copy of each row (fft_smem holds two), real and
//       imaginary parts apart, each with a word of padding every 2^pad_shift (bank_pos), the rows of a
//       block row_words apart: the planner picks both (_fft_plan._reg_layout) so that the exchanges of a
//       warp's rows and positions spread over the banks.
//
// The parameters are fft_smem's, less n, npass, radices and tw_pass (compile-time here), plus:
//   pad_shift   a word of padding after every 2^pad_shift positions of a row part in shared memory.
//   row_words   words (elements of T) between the shared-memory rows of a block: at least 2 (L + L >>
//               pad_shift + 1), the real parts first, the imaginary parts L + (L >> pad_shift) + 1 later.
//   tw          W_L^m, m < L (the passes' twiddles: one small table, cached on chip).
//   post_lo/hi  a four-step's twiddles W_N^(k i tw_post) as post_lo[q & (2^post_shift - 1)] times
//               post_hi[q >> post_shift] with post_lo[m] = W_N^m and post_hi[m] = W_N^(m 2^post_shift): two
//               tables of about sqrt(N) roots instead of one of N (N = the four-step's whole length).
// Blocks of up to 1024 threads for float32 with 8 elements a thread (about 63 registers), else 512 (float32
// with 16 elements: about 92; float64 with 8: about 80).
//   thread_rows 1: consecutive threads take consecutive rows (a four-step's strided columns), 0: consecutive
//               elements of one row. A read (write) whose rows_fast bit matches it goes straight between
//               registers and memory; else through shared memory, in the other order (coalesced), as do
//               the r2c stores (they pair outputs k and L - k of different threads).
//
// Defining PYGPUKIT_FFT_REG_LENGTH and PYGPUKIT_FFT_REG_ELEMENTS keeps one (L, E) pair's entry points
// (pygpukit/audio/_kernels.py compiles each pair alone: all of them take about 30 s); without them the
// file has every pair (ci/compile_kernels.py).
#include "fft_common.cuh"

namespace pygpukit {
namespace audio {

template <int L, int E_, typename T>
struct RegShape {
  static constexpr int E = E_;       // elements per thread
  static constexpr int TPR = L / E;  // threads per row
};

// One row in shared memory: real parts at re[q], imaginary parts at im[q], q = p + (p >> shift) for
// position p (a word of padding every 2^shift).
template <typename T>
struct SmemRow {
  T* re;
  T* im;
  int shift;
  __device__ __forceinline__ SmemRow(T* smem, int row, int row_words, int span, int shift_)
      : re(smem + row * row_words), im(smem + row * row_words + span), shift(shift_) {}
  __device__ __forceinline__ int bank_pos(int p) const { return p + (p >> shift); }
  __device__ __forceinline__ Cx<T> operator()(int k) const {
    const int q = bank_pos(k);
    return cx<T>(re[q], im[q]);
  }
  __device__ __forceinline__ void set(int k, Cx<T> v) const {
    const int q = bank_pos(k);
    re[q] = v.re;
    im[q] = v.im;
  }
};

// The Stockham pass that starts after the radices whose product is NS (fft.cu's butterfly): thread jt
// takes butterflies j = jt + i L / E, i < E / R, whose inputs r (positions j + r L / R) are its registers
// i + r E / R; the outputs go to shared memory at (j - j mod NS) R + j mod NS + r NS, and after a barrier
// each thread reads back positions jt + e L / E for the next pass. The last pass (NS R = L) writes
// position j + r L / R, which is register i + r E / R: no exchange.
template <int L, int E_, int NS, typename T>
struct RegPass {
  using S = RegShape<L, E_, T>;
  static constexpr int E = S::E;
  static constexpr int R = (L / NS) < E ? (L / NS) : E;

  static __device__ __forceinline__ void run(Cx<T> (&v)[S::E], int jt, const SmemRow<T>& row,
                                             const Cx<T>* __restrict__ tw) {
#pragma unroll
    for (int i = 0; i < E / R; ++i) {
      const int j = jt + i * S::TPR;
      const int k = j & (NS - 1);
      Cx<T> u[R];
#pragma unroll
      for (int r = 0; r < R; ++r) u[r] = v[i + r * (E / R)];
      if (NS > 1) {
        const int step = k * (L / (NS * R));  // W_(NS R)^k = W_L^step
#pragma unroll
        for (int r = 1; r < R; ++r) u[r] = u[r] * tw[r * step];
      }
      Dft<R, T>::run(u);
      if constexpr (NS * R == L) {
#pragma unroll
        for (int r = 0; r < R; ++r) v[i + r * (E / R)] = u[r];
      } else {
        const int base = (j - k) * R + k;
#pragma unroll
        for (int r = 0; r < R; ++r) row.set(base + r * NS, u[r]);
      }
    }
    if constexpr (NS * R < L) {
      __syncthreads();
#pragma unroll
      for (int e = 0; e < E; ++e) v[e] = row(jt + e * S::TPR);
      __syncthreads();
      RegPass<L, E, NS * R, T>::run(v, jt, row, tw);
    }
  }
};

// Element e of row (o, i) as the first stage reads it (fft_smem's read).
template <typename T>
__device__ __forceinline__ Cx<T> reg_load(int load_mode, const void* __restrict__ in, index_t o, index_t i,
                                          index_t in_outer, index_t in_inner, index_t in_elem, int e, int n,
                                          int in_len, const Cx<T>* __restrict__ tw_edge, int conj_in,
                                          const T* __restrict__ window, index_t x_len, index_t pad_left,
                                          int pad_mode) {
  return load_mode == codes::kLoadFramePairs
             ? load_frame_pair<T>(in, o * in_outer, i * in_inner - pad_left, e, window, x_len, pad_mode)
             : load_value<T>(load_mode, in, o * in_outer + i * in_inner, in_elem, e, n, in_len, tw_edge,
                             conj_in);
}

template <int L, int E, typename T>
__device__ void fft_reg(const void* __restrict__ in, void* __restrict__ out, const Cx<T>* __restrict__ tw,
                        const Cx<T>* __restrict__ tw_edge, const Cx<T>* __restrict__ post_lo,
                        const Cx<T>* __restrict__ post_hi, index_t rows, index_t inner, index_t in_outer,
                        index_t in_inner, index_t in_elem, index_t out_outer, index_t out_inner,
                        index_t out_elem, int in_len, int out_count, int post_shift, int tw_post,
                        int load_mode, int store_mode, int conj_in, int conj_out, int rows_fast,
                        int thread_rows, double scale, const T* __restrict__ window, index_t x_len,
                        index_t pad_left, int pad_mode, double power, int pad_shift, int row_words) {
  using S = RegShape<L, E, T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);
  const int nthreads = static_cast<int>(blockDim.x);
  const int ry = nthreads / S::TPR;  // rows per block
  const int tid = static_cast<int>(threadIdx.x);
  const int rr = thread_rows ? tid % ry : tid / S::TPR;
  const int jt = thread_rows ? tid / ry : tid % S::TPR;
  const index_t row0 = static_cast<index_t>(blockIdx.x) * ry;
  const index_t row = row0 + rr;
  const bool valid = row < rows;
  index_t o = 0, i = 0;
  if (valid) split_row(row, inner, o, i);
  index_t o0, i0;  // the block's first row (the GridWalk loops split their rows from it)
  split_row(row0, inner, o0, i0);
  const int span = L + (L >> pad_shift) + 1;  // words of one part of a row
  const SmemRow<T> mine(smem, rr, row_words, span, pad_shift);
  const bool loads_fast = (rows_fast & 1) != 0;
  const bool stores_fast = (rows_fast & 2) != 0;
  const bool direct_in = loads_fast == (thread_rows != 0);
  const bool direct_out = (store_mode == codes::kStoreComplex || store_mode == codes::kStoreReal) &&
                          stores_fast == (thread_rows != 0);

  Cx<T> v[S::E];
  if (direct_in) {
#pragma unroll
    for (int e = 0; e < S::E; ++e) {
      v[e] = valid ? reg_load<T>(load_mode, in, o, i, in_outer, in_inner, in_elem, jt + e * S::TPR, L, in_len,
                                 tw_edge, conj_in, window, x_len, pad_left, pad_mode)
                   : czero<T>();
    }
  } else {
    // The block's rows into shared memory with consecutive threads on consecutive positions of the other
    // kind (rows when the rows are strided columns, elements when they are contiguous), then to registers.
    for (GridWalk w(tid, nthreads, loads_fast ? ry : L); w.major < (loads_fast ? L : ry); w.next()) {
      const int r2 = loads_fast ? w.minor : w.major;
      const int e = loads_fast ? w.major : w.minor;
      const index_t row2 = row0 + r2;
      Cx<T> value = czero<T>();
      if (row2 < rows) {
        index_t o2, i2;
        split_row_after(o0, i0, r2, inner, o2, i2);
        value = reg_load<T>(load_mode, in, o2, i2, in_outer, in_inner, in_elem, e, L, in_len, tw_edge,
                            conj_in, window, x_len, pad_left, pad_mode);
      }
      const SmemRow<T> dst(smem, r2, row_words, span, pad_shift);
      dst.set(e, value);
    }
    __syncthreads();
#pragma unroll
    for (int e = 0; e < S::E; ++e) v[e] = mine(jt + e * S::TPR);
    __syncthreads();
  }

  RegPass<L, E, 1, T>::run(v, jt, mine, tw);

  const T s = static_cast<T>(scale);
  if (direct_out) {
    if (!valid) return;
    const index_t base = o * out_outer + i * out_inner;
    const index_t post = i * tw_post;
    const index_t mask = (static_cast<index_t>(1) << post_shift) - 1;
#pragma unroll
    for (int e = 0; e < S::E; ++e) {
      const int k = jt + e * S::TPR;
      if (k >= out_count) continue;
      if (store_mode == codes::kStoreReal) {
        static_cast<T*>(out)[base + k * out_elem] = v[e].re * s;
        continue;
      }
      Cx<T> value = v[e];
      if (conj_out) value.im = -value.im;
      if (post != 0) {
        const index_t q = k * post;
        value = value * (post_lo[q & mask] * post_hi[q >> post_shift]);
      }
      static_cast<Cx<T>*>(out)[base + k * out_elem] = value * s;
    }
    return;
  }
  // Through shared memory (below the last pass's reads of it: no barrier needed before the writes, as
  // the last pass writes registers only), then written with consecutive threads on consecutive outputs
  // of the other kind.
#pragma unroll
  for (int e = 0; e < S::E; ++e) mine.set(jt + e * S::TPR, v[e]);
  __syncthreads();
  const int count = out_count;
  for (GridWalk w(tid, nthreads, stores_fast ? ry : count); w.major < (stores_fast ? count : ry); w.next()) {
    const int r2 = stores_fast ? w.minor : w.major;
    const int k = stores_fast ? w.major : w.minor;
    const index_t row2 = row0 + r2;
    if (row2 < rows) {
      index_t o2, i2;
      split_row_after(o0, i0, r2, inner, o2, i2);
      const SmemRow<T> z(smem, r2, row_words, span, pad_shift);
      store_value<T>(store_mode, out, o2 * out_outer + i2 * out_inner, out_elem, k, z, L, tw_edge,
                     static_cast<const Cx<T>*>(nullptr), 0, conj_out, s, power);
    }
  }
}

}  // namespace audio
}  // namespace pygpukit

#define PYGPUKIT_AUDIO_FFT_REG_ENTRY(E, L, T, SUFFIX)                                                      \
  extern "C" __global__ void __launch_bounds__(E == 8 && sizeof(T) == 4 ? 1024 : 512)                      \
      fft_reg##E##_##L##_##SUFFIX(                                                                         \
          const void* in, void* out, const void* tw, const void* tw_edge, const void* post_lo,             \
          const void* post_hi, long long rows, long long inner, long long in_outer, long long in_inner,    \
          long long in_elem, long long out_outer, long long out_inner, long long out_elem, int in_len,     \
          int out_count, int post_shift, int tw_post, int load_mode, int store_mode, int conj_in,          \
          int conj_out, int rows_fast, int thread_rows, double scale, const void* window, long long x_len, \
          long long pad_left, int pad_mode, double power, int pad_shift, int row_words) {                  \
    using pygpukit::audio::Cx;                                                                             \
    pygpukit::audio::fft_reg<L, E, T>(                                                                     \
        in, out, static_cast<const Cx<T>*>(tw), static_cast<const Cx<T>*>(tw_edge),                        \
        static_cast<const Cx<T>*>(post_lo), static_cast<const Cx<T>*>(post_hi), rows, inner, in_outer,     \
        in_inner, in_elem, out_outer, out_inner, out_elem, in_len, out_count, post_shift, tw_post,         \
        load_mode, store_mode, conj_in, conj_out, rows_fast, thread_rows, scale,                           \
        static_cast<const T*>(window), x_len, pad_left, pad_mode, power, pad_shift, row_words);            \
  }

#define PYGPUKIT_AUDIO_FFT_REG_ENTRIES(E, L)     \
  PYGPUKIT_AUDIO_FFT_REG_ENTRY(E, L, float, f32) \
  PYGPUKIT_AUDIO_FFT_REG_ENTRY(E, L, double, f64)

#if !defined(PYGPUKIT_FFT_REG_LENGTH) || (PYGPUKIT_FFT_REG_LENGTH == 64 && PYGPUKIT_FFT_REG_ELEMENTS == 8)
PYGPUKIT_AUDIO_FFT_REG_ENTRIES(8, 64)
#endif
#if !defined(PYGPUKIT_FFT_REG_LENGTH) || (PYGPUKIT_FFT_REG_LENGTH == 64 && PYGPUKIT_FFT_REG_ELEMENTS == 16)
PYGPUKIT_AUDIO_FFT_REG_ENTRIES(16, 64)
#endif
#if !defined(PYGPUKIT_FFT_REG_LENGTH) || (PYGPUKIT_FFT_REG_LENGTH == 128 && PYGPUKIT_FFT_REG_ELEMENTS == 8)
PYGPUKIT_AUDIO_FFT_REG_ENTRIES(8, 128)
#endif
#if !defined(PYGPUKIT_FFT_REG_LENGTH) || (PYGPUKIT_FFT_REG_LENGTH == 128 && PYGPUKIT_FFT_REG_ELEMENTS == 16)
PYGPUKIT_AUDIO_FFT_REG_ENTRIES(16, 128)
#endif
#if !defined(PYGPUKIT_FFT_REG_LENGTH) || (PYGPUKIT_FFT_REG_LENGTH == 256 && PYGPUKIT_FFT_REG_ELEMENTS == 8)
PYGPUKIT_AUDIO_FFT_REG_ENTRIES(8, 256)
#endif
#if !defined(PYGPUKIT_FFT_REG_LENGTH) || (PYGPUKIT_FFT_REG_LENGTH == 256 && PYGPUKIT_FFT_REG_ELEMENTS == 16)
PYGPUKIT_AUDIO_FFT_REG_ENTRIES(16, 256)
#endif
#if !defined(PYGPUKIT_FFT_REG_LENGTH) || (PYGPUKIT_FFT_REG_LENGTH == 512 && PYGPUKIT_FFT_REG_ELEMENTS == 8)
PYGPUKIT_AUDIO_FFT_REG_ENTRIES(8, 512)
#endif
#if !defined(PYGPUKIT_FFT_REG_LENGTH) || (PYGPUKIT_FFT_REG_LENGTH == 512 && PYGPUKIT_FFT_REG_ELEMENTS == 16)
PYGPUKIT_AUDIO_FFT_REG_ENTRIES(16, 512)
#endif
#if !defined(PYGPUKIT_FFT_REG_LENGTH) || (PYGPUKIT_FFT_REG_LENGTH == 1024 && PYGPUKIT_FFT_REG_ELEMENTS == 8)
PYGPUKIT_AUDIO_FFT_REG_ENTRIES(8, 1024)
#endif
#if !defined(PYGPUKIT_FFT_REG_LENGTH) || (PYGPUKIT_FFT_REG_LENGTH == 1024 && PYGPUKIT_FFT_REG_ELEMENTS == 16)
PYGPUKIT_AUDIO_FFT_REG_ENTRIES(16, 1024)
#endif
#if !defined(PYGPUKIT_FFT_REG_LENGTH) || (PYGPUKIT_FFT_REG_LENGTH == 2048 && PYGPUKIT_FFT_REG_ELEMENTS == 8)
PYGPUKIT_AUDIO_FFT_REG_ENTRIES(8, 2048)
#endif
#if !defined(PYGPUKIT_FFT_REG_LENGTH) || (PYGPUKIT_FFT_REG_LENGTH == 2048 && PYGPUKIT_FFT_REG_ELEMENTS == 16)
PYGPUKIT_AUDIO_FFT_REG_ENTRIES(16, 2048)
#endif
#if !defined(PYGPUKIT_FFT_REG_LENGTH) || (PYGPUKIT_FFT_REG_LENGTH == 4096 && PYGPUKIT_FFT_REG_ELEMENTS == 8)
PYGPUKIT_AUDIO_FFT_REG_ENTRIES(8, 4096)
#endif
#if !defined(PYGPUKIT_FFT_REG_LENGTH) || (PYGPUKIT_FFT_REG_LENGTH == 4096 && PYGPUKIT_FFT_REG_ELEMENTS == 16)
PYGPUKIT_AUDIO_FFT_REG_ENTRIES(16, 4096)
#endif
#undef PYGPUKIT_AUDIO_FFT_REG_ENTRIES
#undef PYGPUKIT_AUDIO_FFT_REG_ENTRY
