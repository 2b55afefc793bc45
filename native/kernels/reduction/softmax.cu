// softmax and log_softmax along one axis, in float for fp16/bf16/fp8/float32 and in double for float64.
//
//   softmax_rows<T, A>(x, out, rows, count, lanes, log, layout)
//       the axis is contiguous in the input: a group of `lanes` threads owns a row, folds the running
//       maximum and sum of exponentials over it (reducers.cuh: LogSumExpR, a fixed order), then reads
//       it again (from cache for rows that fit) and writes exp(x - max) / sum, or x - max - log(sum)
//   softmax_rows_held<T, A, P>(x, out, rows, count, lanes, log, layout)
//       the same for rows of at most lanes * P * (16 / sizeof(T)) elements: each thread holds P packs of
//       its row in registers, so the row is read from memory once and each element is exponentiated
//       once; the maximum and then the sum are combined over the group in fixed trees
//   softmax_rows_shared<T, A>(x, out, rows, count, lanes, log, layout)
//       rows too long for softmax_rows_held (up to what dynamic shared memory holds: the host's limit),
//       one per block: the row is kept in shared memory as loaded, so it is read from memory once;
//       exp(x - max) is computed again for the output. The same fixed trees as softmax_rows_held.
//   softmax_apply<T, A>(out, x, stats, n, layout, log)
//       any layout: the statistics come from reduce_rows/reduce_cols<LogSumExpR<A>>, one per row,
//       and are broadcast along the axis (layout operand 2)
#include "../common/layout.cuh"
#include "reducers.cuh"

