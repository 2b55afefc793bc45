// Register-resident FFTs of power-of-two lengths (pygpukit/audio/_fft_plan.py chooses them over fft.cu's
// fft_smem where they apply; the transforms, load and store modes and conventions are fft.cu's).
//
//   fft_reg<E>_<L>[_2buf]_<f32|f64>, E = 8 or 16, L = 64, 128, ..., 4096: rows of a batch, each transformed
//   by
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
// The _2buf entry points keep two copies of the block's rows in shared memory (the second ry row_words
// words after the first): the passes alternate between them, so each exchange needs one barrier instead of
// two (the planner takes them where the shared memory allows without fewer blocks per SM). They are entry
// points of their own, not a parameter: the second buffer's offsets would cost the one-buffer kernels
// registers (spills at 64).
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

// One row in shared memory: real parts at smem[base + q], imaginary parts at smem[base + span + q], q = p +
// (p >> shift) for position p (a word of padding every 2^shift). Offsets, not pointers: 32-bit arithmetic
// and one register a row (smem, span and shift are the block's).
template <typename T>
struct SmemRow {
  T* smem;
  int base;
  int span;
  int shift;
  __device__ __forceinline__ SmemRow(T* smem_, int row, int row_words, int span_, int shift_)
      : smem(smem_), base(row * row_words), span(span_), shift(shift_) {}
  // The same row of the buffer `words` words on (fft_reg's second buffer: 0 with one).
  __device__ __forceinline__ SmemRow shifted(int words) const {
    SmemRow moved = *this;
    moved.base += words;
    return moved;
  }
  __device__ __forceinline__ int bank_pos(int p) const { return base + p + (p >> shift); }
  __device__ __forceinline__ Cx<T> operator()(int k) const {
    const int q = bank_pos(k);
    return cx<T>(smem[q], smem[q + span]);
  }
  __device__ __forceinline__ void set(int k, Cx<T> v) const {
    const int q = bank_pos(k);
    smem[q] = v.re;
    smem[q + span] = v.im;
  }
};

// The Stockham pass that starts after the radices whose product is NS (fft.cu's butterfly): thread jt
// takes butterflies j = jt + i L / E, i < E / R, whose inputs r (positions j + r L / R) are its registers
// i + r E / R; the outputs go to shared memory at (j - j mod NS) R + j mod NS + r NS, and after a barrier
// each thread reads back positions jt + e L / E for the next pass. The last pass (NS R = L) writes
// position j + r L / R, which is register i + r E / R: no exchange.
template <int L, int E_, int NS, typename T, bool Two>
struct RegPass {
  using S = RegShape<L, E_, T>;
  static constexpr int E = S::E;
  static constexpr int R = (L / NS) < E ? (L / NS) : E;

  // `row` takes this pass's outputs. Two: the next pass writes row.shifted(flip), the other buffer; else
  // the same row, and a second barrier keeps those writes after every thread's reads. Returns the row
  // that may be written after the last pass (with two buffers, not the one the last exchange read).
  static __device__ __forceinline__ SmemRow<T> run(Cx<T> (&v)[S::E], int jt, const SmemRow<T>& row, int flip,
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
      if constexpr (Two) {
        return RegPass<L, E, NS * R, T, Two>::run(v, jt, row.shifted(flip), -flip, tw);
      } else {
        __syncthreads();
        return RegPass<L, E, NS * R, T, Two>::run(v, jt, row, 0, tw);
      }
    }
    return row;
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

template <int L, int E, typename T, bool Two>
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
  // Two: a second copy of the block's rows after the first, so that each exchange needs one barrier.
  const SmemRow<T> mine(smem, rr, row_words, span, pad_shift);
  bool staged_in = false;  // the load went through `mine`: with two buffers the first pass writes the other
  const int flip = Two ? ry * row_words : 0;  // words from the first buffer to the second
  const bool loads_fast = (rows_fast & 1) != 0;
  const bool stores_fast = (rows_fast & 2) != 0;
  const bool direct_in = loads_fast == (thread_rows != 0);
  const bool direct_out = (store_mode == codes::kStoreComplex || store_mode == codes::kStoreReal) &&
                          stores_fast == (thread_rows != 0);

