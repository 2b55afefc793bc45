// Rotary position embeddings (RoPE), applied in place to q and k in one launch, computed in float.
//
//   rope_apply<T, C, kGptj, W>(q, k, cos, sin, positions, units, shape)
//       q: (batch, seq, q_heads, head_dim) and k: (batch, seq, k_heads, head_dim) of T, the last
//       dimension contiguous, the other strides arbitrary (shape.q_stride / k_stride, in elements);
//       k may be null when k_heads is 0. cos/sin: (max_positions, half) tables of C, contiguous.
//       positions: int32, element (b, s) at b * pos_stride[0] + s * pos_stride[1], plus shape.offset.
//       The first 2 * half dimensions of every head are rotated, the rest are left alone.
//       NeoX style (kGptj = 0) pairs dimension i with i + half; GPT-J style (kGptj = 1) pairs 2i
//       with 2i + 1; both use frequency i of the table.
//       A unit of work is W pairs of one head of one token: one Pack<T, W> from each half (NeoX) or two
//       neighbouring packs (GPT-J), and W table entries. W is 16 / sizeof(T) when every row start is
//       aligned and half % W == 0, else 1.
//       Positions outside [0, max_positions) are clamped into it: the kernel never reads past the
//       tables (the host checks positions only on the CPU backend).
#include "rope_common.cuh"

namespace pygpukit {
namespace ops {

struct RopeShape {
  index_t q_stride[3];    // batch, seq, head
  index_t k_stride[3];    // batch, seq, head
  index_t pos_stride[2];  // batch (0 for positions of shape (seq,)), seq
  int batch;
  int seq;
  int q_heads;
  int k_heads;
  int half;  // rotary_dim / 2: pairs per head, columns of the tables
  int max_positions;
  int offset;  // added to every position
  int pad;
};

template <typename T, typename C, int kGptj, int W>
__global__ void rope_apply(T* __restrict__ q, T* __restrict__ k, const C* __restrict__ cos_table,
                           const C* __restrict__ sin_table, const int* __restrict__ positions, index_t units,
                           RopeShape shape) {
  const bool small = units <= kSmallSpace;
  const int heads = shape.q_heads + shape.k_heads;
  const int packs = shape.half / W;  // units per head
  for (index_t u = global_thread(); u < units; u += grid_threads()) {
    int pack, head, token;
    if (small) {  // 32-bit index arithmetic
      unsigned rest = static_cast<unsigned>(u);
      unsigned next = rest / static_cast<unsigned>(packs);
      pack = static_cast<int>(rest - next * static_cast<unsigned>(packs));
      rest = next;
      next = rest / static_cast<unsigned>(heads);
      head = static_cast<int>(rest - next * static_cast<unsigned>(heads));
      token = static_cast<int>(next);
    } else {
      index_t rest = u / packs;
      pack = static_cast<int>(u - rest * packs);
      const index_t next = rest / heads;
      head = static_cast<int>(rest - next * heads);
      token = static_cast<int>(next);
    }
    const int b = token / shape.seq;
    const int s = token - b * shape.seq;
    long long p =
        static_cast<long long>(positions[b * shape.pos_stride[0] + s * shape.pos_stride[1]]) + shape.offset;
    p = p < 0 ? 0 : (p >= shape.max_positions ? shape.max_positions - 1 : p);
    T* row;
    if (head < shape.q_heads) {
      row = q + b * shape.q_stride[0] + s * shape.q_stride[1] + head * shape.q_stride[2];
    } else {
      row = k + b * shape.k_stride[0] + s * shape.k_stride[1] + (head - shape.q_heads) * shape.k_stride[2];
    }
    const index_t entry = p * shape.half + static_cast<index_t>(pack) * W;
    float c[W], sn[W];
    rope_table<C, W>(cos_table + entry, c);
    rope_table<C, W>(sin_table + entry, sn);
    T* first;
    T* second;
    if (kGptj) {
      first = row + static_cast<index_t>(pack) * (2 * W);
      second = first + W;
    } else {
      first = row + static_cast<index_t>(pack) * W;
      second = first + shape.half;
    }
    Pack<T, W> a = *reinterpret_cast<const Pack<T, W>*>(first);
    Pack<T, W> z = *reinterpret_cast<const Pack<T, W>*>(second);
    rope_rotate<T, kGptj, W>(a, z, c, sn);
    *reinterpret_cast<Pack<T, W>*>(first) = a;
    *reinterpret_cast<Pack<T, W>*>(second) = z;
  }
}

}  // namespace ops
}  // namespace pygpukit
