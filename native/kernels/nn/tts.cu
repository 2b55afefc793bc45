// Building blocks of Kokoro's decoder and prosody predictor (pygpukit/ops/tts_ops.py), float arithmetic,
// one rounding to T at the store.
//
//   conv_transpose1d<T>(args)  like torch.nn.functional.conv_transpose1d: x (N, C_in, L_in), weight
//       (C_in, C_out / groups, K), bias (C_out,) or null, out (N, C_out, L_out) with
//       L_out = (L_in - 1) * stride - 2 * padding + dilation * (K - 1) + output_padding + 1.
//       One thread per output element (grid-stride): it gathers every (ci, k) whose tap lands on its
//       position, out[n, co, l] = bias[co] + sum x[n, ci, j] * w[ci, co % Cg_out, k] over
//       l + padding - k * dilation = j * stride, 0 <= j < L_in. Fixed order: bitwise reproducible.
//   instance_norm<T>(args)     one block per (n, c) row of x (N, C, L): (x - mean) / sqrt(var + eps)
//       (biased variance, two passes over the row in float), then * (scale_offset + scale[n, c]) +
//       shift[n, c] where scale/shift are read at n * s_n + c * s_c (s_n = 0: per channel, torch's
//       affine InstanceNorm1d; scale_offset = 1: Kokoro's AdaIN1d, (1 + gamma) * norm + beta).
//   snake<T>(args)             x + 1 / alpha[c] * sin(alpha[c] * x)^2 over x (N, C, L) (Kokoro's
//       AdaINResBlock1 activation); with mode 1 instead leaky_relu(x, slope) (alpha unused).
#include "../common/layout.cuh"

namespace pygpukit {
namespace ops {
namespace tts {

// pygpukit/ops/tts_ops.py declares these as KernelStructs (the compile check asserts the layout).
struct ConvTArgs {
  const void* x;
  const void* weight;
  const void* bias;  // null: none
  void* out;
  index_t x_n, x_c, x_l;  // element strides
  index_t w_i, w_o, w_k;
  index_t total;  // N * C_out * L_out
  int c_out;
  int c_in_group;
  int c_out_group;
  int l_in;
  int l_out;
  int ksize;
  int stride;
  int padding;
  int dilation;
  int pad_;
};

struct InstanceNormArgs {
  const void* x;
  const void* scale;  // null: 1 (with scale_offset 0)
  const void* shift;  // null: 0
  void* out;
  index_t x_n, x_c, x_l;
  index_t o_n, o_c, o_l;
  index_t s_n, s_c;  // strides of scale and shift (same layout)
  int channels;
  int length;
  float eps;
  float scale_offset;
};

struct SnakeArgs {
  const void* x;
  const void* alpha;
  void* out;
  index_t total;  // N * C * L, x and out contiguous
  int channels;
  int length;
  int mode;  // 0 snake, 1 leaky_relu
  float slope;
};

template <typename T>
__global__ void conv_transpose1d(ConvTArgs a) {
  const T* x = static_cast<const T*>(a.x);
  const T* w = static_cast<const T*>(a.weight);
  const T* bias = static_cast<const T*>(a.bias);
  T* out = static_cast<T*>(a.out);
  for (index_t i = global_thread(); i < a.total; i += grid_threads()) {
    const int l = static_cast<int>(i % a.l_out);
    const index_t rest = i / a.l_out;
    const int co = static_cast<int>(rest % a.c_out);
    const index_t n = rest / a.c_out;
    const int g = co / a.c_out_group;
    const int cog = co - g * a.c_out_group;
    float acc = bias != nullptr ? to_float(bias[co]) : 0.0f;
    for (int k = 0; k < a.ksize; ++k) {
      const int pos = l + a.padding - k * a.dilation;
      if (pos < 0 || pos % a.stride != 0) continue;
      const int j = pos / a.stride;
      if (j >= a.l_in) continue;
      const T* xp = x + n * a.x_n + static_cast<index_t>(g) * a.c_in_group * a.x_c + j * a.x_l;
      const T* wp = w + static_cast<index_t>(g) * a.c_in_group * a.w_i + cog * a.w_o + k * a.w_k;
      for (int ci = 0; ci < a.c_in_group; ++ci) {
        acc += to_float(xp[ci * a.x_c]) * to_float(wp[ci * a.w_i]);
      }
    }
    out[i] = from_float<T>(acc);
  }
}

constexpr int kNormThreads = 256;

__device__ __forceinline__ float block_sum(float v, float* shared) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  __syncthreads();  // shared is reused between calls
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kNormThreads / 32; ++w) total += shared[w];  // fixed order: reproducible
  return total;
}

template <typename T>
__global__ void __launch_bounds__(kNormThreads) instance_norm(InstanceNormArgs a) {
  __shared__ float shared[kNormThreads / 32];
  const T* x = static_cast<const T*>(a.x);
  const T* scale = static_cast<const T*>(a.scale);
  const T* shift = static_cast<const T*>(a.shift);
  T* out = static_cast<T*>(a.out);
  const index_t row = blockIdx.x;
  const index_t n = row / a.channels;
  const index_t c = row - n * a.channels;
  const T* xr = x + n * a.x_n + c * a.x_c;
  float sum = 0.0f;
  for (int l = threadIdx.x; l < a.length; l += kNormThreads) sum += to_float(xr[l * a.x_l]);
  const float mean = block_sum(sum, shared) / static_cast<float>(a.length);
  float sq = 0.0f;
  for (int l = threadIdx.x; l < a.length; l += kNormThreads) {
    const float d = to_float(xr[l * a.x_l]) - mean;
    sq += d * d;
  }
  const float var = block_sum(sq, shared) / static_cast<float>(a.length);
  const float inv = rsqrtf(var + a.eps);
  const index_t p = n * a.s_n + c * a.s_c;
  const float mul = (a.scale_offset + (scale != nullptr ? to_float(scale[p]) : 0.0f)) * inv;
  const float add = shift != nullptr ? to_float(shift[p]) : 0.0f;
  T* orow = out + n * a.o_n + c * a.o_c;
  for (int l = threadIdx.x; l < a.length; l += kNormThreads) {
    orow[l * a.o_l] = from_float<T>((to_float(xr[l * a.x_l]) - mean) * mul + add);
  }
}

template <typename T>
__global__ void snake(SnakeArgs a) {
  const T* x = static_cast<const T*>(a.x);
  const T* alpha = static_cast<const T*>(a.alpha);
  T* out = static_cast<T*>(a.out);
  for (index_t i = global_thread(); i < a.total; i += grid_threads()) {
    const float v = to_float(x[i]);
    float r;
    if (a.mode == 0) {
      const int c = static_cast<int>((i / a.length) % a.channels);
      const float al = to_float(alpha[c]);
      const float s = sinf(al * v);
      r = v + s * s / al;
    } else {
      r = v >= 0.0f ? v : v * a.slope;
    }
    out[i] = from_float<T>(r);
  }
}

}  // namespace tts
}  // namespace ops
}  // namespace pygpukit
