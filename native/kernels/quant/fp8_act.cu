// Dynamic FP8 e4m3 quantization of activations (pygpukit/ops/quant/fp8_act.py), the input side of W8A8
// GEMMs (cuBLASLt scaled matmul): x (rows, k) in T (float, __half, __nv_bfloat16), row-major with leading
// dimension ldx (elements) and unit stride along k, to q float8_e4m3fn (rows, k) contiguous (ld k) and
// float32 scales, at three granularities:
//
//   fp8_act_block<T>(x, q, s, rows, k, ldx, lds, vector)
//       per row m and group g of kGroup = 128 columns (the last one shorter): s[g * lds + m] (M-major:
//       a (ceil(k / 128), lds >= rows) array, DeepSeek-V3's / HF fp8 "dynamic" activation scales).
//       One warp per (row, group), 4 elements per lane, held in registers between amax and quantize.
//   fp8_act_row<T>(x, q, s, rows, k, ldx, vector)
//       per row: s[m]. One block per row: a pass for the amax, a second (re-reading x) to quantize.
//   fp8_act_amax<T>(x, amax, rows, k, ldx, vector)
//   fp8_act_tensor<T>(x, q, s, amax, rows, k, ldx, vector)
//       the whole tensor, the two in turn: the first folds each block's amax into *amax (a float >= 0
//       as its bits, whose unsigned order is the float order: atomicMax; the launcher zeroes it first on
//       the same stream); the second reads it, quantizes, and its first thread writes s[0].
//
// Every granularity: amax = max |x| over the group with NaN ignored (fmaxf); scale = amax / 448 rounded
// to nearest, or exactly 1 where that quotient is 0 (an all-zero group, or one whose amax is so small,
// below about 2^-141, that the quotient underflows); q = e4m3(x / scale) with the IEEE float32 quotient
// (__fdiv_rn), rounded to nearest even and saturated to +-448 (cuda_fp8.h's __NV_SATFINITE conversion:
// cvt.rn.satfinite on sm_89 and later, its bitwise equivalent in software before), any NaN becoming the
// canonical NaN 0x7f. The maximum does not depend on the order of its operands, so results are bitwise
// deterministic.
//
// Work goes in chunks of kChunk = 4 consecutive elements of a row. With `vector` (x and ldx aligned to 4
// elements, k a multiple of 4) a chunk is one 16-byte (float) or 8-byte (fp16, bf16) load and one 4-byte
// store of q; otherwise element by element, the columns past k skipped.
#include "../common/types.cuh"