  Cx<T> v[S::E];
  if (direct_in && load_mode == codes::kLoadComplex && in_len >= L) {
    // The common case (a four-step's columns, plain rows) without load_value's per-element checks: one
    // pointer stepped by TPR elements.
    const Cx<T>* src = static_cast<const Cx<T>*>(in) + (o * in_outer + i * in_inner + jt * in_elem);
    const index_t step = S::TPR * in_elem;
#pragma unroll
    for (int e = 0; e < S::E; ++e, src += step) {
      v[e] = valid ? *src : czero<T>();
      if (conj_in) v[e].im = -v[e].im;
    }
  } else if (direct_in) {
#pragma unroll
    for (int e = 0; e < S::E; ++e) {
      v[e] = valid ? reg_load<T>(load_mode, in, o, i, in_outer, in_inner, in_elem, jt + e * S::TPR, L, in_len,
                                 tw_edge, conj_in, window, x_len, pad_left, pad_mode)
                   : czero<T>();
    }
  } else {
    // The block's rows into shared memory with consecutive threads on consecutive positions of the other
    // kind (rows when the rows are strided columns, elements when they are contiguous), then to registers.
    if (load_mode == codes::kLoadComplex && in_len >= L) {
      // The block has ry L / E threads, so each thread stages exactly E values: all E loads are issued
      // before the first store to shared memory (the loop below waits for each load in turn).
      Cx<T> staged[S::E];
      GridWalk w(tid, nthreads, loads_fast ? ry : L);
#pragma unroll
      for (int t = 0; t < S::E; ++t, w.next()) {
        const int r2 = loads_fast ? w.minor : w.major;
        const int e = loads_fast ? w.major : w.minor;
        staged[t] = czero<T>();
        if (row0 + r2 < rows) {
          index_t o2, i2;
          split_row_after(o0, i0, r2, inner, o2, i2);
          staged[t] = static_cast<const Cx<T>*>(in)[o2 * in_outer + i2 * in_inner + e * in_elem];
          if (conj_in) staged[t].im = -staged[t].im;
        }
      }
      GridWalk z(tid, nthreads, loads_fast ? ry : L);
#pragma unroll
      for (int t = 0; t < S::E; ++t, z.next()) {
        const SmemRow<T> dst(smem, loads_fast ? z.minor : z.major, row_words, span, pad_shift);
        dst.set(loads_fast ? z.major : z.minor, staged[t]);
      }
    } else {
      for (GridWalk w(tid, nthreads, loads_fast ? ry : L); w.major < (loads_fast ? L : ry); w.next()) {
        const int r2 = loads_fast ? w.minor : w.major;
        const int e = loads_fast ? w.major : w.minor;
        Cx<T> value = czero<T>();
        if (row0 + r2 < rows) {
          index_t o2, i2;
          split_row_after(o0, i0, r2, inner, o2, i2);
          value = reg_load<T>(load_mode, in, o2, i2, in_outer, in_inner, in_elem, e, L, in_len, tw_edge,
                              conj_in, window, x_len, pad_left, pad_mode);
        }
        const SmemRow<T> dst(smem, r2, row_words, span, pad_shift);
        dst.set(e, value);
      }
    }
    __syncthreads();
#pragma unroll
    for (int e = 0; e < S::E; ++e) v[e] = mine(jt + e * S::TPR);
    if constexpr (Two) {
      staged_in = true;
    } else {
      __syncthreads();
    }
  }

  const SmemRow<T> spare = RegPass<L, E, 1, T, Two>::run(v, jt, staged_in ? mine.shifted(flip) : mine,
                                                         staged_in ? -flip : flip, tw);

