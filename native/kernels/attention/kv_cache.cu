// KV cache writes: activations (batch, seq, kv_heads, head_dim) copied into a fixed cache
// (batch, kv_heads, max_seq_len, head_dim) or a paged one (num_blocks, kv_heads, block_size, head_dim),
// k and v in one launch; and the decode step's context-length update of the paged cache.
//
//   kv_write<T, W>(k_cache, v_cache, k, v, positions, units, shape)
//       token (b, s) goes to cache position positions[b * pos_stride] + start + s (positions[...]
//       counting as 0 when positions is null). Positions outside [0, max_seq) are skipped.
//   paged_kv_write<T, W>(k_blocks, v_blocks, k, v, block_table, context_lens, units, shape)
//       row b of the activations belongs to sequence slot (shape.slot + b); token s goes to position
//       context_lens[slot] + start + s (context_lens[...] counting as 0 when null), i.e. to block
//       block_table[slot][position / block_size] at offset position % block_size. Positions that
//       are negative, past the table's row or whose block id is not in [0, num_blocks) (-1 marks an
//       unallocated entry) are skipped.
//   paged_advance<I>(context_lens, block_table, n, batch, block_size, max_blocks, num_blocks)
//       context_lens[b] += n for b < batch where the block holding position context_lens[b] + n - 1
//       is allocated; other slots (free ones, ones without the capacity) are left alone.
//
// The copies move W elements at a time: W = 16 / sizeof(T) when head_dim and every stride are
// multiples of it and the bases are aligned, else 1.
#include "../common/layout.cuh"
#include "../common/overlap.cuh"

namespace pygpukit {
namespace ops {

struct KVWriteShape {
  index_t src_stride[2][3];  // k and v: batch, seq, head (elements)
  index_t pos_stride;        // positions: batch
  int batch;
  int seq;
  int heads;
  int head_dim;
  int max_seq;     // fixed cache: max_seq_len; paged cache: block_size
  int start;       // added to every position
  int slot;        // paged: the slot of row 0
  int max_blocks;  // paged: columns of the block table
  int num_blocks;  // paged
  int pad;
};

// Unit u of a write: (kv, b, s, h, pack) in C order, pack fastest.
struct KVUnit {
  int pack, head, s, b, kv;
};

template <typename I>
__device__ __forceinline__ KVUnit kv_unit_as(I rest, const KVWriteShape& shape, int packs) {
  KVUnit r;
  r.pack = static_cast<int>(take_index(rest, static_cast<I>(packs)));
  r.head = static_cast<int>(take_index(rest, static_cast<I>(shape.heads)));
  r.s = static_cast<int>(take_index(rest, static_cast<I>(shape.seq)));
  r.b = static_cast<int>(take_index(rest, static_cast<I>(shape.batch)));
  r.kv = static_cast<int>(rest);
  return r;
}

// `small`: units <= kSmallSpace, 32-bit index arithmetic (common/strided.cuh).
__device__ __forceinline__ KVUnit kv_unit(index_t u, bool small, const KVWriteShape& shape, int packs) {
  return small ? kv_unit_as<unsigned>(static_cast<unsigned>(u), shape, packs)
               : kv_unit_as<index_t>(u, shape, packs);
}

template <typename T, int W>
__device__ __forceinline__ void kv_move(T* __restrict__ dst, const T* __restrict__ src) {
  *reinterpret_cast<Pack<T, W>*>(dst) = *reinterpret_cast<const Pack<T, W>*>(src);
}

template <typename T, int W>
__global__ void kv_write(T* __restrict__ k_cache, T* __restrict__ v_cache, const T* __restrict__ k,
                         const T* __restrict__ v, const int* __restrict__ positions, index_t units,
                         KVWriteShape shape) {
  overlap_wait();  // programmatic launch (common/overlap.cuh)
  const bool small = units <= kSmallSpace;
  const int packs = shape.head_dim / W;
  for (index_t u = global_thread(); u < units; u += grid_threads()) {
    const KVUnit w = kv_unit(u, small, shape, packs);
    const long long base = positions != nullptr ? positions[w.b * shape.pos_stride] : 0;
    const long long position = base + shape.start + w.s;
    if (position < 0 || position >= shape.max_seq) continue;
    const index_t* stride = shape.src_stride[w.kv];
    const T* src = (w.kv ? v : k) + w.b * stride[0] + w.s * stride[1] + w.head * stride[2] +
                   static_cast<index_t>(w.pack) * W;
    T* dst =
        (w.kv ? v_cache : k_cache) +
        ((static_cast<index_t>(w.b) * shape.heads + w.head) * shape.max_seq + position) * shape.head_dim +
        static_cast<index_t>(w.pack) * W;
    kv_move<T, W>(dst, src);
  }
}

template <typename T, int W>
__global__ void paged_kv_write(T* __restrict__ k_blocks, T* __restrict__ v_blocks, const T* __restrict__ k,
                               const T* __restrict__ v, const int* __restrict__ block_table,
                               const int* __restrict__ context_lens, index_t units, KVWriteShape shape) {
  const bool small = units <= kSmallSpace;
  const int packs = shape.head_dim / W;
  for (index_t u = global_thread(); u < units; u += grid_threads()) {
    const KVUnit w = kv_unit(u, small, shape, packs);
    const int slot = shape.slot + w.b;
    const long long base = context_lens != nullptr ? context_lens[slot] : 0;
    const long long position = base + shape.start + w.s;
    if (position < 0) continue;
    const long long index = position / shape.max_seq;
    if (index >= shape.max_blocks) continue;
    const int block = block_table[static_cast<index_t>(slot) * shape.max_blocks + index];
    if (block < 0 || block >= shape.num_blocks) continue;
    const index_t offset = position - index * shape.max_seq;
    const index_t* stride = shape.src_stride[w.kv];
    const T* src = (w.kv ? v : k) + w.b * stride[0] + w.s * stride[1] + w.head * stride[2] +
                   static_cast<index_t>(w.pack) * W;
    T* dst =
        (w.kv ? v_blocks : k_blocks) +
        ((static_cast<index_t>(block) * shape.heads + w.head) * shape.max_seq + offset) * shape.head_dim +
        static_cast<index_t>(w.pack) * W;
    kv_move<T, W>(dst, src);
  }
}

template <typename I>
__global__ void paged_advance(I* __restrict__ context_lens, const I* __restrict__ block_table, I n, int batch,
                              int block_size, int max_blocks, int num_blocks) {
  const index_t b = global_thread();
  if (b >= batch) return;
  const long long length = context_lens[b];
  const long long last = length + n - 1;
  if (length < 0 || last < 0) return;
  const long long index = last / block_size;
  if (index >= max_blocks) return;
  const I block = block_table[b * max_blocks + index];
  if (block < 0 || block >= num_blocks) return;
  context_lens[b] = static_cast<I>(length + n);
}

}  // namespace ops
}  // namespace pygpukit