namespace pygpukit {
namespace ops {
namespace fp8act {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 4;
constexpr int kGroup = 32 * kChunk;  // the block granularity's columns: one warp's chunks
constexpr float kE4M3Max = 448.0f;

// The scale of a group whose max |x| is amax.
__device__ __forceinline__ float scale_of(float amax) {
  const float s = __fdiv_rn(amax, kE4M3Max);
  return s > 0.0f ? s : 1.0f;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int delta = 16; delta > 0; delta >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, delta));
  return v;
}

// The maximum of v over the block (every thread gets it); `scratch` holds kWarps floats. Ends with a
// barrier, so the caller may reuse `scratch` right away.
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  v = warp_max(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float all = scratch[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) all = fmaxf(all, scratch[w]);
  __syncthreads();
  return all;
}

// Elements c .. c + 3 of the row at xr as float (0 past k).
template <typename T>
__device__ __forceinline__ void load_chunk(const T* __restrict__ xr, long long c, long long k, int vector,
                                           float (&v)[kChunk]) {
  if (vector != 0 && c < k) {  // k is a multiple of kChunk: the whole chunk is inside the row
    if constexpr (sizeof(T) == 4) {
      const float4 a = *reinterpret_cast<const float4*>(xr + c);
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    } else {
      const Pack<T, kChunk> pack = *reinterpret_cast<const Pack<T, kChunk>*>(xr + c);
#pragma unroll
      for (int j = 0; j < kChunk; ++j) v[j] = to_float(pack.v[j]);
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < kChunk; ++j) v[j] = c + j < k ? to_float(xr[c + j]) : 0.0f;
}

__device__ __forceinline__ float chunk_amax(const float (&v)[kChunk]) {
  float m = 0.0f;
#pragma unroll
  for (int j = 0; j < kChunk; ++j) m = fmaxf(m, fabsf(v[j]));
  return m;
}

// q[c .. c + 3] of the row at qr = e4m3(v / scale), the columns past k left alone.
__device__ __forceinline__ void store_chunk(__nv_fp8_e4m3* __restrict__ qr, long long c, long long k,
                                            int vector, const float (&v)[kChunk], float scale) {
  const __nv_fp8x2_storage_t lo = __nv_cvt_float2_to_fp8x2(
      make_float2(__fdiv_rn(v[0], scale), __fdiv_rn(v[1], scale)), __NV_SATFINITE, __NV_E4M3);
  const __nv_fp8x2_storage_t hi = __nv_cvt_float2_to_fp8x2(
      make_float2(__fdiv_rn(v[2], scale), __fdiv_rn(v[3], scale)), __NV_SATFINITE, __NV_E4M3);
  const unsigned int word = static_cast<unsigned int>(lo) | (static_cast<unsigned int>(hi) << 16);
  if (vector != 0) {
    if (c < k) *reinterpret_cast<unsigned int*>(qr + c) = word;  // 4-byte aligned: k % 4 == 0
    return;
  }
#pragma unroll
  for (int j = 0; j < kChunk; ++j) {
    if (c + j < k) qr[c + j].__x = static_cast<__nv_fp8_storage_t>(word >> (8 * j));
  }
}

// The chunks of a (rows, ceil(k / kChunk)) space walked from `start` in steps of `step` (a grid-stride
// loop), the row and chunk kept without a division per step.
struct ChunkWalk {
  long long m, c, dm, dc, chunks;
  __device__ ChunkWalk(long long start, long long step, long long chunks_per_row)
      : m(start / chunks_per_row),
        c(start % chunks_per_row),
        dm(step / chunks_per_row),
        dc(step % chunks_per_row),
        chunks(chunks_per_row) {}
  __device__ void next() {
    m += dm;
    c += dc;
    if (c >= chunks) c -= chunks, ++m;
  }
};

template <typename T>
__global__ void __launch_bounds__(kThreads)
    fp8_act_block(const T* __restrict__ x, __nv_fp8_e4m3* __restrict__ q, float* __restrict__ s, int rows,
                  int k, long long ldx, long long lds, int vector) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const long long groups = (static_cast<long long>(k) + kGroup - 1) / kGroup;
  const long long total = groups * rows;
  const long long step = static_cast<long long>(gridDim.x) * kWarps;
  for (long long w = static_cast<long long>(blockIdx.x) * kWarps + (threadIdx.x >> 5); w < total; w += step) {
    const long long m = w / groups;
    const long long g = w - m * groups;
    const long long c = g * kGroup + lane * kChunk;
    float v[kChunk];
    load_chunk(x + m * ldx, c, k, vector, v);
    const float scale = scale_of(warp_max(chunk_amax(v)));
    if (lane == 0) s[g * lds + m] = scale;
    store_chunk(q + m * k, c, k, vector, v, scale);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    fp8_act_row(const T* __restrict__ x, __nv_fp8_e4m3* __restrict__ q, float* __restrict__ s, int rows,
                int k, long long ldx, int vector) {
  __shared__ float scratch[kWarps];
  const long long first = static_cast<long long>(threadIdx.x) * kChunk;
  for (long long m = blockIdx.x; m < rows; m += gridDim.x) {
    const T* xr = x + m * ldx;
    float amax = 0.0f;
    for (long long c = first; c < k; c += kThreads * kChunk) {
      float v[kChunk];
      load_chunk(xr, c, k, vector, v);
      amax = fmaxf(amax, chunk_amax(v));
    }
    const float scale = scale_of(block_max(amax, scratch));
    if (threadIdx.x == 0) s[m] = scale;
    for (long long c = first; c < k; c += kThreads * kChunk) {
      float v[kChunk];
      load_chunk(xr, c, k, vector, v);
      store_chunk(q + m * k, c, k, vector, v, scale);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    fp8_act_amax(const T* __restrict__ x, unsigned int* __restrict__ amax, int rows, int k, long long ldx,
                 int vector) {
  __shared__ float scratch[kWarps];
  const long long chunks = (static_cast<long long>(k) + kChunk - 1) / kChunk;
  float local = 0.0f;
  for (ChunkWalk it(global_thread(), grid_threads(), chunks); it.m < rows; it.next()) {
    float v[kChunk];
    load_chunk(x + it.m * ldx, it.c * kChunk, k, vector, v);
    local = fmaxf(local, chunk_amax(v));
  }
  const float all = block_max(local, scratch);
  // all >= 0, whose bits as unsigned order as the floats do (NaN never gets here: fmaxf drops it).
  if (threadIdx.x == 0 && all > 0.0f) atomicMax(amax, __float_as_uint(all));
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    fp8_act_tensor(const T* __restrict__ x, __nv_fp8_e4m3* __restrict__ q, float* __restrict__ s,
                   const unsigned int* __restrict__ amax, int rows, int k, long long ldx, int vector) {
  const float scale = scale_of(__uint_as_float(*amax));
  if (blockIdx.x == 0 && threadIdx.x == 0) s[0] = scale;
  const long long chunks = (static_cast<long long>(k) + kChunk - 1) / kChunk;
  for (ChunkWalk it(global_thread(), grid_threads(), chunks); it.m < rows; it.next()) {
    float v[kChunk];
    load_chunk(x + it.m * ldx, it.c * kChunk, k, vector, v);
    store_chunk(q + it.m * k, it.c * kChunk, k, vector, v, scale);
  }
}

}  // namespace fp8act
}  // namespace ops
}  // namespace pygpukit
