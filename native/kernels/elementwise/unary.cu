// Unary elementwise kernels over a family of ops (functors.cuh: Signs, Math, Logical, Copy), with the
// op a run-time code (codes::SignsOp, MathOp, LogicalOp, CopyOp). Instantiated through NVRTC name
// expressions, e.g.
// "pygpukit::ops::unary_contig<pygpukit::ops::Math<float>, __half, __half>":
//
//   unary_contig<F, T, O>(x, out, n, op)        contiguous, kUnroll 16-byte packs per thread and step
//                                               when aligned (element accesses otherwise)
//   unary_strided<F, O>(out, x, x_code, n, layout, op)   any strides, input dtype known at run time
//
// unary_strided<Copy<C>, O> is the converting strided copy (astype of views, concatenate).
//
// Results of 16 bits or fewer take cheaper forms of some math functions (kNarrowResult).
#include "../common/codes.cuh"
#include "../common/layout.cuh"
#include "../common/overlap.cuh"
#include "functors.cuh"

namespace pygpukit {
namespace ops {

// Results stored as fp16, bf16 or fp8 let some math functions take cheaper forms (functors.cuh).
template <typename O>
constexpr bool kNarrowResult = Traits<O>::kind == Kind::kNarrow;

template <typename F, typename T, typename O>
__global__ void unary_contig(const T* __restrict__ x, O* __restrict__ out, index_t n, int op) {
  overlap_wait();  // programmatic launch (common/overlap.cuh)
  using C = typename F::compute;
  using R = typename F::result;
  constexpr int V = pack_width<T, O>();
  const bool packed = aligned_to(x, V * sizeof(T)) && aligned_to(out, V * sizeof(O));
  const index_t tile = static_cast<index_t>(blockDim.x) * V * kUnroll;
  for (index_t first = static_cast<index_t>(blockIdx.x) * tile; first < n;
       first += static_cast<index_t>(gridDim.x) * tile) {
    const bool whole = packed && first + tile <= n;
    Pack<T, V> vx[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {  // every load of the tile in flight before the first is used
      const index_t base = first + (static_cast<index_t>(u) * blockDim.x + threadIdx.x) * V;
      if (whole) {
        vx[u] = *reinterpret_cast<const Pack<T, V>*>(x + base);
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          if (base + j < n) vx[u].v[j] = x[base + j];
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const index_t base = first + (static_cast<index_t>(u) * blockDim.x + threadIdx.x) * V;
      C c[V];
      R r[V];
#pragma unroll
      for (int j = 0; j < V; ++j) c[j] = convert<C>(vx[u].v[j]);
      F::template apply<kNarrowResult<O>>(op, c, r);
      Pack<O, V> vo;
#pragma unroll
      for (int j = 0; j < V; ++j) vo.v[j] = convert<O>(r[j]);
      if (whole) {
        *reinterpret_cast<Pack<O, V>*>(out + base) = vo;
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          if (base + j < n) out[base + j] = vo.v[j];
        }
      }
    }
  }
}

template <typename F, typename O>
__global__ void unary_strided(O* __restrict__ out, const void* __restrict__ x, int x_code, index_t n,
                              Layout layout, int op) {
  overlap_wait();  // programmatic launch (common/overlap.cuh)
  using C = typename F::compute;
  using R = typename F::result;
  const bool small = n <= kSmallSpace;
  for (index_t i = global_thread(); i < n; i += grid_threads()) {
    index_t offsets[2];
    layout_offsets<2>(layout, i, small, offsets);
    const C c[1] = {load_as<C>(x, x_code, offsets[1])};
    R r[1];
    F::template apply<kNarrowResult<O>>(op, c, r);
    out[offsets[0]] = convert<O>(r[0]);
  }
}

}  // namespace ops
}  // namespace pygpukit
