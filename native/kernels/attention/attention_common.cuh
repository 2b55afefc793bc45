// What the attention kernels (attention_prefill.cu, attention_decode.cu) share: the argument block,
// key lengths and key addressing (strided or paged), the shared-memory tile layout and copies, and
// the tensor-core fragment helpers. Conversions (from_float, and float2_to_word for two values
// rounded into the 32-bit register of a fragment) come from common/convert.cuh.
//
// Positions: a sequence of batch entry b has kv_len keys (0 .. kv_len - 1). Its seq_q queries are
// the last seq_q positions, query i at position kv_len - seq_q + i (bottom-right aligned, as in
// flash-attention). Causal: key j is visible to the query at position p iff j <= p, and with a
// window w > 0 also j > p - w. Non-causal: every key is visible. Scores are scale * q . k; softmax
// runs in base 2 on scale * log2(e) * q . k, with float accumulation throughout.
#pragma once

#include "../common/convert.cuh"
#include "../common/fast_math.cuh"
#include "../gemm/gemm_common.cuh"

namespace pygpukit {
namespace ops {
namespace attention {

using gemm::cp_async_commit;
using gemm::cp_async_wait;
using gemm::shared_address;

// Packed by pygpukit/ops/attention.py (_ARGS); field order and types must match.
struct AttentionArgs {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  const int* lens;         // per batch entry: kv_len = lens[b] + lens_add; nullptr: kv_len = kv_capacity
  const int* block_table;  // paged keys: (batch, blocks per sequence) block ids; nullptr: strided keys
  float* partial;          // split decoding: (m, l) then the unnormalised outputs of every split
  long long q_batch, q_seq, q_head;  // element strides; the head dimension is contiguous
  long long k_batch, k_seq, k_head;  // paged: k_batch is the stride of a block, k_seq of a row in it
  long long v_batch, v_seq, v_head;
  long long o_batch, o_seq, o_head;
  long long table_stride;  // row stride of block_table
  int batch, heads, kv_heads, seq_q;
  int kv_capacity;  // keys of the operand (a device length is clamped to it)
  int lens_add;
  int causal, window;  // window <= 0: no window
  int block_size, splits;
  float scale_log2;  // scale * log2(e)
  int min_chunk;     // decode: fewest keys of a split (a multiple of kSplitGranule)
  int num_blocks;    // paged keys: blocks in k and v (ids outside [0, num_blocks) are not read)
};

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

__device__ __forceinline__ int kv_length(const AttentionArgs& a, int b) {
  // In 64 bits: a length near 2**31 plus lens_add must not wrap (signed overflow is undefined).
  const long long len = a.lens != nullptr ? static_cast<long long>(a.lens[b]) + a.lens_add
                                          : static_cast<long long>(a.kv_capacity);
  return static_cast<int>(max(0LL, min(len, static_cast<long long>(a.kv_capacity))));
}

// Keys of a decode split are a multiple of this (attention_decode.cu).
constexpr int kSplitGranule = 64;

// Element offset of key j of (batch b, kv head hk) in a K or V operand; -1 for a paged key whose block
// id is outside [0, num_blocks): the callers read it as zeros, so a bad device table cannot make the
// kernels read memory outside the cache (host tables are checked before launch).
template <bool PAGED>
__device__ __forceinline__ long long key_offset(const AttentionArgs& a, long long s_batch, long long s_seq,
                                                long long s_head, int b, int hk, int j) {
  if constexpr (PAGED) {
    const int block = a.block_table[b * a.table_stride + j / a.block_size];
    if (block < 0 || block >= a.num_blocks) return -1;
    return block * s_batch + (j % a.block_size) * s_seq + hk * s_head;
  } else {
    return b * s_batch + j * s_seq + hk * s_head;
  }
}

// 16-byte copy global -> shared; a copy with valid == false reads nothing and writes zeros.
__device__ __forceinline__ void cp_async_16_zfill(unsigned dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}

using gemm::ldmatrix_x4;
using gemm::ldmatrix_x4_trans;
// Shared tiles hold rows of PAD elements (the head dimension rounded up to 64, so a row is a whole
// number of 128-byte lines); 16-byte chunk c of row r sits at chunk c ^ (r & 7) of its group of 8.
// The 8 rows read by one ldmatrix phase and the 8 chunks written by one cp.async phase then fall in
// 8 different bank groups.
template <int PAD>
__device__ __forceinline__ int swizzle(int row, int col) {
  static_assert(PAD % 64 == 0, "shared rows are whole 128-byte lines");
  const int chunk = col >> 3;
  return row * PAD + ((chunk & ~7) | ((chunk ^ row) & 7)) * 8 + (col & 7);
}

// Copies ROWS rows of HD elements into a swizzled shared tile, 16 bytes per cp.async. row(r) gives
// the global address of tile row r, or nullptr for a row to zero-fill; fallback is any valid address.
template <typename T, int ROWS, int HD, int PAD, int THREADS, typename RowAddress>
__device__ __forceinline__ void load_tile(unsigned tile, RowAddress row, const T* fallback) {
  constexpr int kChunks = HD / 8;
  constexpr int kTotal = ROWS * kChunks;
#pragma unroll
  for (int i = 0; i < (kTotal + THREADS - 1) / THREADS; ++i) {
    const int c = static_cast<int>(threadIdx.x) + i * THREADS;
    if (kTotal % THREADS == 0 || c < kTotal) {
      const int r = c / kChunks;
      const int col = (c - r * kChunks) * 8;
      const T* src = row(r);
      const bool valid = src != nullptr;
      cp_async_16_zfill(tile + swizzle<PAD>(r, col) * static_cast<int>(sizeof(T)),
                        valid ? src + col : fallback, valid);
    }
  }
}

// load_tile for rows at a fixed stride: tile row r is src + r * ld, rows r >= valid are zero-filled.
// (Offsets within a tile fit in 32 bits; the caller checks ld.)
template <typename T, int ROWS, int HD, int PAD, int THREADS>
__device__ __forceinline__ void load_rows(unsigned tile, const T* src, int ld, int valid) {
  constexpr int kChunks = HD / 8;
  constexpr int kTotal = ROWS * kChunks;
#pragma unroll
  for (int i = 0; i < (kTotal + THREADS - 1) / THREADS; ++i) {
    const int c = static_cast<int>(threadIdx.x) + i * THREADS;
    if (kTotal % THREADS == 0 || c < kTotal) {
      const int r = c / kChunks;
      const int col = (c - r * kChunks) * 8;
      const bool ok = r < valid;
      cp_async_16_zfill(tile + swizzle<PAD>(r, col) * static_cast<int>(sizeof(T)),
                        src + (ok ? r * ld + col : 0), ok);
    }
  }
}

}  // namespace attention
}  // namespace ops
}  // namespace pygpukit
