// Attention over many queries (prefill, encoder self-attention, cross attention):
//
//   out[b, i, h] = softmax_j(scale * q[b, i, h] . k[b, j, hk] + mask) @ v[b, :, hk]
//   with hk = h / (heads / kv_heads)
//
//   flash_prefill<T, HD, WARPS, TILES_M, BN, Q_REGS>   fp16 / bf16 on tensor cores (mma.sync m16n8k16)
//   attention_simt<HD, PAGED>                            float32 on the CUDA cores; also float32 decode
//
// flash_prefill follows flash-attention 2. A block owns BM = WARPS * 16 * TILES_M query rows of one
// (batch, head); each warp owns TILES_M m16 tiles of them. The Q tile is copied to shared memory once
// (and into registers when Q_REGS); K and V advance BN keys at a time through two shared-memory
// stages filled by cp.async, the next tile's copies in flight while the current one is used:
//
//   wait K[t]; barrier; issue K[t+1], V[t+1];  S = Q K[t]^T (fp32);  mask;  online softmax;
//   wait V[t]; barrier;  O += P V[t]  (P rounded to T, straight from the S accumulators)
//
// The online softmax keeps a running maximum m and sum l per row in base 2 (exp2 of
// scale * log2(e) * s - m), rescaling O when m grows. Tiles no key of which is visible to a warp's
// rows are skipped by that warp; only tiles crossing the causal diagonal, the window edge or the end
// of the keys are masked. The query blocks of a head run next to each other (sharing K and V in L2),
// for causal attention those with the most keys first. Each output row is normalised by its l and
// written through shared memory as 16-byte stores. Fragments are read with ldmatrix (.trans for V);
// shared rows are swizzled (attention_common.cuh). Deterministic: no atomics, a fixed order.
#include "attention_common.cuh"

