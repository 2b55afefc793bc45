// Decode attention: one new query per sequence over a KV cache whose length per sequence is read
// from device memory (so one captured CUDA graph replays at every position), split-K
// ("flash-decoding") in one kernel:
//
//   flash_decode<T, HD, WARPS, STAGES, PAGED>   grid (splits, kv_heads * head chunks, batch)
//
// The grid is fixed by the host (`splits` sized so that the blocks at full cache length fill the
// device once). The live keys of sequence b, [max(0, len - window), len), are cut on the device into
// chunks of a multiple of 64 keys, at least min_chunk (so a short context uses few splits and a
// block always has a few tiles to stream), and blocks past the last chunk exit at once: the work
// follows the live length while the launch stays the same.
//
// A block owns one chunk of one kv head and up to 16 of the query heads sharing it (GQA: the K and V
// rows are read from memory once for the whole group). The group's queries form the 16 rows of an
// m16 tensor-core tile (unused rows are zero), held in registers. Tiles of 16 * WARPS keys go
// through STAGES shared-memory stages filled by cp.async (16-byte copies, STAGES - 1 tiles ahead);
// warp w scores keys 16w .. 16w + 15 of each tile (S = Q K^T, mma.sync m16n8k16), folds them into
// its own running maximum, sum and output rows (online softmax in base 2) and multiplies by V with
// the probabilities straight from the S accumulators. At the end the warps' states are merged through
// shared memory. A sequence with one live chunk writes its rows at once; otherwise every block writes
// its (max, sum, unnormalised output) to the workspace and takes a ticket of its (sequence, kv head,
// head chunk): the last block to arrive merges all the chunks' partials in chunk order and resets the
// ticket to zero for the next launch (or graph replay). Deterministic: the merge reads every partial
// from memory in a fixed order whichever block arrives last; no atomics touch the data.
//
// Workspace (floats): [batch * heads * splits * HD] outputs, [batch * heads * splits * 2] (max, sum),
// then batch * heads unsigned tickets (zero between launches).
//
// Paged caches (PAGED): key j of sequence b lives in block block_table[b][j / block_size], row
// j % block_size.
#include "../common/overlap.cuh"
#include "attention_common.cuh"

