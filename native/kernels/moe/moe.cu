// Mixture-of-experts routing kernels, launched by pygpukit/ops/moe.py. None uses atomics whose order
// could change a result: every output is a fixed function of the inputs (bitwise repeatable).
//
//   moe_gating<T, VPL>(logits, weights, ids, tokens, experts, k, ld, renormalize, scoring)
//       a warp per token holds the token's router logits in registers (VPL per lane, experts <= 32 VPL),
//       computes softmax (max, then a sum of exponentials folded per lane in expert order and joined by
//       a butterfly) or sigmoid scores in float, and selects the k best experts one at a time by a warp
//       arg-max over (logit, lower expert id first). Weights are the scores of the chosen experts,
//       divided by their sum (in slot order) when renormalize is set.
//   moe_positions(ids, offsets, permutation, slots, experts, chunk)
//       a stable counting sort of the slots (token-major: slot i = token * k + j) by expert id. Each
//       block counts every expert over all slots and over the slots before its chunk (shared-memory
//       counters: counts do not depend on the order of the additions), scans the counts into the
//       group offsets, then places its chunk 256 slots at a time: a warp ranks its lanes of equal
//       expert with __match_any_sync, and the warps of the block take turns. permutation[i] is the row
//       of the grouped order that slot i goes to. Ids outside [0, experts) sort after every expert.
//   moe_gather_rows<T>(x, permutation, x_perm, slots, k, hidden, ldx, lanes, vector)
//       x_perm[permutation[i]] = x[i / k], 16 bytes per access when vector is set.
//   moe_unpermute<T>(y, permutation, weights, out, tokens, k, hidden, ldo, rows, lanes, vector)
//       out[t] = sum over j = 0..k-1, in that order, of weights[t, j] * y[permutation[t k + j]], in
//       float, rounded once; a permutation entry outside [0, rows) contributes nothing.
//   moe_glu<T>(gate, up, h, rows, cols, ldg, ldu, ldh, activation, lanes, vector)
//       h = act(gate) * up in float, rounded once (SwiGLU for activation "silu").
#include "../common/types.cuh"
#include "../gemm/matmul_common.cuh"
#include "moe_common.cuh"

namespace pygpukit {
namespace ops {
namespace moe {

constexpr int kScoreSoftmax = 0;
constexpr int kScoreSigmoid = 1;

// A total order of floats as unsigned keys, larger key for larger value; -0 counts as +0 and every
// NaN as larger than +infinity (torch.topk's order). Real values have keys >= 0x007fffff, so 0 is
// free to mean "nothing".
__device__ __forceinline__ unsigned order_key(float v) {
  if (v != v) return 0xffffffffu;
  unsigned u = __float_as_uint(v);
  if (u == 0x80000000u) u = 0u;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float key_value(unsigned key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

template <typename T, int VPL>
__global__ void __launch_bounds__(256)
    moe_gating(const T* __restrict__ logits, float* __restrict__ weights, int* __restrict__ ids,
               long long tokens, int experts, int k, long long ld, int renormalize, int scoring) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const long long warps = blockDim.x / 32;
  const float neg_inf = -__int_as_float(0x7f800000);
  for (long long t = blockIdx.x * warps + threadIdx.x / 32; t < tokens; t += gridDim.x * warps) {
    const T* row = logits + t * ld;
    float v[VPL];
    float top = neg_inf;
#pragma unroll
    for (int j = 0; j < VPL; ++j) {
      const int e = lane + 32 * j;
      v[j] = e < experts ? convert<float>(row[e]) : neg_inf;
      top = fmaxf(top, v[j]);
    }
    float total = 0.0f;
    if (scoring == kScoreSoftmax) {
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1)
        top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, offset));
#pragma unroll
      for (int j = 0; j < VPL; ++j) {
        if (lane + 32 * j < experts) total += expf(v[j] - top);
      }
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) total += __shfl_xor_sync(0xffffffffu, total, offset);
    }
    // Candidates: (value key, inverted expert id), so that the maximum is the best value and, among
    // equal values, the lowest expert. 0 marks an expert that is taken or absent.
    unsigned long long candidates[VPL];
#pragma unroll
    for (int j = 0; j < VPL; ++j) {
      const int e = lane + 32 * j;
      candidates[j] = e < experts
                          ? (static_cast<unsigned long long>(order_key(v[j])) << 32) |
                                static_cast<unsigned long long>(0xffffffffu - static_cast<unsigned>(e))
                          : 0ull;
    }
    float* weight_row = weights + t * k;
    int* id_row = ids + t * k;
    float chosen_sum = 0.0f;
    for (int s = 0; s < k; ++s) {
      unsigned long long best = 0ull;
#pragma unroll
      for (int j = 0; j < VPL; ++j) best = candidates[j] > best ? candidates[j] : best;
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) {
        const unsigned long long other = __shfl_xor_sync(0xffffffffu, best, offset);
        best = other > best ? other : best;
      }
#pragma unroll
      for (int j = 0; j < VPL; ++j) {
        if (candidates[j] == best) candidates[j] = 0ull;
      }
      const int expert = static_cast<int>(0xffffffffu - static_cast<unsigned>(best & 0xffffffffull));
      const float value = key_value(static_cast<unsigned>(best >> 32));
      const float score = scoring == kScoreSoftmax ? expf(value - top) / total : 1.0f / (1.0f + expf(-value));
      chosen_sum += score;
      if (lane == (s & 31)) {
        weight_row[s] = score;
        id_row[s] = expert;
      }
    }
    if (renormalize) {
      for (int s = lane; s < k; s += 32)
        weight_row[s] = weight_row[s] / chosen_sum;  // this lane's own writes
    }
  }
}

