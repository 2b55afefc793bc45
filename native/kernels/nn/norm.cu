// Row normalisations over the last axis (pygpukit/ops/norms.py): rmsnorm, layernorm, l2norm, rmsnorm fused
// with the residual add, and group_norm (a row is one (sample, group) pair of a contiguous
// (N, C, *spatial) input). float32, fp16 and bf16 rows, statistics and arithmetic in float.
//
//   norm_rows<T, W, P, Full>(args)      W: the weight/bias type (T or float)
//       a group of args.lanes threads owns a row: a power of two up to 32 (blockDim.x / lanes rows a
//       block, blockDim.x a power of two), or a multiple of 32 up to 1024 (the whole block). P > 0: each
//       thread loads its P 16-byte packs of the row (pack q = lane + i * lanes) into registers once (P <= 4:
//       as P * 16 / sizeof(T) floats, 4 to 32; P = 5, 7, 9: as raw words, see NormHeld), the group sums them
//       (warp shuffles, then one shared-memory exchange between the warps of the group), and the same
//       registers give the output: the row is read from memory once. Full: the host guarantees that the row
//       exactly fills the group (packs == P * lanes) and is aligned, so there are no bounds checks at all.
//       Otherwise a thread checks each of its packs (a predicate per pack) and unaligned rows go element
//       by element. The host launches P = 5, 7, 9 only as Full, with lanes <= 32 (rows such as 576 or 896
//       bf16 values, 576 float32, which no power-of-two group of at most 4 packs a thread fills).
//       P == 0 (rows longer than 1024 * 4 packs): the same loops stream the row from memory once per
//       pass (two passes, three when centred).
//
// Statistics: rmsnorm and add_rmsnorm: inv = rsqrt(mean(x^2) + eps); l2norm: inv = 1 / max(|x|, eps);
// layernorm and group_norm: mean first, then the variance as the mean of squared deviations from the
// registers (two-pass, no cancellation), inv = rsqrt(var + eps). Output: (x - mean) * inv * w + b in
// float (x * inv * w when not centred), rounded once to T. add_rmsnorm stores new_residual =
// T(x + residual) first and normalises those rounded values (what rmsnorm(new_residual) gives). Every
// fold runs in an order fixed by the shape and `lanes` (per-thread partial sums in four interleaved
// accumulators, then xor-butterfly trees, whose result is bitwise the same in every lane), without
// atomics: results are bitwise reproducible.
//
// `aligned` (set by the host when the row length is a multiple of the pack, every row start and the
// weight are 16-byte aligned, and for group_norm the spatial size is a multiple of the pack) selects
// 16-byte vector accesses; otherwise the same slots are read element by element.
#include "../common/codes.cuh"
#include "../common/overlap.cuh"
#include "../reduction/reducers.cuh"

