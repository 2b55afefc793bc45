// Reductions over any set of axes, deterministic (no atomics: every fold follows an order fixed by
// the shape). The host arranges the input as `rows` independent reductions of `count` elements each:
// row m starts at the offset of m in the kept ("outer") dimensions, element k of a row sits at the
// offset of k in the reduced ("inner") dimensions, both C-ordered. The reducer's `mode` picks its
// variant (sum or mean, max or min, ...; reducers.cuh).
//
//   reduce_rows<R, T>   the reduced dimensions hold the fastest-varying input axis: a group of
//                       `lanes` threads (4 to 256) folds one row, each thread a fixed strided subset
//                       (16-byte packs when the row is contiguous), then a fixed tree joins them
//   reduce_cols<R, T>   a kept dimension is the fastest-varying one: 32 rows per block, one per
//                       thread column, 8 threads down each row, then a fixed tree
//   reduce_cols_packed<R, T>
//                       the same order over rows stored side by side (one kept dimension of stride
//                       1, and a reduced stride that keeps 16-byte alignment): each thread folds the
//                       rows of one 16-byte pack, so a warp reads 512 contiguous bytes per step
//
// Rows too long for one block are split along grid.y: into `chunk`-element pieces, or with chunk 0
// into gridDim.y interleaved shares that the blocks sweep together; the first pass then
// stores each piece's accumulator in `partial` (row-major, gridDim.y per row) and a second
// reduce_rows<R, Partial> over those finishes, with 256 lanes (kFinishLanes). reduce_rows (one row
// per block when split) can finish by itself instead: given `counters` (one per blockIdx.x, zero
// before the launch), the last block of a row to finish folds that row's partials in the same order
// as that second pass, so either way gives the same bits, and resets its counter. Two launches
// sharing counters must not run concurrently (the host keeps them per stream). T is the
// input element type, or Dynamic for a run-time dtype code (integer and bool inputs, and reductions
// that are rarely hot). The result is stored converted to the run-time dtype `out_code`.
#include "../common/completion.cuh"
#include "../common/layout.cuh"
#include "reducers.cuh"

