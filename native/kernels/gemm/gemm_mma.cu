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
// The main loop (tiles, cp.async pipeline, mma.sync m16n8k16) and the epilogue are mma_mainloop.cuh's,
// shared with grouped_gemm.cu; it also describes the edge handling: any M, N and K, unaligned operands
// correct but slow.
//
// Blocks run in groups of kGroupM tile rows, column by column (tile_origin in gemm_common.cuh).
#include "mma_mainloop.cuh"

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
  using Mainloop = MmaMainloop<T, TRANS_A, TRANS_B, BM, BN, BK, WARPS_M, WARPS_N, STAGES>;
  extern __shared__ uint4 shared_words[];
  T* shared = reinterpret_cast<T*>(shared_words);

  int m0, n0;
  tile_origin<BM, BN>(m, n, m0, n0);

  typename Mainloop::Accumulators acc;
  Mainloop::run(acc, shared, a, b, m, n, k, lda, ldb, m0, n0, vector_a != 0, vector_b != 0);
  Mainloop::template store<OutT>(acc, shared, out, bias, m, n, ldc, m0, n0, alpha, beta, activation);
}

}  // namespace gemm
}  // namespace ops
}  // namespace pygpukit
