// Group-quantized INT4 weight-only products on the packed HF checkpoint layouts (pygpukit/ops/quant/int4.py):
//
//   int4_gemv<L, T, M>(x, qweight, qzeros, scales, y, bias, rows, n, k, group, zero_offset, ldx, ldy, vector)
//       y[m, c] = sum_k x[m, k] * W[c, k] (+ bias[c]) for m < rows <= M and c < n, where
//       W[c, k] = scale[k / group, c] * (q[k, c] - zero[k / group, c]) and
//       L = 0 (AWQ):  qweight (k, n / 8) int32, column c of input row k in word [k, c / 8] at nibble
//                     awq_nibble(c % 8) (AutoAWQ's interleaved order); qzeros (k / group, n / 8) the same;
//       L = 1 (GPTQ): qweight (k / 8, n) int32, input row k of column c in word [k / 8, c] at nibble k % 8;
//                     qzeros (k / group, n / 8), nibble c % 8, plus zero_offset (1 for GPTQ's v1
//                     checkpoints, which store zero - 1; 0 for v2);
//       scales (k / group, n) float16; x, y, bias in T (float, __half, __nv_bfloat16); float32 sums.
//
//   int4_dequant<L, T>(qweight, qzeros, scales, out, n, k, group, zero_offset, first, count)
//       out[r, kk] = W[first + r, kk] for r < count, kk < k: rows of W (n, k) row-major in T (the prefill
//       path multiplies these tiles with the GEMM); out 16-byte aligned.
//
// GEMV layout (256 threads per block): a thread owns kVW consecutive words of qweight along its
// contiguous (output) axis and a share of K; kTX threads side by side cover the block's columns, kTY
// = 256 / kTX of them split K in chunks (AWQ: 8 input rows, one group; GPTQ: 4 packed rows = 32 input
// rows, one group), so even a small N gives many warps and every thread keeps several 16-byte loads in
// flight (all of a chunk's words are loaded before they are used).
//   AWQ:  kVW = 4 words (32 columns) for M <= 2, 2 for M <= 4, 1 for M = 8 (the accumulators grow with
//         M); a block covers 16 bytes of every input row (32 columns).
//   GPTQ: kVW = 4 words (4 columns of 8 input rows each); a block covers 16 columns.
// A chunk's scales and zero points are read (16-byte loads of the AWQ scales) and each weight decoded
// as fmaf(q, scale, -zero * scale) (exact: an fp16 scale times an integer below 17 fits a float). The
// partial sums of a column are added with warp shuffles and then over the 8 warps in a fixed order in
// shared memory (results are deterministic). `vector` (qweight rows 16-byte aligned for kVW words,
// x's rows 16-byte aligned) selects the vector loads; the last block's partial words are read one by one.
#include "../common/types.cuh"

