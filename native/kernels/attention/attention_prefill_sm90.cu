// Prefill attention for SM 90 (Hopper; compiled for sm_90a): the contract of flash_prefill
// (attention_prefill.cu) for fp16 / bf16 and head dimensions 64 and 128,
//
//   out[b, i, h] = softmax_j(scale * q[b, i, h] . k[b, j, hk] + mask) @ v[b, :, hk]
//
// with both products on warpgroup MMA (wgmma) rather than mma.sync:
//
//   flash_prefill_sm90<T, HD, BN, STAGES, SKEW>
//
// A block of 256 threads (two warpgroups) owns BM = 128 query rows of one (batch, head); warpgroup w
// owns rows 64 w .. 64 w + 63. Per key tile of BN keys each warpgroup computes S = Q K^T with
// wgmma.m64nBNk16 (Q and K read from shared memory through matrix descriptors), masks and folds S
// into its running maximum and sum in registers (the online softmax of flash_prefill, base 2), rounds
// the probabilities P to T in registers and accumulates O += P V with the register-A form of wgmma
// (P never goes through shared memory: the accumulator layout of S is the A-fragment layout of P).
// Each group of wgmmas is waited for before its registers are touched, and no wgmma is in flight
// across a branch or a barrier (ptxas would serialize them otherwise: warning C7515).
//
// Shared memory (from a 1024-byte aligned base): the Q tile, then STAGES stages of K and of V. Every
// tile is stored in wgmma's 128-byte-swizzled layout as blocks of 64 head-dimension columns, each
// block `rows` rows of 128 bytes (ColumnBlocks of gemm_common.cuh): a K-major operand for Q and K, an
// N-major one for V (the head dimension is N of O += P V), so one copy routine fills all three.
//
// Pipeline: every thread copies its share of K and V tiles with cp.async, kAhead tiles ahead:
//
//   wait for tile t's copies; fence.proxy.async; barrier; issue tile t + kAhead's copies;
//   warpgroup 0:                          S = Q K[t]^T; mask; softmax; O += P V[t]
//   warpgroup 1 (SKEW): mask; softmax; O += P V[t - 1]; S = Q K[t]^T
//   warpgroup 1 (no SKEW): as warpgroup 0
//
// With SKEW the two warpgroups are half a tile apart between barriers, so the softmax of one overlaps
// the matrix products of the other instead of both waiting on the tensor cores together; warpgroup 1
// then reads tile t - 1 until the next barrier, so the stage refilled at tile t is that of t - 2
// (kAhead = STAGES - 2) rather than t - 1 (kAhead = STAGES - 1). Causal tiles no key of which a
// warpgroup sees are skipped by that warpgroup, and only tiles crossing the diagonal, the window edge
// or the end of the keys are masked. The query blocks of a head run next to each other (K and V
// shared in L2), for causal attention those with the most keys first. The output is normalised,
// staged in the Q tile and stored as 16-byte chunks. Deterministic: no atomics, a fixed order.
//
// Other architectures compile an empty kernel body; the runtime launches it only on SM 90.
#include "attention_common.cuh"

