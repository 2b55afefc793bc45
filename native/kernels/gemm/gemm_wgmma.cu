// Built-in GEMM for SM 90 (Hopper; compiled for sm_90a): the contract of gemm_mma.cu,
//
//   out = act(alpha * op(A) @ op(B) + beta * out + bias),   fp16 or bf16 inputs, float accumulation,
//
// computed with warpgroup MMA (wgmma), which reads both operands straight from shared memory and so
// leaves the register file and the shared-memory bandwidth that mma.sync's fragment loads need.
//
// A block of 256 threads (two warpgroups) computes a 128 x BN tile: warpgroup w multiplies rows
// 64 w .. 64 w + 63 with wgmma.m64nBNk16, its accumulators (BN / 2 floats per thread) in registers.
// 64-deep K tiles arrive through a ring of STAGES shared-memory stages filled by cp.async from every
// thread, with gemm_mma.cu's edge handling (any M, N, K; unaligned operands element by element).
// Shared tiles use wgmma's 128-byte-swizzled layouts: a K-major operand (A, or B when TRANS_B) as
// rows of 64 elements, an M- or N-major one (A when TRANS_A, B otherwise) as blocks of 64 columns;
// each operand's matrix descriptor says which. Stage bases are 1024-byte aligned, as the swizzle
// pattern requires.
//
// Per K tile: wait for this thread's copies of the tile, make them visible to the tensor cores
// (fence.proxy.async), barrier; issue the copies of tile kt + STAGES - 2 into the stage of tile
// kt - 2, whose wgmmas every warpgroup has waited for; issue the tile's four wgmmas as one group and
// wait until only that group is in flight. The tensor cores thus work on tile kt while tile kt + 1's
// barrier is reached and later tiles load.
//
// Other architectures compile an empty kernel body; the runtime launches this kernel only on SM 90.
#include "gemm_common.cuh"

