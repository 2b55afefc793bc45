// Row normalisations over the last axis (pygpukit/ops/nn.py): rmsnorm, layernorm, l2norm, rmsnorm fused
// with the residual add, and group_norm (a row is one (sample, group) pair of a contiguous
// (N, C, *spatial) input). float32, fp16 and bf16 rows, statistics and arithmetic in float.
//
//   norm_rows<T, W, P>(args)      W: the weight/bias type (T or float)
//       a group of args.lanes threads (a power of two, up to 512) owns a row. P > 0: each thread
//       loads its at most P 16-byte packs of the row (pack q = lane + i * lanes) into registers once,
//       the group sums them in a fixed tree (reducers.cuh: group_allreduce), and the same registers give
//       the output, so the row is read from memory once. P == 0 (rows longer than 512 * 4 packs):
//       the same loops stream the row from memory once per pass (two passes, three when centred).
//
// Statistics: rmsnorm and add_rmsnorm: inv = rsqrt(mean(x^2) + eps); l2norm: inv = 1 / max(|x|, eps);
// layernorm and group_norm: mean first, then the variance as the mean of squared deviations from the
// registers (two-pass, no cancellation), inv = rsqrt(var + eps). Output: (x - mean) * inv * w + b in
// float, rounded once to T. add_rmsnorm stores new_residual = T(x + residual) first and normalises
// those rounded values (what rmsnorm(new_residual) gives). Every fold runs in an order fixed by the
// shape and `lanes`, without atomics: results are bitwise reproducible.
//
// `aligned` (set by the host when the row length is a multiple of the pack, every row start and the
// weight are 16-byte aligned, and for group_norm the spatial size is a multiple of the pack) selects
// 16-byte vector accesses; otherwise the same slots are read element by element.
#include "reducers.cuh"

namespace pygpukit {
namespace ops {

enum NormMode : int { kNormRms = 0, kNormLayer = 1, kNormL2 = 2, kNormAddRms = 3, kNormGroup = 4 };

struct NormArgs {
  const void* x;
  const void* residual;  // add_rmsnorm only
  const void* weight;    // null: 1
  const void* bias;      // null: 0
  void* out;
  void* residual_out;  // add_rmsnorm only (may be residual or x itself)
  index_t rows;
  index_t count;     // elements per row
  index_t x_stride;  // row strides in elements
  index_t residual_stride;
  index_t out_stride;
  index_t residual_out_stride;
  index_t spatial;  // group_norm: elements per channel
  int channels_per_group;
  int groups;
  int mode;
  int lanes;
  int aligned;
  float eps;
};

template <typename T>
__device__ __forceinline__ void norm_load(const T* row, index_t first, index_t count, bool aligned,
                                          float (&v)[16 / sizeof(T)]) {
  constexpr int V = 16 / sizeof(T);
  if (aligned) {
    const Pack<T, V> p = *reinterpret_cast<const Pack<T, V>*>(row + first);
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = convert<float>(p.v[j]);
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = first + j < count ? convert<float>(row[first + j]) : 0.0f;
  }
}

template <typename T>
__device__ __forceinline__ void norm_store(T* row, index_t first, index_t count, bool aligned,
                                           const float (&v)[16 / sizeof(T)]) {
  constexpr int V = 16 / sizeof(T);
  if (aligned) {
    Pack<T, V> p;
#pragma unroll
    for (int j = 0; j < V; ++j) p.v[j] = convert<T>(v[j]);
    *reinterpret_cast<Pack<T, V>*>(row + first) = p;
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if (first + j < count) row[first + j] = convert<T>(v[j]);
    }
  }
}

// The weight and bias of the V elements from `first` on of row `row` (1 and 0 where absent).
template <typename T, typename W>
__device__ __forceinline__ void norm_affine(const NormArgs& a, index_t row, index_t first, bool aligned,
                                            float (&w)[16 / sizeof(T)], float (&b)[16 / sizeof(T)]) {
  constexpr int V = 16 / sizeof(T);
  const W* __restrict__ weight = static_cast<const W*>(a.weight);
  const W* __restrict__ bias = static_cast<const W*>(a.bias);
  if (a.mode == kNormGroup) {
    const index_t channel0 = (row % a.groups) * a.channels_per_group;
    if (aligned) {  // spatial is a multiple of V: the pack lies in one channel
      const index_t channel = channel0 + first / a.spatial;
      const float wc = weight != nullptr ? convert<float>(weight[channel]) : 1.0f;
      const float bc = bias != nullptr ? convert<float>(bias[channel]) : 0.0f;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        w[j] = wc;
        b[j] = bc;
      }
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const index_t e = first + j < a.count ? first + j : a.count - 1;
        const index_t channel = channel0 + e / a.spatial;
        w[j] = weight != nullptr ? convert<float>(weight[channel]) : 1.0f;
        b[j] = bias != nullptr ? convert<float>(bias[channel]) : 0.0f;
      }
    }
    return;
  }
  if (aligned) {
    if (weight != nullptr) {
      const Pack<W, V> p = *reinterpret_cast<const Pack<W, V>*>(weight + first);
#pragma unroll
      for (int j = 0; j < V; ++j) w[j] = convert<float>(p.v[j]);
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) w[j] = 1.0f;
    }
    if (bias != nullptr) {
      const Pack<W, V> p = *reinterpret_cast<const Pack<W, V>*>(bias + first);
#pragma unroll
      for (int j = 0; j < V; ++j) b[j] = convert<float>(p.v[j]);
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) b[j] = 0.0f;
    }
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const bool inside = first + j < a.count;
      w[j] = weight != nullptr && inside ? convert<float>(weight[first + j]) : 1.0f;
      b[j] = bias != nullptr && inside ? convert<float>(bias[first + j]) : 0.0f;
    }
  }
}