namespace pygpukit {
namespace ops {
namespace int4gemv {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// The nibble of column c % 8 in an AWQ word: 0, 4, 1, 5, 2, 6, 3, 7 (AutoAWQ packs columns 0 2 4 6 1 3 5 7).
__device__ __forceinline__ int awq_nibble(int j) { return (j >> 1) | ((j & 1) << 2); }

__device__ __forceinline__ float nibble(unsigned int word, int index) {
  // (word >> 4 index) & 15 as a float without an int-to-float conversion: 2^23 + q, minus 2^23.
  return __uint_as_float(0x4B000000u | ((word >> (4 * index)) & 15u)) - 8388608.0f;
}

template <typename T>
__device__ __forceinline__ void load_x8(const T* p, bool vector, float* v) {
  if (vector) {
    if constexpr (sizeof(T) == 4) {
      const float4 a = *reinterpret_cast<const float4*>(p);
      const float4 c = *reinterpret_cast<const float4*>(p + 4);
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = c.x, v[5] = c.y, v[6] = c.z, v[7] = c.w;
    } else {
      const Pack<T, 8> pack = *reinterpret_cast<const Pack<T, 8>*>(p);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = to_float(pack.v[j]);
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = to_float(p[j]);
}

// kVW consecutive words at p: one vector load when `vector`, else one by one (words past `limit`
// words from p read as 0).
template <int VW>
__device__ __forceinline__ void load_words(const unsigned int* p, bool vector, int limit, unsigned int* w) {
  if constexpr (VW == 4) {
    if (vector) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
      return;
    }
  } else if constexpr (VW == 2) {
    if (vector) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
      w[0] = v.x, w[1] = v.y;
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < VW; ++i) w[i] = i < limit ? __ldg(p + i) : 0u;
}

template <int L, int M>
struct Shape {
  static constexpr int kVW = L == 0 ? (M <= 2 ? 4 : (M <= 4 ? 2 : 1)) : 4;  // words per thread
  static constexpr int kTX = L == 0 ? 4 / kVW : 4;      // threads across a block's columns
  static constexpr int kTY = kThreads / kTX;            // threads along K
  static constexpr int kCols = L == 0 ? 8 * kVW : kVW;  // output columns per thread
  static constexpr int kBlockCols = kTX * kCols;        // AWQ 32, GPTQ 16
  static constexpr int kChunk = L == 0 ? 8 : 32;        // input rows per step
};

template <int L, typename T, int M>
__global__ void __launch_bounds__(kThreads)
    int4_gemv(const T* __restrict__ x, const unsigned int* __restrict__ qweight,
              const unsigned int* __restrict__ qzeros, const __half* __restrict__ scales, T* __restrict__ y,
              const T* __restrict__ bias, int rows, int n, int k, int group, int zero_offset, long long ldx,
              long long ldy, int vector) {
  using S = Shape<L, M>;
  constexpr int VW = S::kVW, TX = S::kTX, TY = S::kTY, COLS = S::kCols;
  __shared__ float partial[kWarps][TX][M * COLS];
  const int tx = static_cast<int>(threadIdx.x) % TX;
  const int ty = static_cast<int>(threadIdx.x) / TX;
  const int words = L == 0 ? n / 8 : n;                          // qweight words per (packed) row
  const int w0 = (static_cast<int>(blockIdx.x) * TX + tx) * VW;  // this thread's first word
  const int limit = words - w0;                                  // words of this thread that exist
  const bool vec = vector != 0 && limit >= VW;
  const bool xvec = vector != 0;

  float acc[M][COLS];
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int j = 0; j < COLS; ++j) acc[m][j] = 0.0f;
  }

  if (limit > 0) {
    const int chunks = k / S::kChunk;
    for (int ch = ty; ch < chunks; ch += TY) {
      const int k0 = ch * S::kChunk;
      const int g = k0 / group;
      float s[COLS], o[COLS];
      if constexpr (L == 0) {
        unsigned int zw[VW];
#pragma unroll
        for (int i = 0; i < VW; ++i)
          zw[i] = i < limit ? __ldg(qzeros + static_cast<long long>(g) * words + w0 + i) : 0u;
#pragma unroll
        for (int i = 0; i < VW; ++i) {
          Pack<__half, 8> sp;
          if (i < limit) {
            sp = *reinterpret_cast<const Pack<__half, 8>*>(scales + static_cast<long long>(g) * n +
                                                           8 * (w0 + i));
          } else {
#pragma unroll
            for (int j = 0; j < 8; ++j) sp.v[j] = __float2half(0.0f);
          }
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            s[8 * i + j] = __half2float(sp.v[j]);
            o[8 * i + j] = -nibble(zw[i], awq_nibble(j)) * s[8 * i + j];
          }
        }
        unsigned int w[8][VW];
#pragma unroll
        for (int r = 0; r < 8; ++r)
          load_words<VW>(qweight + static_cast<long long>(k0 + r) * words + w0, vec, limit, w[r]);
        float xv[M][8];
#pragma unroll
        for (int m = 0; m < M; ++m) {
          if (m < rows) load_x8(x + m * ldx + k0, xvec, xv[m]);
        }
#pragma unroll
        for (int r = 0; r < 8; ++r) {
#pragma unroll
          for (int i = 0; i < VW; ++i) {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
              const float wf = fmaf(nibble(w[r][i], awq_nibble(j)), s[8 * i + j], o[8 * i + j]);
#pragma unroll
              for (int m = 0; m < M; ++m) {
                if (m < rows) acc[m][8 * i + j] = fmaf(xv[m][r], wf, acc[m][8 * i + j]);
              }
            }
          }
        }
      } else {
        const unsigned int zw = __ldg(qzeros + static_cast<long long>(g) * (n / 8) + w0 / 8);
#pragma unroll
        for (int j = 0; j < COLS; ++j) {
          s[j] = j < limit ? __half2float(scales[static_cast<long long>(g) * n + w0 + j]) : 0.0f;
          o[j] = -(nibble(zw, (w0 + j) % 8) + static_cast<float>(zero_offset)) * s[j];
        }
        unsigned int w[4][VW];
#pragma unroll
        for (int r = 0; r < 4; ++r)
          load_words<VW>(qweight + static_cast<long long>(k0 / 8 + r) * n + w0, vec, limit, w[r]);
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          float xv[M][8];
#pragma unroll
          for (int m = 0; m < M; ++m) {
            if (m < rows) load_x8(x + m * ldx + k0 + 8 * r, xvec, xv[m]);
          }
#pragma unroll
          for (int j = 0; j < COLS; ++j) {
#pragma unroll
            for (int e = 0; e < 8; ++e) {
              const float wf = fmaf(nibble(w[r][j], e), s[j], o[j]);
#pragma unroll
              for (int m = 0; m < M; ++m) {
                if (m < rows) acc[m][j] = fmaf(xv[m][e], wf, acc[m][j]);
              }
            }
          }
        }
      }
    }
  }

  // Lanes tx, tx + TX, tx + 2 TX, ... of a warp hold the same columns.
  const int warp = static_cast<int>(threadIdx.x) >> 5;
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int j = 0; j < COLS; ++j) {
      float v = acc[m][j];
#pragma unroll
      for (int delta = TX; delta < 32; delta <<= 1) v += __shfl_xor_sync(0xffffffffu, v, delta);
      acc[m][j] = v;
    }
  }
  if ((threadIdx.x & 31) < TX) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
      for (int j = 0; j < COLS; ++j) partial[warp][tx][m * COLS + j] = acc[m][j];
    }
  }
  __syncthreads();
  const int first = static_cast<int>(blockIdx.x) * S::kBlockCols;  // the block's first output column
  for (int e = static_cast<int>(threadIdx.x); e < M * S::kBlockCols; e += kThreads) {
    const int m = e / S::kBlockCols;
    const int local = e % S::kBlockCols;
    const int col = first + local;
    if (m >= rows || col >= n) continue;
    const int t = local / COLS;
    const int j = local % COLS;
    float sum = 0.0f;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) sum += partial[v][t][m * COLS + j];
    if (bias != nullptr) sum += to_float(bias[col]);
    y[m * ldy + col] = from_float<T>(sum);
  }
}