namespace pygpukit {
namespace ops {

struct SoftmaxLayout {
  int outer_ndim;
  index_t outer_shape[kMaxDims];
  index_t in_outer_strides[kMaxDims];
  index_t out_outer_strides[kMaxDims];
};

// `scale` is 1 / sum for softmax and log(sum) for log_softmax.
template <typename A>
__device__ __forceinline__ A softmax_value(A x, A max, A scale, int log) {
  return log ? x - max - scale : m_exp(x - max) * scale;
}

template <typename T, typename A>
__global__ void softmax_rows(const T* __restrict__ x, T* __restrict__ out, index_t rows, index_t count,
                             int lanes, int log, SoftmaxLayout layout) {
  using R = LogSumExpR<A>;
  using Acc = typename R::acc;
  const R r{0};
  constexpr int V = pack_width<T, T>();
  __shared__ Acc scratch[8];
  const int group = threadIdx.x / lanes;
  const int lane = threadIdx.x % lanes;
  const index_t row = static_cast<index_t>(blockIdx.x) * (blockDim.x / lanes) + group;
  const bool valid = row < rows;
  const T* in_row = x;
  T* out_row = out;
  bool aligned = false;
  Acc acc = r.identity();
  if (valid) {
    in_row = x + strided_offset(row, layout.outer_ndim, layout.outer_shape, layout.in_outer_strides);
    out_row = out + strided_offset(row, layout.outer_ndim, layout.outer_shape, layout.out_outer_strides);
    aligned = aligned_to(in_row, V * sizeof(T)) && aligned_to(out_row, V * sizeof(T));
    const index_t step = static_cast<index_t>(lanes) * V;
    index_t start = static_cast<index_t>(lane) * V;
    if (aligned) {
      for (; start + step + V <= count; start += 2 * step) {  // two loads in flight
        const Pack<T, V> first = *reinterpret_cast<const Pack<T, V>*>(in_row + start);
        const Pack<T, V> second = *reinterpret_cast<const Pack<T, V>*>(in_row + start + step);
#pragma unroll
        for (int j = 0; j < V; ++j) acc = fold(r, acc, convert<A>(first.v[j]), 0);
#pragma unroll
        for (int j = 0; j < V; ++j) acc = fold(r, acc, convert<A>(second.v[j]), 0);
      }
      for (; start + V <= count; start += step) {
        const Pack<T, V> pack = *reinterpret_cast<const Pack<T, V>*>(in_row + start);
#pragma unroll
        for (int j = 0; j < V; ++j) acc = fold(r, acc, convert<A>(pack.v[j]), 0);
      }
    }
    for (; start < count; start += step) {
      for (int j = 0; j < V && start + j < count; ++j) acc = fold(r, acc, convert<A>(in_row[start + j]), 0);
    }
  }
  const Acc stats = group_allreduce<R>(r, acc, lanes, scratch);
  if (!valid) return;
  const A scale = log ? m_log(stats.sum) : A(1) / stats.sum;
  for (index_t start = static_cast<index_t>(lane) * V; start < count;
       start += static_cast<index_t>(lanes) * V) {
    if (aligned && start + V <= count) {
      const Pack<T, V> pack = *reinterpret_cast<const Pack<T, V>*>(in_row + start);
      Pack<T, V> result;
#pragma unroll
      for (int j = 0; j < V; ++j)
        result.v[j] = convert<T>(softmax_value(convert<A>(pack.v[j]), stats.max, scale, log));
      *reinterpret_cast<Pack<T, V>*>(out_row + start) = result;
    } else {
      for (int j = 0; j < V && start + j < count; ++j) {
        out_row[start + j] = convert<T>(softmax_value(convert<A>(in_row[start + j]), stats.max, scale, log));
      }
    }
  }
}

// exp(x - max) for softmax_rows_held. In float it is exp2(x * log2(e) - max * log2(e)): one FFMA and
// the hardware exp2 (a relative error of about 2 ulp plus |x - max| * 2^-24 from the rounded product),
// instead of expf's longer range reduction; double keeps exp.
template <typename A>
struct HeldExp {
  A scaled_max;
  __device__ explicit HeldExp(A max) : scaled_max(max) {}
  __device__ A operator()(A v) const { return m_exp(v - scaled_max); }
};
template <>
struct HeldExp<float> {
  float scaled_max;
  __device__ explicit HeldExp(float max) : scaled_max(max * 1.4426950408889634f) {}
  __device__ float operator()(float v) const { return exp2f(fmaf(v, 1.4426950408889634f, -scaled_max)); }
};

__device__ __forceinline__ float held_max(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double held_max(double a, double b) { return fmax(a, b); }

// fmax over a group of `lanes` threads (every lane gets it), in a fixed butterfly: max is exact, so
// order is moot. `scratch` holds blockDim.x / 32 values; every thread of the block must call it.
template <typename A>
__device__ __forceinline__ A group_max(A top, int lanes, A* scratch) {
  for (int offset = 1; offset < (lanes < 32 ? lanes : 32); offset <<= 1) {
    top = held_max(top, shuffle_xor(top, offset));
  }
  if (lanes > 32) {
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x / 32] = top;
    __syncthreads();
    const int first = (threadIdx.x / lanes) * (lanes / 32);
    top = scratch[first];
    for (int w = 1; w < lanes / 32; ++w) top = held_max(top, scratch[first + w]);
    __syncthreads();
  }
  return top;
}

// A NaN anywhere in a row makes its sum NaN (exp(NaN - max)), so every output is NaN as NumPy's; the
// maximum may therefore ignore NaN (fmax). An infinite maximum makes exp(inf - inf) NaN the same way.
template <typename T, typename A, int P>
__global__ void __launch_bounds__(256)
    softmax_rows_held(const T* __restrict__ x, T* __restrict__ out, index_t rows, index_t count, int lanes,
                      int log, SoftmaxLayout layout) {
  constexpr int V = pack_width<T, T>();
  __shared__ A scratch[32];
  const SumR<A> sum_r{0};
  const int group = threadIdx.x / lanes;
  const int lane = threadIdx.x % lanes;
  const index_t row = static_cast<index_t>(blockIdx.x) * (blockDim.x / lanes) + group;
  const bool valid = row < rows;
  const T* in_row = x;
  T* out_row = out;
  A values[P][V];
  A top = Limits<A>::lowest();
  bool full = false;  // every pack of this thread is whole and aligned: no per-element checks
  if (valid) {
    in_row = x + strided_offset(row, layout.outer_ndim, layout.outer_shape, layout.in_outer_strides);
    out_row = out + strided_offset(row, layout.outer_ndim, layout.outer_shape, layout.out_outer_strides);
    full = aligned_to(in_row, V * sizeof(T)) && aligned_to(out_row, V * sizeof(T)) &&
           (static_cast<index_t>(P - 1) * lanes + lane + 1) * V <= count;
  }
  if (full) {
    Pack<T, V> packs[P];
#pragma unroll
    for (int p = 0; p < P; ++p) {  // every load in flight before any is used
      packs[p] = *reinterpret_cast<const Pack<T, V>*>(in_row + (static_cast<index_t>(p) * lanes + lane) * V);
    }
#pragma unroll
    for (int p = 0; p < P; ++p) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        values[p][j] = convert<A>(packs[p].v[j]);
        top = held_max(top, values[p][j]);
      }
    }
  } else {
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const index_t start = (static_cast<index_t>(p) * lanes + lane) * V;
#pragma unroll
      for (int j = 0; j < V; ++j) {  // padding is -inf: exp(-inf - max) adds 0
        values[p][j] = valid && start + j < count ? convert<A>(in_row[start + j]) : Limits<A>::lowest();
        top = held_max(top, values[p][j]);
      }
    }
  }
  top = group_max(top, lanes, scratch);
  const HeldExp<A> exp_shifted(top);
  A total = A(0);
#pragma unroll
  for (int p = 0; p < P; ++p) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const A e = exp_shifted(values[p][j]);
      total += e;
      values[p][j] = log ? values[p][j] - top : e;
    }
  }
  total = group_allreduce<SumR<A>>(sum_r, total, lanes, scratch);
  if (!valid) return;
  const A scale = log ? m_log(total) : A(1) / total;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const index_t start = (static_cast<index_t>(p) * lanes + lane) * V;
    Pack<T, V> result;
