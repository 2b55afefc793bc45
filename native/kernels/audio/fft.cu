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
#include "complex.cuh"
#include "padding.cuh"

namespace pygpukit {
namespace audio {

// cos and sin of 2 pi j / R for 1 <= j <= (R - 1) / 2, rounded once from extended precision.
template <int R>
__device__ __forceinline__ double root_cos(int j);
template <int R>
__device__ __forceinline__ double root_sin(int j);

template <>
__device__ __forceinline__ double root_cos<3>(int) {
  return -0.5;
}
template <>
__device__ __forceinline__ double root_sin<3>(int) {
  return 0.8660254037844386;
}
template <>
__device__ __forceinline__ double root_cos<5>(int j) {
  return j == 1 ? 0.30901699437494745 : -0.8090169943749475;
}
template <>
__device__ __forceinline__ double root_sin<5>(int j) {
  return j == 1 ? 0.9510565162951535 : 0.5877852522924731;
}
template <>
__device__ __forceinline__ double root_cos<7>(int j) {
  return j == 1 ? 0.6234898018587335 : j == 2 ? -0.2225209339563144 : -0.9009688679024191;
}
template <>
__device__ __forceinline__ double root_sin<7>(int j) {
  return j == 1 ? 0.7818314824680298 : j == 2 ? 0.9749279121818236 : 0.4338837391175581;
}
template <>
__device__ __forceinline__ double root_cos<11>(int j) {
  switch (j) {
    case 1:
      return 0.8412535328311812;
    case 2:
      return 0.41541501300188644;
    case 3:
      return -0.14231483827328514;
    case 4:
      return -0.6548607339452851;
    default:
      return -0.9594929736144974;
  }
}
template <>
__device__ __forceinline__ double root_sin<11>(int j) {
  switch (j) {
    case 1:
      return 0.5406408174555976;
    case 2:
      return 0.9096319953545183;
    case 3:
      return 0.9898214418809327;
    case 4:
      return 0.7557495743542583;
    default:
      return 0.28173255684142967;
  }
}
template <>
__device__ __forceinline__ double root_cos<13>(int j) {
  switch (j) {
    case 1:
      return 0.8854560256532099;
    case 2:
      return 0.5680647467311558;
    case 3:
      return 0.12053668025532305;
    case 4:
      return -0.3546048870425356;
    case 5:
      return -0.7485107481711011;
    default:
      return -0.970941817426052;
  }
}
template <>
__device__ __forceinline__ double root_sin<13>(int j) {
  switch (j) {
    case 1:
      return 0.46472317204376856;
    case 2:
      return 0.8229838658936564;
    case 3:
      return 0.992708874098054;
    case 4:
      return 0.9350162426854148;
    case 5:
      return 0.6631226582407952;
    default:
      return 0.23931566428755777;
  }
}

// -- the R-point forward DFTs, in place on v[0..R)
// ------------------------------------------------------------
template <typename T>
__device__ __forceinline__ void dft4(Cx<T>& a0, Cx<T>& a1, Cx<T>& a2, Cx<T>& a3) {
  const Cx<T> t0 = a0 + a2;
  const Cx<T> t1 = a0 - a2;
  const Cx<T> t2 = a1 + a3;
  const Cx<T> t3 = mul_neg_i(a1 - a3);
  a0 = t0 + t2;
  a2 = t0 - t2;
  a1 = t1 + t3;
  a3 = t1 - t3;
}

// Odd R: inputs m and R - m in pairs, X[k] = A - iB and X[R - k] = A + iB with
// A = v0 + sum (v_m + v_(R-m)) cos(2 pi m k / R), B = sum (v_m - v_(R-m)) sin(2 pi m k / R).
template <int R, typename T>
__device__ __forceinline__ void dft_odd(Cx<T>* v) {
  constexpr int H = (R - 1) / 2;
  Cx<T> s[H + 1];
  Cx<T> d[H + 1];
  const Cx<T> x0 = v[0];
  Cx<T> total = x0;
#pragma unroll
  for (int m = 1; m <= H; ++m) {
    s[m] = v[m] + v[R - m];
    d[m] = v[m] - v[R - m];
    total = total + s[m];
  }
  v[0] = total;
#pragma unroll
  for (int k = 1; k <= H; ++k) {
    Cx<T> a = x0;
    Cx<T> b = czero<T>();
#pragma unroll
    for (int m = 1; m <= H; ++m) {
      const int q = (m * k) % R;
      const T c = q <= H ? static_cast<T>(root_cos<R>(q)) : static_cast<T>(root_cos<R>(R - q));
      const T sn = q <= H ? static_cast<T>(root_sin<R>(q)) : -static_cast<T>(root_sin<R>(R - q));
      a.re += s[m].re * c;
      a.im += s[m].im * c;
      b.re += d[m].re * sn;
      b.im += d[m].im * sn;
    }
    v[k] = cx<T>(a.re + b.im, a.im - b.re);
    v[R - k] = cx<T>(a.re - b.im, a.im + b.re);
  }
}

template <int R, typename T>
struct Dft {
  static __device__ __forceinline__ void run(Cx<T>* v) { dft_odd<R, T>(v); }
};

template <typename T>
struct Dft<2, T> {
  static __device__ __forceinline__ void run(Cx<T>* v) {
    const Cx<T> t = v[0];
    v[0] = t + v[1];
    v[1] = t - v[1];
  }
};

template <typename T>
struct Dft<4, T> {
  static __device__ __forceinline__ void run(Cx<T>* v) { dft4(v[0], v[1], v[2], v[3]); }
};

// 8 points: two 4-point DFTs of the even and odd inputs, joined with W_8^k.
template <typename T>
struct Dft<8, T> {
  static __device__ __forceinline__ void run(Cx<T>* v) {
    const T c = static_cast<T>(0.70710678118654752);
    Cx<T> e0 = v[0], e1 = v[2], e2 = v[4], e3 = v[6];
    Cx<T> o0 = v[1], o1 = v[3], o2 = v[5], o3 = v[7];
    dft4(e0, e1, e2, e3);
    dft4(o0, o1, o2, o3);
    const Cx<T> w1 = cx<T>(c * (o1.re + o1.im), c * (o1.im - o1.re));   // W_8 o1
    const Cx<T> w2 = mul_neg_i(o2);                                     // W_8^2 o2
    const Cx<T> w3 = cx<T>(c * (o3.im - o3.re), -c * (o3.re + o3.im));  // W_8^3 o3
    v[0] = e0 + o0;
    v[4] = e0 - o0;
    v[1] = e1 + w1;
    v[5] = e1 - w1;
    v[2] = e2 + w2;
    v[6] = e2 - w2;
    v[3] = e3 + w3;
    v[7] = e3 - w3;
  }
};

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

// -- the first stage's read and the last stage's write ------------------------------------------------------
// Element e (< n, the transform length) of an input row starting at `in + base` (elements of the input's
// type: complex, or real for kLoadRealPairs and kLoadReal) with element stride `elem`; `in_len` elements
// are valid (zero past them). tw_edge: the roots W_(2n)^k of the real transforms of an even length.
template <typename T>
__device__ __forceinline__ Cx<T> load_value(int mode, const void* __restrict__ in, index_t base, index_t elem,
                                            int e, int n, int in_len, const Cx<T>* __restrict__ tw_edge,
                                            int conj_in) {
  Cx<T> v = czero<T>();
  if (mode == codes::kLoadComplex) {
    const Cx<T>* p = static_cast<const Cx<T>*>(in) + base;
    if (e < in_len) v = p[e * elem];
  } else if (mode == codes::kLoadRealPairs) {
    const T* p = static_cast<const T*>(in) + base;
    const index_t i0 = 2 * static_cast<index_t>(e);
    if (i0 < in_len) v.re = p[i0 * elem];
    if (i0 + 1 < in_len) v.im = p[(i0 + 1) * elem];
  } else if (mode == codes::kLoadReal) {
    const T* p = static_cast<const T*>(in) + base;
    if (e < in_len) v.re = p[e * elem];
  } else if (mode == codes::kLoadC2rEven) {
    // Z'[e] = (X[e] + conj X[n - e]) + i (X[e] - conj X[n - e]) W_(2n)^(-e); imaginary parts of X[0] and
    // X[n] (DC and Nyquist) are ignored, as numpy.fft.irfft does.
    const Cx<T>* p = static_cast<const Cx<T>*>(in) + base;
    const int m = n - e;
    Cx<T> x = czero<T>();
    Cx<T> y = czero<T>();
    if (e < in_len) x = p[e * elem];
    if (m < in_len) y = p[m * elem];
    if (e == 0) {
      x.im = T(0);
      y.im = T(0);
    }
    const Cx<T> sum = x + conj(y);
    const Cx<T> t = (x - conj(y)) * conj(tw_edge[e]);
    v = sum + mul_i(t);
  } else {  // kLoadHermitian: the full spectrum of an odd length n from its first n / 2 + 1 values
    const Cx<T>* p = static_cast<const Cx<T>*>(in) + base;
    if (e <= n / 2) {
      if (e < in_len) v = p[e * elem];
      if (e == 0) v.im = T(0);
    } else {
      const int m = n - e;
      if (m < in_len) v = conj(p[m * elem]);
    }
  }
  if (conj_in) v.im = -v.im;
  return v;
}

// kLoadFramePairs: element e of STFT frame (signal row at `in + row_start`, first padded position `start`)
// as the complex value (w[2e] x(start + 2e), w[2e + 1] x(start + 2e + 1)), x read through pad_mode outside
// [0, x_len) and w the window (null: none); the same values and arithmetic as spectral.cu's frame_signal.
template <typename T>
__device__ __forceinline__ Cx<T> load_frame_pair(const void* __restrict__ in, index_t row_start,
                                                 index_t start, int e, const T* __restrict__ window,
                                                 index_t x_len, int pad_mode) {
  const T* x = static_cast<const T*>(in) + row_start;
  const int j = 2 * e;
  const index_t t = start + j;
  Cx<T> v;
  if (t >= 0 && t + 1 < x_len) {
    v.re = x[t];
    v.im = x[t + 1];
  } else {
    v.re = padded(x, t, x_len, pad_mode);
    v.im = padded(x, t + 1, x_len, pad_mode);
  }
  if (window) {
    v.re *= window[j];
    v.im *= window[j + 1];
  }
  return v;
}

// Row r of a launch as (outer r / inner, inner r % inner), without a 64-bit division where it can.
__device__ __forceinline__ void split_row(index_t row, index_t inner, index_t& outer, index_t& in_row) {
  if (inner == 1) {
    outer = row;
    in_row = 0;
  } else if (row <= 0xffffffffll && inner <= 0xffffffffll) {
    const unsigned r = static_cast<unsigned>(row);
    const unsigned m = static_cast<unsigned>(inner);
    const unsigned o = r / m;
    outer = o;
    in_row = r - o * m;
  } else {
    outer = row / inner;
    in_row = row - outer * inner;
  }
}

// The flat positions q = start, start + step, ... of a (majors x m) grid as (major q / m, minor q % m),
// stepped without a division per position.
struct GridWalk {
  int major, minor, dmajor, dminor, m;
  __device__ __forceinline__ GridWalk(int start, int step, int m_)
      : major(start / m_), minor(start % m_), dmajor(step / m_), dminor(step % m_), m(m_) {}
  __device__ __forceinline__ void next() {
    minor += dminor;
    major += dmajor;
    if (minor >= m) {
      minor -= m;
      ++major;
    }
  }
};

// A row of a transform's result as the last stage reads it: z[k], or for Bluestein chirp[k] conj(z[k]).
template <typename T>
struct ResultRow {
  const Cx<T>* z;
  const Cx<T>* chirp;  // null: none
  __device__ __forceinline__ Cx<T> operator()(int k) const { return chirp ? chirp[k] * conj(z[k]) : z[k]; }
};

// Output k of a row starting at `out + base` (complex elements, or real for kStoreReal and kStoreR2cPower),
// element stride `elem`. post_step != 0: a four-step's first step, times W^(k post_step) from tw. `power`:
// the exponent of kStoreR2cPower.
template <typename T>
__device__ __forceinline__ void store_value(int mode, void* __restrict__ out, index_t base, index_t elem,
                                            int k, const ResultRow<T>& z, int n,
                                            const Cx<T>* __restrict__ tw_edge, const Cx<T>* __restrict__ tw,
                                            index_t post_step, int conj_out, T scale, double power = 2.0) {
  if (mode == codes::kStoreComplex) {
    Cx<T> v = z(k);
    if (conj_out) v.im = -v.im;
    if (post_step != 0) v = v * tw[k * post_step];
    static_cast<Cx<T>*>(out)[base + k * elem] = v * scale;
  } else if (mode == codes::kStoreR2cEven || mode == codes::kStoreR2cPower) {
    // X[k] = (Z[k] + conj Z[n - k]) / 2 + W_(2n)^k (-i) (Z[k] - conj Z[n - k]) / 2, k <= n, Z periodic.
    const Cx<T> zk = z(k == n ? 0 : k);
    const Cx<T> zc = conj(z(k == 0 ? 0 : n - k));
    const Cx<T> v = ((zk + zc) + tw_edge[k] * mul_neg_i(zk - zc)) * (T(0.5) * scale);
    if (mode == codes::kStoreR2cEven) {
      static_cast<Cx<T>*>(out)[base + k * elem] = v;
    } else {  // as spectrum_power (spectral.cu)
      const T m2 = norm2(v);
      static_cast<T*>(out)[base + k * elem] = power == 2.0   ? m2
                                              : power == 1.0 ? sqrt(m2)
                                                             : pow(m2, static_cast<T>(power) / T(2));
    }
  } else {  // kStoreReal
    static_cast<T*>(out)[base + k * elem] = z(k).re * scale;
  }
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

  // Positions q < ry n (ry n fits in an int: it is bounded by the shared memory).
  const bool loads_fast = (rows_fast & 1) != 0;
  for (GridWalk w(tid, nthreads, loads_fast ? ry : n); w.major < (loads_fast ? n : ry); w.next()) {
    const int rr = loads_fast ? w.minor : w.major;
    const int e = loads_fast ? w.major : w.minor;
    const index_t row = row0 + rr;
    if (row < rows) {
      index_t o, i;
      split_row(row, inner, o, i);
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
      split_row(row, inner, o, i);
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
