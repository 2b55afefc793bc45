// Inclusive (or exclusive) prefix sums along one axis: cumsum. Deterministic: a fixed order of adds.
//
//   scan_rows<A>(x, x_code, out, out_code, rows, count, chunk, carry, exclusive, layout)
//
// Block (row, c) scans elements [c * chunk, (c + 1) * chunk) of row `row` in tiles of blockDim.x * 4:
// each thread adds its 4 consecutive elements, a fixed shuffle scan joins the threads, and a running
// total carries from tile to tile. Long rows are split into chunks along grid.y by the host, which
// first sums every chunk (reduce_rows<SumR<A>>), scans those sums exclusively with this kernel, and
// passes them as `carry`. A is the accumulator (float for fp16/bf16/fp8/float32, double, long long,
// unsigned long long); input and output dtypes are run-time codes.
#include "../common/layout.cuh"
#include "reducers.cuh"

namespace pygpukit {
namespace ops {

struct ScanLayout {
  int outer_ndim;
  index_t outer_shape[kMaxDims];
  index_t in_outer_strides[kMaxDims];
  index_t out_outer_strides[kMaxDims];
  index_t in_stride;  // along the scanned axis
  index_t out_stride;
};

template <typename A>
__global__ void scan_rows(const void* __restrict__ x, int x_code, void* __restrict__ out, int out_code,
                          index_t rows, index_t count, index_t chunk, const A* __restrict__ carry,
                          int exclusive, ScanLayout layout) {
  constexpr int kItems = 4;
  __shared__ A warp_totals[32];
  const index_t row = blockIdx.x;
  if (row >= rows) return;
  const index_t in_base = strided_offset(row, layout.outer_ndim, layout.outer_shape, layout.in_outer_strides);
  const index_t out_base =
      strided_offset(row, layout.outer_ndim, layout.outer_shape, layout.out_outer_strides);
  const index_t begin = static_cast<index_t>(blockIdx.y) * chunk;
  const index_t end = begin + chunk < count ? begin + chunk : count;
  A running = carry != nullptr ? carry[row * gridDim.y + blockIdx.y] : A(0);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  for (index_t tile = begin; tile < end; tile += static_cast<index_t>(blockDim.x) * kItems) {
    const index_t first = tile + static_cast<index_t>(threadIdx.x) * kItems;
    A values[kItems];
    A inclusive[kItems];
    A total = A(0);
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const index_t k = first + j;
      values[j] = k < end ? load_as<A>(x, x_code, in_base + k * layout.in_stride) : A(0);
      total = Add<A>()(total, values[j]);
      inclusive[j] = total;
    }
    // Inclusive scan of the thread totals within the warp, then across warps.
    A scanned = total;
    for (int offset = 1; offset < 32; offset <<= 1) {
      const A other = __shfl_up_sync(0xffffffffu, scanned, offset);
      if (lane >= offset) scanned = Add<A>()(other, scanned);
    }
    A before_thread = __shfl_up_sync(0xffffffffu, scanned, 1);
    if (lane == 0) before_thread = A(0);
    if (lane == 31) warp_totals[warp] = scanned;
    __syncthreads();
    A warp_prefix = A(0);
    A block_total = A(0);
    for (int w = 0; w < warps; ++w) {
      if (w == warp) warp_prefix = block_total;
      block_total = Add<A>()(block_total, warp_totals[w]);
    }
    __syncthreads();
    const A prefix = Add<A>()(running, Add<A>()(warp_prefix, before_thread));
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const index_t k = first + j;
      if (k < end) {
        const A before = j == 0 ? A(0) : inclusive[j - 1];
        const A value = exclusive ? Add<A>()(prefix, before) : Add<A>()(prefix, inclusive[j]);
        store_as(out, out_code, out_base + k * layout.out_stride, value);
      }
    }
    running = Add<A>()(running, block_total);
  }
}

}  // namespace ops
}  // namespace pygpukit
