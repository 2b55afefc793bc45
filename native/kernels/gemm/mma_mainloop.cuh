// The mma.sync main loop of the built-in tensor-core GEMMs, the one definition used by gemm_mma.cu
// (dense) and grouped_gemm.cu (mixture-of-experts groups): tile loads into shared memory, the cp.async
// pipeline and the m16n8k16 loop, then the epilogue through shared memory.
//
// A block computes a BM x BN tile of the output with WARPS_M x WARPS_N warps; each warp owns a
// (BM / WARPS_M) x (BN / WARPS_N) tile of float accumulators held in registers as mma.sync.m16n8k16
// fragments. K advances BK at a time through a ring of STAGES shared-memory tiles filled by cp.async
// (16 bytes per copy, cached in L2 only), so loads of the next tiles overlap the tensor-core work on
// the current one; one barrier per K step. Fragments are read with ldmatrix (.trans for an operand
// stored with M or N contiguous). The 16-byte chunks of each shared-memory row are XOR-swizzled so
// that both the cp.async stores and the ldmatrix reads of a warp touch every bank once.
//
// Operands: op(A) is M x K, stored M x K row-major or K x M when TRANS_A; op(B) is K x N, stored K x N
// row-major or N x K when TRANS_B; each with unit stride along its rows and leading dimension lda /
// ldb. Edges: any M, N and K. A 16-byte chunk wholly inside its operand is copied with cp.async when
// the operand is 16-byte aligned (vector_a / vector_b: base address and leading dimension); a chunk
// wholly outside is zero-filled; a chunk across an edge, and every chunk of an unaligned operand, is
// loaded element by element with zero fill. Zeros add nothing to the dot products, so the K tail
// needs no special case.
#pragma once

#include "gemm_common.cuh"

namespace pygpukit {
namespace ops {
namespace gemm {

template <typename T, bool TRANS_A, bool TRANS_B, int BM, int BN, int BK, int WARPS_M, int WARPS_N,
          int STAGES>
struct MmaMainloop {
  static constexpr int kThreads = WARPS_M * WARPS_N * 32;
  static constexpr int kWarpM = BM / WARPS_M;
  static constexpr int kWarpN = BN / WARPS_N;
  static constexpr int kTilesM = kWarpM / 16;  // m16 fragments per warp
  static constexpr int kTilesN = kWarpN / 8;   // n8 fragments per warp
  static constexpr int kStageA = BM * BK;
  static constexpr int kStageB = BN * BK;
  static constexpr int kSteps = BK / 16;
  static_assert(kWarpM % 16 == 0 && kWarpN % 16 == 0 && BK % 16 == 0,
                "warp tiles are made of 16 x 16 blocks");
  static_assert(STAGES >= 2, "the pipeline needs at least two stages");
  static_assert(WARPS_M * WARPS_N * 16 * (kWarpN + 8) * 4 <=
                    STAGES * (kStageA + kStageB) * static_cast<int>(sizeof(T)),
                "the epilogue staging must fit in the pipeline's shared memory");

  using Accumulators = float[kTilesM][kTilesN][4];

  // Operand tiles as stored: A is BM x BK (K contiguous) or BK x BM (TRANS_A), B is BK x BN or
  // BN x BK (TRANS_B).
  using CopyA = TileCopy<T, TRANS_A ? BK : BM, TRANS_A ? BM : BK, kThreads, RowSwizzled<TRANS_A ? BM : BK>>;
  using CopyB = TileCopy<T, TRANS_B ? BN : BK, TRANS_B ? BK : BN, kThreads, RowSwizzled<TRANS_B ? BK : BN>>;

  // Fragments of one k16 step: A as kTilesM 16 x 16 blocks, B as kTilesN 16 x 8 blocks.
  struct Fragments {
    unsigned a[kTilesM][4];
    unsigned b[kTilesN][2];
  };

  __device__ __forceinline__ static void zero(Accumulators& acc) {
#pragma unroll
    for (int i = 0; i < kTilesM; ++i) {
#pragma unroll
      for (int j = 0; j < kTilesN; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
      }
    }
  }

  // The fragments of k16 step kk of the stage whose A and B tiles start at shared addresses tile_a
  // and tile_b (laid out as the tile copies store them).
  __device__ __forceinline__ static void load_fragments(Fragments& f, unsigned tile_a, unsigned tile_b,
                                                        int kk) {
    const int warp = static_cast<int>(threadIdx.x) / 32;
    const int lane = static_cast<int>(threadIdx.x) % 32;
    const int warp_m = (warp / WARPS_N) * kWarpM;
    const int warp_n = (warp % WARPS_N) * kWarpN;
    const int quad = lane >> 3;  // which 8 x 8 matrix of an ldmatrix.x4 this lane addresses
    const int quad_row = lane & 7;
#pragma unroll
    for (int i = 0; i < kTilesM; ++i) {
      const int row = warp_m + i * 16;
      if constexpr (TRANS_A) {  // shared tile: BK rows of BM
        const int offset = swizzled<BM>(kk + (quad >> 1) * 8 + quad_row, row + (quad & 1) * 8);
        ldmatrix_x4_trans(f.a[i], tile_a + offset * static_cast<int>(sizeof(T)));
      } else {  // shared tile: BM rows of BK
        const int offset = swizzled<BK>(row + (quad & 1) * 8 + quad_row, kk + (quad >> 1) * 8);
        ldmatrix_x4(f.a[i], tile_a + offset * static_cast<int>(sizeof(T)));
      }
    }
#pragma unroll
    for (int j = 0; j < kTilesN; j += 2) {
      const int col = warp_n + j * 8;
      unsigned r[4];
      if constexpr (TRANS_B) {  // shared tile: BN rows of BK
        const int offset = swizzled<BK>(col + (quad >> 1) * 8 + quad_row, kk + (quad & 1) * 8);
        ldmatrix_x4(r, tile_b + offset * static_cast<int>(sizeof(T)));
      } else {  // shared tile: BK rows of BN
        const int offset = swizzled<BN>(kk + (quad & 1) * 8 + quad_row, col + (quad >> 1) * 8);
        ldmatrix_x4_trans(r, tile_b + offset * static_cast<int>(sizeof(T)));
      }
      f.b[j][0] = r[0];
      f.b[j][1] = r[1];
      f.b[j + 1][0] = r[2];
      f.b[j + 1][1] = r[3];
    }
  }

