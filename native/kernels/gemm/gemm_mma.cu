// Built-in tensor-core GEMM for fp16 and bf16 inputs with float accumulation, the path taken when
// cuBLASLt is absent or turned off (PYGPUKIT_NO_CUBLASLT=1):
//
//   out = act(alpha * op(A) @ op(B) + beta * out + bias)        (bias: one value per column)
//
// op(A) is M x K and op(B) is K x N. A is stored M x K row-major, or K x M when TRANS_A; B is stored
// K x N row-major, or N x K when TRANS_B (the weight of a linear layer). Each operand has unit stride
// along its rows and a leading dimension (row stride) of at least its row length; out likewise.
// out is read only when beta != 0, so it may hold anything (NaN included) otherwise.
//
// A block computes a BM x BN tile of out with WARPS_M x WARPS_N warps; each warp owns a
// (BM / WARPS_M) x (BN / WARPS_N) tile of float accumulators held in registers as
// mma.sync.m16n8k16 fragments. K advances BK at a time through a ring of STAGES shared-memory tiles
// filled by cp.async (16 bytes per copy, cached in L2 only), so loads of the next tiles overlap the
// tensor-core work on the current one; one barrier per K step. Fragments are read with ldmatrix
// (.trans for an operand stored with M or N contiguous). The 16-byte chunks of each shared-memory row
// are XOR-swizzled so that both the cp.async stores and the ldmatrix reads of a warp touch every bank
// once.
//
// Edges: any M, N and K. A 16-byte chunk that lies wholly inside its operand is copied with cp.async
// when the operand is 16-byte aligned (vector_a / vector_b: base address and leading dimension); a
// chunk wholly outside is zero-filled; a chunk across an edge, and every chunk of an operand that is
// not aligned, is loaded element by element with zero fill. Zeros add nothing to the dot products,
// so the K tail needs no special case. Unaligned operands are therefore correct but slow.
//
// Blocks run in groups of kGroupM tile rows, column by column, so that the tiles resident together
// share rows of A and columns of B in L2.
#include "gemm_common.cuh"