namespace pygpukit {
namespace ops {
namespace attention {

template <typename T, int HD, int WARPS, int TILES_M, int BN, bool Q_REGS>
__global__ void __launch_bounds__(WARPS * 32) flash_prefill(AttentionArgs a) {
  constexpr int kThreads = WARPS * 32;
  constexpr int kBM = WARPS * 16 * TILES_M;
  constexpr int kPad = (HD + 63) / 64 * 64;
  constexpr int kSteps = HD / 16;  // k16 steps of Q K^T
  constexpr int kDTiles = HD / 8;  // n8 tiles of O
  constexpr int kNTiles = BN / 8;  // n8 tiles of S
  constexpr int kTileBytes = BN * kPad * static_cast<int>(sizeof(T));
  static_assert(HD % 16 == 0 && BN % 16 == 0 && kDTiles % 2 == 0, "tiles are made of 16 x 16 blocks");

  extern __shared__ uint4 shared_words[];
  T* smem_q = reinterpret_cast<T*>(shared_words);
  const unsigned q_tile = shared_address(smem_q);
  const unsigned k_tiles = q_tile + kBM * kPad * static_cast<int>(sizeof(T));
  const unsigned v_tiles = k_tiles + 2 * kTileBytes;

  // Block -> (query block, batch, head): the query blocks of one head are consecutive, so the blocks
  // resident together share their heads' K and V in L2; for causal attention each head's last query
  // blocks (the most keys) come first.
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

  load_rows<T, kBM, HD, kPad, kThreads>(q_tile, q + m0 * a.q_seq, static_cast<int>(a.q_seq), rows);
  cp_async_commit();
  auto load_kv = [&](int tile, int stage) {
    const int n0 = n_begin + tile * BN;
    const int valid = n_end - n0;
    load_rows<T, BN, HD, kPad, kThreads>(k_tiles + stage * kTileBytes, k + n0 * a.k_seq,
                                         static_cast<int>(a.k_seq), valid);
    cp_async_commit();
    load_rows<T, BN, HD, kPad, kThreads>(v_tiles + stage * kTileBytes, v + n0 * a.v_seq,
                                         static_cast<int>(a.v_seq), valid);
    cp_async_commit();
  };
  if (tiles > 0) {
    load_kv(0, 0);
  } else {
    cp_async_commit();
    cp_async_commit();
  }

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int quad = lane >> 3;  // which 8 x 8 matrix of an ldmatrix.x4 this lane addresses
  const int quad_row = lane & 7;
  const int g = lane >> 2;  // fragment row (and row + 8)
  const int tq = lane & 3;  // fragment column pair
  const int warp_row0 = warp * 16 * TILES_M;
  const int warp_pos_lo = offset + m0 + warp_row0;  // positions of the warp's first and last rows
  const int warp_pos_hi = warp_pos_lo + 16 * TILES_M - 1;
  const float scale_log2 = a.scale_log2;

  // K and V fragment addresses: with the swizzle of attention_common.cuh, row (a multiple of 8) + r
  // and chunk c reduce to a per-lane offset plus (per-lane chunk ^ c) * 16 bytes.
  constexpr int kRowBytes = kPad * static_cast<int>(sizeof(T));
  const int k_lane = ((quad >> 1) * 8 + quad_row) * kRowBytes;
  const int k_chunk = ((quad & 1) ^ quad_row) * 16;
  const int v_lane = ((quad & 1) * 8 + quad_row) * kRowBytes;
  const int v_chunk = ((quad >> 1) ^ quad_row) * 16;
  auto q_address = [&](int i, int step) {
    return q_tile +
           swizzle<kPad>(warp_row0 + 16 * i + (quad & 1) * 8 + quad_row, step * 16 + (quad >> 1) * 8) *
               static_cast<int>(sizeof(T));
  };
  unsigned q_regs[Q_REGS ? TILES_M : 1][Q_REGS ? kSteps : 1][4];
  cp_async_wait<2>();  // the Q tile has landed (K and V of tile 0 may still be in flight)
  __syncthreads();
  if constexpr (Q_REGS) {
#pragma unroll
    for (int i = 0; i < TILES_M; ++i) {
#pragma unroll
      for (int step = 0; step < kSteps; ++step) ldmatrix_x4(q_regs[i][step], q_address(i, step));
    }
  }

  float o[TILES_M][kDTiles][4];
  float row_max[TILES_M][2];
  float row_sum[TILES_M][2];
#pragma unroll
  for (int i = 0; i < TILES_M; ++i) {
#pragma unroll
    for (int d = 0; d < kDTiles; ++d) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[i][d][e] = 0.0f;
    }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      row_max[i][hf] = neg_inf();
      row_sum[i][hf] = 0.0f;
    }
  }

#pragma unroll 1
  for (int it = 0; it < tiles; ++it) {
    const int stage = it & 1;
    const int n0 = n_begin + it * BN;
    cp_async_wait<1>();  // K of this tile has landed (its V may still be in flight)
    __syncthreads();     // ... for every thread, and every warp is done with the other stage
    if (it + 1 < tiles) {
      load_kv(it + 1, stage ^ 1);
    } else {
      cp_async_commit();
      cp_async_commit();
    }
    const bool active =
        !a.causal || (n0 <= warp_pos_hi && (a.window <= 0 || n0 + BN - 1 > warp_pos_lo - a.window));
    float s[TILES_M][kNTiles][4];
    if (active) {
#pragma unroll
      for (int i = 0; i < TILES_M; ++i) {
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[i][j][e] = 0.0f;
        }
      }
      const unsigned k_tile = k_tiles + stage * kTileBytes + k_lane;
#pragma unroll
      for (int step = 0; step < kSteps; ++step) {
        unsigned qa[TILES_M][4];
#pragma unroll
        for (int i = 0; i < TILES_M; ++i) {
          if constexpr (Q_REGS) {
#pragma unroll
            for (int e = 0; e < 4; ++e) qa[i][e] = q_regs[i][step][e];
          } else {
            ldmatrix_x4(qa[i], q_address(i, step));
          }
        }
#pragma unroll
        for (int j = 0; j < kNTiles; j += 2) {
          unsigned kb[4];
          ldmatrix_x4(kb, k_tile + j * 8 * kRowBytes + (k_chunk ^ (step * 32)));
#pragma unroll
          for (int i = 0; i < TILES_M; ++i) {
            matmul::Mma<T>::run(s[i][j], qa[i], kb[0], kb[1]);
            matmul::Mma<T>::run(s[i][j + 1], qa[i], kb[2], kb[3]);
          }
        }
      }

      const bool masked =
          n0 + BN > kv_len ||
          (a.causal && (n0 + BN - 1 > warp_pos_lo || (a.window > 0 && n0 <= warp_pos_hi - a.window)));
      if (masked) {
#pragma unroll
        for (int i = 0; i < TILES_M; ++i) {
#pragma unroll
          for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int key = n0 + 8 * j + 2 * tq + (e & 1);
              const int pos = warp_pos_lo + 16 * i + g + 8 * (e >> 1);
              bool visible = key < kv_len;
              if (a.causal) visible = visible && key <= pos && (a.window <= 0 || key > pos - a.window);
              if (!visible) s[i][j][e] = neg_inf();
            }
          }
        }
      }

