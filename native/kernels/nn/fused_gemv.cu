// One-row GEMV with the decode step's neighbours fused in (pygpukit/ops/fused_gemv.py):
//
//   fused_gemv<T, P, R, N>(args)
//       y[n] = [residual[n] +] [round(] round(sum_k p[k] * W[n, k]) [+ bias[n])]   for n < N, W row-major N x
//       K p = the prologue of x, computed by every block into shared memory and rounded to T (as the separate
//       op would store it):
//         P = 0 (kNone):    p = x (K values)
//         P = 1 (kRmsNorm): p = x * rsqrt(mean(x * x) + eps) * norm_w   (x: K values, RMSNorm)
//         P = 2 (kSwiglu):  p = silu(x[:K]) * x[K:]                     (x: 2K values, gate | up)
//       The bias is added to the rounded product and rounded again (as a GEMV into a buffer followed by
//       an add: the decoder's unfused step). With `residual` the result is residual[n] + that, rounded
//       again (the residual
//       add of a transformer layer, as add_rmsnorm rounds it); y may be residual itself (each output
//       is read and written by one thread).
//   Each warp owns R consecutive rows of W and walks their K extent, lanes striding over 16-byte
//   chunks (several loads in flight, or, with N > 0, all of a short row's chunks loaded into registers
//   before the prologue), x from shared memory; the dot products end with a warp-shuffle
//   reduction. The host launches it only for 16-byte aligned rows (K a multiple of 16 / sizeof(T),
//   aligned bases and row stride) and K * sizeof(T) within the dynamic shared memory it asks for.
#include "../common/layout.cuh"
#include "../common/overlap.cuh"

namespace pygpukit {
namespace ops {

struct FusedGemvArgs {
  const void* x;         // (K,) or (2K,) for kSwiglu
  const void* norm_w;    // (K,), kRmsNorm
  const void* w;         // (N, K) row-major, row stride ldw
  const void* bias;      // (N,) or null
  const void* residual;  // (N,) or null
  void* y;               // (N,)
  long long ldw;         // elements
  int n;
  int k;
  float eps;
  int pad;
};

constexpr int kFusedGemvThreads = 256;
constexpr int kFusedGemvWarps = kFusedGemvThreads / 32;

// W is streamed: each byte is used once, so keep it out of L1.
__device__ __forceinline__ uint4 fused_gemv_load(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// One 16-byte chunk of x (from shared memory) against chunk `raw` of a row of W, into acc.
template <typename T, int E>
__device__ __forceinline__ void fused_gemv_dot(const T* xs, int c, const uint4& raw, float& acc) {
  const Pack<T, E> xp = *reinterpret_cast<const Pack<T, E>*>(xs + c * E);
  const Pack<T, E> wp = *reinterpret_cast<const Pack<T, E>*>(&raw);
#pragma unroll
  for (int e = 0; e < E; ++e) acc = fmaf(convert<float>(xp.v[e]), convert<float>(wp.v[e]), acc);
}

// N = 0: the warp streams its rows of W after the prologue, U chunks per lane and row in flight. N > 0
// (rows of at most 32 N chunks: the host's choice): every chunk of the warp's rows is loaded into
// registers first, then the prologue runs while they arrive, so a short row costs one memory round
// trip instead of the prologue's and the loop's in turn. Each lane adds its chunks in the same order
// either way (ascending), so both give the same bits.
template <typename T, int P, int R, int N>
__global__ void __launch_bounds__(kFusedGemvThreads) fused_gemv(FusedGemvArgs a) {
  constexpr int E = 16 / static_cast<int>(sizeof(T));
  extern __shared__ uint4 fused_gemv_smem[];
  T* xs = reinterpret_cast<T*>(fused_gemv_smem);
  __shared__ float partial[kFusedGemvWarps];
  const T* x = static_cast<const T*>(a.x);
  const int k = a.k;
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int n = a.n;
  const int row0 = (static_cast<int>(blockIdx.x) * kFusedGemvWarps + warp) * R;
  const T* w = static_cast<const T*>(a.w);

  // Launched programmatically (SM90+), the warp's rows of W head for L2 while the kernel before this
  // one finishes; x and the residual are read only after it has.
  if (lane < R && row0 + lane < n) {
    prefetch_l2(w + static_cast<long long>(row0 + lane) * a.ldw, static_cast<unsigned>(k * sizeof(T)));
  }
  overlap_wait();

  const int chunks = k / E;
  const T* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = w + static_cast<long long>(min(row0 + r, n - 1)) * a.ldw;
  uint4 held[N > 0 ? N : 1][R];
  if (N > 0 && row0 < n) {
#pragma unroll
    for (int u = 0; u < N; ++u) {
      const int c = lane + 32 * u;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        held[u][r] = c < chunks ? fused_gemv_load(rows[r] + static_cast<long long>(c) * E)
                                : make_uint4(0u, 0u, 0u, 0u);
      }
    }
  }

  // The prologue: p into shared memory, rounded to T.
  float scale = 1.0f;
  if (P == 1) {
    float ss = 0.0f;
    for (int i = tid; i < k; i += kFusedGemvThreads) {
      const float v = convert<float>(x[i]);
      ss = fmaf(v, v, ss);
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, offset);
    if (lane == 0) partial[warp] = ss;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < kFusedGemvWarps; ++i) total += partial[i];
    scale = rsqrtf(total / static_cast<float>(k) + a.eps);
  }
  const T* norm_w = static_cast<const T*>(a.norm_w);
  for (int i = tid; i < k; i += kFusedGemvThreads) {
    float v;
    if (P == 1) {
      v = convert<float>(x[i]) * scale * convert<float>(norm_w[i]);
    } else if (P == 2) {
      const float g = convert<float>(x[i]);
      v = g / (1.0f + expf(-g)) * convert<float>(x[k + i]);
    } else {
      v = convert<float>(x[i]);
    }
    xs[i] = convert<T>(v);
  }
  __syncthreads();

