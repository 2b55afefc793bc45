// Gated activations of MLP blocks (pygpukit/ops/gated.py), in float, rounded once to T; the mode is a
// GatedMode code of common/codes.cuh:
//
//   kGatedSwiglu     swiglu      silu(gate) * up
//   kGatedGeglu      geglu       gelu(gate) * up, the exact (erf) GELU
//   kGatedGegluTanh  geglu       gelu_tanh(gate) * up, the tanh approximation
//   kGatedRelu2      relu2       relu(gate)**2 (no up operand)
//
//   gated_rows<T>(args)
//       operands are rows x cols matrices with unit stride along a row and their own row stride (the
//       host merges fully contiguous operands into one row), so one kernel serves two separate inputs
//       and one concatenated input whose first half of each row is the gate and second half the up
//       projection. A grid-stride loop gives each thread one 16-byte pack of every operand per step
//       when `aligned` (cols a multiple of the pack, every row start 16-byte aligned), else one element.
#include "../common/codes.cuh"
#include "../common/layout.cuh"
#include "../common/overlap.cuh"

namespace pygpukit {
namespace ops {

// pygpukit/ops/gated.py declares it as a KernelStruct (the compile check asserts the layout).
struct GatedArgs {
  const void* gate;
  const void* up;  // unused by relu2
  void* out;
  index_t rows;
  index_t cols;
  index_t gate_stride;  // row strides in elements
  index_t up_stride;
  index_t out_stride;
  int mode;
  int aligned;
};

__device__ __forceinline__ float gated_value(float g, float u, int mode) {
  switch (mode) {
    case codes::kGatedSwiglu:
      return g / (1.0f + expf(-g)) * u;
    case codes::kGatedGeglu:
      return 0.5f * g * (1.0f + erff(g * 0.7071067811865476f)) * u;
    case codes::kGatedGegluTanh:
      return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u;
    default:
      return g > 0.0f ? g * g : (g != g ? g : 0.0f);  // NaN stays NaN
  }
}

template <typename T>
__global__ void gated_rows(GatedArgs a) {
  overlap_wait();  // programmatic launch: gate and up come from the kernels before
  constexpr int V = 16 / sizeof(T);
  const T* gate = static_cast<const T*>(a.gate);
  const T* up = static_cast<const T*>(a.up);
  T* out = static_cast<T*>(a.out);
  const int mode = a.mode;
  const bool unary = mode == codes::kGatedRelu2;
  const index_t per_row = a.aligned ? a.cols / V : a.cols;
  const index_t total = a.rows * per_row;
  const bool small = total <= kSmallSpace && per_row <= kSmallSpace;
  for (index_t i = global_thread(); i < total; i += grid_threads()) {
    index_t row, col;
    if (a.rows == 1) {
      row = 0;
      col = i;
    } else if (small) {
      const unsigned q = static_cast<unsigned>(i) / static_cast<unsigned>(per_row);
      row = q;
      col = i - static_cast<index_t>(q) * per_row;
    } else {
      row = i / per_row;
      col = i - row * per_row;
    }
    if (a.aligned) {
      const index_t first = col * V;
      const Pack<T, V> g = *reinterpret_cast<const Pack<T, V>*>(gate + row * a.gate_stride + first);
      Pack<T, V> u;
      if (!unary) u = *reinterpret_cast<const Pack<T, V>*>(up + row * a.up_stride + first);
      Pack<T, V> result;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float uj = unary ? 1.0f : convert<float>(u.v[j]);
        result.v[j] = convert<T>(gated_value(convert<float>(g.v[j]), uj, mode));
      }
      *reinterpret_cast<Pack<T, V>*>(out + row * a.out_stride + first) = result;
    } else {
      const float g = convert<float>(gate[row * a.gate_stride + col]);
      const float u = unary ? 1.0f : convert<float>(up[row * a.up_stride + col]);
      out[row * a.out_stride + col] = convert<T>(gated_value(g, u, mode));
    }
  }
}

}  // namespace ops
}  // namespace pygpukit