namespace pygpukit {
namespace ops {
namespace attention {

// The chunks of a live range: `chunk` keys each (a multiple of kSplitGranule, at least min_chunk, and
// at most `splits` chunks), `used` of them non-empty.
struct DecodeSplit {
  int chunk;
  int used;
};

__device__ __forceinline__ DecodeSplit decode_split(int live, int splits, int min_chunk) {
  if (live <= 0) return {min_chunk, 0};
  const int per = (live + splits - 1) / splits;
  const int chunk = max(min_chunk, (per + kSplitGranule - 1) / kSplitGranule * kSplitGranule);
  return {chunk, (live + chunk - 1) / chunk};
}

template <typename T, int HD, int WARPS, int STAGES, bool PAGED>
__global__ void __launch_bounds__(WARPS * 32) flash_decode(AttentionArgs a) {
  overlap_wait();  // programmatic launch: q, the cache and the lengths come from the kernels before
  constexpr int kThreads = WARPS * 32;
  constexpr int KT = 16 * WARPS;  // keys per tile
  constexpr int kPad = (HD + 63) / 64 * 64;
  constexpr int kSteps = HD / 16;
  constexpr int kDTiles = HD / 8;
  constexpr int kTileBytes = KT * kPad * static_cast<int>(sizeof(T));
  constexpr int kAhead = STAGES - 1;  // tiles in flight beyond the one computed
  static_assert(kSplitGranule % KT == 0, "a split is a whole number of tiles");
  static_assert(HD % 16 == 0, "head dimensions are multiples of 16");
  static_assert(STAGES >= 2, "at least two stages");

  extern __shared__ uint4 shared_words[];
  __shared__ int last_block;
  const unsigned q_tile = shared_address(shared_words);
  const unsigned k_tiles = q_tile + 16 * kPad * static_cast<int>(sizeof(T));
  const unsigned v_tiles = k_tiles + STAGES * kTileBytes;

  const int split = static_cast<int>(blockIdx.x);
  const int group = a.heads / a.kv_heads;
  const int chunks = (group + 15) / 16;
  const int hk = static_cast<int>(blockIdx.y) / chunks;
  const int h0 = hk * group + (static_cast<int>(blockIdx.y) % chunks) * 16;
  const int rows = min(16, hk * group + group - h0);
  const int b = static_cast<int>(blockIdx.z);
  const int len = kv_length(a, b);
  const int k_begin = a.window > 0 ? max(0, len - a.window) : 0;
  const DecodeSplit cut = decode_split(len - k_begin, a.splits, a.min_chunk);
  const int s_lo = k_begin + split * cut.chunk;
  const int s_hi = min(len, s_lo + cut.chunk);
  T* out = static_cast<T*>(a.out) + b * a.o_batch + h0 * a.o_head;
  if (split >= cut.used) {
    if (split == 0) {  // no key at all: the rows are written as zeros
      for (int idx = static_cast<int>(threadIdx.x); idx < rows * HD; idx += kThreads) {
        out[(idx / HD) * a.o_head + idx % HD] = from_float<T>(0.0f);
      }
    }
    return;
  }
  const int tiles = (s_hi - s_lo + KT - 1) / KT;

  const T* q = static_cast<const T*>(a.q) + b * a.q_batch + h0 * a.q_head;
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  load_tile<T, 16, HD, kPad, kThreads>(
      q_tile, [&](int r) -> const T* { return r < rows ? q + r * a.q_head : nullptr; }, q);
  cp_async_commit();
  // Tile `tile` into stage `stage`, as two commit groups (K, then V); past the last tile two empty
  // groups, so that the count of groups per tile stays fixed.
  auto load_kv = [&](int tile, int stage) {
    if (tile >= tiles) {
      cp_async_commit();
      cp_async_commit();
      return;
    }
    const int n0 = s_lo + tile * KT;
    const unsigned k_tile = k_tiles + stage * kTileBytes;
    const unsigned v_tile = v_tiles + stage * kTileBytes;
    if constexpr (PAGED) {
      load_tile<T, KT, HD, kPad, kThreads>(
          k_tile,
          [&](int r) -> const T* {
            if (n0 + r >= s_hi) return nullptr;
            const long long offset = key_offset<true>(a, a.k_batch, a.k_seq, a.k_head, b, hk, n0 + r);
            return offset < 0 ? nullptr : k + offset;
          },
          k);
      cp_async_commit();
      load_tile<T, KT, HD, kPad, kThreads>(
          v_tile,
          [&](int r) -> const T* {
            if (n0 + r >= s_hi) return nullptr;
            const long long offset = key_offset<true>(a, a.v_batch, a.v_seq, a.v_head, b, hk, n0 + r);
            return offset < 0 ? nullptr : v + offset;
          },
          v);
      cp_async_commit();
    } else {
      load_rows<T, KT, HD, kPad, kThreads>(k_tile,
                                           k + key_offset<false>(a, a.k_batch, a.k_seq, a.k_head, b, hk, n0),
                                           static_cast<int>(a.k_seq), s_hi - n0);
      cp_async_commit();
      load_rows<T, KT, HD, kPad, kThreads>(v_tile,
                                           v + key_offset<false>(a, a.v_batch, a.v_seq, a.v_head, b, hk, n0),
                                           static_cast<int>(a.v_seq), s_hi - n0);
      cp_async_commit();
    }
  };
#pragma unroll
  for (int t = 0; t < kAhead; ++t) load_kv(t, t);

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int quad = lane >> 3;
  const int quad_row = lane & 7;
  const int g = lane >> 2;
  const int tq = lane & 3;
  const float scale_log2 = a.scale_log2;

  // The queries' fragments: in registers, except for the widest heads (the output rows need them).
  constexpr bool kQRegs = HD <= 128;
  auto q_address = [&](int step) {
    return q_tile + swizzle<kPad>((quad & 1) * 8 + quad_row, step * 16 + (quad >> 1) * 8) *
                        static_cast<int>(sizeof(T));
  };
  unsigned qf[kQRegs ? kSteps : 1][4];
  cp_async_wait<2 * kAhead>();  // the queries
  __syncthreads();
  if constexpr (kQRegs) {
#pragma unroll
    for (int step = 0; step < kSteps; ++step) ldmatrix_x4(qf[step], q_address(step));
  }

  float o[kDTiles][4];
#pragma unroll
  for (int d = 0; d < kDTiles; ++d) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[d][e] = 0.0f;
  }
  float row_max[2] = {neg_inf(), neg_inf()};
  float row_sum[2] = {0.0f, 0.0f};