namespace pygpukit {
namespace ops {
namespace gemm {

// Shared memory: STAGES x (BM x BK of A + BN x BK of B) elements, passed as dynamic shared memory.
template <typename T, typename OutT, bool TRANS_A, bool TRANS_B, int BM, int BN, int BK, int WARPS_M,
          int WARPS_N, int STAGES>
__global__ void __launch_bounds__(WARPS_M * WARPS_N * 32)
    gemm_mma(const T* __restrict__ a, const T* __restrict__ b, OutT* out, const OutT* __restrict__ bias,
             int m, int n, int k, long long lda, long long ldb, long long ldc, float alpha, float beta,
             int activation, int vector_a, int vector_b) {
  constexpr int kThreads = WARPS_M * WARPS_N * 32;
  constexpr int kWarpM = BM / WARPS_M;
  constexpr int kWarpN = BN / WARPS_N;
  constexpr int kTilesM = kWarpM / 16;  // m16 fragments per warp
  constexpr int kTilesN = kWarpN / 8;   // n8 fragments per warp
  constexpr int kStageA = BM * BK;
  constexpr int kStageB = BN * BK;
  static_assert(kWarpM % 16 == 0 && kWarpN % 16 == 0 && BK % 16 == 0,
                "warp tiles are made of 16 x 16 blocks");
  static_assert(STAGES >= 2, "the pipeline needs at least two stages");

  extern __shared__ uint4 shared_words[];
  T* smem_a = reinterpret_cast<T*>(shared_words);
  T* smem_b = smem_a + STAGES * kStageA;

  const int tiles_m = (m + BM - 1) / BM;
  const int tiles_n = (n + BN - 1) / BN;
  const int per_group = kGroupM * tiles_n;
  const int pid = static_cast<int>(blockIdx.x);
  const int first_m = (pid / per_group) * kGroupM;
  const int group_rows = min(tiles_m - first_m, kGroupM);
  const int m0 = (first_m + (pid % per_group) % group_rows) * BM;
  const int n0 = ((pid % per_group) / group_rows) * BN;

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp_m = (warp / WARPS_N) * kWarpM;
  const int warp_n = (warp % WARPS_N) * kWarpN;
  const int quad = lane >> 3;  // which 8 x 8 matrix of an ldmatrix.x4 this lane addresses
  const int quad_row = lane & 7;

  // Operand tiles as stored: A is BM x BK (K contiguous) or BK x BM (TRANS_A), B is BK x BN or
  // BN x BK (TRANS_B).
  using CopyA = TileCopy < T, TRANS_A ? BK : BM, TRANS_A ? BM : BK, kThreads,
        RowSwizzled < TRANS_A ? BM : BK >>
      ;
  using CopyB = TileCopy < T, TRANS_B ? BN : BK, TRANS_B ? BK : BN, kThreads,
        RowSwizzled < TRANS_B ? BK : BN >>
      ;
  const CopyA copy_a;
  const CopyB copy_b;
  // Where this thread's chunks start for k tile 0, and how far they move per k tile.
  const T* a_first =
      TRANS_A ? a + copy_a.row * lda + (m0 + copy_a.col) : a + (m0 + copy_a.row) * lda + copy_a.col;
  const T* b_first =
      TRANS_B ? b + (n0 + copy_b.row) * ldb + copy_b.col : b + copy_b.row * ldb + (n0 + copy_b.col);
  const long long a_step = TRANS_A ? BK * lda : BK;
  const long long b_step = TRANS_B ? BK : BK * ldb;
  const bool interior_mn = vector_a != 0 && vector_b != 0 && m0 + BM <= m && n0 + BN <= n;
  const unsigned base_a = shared_address(smem_a);
  const unsigned base_b = shared_address(smem_b);

  auto load_stage = [&](int stage, int k_tile) {
    const int k0 = k_tile * BK;
    const unsigned tile_a = base_a + stage * kStageA * static_cast<int>(sizeof(T));
    const unsigned tile_b = base_b + stage * kStageB * static_cast<int>(sizeof(T));
    if (interior_mn && k0 + BK <= k) {  // the common case: no edge, aligned
      copy_a.full(tile_a, a_first + k_tile * a_step, lda);
      copy_b.full(tile_b, b_first + k_tile * b_step, ldb);
      return;
    }
    T* pointer_a = smem_a + stage * kStageA;
    T* pointer_b = smem_b + stage * kStageB;
    if constexpr (TRANS_A) {
      copy_a.checked(tile_a, pointer_a, a, lda, k0, k, m0, m, vector_a != 0);
    } else {
      copy_a.checked(tile_a, pointer_a, a, lda, m0, m, k0, k, vector_a != 0);
    }
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

  // Fragments of one k16 step: A as kTilesM 16 x 16 blocks, B as kTilesN 16 x 8 blocks.
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
  };
  auto multiply = [&](const Fragments& f) {
#pragma unroll
    for (int i = 0; i < kTilesM; ++i) {
#pragma unroll
      for (int jj = 0; jj < kTilesN; ++jj) {
        const int j = (i % 2 == 0) ? jj : kTilesN - 1 - jj;  // serpentine: reuse the last B fragment
        matmul::Mma<T>::run(acc[i][j], f.a[i], f.b[j][0], f.b[j][1]);
      }
    }
  };

  // The main loop keeps STAGES tiles in flight with cp.async. The fragments of the last k16 step of
  // tile kt are read before the barrier that publishes tile kt + 1, so the tensor cores still have
  // that step's work while warps wait there, and after the barrier the stage of tile kt is free at
  // once for tile kt + STAGES.
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
        __syncthreads();  // tile kt + 1 has landed, and every warp has read all of tile kt
        const int next = kt + STAGES;
        if (next < k_tiles) load_stage(read_stage, next);
        cp_async_commit();
        read_stage = read_stage == STAGES - 1 ? 0 : read_stage + 1;
      }
      multiply(fragments);
    }
  }

  // Epilogue, through the now idle shared memory (each warp its own slice).
  static_assert(
      WARPS_M * WARPS_N * 16 * (kWarpN + 8) * 4 <= STAGES * (kStageA + kStageB) * static_cast<int>(sizeof(T)),
      "the epilogue staging must fit in the pipeline's shared memory");
  cp_async_wait<0>();
  __syncthreads();
  store_warp_tile<OutT, kTilesM, kTilesN>(
      acc, reinterpret_cast<float*>(shared_words) + warp * 16 * (kWarpN + 8), out, bias, m, n, ldc,
      m0 + warp_m, n0 + warp_n, alpha, beta, activation);
}

}  // namespace gemm
}  // namespace ops
}  // namespace pygpukit