namespace pygpukit {
namespace ops {
namespace attention {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

namespace sm90 {

// A shared-memory matrix descriptor with the 128-byte swizzle; offsets in bytes.
__device__ __forceinline__ unsigned long long descriptor(unsigned address, unsigned leading,
                                                         unsigned stride) {
  return static_cast<unsigned long long>((address & 0x3FFFFu) >> 4) |
         (static_cast<unsigned long long>(leading >> 4) << 16) |
         (static_cast<unsigned long long>(stride >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Pins registers at this point of the program, so that the compiler neither reads nor reuses them
// while an asynchronous wgmma may still write (accumulators) or read (A fragments) them.
template <int N>
__device__ __forceinline__ void hold(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N>
__device__ __forceinline__ void hold(unsigned (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(r[i][e])::"memory");
  }
}

// Ss<T, N>::run(d, a, b, accumulate): d (= or +=) A (64 x 16, K-major descriptor) * B (16 x N,
// K-major descriptor), one warpgroup. Rs<T, N>::run(d, a, b): d += A (64 x 16 from registers, four
// words per thread in the mma.sync m16n8k16 A-fragment layout of the thread's warp) * B (16 x N,
// N-major descriptor). The accumulators are N / 2 floats per thread (N / 8 m16n8 fragments of the
// warp's 16 rows), each its own asm operand; the lists come from the preprocessor as in
// gemm_wgmma.cu: PYGPUKIT_ATT_1_TO_31(F) is F(1) ... F(31), PYGPUKIT_ATT_1_TO_63(F) goes on to F(63).
template <typename T, int N>
struct Ss;
template <typename T, int N>
struct Rs;

// clang-format off
#define PYGPUKIT_ATT_TEN(F, p) F(p##0) F(p##1) F(p##2) F(p##3) F(p##4) F(p##5) F(p##6) F(p##7) F(p##8) F(p##9)
#define PYGPUKIT_ATT_1_TO_31(F)                                                                            \
  F(1) F(2) F(3) F(4) F(5) F(6) F(7) F(8) F(9) PYGPUKIT_ATT_TEN(F, 1) PYGPUKIT_ATT_TEN(F, 2) F(30) F(31)
#define PYGPUKIT_ATT_1_TO_63(F)                                                                            \
  PYGPUKIT_ATT_1_TO_31(F) F(32) F(33) F(34) F(35) F(36) F(37) F(38) F(39) PYGPUKIT_ATT_TEN(F, 4)           \
  PYGPUKIT_ATT_TEN(F, 5) F(60) F(61) F(62) F(63)
#define PYGPUKIT_ATT_REGISTER(n) ", %" #n
#define PYGPUKIT_ATT_OPERAND(n) , "+f"(d[n])

// SS: operands after the accumulators: descriptors DA, DB, the scale-d predicate P.
#define PYGPUKIT_ATT_SS(T, PTX, N, LIST, DA, DB, P)                                                         \
  template <>                                                                                               \
  struct Ss<T, N> {                                                                                         \
    __device__ __forceinline__ static void run(float (&d)[N / 2], unsigned long long desc_a,                \
                                               unsigned long long desc_b, int accumulate) {                 \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P ", 0;\n"                                         \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX "." PTX " "                         \
                   "{%0" LIST(PYGPUKIT_ATT_REGISTER) "}, %" #DA ", %" #DB ", p, 1, 1, 0, 0;\n}\n"           \
                   : "+f"(d[0]) LIST(PYGPUKIT_ATT_OPERAND)                                                  \
                   : "l"(desc_a), "l"(desc_b), "r"(accumulate));                                            \
    }                                                                                                       \
  };
// RS: operands after the accumulators: the four A words A0..A3, descriptor DB, the scale-d
// predicate P (always set: accumulate). B is N-major: the transpose immediate is 1.
#define PYGPUKIT_ATT_RS(T, PTX, N, LIST, A0, A1, A2, A3, DB, P)                                             \
  template <>                                                                                               \
  struct Rs<T, N> {                                                                                         \
    __device__ __forceinline__ static void run(float (&d)[N / 2], const unsigned (&a)[4],                   \
                                               unsigned long long desc_b) {                                 \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P ", 0;\n"                                         \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX "." PTX " "                         \
                   "{%0" LIST(PYGPUKIT_ATT_REGISTER) "}, {%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #DB    \
                   ", p, 1, 1, 1;\n}\n"                                                                     \
                   : "+f"(d[0]) LIST(PYGPUKIT_ATT_OPERAND)                                                  \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));                      \
    }                                                                                                       \
  };
// clang-format on

PYGPUKIT_ATT_SS(__nv_bfloat16, "bf16", 64, PYGPUKIT_ATT_1_TO_31, 32, 33, 34)
PYGPUKIT_ATT_SS(__nv_bfloat16, "bf16", 128, PYGPUKIT_ATT_1_TO_63, 64, 65, 66)
PYGPUKIT_ATT_SS(__half, "f16", 64, PYGPUKIT_ATT_1_TO_31, 32, 33, 34)
PYGPUKIT_ATT_SS(__half, "f16", 128, PYGPUKIT_ATT_1_TO_63, 64, 65, 66)
PYGPUKIT_ATT_RS(__nv_bfloat16, "bf16", 64, PYGPUKIT_ATT_1_TO_31, 32, 33, 34, 35, 36, 37)
PYGPUKIT_ATT_RS(__nv_bfloat16, "bf16", 128, PYGPUKIT_ATT_1_TO_63, 64, 65, 66, 67, 68, 69)
PYGPUKIT_ATT_RS(__half, "f16", 64, PYGPUKIT_ATT_1_TO_31, 32, 33, 34, 35, 36, 37)
PYGPUKIT_ATT_RS(__half, "f16", 128, PYGPUKIT_ATT_1_TO_63, 64, 65, 66, 67, 68, 69)

#undef PYGPUKIT_ATT_RS
#undef PYGPUKIT_ATT_SS
#undef PYGPUKIT_ATT_OPERAND
#undef PYGPUKIT_ATT_REGISTER
#undef PYGPUKIT_ATT_1_TO_63
#undef PYGPUKIT_ATT_1_TO_31
#undef PYGPUKIT_ATT_TEN

// Element offset of (row, col) in a tile of ROWS rows stored as blocks of 64 columns, each ROWS rows
// of 128 bytes with the 16-byte chunks of row r at chunk ^ (r & 7): wgmma's 128-byte swizzle.
template <int ROWS>
__device__ __forceinline__ int offset(int row, int col) {
  return ((col >> 6) * ROWS + row) * 64 + ((((col >> 3) & 7) ^ (row & 7)) << 3) + (col & 7);
}

// Copies ROWS rows of HD elements (row r at src + r * ld) into such a tile, 16 bytes per cp.async;
// rows r >= valid are zero-filled. Consecutive threads read consecutive chunks of a row.
template <typename T, int ROWS, int HD, int THREADS>
__device__ __forceinline__ void load_rows(unsigned tile, const T* src, int ld, int valid) {
  constexpr int kChunks = HD / 8;
  constexpr int kTotal = ROWS * kChunks;
  static_assert(kTotal % THREADS == 0, "a tile is a whole number of chunks per thread");
#pragma unroll
  for (int i = 0; i < kTotal / THREADS; ++i) {
    const int c = static_cast<int>(threadIdx.x) + i * THREADS;
    const int r = c / kChunks;
    const int col = (c - r * kChunks) * 8;
    const bool ok = r < valid;
    cp_async_16_zfill(tile + offset<ROWS>(r, col) * static_cast<int>(sizeof(T)),
                      src + (ok ? r * ld + col : 0), ok);
  }
}

}  // namespace sm90

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// Dynamic shared memory: (128 + 2 * STAGES * BN) * HD * sizeof(T) bytes plus 1024 bytes of alignment
// slack (_attention_sm90.py computes the same). 256 threads per block; one block per 128 query rows
// of each (batch, head), the query blocks of a head consecutive.
template <typename T, int HD, int BN, int STAGES, bool SKEW>
__global__ void __launch_bounds__(256, 1) flash_prefill_sm90(AttentionArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kThreads = 256;
  constexpr int kBM = 128;
  constexpr int kSteps = HD / 16;   // k16 steps of S = Q K^T
  constexpr int kPSteps = BN / 16;  // k16 steps of O += P V
  constexpr int kElem = static_cast<int>(sizeof(T));
  constexpr int kQBytes = kBM * HD * kElem;
  constexpr int kTileBytes = BN * HD * kElem;
  static_assert(HD == 64 || HD == 128, "head dimensions 64 and 128");
  static_assert(BN == 64 || BN == 128, "key tiles of 64 or 128");
  static_assert(STAGES >= 2 && STAGES <= 4, "two to four shared-memory stages");
  static_assert(!SKEW || STAGES >= 3, "a skewed warpgroup reads the previous tile's stage too");
  // Tiles copied ahead of the one in use: the stage refilled at tile it is that of tile it - 1
  // (without SKEW: every wgmma reading it was waited for before the barrier) or of tile it - 2 (with
  // SKEW, the lagging warpgroup reads tile it - 1 until the next barrier).
  constexpr int kAhead = SKEW ? STAGES - 2 : STAGES - 1;

  extern __shared__ uint4 shared_words[];
  const unsigned raw_base = shared_address(shared_words);
  const unsigned base = (raw_base + 1023u) & ~1023u;
  T* smem_q = reinterpret_cast<T*>(reinterpret_cast<unsigned char*>(shared_words) + (base - raw_base));
  const unsigned q_tile = base;
  const unsigned k_tiles = q_tile + kQBytes;
  const unsigned v_tiles = k_tiles + STAGES * kTileBytes;

  // Block -> (query block, batch, head), as flash_prefill.
  const int m_blocks = (a.seq_q + kBM - 1) / kBM;
  const int linear = static_cast<int>(blockIdx.x);
  const int m_index = linear % m_blocks;
  const int m_block = a.causal ? m_blocks - 1 - m_index : m_index;
  const int b = linear / m_blocks / a.heads;
  const int h = linear / m_blocks % a.heads;
  const int hk = h / (a.heads / a.kv_heads);
  const int m0 = m_block * kBM;
  const int rows = min(kBM, a.seq_q - m0);
  const int kv_len = kv_length(a, b);
  const int offset = kv_len - a.seq_q;  // position of query 0

  int n_begin = 0;
  int n_end = kv_len;
  if (a.causal) {
    n_end = min(kv_len, offset + m0 + rows);
    if (a.window > 0) n_begin = max(0, offset + m0 - a.window + 1);
  }
  n_begin = n_begin / BN * BN;
  const int tiles = n_end > n_begin ? (n_end - n_begin + BN - 1) / BN : 0;

  const T* q = static_cast<const T*>(a.q) + b * a.q_batch + h * a.q_head;
  const T* k = static_cast<const T*>(a.k) + b * a.k_batch + hk * a.k_head;
  const T* v = static_cast<const T*>(a.v) + b * a.v_batch + hk * a.v_head;

  sm90::load_rows<T, kBM, HD, kThreads>(q_tile, q + m0 * a.q_seq, static_cast<int>(a.q_seq), rows);
  auto load_kv = [&](int tile, int stage) {
    const int n0 = n_begin + tile * BN;
    const int valid = n_end - n0;
    sm90::load_rows<T, BN, HD, kThreads>(k_tiles + stage * kTileBytes, k + n0 * a.k_seq,
                                         static_cast<int>(a.k_seq), valid);
    sm90::load_rows<T, BN, HD, kThreads>(v_tiles + stage * kTileBytes, v + n0 * a.v_seq,
                                         static_cast<int>(a.v_seq), valid);
  };
  cp_async_commit();  // (Q)
#pragma unroll
  for (int t = 0; t < kAhead; ++t) {
    if (t < tiles) load_kv(t, t);
    cp_async_commit();
  }

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int warpgroup = warp / 4;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane >> 2;  // accumulator row (and row + 8) within the warp's 16
  const int tq = lane & 3;  // accumulator column pair
  const int group_row0 = 64 * warpgroup;
  const int group_pos_lo = offset + m0 + group_row0;  // positions of the warpgroup's first and last rows
  const int group_pos_hi = group_pos_lo + 63;
  const int warp_pos_lo = offset + m0 + 16 * warp;  // ... and of the warp's
  const int warp_pos_hi = warp_pos_lo + 15;
  const float scale_log2 = a.scale_log2;

  // Descriptors of k16 step 0 (Q: this warpgroup's 64 rows; K and V: stage 0). A step of S moves 32
  // bytes along a 128-byte row, and every fourth one to the next block of 64 columns; a step of
  // O += P V moves 16 keys (2048 bytes) down the V tile, whose blocks of 64 columns lie BN * 128
  // bytes apart (the leading offset of an N-major operand).
  const unsigned long long desc_q = sm90::descriptor(q_tile + group_row0 * 128, 16, 1024);
  const unsigned long long desc_k = sm90::descriptor(k_tiles, 16, 1024);
  const unsigned long long desc_v = sm90::descriptor(v_tiles, BN * 128, 1024);
  auto step_s = [](int step, int rows_per_block) {
    return static_cast<unsigned long long>((step / 4) * rows_per_block * 128 + (step % 4) * 32) >> 4;
  };

  float o[HD / 2];
  float s[BN / 2];
  unsigned p[kPSteps][4];
  float row_max[2] = {neg_inf(), neg_inf()};
  float row_sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) o[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) s[i] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < kPSteps; ++kk) {
#pragma unroll
    for (int e = 0; e < 4; ++e) p[kk][e] = 0u;
  }

  // S = Q K^T of the tile in `stage`, in registers when this returns.
  auto scores = [&](int stage) {
    const unsigned long long stage_k = static_cast<unsigned long long>(stage * kTileBytes) >> 4;
    sm90::fence();
    sm90::hold(s);
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      sm90::Ss<T, BN>::run(s, desc_q + step_s(step, kBM), desc_k + stage_k + step_s(step, BN),
                           step > 0 ? 1 : 0);
    }
    sm90::commit();
    sm90::wait<0>();
    sm90::hold(s);
  };
  // Masks S (keys from n0 on), folds it into the online softmax and accumulates O += P V of the
  // tile in `stage`, complete when this returns.
  auto accumulate = [&](int n0, int stage) {
    const bool masked =
        n0 + BN > kv_len ||
        (a.causal && (n0 + BN - 1 > warp_pos_lo || (a.window > 0 && n0 <= warp_pos_hi - a.window)));
    if (masked) {
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = n0 + 8 * j + 2 * tq + (e & 1);
          const int pos = warp_pos_lo + g + 8 * (e >> 1);
          bool visible = key < kv_len;
          if (a.causal) visible = visible && key <= pos && (a.window <= 0 || key > pos - a.window);
          if (!visible) s[4 * j + e] = neg_inf();
        }
      }
    }
    // Online softmax; a row's four lanes (tq = 0..3) share its maximum.
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float mx = row_max[hf];
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * hf], s[4 * j + 2 * hf + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float base_value = mx == neg_inf() ? 0.0f : mx * scale_log2;
      const float alpha = fast_exp2(row_max[hf] * scale_log2 - base_value);
      row_max[hf] = mx;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
        for (int e = 2 * hf; e < 2 * hf + 2; ++e) {
          const float pe = fast_exp2(fmaf(s[4 * j + e], scale_log2, -base_value));
          s[4 * j + e] = pe;
          sum += pe;
        }
      }
      row_sum[hf] = row_sum[hf] * alpha + sum;
#pragma unroll
      for (int d = 0; d < HD / 8; ++d) {
        o[4 * d + 2 * hf] *= alpha;
        o[4 * d + 2 * hf + 1] *= alpha;
      }
    }
    // P in the A-fragment layout: k16 step kk covers S columns 16 kk .. 16 kk + 15 (fragments 2 kk
    // and 2 kk + 1): words (row g, cols 2 tq..), (g + 8, 2 tq..), (g, 2 tq + 8..), (g + 8, 2 tq + 8..).
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk) {
      p[kk][0] = float2_to_word<T>(s[8 * kk + 0], s[8 * kk + 1]);
      p[kk][1] = float2_to_word<T>(s[8 * kk + 2], s[8 * kk + 3]);
      p[kk][2] = float2_to_word<T>(s[8 * kk + 4], s[8 * kk + 5]);
      p[kk][3] = float2_to_word<T>(s[8 * kk + 6], s[8 * kk + 7]);
    }
    const unsigned long long stage_v = static_cast<unsigned long long>(stage * kTileBytes) >> 4;
    sm90::fence();
    sm90::hold(o);
    sm90::hold(p);
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk) {
      sm90::Rs<T, HD>::run(o, p[kk], desc_v + stage_v + ((kk * 2048) >> 4));
    }
    sm90::commit();
    sm90::wait<0>();
    sm90::hold(o);
    sm90::hold(p);
  };
  // Whether any key of the tile from n0 on is visible to a row of this warpgroup.
  auto visible_tile = [&](int n0) {
    return group_row0 < rows &&
           (!a.causal || (n0 <= group_pos_hi && (a.window <= 0 || n0 + BN - 1 > group_pos_lo - a.window)));
  };
  // With SKEW, warpgroup 1 runs one step behind: between two barriers it finishes tile it - 1
  // (softmax, O += P V) and then computes S of tile it, while warpgroup 0 does all of tile it.
  const bool behind = SKEW && warpgroup == 1;

