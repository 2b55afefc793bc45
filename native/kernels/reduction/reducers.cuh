// Reductions as accumulators, and the fixed-order trees that combine them. A reducer R<A> is a small
// object (its `mode` picks a variant at run time, so one kernel serves sum and mean, max and min, ...):
//   value                  the type an element converts to before it is folded in
//   acc                    the accumulator (trivially copyable: it is shuffled between lanes and
//                          stored as the partial result of the first of two passes)
//   identity()             the empty accumulator
//   element(v, k)          one element of value v at position k of the reduced index space
//   combine(a, b)          a followed by b
//   finish(a, count, ddof) the result; kScalarResult: a number stored in the output dtype, else the
//                          accumulator itself is the result (the softmax statistics)
//   kBatch                 16-byte loads a thread keeps in flight in the contiguous row kernels (more
//                          for cheap folds; each costs code in every instantiation)
// Nothing here uses atomics: every kernel folds elements in an order fixed by the shape alone, so a
// given input and layout give bitwise the same result on every run.
#pragma once

#include "../elementwise/functors.cuh"

namespace pygpukit {
namespace ops {

template <typename A>
struct SumR {  // mode: codes::kReduceSum or kReduceMean
  using value = A;
  using acc = A;
  static constexpr bool kScalarResult = true;
  static constexpr int kBatch = 4;
  int mode;
  __device__ acc identity() const { return A(0); }
  __device__ acc element(value v, index_t) const { return v; }
  __device__ acc combine(acc a, acc b) const { return Add<A>()(a, b); }
  __device__ A finish(acc a, index_t count, index_t) const {
    if constexpr (is_floating<A>()) {
      if (mode == codes::kReduceMean) return a / static_cast<A>(count);
    }
    return a;
  }
};

template <typename A>
struct ProdR {
  using value = A;
  using acc = A;
  static constexpr bool kScalarResult = true;
  static constexpr int kBatch = 1;
  int mode;
  __device__ acc identity() const { return A(1); }
  __device__ acc element(value v, index_t) const { return v; }
  __device__ acc combine(acc a, acc b) const { return Mul<A>()(a, b); }
  __device__ A finish(acc a, index_t, index_t) const { return a; }
};

// mode: codes::kReduceMax or kReduceMin. NaN propagates; for bool max is any and min is all.
template <typename A>
struct ExtremeR {
  using value = A;
  using acc = A;
  static constexpr bool kScalarResult = true;
  static constexpr int kBatch = 4;
  int mode;
  __device__ acc identity() const {
    return mode == codes::kReduceMax ? Limits<A>::lowest() : Limits<A>::highest();
  }
  __device__ acc element(value v, index_t) const { return v; }
  __device__ acc combine(acc a, acc b) const {
    return mode == codes::kReduceMax ? Maximum<A>()(a, b) : Minimum<A>()(a, b);
  }
  __device__ A finish(acc a, index_t, index_t) const { return a; }
};

template <typename A>
struct ArgAcc {
  A value;
  index_t index;
};

// mode: codes::kReduceArgmax or kReduceArgmin. The first index of the extreme value wins; a NaN counts as the
// extreme (NumPy's rule). The combine compares indices, so it does not depend on the order of its operands.
template <typename A>
struct ArgR {
  using value = A;
  using acc = ArgAcc<A>;
  static constexpr bool kScalarResult = true;
  static constexpr int kBatch = 2;
  int mode;
  __device__ acc identity() const {
    return {mode == codes::kReduceArgmax ? Limits<A>::lowest() : Limits<A>::highest(),
            static_cast<index_t>(0x7fffffffffffffffLL)};
  }
  __device__ acc element(value v, index_t k) const { return {v, k}; }
  __device__ acc combine(acc a, acc b) const {
    const bool a_nan = is_nan(a.value);
    const bool b_nan = is_nan(b.value);
    if (a_nan || b_nan) {
      if (a_nan && b_nan) return a.index <= b.index ? a : b;
      return a_nan ? a : b;
    }
    if (a.value == b.value) return a.index <= b.index ? a : b;
    const bool a_wins = mode == codes::kReduceArgmax ? b.value < a.value : a.value < b.value;
    return a_wins ? a : b;
  }
  __device__ index_t finish(acc a, index_t, index_t) const { return a.index; }
};

template <typename A>
struct TruthR {  // A is bool. mode: codes::kReduceAny or kReduceAll
  using value = bool;
  using acc = bool;
  static constexpr bool kScalarResult = true;
  static constexpr int kBatch = 1;
  int mode;
  __device__ acc identity() const { return mode == codes::kReduceAll; }
  __device__ acc element(value v, index_t) const { return v; }
  __device__ acc combine(acc a, acc b) const { return mode == codes::kReduceAny ? (a || b) : (a && b); }
  __device__ bool finish(acc a, index_t, index_t) const { return a; }
};

template <typename A>
struct Moments {
  index_t n;
  A mean;
  A m2;  // sum of squared deviations from the mean
};

// mode: codes::kReduceVar (variance) or kReduceStd (standard deviation). Welford's update per element,
// partial results merged with Chan's formula; finish() gives m2 / (n - ddof), or its square root.
template <typename A>
struct VarianceR {
  using value = A;
  using acc = Moments<A>;
  static constexpr bool kScalarResult = true;
  static constexpr int kBatch = 1;
  int mode;
  __device__ acc identity() const { return {0, A(0), A(0)}; }
  __device__ acc element(value v, index_t) const { return {1, v, A(0)}; }
  __device__ acc combine(acc a, acc b) const {
    if (a.n == 0) return b;
    if (b.n == 0) return a;
    const index_t n = a.n + b.n;
    const A delta = b.mean - a.mean;
    const A weight_b = static_cast<A>(b.n) / static_cast<A>(n);
    const A mean = a.mean + delta * weight_b;
    const A m2 = a.m2 + b.m2 + delta * delta * static_cast<A>(a.n) * weight_b;
    return {n, mean, m2};
  }
  __device__ A finish(acc a, index_t, index_t ddof) const {
    const A variance = a.m2 / static_cast<A>(a.n - ddof);
    return mode == codes::kReduceStd ? m_sqrt(variance) : variance;
  }
};

template <typename A>
struct SoftmaxStats {
  A max;
  A sum;  // sum of exp(x - max)
};

// The running maximum and the sum of exponentials relative to it: what softmax normalises by.
template <typename A>
struct LogSumExpR {
  using value = A;
  using acc = SoftmaxStats<A>;
  static constexpr bool kScalarResult = false;
  static constexpr int kBatch = 2;
  int mode;
  __device__ acc identity() const { return {Limits<A>::lowest(), A(0)}; }
  __device__ acc element(value v, index_t) const { return {v, A(1)}; }
  __device__ acc combine(acc a, acc b) const {
    if (a.sum == A(0)) return b;
    if (b.sum == A(0)) return a;
    const A m = Maximum<A>()(a.max, b.max);
    if (m == Limits<A>::lowest()) return {m, a.sum + b.sum};  // only -inf so far
    return {m, a.sum * m_exp(a.max - m) + b.sum * m_exp(b.max - m)};
  }
  __device__ acc finish(acc a, index_t, index_t) const { return a; }
};

// Fold one element into an accumulator: combine(a, element(v, k)), except for the softmax statistics,
// where the running form needs one exponential per element instead of two.
template <typename R>
__device__ __forceinline__ typename R::acc fold(const R& r, typename R::acc a, typename R::value v,
                                                index_t k) {
  return r.combine(a, r.element(v, k));
}
template <typename A>
__device__ __forceinline__ SoftmaxStats<A> fold(const LogSumExpR<A>&, SoftmaxStats<A> a, A v, index_t) {
  if (v > a.max) {
    a.sum = a.sum * m_exp(a.max - v) + A(1);  // the empty accumulator has sum 0 and max -inf
    a.max = v;
  } else if (v != v) {
    a.max = v;
    a.sum = v;
  } else if (v != Limits<A>::lowest()) {
    a.sum += m_exp(v - a.max);
  }
  return a;
}

// -- moving accumulators between lanes --------------------------------------------------------------
template <typename T>
__device__ __forceinline__ T shuffle_xor(T value, int mask) {
  constexpr int kWords = (sizeof(T) + 3) / 4;
  unsigned words[kWords];
  memcpy(words, &value, sizeof(T));
#pragma unroll
  for (int i = 0; i < kWords; ++i) words[i] = __shfl_xor_sync(0xffffffffu, words[i], mask);
  T result;
  memcpy(&result, words, sizeof(T));
  return result;
}

// Combine the accumulators of `lanes` consecutive threads (a power of two, at most the block) in a
// fixed binary tree; the group's first thread gets the result. `scratch` holds blockDim.x / 32 values.
// Every thread of the block must call it.
template <typename R>
__device__ typename R::acc group_reduce(const R& r, typename R::acc value, int lanes,
                                        typename R::acc* scratch) {
  using Acc = typename R::acc;
  const int width = lanes < 32 ? lanes : 32;
  for (int offset = 1; offset < width; offset <<= 1) {
    const Acc other = shuffle_xor(value, offset);
    // The lower lane's partial covers lower positions: both lanes combine in that order.
    value = (threadIdx.x & offset) ? r.combine(other, value) : r.combine(value, other);
  }
  if (lanes > 32) {
    const int warp = threadIdx.x / 32;
    if ((threadIdx.x & 31) == 0) scratch[warp] = value;
    __syncthreads();
    const int warps = lanes / 32;
    if ((threadIdx.x % lanes) == 0) {
      for (int w = 1; w < warps; ++w) value = r.combine(value, scratch[warp + w]);
    }
    __syncthreads();
  }
  return value;
}

// group_reduce, with the result handed to every thread of the group.
template <typename R>
__device__ typename R::acc group_allreduce(const R& r, typename R::acc value, int lanes,
                                           typename R::acc* scratch) {
  value = group_reduce<R>(r, value, lanes, scratch);
  if (lanes > 32) {
    if ((threadIdx.x % lanes) == 0) scratch[threadIdx.x / 32] = value;
    __syncthreads();
    value = scratch[(threadIdx.x / lanes) * (lanes / 32)];
    __syncthreads();
  }
  return value;
}

}  // namespace ops
}  // namespace pygpukit
