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
//       the main loop of gemm_mma.cu (mma.sync m16n8k16, cp.async ring of STAGES shared tiles,
//       swizzled ldmatrix reads) on the expert's slice of a and its W, and gemm_common.cuh's epilogue.
//       Tiles with BM = 16 serve decode: each live block streams a BN x K slice of one expert's W
//       (so every active expert's weights are read once).
//   grouped_gemm_simt<TRANS_B>                                            float32, 64 x 64 tiles of FMAs
#include "gemm_mma.cu"
#include "../moe/moe_common.cuh"

namespace pygpukit {
namespace ops {
namespace gemm {

template <typename T, bool TRANS_B, int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES>
__global__ void __launch_bounds__(WARPS_M * WARPS_N * 32)
    grouped_gemm_mma(const T* __restrict__ a, const T* __restrict__ w, T* out,
                     const int* __restrict__ offsets, int experts, int total_rows, int n, int k,
                     long long lda, long long ldb, long long w_stride, long long ldc, int worst_m,
                     int vector_a, int vector_b) {
  constexpr int kThreads = WARPS_M * WARPS_N * 32;
  constexpr int kWarpM = BM / WARPS_M;
  constexpr int kWarpN = BN / WARPS_N;
  constexpr int kTilesM = kWarpM / 16;
  constexpr int kTilesN = kWarpN / 8;
  constexpr int kStageA = BM * BK;
  constexpr int kStageB = BN * BK;
  static_assert(kWarpM % 16 == 0 && kWarpN % 16 == 0 && BK % 16 == 0,
                "warp tiles are made of 16 x 16 blocks");
  static_assert(STAGES >= 2, "the pipeline needs at least two stages");

  const int m_tile = static_cast<int>(blockIdx.x % static_cast<unsigned>(worst_m));
  const int n0 = static_cast<int>(blockIdx.x / static_cast<unsigned>(worst_m)) * BN;
  moe::GroupTile group;
  if (!moe::find_group_tile<kThreads>(offsets, experts, total_rows, BM, m_tile, group)) return;
  const int m = group.rows;
  const int m0 = group.m0;
  a += static_cast<long long>(group.begin) * lda;
  out += static_cast<long long>(group.begin) * ldc;
  const T* b = w + static_cast<long long>(group.expert) * w_stride;

  extern __shared__ uint4 shared_words[];
  T* smem_a = reinterpret_cast<T*>(shared_words);
  T* smem_b = smem_a + STAGES * kStageA;

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp_m = (warp / WARPS_N) * kWarpM;
  const int warp_n = (warp % WARPS_N) * kWarpN;
  const int quad = lane >> 3;
  const int quad_row = lane & 7;

  using CopyA = TileCopy<T, BM, BK, kThreads, RowSwizzled<BK>>;
  using CopyB = TileCopy < T, TRANS_B ? BN : BK, TRANS_B ? BK : BN, kThreads,
        RowSwizzled < TRANS_B ? BK : BN >>
      ;
  const CopyA copy_a;
  const CopyB copy_b;
  const T* a_first = a + static_cast<long long>(m0 + copy_a.row) * lda + copy_a.col;
  const T* b_first = TRANS_B ? b + static_cast<long long>(n0 + copy_b.row) * ldb + copy_b.col
                             : b + static_cast<long long>(copy_b.row) * ldb + (n0 + copy_b.col);
  const long long b_step = TRANS_B ? BK : BK * ldb;
  const bool interior_mn = vector_a != 0 && vector_b != 0 && m0 + BM <= m && n0 + BN <= n;
  const unsigned base_a = shared_address(smem_a);
  const unsigned base_b = shared_address(smem_b);

  auto load_stage = [&](int stage, int k_tile) {
    const int k0 = k_tile * BK;
    const unsigned tile_a = base_a + stage * kStageA * static_cast<int>(sizeof(T));
    const unsigned tile_b = base_b + stage * kStageB * static_cast<int>(sizeof(T));
    if (interior_mn && k0 + BK <= k) {
      copy_a.full(tile_a, a_first + k0, lda);
      copy_b.full(tile_b, b_first + k_tile * b_step, ldb);
      return;
    }
    T* pointer_a = smem_a + stage * kStageA;
    T* pointer_b = smem_b + stage * kStageB;
    copy_a.checked(tile_a, pointer_a, a, lda, m0, m, k0, k, vector_a != 0);
    if constexpr (TRANS_B) {
      copy_b.checked(tile_b, pointer_b, b, ldb, n0, n, k0, k, vector_b != 0);
    } else {
      copy_b.checked(tile_b, pointer_b, b, ldb, k0, k, n0, n, vector_b != 0);
    }
  };

  float acc[kTilesM][kTilesN][4];
#pragma unroll
  for (int i = 0; i < kTilesM; ++i) {
#pragma unroll
    for (int j = 0; j < kTilesN; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    }
  }

  struct Fragments {
    unsigned a[kTilesM][4];
    unsigned b[kTilesN][2];
  };
  auto load_fragments = [&](Fragments& f, int stage, int kk) {
    const unsigned tile_a = base_a + stage * kStageA * static_cast<int>(sizeof(T));
    const unsigned tile_b = base_b + stage * kStageB * static_cast<int>(sizeof(T));
#pragma unroll
    for (int i = 0; i < kTilesM; ++i) {
      const int row = warp_m + i * 16;
      const int offset = swizzled<BK>(row + (quad & 1) * 8 + quad_row, kk + (quad >> 1) * 8);
      ldmatrix_x4(f.a[i], tile_a + offset * static_cast<int>(sizeof(T)));
    }
#pragma unroll
    for (int j = 0; j < kTilesN; j += 2) {
      const int col = warp_n + j * 8;
      unsigned r[4];
      if constexpr (TRANS_B) {
        const int offset = swizzled<BK>(col + (quad >> 1) * 8 + quad_row, kk + (quad & 1) * 8);
        ldmatrix_x4(r, tile_b + offset * static_cast<int>(sizeof(T)));
      } else {
        const int offset = swizzled<BN>(kk + (quad & 1) * 8 + quad_row, col + (quad >> 1) * 8);
        ldmatrix_x4_trans(r, tile_b + offset * static_cast<int>(sizeof(T)));
      }
      f.b[j][0] = r[0];
      f.b[j][1] = r[1];
      f.b[j + 1][0] = r[2];
      f.b[j + 1][1] = r[3];
    }
  };
  auto multiply = [&](const Fragments& f) {
#pragma unroll
    for (int i = 0; i < kTilesM; ++i) {
#pragma unroll
      for (int jj = 0; jj < kTilesN; ++jj) {
        const int j = (i % 2 == 0) ? jj : kTilesN - 1 - jj;
        matmul::Mma<T>::run(acc[i][j], f.a[i], f.b[j][0], f.b[j][1]);
      }
    }
  };

  constexpr int kSteps = BK / 16;
  const int k_tiles = (k + BK - 1) / BK;
#pragma unroll 1
  for (int s = 0; s < STAGES; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }
  cp_async_wait<STAGES - 1>();
  __syncthreads();
  int read_stage = 0;
  for (int kt = 0; kt < k_tiles; ++kt) {
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      Fragments fragments;
      load_fragments(fragments, read_stage, step * 16);
      if (step == kSteps - 1) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const int next = kt + STAGES;
        if (next < k_tiles) load_stage(read_stage, next);
        cp_async_commit();
        read_stage = read_stage == STAGES - 1 ? 0 : read_stage + 1;
      }
      multiply(fragments);
    }
  }

  static_assert(
      WARPS_M * WARPS_N * 16 * (kWarpN + 8) * 4 <= STAGES * (kStageA + kStageB) * static_cast<int>(sizeof(T)),
      "the epilogue staging must fit in the pipeline's shared memory");
  cp_async_wait<0>();
  __syncthreads();
  store_warp_tile<T, kTilesM, kTilesN>(acc, reinterpret_cast<float*>(shared_words) + warp * 16 * (kWarpN + 8),
                                       out, nullptr, m, n, ldc, m0 + warp_m, n0 + warp_n, 1.0f, 0.0f, 0);
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
