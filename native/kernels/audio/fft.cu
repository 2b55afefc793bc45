// FFTs of pygpukit.audio (pygpukit/audio/_fft_plan.py plans them, pygpukit/audio/fft.py is the API).
//
// Every transform is a forward complex DFT of a length L, X[k] = sum_j x[j] W_L^(jk), W_L = exp(-2 pi i / L);
// an inverse one is conj(DFT(conj(x))) (the conj_in / conj_out flags), so the butterflies and the twiddle
// tables are forward only. Real transforms of an even length n run a complex transform of L = n / 2
// (kLoadRealPairs + kStoreR2cEven, kLoadC2rEven + kStoreComplex into the real output); odd lengths run L = n
// (kLoadReal, kLoadHermitian + kStoreReal). codes::FftLoad and codes::FftStore (audio_codes.cuh) say how
// the first stage reads and the last writes; both add zeros past the input's valid length (numpy's n=).
//
// The passes are Stockham autosort steps of radix R in {2, 3, 4, 5, 7, 8, 11, 13}: with Ns the product of
// the radices before, butterfly j (j < L / R) reads src[j + r L / R], multiplies input r by
// W_(Ns R)^(r (j mod Ns)), takes the R-point DFT and writes dst[(j - j mod Ns) R + j mod Ns + r Ns]. The
// twiddles come from a table of roots computed in float64 on the host (tw[m] = W_N^m of the table's own N;
// the passes read tw[m * tw_pass], so one table serves sub-lengths of N).
//
//   fft_smem_<f32|f64>     a whole transform of length L in shared memory (two buffers of L per row), rows
//       of a batch in blockDim.y, the butterflies of a row over blockDim.x. Also the two steps of a
//       four-step transform L = L1 L2: rows are (outer, inner) pairs with their own strides, and the store
//       multiplies output k of inner row m by W^(m k) (tw_post). A complex transform too long for one
//       launch is these two launches only (input -> scratch -> output, two passes over memory); the
//       load and store modes, the conjugations and the scale happen in them.
//   fft_pass_<f32|f64>     one Stockham pass over contiguous rows in global memory (lengths too long for
//       shared memory that do not split into two that fit).
//   fft_pack_<f32|f64>     the first stage's read into contiguous rows of length m >= L (zeros past L),
//       optionally times a Bluestein chirp; fft_unpack_<f32|f64> the last stage's write from such rows.
//   fft_chirp_mul_<f32|f64> Bluestein's pointwise product y = conj(y * bhat) / m.
//
// Index arithmetic: rows and offsets are 64-bit; positions inside a row are int (L < 2^31, which the
// planner checks). Shared memory holds 2 L complex values per row of the block (plus a bank pad, above).
#include "fft_common.cuh"