template <int L, typename T>
__global__ void __launch_bounds__(kThreads)
    int4_dequant(const unsigned int* __restrict__ qweight, const unsigned int* __restrict__ qzeros,
                 const __half* __restrict__ scales, T* __restrict__ out, int n, int k, int group,
                 int zero_offset, int first, int count) {
  // A thread decodes 16 consecutive input rows of one column (one group: 32 bytes of out, stored
  // with 16-byte stores); neighbouring threads take neighbouring columns, so the words they read
  // are side by side (AWQ: 8 columns share a word, GPTQ: consecutive words).
  constexpr int kPack = 16 / static_cast<int>(sizeof(T));
  const long long units = static_cast<long long>(count) * (k / 16);
  const long long stride = static_cast<long long>(gridDim.x) * kThreads;
  for (long long u = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x; u < units; u += stride) {
    const int r = static_cast<int>(u % count);
    const int k0 = static_cast<int>(u / count) * 16;
    const int col = first + r;
    const int g = k0 / group;
    const float s = __half2float(scales[static_cast<long long>(g) * n + col]);
    const unsigned int zw = __ldg(qzeros + static_cast<long long>(g) * (n / 8) + col / 8);
    float q[16], z;
    if constexpr (L == 0) {
      const int field = awq_nibble(col % 8);
      z = nibble(zw, field);
#pragma unroll
      for (int e = 0; e < 16; ++e)
        q[e] = nibble(__ldg(qweight + static_cast<long long>(k0 + e) * (n / 8) + col / 8), field);
    } else {
      z = nibble(zw, col % 8) + static_cast<float>(zero_offset);
      const unsigned int w0 = __ldg(qweight + static_cast<long long>(k0 / 8) * n + col);
      const unsigned int w1 = __ldg(qweight + static_cast<long long>(k0 / 8 + 1) * n + col);
#pragma unroll
      for (int e = 0; e < 8; ++e) q[e] = nibble(w0, e), q[8 + e] = nibble(w1, e);
    }
    const float o = -z * s;
    T* dst = out + static_cast<long long>(r) * k + k0;
#pragma unroll
    for (int p = 0; p < 16; p += kPack) {
      Pack<T, kPack> pack;
#pragma unroll
      for (int i = 0; i < kPack; ++i) pack.v[i] = from_float<T>(fmaf(q[p + i], s, o));
      *reinterpret_cast<Pack<T, kPack>*>(dst + p) = pack;
    }
  }
}

}  // namespace int4gemv
}  // namespace ops
}  // namespace pygpukit
