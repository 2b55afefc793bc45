// Binary elementwise kernels over a family of ops (functors.cuh: Arith, Compare, Logical), with the op
// a run-time code. Instantiated through NVRTC name expressions, e.g.
// "pygpukit::ops::binary_contig<pygpukit::ops::Arith<float>, __half, __half>":
//
//   binary_contig<F, T, O>(a, b, s, out, n, mode, op)  contiguous operands of one dtype T, O out;
//                                                      mode (codes::BinaryMode) kBinaryArrays: a op b,
//                                                      kBinaryScalarFirst: s op b, kBinaryScalarSecond:
//                                                      a op s, where s is a scalar argument in F::compute
//   binary_strided<F, O>(out, a, a_code, b, b_code, s, n, layout, op)
//                                                      any strides, broadcasting, mixed input dtypes
//                                                      (run-time codes), one operand may be the scalar
//
// The contiguous kernel moves 16-byte packs when every pointer is aligned to its pack (element accesses
// otherwise, and in the last partial tile); each thread loads kUnroll packs per operand before using
// any, and the loop over tiles of blockDim.x * kUnroll packs is grid-stride.
#include "../common/codes.cuh"
#include "../common/layout.cuh"
#include "../common/overlap.cuh"
#include "functors.cuh"

namespace pygpukit {
namespace ops {

template <typename F, typename T, typename O>
__global__ void binary_contig(const T* __restrict__ a, const T* __restrict__ b, typename F::compute s,
                              O* __restrict__ out, index_t n, int mode, int op) {
  overlap_wait();  // programmatic launch (common/overlap.cuh)
  using C = typename F::compute;
  using R = typename F::result;
  constexpr int V = pack_width<T, O>();
  const bool load_a = mode != codes::kBinaryScalarFirst;
  const bool load_b = mode != codes::kBinaryScalarSecond;
  const bool packed =
      aligned_to(a, V * sizeof(T)) && aligned_to(b, V * sizeof(T)) && aligned_to(out, V * sizeof(O));
  const index_t tile = static_cast<index_t>(blockDim.x) * V * kUnroll;
  for (index_t first = static_cast<index_t>(blockIdx.x) * tile; first < n;
       first += static_cast<index_t>(gridDim.x) * tile) {
    const bool whole = packed && first + tile <= n;
    Pack<T, V> va[kUnroll];
    Pack<T, V> vb[kUnroll];
    if (whole) {  // every load of the tile in flight before the first is used
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const index_t base = first + (static_cast<index_t>(u) * blockDim.x + threadIdx.x) * V;
        if (load_a) va[u] = *reinterpret_cast<const Pack<T, V>*>(a + base);
        if (load_b) vb[u] = *reinterpret_cast<const Pack<T, V>*>(b + base);
      }
    } else {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const index_t base = first + (static_cast<index_t>(u) * blockDim.x + threadIdx.x) * V;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          if (base + j < n) {
            if (load_a) va[u].v[j] = a[base + j];
            if (load_b) vb[u].v[j] = b[base + j];
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const index_t base = first + (static_cast<index_t>(u) * blockDim.x + threadIdx.x) * V;
      C x[V];
      C y[V];
      R r[V];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        x[j] = load_a ? convert<C>(va[u].v[j]) : s;
        y[j] = load_b ? convert<C>(vb[u].v[j]) : s;
      }
      F::apply(op, x, y, r);
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
__global__ void binary_strided(O* __restrict__ out, const void* __restrict__ a, int a_code,
                               const void* __restrict__ b, int b_code, typename F::compute s, index_t n,
                               Layout layout, int op) {
  overlap_wait();  // programmatic launch (common/overlap.cuh)
  using C = typename F::compute;
  using R = typename F::result;
  const bool small = n <= kSmallSpace;
  for (index_t i = global_thread(); i < n; i += grid_threads()) {
    index_t offsets[3];
    layout_offsets<3>(layout, i, small, offsets);
    const C x[1] = {operand<C>(a, a_code, offsets[1], s)};
    const C y[1] = {operand<C>(b, b_code, offsets[2], s)};
    R r[1];
    F::apply(op, x, y, r);
    out[offsets[0]] = convert<O>(r[0]);
  }
}

}  // namespace ops
}  // namespace pygpukit
