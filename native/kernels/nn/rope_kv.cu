// RoPE fused with the decode step's KV-cache write, in one launch, computed in float:
//
//   rope_kv_append<T, C, kGptj, W>(q, q_out, k, v, k_cache, v_cache, cos, sin, positions, units, shape)
//       q: (batch, seq, q_heads, head_dim), k and v: (batch, seq, kv_heads, head_dim) of T, the last
//       dimension contiguous, the other strides arbitrary (in elements; views into one fused qkv
//       buffer work). Token (b, s) sits at position p = positions[b * pos_stride] + offset + s.
//       q is rotated into q_out (which may be q itself: in place); k is rotated and written, and v
//       copied, into the fixed cache (cache_batch, kv_heads, max_seq, head_dim) at position p. k and v
//       themselves are not written. Tokens whose p is outside [0, max_seq) write nothing to the cache
//       (as kv_write of attention/kv_cache.cu); for the tables p is clamped into [0, max_positions)
//       (as rope_apply of rope.cu), so q is always rotated and nothing reads past the tables.
//       The first 2 * half dimensions of every head are rotated, the rest copied unchanged. NeoX
//       style (kGptj = 0) pairs dimension i with i + half, GPT-J style (kGptj = 1) 2i with 2i + 1. The
//       arithmetic is rope_apply's, term for term, so the results equal rope_apply followed by
//       kv_write.
//       A unit of work is one of a head's `pairs = half / W` pair packs (W pairs: a Pack<T, W> from
//       each half (NeoX) or two neighbouring packs (GPT-J)) or one of its (head_dim - 2 half) / W
//       tail packs; heads are q's, then k's, then v's. W is 16 / sizeof(T) when every row start is
//       aligned and half and head_dim - 2 half are multiples of it, else 1.
#include "../common/overlap.cuh"
#include "rope_common.cuh"

namespace pygpukit {
namespace ops {

struct RopeKVShape {
  index_t q_stride[3];   // q: batch, seq, head
  index_t qo_stride[3];  // q_out: batch, seq, head
  index_t k_stride[3];   // k: batch, seq, head
  index_t v_stride[3];   // v: batch, seq, head
  index_t pos_stride;    // positions: batch
  int batch;
  int seq;
  int q_heads;
  int kv_heads;
  int head_dim;
  int half;  // rotary_dim / 2: pairs per head, columns of the tables
  int max_positions;
  int max_seq;  // the cache's positions
  int offset;   // added to every position
  int pad;
};

template <typename T, typename C, int kGptj, int W>
__global__ void rope_kv_append(const T* q, T* q_out, const T* __restrict__ k, const T* __restrict__ v,
                               T* __restrict__ k_cache, T* __restrict__ v_cache,
                               const C* __restrict__ cos_table, const C* __restrict__ sin_table,
                               const int* __restrict__ positions, index_t units, RopeKVShape shape) {
  overlap_wait();  // programmatic launch: q, k, v and the positions come from the kernels before
  const bool small = units <= kSmallSpace;
  const int heads = shape.q_heads + 2 * shape.kv_heads;
  const int pairs = shape.half / W;
  const int per_head = pairs + (shape.head_dim - 2 * shape.half) / W;
  for (index_t u = global_thread(); u < units; u += grid_threads()) {
    int unit, head, token;
    if (small) {  // 32-bit index arithmetic
      unsigned rest = static_cast<unsigned>(u);
      unsigned next = rest / static_cast<unsigned>(per_head);
      unit = static_cast<int>(rest - next * static_cast<unsigned>(per_head));
      rest = next;
      next = rest / static_cast<unsigned>(heads);
      head = static_cast<int>(rest - next * static_cast<unsigned>(heads));
      token = static_cast<int>(next);
    } else {
      index_t rest = u / per_head;
      unit = static_cast<int>(u - rest * per_head);
      const index_t next = rest / heads;
      head = static_cast<int>(rest - next * heads);
      token = static_cast<int>(next);
    }
    const int b = token / shape.seq;
    const int s = token - b * shape.seq;
    const long long position =
        static_cast<long long>(positions[b * shape.pos_stride]) + shape.offset + static_cast<long long>(s);
    const T* src;
    T* dst;
    bool rotate = true;
    if (head < shape.q_heads) {
      src = q + b * shape.q_stride[0] + s * shape.q_stride[1] + head * shape.q_stride[2];
      dst = q_out + b * shape.qo_stride[0] + s * shape.qo_stride[1] + head * shape.qo_stride[2];
    } else {
      if (position < 0 || position >= shape.max_seq) continue;
      const bool is_v = head >= shape.q_heads + shape.kv_heads;
      const int h = head - shape.q_heads - (is_v ? shape.kv_heads : 0);
      const index_t* stride = is_v ? shape.v_stride : shape.k_stride;
      src = (is_v ? v : k) + b * stride[0] + s * stride[1] + h * stride[2];
      dst = (is_v ? v_cache : k_cache) +
            ((static_cast<index_t>(b) * shape.kv_heads + h) * shape.max_seq + position) * shape.head_dim;
      rotate = !is_v;
    }
    if (unit >= pairs) {  // a tail pack past the rotary dimensions: copied
      const index_t at = 2 * static_cast<index_t>(shape.half) + static_cast<index_t>(unit - pairs) * W;
      *reinterpret_cast<Pack<T, W>*>(dst + at) = *reinterpret_cast<const Pack<T, W>*>(src + at);
      continue;
    }
    index_t first, second;
    if (kGptj) {
      first = static_cast<index_t>(unit) * (2 * W);
      second = first + W;
    } else {
      first = static_cast<index_t>(unit) * W;
      second = first + shape.half;
    }
    Pack<T, W> a = *reinterpret_cast<const Pack<T, W>*>(src + first);
    Pack<T, W> z = *reinterpret_cast<const Pack<T, W>*>(src + second);
    if (rotate) {
      long long p = position;
      p = p < 0 ? 0 : (p >= shape.max_positions ? shape.max_positions - 1 : p);
      const index_t entry = p * shape.half + static_cast<index_t>(unit) * W;
      float c[W], sn[W];
      rope_table<C, W>(cos_table + entry, c);
      rope_table<C, W>(sin_table + entry, sn);
      rope_rotate<T, kGptj, W>(a, z, c, sn);
    }
    *reinterpret_cast<Pack<T, W>*>(dst + first) = a;
    *reinterpret_cast<Pack<T, W>*>(dst + second) = z;
  }
}

}  // namespace ops
}  // namespace pygpukit
