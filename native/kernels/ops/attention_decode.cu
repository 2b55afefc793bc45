// Decode attention: one new query per sequence over a KV cache whose length per sequence is read
// from device memory (so one captured CUDA graph replays at every position), split-K
// ("flash-decoding"):
//
//   flash_decode<T, HD, WARPS, PAGED>   grid (splits, kv_heads * head chunks, batch)
//   decode_combine<T, HD>               grid (batch * heads)
//
// The grid is fixed by the host (a number of splits sized to fill the device at the cache's
// capacity); the live keys of sequence b, [max(0, len - window), len), are cut on the device into
// `splits` chunks of a multiple of 64 keys, and blocks whose chunk is empty exit at once. So the work
// follows the live length while the launch stays the same.
//
// A block owns one chunk of one kv head and up to 16 of the query heads sharing it (GQA: the K and V
// rows are read from memory once for the whole group). The group's queries form the 16 rows of an
// m16 tensor-core tile (unused rows are zero), held in registers. Tiles of 16 * WARPS keys go
// through two shared-memory stages filled by cp.async; warp w scores keys 16w .. 16w + 15 of each
// tile (S = Q K^T, mma.sync m16n8k16), folds them into its own running maximum, sum and output rows
// (online softmax in base 2) and multiplies by V with the probabilities straight from the S
// accumulators. At the end the warps' states are merged through shared memory and the block writes
// either the finished rows (one split) or its (max, sum, unnormalised output) to the workspace,
// which decode_combine merges in split order. Deterministic: no atomics, a fixed order.
//
// Paged caches (PAGED): key j of sequence b lives in block block_table[b][j / block_size], row
// j % block_size.
#include "attention_common.cuh"