  int stage = 0;
#pragma unroll 1
  for (int it = 0; it < tiles; ++it) {
    const int n0 = s_lo + it * KT + 16 * warp;  // this warp's first key
    cp_async_wait<2 * kAhead - 1>();            // K of tile it
    __syncthreads();                            // ... for every thread; and stage it - 1 is free
    load_kv(it + kAhead, stage == 0 ? STAGES - 1 : stage - 1);
    const bool active = n0 < s_hi;
    float s[2][4];
    if (active) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] = 0.0f;
      }
      const unsigned k_tile = k_tiles + stage * kTileBytes;
#pragma unroll
      for (int step = 0; step < kSteps; ++step) {
        unsigned kb[4];
        ldmatrix_x4(
            kb, k_tile + swizzle<kPad>(16 * warp + (quad >> 1) * 8 + quad_row, step * 16 + (quad & 1) * 8) *
                             static_cast<int>(sizeof(T)));
        unsigned qa[4];
        if constexpr (kQRegs) {
#pragma unroll
          for (int e = 0; e < 4; ++e) qa[e] = qf[step][e];
        } else {
          ldmatrix_x4(qa, q_address(step));
        }
        matmul::Mma<T>::run(s[0], qa, kb[0], kb[1]);
        matmul::Mma<T>::run(s[1], qa, kb[2], kb[3]);
      }
      if (n0 + 16 > s_hi) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (n0 + 8 * j + 2 * tq + (e & 1) >= s_hi) s[j][e] = neg_inf();
          }
        }
      }
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float mx = fmaxf(row_max[hf],
                         fmaxf(fmaxf(s[0][2 * hf], s[0][2 * hf + 1]), fmaxf(s[1][2 * hf], s[1][2 * hf + 1])));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float base = mx == neg_inf() ? 0.0f : mx * scale_log2;
        const float alpha = fast_exp2(row_max[hf] * scale_log2 - base);
        row_max[hf] = mx;
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
          for (int e = 2 * hf; e < 2 * hf + 2; ++e) {
            const float p = fast_exp2(fmaf(s[j][e], scale_log2, -base));
            s[j][e] = p;
            sum += p;
          }
        }
        row_sum[hf] = row_sum[hf] * alpha + sum;
#pragma unroll
        for (int d = 0; d < kDTiles; ++d) {
          o[d][2 * hf] *= alpha;
          o[d][2 * hf + 1] *= alpha;
        }
      }
    }
    cp_async_wait<2 * kAhead>();  // V of tile it
    __syncthreads();
    if (active) {
      unsigned pa[4];
      pa[0] = float2_to_word<T>(s[0][0], s[0][1]);
      pa[1] = float2_to_word<T>(s[0][2], s[0][3]);
      pa[2] = float2_to_word<T>(s[1][0], s[1][1]);
      pa[3] = float2_to_word<T>(s[1][2], s[1][3]);
      const unsigned v_tile = v_tiles + stage * kTileBytes;
#pragma unroll
      for (int d = 0; d < kDTiles; d += 2) {
        unsigned vb[4];
        ldmatrix_x4_trans(
            vb, v_tile + swizzle<kPad>(16 * warp + (quad & 1) * 8 + quad_row, 8 * d + (quad >> 1) * 8) *
                             static_cast<int>(sizeof(T)));
        matmul::Mma<T>::run(o[d], pa, vb[0], vb[1]);
        matmul::Mma<T>::run(o[d + 1], pa, vb[2], vb[3]);
      }
    }
    stage = stage + 1 == STAGES ? 0 : stage + 1;
  }
  cp_async_wait<0>();
  __syncthreads();  // the tiles are free for the merge below

  // Merge the warps: each writes its maxima (in base-2 units), sums and output rows, then every
  // thread merges some (row, column) elements over the warps in warp order.
  float* merged_o = reinterpret_cast<float*>(shared_words);  // [WARPS][16][HD]
  float* merged_m = merged_o + WARPS * 16 * HD;              // [WARPS][16]
  float* merged_l = merged_m + WARPS * 16;                   // [WARPS][16]
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float sum = row_sum[hf];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int row = g + 8 * hf;
    if (tq == 0) {
      merged_m[warp * 16 + row] = row_max[hf] == neg_inf() ? neg_inf() : row_max[hf] * scale_log2;
      merged_l[warp * 16 + row] = sum;
    }
#pragma unroll
    for (int d = 0; d < kDTiles; ++d) {
      *reinterpret_cast<float2*>(merged_o + (warp * 16 + row) * HD + 8 * d + 2 * tq) =
          make_float2(o[d][2 * hf], o[d][2 * hf + 1]);
    }
  }
  __syncthreads();
  const int splits = a.splits;
  const long long bh0 = static_cast<long long>(b) * a.heads + h0;
  const long long partials = static_cast<long long>(a.batch) * a.heads * splits;
  float* partial_o = a.partial + (bh0 * splits + split) * HD;                  // row stride splits * HD
  float* partial_ml = a.partial + partials * HD + (bh0 * splits + split) * 2;  // row stride splits * 2
  const bool alone = cut.used == 1;
