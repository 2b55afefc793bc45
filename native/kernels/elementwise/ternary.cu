// Three-operand elementwise kernels: where(cond, x, y) and clamp(x, lo, hi), instantiated through
// NVRTC name expressions ("pygpukit::ops::where_contig<float>").
//
//   where_contig<T>(cond, x, y, out, n)             bool cond, x, y and out contiguous, one dtype
//   where_strided<C, O>(out, cond, cond_code, x, x_code, y, y_code, xs, ys, n, layout)
//   clamp_scalar<C, T>(x, lo, hi, has_lo, has_hi, out, n)   contiguous x, scalar bounds
//   clamp_strided<C, O>(out, x, x_code, lo, lo_code, hi, hi_code, los, his, n, layout)
//
// Codes are run-time dtypes (types.cuh); kCodeScalar takes the scalar argument, and for clamp
// kCodeAbsent drops a bound. clamp is minimum(maximum(x, lo), hi) with NaN propagated, as NumPy's clip.
#include "../common/layout.cuh"
#include "functors.cuh"

namespace pygpukit {
namespace ops {

template <typename T>
__global__ void where_contig(const bool* __restrict__ cond, const T* __restrict__ x, const T* __restrict__ y,
                             T* __restrict__ out, index_t n) {
  for (index_t i = global_thread(); i < n; i += grid_threads()) out[i] = cond[i] ? x[i] : y[i];
}

template <typename C, typename O>
__global__ void where_strided(O* __restrict__ out, const void* __restrict__ cond, int cond_code,
                              const void* __restrict__ x, int x_code, const void* __restrict__ y, int y_code,
                              C xs, C ys, index_t n, Layout layout) {
  const bool small = n <= kSmallSpace;
  for (index_t i = global_thread(); i < n; i += grid_threads()) {
    index_t offsets[4];
    layout_offsets<4>(layout, i, small, offsets);
    const bool c = load_as<bool>(cond, cond_code, offsets[1]);
    out[offsets[0]] =
        convert<O>(c ? operand<C>(x, x_code, offsets[2], xs) : operand<C>(y, y_code, offsets[3], ys));
  }
}

template <typename C>
__device__ __forceinline__ C clamp_value(C x, C lo, C hi, bool has_lo, bool has_hi) {
  if (has_lo) x = Maximum<C>()(x, lo);
  if (has_hi) x = Minimum<C>()(x, hi);
  return x;
}

template <typename C, typename T>
__global__ void clamp_scalar(const T* __restrict__ x, C lo, C hi, int has_lo, int has_hi, T* __restrict__ out,
                             index_t n) {
  constexpr int V = pack_width<T, T>();
  const index_t start = global_thread();
  const index_t step = grid_threads();
  index_t done = 0;
  if (aligned_to(x, V * sizeof(T)) && aligned_to(out, V * sizeof(T))) {
    const index_t packs = n / V;
    const auto* px = reinterpret_cast<const Pack<T, V>*>(x);
    auto* po = reinterpret_cast<Pack<T, V>*>(out);
    for (index_t i = start; i < packs; i += step) {
      const Pack<T, V> vx = px[i];
      Pack<T, V> vo;
#pragma unroll
      for (int j = 0; j < V; ++j)
        vo.v[j] = convert<T>(clamp_value(convert<C>(vx.v[j]), lo, hi, has_lo, has_hi));
      po[i] = vo;
    }
    done = packs * V;
  }
  for (index_t i = done + start; i < n; i += step) {
    out[i] = convert<T>(clamp_value(convert<C>(x[i]), lo, hi, has_lo, has_hi));
  }
}

template <typename C, typename O>
__global__ void clamp_strided(O* __restrict__ out, const void* __restrict__ x, int x_code,
                              const void* __restrict__ lo, int lo_code, const void* __restrict__ hi,
                              int hi_code, C los, C his, index_t n, Layout layout) {
  const bool small = n <= kSmallSpace;
  for (index_t i = global_thread(); i < n; i += grid_threads()) {
    index_t offsets[4];
    layout_offsets<4>(layout, i, small, offsets);
    const C value = operand<C>(x, x_code, offsets[1], C(0));
    const C low = lo_code == kCodeAbsent ? C(0) : operand<C>(lo, lo_code, offsets[2], los);
    const C high = hi_code == kCodeAbsent ? C(0) : operand<C>(hi, hi_code, offsets[3], his);
    out[offsets[0]] =
        convert<O>(clamp_value(value, low, high, lo_code != kCodeAbsent, hi_code != kCodeAbsent));
  }
}

}  // namespace ops
}  // namespace pygpukit
