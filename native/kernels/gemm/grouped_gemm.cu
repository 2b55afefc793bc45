// Grouped GEMM of a mixture-of-experts layer, launched by pygpukit/ops/moe.py:
//
//   out[offsets[e] : offsets[e + 1]] = a[offsets[e] : offsets[e + 1]] @ op(W[e])     for every expert e
//
// a is the permuted activations (rows x K, row-major, leading dimension lda), W holds one matrix per
// expert, w_stride elements apart: N x K row-major when TRANS_B (a linear layer's weight, "nk") or
// K x N ("kn"); out is rows x N. The group sizes live only on the device (expert_offsets), so the
// grid covers the worst case: worst_m row tiles (the most that any split of `rows` rows among the
// experts can need) times ceil(N / BN) column tiles, with the row tile index fastest. Each block
// finds its row tile by walking the offsets (find_group_tile in moe_common.cuh: two block scans over
// the experts, no workspace) and leaves at once when the groups have fewer tiles. Rows of out outside
// every group are not written.
//
//   grouped_gemm_mma<T, TRANS_B, BM, BN, BK, WARPS_M, WARPS_N, STAGES>   fp16 / bf16, float accumulation
//       the main loop and epilogue of the dense GEMM (mma_mainloop.cuh: mma.sync m16n8k16, cp.async
//       ring of STAGES shared tiles, swizzled ldmatrix reads) on the expert's slice of a and its W.
//       Tiles with BM = 16 serve decode: each live block streams a BN x K slice of one expert's W
//       (so every active expert's weights are read once).
//   grouped_gemm_simt<TRANS_B>                                            float32, 64 x 64 tiles of FMAs
#include "../moe/moe_common.cuh"
#include "mma_mainloop.cuh"

namespace pygpukit {
namespace ops {
namespace gemm {

template <typename T, bool TRANS_B, int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES>
__global__ void __launch_bounds__(WARPS_M * WARPS_N * 32)
    grouped_gemm_mma(const T* __restrict__ a, const T* __restrict__ w, T* out,
                     const int* __restrict__ offsets, int experts, int total_rows, int n, int k,
                     long long lda, long long ldb, long long w_stride, long long ldc, int worst_m,
                     int vector_a, int vector_b) {
  using Mainloop = MmaMainloop<T, false, TRANS_B, BM, BN, BK, WARPS_M, WARPS_N, STAGES>;
  const int m_tile = static_cast<int>(blockIdx.x % static_cast<unsigned>(worst_m));
  const int n0 = static_cast<int>(blockIdx.x / static_cast<unsigned>(worst_m)) * BN;
  moe::GroupTile group;
  if (!moe::find_group_tile<Mainloop::kThreads>(offsets, experts, total_rows, BM, m_tile, group)) return;
  a += static_cast<long long>(group.begin) * lda;
  out += static_cast<long long>(group.begin) * ldc;
  const T* b = w + static_cast<long long>(group.expert) * w_stride;

  extern __shared__ uint4 shared_words[];
  T* shared = reinterpret_cast<T*>(shared_words);
  typename Mainloop::Accumulators acc;
  Mainloop::run(acc, shared, a, b, group.rows, n, k, lda, ldb, group.m0, n0, vector_a != 0, vector_b != 0);
  Mainloop::template store<T>(acc, shared, out, nullptr, group.rows, n, ldc, group.m0, n0, 1.0f, 0.0f,
                              codes::kActNone);
}

// float32: a 64 x 64 output tile per block of 256 threads, each thread 4 x 4 outputs (rows ty + 16 i,
// columns tx + 16 j), K in steps of 16 through shared memory; exact float FMAs in K order.
template <bool TRANS_B>
__global__ void __launch_bounds__(256)
    grouped_gemm_simt(const float* __restrict__ a, const float* __restrict__ w, float* out,
                      const int* __restrict__ offsets, int experts, int total_rows, int n, int k,
                      long long lda, long long ldb, long long w_stride, long long ldc, int worst_m) {
  constexpr int BM = 64;
  constexpr int BN = 64;
  constexpr int BK = 16;
  __shared__ float tile_a[BK][BM + 4];
  __shared__ float tile_b[BK][BN + 4];
  const int m_tile = static_cast<int>(blockIdx.x % static_cast<unsigned>(worst_m));
  const int n0 = static_cast<int>(blockIdx.x / static_cast<unsigned>(worst_m)) * BN;
  moe::GroupTile group;
  if (!moe::find_group_tile<256>(offsets, experts, total_rows, BM, m_tile, group)) return;
  const int m = group.rows;
  const int m0 = group.m0;
  a += static_cast<long long>(group.begin) * lda;
  out += static_cast<long long>(group.begin) * ldc;
  const float* b = w + static_cast<long long>(group.expert) * w_stride;
  const int tid = static_cast<int>(threadIdx.x);
  const int tx = tid % 16;
  const int ty = tid / 16;
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
  }
  for (int k0 = 0; k0 < k; k0 += BK) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int index = tid + 256 * q;
      {  // a: BM rows of BK, read along k
        const int r = index / BK;
        const int c = index % BK;
        const int row = m0 + r;
        const int col = k0 + c;
        tile_a[c][r] = (row < m && col < k) ? a[static_cast<long long>(row) * lda + col] : 0.0f;
      }
      if constexpr (TRANS_B) {  // W: BN rows (n) of BK (k)
        const int r = index / BK;
        const int c = index % BK;
        const int row = n0 + r;
        const int col = k0 + c;
        tile_b[c][r] = (row < n && col < k) ? b[static_cast<long long>(row) * ldb + col] : 0.0f;
      } else {  // W: BK rows (k) of BN (n)
        const int r = index / BN;
        const int c = index % BN;
        const int row = k0 + r;
        const int col = n0 + c;
        tile_b[r][c] = (row < k && col < n) ? b[static_cast<long long>(row) * ldb + col] : 0.0f;
      }
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      float av[4];
      float bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = tile_a[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = tile_b[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = m0 + ty + 16 * i;
    if (row >= m) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int col = n0 + tx + 16 * j;
      if (col < n) out[static_cast<long long>(row) * ldc + col] = acc[i][j];
    }
  }
}

}  // namespace gemm
}  // namespace ops
}  // namespace pygpukit
