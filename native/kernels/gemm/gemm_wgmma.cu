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

template <bool A_M_MAJOR, bool B_N_MAJOR>
struct Wgmma<__nv_bfloat16, 256, A_M_MAJOR, B_N_MAJOR> {
  __device__ __forceinline__ static void run(float (&d)[128], unsigned long long desc_a,
                                             unsigned long long desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
        "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, "
        "%41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, "
        "%61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, "
        "%81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, "
        "%100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, "
        "%116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "%128, %129, p, 1, 1, %131, %132;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
          "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
          "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
          "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
          "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
          "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
          "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
          "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]),
          "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]),
          "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]),
          "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]),
          "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]),
          "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]),
          "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]),
          "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]),
          "+f"(d[127])
        : "l"(desc_a), "l"(desc_b), "r"(1), "n"(A_M_MAJOR ? 1 : 0), "n"(B_N_MAJOR ? 1 : 0));
  }
};

template <bool A_M_MAJOR, bool B_N_MAJOR>
struct Wgmma<__nv_bfloat16, 128, A_M_MAJOR, B_N_MAJOR> {
  __device__ __forceinline__ static void run(float (&d)[64], unsigned long long desc_a,
                                             unsigned long long desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
        "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, "
        "%41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, "
        "%61, %62, %63}, "
        "%64, %65, p, 1, 1, %67, %68;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
          "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
          "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
          "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
          "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
          "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
          "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
          "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(desc_a), "l"(desc_b), "r"(1), "n"(A_M_MAJOR ? 1 : 0), "n"(B_N_MAJOR ? 1 : 0));
  }
};

template <bool A_M_MAJOR, bool B_N_MAJOR>
struct Wgmma<__half, 256, A_M_MAJOR, B_N_MAJOR> {
  __device__ __forceinline__ static void run(float (&d)[128], unsigned long long desc_a,
                                             unsigned long long desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
        "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, "
        "%41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, "
        "%61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, "
        "%81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, "
        "%100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, "
        "%116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "%128, %129, p, 1, 1, %131, %132;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
          "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
          "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
          "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
          "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
          "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
          "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
          "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]),
          "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]),
          "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]),
          "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]),
          "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]),
          "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]),
          "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]),
          "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]),
          "+f"(d[127])
        : "l"(desc_a), "l"(desc_b), "r"(1), "n"(A_M_MAJOR ? 1 : 0), "n"(B_N_MAJOR ? 1 : 0));
  }
};

template <bool A_M_MAJOR, bool B_N_MAJOR>
struct Wgmma<__half, 128, A_M_MAJOR, B_N_MAJOR> {
  __device__ __forceinline__ static void run(float (&d)[64], unsigned long long desc_a,
                                             unsigned long long desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
        "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, "
        "%41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, "
        "%61, %62, %63}, "
        "%64, %65, p, 1, 1, %67, %68;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
          "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
          "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
          "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
          "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
          "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
          "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
          "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(desc_a), "l"(desc_b), "r"(1), "n"(A_M_MAJOR ? 1 : 0), "n"(B_N_MAJOR ? 1 : 0));
  }
};

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

  const int tiles_m = (m + BM - 1) / BM;
  const int tiles_n = (n + BN - 1) / BN;
  const int per_group = kGroupM * tiles_n;
  const int pid = static_cast<int>(blockIdx.x);
  const int first_m = (pid / per_group) * kGroupM;
  const int group_rows = min(tiles_m - first_m, kGroupM);
  const int m0 = (first_m + (pid % per_group) % group_rows) * BM;
  const int n0 = ((pid % per_group) / group_rows) * BN;

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int warpgroup = warp / 4;

  using LayoutA = typename Choose<TRANS_A, ColumnBlocks<BK>, RowSwizzled<BK>>::type;
  using LayoutB = typename Choose<TRANS_B, RowSwizzled<BK>, ColumnBlocks<BK>>::type;
  using CopyA = TileCopy<T, TRANS_A ? BK : BM, TRANS_A ? BM : BK, kThreads, LayoutA>;
  using CopyB = TileCopy<T, TRANS_B ? BN : BK, TRANS_B ? BK : BN, kThreads, LayoutB>;
  const CopyA copy_a;
  const CopyB copy_b;
  const T* a_first =
      TRANS_A ? a + copy_a.row * lda + (m0 + copy_a.col) : a + (m0 + copy_a.row) * lda + copy_a.col;
  const T* b_first =
      TRANS_B ? b + (n0 + copy_b.row) * ldb + copy_b.col : b + copy_b.row * ldb + (n0 + copy_b.col);
  const long long a_step = TRANS_A ? BK * lda : BK;
  const long long b_step = TRANS_B ? BK : BK * ldb;
  const bool interior_mn = vector_a != 0 && vector_b != 0 && m0 + BM <= m && n0 + BN <= n;

  auto load_stage = [&](int stage, int k_tile) {
    const int k0 = k_tile * BK;
    const unsigned tile_a = base + stage * kStageBytes;
    const unsigned tile_b = tile_a + kStageA * static_cast<int>(sizeof(T));
    if (interior_mn && k0 + BK <= k) {
      copy_a.full(tile_a, a_first + k_tile * a_step, lda);
      copy_b.full(tile_b, b_first + k_tile * b_step, ldb);
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
