// A portable tiled GEMM on CUDA cores: D (batch, M, N) row-major = act(alpha * A (M x K) @ B (K x N) +
// bias) with any element strides for A and B (transposed views included), accumulating in Acc, with
// an optional bias over N and an activation (a codes::Activation). It runs, when cuBLASLt is absent
// or disabled, the dtypes the tensor-core kernel does not cover (float64, float32, int8) and operand
// layouts it does not take (neither dimension unit-strided). Instantiated per type triple through
// NVRTC name expressions: "pygpukit::ops::gemm::gemm_simt<float, float, float>".
//
// GemmShape is declared once in Python as well (pygpukit/ops/gemm/simt.py, a KernelStruct): the
// kernel compile check appends static_asserts that both agree on its size and every offset.
#include "../common/codes.cuh"
#include "../common/convert.cuh"

namespace pygpukit {
namespace ops {
namespace gemm {

template <typename Acc, typename T>
__device__ __forceinline__ Acc load_acc(const T* p) {
  if constexpr (sizeof(Acc) == 8 || sizeof(T) == 1) {
    return static_cast<Acc>(*p);  // double, or int8 into int
  } else {
    return static_cast<Acc>(to_float(*p));
  }
}

// The epilogue activation in the accumulator type (floating: float or double math; int: relu only,
// the only one an integer product is given).
template <typename Acc>
__device__ __forceinline__ Acc activate(Acc x, int activation) {
  if (activation == codes::kActRelu) return x > Acc(0) ? x : Acc(0);
  if constexpr (is_floating<Acc>()) {
    switch (activation) {
      case codes::kActGeluTanh:
        return Acc(0.5) * x * (Acc(1) + tanh(Acc(0.7978845608028654) * (x + Acc(0.044715) * x * x * x)));
      case codes::kActSilu:
        return x / (Acc(1) + exp(-x));
      case codes::kActGelu:
        return Acc(0.5) * x * (Acc(1) + erf(x * Acc(0.7071067811865476)));
      default:
        break;
    }
  }
  return x;
}

struct GemmShape {
  long long m, n, k;
  long long sa_m, sa_k, sa_batch;  // element strides of A
  long long sb_k, sb_n, sb_batch;  // element strides of B
  long long sd_batch;              // D is row-major (m, n) per batch
  int activation;                  // codes::Activation
  int has_bias;
  double alpha;
};

constexpr int kTile = 64;
constexpr int kTileK = 16;

// 256 threads, a 64 x 64 tile of D per block, 4 x 4 outputs per thread; grid.z walks the batch.
template <typename In, typename Out, typename Acc>
__global__ void __launch_bounds__(256)
    gemm_simt(const In* __restrict__ a, const In* __restrict__ b, Out* __restrict__ d,
              const Out* __restrict__ bias, GemmShape s) {
  __shared__ Acc as[kTileK][kTile + 1];
  __shared__ Acc bs[kTileK][kTile + 1];
  const long long batch = blockIdx.z;
  a += batch * s.sa_batch;
  b += batch * s.sb_batch;
  d += batch * s.sd_batch;
  const long long row0 = static_cast<long long>(blockIdx.y) * kTile;
  const long long col0 = static_cast<long long>(blockIdx.x) * kTile;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  Acc acc[4][4] = {};
  for (long long k0 = 0; k0 < s.k; k0 += kTileK) {
    for (int i = threadIdx.x; i < kTile * kTileK; i += 256) {
      const int r = i / kTileK, kk = i % kTileK;  // A tile: 64 rows x 16 k
      const long long gr = row0 + r, gk = k0 + kk;
      as[kk][r] = (gr < s.m && gk < s.k) ? load_acc<Acc>(a + gr * s.sa_m + gk * s.sa_k) : Acc(0);
      const int c = i % kTile, kb = i / kTile;  // B tile: 16 k x 64 cols
      const long long gc = col0 + c, gkb = k0 + kb;
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
    const long long r = row0 + ty + 16 * i;
    if (r >= s.m) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const long long c = col0 + tx + 16 * j;
      if (c >= s.n) continue;
      Acc v = acc[i][j];
      if constexpr (is_floating<Acc>()) v = static_cast<Acc>(s.alpha) * v;
      if (s.has_bias) v += load_acc<Acc>(bias + c);
      d[r * s.n + c] = convert<Out>(activate(v, s.activation));
    }
  }
}

}  // namespace gemm
}  // namespace ops
}  // namespace pygpukit
