// One time step of a (bidirectional, length-masked) LSTM (pygpukit/ops/recurrent.py), torch's gate order
// (input, forget, cell, output) and equations:
//
//   gates = xw[n, tt, d] + W_hh[d] @ h[d, n]      (xw = x @ W_ih^T + b_ih + b_hh with the directions
//   i, f, o = sigmoid(...), g = tanh(...)           stacked: one GEMM made by the host before the steps)
//   c' = f * c + i * g,  h' = o * tanh(c')
//
//   lstm_step<T>(args)  one warp per (direction, sample, hidden unit): its lanes walk the unit's four rows
//       of W_hh (contiguous, so the loads coalesce) against h, reduce by shuffles in a fixed order
//       (bitwise reproducible), and lane 0 updates the state. Step t of direction 0 is time t; of
//       direction 1 time len[n] - 1 - t (the reverse pass starts at each sequence's own last frame, as
//       torch's packed sequences). Samples with t >= len[n] keep their state and write nothing (the
//       host zeroes the output first). h is double-buffered: step t reads h_in and writes h_out, the
//       host swaps them; c is updated in place (one thread owns each c element). State in float.
#include "../common/layout.cuh"

namespace pygpukit {
namespace ops {
namespace lstm {

// pygpukit/ops/recurrent.py declares it as a KernelStruct (the compile check asserts the layout).
struct LstmArgs {
  const void* xw;      // (N, T, D * 4H) contiguous, T: one GEMM with the directions' W_ih stacked
  const void* w_hh;    // (D, 4H, H) contiguous, T
  const int* lengths;  // (N,) int32
  const float* h_in;   // (D, N, H) float
  float* h_out;        // (D, N, H) float
  float* c;            // (D, N, H) float
  void* out;           // (N, T, D * H) contiguous, T
  int directions;
  int batch;
  int steps;  // T
  int hidden;
  int t;  // this step
  int pad_;
};

__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

template <typename T>
__global__ void lstm_step(LstmArgs a) {
  const int lane = threadIdx.x % 32;
  const long long unit = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int H = a.hidden;
  const long long units = static_cast<long long>(a.directions) * a.batch * H;
  if (unit >= units) return;  // whole warps only: units are counted per warp
  const int j = static_cast<int>(unit % H);
  const int n = static_cast<int>((unit / H) % a.batch);
  const int d = static_cast<int>(unit / (static_cast<long long>(H) * a.batch));
  const int len = a.lengths[n];
  const index_t state = (static_cast<index_t>(d) * a.batch + n) * H;
  if (a.t >= len) {
    if (lane == 0) a.h_out[state + j] = a.h_in[state + j];
    return;
  }
  const int tt = d == 0 ? a.t : len - 1 - a.t;
  const T* w = static_cast<const T*>(a.w_hh) + static_cast<index_t>(d) * 4 * H * H;
  const float* h = a.h_in + state;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int k = lane; k < H; k += 32) {
    const float hk = h[k];
#pragma unroll
    for (int g = 0; g < 4; ++g) acc[g] += to_float(w[(static_cast<index_t>(g) * H + j) * H + k]) * hk;
  }
#pragma unroll
  for (int g = 0; g < 4; ++g) {
    for (int offset = 16; offset > 0; offset /= 2) acc[g] += __shfl_xor_sync(0xffffffffu, acc[g], offset);
  }
  if (lane != 0) return;
  const T* xw = static_cast<const T*>(a.xw) +
                (static_cast<index_t>(n) * a.steps + tt) * a.directions * 4 * H +
                static_cast<index_t>(d) * 4 * H;
  const float gi = sigmoid(acc[0] + to_float(xw[j]));
  const float gf = sigmoid(acc[1] + to_float(xw[H + j]));
  const float gg = tanhf(acc[2] + to_float(xw[2 * H + j]));
  const float go = sigmoid(acc[3] + to_float(xw[3 * H + j]));
  const float c = gf * a.c[state + j] + gi * gg;
  const float hv = go * tanhf(c);
  a.c[state + j] = c;
  a.h_out[state + j] = hv;
  T* out = static_cast<T*>(a.out);
  out[(static_cast<index_t>(n) * a.steps + tt) * a.directions * H + static_cast<index_t>(d) * H + j] =
      from_float<T>(hv);
}

}  // namespace lstm
}  // namespace ops
}  // namespace pygpukit
