// A portable tiled GEMM on CUDA cores: D (batch, M, N) row-major = A (M x K) @ B (K x N) with any
// element strides for A and B (transposed views included), accumulating in Acc, with an optional
// bias over N and an activation (0 none, 1 relu, 2 gelu-tanh). It is the fallback when cuBLASLt is
// absent or disabled, for the dtypes the tensor-core kernel does not cover (float64, float32, int8)
// and for shapes it does not take. Instantiated per type triple through NVRTC name expressions:
// "pygpukit::gemm_simt<float, float, float>".
#include "../common/types.cuh"

namespace pygpukit {

namespace simt {
template <typename T>
struct Floating {
  static constexpr bool value = ops::SameType<T, float>::value || ops::SameType<T, double>::value;
};
}  // namespace simt

template <typename T>
__device__ __forceinline__ float load_as_float(const T* p) {
  return static_cast<float>(*p);
}
template <>
__device__ __forceinline__ float load_as_float<__half>(const __half* p) {
  return __half2float(*p);
}
template <>
__device__ __forceinline__ float load_as_float<__nv_bfloat16>(const __nv_bfloat16* p) {
  return __bfloat162float(*p);
}

template <typename Acc, typename T>
__device__ __forceinline__ Acc load_acc(const T* p) {
  if constexpr (sizeof(Acc) == 8 || sizeof(T) == 1) {
    return static_cast<Acc>(*p);
  } else {
    return static_cast<Acc>(load_as_float<T>(p));
  }
}

template <typename Out, typename Acc>
__device__ __forceinline__ Out store_from(Acc v) {
  if constexpr (ops::SameType<Out, __half>::value) {
    return __float2half_rn(static_cast<float>(v));
  } else if constexpr (ops::SameType<Out, __nv_bfloat16>::value) {
    return __float2bfloat16_rn(static_cast<float>(v));
  } else {
    return static_cast<Out>(v);
  }
}

template <typename Acc>
__device__ __forceinline__ Acc activate(Acc x, int activation) {
  if constexpr (simt::Floating<Acc>::value) {
    if (activation == 1) return x > Acc(0) ? x : Acc(0);
    if (activation == 2) {
      const Acc k0 = Acc(0.7978845608028654), k1 = Acc(0.044715);
      return Acc(0.5) * x * (Acc(1) + tanh(k0 * (x + k1 * x * x * x)));
    }
  } else {
    if (activation == 1) return x > Acc(0) ? x : Acc(0);
  }
  return x;
}

struct GemmShape {
  index_t m, n, k;
  index_t sa_m, sa_k, sa_batch;  // element strides of A
  index_t sb_k, sb_n, sb_batch;  // element strides of B
  index_t sd_batch;              // D is row-major (m, n) per batch
  int activation;
  int has_bias;
  double alpha;
};

constexpr int kTile = 64;
constexpr int kTileK = 16;

// 256 threads, a 64 x 64 tile of D per block, 4 x 4 outputs per thread.
template <typename In, typename Out, typename Acc>
__global__ void __launch_bounds__(256)
    gemm_simt(const In* __restrict__ a, const In* __restrict__ b, Out* __restrict__ d,
              const Out* __restrict__ bias, GemmShape s) {
  __shared__ Acc as[kTileK][kTile + 1];
  __shared__ Acc bs[kTileK][kTile + 1];
  const index_t batch = blockIdx.z;
  a += batch * s.sa_batch;
  b += batch * s.sb_batch;
  d += batch * s.sd_batch;
  const index_t row0 = static_cast<index_t>(blockIdx.y) * kTile;
  const index_t col0 = static_cast<index_t>(blockIdx.x) * kTile;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  Acc acc[4][4] = {};
  for (index_t k0 = 0; k0 < s.k; k0 += kTileK) {
    for (int i = threadIdx.x; i < kTile * kTileK; i += 256) {
      const int r = i / kTileK, kk = i % kTileK;  // A tile: 64 rows x 16 k
      const index_t gr = row0 + r, gk = k0 + kk;
      as[kk][r] = (gr < s.m && gk < s.k) ? load_acc<Acc>(a + gr * s.sa_m + gk * s.sa_k) : Acc(0);
      const int c = i % kTile, kb = i / kTile;  // B tile: 16 k x 64 cols
      const index_t gc = col0 + c, gkb = k0 + kb;
      bs[kb][c] = (gc < s.n && gkb < s.k) ? load_acc<Acc>(b + gkb * s.sb_k + gc * s.sb_n) : Acc(0);
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTileK; ++kk) {
      Acc av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = as[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = bs[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const index_t r = row0 + ty + 16 * i;
    if (r >= s.m) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const index_t c = col0 + tx + 16 * j;
      if (c >= s.n) continue;
      Acc v = acc[i][j];
      if constexpr (simt::Floating<Acc>::value) v = static_cast<Acc>(s.alpha) * v;
      if (s.has_bias) v += load_acc<Acc>(bias + c);
      d[r * s.n + c] = store_from<Out>(activate(v, s.activation));
    }
  }
}

}  // namespace pygpukit