#pragma unroll 1
  for (int idx = static_cast<int>(threadIdx.x); idx < rows * HD; idx += kThreads) {
    const int row = idx / HD;
    const int d = idx - row * HD;
    float m = neg_inf();
#pragma unroll
    for (int w = 0; w < WARPS; ++w) m = fmaxf(m, merged_m[w * 16 + row]);
    float l = 0.0f;
    float acc = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      const float mw = merged_m[w * 16 + row];
      const float f = mw == neg_inf() ? 0.0f : fast_exp2(mw - m);
      l += merged_l[w * 16 + row] * f;
      acc += merged_o[(w * 16 + row) * HD + d] * f;
    }
    if (alone) {
      out[row * a.o_head + d] = from_float<T>(l > 0.0f ? acc / l : 0.0f);
    } else {
      partial_o[static_cast<long long>(row) * splits * HD + d] = acc;
      if (d == 0) {
        partial_ml[static_cast<long long>(row) * splits * 2] = m;
        partial_ml[static_cast<long long>(row) * splits * 2 + 1] = l;
      }
    }
  }
  if (alone) return;

  // Publish the partials and take a ticket; the last of the `used` blocks merges.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned* ticket = reinterpret_cast<unsigned*>(a.partial + partials * (HD + 2)) +
                       (static_cast<long long>(b) * gridDim.y + blockIdx.y);
    const unsigned taken = atomicAdd(ticket, 1u);
    const bool last = taken == static_cast<unsigned>(cut.used) - 1u;
    if (last) atomicExch(ticket, 0u);  // every block of this launch has taken its ticket
    last_block = last;
  }
  __syncthreads();
  if (!last_block) return;
  __threadfence();

  // out = sum_s 2^(m_s - M) o_s / sum_s 2^(m_s - M) l_s over the used chunks in chunk order. Each
  // thread owns 4 columns of a row and reads the row's (m, l) itself (the threads of a row read the
  // same words: broadcasts), so there is no exchange through shared memory: one round trip to L2 for
  // the maxima and one for up to kBatch chunks' outputs.
  constexpr int kQuads = HD / 4;
  constexpr int kBatch = HD <= 128 ? 16 : 4;
  const int used = cut.used;
#pragma unroll 1
  for (int idx = static_cast<int>(threadIdx.x); idx < rows * kQuads; idx += kThreads) {
    const int row = idx / kQuads;
    const int d = (idx - row * kQuads) * 4;
    const float2* ml = reinterpret_cast<const float2*>(a.partial + partials * HD + (bh0 + row) * splits * 2);
    const float4* po = reinterpret_cast<const float4*>(a.partial + (bh0 + row) * splits * HD + d);
    float m = neg_inf();
#pragma unroll 1
    for (int s0 = 0; s0 < used; s0 += kBatch) {
      float ms[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) ms[j] = s0 + j < used ? __ldcg(&ml[s0 + j].x) : neg_inf();
#pragma unroll
      for (int j = 0; j < kBatch; ++j) m = fmaxf(m, ms[j]);
    }
    float l = 0.0f;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 1
    for (int s0 = 0; s0 < used; s0 += kBatch) {
      float2 pm[kBatch];
      float4 p[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (s0 + j < used) {
          pm[j] = __ldcg(ml + s0 + j);
          p[j] = __ldcg(po + static_cast<long long>(s0 + j) * kQuads);
        }
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (s0 + j < used) {
          const float f = pm[j].x == neg_inf() ? 0.0f : fast_exp2(pm[j].x - m);
          l = fmaf(pm[j].y, f, l);
          acc.x = fmaf(p[j].x, f, acc.x);
          acc.y = fmaf(p[j].y, f, acc.y);
          acc.z = fmaf(p[j].z, f, acc.z);
          acc.w = fmaf(p[j].w, f, acc.w);
        }
      }
    }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    T* o_row = out + row * a.o_head + d;
    o_row[0] = from_float<T>(acc.x * inv);
    o_row[1] = from_float<T>(acc.y * inv);
    o_row[2] = from_float<T>(acc.z * inv);
    o_row[3] = from_float<T>(acc.w * inv);
  }
}

}  // namespace attention
}  // namespace ops
}  // namespace pygpukit