namespace pygpukit {
namespace ops {

struct Dynamic {};  // T: the input dtype is the run-time code x_code
struct Partial {};  // T: the input is the previous pass's accumulators

constexpr int kCodeAccumulator = codes::kReduceOutAccumulator;  // out_code: store the accumulator itself

struct ReduceLayout {
  int outer_ndim;
  int inner_ndim;
  index_t outer_shape[kMaxDims];
  index_t outer_strides[kMaxDims];
  index_t inner_shape[kMaxDims];
  index_t inner_strides[kMaxDims];
};

__device__ __forceinline__ index_t inner_offset(const ReduceLayout& layout, index_t k) {
  return layout.inner_ndim == 1
             ? k * layout.inner_strides[0]
             : strided_offset(k, layout.inner_ndim, layout.inner_shape, layout.inner_strides);
}

// Fold element `offset` of the input (or, for Partial, a previous pass's accumulator) into `acc`.
template <typename R, typename T>
__device__ __forceinline__ typename R::acc fold_element(const R& r, typename R::acc acc, const void* x,
                                                        int x_code, index_t offset, index_t k) {
  using Value = typename R::value;
  if constexpr (SameType<T, Partial>::value) {
    return r.combine(acc, static_cast<const typename R::acc*>(x)[offset]);
  } else if constexpr (SameType<T, Dynamic>::value) {
    return fold(r, acc, load_as<Value>(x, x_code, offset), k);
  } else {
    return fold(r, acc, convert<Value>(static_cast<const T*>(x)[offset]), k);
  }
}

template <typename R>
__device__ __forceinline__ void store_result(const R& r, void* out, int out_code, index_t index,
                                             typename R::acc acc, index_t total, index_t ddof) {
  if constexpr (R::kScalarResult) {
    if (out_code != kCodeAccumulator) {
      store_as(out, out_code, index, r.finish(acc, total, ddof));
      return;
    }
  }
  static_cast<typename R::acc*>(out)[index] = acc;
}

constexpr int kFinishLanes = 256;  // lanes that fold the partials of one row (host: _BLOCK)

// Split rows, after this block stored its partial: the last block of row `row` to finish folds the
// row's gridDim.y partials (lane i: partials i, i + 256, ...; then group_reduce) and stores the
// result. Called by all kFinishLanes threads of the block.
template <typename R>
__device__ __forceinline__ void finish_row(const R& r, const typename R::acc* partial, unsigned* counters,
                                           void* out, int out_code, index_t row, index_t total, index_t ddof,
                                           typename R::acc* scratch) {
  using Acc = typename R::acc;
  __shared__ bool last;
  __syncthreads();  // the block's partial, then one acq_rel count (completion.cuh)
  if (threadIdx.x == 0) last = arrive(&counters[blockIdx.x]) == gridDim.y - 1;
  __syncthreads();
  if (!last) return;
  Acc acc = r.identity();
  const Acc* parts = partial + row * gridDim.y;
  for (unsigned k = threadIdx.x; k < gridDim.y; k += 4 * kFinishLanes) {  // 4 loads in flight, in order
    Acc v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (k + u * kFinishLanes < gridDim.y) v[u] = parts[k + u * kFinishLanes];
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (k + u * kFinishLanes < gridDim.y) acc = r.combine(acc, v[u]);
    }
  }
  acc = group_reduce<R>(r, acc, kFinishLanes, scratch);
  if (threadIdx.x == 0) {
    store_result<R>(r, out, out_code, row, acc, total, ddof);
    counters[blockIdx.x] = 0u;  // ready for the next launch
  }
}

template <typename R, typename T>
__global__ void reduce_rows(const void* __restrict__ x, int x_code, void* __restrict__ out, int out_code,
                            index_t rows, index_t count, index_t chunk, int lanes, index_t total,
                            index_t ddof, int mode, ReduceLayout layout, void* __restrict__ partial,
                            unsigned* counters) {
  using Acc = typename R::acc;
  using Value = typename R::value;
  __shared__ Acc scratch[8];
  const R r{mode};
  const int group = threadIdx.x / lanes;
  const int lane = threadIdx.x % lanes;
  const index_t row = static_cast<index_t>(blockIdx.x) * (blockDim.x / lanes) + group;
  // A split row with chunk 0 (the reductions): its gridDim.y blocks sweep it together, pack by pack
  // (block b, lane l folds packs (k * gridDim.y + b) * lanes + l, as a grid-stride loop), so that they
  // read neighbouring memory at any moment (0.2-1.1 % faster than a contiguous chunk per block on the
  // H100: benchmarks/tools/reduce_gaps.py; as deterministic). A chunk > 0 (cumsum's chunk totals):
  // block y folds elements [y * chunk, (y + 1) * chunk).
  const bool sweep = chunk == 0 && gridDim.y > 1;
  const index_t blocks = sweep ? gridDim.y : 1;
  const index_t first = sweep ? static_cast<index_t>(blockIdx.y) * lanes : 0;
  const index_t begin = sweep ? 0 : static_cast<index_t>(blockIdx.y) * chunk;
  const index_t end = sweep ? count : (begin + chunk < count ? begin + chunk : count);
  Acc acc = r.identity();
  if (row < rows) {
    const index_t base = strided_offset(row, layout.outer_ndim, layout.outer_shape, layout.outer_strides);
    bool folded = false;
    if constexpr (!SameType<T, Partial>::value && !SameType<T, Dynamic>::value) {
      constexpr int V = pack_width<T, T>();
      const T* row_start = static_cast<const T*>(x) + base;
      if (V > 1 && layout.inner_ndim == 1 && layout.inner_strides[0] == 1) {
        // Lane i folds packs i, i + lanes, ... of V consecutive elements, in order; whole aligned
        // packs are one 16-byte load, the rest element loads: the same order either way.
        const bool aligned = aligned_to(row_start, V * sizeof(T));
        const index_t step = static_cast<index_t>(lanes) * V * blocks;
        index_t start = begin + (first + static_cast<index_t>(lane)) * V;
        if (aligned) {
          // kBatch packs at a time: their loads are in flight together, then they fold in order. A pack
          // of 16-bit or 8-bit elements is twice or four times the work of a float pack, so those keep
          // twice the loads in flight where the reducer batches four (measured: bf16 sums 4 % faster).
          constexpr int kBatch = R::kBatch >= 4 && sizeof(T) <= 2 ? 2 * R::kBatch : R::kBatch;
          for (; start + (kBatch - 1) * step + V <= end; start += kBatch * step) {
            Pack<T, V> packs[kBatch];
#pragma unroll
            for (int u = 0; u < kBatch; ++u) {
              packs[u] = *reinterpret_cast<const Pack<T, V>*>(row_start + start + u * step);
            }
#pragma unroll
            for (int u = 0; u < kBatch; ++u) {
#pragma unroll
              for (int j = 0; j < V; ++j)
                acc = fold(r, acc, convert<Value>(packs[u].v[j]), start + u * step + j);
            }
          }
          for (; start + V <= end; start += step) {
            const Pack<T, V> pack = *reinterpret_cast<const Pack<T, V>*>(row_start + start);
#pragma unroll
            for (int j = 0; j < V; ++j) acc = fold(r, acc, convert<Value>(pack.v[j]), start + j);
          }
        }
        for (; start < end; start += step) {
          for (int j = 0; j < V && start + j < end; ++j) {
            acc = fold(r, acc, convert<Value>(row_start[start + j]), start + j);
          }
        }
        folded = true;
      }
    }
    if (!folded) {
      for (index_t k = begin + first + lane; k < end; k += static_cast<index_t>(lanes) * blocks) {
        acc = fold_element<R, T>(r, acc, x, x_code, base + inner_offset(layout, k), k);
      }
    }
  }
  acc = group_reduce<R>(r, acc, lanes, scratch);
  if (lane == 0 && row < rows) {
    if (gridDim.y == 1) {
      store_result<R>(r, out, out_code, row, acc, total, ddof);
    } else {
      static_cast<Acc*>(partial)[row * gridDim.y + blockIdx.y] = acc;
    }
  }
  if (gridDim.y > 1 && counters != nullptr) {  // split rows are one per block: row < rows
    finish_row<R>(r, static_cast<const Acc*>(partial), counters, out, out_code, row, total, ddof, scratch);
  }
}

template <typename R, typename T>
__global__ void reduce_cols(const void* __restrict__ x, int x_code, void* __restrict__ out, int out_code,
                            index_t rows, index_t count, index_t chunk, index_t total, index_t ddof, int mode,
                            ReduceLayout layout) {
  using Acc = typename R::acc;
  constexpr int kDown = 8;
  __shared__ Acc partials[kDown][32];
  const R r{mode};
  const index_t row = static_cast<index_t>(blockIdx.x) * 32 + threadIdx.x;
  const index_t begin = static_cast<index_t>(blockIdx.y) * chunk;
  const index_t end = begin + chunk < count ? begin + chunk : count;
  Acc acc = r.identity();
  if (row < rows) {
    const index_t base = strided_offset(row, layout.outer_ndim, layout.outer_shape, layout.outer_strides);
    if (layout.inner_ndim == 1) {
      const index_t stride = layout.inner_strides[0];
      index_t k = begin + threadIdx.y;
      if constexpr (!SameType<T, Dynamic>::value && !SameType<T, Partial>::value) {
        using Value = typename R::value;
        const T* column = static_cast<const T*>(x) + base;
        for (; k + 3 * kDown < end; k += 4 * kDown) {  // four loads in flight, folded in order
          T values[4];
#pragma unroll
          for (int u = 0; u < 4; ++u) values[u] = column[(k + u * kDown) * stride];
#pragma unroll
          for (int u = 0; u < 4; ++u) acc = fold(r, acc, convert<Value>(values[u]), k + u * kDown);
        }
      }
      for (; k < end; k += kDown) acc = fold_element<R, T>(r, acc, x, x_code, base + k * stride, k);
    } else {
      for (index_t k = begin + threadIdx.y; k < end; k += kDown) {
        acc = fold_element<R, T>(r, acc, x, x_code, base + inner_offset(layout, k), k);
      }
    }
  }
  partials[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && row < rows) {
    // Thread y folded positions y, y + 8, ...: join the 8 partials in a fixed binary tree.
    Acc level[kDown];
#pragma unroll
    for (int y = 0; y < kDown; ++y) level[y] = partials[y][threadIdx.x];
#pragma unroll
    for (int width = kDown / 2; width >= 1; width /= 2) {
#pragma unroll
      for (int y = 0; y < width; ++y) level[y] = r.combine(level[y], level[y + width]);
    }
    acc = level[0];
    if (gridDim.y == 1) {
      store_result<R>(r, out, out_code, row, acc, total, ddof);
    } else {
      static_cast<Acc*>(out)[row * gridDim.y + blockIdx.y] = acc;
    }
  }
}

template <typename R, typename T>
__global__ void reduce_cols_packed(const T* __restrict__ x, void* __restrict__ out, int out_code,
                                   index_t rows, index_t count, index_t chunk, index_t total, index_t ddof,
                                   int mode, index_t stride) {
  using Acc = typename R::acc;
  using Value = typename R::value;
  constexpr int V = pack_width<T, T>();
  constexpr int kDown = 8;
  __shared__ Acc partials[kDown][32 * V];
  const R r{mode};
  const index_t first = (static_cast<index_t>(blockIdx.x) * 32 + threadIdx.x) * V;
  const index_t begin = static_cast<index_t>(blockIdx.y) * chunk;
  const index_t end = begin + chunk < count ? begin + chunk : count;
  Acc acc[V];
#pragma unroll
  for (int j = 0; j < V; ++j) acc[j] = r.identity();
  if (first < rows) {  // rows is a multiple of V
    const T* column = x + first;
    index_t k = begin + threadIdx.y;
    for (; k + 3 * kDown < end; k += 4 * kDown) {  // four loads in flight, folded in order
      Pack<T, V> packs[4];
#pragma unroll
      for (int u = 0; u < 4; ++u)
        packs[u] = *reinterpret_cast<const Pack<T, V>*>(column + (k + u * kDown) * stride);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] = fold(r, acc[j], convert<Value>(packs[u].v[j]), k + u * kDown);
      }
    }
    for (; k < end; k += kDown) {
      const Pack<T, V> pack = *reinterpret_cast<const Pack<T, V>*>(column + k * stride);
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] = fold(r, acc[j], convert<Value>(pack.v[j]), k);
    }
  }
#pragma unroll
  for (int j = 0; j < V; ++j) partials[threadIdx.y][threadIdx.x * V + j] = acc[j];
  __syncthreads();
  // Thread (x, y) joins the 8 partials of row x * V + y, x * V + y + 8, ... of the block in the same
  // fixed tree as reduce_cols.
  for (int slot = threadIdx.y; slot < V; slot += kDown) {
    const int column = threadIdx.x * V + slot;
    const index_t row = static_cast<index_t>(blockIdx.x) * 32 * V + column;
    if (row >= rows) continue;
    Acc level[kDown];
#pragma unroll
    for (int y = 0; y < kDown; ++y) level[y] = partials[y][column];
#pragma unroll
    for (int width = kDown / 2; width >= 1; width /= 2) {
#pragma unroll
      for (int y = 0; y < width; ++y) level[y] = r.combine(level[y], level[y + width]);
    }
    if (gridDim.y == 1) {
      store_result<R>(r, out, out_code, row, level[0], total, ddof);
    } else {
      static_cast<Acc*>(out)[row * gridDim.y + blockIdx.y] = level[0];
    }
  }
}

}  // namespace ops
}  // namespace pygpukit