// x + residual rounded to T (the new residual stream), back in float.
template <typename T>
__device__ __forceinline__ float round_to(float v) {
  return convert<float>(convert<T>(v));
}

template <typename T, typename W, int P>
__global__ void __launch_bounds__(512) norm_rows(NormArgs a) {
  constexpr int V = 16 / sizeof(T);
  using R = SumR<float>;
  const R r{0};
  __shared__ float scratch[32];
  const int lanes = a.lanes;
  const int lane = static_cast<int>(threadIdx.x) % lanes;
  const index_t row = static_cast<index_t>(blockIdx.x) * (blockDim.x / lanes) + threadIdx.x / lanes;
  const bool valid = row < a.rows;
  const index_t at = valid ? row : 0;
  const bool aligned = a.aligned != 0;
  const index_t count = a.count;
  const index_t packs = (count + V - 1) / V;
  const int mode = a.mode;
  const bool add = mode == kNormAddRms;
  const bool centred = mode == kNormLayer || mode == kNormGroup;
  const T* x = static_cast<const T*>(a.x) + at * a.x_stride;
  const T* residual = add ? static_cast<const T*>(a.residual) + at * a.residual_stride : nullptr;
  T* residual_out = add ? static_cast<T*>(a.residual_out) + at * a.residual_out_stride : nullptr;
  T* out = static_cast<T*>(a.out) + at * a.out_stride;
  const float n = static_cast<float>(count);

  if constexpr (P > 0) {
    float v[P][V];
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const index_t q = lane + static_cast<index_t>(i) * lanes;
      if (valid && q < packs) {
        norm_load<T>(x, q * V, count, aligned, v[i]);
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) v[i][j] = 0.0f;
      }
    }
    if (add) {  // every load is issued before the first store: residual_out may be residual or x
      float u[P][V];
#pragma unroll
      for (int i = 0; i < P; ++i) {
        const index_t q = lane + static_cast<index_t>(i) * lanes;
        if (valid && q < packs) {
          norm_load<T>(residual, q * V, count, aligned, u[i]);
        } else {
#pragma unroll
          for (int j = 0; j < V; ++j) u[i][j] = 0.0f;
        }
      }
#pragma unroll
      for (int i = 0; i < P; ++i) {
        const index_t q = lane + static_cast<index_t>(i) * lanes;
#pragma unroll
        for (int j = 0; j < V; ++j) v[i][j] = round_to<T>(v[i][j] + u[i][j]);
        if (valid && q < packs) norm_store<T>(residual_out, q * V, count, aligned, v[i]);
      }
    }
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < P; ++i) {
#pragma unroll
      for (int j = 0; j < V; ++j) s += centred ? v[i][j] : v[i][j] * v[i][j];
    }
    s = group_allreduce<R>(r, s, lanes, scratch);
    float mean = 0.0f;
    float inv;
    if (centred) {
      mean = s / n;
      float d2 = 0.0f;
#pragma unroll
      for (int i = 0; i < P; ++i) {
        const index_t first = (lane + static_cast<index_t>(i) * lanes) * V;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float d = first + j < count ? v[i][j] - mean : 0.0f;
          d2 += d * d;
        }
      }
      d2 = group_allreduce<R>(r, d2, lanes, scratch);
      inv = rsqrtf(d2 / n + a.eps);
    } else if (mode == kNormL2) {
      inv = 1.0f / fmaxf(sqrtf(s), a.eps);
    } else {
      inv = rsqrtf(s / n + a.eps);
    }
    if (!valid) return;
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const index_t q = lane + static_cast<index_t>(i) * lanes;
      if (q < packs) {
        float w[V], b[V], y[V];
        norm_affine<T, W>(a, row, q * V, aligned, w, b);
#pragma unroll
        for (int j = 0; j < V; ++j) y[j] = (v[i][j] - mean) * inv * w[j] + b[j];
        norm_store<T>(out, q * V, count, aligned, y);
      }
    }
  } else {
    // Long rows: stream the row once per pass. A thread re-reads only what it wrote itself.
    const T* source = add ? residual_out : x;
    float s = 0.0f;
    if (valid) {
      for (index_t q = lane; q < packs; q += lanes) {
        float v[V];
        norm_load<T>(x, q * V, count, aligned, v);
        if (add) {
          float u[V];
          norm_load<T>(residual, q * V, count, aligned, u);
#pragma unroll
          for (int j = 0; j < V; ++j) v[j] = round_to<T>(v[j] + u[j]);
          norm_store<T>(residual_out, q * V, count, aligned, v);
        }
#pragma unroll
        for (int j = 0; j < V; ++j) s += centred ? v[j] : v[j] * v[j];
      }
    }
    s = group_allreduce<R>(r, s, lanes, scratch);
    float mean = 0.0f;
    float inv;
    if (centred) {
      mean = s / n;
      float d2 = 0.0f;
      if (valid) {
        for (index_t q = lane; q < packs; q += lanes) {
          float v[V];
          norm_load<T>(x, q * V, count, aligned, v);
#pragma unroll
          for (int j = 0; j < V; ++j) {
            const float d = q * V + j < count ? v[j] - mean : 0.0f;
            d2 += d * d;
          }
        }
      }
      d2 = group_allreduce<R>(r, d2, lanes, scratch);
      inv = rsqrtf(d2 / n + a.eps);
    } else if (mode == kNormL2) {
      inv = 1.0f / fmaxf(sqrtf(s), a.eps);
    } else {
      inv = rsqrtf(s / n + a.eps);
    }
    if (!valid) return;
    for (index_t q = lane; q < packs; q += lanes) {
      float v[V], w[V], b[V];
      norm_load<T>(source, q * V, count, aligned, v);
      norm_affine<T, W>(a, row, q * V, aligned, w, b);
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] = (v[j] - mean) * inv * w[j] + b[j];
      norm_store<T>(out, q * V, count, aligned, v);
    }
  }
}

}  // namespace ops
}  // namespace pygpukit
