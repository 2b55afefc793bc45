// Pieces shared by the FFT kernels of fft.cu (the generic Stockham kernels) and fft_reg.cu (the
// register-resident power-of-two kernels): the R-point DFTs of the butterflies, and the first stage's read
// and the last stage's write of a row (the FftLoad and FftStore modes of audio_codes.cuh). fft.cu's
// opening comment describes the transforms and the conventions (forward DFTs only; an inverse one
// conjugates on the way in and out).
#pragma once

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

// 16 points as 4 x 4: four 4-point DFTs over the inputs n1 = 0..3 of each residue n2 (x[4 n1 + n2]), the
// twiddles W_16^(n2 k1), and four 4-point DFTs over n2; output k1 + 4 k2.
template <typename T>
__device__ __forceinline__ Cx<T> w16_times(int m, Cx<T> a) {  // W_16^m a for m in {0..4, 6, 9}
  const T c1 = static_cast<T>(0.92387953251128674);           // cos(pi / 8)
  const T s1 = static_cast<T>(0.38268343236508977);           // sin(pi / 8)
  const T h = static_cast<T>(0.70710678118654752);
  switch (m) {
    case 0:
      return a;
    case 1:
      return a * cx<T>(c1, -s1);
    case 2:
      return cx<T>(h * (a.re + a.im), h * (a.im - a.re));
    case 3:
      return a * cx<T>(s1, -c1);
    case 4:
      return mul_neg_i(a);
    case 6:
      return cx<T>(h * (a.im - a.re), -h * (a.re + a.im));
    default:  // 9
      return a * cx<T>(-c1, s1);
  }
}

template <typename T>
struct Dft<16, T> {
  static __device__ __forceinline__ void run(Cx<T>* v) {
#pragma unroll
    for (int n2 = 0; n2 < 4; ++n2) dft4(v[n2], v[4 + n2], v[8 + n2], v[12 + n2]);  // v[4 k1 + n2]
#pragma unroll
    for (int n2 = 1; n2 < 4; ++n2) {
#pragma unroll
      for (int k1 = 1; k1 < 4; ++k1) v[4 * k1 + n2] = w16_times<T>(n2 * k1, v[4 * k1 + n2]);
    }
    Cx<T> u[16];
#pragma unroll
    for (int k1 = 0; k1 < 4; ++k1) {
      Cx<T> a0 = v[4 * k1], a1 = v[4 * k1 + 1], a2 = v[4 * k1 + 2], a3 = v[4 * k1 + 3];
      dft4(a0, a1, a2, a3);
      u[k1] = a0;
      u[k1 + 4] = a1;
      u[k1 + 8] = a2;
      u[k1 + 12] = a3;
    }
#pragma unroll
    for (int k = 0; k < 16; ++k) v[k] = u[k];
  }
};

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

// Row row0 + r of a launch (r >= 0, a row of the same block) from row0's split (o0, i0): a few steps,
// no division (the GridWalk loops below split every position's row this way).
__device__ __forceinline__ void split_row_after(index_t o0, index_t i0, int r, index_t inner, index_t& outer,
                                                index_t& in_row) {
  if (inner == 1) {
    outer = o0 + r;
    in_row = 0;
    return;
  }
  index_t i = i0 + r;
  index_t o = o0;
  while (i >= inner) {
    i -= inner;
    ++o;
  }
  outer = o;
  in_row = i;
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
// the exponent of kStoreR2cPower. `z` is the transform's row: z(k) its value k (ResultRow, or fft_reg.cu's
// padded shared-memory row).
template <typename T, typename Row>
__device__ __forceinline__ void store_value(int mode, void* __restrict__ out, index_t base, index_t elem,
                                            int k, const Row& z, int n, const Cx<T>* __restrict__ tw_edge,
                                            const Cx<T>* __restrict__ tw, index_t post_step, int conj_out,
                                            T scale, double power = 2.0) {
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

}  // namespace audio
}  // namespace pygpukit