namespace pygpukit {
namespace ops {
namespace gemm {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// A shared-memory matrix descriptor with the 128-byte swizzle; offsets in bytes.
__device__ __forceinline__ unsigned long long wgmma_descriptor(unsigned address, unsigned leading,
                                                               unsigned stride) {
  return static_cast<unsigned long long>((address & 0x3FFFFu) >> 4) |
         (static_cast<unsigned long long>(leading >> 4) << 16) |
         (static_cast<unsigned long long>(stride >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Pins accumulator registers at this point of the program, so that the compiler neither reads nor
// moves them while an asynchronous wgmma may still write them.
template <int N>
__device__ __forceinline__ void hold_registers(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d += A (64 x 16, descriptor desc_a) * B (16 x N, descriptor desc_b), one warpgroup. A is M-major
// (rather than K-major) when A_M_MAJOR, B N-major when B_N_MAJOR.
template <typename T, int N, bool A_M_MAJOR, bool B_N_MAJOR>
struct Wgmma;

// The register block of one wgmma is N / 2 accumulators per thread, each its own asm operand: the
// operand lists are generated here, once, by the preprocessor. PYGPUKIT_WGMMA_1_TO_63(F) is
// F(1) F(2) ... F(63), PYGPUKIT_WGMMA_1_TO_127(F) goes on to F(127) (ten at a time by pasting a
// digit to a prefix); F is PYGPUKIT_WGMMA_REGISTER for the asm text (", %n") or
// PYGPUKIT_WGMMA_OPERAND for the constraint list (, "+f"(d[n])). Register 0 starts each list.
// clang-format off
#define PYGPUKIT_WGMMA_TEN(F, p) F(p##0) F(p##1) F(p##2) F(p##3) F(p##4) F(p##5) F(p##6) F(p##7) F(p##8) F(p##9)
#define PYGPUKIT_WGMMA_1_TO_63(F)                                                                          \
  F(1) F(2) F(3) F(4) F(5) F(6) F(7) F(8) F(9) PYGPUKIT_WGMMA_TEN(F, 1) PYGPUKIT_WGMMA_TEN(F, 2)            \
  PYGPUKIT_WGMMA_TEN(F, 3) PYGPUKIT_WGMMA_TEN(F, 4) PYGPUKIT_WGMMA_TEN(F, 5) F(60) F(61) F(62) F(63)
#define PYGPUKIT_WGMMA_1_TO_127(F)                                                                         \
  PYGPUKIT_WGMMA_1_TO_63(F) F(64) F(65) F(66) F(67) F(68) F(69) PYGPUKIT_WGMMA_TEN(F, 7)                   \
  PYGPUKIT_WGMMA_TEN(F, 8) PYGPUKIT_WGMMA_TEN(F, 9) PYGPUKIT_WGMMA_TEN(F, 10) PYGPUKIT_WGMMA_TEN(F, 11)    \
  F(120) F(121) F(122) F(123) F(124) F(125) F(126) F(127)
#define PYGPUKIT_WGMMA_REGISTER(n) ", %" #n
#define PYGPUKIT_WGMMA_OPERAND(n) , "+f"(d[n])

// One specialization: element type T (PTX name PTX), N columns, the accumulator list LIST and the
// operand numbers that follow the accumulators (descriptors DA and DB, the scale-d predicate P, the
// two transpose immediates TA and TB).
#define PYGPUKIT_WGMMA(T, PTX, N, LIST, DA, DB, P, TA, TB)                                                  \
  template <bool A_M_MAJOR, bool B_N_MAJOR>                                                                 \
  struct Wgmma<T, N, A_M_MAJOR, B_N_MAJOR> {                                                                \
    __device__ __forceinline__ static void run(float (&d)[N / 2], unsigned long long desc_a,                \
                                               unsigned long long desc_b) {                                 \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P ", 0;\n"                                         \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX "." PTX " "                         \
                   "{%0" LIST(PYGPUKIT_WGMMA_REGISTER) "}, %" #DA ", %" #DB ", p, 1, 1, %" #TA ", %" #TB ";\n}\n" \
                   : "+f"(d[0]) LIST(PYGPUKIT_WGMMA_OPERAND)                                                \
                   : "l"(desc_a), "l"(desc_b), "r"(1), "n"(A_M_MAJOR ? 1 : 0), "n"(B_N_MAJOR ? 1 : 0));     \
    }                                                                                                       \
  };
// clang-format on

PYGPUKIT_WGMMA(__nv_bfloat16, "bf16", 256, PYGPUKIT_WGMMA_1_TO_127, 128, 129, 130, 131, 132)
PYGPUKIT_WGMMA(__nv_bfloat16, "bf16", 128, PYGPUKIT_WGMMA_1_TO_63, 64, 65, 66, 67, 68)
PYGPUKIT_WGMMA(__half, "f16", 256, PYGPUKIT_WGMMA_1_TO_127, 128, 129, 130, 131, 132)
PYGPUKIT_WGMMA(__half, "f16", 128, PYGPUKIT_WGMMA_1_TO_63, 64, 65, 66, 67, 68)

#undef PYGPUKIT_WGMMA
#undef PYGPUKIT_WGMMA_OPERAND
#undef PYGPUKIT_WGMMA_REGISTER
#undef PYGPUKIT_WGMMA_1_TO_127
#undef PYGPUKIT_WGMMA_1_TO_63
#undef PYGPUKIT_WGMMA_TEN

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// Shared memory: STAGES x (128 x 64 of A + BN x 64 of B) elements plus 1024 bytes of alignment slack,
// passed as dynamic shared memory. 256 threads per block.
template <typename T, typename OutT, bool TRANS_A, bool TRANS_B, int BN, int STAGES>
__global__ void __launch_bounds__(256, 1)
    gemm_wgmma(const T* __restrict__ a, const T* __restrict__ b, OutT* out, const OutT* __restrict__ bias,
               int m, int n, int k, long long lda, long long ldb, long long ldc, float alpha, float beta,
               int activation, int vector_a, int vector_b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BM = 128;
  constexpr int BK = 64;
  constexpr int kThreads = 256;
  constexpr int kStageA = BM * BK;
  constexpr int kStageB = BN * BK;
  constexpr int kStageBytes = (kStageA + kStageB) * static_cast<int>(sizeof(T));
  static_assert(BN == 128 || BN == 256, "wgmma tiles are 128 x 128 or 128 x 256");
  static_assert(STAGES >= 3, "the pipeline needs at least three stages");
  static_assert(8 * 16 * (BN + 8) * 4 <= STAGES * kStageBytes, "the epilogue staging must fit");

  extern __shared__ uint4 shared_words[];
  const unsigned raw_base = shared_address(shared_words);
  const unsigned base = (raw_base + 1023u) & ~1023u;
  unsigned char* base_pointer = reinterpret_cast<unsigned char*>(shared_words) + (base - raw_base);
  // Stage s: A at base + s * kStageBytes, B right after it.

  int m0, n0;
  tile_origin<BM, BN>(m, n, m0, n0);

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int warpgroup = warp / 4;

  using LayoutA = typename Choose<TRANS_A, ColumnBlocks<BK>, RowSwizzled<BK>>::type;
  using LayoutB = typename Choose<TRANS_B, RowSwizzled<BK>, ColumnBlocks<BK>>::type;
  using CopyA = TileCopy<T, TRANS_A ? BK : BM, TRANS_A ? BM : BK, kThreads, LayoutA>;
  using CopyB = TileCopy<T, TRANS_B ? BN : BK, TRANS_B ? BK : BN, kThreads, LayoutB>;
  const CopyA copy_a;
  const CopyB copy_b;
  const OperandCursors<T, TRANS_A, TRANS_B, BK> cursors(a, b, lda, ldb, m0, n0, copy_a, copy_b);
  const bool interior_mn = vector_a != 0 && vector_b != 0 && m0 + BM <= m && n0 + BN <= n;

  auto load_stage = [&](int stage, int k_tile) {
    const int k0 = k_tile * BK;
    const unsigned tile_a = base + stage * kStageBytes;
    const unsigned tile_b = tile_a + kStageA * static_cast<int>(sizeof(T));
    if (interior_mn && k0 + BK <= k) {
      copy_a.full(tile_a, cursors.a_at(k_tile), lda);
      copy_b.full(tile_b, cursors.b_at(k_tile), ldb);
      return;
    }
    T* pointer_a = reinterpret_cast<T*>(base_pointer + stage * kStageBytes);
    T* pointer_b = pointer_a + kStageA;
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

  // Descriptors of k16 step 0 in stage 0; a stage adds kStageBytes, a k16 step 32 bytes along a
  // K-major row or two 8-row groups (2048 bytes) of an M/N-major column block.
  constexpr unsigned kColumnBlockBytes = BK * 128;
  const unsigned a_start = base + warpgroup * (TRANS_A ? kColumnBlockBytes : 64 * 128);
  const unsigned b_start = base + kStageA * static_cast<int>(sizeof(T));
  const unsigned long long desc_a0 = wgmma_descriptor(a_start, TRANS_A ? kColumnBlockBytes : 16, 1024);
  const unsigned long long desc_b0 = wgmma_descriptor(b_start, TRANS_B ? 16 : kColumnBlockBytes, 1024);
  constexpr unsigned kStepA = TRANS_A ? 2048 : 32;
  constexpr unsigned kStepB = TRANS_B ? 32 : 2048;

  float acc[1][BN / 8][4];
  float (&flat)[BN / 2] = *reinterpret_cast<float (*)[BN / 2]>(&acc[0][0][0]);
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) flat[i] = 0.0f;

  const int k_tiles = (k + BK - 1) / BK;
#pragma unroll 1
  for (int s = 0; s < STAGES - 2; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }
  int stage = 0;
  int write_stage = STAGES - 2;
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<STAGES - 3>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const int next = kt + STAGES - 2;
    if (next < k_tiles) load_stage(write_stage, next);
    cp_async_commit();
    write_stage = write_stage == STAGES - 1 ? 0 : write_stage + 1;

    const unsigned long long stage_offset = static_cast<unsigned long long>(stage * kStageBytes) >> 4;
    wgmma_fence();
    hold_registers(flat);
#pragma unroll
    for (int step = 0; step < BK / 16; ++step) {
      Wgmma<T, BN, TRANS_A, !TRANS_B>::run(flat, desc_a0 + stage_offset + ((step * kStepA) >> 4),
                                           desc_b0 + stage_offset + ((step * kStepB) >> 4));
    }
    wgmma_commit();
    wgmma_wait<1>();
    hold_registers(flat);
    stage = stage == STAGES - 1 ? 0 : stage + 1;
  }
  wgmma_wait<0>();
  hold_registers(flat);

  cp_async_wait<0>();
  __syncthreads();
  float* staged = reinterpret_cast<float*>(base_pointer) + warp * 16 * (BN + 8);
  store_warp_tile<OutT, 1, BN / 8>(acc, staged, out, bias, m, n, ldc, m0 + warpgroup * 64 + (warp % 4) * 16,
                                   n0, alpha, beta, activation);
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

}  // namespace gemm
}  // namespace ops
}  // namespace pygpukit