namespace pygpukit {
namespace ops {
namespace attention {

template <typename T, int HD, int WARPS, bool PAGED>
__global__ void __launch_bounds__(WARPS * 32) flash_decode(AttentionArgs a) {
  constexpr int kThreads = WARPS * 32;
  constexpr int KT = 16 * WARPS;  // keys per tile
  constexpr int kPad = (HD + 63) / 64 * 64;
  constexpr int kSteps = HD / 16;
  constexpr int kDTiles = HD / 8;
  constexpr int kTileBytes = KT * kPad * static_cast<int>(sizeof(T));
  static_assert(kSplitGranule % KT == 0, "a split is a whole number of tiles");
  static_assert(HD % 16 == 0, "head dimensions are multiples of 16");

  extern __shared__ uint4 shared_words[];
  const unsigned q_tile = shared_address(shared_words);
  const unsigned k_tiles = q_tile + 16 * kPad * static_cast<int>(sizeof(T));
  const unsigned v_tiles = k_tiles + 2 * kTileBytes;

  const int split = static_cast<int>(blockIdx.x);
  const int group = a.heads / a.kv_heads;
  const int chunks = (group + 15) / 16;
  const int hk = static_cast<int>(blockIdx.y) / chunks;
  const int h0 = hk * group + (static_cast<int>(blockIdx.y) % chunks) * 16;
  const int rows = min(16, hk * group + group - h0);
  const int b = static_cast<int>(blockIdx.z);
  const int len = kv_length(a, b);
  const int k_begin = a.window > 0 ? max(0, len - a.window) : 0;
  const int chunk = split_chunk(len - k_begin, a.splits);
  const int s_lo = k_begin + split * chunk;
  const int s_hi = min(len, s_lo + chunk);
  T* out = static_cast<T*>(a.out) + b * a.o_batch + h0 * a.o_head;
  if (s_lo >= s_hi) {
    if (a.splits == 1) {  // no key at all: the rows are written as zeros
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
  auto load_kv = [&](int tile, int stage) {
    const int n0 = s_lo + tile * KT;
    const unsigned k_tile = k_tiles + stage * kTileBytes;
    const unsigned v_tile = v_tiles + stage * kTileBytes;
    if constexpr (PAGED) {
      load_tile<T, KT, HD, kPad, kThreads>(
          k_tile,
          [&](int r) -> const T* {
            return n0 + r < s_hi ? k + key_offset<true>(a, a.k_batch, a.k_seq, a.k_head, b, hk, n0 + r)
                                 : nullptr;
          },
          k);
      cp_async_commit();
      load_tile<T, KT, HD, kPad, kThreads>(
          v_tile,
          [&](int r) -> const T* {
            return n0 + r < s_hi ? v + key_offset<true>(a, a.v_batch, a.v_seq, a.v_head, b, hk, n0 + r)
                                 : nullptr;
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
  load_kv(0, 0);

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
  cp_async_wait<2>();
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

#pragma unroll 1
  for (int it = 0; it < tiles; ++it) {
    const int stage = it & 1;
    const int n0 = s_lo + it * KT + 16 * warp;  // this warp's first key
    cp_async_wait<1>();
    __syncthreads();
    if (it + 1 < tiles) {
      load_kv(it + 1, stage ^ 1);
    } else {
      cp_async_commit();
      cp_async_commit();
    }
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
    cp_async_wait<2>();
    __syncthreads();
    if (active) {
      unsigned pa[4];
      pa[0] = pack2<T>(s[0][0], s[0][1]);
      pa[1] = pack2<T>(s[0][2], s[0][3]);
      pa[2] = pack2<T>(s[1][0], s[1][1]);
      pa[3] = pack2<T>(s[1][2], s[1][3]);
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
  const int bh0 = b * a.heads + h0;
  float* partial_ml = a.partial + (static_cast<long long>(bh0) * a.splits + split) * 2;
  float* partial_o = a.partial + static_cast<long long>(a.batch) * a.heads * a.splits * 2 +
                     (static_cast<long long>(bh0) * a.splits + split) * HD;
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
    if (a.splits == 1) {
      out[row * a.o_head + d] = from_float<T>(l > 0.0f ? acc / l : 0.0f);
    } else {
      partial_o[static_cast<long long>(row) * a.splits * HD + d] = acc;
      if (d == 0) {
        partial_ml[static_cast<long long>(row) * a.splits * 2] = m;
        partial_ml[static_cast<long long>(row) * a.splits * 2 + 1] = l;
      }
    }
  }
}

// Merges the splits of flash_decode: out = sum_s 2^(m_s - M) o_s / sum_s 2^(m_s - M) l_s, over the
// live splits in order.
template <typename T, int HD>
__global__ void __launch_bounds__(128) decode_combine(AttentionArgs a) {
  const int bh = static_cast<int>(blockIdx.x);
  const int b = bh / a.heads;
  const int h = bh - b * a.heads;
  const int len = kv_length(a, b);
  const int live = len - (a.window > 0 ? max(0, len - a.window) : 0);
  const int chunk = split_chunk(live, a.splits);
  const int used = chunk > 0 ? (live + chunk - 1) / chunk : 0;
  const float* ml = a.partial + static_cast<long long>(bh) * a.splits * 2;
  const float* po = a.partial + static_cast<long long>(a.batch) * a.heads * a.splits * 2 +
                    static_cast<long long>(bh) * a.splits * HD;
  T* out = static_cast<T*>(a.out) + b * a.o_batch + h * a.o_head;
  for (int d = static_cast<int>(threadIdx.x); d < HD; d += static_cast<int>(blockDim.x)) {
    float m = neg_inf();
    for (int s = 0; s < used; ++s) m = fmaxf(m, ml[2 * s]);
    float l = 0.0f;
    float acc = 0.0f;
    for (int s = 0; s < used; ++s) {
      const float ms = ml[2 * s];
      const float f = ms == neg_inf() ? 0.0f : fast_exp2(ms - m);
      l += ml[2 * s + 1] * f;
      acc += po[s * HD + d] * f;
    }
    out[d] = from_float<T>(l > 0.0f ? acc / l : 0.0f);
  }
}

}  // namespace attention
}  // namespace ops
}  // namespace pygpukit