namespace pygpukit {
namespace audio {

// One Stockham butterfly (see the top of the file); src and dst are rows of n, tw a root table.
template <int R, typename T>
__device__ __forceinline__ void stockham_step(const Cx<T>* __restrict__ src, Cx<T>* __restrict__ dst, int n,
                                              int ns, int j, const Cx<T>* __restrict__ tw, index_t tw_pass) {
  const int stride = n / R;
  const int k = j % ns;
  Cx<T> v[R];
#pragma unroll
  for (int r = 0; r < R; ++r) v[r] = src[j + r * stride];
  if (ns > 1) {
    const index_t step = static_cast<index_t>(k) * (n / (ns * R)) * tw_pass;  // W_(Ns R)^k
#pragma unroll
    for (int r = 1; r < R; ++r) v[r] = v[r] * tw[r * step];
  }
  Dft<R, T>::run(v);
  const int base = (j - k) * R + k;
#pragma unroll
  for (int r = 0; r < R; ++r) dst[base + r * ns] = v[r];
}

template <int R, typename T>
__device__ __forceinline__ void stockham_pass_block(const Cx<T>* src, Cx<T>* dst, int n, int ns,
                                                    const Cx<T>* tw, index_t tw_pass, int lane, int lanes) {
  for (int j = lane; j < n / R; j += lanes) stockham_step<R, T>(src, dst, n, ns, j, tw, tw_pass);
}

// Every pass of one row held in shared memory; every thread of the block calls it (it synchronises).
// Returns the buffer holding the result (a after an even number of passes, else b).
template <typename T>
__device__ Cx<T>* run_passes(Cx<T>* a, Cx<T>* b, int n, int npass, unsigned long long radices,
                             const Cx<T>* __restrict__ tw, index_t tw_pass, int lane, int lanes) {
  Cx<T>* src = a;
  Cx<T>* dst = b;
  int ns = 1;
  for (int p = 0; p < npass; ++p) {
    const int radix = static_cast<int>((radices >> (4 * p)) & 15ull);
    switch (radix) {
      case 2:
        stockham_pass_block<2, T>(src, dst, n, ns, tw, tw_pass, lane, lanes);
        break;
      case 3:
        stockham_pass_block<3, T>(src, dst, n, ns, tw, tw_pass, lane, lanes);
        break;
      case 4:
        stockham_pass_block<4, T>(src, dst, n, ns, tw, tw_pass, lane, lanes);
        break;
      case 5:
        stockham_pass_block<5, T>(src, dst, n, ns, tw, tw_pass, lane, lanes);
        break;
      case 7:
        stockham_pass_block<7, T>(src, dst, n, ns, tw, tw_pass, lane, lanes);
        break;
      case 8:
        stockham_pass_block<8, T>(src, dst, n, ns, tw, tw_pass, lane, lanes);
        break;
      case 11:
        stockham_pass_block<11, T>(src, dst, n, ns, tw, tw_pass, lane, lanes);
        break;
      default:
        stockham_pass_block<13, T>(src, dst, n, ns, tw, tw_pass, lane, lanes);
        break;
    }
    __syncthreads();
    Cx<T>* t = src;
    src = dst;
    dst = t;
    ns *= radix;
  }
  return src;
}

// -- kernels
// ---------------------------------------------------------------------------------------------------- Row r
// of a launch is (outer o = r / inner, inner i = r % inner); its input starts at o * in_outer + i * in_inner,
// its output at o * out_outer + i * out_inner. rows_fast bit 0 (input) and bit 1 (output): consecutive
// threads take consecutive rows of the block rather than consecutive elements (coalesced where the rows are
// adjacent in memory and the elements strided, as in a four-step's columns).
// kLoadFramePairs: inner rows are the frames of an outer signal row; `window`, `x_len` (samples per signal
// row), `pad_left` and `pad_mode` describe the frames, and in_inner is the hop.
template <typename T>
__device__ void fft_smem(const void* __restrict__ in, void* __restrict__ out, const Cx<T>* __restrict__ tw,
                         const Cx<T>* __restrict__ tw_edge, index_t rows, index_t inner, index_t in_outer,
                         index_t in_inner, index_t in_elem, index_t out_outer, index_t out_inner,
                         index_t out_elem, int n, int in_len, int out_count, int npass,
                         unsigned long long radices, int tw_pass, int tw_post, int load_mode, int store_mode,
                         int conj_in, int conj_out, int rows_fast, double scale, const T* __restrict__ window,
                         index_t x_len, index_t pad_left, int pad_mode, double power) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Cx<T>* smem = reinterpret_cast<Cx<T>*>(smem_raw);
  const int ry = static_cast<int>(blockDim.y);
  const int tid = static_cast<int>(threadIdx.y * blockDim.x + threadIdx.x);
  const int nthreads = static_cast<int>(blockDim.x * blockDim.y);
  const index_t row0 = static_cast<index_t>(blockIdx.x) * ry;
  // Two buffers per row; launches over strided rows (rows_fast) pad each row's span by 32 / ry values so
  // that the rows of one warp's access fall in different shared-memory banks (_fft_plan._smem_shape).
  const index_t span = 2 * static_cast<index_t>(n) + (rows_fast ? (ry >= 32 ? 1 : 32 / ry) : 0);

  index_t o0, i0;  // the block's first row (each position's row is split from it)
  split_row(row0, inner, o0, i0);

  // Positions q < ry n (ry n fits in an int: it is bounded by the shared memory).
  const bool loads_fast = (rows_fast & 1) != 0;
  for (GridWalk w(tid, nthreads, loads_fast ? ry : n); w.major < (loads_fast ? n : ry); w.next()) {
    const int rr = loads_fast ? w.minor : w.major;
    const int e = loads_fast ? w.major : w.minor;
    const index_t row = row0 + rr;
    if (row < rows) {
      index_t o, i;
      split_row_after(o0, i0, rr, inner, o, i);
      smem[rr * span + e] =
          load_mode == codes::kLoadFramePairs
              ? load_frame_pair<T>(in, o * in_outer, i * in_inner - pad_left, e, window, x_len, pad_mode)
              : load_value<T>(load_mode, in, o * in_outer + i * in_inner, in_elem, e, n, in_len, tw_edge,
                              conj_in);
    }
  }
  __syncthreads();

