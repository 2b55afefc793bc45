// What the mixture-of-experts kernels (moe.cu, grouped_gemm.cu) share: block-wide scans of int
// values in a fixed order, and the expert groups that expert_offsets describe.
//
// Expert groups: expert e owns rows [offsets[e], offsets[e + 1]) of the permuted activations. The
// kernels never trust those values to stay inside the arrays: they use the running maximum of
// offsets[0..e], clamped to [0, rows], so that the groups are disjoint, ordered and in bounds
// whatever the buffer holds (ill-formed offsets give empty or shortened groups, never a fault).
#pragma once

#include "../common/element_types.cuh"

namespace pygpukit {
namespace ops {
namespace moe {

struct SumOp {
  __device__ __forceinline__ int operator()(int a, int b) const { return a + b; }
};
struct MaxOp {
  __device__ __forceinline__ int operator()(int a, int b) const { return a > b ? a : b; }
};

// Exclusive scan of one int per thread over a block of THREADS threads (all of which must call
// it), in thread order: thread t gets op(identity, v_0, ..., v_{t-1}). `scratch` holds THREADS / 32
// ints of shared memory; it may be reused once this returns.
template <int THREADS, typename Op>
__device__ __forceinline__ int block_exclusive_scan(int value, Op op, int identity, int* scratch) {
  constexpr int kWarps = THREADS / 32;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  int inclusive = value;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int up = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive = op(inclusive, up);
  }
  if (lane == 31) scratch[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    int total = lane < kWarps ? scratch[lane] : identity;
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
      const int up = __shfl_up_sync(0xffffffffu, total, offset);
      if (lane >= offset) total = op(total, up);
    }
    if (lane < kWarps) scratch[lane] = total;
  }
  __syncthreads();
  int before = __shfl_up_sync(0xffffffffu, inclusive, 1);
  if (lane == 0) before = identity;
  const int result = warp > 0 ? op(scratch[warp - 1], before) : before;
  __syncthreads();
  return result;
}

// The experts a thread of a THREADS-thread block looks after when a block walks all of them: a
// contiguous run [first, last) of ceil(count / THREADS) entries.
template <int THREADS>
__device__ __forceinline__ void thread_run(int count, int& first, int& last) {
  const int per = (count + THREADS - 1) / THREADS;
  first = min(static_cast<int>(threadIdx.x) * per, count);
  last = min(first + per, count);
}

// One row tile of a grouped GEMM: rows [begin + m0, begin + min(m0 + BM, rows)) of expert `expert`,
// whose group starts at row `begin` and holds `rows` rows.
struct GroupTile {
  int expert;
  int begin;
  int rows;
  int m0;
};

// The `tile`-th row tile, counting the tiles of every expert's group in expert order (ceil(rows /
// bm) per group). Returns false, in every thread, when there are fewer tiles. All THREADS threads of
// the block must call it; it reads offsets[0..experts] once per thread run.
template <int THREADS>
__device__ __forceinline__ bool find_group_tile(const int* __restrict__ offsets, int experts, int total_rows,
                                                int bm, int tile, GroupTile& result) {
  __shared__ int scratch[THREADS / 32];
  __shared__ GroupTile found;
  __shared__ int hit;
  if (threadIdx.x == 0) hit = 0;
  int first, last;
  thread_run<THREADS>(experts, first, last);
  int local_max = 0;
  for (int e = first; e < last; ++e) local_max = max(local_max, offsets[e]);
  const int start = block_exclusive_scan<THREADS>(local_max, MaxOp(), 0, scratch);
  int run = start;
  int local_tiles = 0;
  for (int e = first; e < last; ++e) {
    run = max(run, offsets[e]);
    const int lo = min(run, total_rows);
    const int hi = min(max(run, offsets[e + 1]), total_rows);
    local_tiles += (hi - lo + bm - 1) / bm;
  }
  int base = block_exclusive_scan<THREADS>(local_tiles, SumOp(), 0, scratch);
  if (tile >= base && tile < base + local_tiles) {
    run = start;
    for (int e = first; e < last; ++e) {
      run = max(run, offsets[e]);
      const int lo = min(run, total_rows);
      const int hi = min(max(run, offsets[e + 1]), total_rows);
      const int tiles = (hi - lo + bm - 1) / bm;
      if (tile < base + tiles) {
        found.expert = e;
        found.begin = lo;
        found.rows = hi - lo;
        found.m0 = (tile - base) * bm;
        hit = 1;
        break;
      }
      base += tiles;
    }
  }
  __syncthreads();
  if (!hit) return false;
  result = found;
  return true;
}

}  // namespace moe
}  // namespace ops
}  // namespace pygpukit
