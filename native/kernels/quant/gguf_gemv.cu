// Decode GEMV over GGUF (ggml) block-quantized weights (pygpukit/ops/quant/gemv.py):
//
//   gguf_gemv<Type, T, M>(x, w, y, bias, rows, n, k, ldx, ldy, vector, split)
//       y[m, r] = sum_k x[m, k] * W[r, k] (+ bias[r]) for m < rows <= M and r < n, in T (float,
//       __half or __nv_bfloat16) with float32 accumulation. Row r of W is k / QK consecutive blocks
//       of ggml type `Type` (Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q2_K = 10, Q3_K = 11,
//       Q4_K = 12, Q5_K = 13, Q6_K = 14) exactly as a GGUF file stores them, rows back to back.
//
// One warp per row of W, eight rows per block of 256 threads; with `split` (2, 4 or 8; for short, wide
// products that would leave SMs idle) that many warps share a row, taking every split-th segment,
// and the row's first warp adds their sums (through shared memory, in a fixed order). The block's
// warps walk K in lockstep, one step of split segments of 1024 elements (32 whole blocks of the
// 32-element formats, 4 of the k-quants) at a time. Per step, all 256 threads stage that chunk of x
// (every row of x) in shared memory once as float32 (converted once for the block's 8 rows of W,
// read back with conflict-free 16-byte loads) together with its sums over every scale group; the next
// step's first 8 elements per thread (all of it when M * split <= 2) are loaded while this one is
// decoded. The launch passes M * split * 4352 bytes of dynamic shared memory, M * split <= 8. Each warp
// copies its segment's bytes of W into its own shared-memory buffer with coalesced 16-byte loads from the
// 16-byte aligned address at or below the segment's start (blocks are 18 to 272 bytes and need not be
// aligned), the next segment's loads in flight while the current one is decoded. Then lane l decodes elements
// 32 l .. 32 l + 31 of the segment (one or two scale groups), 8 at a time, as value = s * q + o (s and o the
// scale and offset of their group, decoded once per group) and accumulates s * sum(q x) + o * sum(x) for each
// row of x in float32 (sum(x) from the staged group sums). x is read from global memory 16 bytes at a time
// when `vector` (x and its row stride 16-byte aligned). Lane partial sums are reduced with warp
// shuffles. Loads that would leave [w, w + n * row bytes) are done byte by byte.
#include "gguf_formats.cuh"

namespace pygpukit {
namespace ops {
namespace qgemv {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kSegElems = 1024;  // elements of a row per warp step: 32 per lane

// The 16 bytes at address a, of which only those inside [lo, hi) are read (the others are zero).
__device__ __forceinline__ uint4 load_chunk(unsigned long long a, unsigned long long lo,
                                            unsigned long long hi) {
  if (a >= lo && a + 16 <= hi) return __ldg(reinterpret_cast<const uint4*>(a));
  union {
    uint4 v;
    unsigned char c[16];
  } u;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const unsigned long long at = a + j;
    u.c[j] = (at >= lo && at < hi) ? *reinterpret_cast<const unsigned char*>(at) : 0;
  }
  return u.v;
}

// x staged in shared memory: per step, the CTA's chunk of x (split segments of 1024 elements for each
// of the M rows) as float32, float4 slot `s` stored at s ^ ((s >> 3) & 7) so that the 8 lanes of a
// 16-byte load phase (32 elements apart) hit distinct banks; after it the sums of x over every group
// of kGroup elements (the offset term o * sum(x) of the formats with a minimum).
__device__ __forceinline__ int x_slot(int s) { return s ^ ((s >> 3) & 7); }

// Rows of x (bucket M) times split segments must fit the staging: M * split <= kMaxXSegments.
constexpr int kMaxXSegments = 8;
constexpr int kXItems = kMaxXSegments * kSegElems / 8 / kThreads;  // 8-element items per thread

// The 8 elements of x at p as raw T (zeros when !valid), 16-byte loads when `vector`.
template <typename T>
__device__ __forceinline__ Pack<T, 8> load_raw8(const T* p, bool valid, bool vector) {
  Pack<T, 8> r;
  if (!valid) {
#pragma unroll
    for (int j = 0; j < 8; ++j) r.v[j] = from_float<T>(0.0f);
    return r;
  }
  if (vector) {
    if constexpr (sizeof(T) == 4) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(p));
      const float4 c = __ldg(reinterpret_cast<const float4*>(p + 4));
      r.v[0] = a.x, r.v[1] = a.y, r.v[2] = a.z, r.v[3] = a.w, r.v[4] = c.x, r.v[5] = c.y, r.v[6] = c.z,
      r.v[7] = c.w;
    } else {
      r = *reinterpret_cast<const Pack<T, 8>*>(p);
    }
    return r;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) r.v[j] = p[j];
  return r;
}