  // acc += the products of one k16 step's fragments.
  __device__ __forceinline__ static void multiply(Accumulators& acc, const Fragments& f) {
#pragma unroll
    for (int i = 0; i < kTilesM; ++i) {
#pragma unroll
      for (int jj = 0; jj < kTilesN; ++jj) {
        const int j = (i % 2 == 0) ? jj : kTilesN - 1 - jj;  // serpentine: reuse the last B fragment
        matmul::Mma<T>::run(acc[i][j], f.a[i], f.b[j][0], f.b[j][1]);
      }
    }
  }

  // acc = op(A)[m0 : m0 + BM, :] @ op(B)[:, n0 : n0 + BN] for op(A) m x k and op(B) k x n, through
  // `shared`: STAGES x (kStageA + kStageB) elements of dynamic shared memory.
  __device__ __forceinline__ static void run(Accumulators& acc, T* shared, const T* __restrict__ a,
                                             const T* __restrict__ b, int m, int n, int k, long long lda,
                                             long long ldb, int m0, int n0, bool vector_a, bool vector_b) {
    T* smem_a = shared;
    T* smem_b = shared + STAGES * kStageA;
    const CopyA copy_a;
    const CopyB copy_b;
    const OperandCursors<T, TRANS_A, TRANS_B, BK> cursors(a, b, lda, ldb, m0, n0, copy_a, copy_b);
    const bool interior_mn = vector_a && vector_b && m0 + BM <= m && n0 + BN <= n;
    const unsigned base_a = shared_address(smem_a);
    const unsigned base_b = shared_address(smem_b);

    auto load_stage = [&](int stage, int k_tile) {
      const int k0 = k_tile * BK;
      const unsigned tile_a = base_a + stage * kStageA * static_cast<int>(sizeof(T));
      const unsigned tile_b = base_b + stage * kStageB * static_cast<int>(sizeof(T));
      if (interior_mn && k0 + BK <= k) {  // the common case: no edge, aligned
        copy_a.full(tile_a, cursors.a_at(k_tile), lda);
        copy_b.full(tile_b, cursors.b_at(k_tile), ldb);
        return;
      }
      T* pointer_a = smem_a + stage * kStageA;
      T* pointer_b = smem_b + stage * kStageB;
      if constexpr (TRANS_A) {
        copy_a.checked(tile_a, pointer_a, a, lda, k0, k, m0, m, vector_a);
      } else {
        copy_a.checked(tile_a, pointer_a, a, lda, m0, m, k0, k, vector_a);
      }
      if constexpr (TRANS_B) {
        copy_b.checked(tile_b, pointer_b, b, ldb, n0, n, k0, k, vector_b);
      } else {
        copy_b.checked(tile_b, pointer_b, b, ldb, k0, k, n0, n, vector_b);
      }
    };

    zero(acc);

    // The main loop keeps STAGES tiles in flight with cp.async. The fragments of the last k16 step of
    // tile kt are read before the barrier that publishes tile kt + 1, so the tensor cores still have
    // that step's work while warps wait there, and after the barrier the stage of tile kt is free at
    // once for tile kt + STAGES.
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
        load_fragments(fragments, base_a + read_stage * kStageA * static_cast<int>(sizeof(T)),
                       base_b + read_stage * kStageB * static_cast<int>(sizeof(T)), step * 16);
        if (step == kSteps - 1) {
          cp_async_wait<STAGES - 2>();
          __syncthreads();  // tile kt + 1 has landed, and every warp has read all of tile kt
          const int next = kt + STAGES;
          if (next < k_tiles) load_stage(read_stage, next);
          cp_async_commit();
          read_stage = read_stage == STAGES - 1 ? 0 : read_stage + 1;
        }
        multiply(acc, fragments);
      }
    }
  }

  // out[m0 :, n0 :] = act(alpha * acc + beta * out + bias) for the rows and columns inside m x n,
  // through the now idle pipeline memory `shared` (each warp its own slice).
  template <typename OutT>
  __device__ __forceinline__ static void store(const Accumulators& acc, T* shared, OutT* out,
                                               const OutT* __restrict__ bias, int m, int n, long long ldc,
                                               int m0, int n0, float alpha, float beta, int activation) {
    const int warp = static_cast<int>(threadIdx.x) / 32;
    cp_async_wait<0>();
    __syncthreads();
    store_warp_tile<OutT, kTilesM, kTilesN>(acc, reinterpret_cast<float*>(shared) + warp * 16 * (kWarpN + 8),
                                            out, bias, m, n, ldc, m0 + (warp / WARPS_N) * kWarpM,
                                            n0 + (warp % WARPS_N) * kWarpN, alpha, beta, activation);
  }
};

}  // namespace gemm
}  // namespace ops
}  // namespace pygpukit