namespace pygpukit {
namespace ops {

// pygpukit/ops/norms.py declares it as a KernelStruct (the compile check asserts the layout); `mode`
// is a NormMode code of common/codes.cuh.
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
  if (a.mode == codes::kNormGroup) {
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

constexpr int kNormMaxThreads = 1024;  // the largest group (lanes) and block

// 16-byte words of V elements of E in registers, and their conversion to and from float (one
// instruction per element or pair: bf16 widens by a shift, pairs narrow with one cvt.rn.*x2; the
// word helpers of common/convert.cuh).
template <typename E, int V>
struct alignas(16) NormRaw {
  static constexpr int kWords = V * static_cast<int>(sizeof(E)) / 4;
  unsigned u[kWords];
};

template <typename E, int V>
__device__ __forceinline__ void raw_zero(NormRaw<E, V>& r) {
#pragma unroll
  for (int k = 0; k < NormRaw<E, V>::kWords; ++k) r.u[k] = 0u;
}

template <typename E, int V>
__device__ __forceinline__ void raw_load(NormRaw<E, V>& r, const E* p) {  // p: 16-byte aligned
#pragma unroll
  for (int k = 0; k < NormRaw<E, V>::kWords / 4; ++k) {
    const uint4 w = reinterpret_cast<const uint4*>(p)[k];
    r.u[4 * k] = w.x;
    r.u[4 * k + 1] = w.y;
    r.u[4 * k + 2] = w.z;
    r.u[4 * k + 3] = w.w;
  }
}

template <typename E, int V>
__device__ __forceinline__ void raw_store(E* p, const NormRaw<E, V>& r) {
#pragma unroll
  for (int k = 0; k < NormRaw<E, V>::kWords / 4; ++k) {
    reinterpret_cast<uint4*>(p)[k] = make_uint4(r.u[4 * k], r.u[4 * k + 1], r.u[4 * k + 2], r.u[4 * k + 3]);
  }
}

// Element j of a pack, as bits (unaligned rows move element by element, still through packs).
template <typename E, int V>
__device__ __forceinline__ void raw_set(NormRaw<E, V>& r, int j, E value) {
  if constexpr (sizeof(E) == 4) {
    memcpy(&r.u[j], &value, 4);
  } else {
    unsigned short bits;
    memcpy(&bits, &value, 2);
    r.u[j / 2] |= static_cast<unsigned>(bits) << (16 * (j % 2));
  }
}
template <typename E, int V>
__device__ __forceinline__ E raw_get(const NormRaw<E, V>& r, int j) {
  E value;
  if constexpr (sizeof(E) == 4) {
    memcpy(&value, &r.u[j], 4);
  } else {
    const unsigned short bits = static_cast<unsigned short>(r.u[j / 2] >> (16 * (j % 2)));
    memcpy(&value, &bits, 2);
  }
  return value;
}

// Stores pack q of a row (count elements): one 16-byte store when the row is aligned, else the
// elements that lie inside the row one by one.
template <typename E, int V>
__device__ __forceinline__ void store_pack(E* row, int q, int count, bool aligned, const NormRaw<E, V>& r) {
  if (aligned) {
    raw_store(row + q * V, r);
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if (q * V + j < count) row[q * V + j] = raw_get(r, j);
    }
  }
}

template <typename E, int V>
__device__ __forceinline__ void raw_unpack(const NormRaw<E, V>& r, float (&f)[V]) {
  if constexpr (sizeof(E) == 4) {
#pragma unroll
    for (int j = 0; j < V; ++j) f[j] = __uint_as_float(r.u[j]);
  } else {
#pragma unroll
    for (int k = 0; k < V / 2; ++k) {
      const float2 t = word_to_float2<E>(r.u[k]);
      f[2 * k] = t.x;
      f[2 * k + 1] = t.y;
    }
  }
}

template <typename E, int V>
__device__ __forceinline__ void raw_pack(NormRaw<E, V>& r, const float (&f)[V]) {
  if constexpr (sizeof(E) == 4) {
#pragma unroll
    for (int j = 0; j < V; ++j) r.u[j] = __float_as_uint(f[j]);
  } else {
#pragma unroll
    for (int k = 0; k < V / 2; ++k) r.u[k] = float2_to_word<E>(f[2 * k], f[2 * k + 1]);
  }
}

// Element j of a pack as float (one instruction: bf16 by a shift or a mask, fp16 by one cvt).
template <typename E, int V>
__device__ __forceinline__ float raw_float(const NormRaw<E, V>& r, int j) {
  if constexpr (sizeof(E) == 4) {
    return __uint_as_float(r.u[j]);
  } else {
    return word_half_to_float<E>(r.u[j / 2], j % 2 != 0);
  }
}

// The packs a thread holds (pack i of the thread: pack q = lane + i * lanes of the row). Up to
// kNormFloatPacks packs: as floats, converted once. More (norm_rows with P up to 9, for rows that
// exactly fill a small group, such as 576 bf16 values in 8 lanes of 9 packs): as the raw 16-byte words
// (fp16/bf16: half the registers), converted again each time a pack is read (exact, so the values and
// every sum are the same bits either way).
constexpr int kNormFloatPacks = 4;

template <typename T, int P, bool Floats = (P <= kNormFloatPacks)>
struct NormHeld {
  static constexpr int kPacks = P;
  static constexpr int V = 16 / sizeof(T);
  float f[P][V];
  __device__ __forceinline__ void hold(const NormRaw<T, V> (&r)[P]) {
#pragma unroll
    for (int i = 0; i < P; ++i) raw_unpack(r[i], f[i]);
  }
  __device__ __forceinline__ float at(int i, int j) const { return f[i][j]; }
};

template <typename T, int P>
struct NormHeld<T, P, false> {
  static constexpr int kPacks = P;
  static constexpr int V = 16 / sizeof(T);
  NormRaw<T, V> r[P];
  __device__ __forceinline__ void hold(const NormRaw<T, V> (&raw)[P]) {
#pragma unroll
    for (int i = 0; i < P; ++i) r[i] = raw[i];
  }
  __device__ __forceinline__ float at(int i, int j) const { return raw_float(r[i], j); }
};

// The sum of `value` over the `lanes` threads of a group (see norm_rows), in every thread of the group:
// an xor butterfly inside the warp (both partners add the same two values: the same bits in every
// lane), then, for groups of several warps, one exchange of the warp sums through `scratch` (one slot
// per warp) and a butterfly over them (such a group is the whole block). Every thread of the block
// must call it.
__device__ __forceinline__ float norm_allreduce(float value, int lanes, float* scratch) {
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    if (offset < lanes) value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  if (lanes > 32) {
    const int lane = threadIdx.x & 31;
    const int warps = lanes >> 5;
    if (lane == 0) scratch[threadIdx.x >> 5] = value;
    __syncthreads();
    value = lane < warps ? scratch[lane] : 0.0f;  // groups of several warps are whole blocks
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

// Four interleaved accumulators (independent dependency chains), combined in a fixed tree.
template <typename Held>
__device__ __forceinline__ float norm_sum(const Held& v, bool squares) {
  constexpr int P = Held::kPacks;
  constexpr int V = Held::V;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (squares) {
#pragma unroll
    for (int i = 0; i < P; ++i) {
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j % 4] = fmaf(v.at(i, j), v.at(i, j), acc[j % 4]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < P; ++i) {
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j % 4] += v.at(i, j);
    }
  }
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

// The output of the held packs (pack q = lane + i * lanes holds the V elements from q * V on; packs
// beyond the row are skipped unless Full). Not centred: y = v * inv * w; centred: y = (v - mean) * inv
// * w + b (one fma when there is a bias); w = 1 and b = 0 where absent; rounded once to T.
template <typename T, typename W, int P, bool Full, bool Centred, bool HasW, bool HasB>
__device__ __forceinline__ void norm_emit(const NormArgs& a, T* out, const NormHeld<T, P>& v, int lane,
                                          int lanes, int packs, int count, bool aligned, float mean,
                                          float inv) {
  constexpr int V = 16 / sizeof(T);
  const W* weight = static_cast<const W*>(a.weight);
  const W* bias = static_cast<const W*>(a.bias);
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const int q = lane + i * lanes;
    if (!Full && q >= packs) continue;
    float w[V], b[V], y[V];
    if (Full || aligned) {
      if constexpr (HasW) {
        NormRaw<W, V> r;
        raw_load(r, weight + q * V);
        raw_unpack(r, w);
      }
      if constexpr (HasB) {
        NormRaw<W, V> r;
        raw_load(r, bias + q * V);
        raw_unpack(r, b);
      }
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const int e = q * V + j < count ? q * V + j : count - 1;
        if constexpr (HasW) w[j] = convert<float>(weight[e]);
        if constexpr (HasB) b[j] = convert<float>(bias[e]);
      }
    }
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float t = Centred ? (v.at(i, j) - mean) * inv : v.at(i, j) * inv;
      if constexpr (HasB) {
        y[j] = fmaf(t, HasW ? w[j] : 1.0f, b[j]);
      } else {
        y[j] = HasW ? t * w[j] : t;
      }
    }
    if (Full || aligned) {
      NormRaw<T, V> r;
      raw_pack(r, y);
      raw_store(out + q * V, r);
    } else {
      norm_store<T>(out, static_cast<index_t>(q) * V, count, false, y);
    }
  }
}

// group_norm's output: the weight and bias of a channel (spatial elements of the row each). Aligned
// rows have spatial a multiple of V, so a pack lies in one channel.
template <typename T, typename W, int P, bool Full>
__device__ __forceinline__ void norm_emit_group(const NormArgs& a, index_t row, T* out,
                                                const NormHeld<T, P>& v, int lane, int lanes, int packs,
                                                int count, bool aligned, float mean, float inv) {
  constexpr int V = 16 / sizeof(T);
  const W* weight = static_cast<const W*>(a.weight);
  const W* bias = static_cast<const W*>(a.bias);
  const int channel0 = static_cast<int>(row % a.groups) * a.channels_per_group;
  const unsigned spatial = static_cast<unsigned>(a.spatial);  // at most count here
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const int q = lane + i * lanes;
    if (!Full && q >= packs) continue;
    float y[V];
    if (Full || aligned) {
      const int channel = channel0 + static_cast<int>(static_cast<unsigned>(q * V) / spatial);
      const float w = weight != nullptr ? convert<float>(weight[channel]) : 1.0f;
      const float b = bias != nullptr ? convert<float>(bias[channel]) : 0.0f;
#pragma unroll
      for (int j = 0; j < V; ++j) y[j] = fmaf((v.at(i, j) - mean) * inv, w, b);
      NormRaw<T, V> r;
      raw_pack(r, y);
      raw_store(out + q * V, r);
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const int e = q * V + j < count ? q * V + j : count - 1;
        const int channel = channel0 + static_cast<int>(static_cast<unsigned>(e) / spatial);
        const float w = weight != nullptr ? convert<float>(weight[channel]) : 1.0f;
        const float b = bias != nullptr ? convert<float>(bias[channel]) : 0.0f;
        y[j] = fmaf((v.at(i, j) - mean) * inv, w, b);
      }
      norm_store<T>(out, static_cast<index_t>(q) * V, count, false, y);
    }
  }
}