  const T s = static_cast<T>(scale);
  if (direct_out) {
    if (!valid) return;
    const index_t base = o * out_outer + i * out_inner;
    if (store_mode == codes::kStoreReal) {
#pragma unroll
      for (int e = 0; e < S::E; ++e) {
        const int k = jt + e * S::TPR;
        if (k < out_count) static_cast<T*>(out)[base + k * out_elem] = v[e].re * s;
      }
      return;
    }
    if (conj_out) {
#pragma unroll
      for (int e = 0; e < S::E; ++e) v[e].im = -v[e].im;
    }
    const index_t post = i * tw_post;
    if (post != 0) {
      // The four-step's twiddles, every table load issued before the first product (the planner's tables
      // hold W_N^q for every q = k post, k < L, so no position needs a bound check here).
      const index_t mask = (static_cast<index_t>(1) << post_shift) - 1;
      Cx<T> lo[S::E], hi[S::E];
#pragma unroll
      for (int e = 0; e < S::E; ++e) {
        const index_t q = static_cast<index_t>(jt + e * S::TPR) * post;
        lo[e] = post_lo[q & mask];
        hi[e] = post_hi[q >> post_shift];
      }
#pragma unroll
      for (int e = 0; e < S::E; ++e) v[e] = v[e] * (lo[e] * hi[e]);
    }
    Cx<T>* dst = static_cast<Cx<T>*>(out) + (base + jt * out_elem);
    const index_t step = S::TPR * out_elem;
#pragma unroll
    for (int e = 0; e < S::E; ++e, dst += step) {
      if (jt + e * S::TPR < out_count) *dst = v[e] * s;
    }
    return;
  }
  // Through shared memory (the buffer the last exchange did not read, or with one buffer below its
  // second barrier: no barrier needed before the writes, as the last pass writes registers only), then
  // written with consecutive threads on consecutive outputs of the other kind.
  T* const out_rows = smem + (spare.base - mine.base);
#pragma unroll
  for (int e = 0; e < S::E; ++e) spare.set(jt + e * S::TPR, v[e]);
  __syncthreads();
  const int count = out_count;
  for (GridWalk w(tid, nthreads, stores_fast ? ry : count); w.major < (stores_fast ? count : ry); w.next()) {
    const int r2 = stores_fast ? w.minor : w.major;
    const int k = stores_fast ? w.major : w.minor;
    const index_t row2 = row0 + r2;
    if (row2 < rows) {
      index_t o2, i2;
      split_row_after(o0, i0, r2, inner, o2, i2);
      const SmemRow<T> z(out_rows, r2, row_words, span, pad_shift);
      store_value<T>(store_mode, out, o2 * out_outer + i2 * out_inner, out_elem, k, z, L, tw_edge,
                     static_cast<const Cx<T>*>(nullptr), 0, conj_out, s, power);
    }
  }
}

}  // namespace audio
}  // namespace pygpukit

#define PYGPUKIT_AUDIO_FFT_REG_ENTRY(E, L, T, NAME, TWO)                                                    \
  extern "C" __global__ void __launch_bounds__(E == 8 && sizeof(T) == 4 ? 1024 : 512)                       \
      NAME(const void* in, void* out, const void* tw, const void* tw_edge, const void* post_lo,             \
           const void* post_hi, long long rows, long long inner, long long in_outer, long long in_inner,    \
           long long in_elem, long long out_outer, long long out_inner, long long out_elem, int in_len,     \
           int out_count, int post_shift, int tw_post, int load_mode, int store_mode, int conj_in,          \
           int conj_out, int rows_fast, int thread_rows, double scale, const void* window, long long x_len, \
           long long pad_left, int pad_mode, double power, int pad_shift, int row_words) {                  \
    using pygpukit::audio::Cx;                                                                              \
    pygpukit::audio::fft_reg<L, E, T, TWO>(                                                                 \
        in, out, static_cast<const Cx<T>*>(tw), static_cast<const Cx<T>*>(tw_edge),                         \
        static_cast<const Cx<T>*>(post_lo), static_cast<const Cx<T>*>(post_hi), rows, inner, in_outer,      \
        in_inner, in_elem, out_outer, out_inner, out_elem, in_len, out_count, post_shift, tw_post,          \
        load_mode, store_mode, conj_in, conj_out, rows_fast, thread_rows, scale,                            \
        static_cast<const T*>(window), x_len, pad_left, pad_mode, power, pad_shift, row_words);             \
  }

#define PYGPUKIT_AUDIO_FFT_REG_ENTRIES(E, L)                                   \
  PYGPUKIT_AUDIO_FFT_REG_ENTRY(E, L, float, fft_reg##E##_##L##_f32, false)     \
  PYGPUKIT_AUDIO_FFT_REG_ENTRY(E, L, double, fft_reg##E##_##L##_f64, false)    \
  PYGPUKIT_AUDIO_FFT_REG_ENTRY(E, L, float, fft_reg##E##_##L##_2buf_f32, true) \
  PYGPUKIT_AUDIO_FFT_REG_ENTRY(E, L, double, fft_reg##E##_##L##_2buf_f64, true)

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
