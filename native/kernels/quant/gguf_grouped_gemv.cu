// Grouped GEMV over MoE experts stored in a GGUF block format (pygpukit/ops/quant/experts.py):
//
//   gguf_grouped_gemv<Type, T>(x, w, y, offsets, experts, rows, n, k, ldx, ldy)
//       y[r, f] = sum_k x[r, k] * W_e[f, k] for every permuted token row r < rows and feature f < n, in T
//       with float32 accumulation, where e is the expert whose rows [offsets[e], offsets[e + 1]) hold r
//       (moe_permute's expert offsets, read on the device) and W_e is expert e's (n, k) weight: rows
//       e * n .. e * n + n - 1 of the stacked weight, each k / QK blocks of ggml type `Type`. Rows at or
//       past offsets[experts] are left alone.
//
// blockIdx.y is the row r, one warp per feature f, eight features per block of 256 threads. A warp walks
// its weight row 256 elements (8 blocks of the 32-element formats, one k-quant block) a step: it copies
// the step's blocks into its own shared-memory buffer (blocks need not be aligned; the buffer leaves
// room for the format readers' reads past a block), then lane l decodes elements 8 l .. 8 l + 7 of the
// step as s * q + o (gguf_formats.cuh) and accumulates s * sum(q x) + o * sum(x). Lane sums are reduced
// with warp shuffles in a fixed order. Meant for decode (a few rows): each row reads its expert's
// weights once; the experts no row chose are not read at all.
#include "gguf_formats.cuh"

namespace pygpukit {
namespace ops {
namespace qgemv {

constexpr int kGroupedThreads = 256;
constexpr int kGroupedWarps = kGroupedThreads / 32;
constexpr int kStepElems = 256;  // 8 elements per lane

template <int Type, typename T>
__global__ void __launch_bounds__(kGroupedThreads)
    gguf_grouped_gemv(const T* __restrict__ x, const unsigned char* __restrict__ w, T* __restrict__ y,
                      const int* __restrict__ offsets, int experts, int rows, int n, int k, long long ldx,
                      long long ldy) {
  using F = Format<Type>;
  constexpr int kStepBlocks = kStepElems / F::kElems;
  constexpr int kStepBytes = kStepBlocks * F::kBytes;
  constexpr int kBufBytes = (kStepBytes + 16 + 15) / 16 * 16;  // room for reads past the last block
  __shared__ __align__(16) unsigned char stage[kGroupedWarps][kBufBytes];

  const int r = static_cast<int>(blockIdx.y);
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int f = static_cast<int>(blockIdx.x) * kGroupedWarps + warp;
  if (r >= rows || r >= offsets[experts] || f >= n) return;  // uniform per warp
  // The expert holding row r: the last e with offsets[e] <= r (experts without rows share offsets).
  int lo = 0, hi = experts;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (offsets[mid] <= r) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const int blocks_per_row = k / F::kElems;
  const long long row_bytes = static_cast<long long>(blocks_per_row) * F::kBytes;
  const unsigned char* wrow = w + (static_cast<long long>(lo) * n + f) * row_bytes;
  const T* xr = x + static_cast<long long>(r) * ldx;
  unsigned char* buf = stage[warp];
  const int blk = lane * 8 / F::kElems;  // this lane's block of a step and its first element there
  const int at = lane * 8 % F::kElems;

  float acc = 0.0f;
  for (int b0 = 0; b0 < blocks_per_row; b0 += kStepBlocks) {
    const int nb = min(kStepBlocks, blocks_per_row - b0);
    const unsigned char* src = wrow + static_cast<long long>(b0) * F::kBytes;
    __syncwarp();
    for (int j = lane; j < nb * F::kBytes; j += 32) buf[j] = __ldg(src + j);
    __syncwarp();
    if (blk < nb) {
      const unsigned char* bp = buf + blk * F::kBytes;
      float s, o, q[8];
      F::scale(bp, at, s, o);
      F::quants(bp, at, q);
      const T* xp = xr + static_cast<long long>(b0) * F::kElems + lane * 8;
      float dot = 0.0f, sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float v = to_float(xp[j]);
        dot += q[j] * v;
        sum += v;
      }
      acc += s * dot + o * sum;
    }
  }
#pragma unroll
  for (int delta = 16; delta > 0; delta >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, delta);
  if (lane == 0) y[static_cast<long long>(r) * ldy + f] = from_float<T>(acc);
}

}  // namespace qgemv
}  // namespace ops
}  // namespace pygpukit