  if (row0 >= n) return;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  if (N > 0) {
#pragma unroll
    for (int u = 0; u < N; ++u) {
      const int c = lane + 32 * u;
      if (c < chunks) {
#pragma unroll
        for (int r = 0; r < R; ++r) fused_gemv_dot<T, E>(xs, c, held[u][r], acc[r]);
      }
    }
  }
  constexpr int U = 4;            // chunks in flight per lane and row
  int c = N > 0 ? chunks : lane;  // N > 0: done above
  for (; c + (U - 1) * 32 < chunks; c += U * 32) {
    uint4 wv[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int r = 0; r < R; ++r)
        wv[u][r] = fused_gemv_load(rows[r] + static_cast<long long>(c + u * 32) * E);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int r = 0; r < R; ++r) fused_gemv_dot<T, E>(xs, c + u * 32, wv[u][r], acc[r]);
    }
  }
  if (c + 32 < chunks) {  // two more chunks per row in flight (short rows: K of a few hundred)
    uint4 wv[2][R];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
#pragma unroll
      for (int r = 0; r < R; ++r)
        wv[u][r] = fused_gemv_load(rows[r] + static_cast<long long>(c + u * 32) * E);
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
#pragma unroll
      for (int r = 0; r < R; ++r) fused_gemv_dot<T, E>(xs, c + u * 32, wv[u][r], acc[r]);
    }
    c += 64;
  }
  for (; c < chunks; c += 32) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      fused_gemv_dot<T, E>(xs, c, fused_gemv_load(rows[r] + static_cast<long long>(c) * E), acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], offset);
  }
  if (lane < R && row0 + lane < n) {
    float sum = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) sum = lane == r ? acc[r] : sum;
    const int col = row0 + lane;
    const T* bias = static_cast<const T*>(a.bias);
    T out = convert<T>(sum);
    if (bias != nullptr) out = convert<T>(convert<float>(out) + convert<float>(bias[col]));
    const T* residual = static_cast<const T*>(a.residual);
    if (residual != nullptr) out = convert<T>(convert<float>(residual[col]) + convert<float>(out));
    static_cast<T*>(a.y)[col] = out;
  }
}

}  // namespace ops
}  // namespace pygpukit