#pragma unroll 1
  for (int it = 0; it < tiles; ++it) {
    const int stage = it % STAGES;
    const int n0 = n_begin + it * BN;
    cp_async_wait<kAhead - 1>();  // this thread's copies of tile it (and of Q) have landed
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();  // ... every thread's; and no wgmma reads the stage refilled next
    if (it + kAhead < tiles) load_kv(it + kAhead, (it + kAhead) % STAGES);
    cp_async_commit();

    if (behind && it > 0 && visible_tile(n0 - BN)) accumulate(n0 - BN, (it + STAGES - 1) % STAGES);
    if (visible_tile(n0)) {
      scores(stage);
      if (!behind) accumulate(n0, stage);
    }
  }
  if (behind && tiles > 0) {
    const int last = n_begin + (tiles - 1) * BN;
    if (visible_tile(last)) accumulate(last, (tiles - 1) % STAGES);
  }
  cp_async_wait<0>();
  __syncthreads();  // every wgmma of the block has read the Q tile: it becomes the output staging

  // Normalise and stage the warp's rows in the layout of the Q tile, then store 16-byte chunks.
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float sum = row_sum[hf];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    const int row = 16 * warp + g + 8 * hf;
#pragma unroll
    for (int d = 0; d < HD / 8; ++d) {
      *reinterpret_cast<unsigned*>(smem_q + sm90::offset<kBM>(row, 8 * d + 2 * tq)) =
          float2_to_word<T>(o[4 * d + 2 * hf] * inv, o[4 * d + 2 * hf + 1] * inv);
    }
  }
  __syncthreads();
  T* out = static_cast<T*>(a.out) + b * a.o_batch + h * a.o_head;
  constexpr int kChunks = HD / 8;
#pragma unroll
  for (int i = 0; i < kBM * kChunks / kThreads; ++i) {
    const int c = static_cast<int>(threadIdx.x) + i * kThreads;
    const int r = c / kChunks;
    const int col = (c % kChunks) * 8;
    if (r < rows) {
      *reinterpret_cast<uint4*>(out + (m0 + r) * a.o_seq + col) =
          *reinterpret_cast<const uint4*>(smem_q + sm90::offset<kBM>(r, col));
    }
  }
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

}  // namespace attention
}  // namespace ops
}  // namespace pygpukit