template <int Type, typename T, int M>
__global__ void __launch_bounds__(kThreads, M <= 4 ? 4 : 3)
    gguf_gemv(const T* __restrict__ x, const unsigned char* __restrict__ w, T* __restrict__ y,
              const T* __restrict__ bias, int rows, int n, int k, long long ldx, long long ldy, int vector,
              int split) {
  using F = Format<Type>;
  constexpr int kSegBlocks = kSegElems / F::kElems;
  constexpr int kSegBytes = kSegBlocks * F::kBytes;
  // 16-byte chunks of a segment from an aligned-down start, and room for bytes8's reads past its end
  constexpr int kChunks = (kSegBytes + 15 + 15) / 16;
  static_assert(((kChunks + 31) / 32) * 32 * 16 >= kSegBytes + 15 + 4, "bytes8 reads stay in the buffer");
  constexpr int kPerLane = (kChunks + 31) / 32;
  __shared__ __align__(16) unsigned char stage[kWarps][kPerLane * 32 * 16];
  // Dynamic: M * split * kSegElems floats of x, then M * split * kSegElems / kGroup group sums.
  extern __shared__ float4 x_stage[];

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int part = warp % split;  // split warps share a row, taking every split-th segment
  const int row = static_cast<int>(blockIdx.x) * (kWarps / split) + warp / split;
  const bool active = row < n;
  const int blocks_per_row = k / F::kElems;
  const long long row_bytes = static_cast<long long>(blocks_per_row) * F::kBytes;
  const unsigned long long lo = reinterpret_cast<unsigned long long>(w);
  const unsigned long long hi =
      lo + static_cast<unsigned long long>(row_bytes) * static_cast<unsigned long long>(n);
  const unsigned long long row_start = lo + static_cast<unsigned long long>(row_bytes) * row;
  const int all_segments = (blocks_per_row + kSegBlocks - 1) / kSegBlocks;  // the same for every warp
  const int segments = active ? all_segments : 0;
  const int steps = (all_segments + split - 1) / split;
  unsigned char* buf = stage[warp];
  const bool vec = vector != 0;
  const int chunk = split * kSegElems;  // elements of one row of x per step
  const int items = M * chunk / 8;      // 8-element items of x per step
  float* x_sums = reinterpret_cast<float*>(x_stage + M * chunk / 4);

  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;

  uint4 regs[kPerLane];
#pragma unroll
  for (int p = 0; p < kPerLane; ++p) regs[p] = make_uint4(0u, 0u, 0u, 0u);
  int lead = 0;
  auto fetch = [&](int s) {
    const unsigned long long start = row_start + static_cast<unsigned long long>(s) * kSegBytes;
    const unsigned long long aligned = start & ~15ull;
    const int seg_blocks = min(kSegBlocks, blocks_per_row - s * kSegBlocks);
    lead = static_cast<int>(start - aligned);
    const int chunks = (lead + seg_blocks * F::kBytes + 15) >> 4;
#pragma unroll
    for (int p = 0; p < kPerLane; ++p) {
      const int c = p * 32 + lane;
      if (c < chunks) regs[p] = load_chunk(aligned + 16ull * c, lo, hi);
    }
  };
  // Item i of a step (8 elements of x): row i >> item_shift of x, elements 8 * (i & item_mask) of the
  // step's chunk (chunk / 8 = split * 128 items per row, a power of two).
  const int item_shift = 31 - __clz(chunk / 8);
  const int item_mask = chunk / 8 - 1;
  auto load_item = [&](int t, int j) {
    const int item = tid + j * kThreads;
    const int xm = item >> item_shift;
    const long long kk = static_cast<long long>(t) * chunk + (item & item_mask) * 8;
    const bool valid = item < items && xm < rows && kk < k;
    return load_raw8(x + (valid ? xm * ldx + kk : 0), valid, vec);
  };
  auto stage_item = [&](int j, const Pack<T, 8>& raw) {  // every lane of the warp takes part
    const int item = tid + j * kThreads;
    float v[8];
    float s8 = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      v[e] = to_float(raw.v[e]);
      s8 += v[e];
    }
    // group sums over consecutive items (consecutive lanes), in a fixed order
    float s = s8;
#pragma unroll
    for (int width = 1; width < F::kGroup / 8; width *= 2) s += __shfl_down_sync(0xffffffffu, s, width);
    if (item < items) {
      x_stage[x_slot(2 * item)] = make_float4(v[0], v[1], v[2], v[3]);
      x_stage[x_slot(2 * item + 1)] = make_float4(v[4], v[5], v[6], v[7]);
      if ((item & (F::kGroup / 8 - 1)) == 0) x_sums[item / (F::kGroup / 8)] = s;
    }
  };

  if (part < segments) fetch(part);
  Pack<T, 8> next_x = load_item(0, 0);  // the next step's first item, in flight while a step is decoded
  for (int t = 0; t < steps; ++t) {
    __syncthreads();  // every warp is done with the previous step's x and its staging buffer
    stage_item(0, next_x);
#pragma unroll 1
    for (int j = 1; j < kXItems; ++j) {  // bucket * split > 2 only
      if (j * kThreads >= items) break;  // uniform: items is a multiple of 128
      stage_item(j, load_item(t, j));
    }
    const int s = t * split + part;
#pragma unroll
    for (int p = 0; p < kPerLane; ++p) reinterpret_cast<uint4*>(buf)[p * 32 + lane] = regs[p];
    const int cur_lead = lead;
    __syncthreads();
    if (t + 1 < steps) next_x = load_item(t + 1, 0);
    if (s + split < segments) fetch(s + split);  // in flight while this segment is decoded
    if (s >= segments) continue;
    const int elems = min(kSegBlocks, blocks_per_row - s * kSegBlocks) * F::kElems;
    const int e0 = lane * 32;
    if (e0 >= elems) continue;
    const unsigned char* blk = buf + cur_lead + (e0 / F::kElems) * F::kBytes;
    const int i0 = e0 % F::kElems;
    const int f0 = part * kSegElems + e0;  // in the chunk of row m: m * chunk + f0
    // Q4_K / Q5_K: every block of the segment starts 16-byte aligned in buf (uniform over the warp)
    const bool aligned = kCanAlign<Type> && cur_lead == 0;
#pragma unroll
    for (int g0 = 0; g0 < 32; g0 += F::kGroup) {  // the lane's 32 elements: one or two scale groups
      float sc, off;
      F::scale(blk, i0 + g0, sc, off);
      float dot[M];
#pragma unroll
      for (int m = 0; m < M; ++m) dot[m] = 0.0f;
#pragma unroll(M >= 4 ? 1 : 4)
      for (int g = g0; g < g0 + F::kGroup; g += 8) {
        float q[8];
        if (aligned) {
          F::template quants<kCanAlign<Type>>(blk, i0 + g, q);
        } else {
          F::template quants<false>(blk, i0 + g, q);
        }
#pragma unroll
        for (int m = 0; m < M; ++m) {
          if (m < rows) {
            const int slot = (m * chunk + f0 + g) >> 2;
            const float4 a = x_stage[x_slot(slot)];
            const float4 c = x_stage[x_slot(slot + 1)];
            dot[m] = fmaf(a.x, q[0], dot[m]);
            dot[m] = fmaf(a.y, q[1], dot[m]);
            dot[m] = fmaf(a.z, q[2], dot[m]);
            dot[m] = fmaf(a.w, q[3], dot[m]);
            dot[m] = fmaf(c.x, q[4], dot[m]);
            dot[m] = fmaf(c.y, q[5], dot[m]);
            dot[m] = fmaf(c.z, q[6], dot[m]);
            dot[m] = fmaf(c.w, q[7], dot[m]);
          }
        }
      }
#pragma unroll
      for (int m = 0; m < M; ++m) {
        acc[m] = fmaf(sc, dot[m], acc[m]);
        if constexpr (F::kMin) {
          if (m < rows) acc[m] = fmaf(off, x_sums[(m * chunk + f0 + g0) / F::kGroup], acc[m]);
        }
      }
    }
  }

#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int delta = 16; delta > 0; delta >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], delta);
  }
  if (split > 1) {  // the row's first warp adds the split warps' sums in a fixed order
    __shared__ float partial[kWarps][M];
    if (lane == 0) {
#pragma unroll
      for (int m = 0; m < M; ++m) partial[warp][m] = acc[m];
    }
    __syncthreads();
    if (part != 0) return;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float total = 0.0f;
      for (int p = 0; p < split; ++p) total += partial[warp + p][m];
      acc[m] = total;
    }
  }
  if (active && lane == 0) {
    const float b = bias != nullptr ? to_float(bias[row]) : 0.0f;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if (m < rows) y[m * ldy + row] = from_float<T>(acc[m] + b);
    }
  }
}

}  // namespace qgemv
}  // namespace ops
}  // namespace pygpukit
