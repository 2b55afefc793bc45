// Row gathers and position ids (pygpukit/ops/embeddings.py):
//
//   gather_rows<E, I>(args)
//       out row r = src row (r * src_outer + index * src_row) where index = ids[r] + shift (ids of
//       type I read through a strided Layout), or `fixed` when there are no ids. embedding: src is the
//       (vocab, hidden) table, src_outer = 0; gather_last: src is (batch, seq, hidden), src_outer the
//       batch stride, ids the lengths with shift -1. An index outside [0, limit) is never read: its
//       output row is zero-filled and, when `error` is given, *error is set to 1 (every writer stores
//       the same value, so the flag is deterministic without atomics). E is an unsigned type of the
//       element size: the copy moves bits. A group of `lanes` threads copies a row, in 16-byte chunks
//       when `vector` (row bytes a multiple of 16, every row start 16-byte aligned), else by element.
//       The ids are read with their own strides: ids_ndim merged dimensions of ids_shape, stepping
//       ids_strides elements (pygpukit/ops/embeddings.py declares GatherArgs as a KernelStruct).
//
//   position_ids<I>(out, start, start_value, start_stride, batch, seq, out_b, out_s)
//       out[b, s] = (start ? start[b * start_stride] : start_value) + s, int32.
#include "../common/layout.cuh"
#include "../common/overlap.cuh"

namespace pygpukit {
namespace ops {

struct GatherArgs {
  const void* src;
  const void* ids;  // null: every row takes `fixed`
  void* out;
  int* error;  // null: no flag
  index_t rows;
  index_t hidden;     // elements per row
  index_t src_outer;  // element stride of src per output row
  index_t src_row;    // element stride of src per index
  index_t out_row;    // element stride of out per output row
  index_t limit;      // valid indices: [0, limit)
  index_t fixed;
  index_t shift;
  int lanes;
  int vector;
  int ids_ndim;  // 0 to kMaxDims
  index_t ids_shape[kMaxDims];
  index_t ids_strides[kMaxDims];  // elements
};

template <typename E, typename I>
__global__ void gather_rows(GatherArgs a) {
  overlap_wait();  // programmatic launch: the ids come from the kernels before
  const int lanes = a.lanes;
  const int lane = static_cast<int>(threadIdx.x) % lanes;
  const index_t groups = (static_cast<index_t>(gridDim.x) * blockDim.x) / lanes;
  const bool small = a.rows <= kSmallSpace;
  const I* ids = static_cast<const I*>(a.ids);
  for (index_t r = global_thread() / lanes; r < a.rows; r += groups) {
    index_t index = a.fixed;
    if (ids != nullptr) {
      index_t offsets[1];
      strided_offsets<1>(
          r, a.ids_ndim, a.ids_shape, [&](int, int d) { return a.ids_strides[d]; }, small, offsets);
      // Range-checked before the shift is added, so that no id (any int64) can overflow: an id
      // outside [-shift, limit - shift) becomes -1, outside like every other bad value.
      const index_t raw = static_cast<index_t>(ids[offsets[0]]);
      index = raw >= -a.shift && raw < a.limit - a.shift ? raw + a.shift : -1;
    }
    const bool inside = index >= 0 && index < a.limit;
    if (!inside && a.error != nullptr && lane == 0) *a.error = 1;
    const E* src = static_cast<const E*>(a.src) + (inside ? r * a.src_outer + index * a.src_row : 0);
    E* out = static_cast<E*>(a.out) + r * a.out_row;
    if (a.vector) {
      const index_t chunks = a.hidden * static_cast<index_t>(sizeof(E)) / 16;
      const uint4* from = reinterpret_cast<const uint4*>(src);
      uint4* to = reinterpret_cast<uint4*>(out);
      for (index_t c = lane; c < chunks; c += lanes) to[c] = inside ? from[c] : make_uint4(0u, 0u, 0u, 0u);
    } else {
      for (index_t c = lane; c < a.hidden; c += lanes) out[c] = inside ? src[c] : E(0);
    }
  }
}

template <typename I>
__global__ void position_ids(int* out, const I* start, int start_value, index_t start_stride, index_t batch,
                             index_t seq, index_t out_b, index_t out_s) {
  const index_t n = batch * seq;
  for (index_t i = global_thread(); i < n; i += grid_threads()) {
    const index_t b = i / seq;
    const index_t s = i - b * seq;
    const int first = start != nullptr ? static_cast<int>(start[b * start_stride]) : start_value;
    out[b * out_b + s * out_s] = first + static_cast<int>(s);
  }
}

}  // namespace ops
}  // namespace pygpukit
