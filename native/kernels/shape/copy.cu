// Copies that move elements without converting them, by element size (1, 2, 4 or 8 bytes, any dtype):
//
//   transpose_tiles<E>(out, x, batch, rows, cols, in_strides, ...)  out[b][c][r] = x[b][r][c] through
//       32x32 shared-memory tiles, so reads and writes are both coalesced (permute/transpose when the
//       last axis moves)
//   gather<E>(out, x, n, layout)      out (contiguous) = x read with any strides (the other permutes)
#include "../common/layout.cuh"

namespace pygpukit {
namespace ops {

constexpr int kTile = 32;
constexpr int kTileRows = 8;

// pygpukit/ops/shape.py declares it as a KernelStruct (the compile check asserts the layout).
struct TileLayout {
  index_t batch_shape[kMaxDims];  // batch dimensions, C order
  index_t batch_strides[kMaxDims];
  int batch_ndim;
  index_t rows;  // the input's second-to-last axis, which becomes the output's last
  index_t cols;
  index_t row_stride;  // input strides of those two axes
  index_t col_stride;
};

template <typename E>
__global__ void transpose_tiles(E* __restrict__ out, const E* __restrict__ x, TileLayout layout) {
  __shared__ E tile[kTile][kTile + 1];
  const index_t batch = blockIdx.z;
  const index_t in_base = strided_offset(batch, layout.batch_ndim, layout.batch_shape, layout.batch_strides);
  const index_t out_base = batch * layout.rows * layout.cols;
  const index_t row0 = static_cast<index_t>(blockIdx.y) * kTile;
  const index_t col0 = static_cast<index_t>(blockIdx.x) * kTile;
  for (int i = threadIdx.y; i < kTile; i += kTileRows) {
    const index_t r = row0 + i;
    const index_t c = col0 + threadIdx.x;
    if (r < layout.rows && c < layout.cols)
      tile[i][threadIdx.x] = x[in_base + r * layout.row_stride + c * layout.col_stride];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < kTile; i += kTileRows) {
    const index_t c = col0 + i;
    const index_t r = row0 + threadIdx.x;
    if (r < layout.rows && c < layout.cols) out[out_base + c * layout.rows + r] = tile[threadIdx.x][i];
  }
}

template <typename E>
__global__ void gather(E* __restrict__ out, const E* __restrict__ x, index_t n, Layout layout) {
  const bool small = n <= kSmallSpace;
  for (index_t i = global_thread(); i < n; i += grid_threads()) {
    index_t offsets[2];
    layout_offsets<2>(layout, i, small, offsets);
    out[offsets[0]] = x[offsets[1]];
  }
}

}  // namespace ops
}  // namespace pygpukit