      // Online softmax; a row's four lanes (tq = 0..3) share its maximum.
#pragma unroll
      for (int i = 0; i < TILES_M; ++i) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          float mx = row_max[i][hf];
#pragma unroll
          for (int j = 0; j < kNTiles; ++j) mx = fmaxf(mx, fmaxf(s[i][j][2 * hf], s[i][j][2 * hf + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float base = mx == neg_inf() ? 0.0f : mx * scale_log2;
          const float alpha = fast_exp2(row_max[i][hf] * scale_log2 - base);
          row_max[i][hf] = mx;
          float sum = 0.0f;
#pragma unroll
          for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
            for (int e = 2 * hf; e < 2 * hf + 2; ++e) {
              const float p = fast_exp2(fmaf(s[i][j][e], scale_log2, -base));
              s[i][j][e] = p;
              sum += p;
            }
          }
          row_sum[i][hf] = row_sum[i][hf] * alpha + sum;
#pragma unroll
          for (int d = 0; d < kDTiles; ++d) {
            o[i][d][2 * hf] *= alpha;
            o[i][d][2 * hf + 1] *= alpha;
          }
        }
      }
    }

    cp_async_wait<2>();  // V of this tile has landed
    __syncthreads();
    if (active) {
      const unsigned v_tile = v_tiles + stage * kTileBytes + v_lane;
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        unsigned pa[TILES_M][4];
#pragma unroll
        for (int i = 0; i < TILES_M; ++i) {
          pa[i][0] = float2_to_word<T>(s[i][2 * kk][0], s[i][2 * kk][1]);
          pa[i][1] = float2_to_word<T>(s[i][2 * kk][2], s[i][2 * kk][3]);
          pa[i][2] = float2_to_word<T>(s[i][2 * kk + 1][0], s[i][2 * kk + 1][1]);
          pa[i][3] = float2_to_word<T>(s[i][2 * kk + 1][2], s[i][2 * kk + 1][3]);
        }
#pragma unroll
        for (int d = 0; d < kDTiles; d += 2) {
          unsigned vb[4];
          ldmatrix_x4_trans(vb, v_tile + kk * 16 * kRowBytes + (v_chunk ^ (d * 16)));
#pragma unroll
          for (int i = 0; i < TILES_M; ++i) {
            matmul::Mma<T>::run(o[i][d], pa[i], vb[0], vb[1]);
            matmul::Mma<T>::run(o[i][d + 1], pa[i], vb[2], vb[3]);
          }
        }
      }
    }
  }
  cp_async_wait<0>();

  // Normalise and stage the warp's rows in its own rows of the Q tile (only this warp read them),
  // then store them as 16-byte chunks.
#pragma unroll
  for (int i = 0; i < TILES_M; ++i) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float sum = row_sum[i][hf];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      const int row = warp_row0 + 16 * i + g + 8 * hf;
#pragma unroll
      for (int d = 0; d < kDTiles; ++d) {
        *reinterpret_cast<unsigned*>(smem_q + swizzle<kPad>(row, 8 * d + 2 * tq)) =
            float2_to_word<T>(o[i][d][2 * hf] * inv, o[i][d][2 * hf + 1] * inv);
      }
    }
  }
  __syncwarp();
  T* out = static_cast<T*>(a.out) + b * a.o_batch + h * a.o_head;
  constexpr int kChunks = HD / 8;
#pragma unroll 1
  for (int c = lane; c < 16 * TILES_M * kChunks; c += 32) {
    const int r = warp_row0 + c / kChunks;
    const int col = (c % kChunks) * 8;
    if (r < rows) {
      *reinterpret_cast<uint4*>(out + (m0 + r) * a.o_seq + col) =
          *reinterpret_cast<const uint4*>(smem_q + swizzle<kPad>(r, col));
    }
  }
}

