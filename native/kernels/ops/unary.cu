// Unary elementwise kernels over a family of ops (functors.cuh: Signs, Math, Logical, Copy), with the
// op a run-time code. Instantiated through NVRTC name expressions, e.g.
// "pygpukit::ops::unary_contig<pygpukit::ops::Math<float>, __half, __half>":
//
//   unary_contig<F, T, O>(x, out, n, op)                 contiguous, 16-byte packs (two per step) when
//   aligned unary_strided<F, O>(out, x, x_code, n, layout, op)   any strides, input dtype known at run time
//
// unary_strided<Copy<C>, O> is the converting strided copy (astype of views, concatenate).
#include "functors.cuh"
#include "layout.cuh"

namespace pygpukit {
namespace ops {

template <typename F, typename T, typename O>
__global__ void unary_contig(const T* __restrict__ x, O* __restrict__ out, index_t n, int op) {
  using C = typename F::compute;
  using R = typename F::result;
  constexpr int V = pack_width<T, O>();
  const bool packed = aligned_to(x, V * sizeof(T)) && aligned_to(out, V * sizeof(O));
  const index_t step = grid_threads() * V;
  auto load = [&](index_t at, Pack<T, V>& vx) {
    if (packed && at + V <= n) {
      vx = *reinterpret_cast<const Pack<T, V>*>(x + at);
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        if (at + j < n) vx.v[j] = x[at + j];
      }
    }
  };
  index_t at = global_thread() * V;
  Pack<T, V> vx;
  if (at < n) load(at, vx);
  for (; at < n; at += step) {
    Pack<T, V> next;  // requested before this step is computed: two loads in flight
    if (at + step < n) load(at + step, next);
    C c[V];
    R r[V];
#pragma unroll
    for (int j = 0; j < V; ++j) c[j] = convert<C>(vx.v[j]);
    F::apply(op, c, r);
    Pack<O, V> vo;
#pragma unroll
    for (int j = 0; j < V; ++j) vo.v[j] = convert<O>(r[j]);
    if (packed && at + V <= n) {
      *reinterpret_cast<Pack<O, V>*>(out + at) = vo;
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        if (at + j < n) out[at + j] = vo.v[j];
      }
    }
    vx = next;
  }
}

template <typename F, typename O>
__global__ void unary_strided(O* __restrict__ out, const void* __restrict__ x, int x_code, index_t n,
                              Layout layout, int op) {
  using C = typename F::compute;
  using R = typename F::result;
  const bool small = n <= kSmallSpace;
  for (index_t i = global_thread(); i < n; i += grid_threads()) {
    index_t offsets[2];
    layout_offsets<2>(layout, i, small, offsets);
    const C c[1] = {load_as<C>(x, x_code, offsets[1])};
    R r[1];
    F::apply(op, c, r);
    out[offsets[0]] = convert<O>(r[0]);
  }
}

}  // namespace ops
}  // namespace pygpukit