  Cx<T>* mine = smem + threadIdx.y * span;
  run_passes<T>(mine, mine + n, n, npass, radices, tw, tw_pass, static_cast<int>(threadIdx.x),
                static_cast<int>(blockDim.x));
  const index_t result = (npass & 1) ? n : 0;  // offset of the result buffer in each row's span

  const int count = out_count;
  const T s = static_cast<T>(scale);
  const bool stores_fast = (rows_fast & 2) != 0;
  for (GridWalk w(tid, nthreads, stores_fast ? ry : count); w.major < (stores_fast ? count : ry); w.next()) {
    const int rr = stores_fast ? w.minor : w.major;
    const int k = stores_fast ? w.major : w.minor;
    const index_t row = row0 + rr;
    if (row < rows) {
      index_t o, i;
      split_row_after(o0, i0, rr, inner, o, i);
      const ResultRow<T> z{smem + rr * span + result, nullptr};
      store_value<T>(store_mode, out, o * out_outer + i * out_inner, out_elem, k, z, n, tw_edge, tw,
                     i * tw_post, conj_out, s, power);
    }
  }
}

template <typename T>
__device__ void fft_pass(const Cx<T>* __restrict__ src, Cx<T>* __restrict__ dst, const Cx<T>* __restrict__ tw,
                         index_t rows, int n, int radix, int ns, int tw_pass) {
  const index_t per_row = n / radix;
  const index_t total = rows * per_row;
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const index_t row = i / per_row;
    const int j = static_cast<int>(i - row * per_row);
    const Cx<T>* s = src + row * n;
    Cx<T>* d = dst + row * n;
    switch (radix) {
      case 2:
        stockham_step<2, T>(s, d, n, ns, j, tw, tw_pass);
        break;
      case 3:
        stockham_step<3, T>(s, d, n, ns, j, tw, tw_pass);
        break;
      case 4:
        stockham_step<4, T>(s, d, n, ns, j, tw, tw_pass);
        break;
      case 5:
        stockham_step<5, T>(s, d, n, ns, j, tw, tw_pass);
        break;
      case 7:
        stockham_step<7, T>(s, d, n, ns, j, tw, tw_pass);
        break;
      case 8:
        stockham_step<8, T>(s, d, n, ns, j, tw, tw_pass);
        break;
      case 11:
        stockham_step<11, T>(s, d, n, ns, j, tw, tw_pass);
        break;
      default:
        stockham_step<13, T>(s, d, n, ns, j, tw, tw_pass);
        break;
    }
  }
}

// dst: contiguous rows of m >= n; element e < n is load_value (times chirp[e] when chirp is given), the rest
// 0.
template <typename T>
__device__ void fft_pack(const void* __restrict__ in, Cx<T>* __restrict__ dst,
                         const Cx<T>* __restrict__ tw_edge, const Cx<T>* __restrict__ chirp, index_t rows,
                         index_t in_row, index_t in_elem, int n, int m, int in_len, int load_mode,
                         int conj_in) {
  const index_t total = rows * m;
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const index_t row = i / m;
    const int e = static_cast<int>(i - row * m);
    Cx<T> v = czero<T>();
    if (e < n) {
      v = load_value<T>(load_mode, in, row * in_row, in_elem, e, n, in_len, tw_edge, conj_in);
      if (chirp) v = v * chirp[e];
    }
    dst[i] = v;
  }
}

// out: `count` outputs per row (n + 1 for kStoreR2cEven, at most n otherwise) from contiguous source rows of
// m (the transform's result).
template <typename T>
__device__ void fft_unpack(const Cx<T>* __restrict__ src, void* __restrict__ out,
                           const Cx<T>* __restrict__ tw_edge, const Cx<T>* __restrict__ chirp, index_t rows,
                           index_t out_row, index_t out_elem, int n, int m, int count, int store_mode,
                           int conj_out, double scale) {
  const index_t total = rows * count;
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  const T s = static_cast<T>(scale);
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const index_t row = i / count;
    const int k = static_cast<int>(i - row * count);
    const ResultRow<T> z{src + row * m, chirp};
    store_value<T>(store_mode, out, row * out_row, out_elem, k, z, n, tw_edge, nullptr, 0, conj_out, s);
  }
}