template <typename T, typename W, int P, bool Full>
__global__ void __launch_bounds__(kNormMaxThreads, 1) norm_rows(NormArgs a) {
  overlap_wait();  // programmatic launch: the rows come from the kernels before
  constexpr int V = 16 / sizeof(T);
  __shared__ float scratch[2][kNormMaxThreads / 32];
  // lanes <= 32: a power of two, blockDim.x / lanes rows a block; lanes > 32: one row a block.
  const int lanes = a.lanes;
  const int shift = lanes <= 32 ? __ffs(lanes) - 1 : 10;
  const int lane = lanes <= 32 ? static_cast<int>(threadIdx.x) & (lanes - 1) : static_cast<int>(threadIdx.x);
  const index_t row = lanes <= 32 ? (static_cast<index_t>(blockIdx.x) << (__ffs(blockDim.x) - 1 - shift)) +
                                        static_cast<index_t>(threadIdx.x >> shift)
                                  : static_cast<index_t>(blockIdx.x);
  const bool valid = row < a.rows;
  const index_t at = valid ? row : a.rows - 1;  // idle groups redo the last row and store nothing
  const int mode = a.mode;
  const bool add = mode == codes::kNormAddRms;
  const bool centred = mode == codes::kNormLayer || mode == codes::kNormGroup;
  const T* x = static_cast<const T*>(a.x) + at * a.x_stride;
  const T* residual = add ? static_cast<const T*>(a.residual) + at * a.residual_stride : nullptr;
  T* residual_out = add ? static_cast<T*>(a.residual_out) + at * a.residual_out_stride : nullptr;
  T* out = static_cast<T*>(a.out) + at * a.out_stride;
  const float n = static_cast<float>(a.count);

  if constexpr (P > 0) {
    const bool aligned = Full || a.aligned != 0;
    const int count = static_cast<int>(a.count);  // at most kNormMaxThreads * P * V
    const int packs = (count + V - 1) / V;
    // Every load is issued before the first store: residual_out may be residual or x. Unaligned rows
    // fill the same packs element by element (zeros beyond the row).
    auto load = [&](NormRaw<T, V>& r, const T* source, int q) {
      if (aligned) {
        raw_load(r, source + q * V);
      } else {
        raw_zero(r);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          if (q * V + j < count) raw_set(r, j, source[q * V + j]);
        }
      }
    };
    NormRaw<T, V> rx[P];
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int q = lane + i * lanes;
      if (Full || q < packs) {
        load(rx[i], x, q);
      } else {
        raw_zero(rx[i]);
      }
    }
    if (add && P <= kNormFloatPacks) {
      NormRaw<T, V> rr[P];
#pragma unroll
      for (int i = 0; i < P; ++i) {
        const int q = lane + i * lanes;
        if (Full || q < packs) {
          load(rr[i], residual, q);
        } else {
          raw_zero(rr[i]);
        }
      }
#pragma unroll
      for (int i = 0; i < P; ++i) {
        const int q = lane + i * lanes;
        float f[V], g[V];
        raw_unpack(rx[i], f);
        raw_unpack(rr[i], g);
#pragma unroll
        for (int j = 0; j < V; ++j) f[j] += g[j];
        raw_pack(rx[i], f);  // the new residual, rounded to T (zeros stay zeros)
        if (valid && (Full || q < packs)) store_pack(residual_out, q, count, aligned, rx[i]);
      }
    } else if (add) {
      // Many packs: a residual pack at a time (registers), each stored as the new residual before the
      // next one is read. A thread stores only packs it has read itself: residual_out may be residual or x.
#pragma unroll
      for (int i = 0; i < P; ++i) {
        const int q = lane + i * lanes;
        NormRaw<T, V> rr;
        if (Full || q < packs) {
          load(rr, residual, q);
        } else {
          raw_zero(rr);
        }
        float f[V], g[V];
        raw_unpack(rx[i], f);
        raw_unpack(rr, g);
#pragma unroll
        for (int j = 0; j < V; ++j) f[j] += g[j];
        raw_pack(rx[i], f);
        if (valid && (Full || q < packs)) store_pack(residual_out, q, count, aligned, rx[i]);
      }
    }
    NormHeld<T, P> v;
    v.hold(rx);

    const float s = norm_allreduce(norm_sum(v, !centred), lanes, scratch[0]);
    float mean = 0.0f;
    float inv;
    if (centred) {
      mean = s / n;
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int i = 0; i < P; ++i) {
        const int first = (lane + i * lanes) * V;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float d = v.at(i, j) - mean;
          if (Full || first + j < count) acc[j % 4] = fmaf(d, d, acc[j % 4]);
        }
      }
      const float d2 = norm_allreduce((acc[0] + acc[1]) + (acc[2] + acc[3]), lanes, scratch[1]);
      inv = rsqrtf(d2 / n + a.eps);
    } else if (mode == codes::kNormL2) {
      inv = 1.0f / fmaxf(sqrtf(s), a.eps);
    } else {
      inv = rsqrtf(s / n + a.eps);
    }
    if (!valid) return;
    const bool has_w = a.weight != nullptr;
    const bool has_b = a.bias != nullptr;
    if (mode == codes::kNormGroup) {
      norm_emit_group<T, W, P, Full>(a, row, out, v, lane, lanes, packs, count, aligned, mean, inv);
    } else if (!centred) {
      if (has_w) {
        norm_emit<T, W, P, Full, false, true, false>(a, out, v, lane, lanes, packs, count, aligned, mean,
                                                     inv);
      } else {
        norm_emit<T, W, P, Full, false, false, false>(a, out, v, lane, lanes, packs, count, aligned, mean,
                                                      inv);
      }
    } else if (has_w && has_b) {
      norm_emit<T, W, P, Full, true, true, true>(a, out, v, lane, lanes, packs, count, aligned, mean, inv);
    } else if (has_w) {
      norm_emit<T, W, P, Full, true, true, false>(a, out, v, lane, lanes, packs, count, aligned, mean, inv);
    } else if (has_b) {
      norm_emit<T, W, P, Full, true, false, true>(a, out, v, lane, lanes, packs, count, aligned, mean, inv);
    } else {
      norm_emit<T, W, P, Full, true, false, false>(a, out, v, lane, lanes, packs, count, aligned, mean, inv);
    }
  } else {
    // Long rows: stream the row once per pass. A thread re-reads only what it wrote itself.
    const bool aligned = a.aligned != 0;
    const index_t count = a.count;
    const index_t packs = (count + V - 1) / V;
    const T* source = add ? residual_out : x;
    float s = 0.0f;
    for (index_t q = lane; q < packs; q += lanes) {
      float v[V];
      norm_load<T>(x, q * V, count, aligned, v);
      if (add) {
        float u[V];
        norm_load<T>(residual, q * V, count, aligned, u);
#pragma unroll
        for (int j = 0; j < V; ++j) v[j] = round_to<T>(v[j] + u[j]);
        if (valid) norm_store<T>(residual_out, q * V, count, aligned, v);
      }
      if (centred) {
#pragma unroll
        for (int j = 0; j < V; ++j) s += v[j];
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) s = fmaf(v[j], v[j], s);
      }
    }
    s = norm_allreduce(s, lanes, scratch[0]);
    float mean = 0.0f;
    float inv;
    if (centred) {
      mean = s / n;
      float d2 = 0.0f;
      for (index_t q = lane; q < packs; q += lanes) {
        float v[V];
        norm_load<T>(x, q * V, count, aligned, v);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float d = q * V + j < count ? v[j] - mean : 0.0f;
          d2 = fmaf(d, d, d2);
        }
      }
      d2 = norm_allreduce(d2, lanes, scratch[1]);
      inv = rsqrtf(d2 / n + a.eps);
    } else if (mode == codes::kNormL2) {
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
      for (int j = 0; j < V; ++j) v[j] = fmaf((v[j] - mean) * inv, w[j], b[j]);
      norm_store<T>(out, q * V, count, aligned, v);
    }
  }
}

}  // namespace ops
}  // namespace pygpukit