// float32 attention on the CUDA cores, for prefill and decode alike. The rows of a block are
// (query, head) pairs of one kv head: row r is query r / group of head hk * group + r % group, so
// grouped heads share the K and V tiles. Each warp owns one row: KT keys at a time are staged in
// shared memory, lane j scores key j (the whole dot product, reading the row's q from shared
// memory), the warp folds the tile into its running maximum and sum, and each lane accumulates the
// output columns lane, lane + 32, ...
template <int HD, bool PAGED>
__global__ void __launch_bounds__(128) attention_simt(AttentionArgs a) {
  constexpr int kRows = 4;  // warps, one row each
  constexpr int KT = HD > 128 ? 16 : 32;
  constexpr int kPer = (HD + 31) / 32;
  __shared__ float smem_k[KT][HD + 1];
  __shared__ float smem_v[KT][HD];
  __shared__ float smem_q[kRows][HD];

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int group = a.heads / a.kv_heads;
  const int total_rows = a.seq_q * group;
  const int hk = static_cast<int>(blockIdx.y);
  const int b = static_cast<int>(blockIdx.z);
  const int first = static_cast<int>(blockIdx.x) * kRows;
  const int last = min(total_rows, first + kRows) - 1;
  const int row = first + warp;
  const int kv_len = kv_length(a, b);
  const int offset = kv_len - a.seq_q;

  auto key_range = [&](int r, int& lo, int& hi) {
    const int pos = offset + r / group;
    lo = 0;
    hi = kv_len;
    if (a.causal) {
      hi = min(kv_len, pos + 1);
      if (a.window > 0) lo = max(0, pos - a.window + 1);
    }
  };
  int lo, hi, block_lo, block_hi, unused;
  key_range(row < total_rows ? row : last, lo, hi);
  if (row >= total_rows) hi = lo;
  key_range(first, block_lo, unused);
  key_range(last, unused, block_hi);

  const int h = hk * group + (row < total_rows ? row % group : 0);
  const int i = row < total_rows ? row / group : 0;
  const float* q = static_cast<const float*>(a.q) + b * a.q_batch + i * a.q_seq + h * a.q_head;
  for (int d = lane; d < HD; d += 32) smem_q[warp][d] = row < total_rows ? q[d] : 0.0f;

  float o[kPer];
#pragma unroll
  for (int e = 0; e < kPer; ++e) o[e] = 0.0f;
  float row_max = neg_inf();
  float row_sum = 0.0f;
  const float* kbase = static_cast<const float*>(a.k);
  const float* vbase = static_cast<const float*>(a.v);

#pragma unroll 1
  for (int n0 = block_lo; n0 < block_hi; n0 += KT) {
    __syncthreads();  // the previous tile is consumed (and smem_q written, the first time)
    for (int idx = static_cast<int>(threadIdx.x); idx < KT * HD; idx += 128) {
      const int r = idx / HD;
      const int d = idx - r * HD;
      const int key = n0 + r;
      float kv = 0.0f, vv = 0.0f;
      if (key < block_hi) {
        const long long k_at = key_offset<PAGED>(a, a.k_batch, a.k_seq, a.k_head, b, hk, key);
        const long long v_at = key_offset<PAGED>(a, a.v_batch, a.v_seq, a.v_head, b, hk, key);
        kv = k_at < 0 ? 0.0f : kbase[k_at + d];  // (-1: a paged key outside the cache, see key_offset)
        vv = v_at < 0 ? 0.0f : vbase[v_at + d];
      }
      smem_k[r][d] = kv;
      smem_v[r][d] = vv;
    }
    __syncthreads();
    const int key = n0 + lane;
    float score = neg_inf();
    if (lane < KT && key >= lo && key < hi) {
      float dot = 0.0f;
#pragma unroll 8
      for (int d = 0; d < HD; ++d) dot = fmaf(smem_q[warp][d], smem_k[lane][d], dot);
      score = dot * a.scale_log2;
    }
    float mx = score;
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, m));
    mx = fmaxf(mx, row_max);
    if (mx == neg_inf()) continue;  // no visible key yet (uniform across the warp)
    const float alpha = exp2f(row_max - mx);
    const float p = exp2f(score - mx);
    float sum = p;
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, m);
    row_sum = row_sum * alpha + sum;
    row_max = mx;
#pragma unroll
    for (int e = 0; e < kPer; ++e) o[e] *= alpha;
#pragma unroll 4
    for (int j = 0; j < KT; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        const int d = lane + 32 * e;
        if (d < HD) o[e] = fmaf(pj, smem_v[j][d], o[e]);
      }
    }
  }
  if (row < total_rows) {
    const float inv = row_sum > 0.0f ? 1.0f / row_sum : 0.0f;
    float* out = static_cast<float*>(a.out) + b * a.o_batch + i * a.o_seq + h * a.o_head;
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int d = lane + 32 * e;
      if (d < HD) out[d] = o[e] * inv;
    }
  }
}

}  // namespace attention
}  // namespace ops
}  // namespace pygpukit