template <typename T>
__device__ void fft_chirp_mul(Cx<T>* __restrict__ y, const Cx<T>* __restrict__ bhat, index_t rows, int m,
                              double inv_m) {
  const index_t total = rows * m;
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  const T s = static_cast<T>(inv_m);
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int j = static_cast<int>(i % m);
    y[i] = conj(y[i] * bhat[j]) * s;
  }
}

}  // namespace audio
}  // namespace pygpukit

#define PYGPUKIT_AUDIO_FFT_ENTRIES(T, SUFFIX)                                                                \
  extern "C" __global__ void fft_smem_##SUFFIX(                                                              \
      const void* in, void* out, const void* tw, const void* tw_edge, long long rows, long long inner,       \
      long long in_outer, long long in_inner, long long in_elem, long long out_outer, long long out_inner,   \
      long long out_elem, int n, int in_len, int out_count, int npass, unsigned long long radices,           \
      int tw_pass, int tw_post, int load_mode, int store_mode, int conj_in, int conj_out, int rows_fast,     \
      double scale, const void* window, long long x_len, long long pad_left, int pad_mode, double power) {   \
    using pygpukit::audio::Cx;                                                                               \
    pygpukit::audio::fft_smem<T>(in, out, static_cast<const Cx<T>*>(tw), static_cast<const Cx<T>*>(tw_edge), \
                                 rows, inner, in_outer, in_inner, in_elem, out_outer, out_inner, out_elem,   \
                                 n, in_len, out_count, npass, radices, tw_pass, tw_post, load_mode,          \
                                 store_mode, conj_in, conj_out, rows_fast, scale,                            \
                                 static_cast<const T*>(window), x_len, pad_left, pad_mode, power);           \
  }                                                                                                          \
  extern "C" __global__ void fft_pass_##SUFFIX(const void* src, void* dst, const void* tw, long long rows,   \
                                               int n, int radix, int ns, int tw_pass) {                      \
    using pygpukit::audio::Cx;                                                                               \
    pygpukit::audio::fft_pass<T>(static_cast<const Cx<T>*>(src), static_cast<Cx<T>*>(dst),                   \
                                 static_cast<const Cx<T>*>(tw), rows, n, radix, ns, tw_pass);                \
  }                                                                                                          \
  extern "C" __global__ void fft_pack_##SUFFIX(                                                              \
      const void* in, void* dst, const void* tw_edge, const void* chirp, long long rows, long long in_row,   \
      long long in_elem, int n, int m, int in_len, int load_mode, int conj_in) {                             \
    using pygpukit::audio::Cx;                                                                               \
    pygpukit::audio::fft_pack<T>(in, static_cast<Cx<T>*>(dst), static_cast<const Cx<T>*>(tw_edge),           \
                                 static_cast<const Cx<T>*>(chirp), rows, in_row, in_elem, n, m, in_len,      \
                                 load_mode, conj_in);                                                        \
  }                                                                                                          \
  extern "C" __global__ void fft_unpack_##SUFFIX(                                                            \
      const void* src, void* out, const void* tw_edge, const void* chirp, long long rows, long long out_row, \
      long long out_elem, int n, int m, int out_count, int store_mode, int conj_out, double scale) {         \
    using pygpukit::audio::Cx;                                                                               \
    pygpukit::audio::fft_unpack<T>(static_cast<const Cx<T>*>(src), out, static_cast<const Cx<T>*>(tw_edge),  \
                                   static_cast<const Cx<T>*>(chirp), rows, out_row, out_elem, n, m,          \
                                   out_count, store_mode, conj_out, scale);                                  \
  }                                                                                                          \
  extern "C" __global__ void fft_chirp_mul_##SUFFIX(void* y, const void* bhat, long long rows, int m,        \
                                                    double inv_m) {                                          \
    using pygpukit::audio::Cx;                                                                               \
    pygpukit::audio::fft_chirp_mul<T>(static_cast<Cx<T>*>(y), static_cast<const Cx<T>*>(bhat), rows, m,      \
                                      inv_m);                                                                \
  }

PYGPUKIT_AUDIO_FFT_ENTRIES(float, f32)
PYGPUKIT_AUDIO_FFT_ENTRIES(double, f64)
#undef PYGPUKIT_AUDIO_FFT_ENTRIES
