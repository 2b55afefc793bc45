// Copies that move elements without converting them, by element size (1, 2, 4 or 8 bytes, any dtype):
//
//   transpose_tiles<E>(out, x, batch, rows, cols, in_strides, ...)  out[b][c][r] = x[b][r][c] through
//       32x32 shared-memory tiles, so reads and writes are both coalesced (permute/transpose when the
//       last axis moves)
//   gather<E>(out, x, n, layout)      out (contiguous) = x read with any strides (the other permutes)
//   concat<E>(out, in0, ..., in15, args)  up to kConcatInputs contiguous inputs of one dtype into their
//       column ranges of the contiguous output (concatenate and stack), in one launch
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

// concatenate/stack: the output is viewed as (rows, row_bytes) and input j as (rows, starts[j + 1] -
// starts[j]) bytes, the column range of the output row that it fills. pygpukit/ops/shape.py declares it
// as a KernelStruct (the compile check asserts the layout).
constexpr int kConcatInputs = 16;

struct ConcatArgs {
  // Bytes: where each input's columns begin in an output row (prefix sums; unused entries repeat the last).
  index_t starts[kConcatInputs + 1];
  index_t rows;
  index_t row_bytes;   // the output row, starts[inputs]
  index_t align_bits;  // OR of every start and row_bytes: its lowest set bit bounds the copy unit
};

// Input `part` (rows x `width` units U, contiguous) into columns [begin, begin + width) of `dst` (rows x
// `stride` units); grid-stride over the input's units, blockIdx.y picks the input.
template <typename U>
__device__ __forceinline__ void concat_part(void* dst, const void* part, index_t rows, index_t stride,
                                            index_t begin, index_t width) {
  U* out = static_cast<U*>(dst) + begin;
  const U* in = static_cast<const U*>(part);
  const index_t n = rows * width;
  if (rows == 1) {
    for (index_t i = global_thread(); i < n; i += grid_threads()) out[i] = in[i];
    return;
  }
  if (n <= kSmallSpace) {  // 32-bit division; the output offset stays 64-bit (the output may be larger)
    const unsigned w = static_cast<unsigned>(width);
    const unsigned step = static_cast<unsigned>(grid_threads());
    for (unsigned i = static_cast<unsigned>(global_thread()); i < static_cast<unsigned>(n); i += step) {
      const unsigned row = i / w;
      out[static_cast<index_t>(row) * stride + (i - row * w)] = in[i];
    }
    return;
  }
  for (index_t i = global_thread(); i < n; i += grid_threads()) {
    const index_t row = i / width;
    out[row * stride + (i - row * width)] = in[i];
  }
}

__device__ __forceinline__ const void* concat_input(int j, const void* in0, const void* in1, const void* in2,
                                                    const void* in3, const void* in4, const void* in5,
                                                    const void* in6, const void* in7, const void* in8,
                                                    const void* in9, const void* in10, const void* in11,
                                                    const void* in12, const void* in13, const void* in14,
                                                    const void* in15) {
  switch (j) {
    case 0:
      return in0;
    case 1:
      return in1;
    case 2:
      return in2;
    case 3:
      return in3;
    case 4:
      return in4;
    case 5:
      return in5;
    case 6:
      return in6;
    case 7:
      return in7;
    case 8:
      return in8;
    case 9:
      return in9;
    case 10:
      return in10;
    case 11:
      return in11;
    case 12:
      return in12;
    case 13:
      return in13;
    case 14:
      return in14;
    default:
      return in15;
  }
}

// Elements of E move in the widest unit (16, 8 or 4 bytes, or E itself) that the output row, every
// column range and both pointers are aligned to.
template <typename E>
__global__ void concat(void* __restrict__ out, const void* in0, const void* in1, const void* in2,
                       const void* in3, const void* in4, const void* in5, const void* in6, const void* in7,
                       const void* in8, const void* in9, const void* in10, const void* in11, const void* in12,
                       const void* in13, const void* in14, const void* in15, ConcatArgs args) {
  const int j = blockIdx.y;
  const void* part =
      concat_input(j, in0, in1, in2, in3, in4, in5, in6, in7, in8, in9, in10, in11, in12, in13, in14, in15);
  const index_t begin = args.starts[j];
  const index_t bytes = args.starts[j + 1] - begin;
  if (bytes == 0) return;
  const unsigned long long bits = static_cast<unsigned long long>(args.align_bits) |
                                  reinterpret_cast<unsigned long long>(part) |
                                  reinterpret_cast<unsigned long long>(out) | 16ULL;
  const unsigned long long unit = bits & (~bits + 1ULL);  // the lowest set bit: at most 16
  if (unit == 16) {
    concat_part<uint4>(out, part, args.rows, args.row_bytes / 16, begin / 16, bytes / 16);
  } else if (sizeof(E) < 8 && unit == 8) {
    concat_part<uint2>(out, part, args.rows, args.row_bytes / 8, begin / 8, bytes / 8);
  } else if (sizeof(E) < 4 && unit == 4) {
    concat_part<unsigned int>(out, part, args.rows, args.row_bytes / 4, begin / 4, bytes / 4);
  } else {
    constexpr index_t kSize = sizeof(E);
    concat_part<E>(out, part, args.rows, args.row_bytes / kSize, begin / kSize, bytes / kSize);
  }
}

}  // namespace ops
}  // namespace pygpukit