#pragma unroll
    for (int j = 0; j < V; ++j) result.v[j] = convert<T>(log ? values[p][j] - scale : values[p][j] * scale);
    if (full) {
      *reinterpret_cast<Pack<T, V>*>(out_row + start) = result;
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        if (start + j < count) out_row[start + j] = result.v[j];
      }
    }
  }
}

// One 16-byte global -> shared copy that bypasses registers (cp.async, sm_80 on; as gemm_common.cuh's
// cp_async_16, which this file does not include).
__device__ __forceinline__ void copy_async_16(unsigned dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}

// One row per block of `lanes` threads (blockDim.x); the row is kept in dynamic shared memory as
// loaded (16-byte packs, ceil(count / V) of them: the host sizes it), so it is read from memory once.
// Lane i owns packs i, i + lanes, ... and only ever reads back its own packs (no barrier needed for
// them); exp(x - max) is computed again for the output. At most 40 registers: three blocks of 512
// threads an SM, as shared memory allows three 64 KiB rows on an H100.
template <typename T, typename A>
__global__ void __launch_bounds__(512, 3)
    softmax_rows_shared(const T* __restrict__ x, T* __restrict__ out, index_t rows, index_t count, int lanes,
                        int log, SoftmaxLayout layout) {
  constexpr int V = pack_width<T, T>();
  extern __shared__ __align__(16) unsigned char softmax_row[];
  Pack<T, V>* held = reinterpret_cast<Pack<T, V>*>(softmax_row);
  __shared__ A scratch[32];
  const SumR<A> sum_r{0};
  const int lane = threadIdx.x;
  const index_t row = blockIdx.x;
  // Positions within a row fit an int (the host bounds the row by shared memory).
  const int n = static_cast<int>(count);
  const int packs = (n + V - 1) / V;
  const T* in_row = x + strided_offset(row, layout.outer_ndim, layout.outer_shape, layout.in_outer_strides);
  T* out_row = out + strided_offset(row, layout.outer_ndim, layout.outer_shape, layout.out_outer_strides);
  const bool aligned = aligned_to(in_row, V * sizeof(T)) && aligned_to(out_row, V * sizeof(T));
  const int whole = aligned ? n / V : 0;  // packs moved as one 16-byte load or store
  // Whole packs: copied to shared memory asynchronously (cp.async, sm_80 on), all of this lane's in
  // flight at once and none through registers. The rest (a misaligned row: all of it) element by
  // element, this lane's packs from `whole` on.
  for (int k = lane; k < whole; k += lanes) {
    copy_async_16(static_cast<unsigned>(__cvta_generic_to_shared(held + k)), in_row + k * V);
  }
  asm volatile("cp.async.commit_group;\n" ::);
  for (int k = whole + ((lane - whole) % lanes + lanes) % lanes; k < packs; k += lanes) {
    Pack<T, V> pack;
#pragma unroll
    for (int j = 0; j < V; ++j) pack.v[j] = in_row[k * V + j < n ? k * V + j : 0];  // past the end: unused
    held[k] = pack;
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");  // this lane's copies are visible to it
  A top = Limits<A>::lowest();
  for (int k = lane; k < packs; k += lanes) {
    const Pack<T, V> pack = held[k];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if (k < whole || k * V + j < n) top = held_max(top, convert<A>(pack.v[j]));
    }
  }
  top = group_max(top, lanes, scratch);
  const HeldExp<A> exp_shifted(top);
  A total = A(0);
  for (int k = lane; k < packs; k += lanes) {
    const Pack<T, V> pack = held[k];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if (k < whole || k * V + j < n) total += exp_shifted(convert<A>(pack.v[j]));
    }
  }
  total = group_allreduce<SumR<A>>(sum_r, total, lanes, scratch);
  const A scale = log ? m_log(total) : A(1) / total;
  for (int k = lane; k < packs; k += lanes) {
    const Pack<T, V> pack = held[k];
    Pack<T, V> result;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const A v = convert<A>(pack.v[j]);
      result.v[j] = convert<T>(log ? (v - top) - scale : exp_shifted(v) * scale);
    }
    if (k < whole) {
      *reinterpret_cast<Pack<T, V>*>(out_row + k * V) = result;
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        if (k * V + j < n) out_row[k * V + j] = result.v[j];
      }
    }
  }
}

template <typename T, typename A>
__global__ void softmax_apply(T* __restrict__ out, const T* __restrict__ x,
                              const SoftmaxStats<A>* __restrict__ stats, index_t n, Layout layout, int log) {
  const bool small = n <= kSmallSpace;
  for (index_t i = global_thread(); i < n; i += grid_threads()) {
    index_t offsets[3];
    layout_offsets<3>(layout, i, small, offsets);
    const SoftmaxStats<A> s = stats[offsets[2]];
    const A scale = log ? m_log(s.sum) : A(1) / s.sum;
    out[offsets[0]] = convert<T>(softmax_value(convert<A>(x[offsets[1]]), s.max, scale, log));
  }
}

}  // namespace ops
}  // namespace pygpukit