// Shared memory: 2 (experts + 1) ints (dynamic).
__global__ void __launch_bounds__(256)
    moe_positions(const int* __restrict__ ids, int* __restrict__ offsets, int* __restrict__ permutation,
                  long long slots, int experts, long long chunk) {
  constexpr int kThreads = 256;
  extern __shared__ int counts[];
  __shared__ int scratch[kThreads / 32];
  const int buckets = experts + 1;  // the last one collects ids out of range
  int* total = counts;
  int* before = counts + buckets;
  const int tid = static_cast<int>(threadIdx.x);
  for (int i = tid; i < 2 * buckets; i += kThreads) counts[i] = 0;
  __syncthreads();
  const long long begin = static_cast<long long>(blockIdx.x) * chunk;
  const long long end = min(begin + chunk, slots);
  for (long long i = tid; i < slots; i += kThreads) {
    const int id = ids[i];
    const int e = (id >= 0 && id < experts) ? id : experts;
    atomicAdd(&total[e], 1);
    if (i < begin) atomicAdd(&before[e], 1);
  }
  __syncthreads();
  int first, last;
  thread_run<kThreads>(buckets, first, last);
  int local = 0;
  for (int e = first; e < last; ++e) local += total[e];
  int run = block_exclusive_scan<kThreads>(local, SumOp(), 0, scratch);
  for (int e = first; e < last; ++e) {
    if (blockIdx.x == 0) offsets[e] = run;  // offsets[experts]: the rows that belong to an expert
    before[e] += run;                       // where this block's first slot of bucket e goes
    run += total[e];
  }
  __syncthreads();
  const int lane = tid & 31;
  const int warp = tid >> 5;
  for (long long s0 = begin; s0 < end; s0 += kThreads) {
    const long long i = s0 + tid;
    const bool live = i < end;
    int e = experts + 1;  // dead lanes match only each other
    if (live) {
      const int id = ids[i];
      e = (id >= 0 && id < experts) ? id : experts;
    }
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(peers & ((1u << lane) - 1u));
    const int leader = __ffs(peers) - 1;
    for (int w = 0; w < kThreads / 32; ++w) {
      if (warp == w) {
        const int position = live ? before[e] + rank : 0;
        __syncwarp();
        if (live) {
          permutation[i] = position;
          if (lane == leader) before[e] += __popc(peers);
        }
      }
      __syncthreads();
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(256)
    moe_gather_rows(const T* __restrict__ x, const int* __restrict__ permutation, T* __restrict__ x_perm,
                    long long slots, int k, long long hidden, long long ldx, int lanes, int vector) {
  constexpr int V = 16 / sizeof(T);
  const int group = static_cast<int>(threadIdx.x) / lanes;
  const int lane = static_cast<int>(threadIdx.x) % lanes;
  const long long per_block = blockDim.x / lanes;
  for (long long i = blockIdx.x * per_block + group; i < slots; i += gridDim.x * per_block) {
    const long long row = permutation[i];
    if (row < 0 || row >= slots) continue;
    const T* src = x + (i / k) * ldx;
    T* dst = x_perm + row * hidden;
    if (vector) {
      for (long long c = static_cast<long long>(lane) * V; c < hidden;
           c += static_cast<long long>(lanes) * V) {
        *reinterpret_cast<uint4*>(dst + c) = *reinterpret_cast<const uint4*>(src + c);
      }
    } else {
      for (long long c = lane; c < hidden; c += lanes) dst[c] = src[c];
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(256)
    moe_unpermute(const T* __restrict__ y, const int* __restrict__ permutation,
                  const float* __restrict__ weights, T* __restrict__ out, long long tokens, int k,
                  long long hidden, long long ldo, long long rows, int lanes, int vector) {
  constexpr int V = 16 / sizeof(T);
  const int group = static_cast<int>(threadIdx.x) / lanes;
  const int lane = static_cast<int>(threadIdx.x) % lanes;
  const long long per_block = blockDim.x / lanes;
  for (long long t = blockIdx.x * per_block + group; t < tokens; t += gridDim.x * per_block) {
    const int* slot_rows = permutation + t * k;
    const float* slot_weights = weights + t * k;
    T* dst = out + t * ldo;
    if (vector) {
      for (long long c = static_cast<long long>(lane) * V; c < hidden;
           c += static_cast<long long>(lanes) * V) {
        float acc[V];
#pragma unroll
        for (int e = 0; e < V; ++e) acc[e] = 0.0f;
        for (int j = 0; j < k; ++j) {
          const long long row = slot_rows[j];
          if (row < 0 || row >= rows) continue;
          const float w = slot_weights[j];
          const Pack<T, V> pack = *reinterpret_cast<const Pack<T, V>*>(y + row * hidden + c);
#pragma unroll
          for (int e = 0; e < V; ++e) acc[e] += w * convert<float>(pack.v[e]);
        }
        Pack<T, V> result;
#pragma unroll
        for (int e = 0; e < V; ++e) result.v[e] = convert<T>(acc[e]);
        *reinterpret_cast<Pack<T, V>*>(dst + c) = result;
      }
    } else {
      for (long long c = lane; c < hidden; c += lanes) {
        float acc = 0.0f;
        for (int j = 0; j < k; ++j) {
          const long long row = slot_rows[j];
          if (row < 0 || row >= rows) continue;
          acc += slot_weights[j] * convert<float>(y[row * hidden + c]);
        }
        dst[c] = convert<T>(acc);
      }
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(256)
    moe_glu(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ h, long long rows,
            long long cols, long long ldg, long long ldu, long long ldh, int activation, int lanes,
            int vector) {
  constexpr int V = 16 / sizeof(T);
  const int group = static_cast<int>(threadIdx.x) / lanes;
  const int lane = static_cast<int>(threadIdx.x) % lanes;
  const long long per_block = blockDim.x / lanes;
  for (long long r = blockIdx.x * per_block + group; r < rows; r += gridDim.x * per_block) {
    const T* g_row = gate + r * ldg;
    const T* u_row = up + r * ldu;
    T* h_row = h + r * ldh;
    if (vector) {
      for (long long c = static_cast<long long>(lane) * V; c < cols; c += static_cast<long long>(lanes) * V) {
        const Pack<T, V> g = *reinterpret_cast<const Pack<T, V>*>(g_row + c);
        const Pack<T, V> u = *reinterpret_cast<const Pack<T, V>*>(u_row + c);
        Pack<T, V> result;
#pragma unroll
        for (int e = 0; e < V; ++e) {
          result.v[e] =
              convert<T>(matmul::activate(convert<float>(g.v[e]), activation) * convert<float>(u.v[e]));
        }
        *reinterpret_cast<Pack<T, V>*>(h_row + c) = result;
      }
    } else {
      for (long long c = lane; c < cols; c += lanes) {
        h_row[c] =
            convert<T>(matmul::activate(convert<float>(g_row[c]), activation) * convert<float>(u_row[c]));
      }
    }
  }
}

}  // namespace moe
}  // namespace ops
}  // namespace pygpukit
