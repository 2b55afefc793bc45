// cast<Src, Dst>(src, dst, n): element-wise conversion between any two element types, instantiated
// per pair through NVRTC name expressions ("pygpukit::cast<float, __nv_bfloat16>").
// Each element converts through convert<Dst> (common/convert.cuh): NumPy's rules with one rounding
// (integer to integer wraps like NumPy; anything to bool is "!= 0").
#include "../common/convert.cuh"

namespace pygpukit {

template <typename T, int N>
struct alignas(sizeof(T) * N) Chunk {
  T v[N];
};

// 16-byte chunks (of the wider type) per thread when both pointers allow, then single elements.
template <typename Src, typename Dst>
__global__ void cast(const Src* __restrict__ src, Dst* __restrict__ dst, long long n) {
  constexpr int N = 16 / (sizeof(Src) > sizeof(Dst) ? sizeof(Src) : sizeof(Dst));
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool aligned = reinterpret_cast<unsigned long long>(src) % (sizeof(Src) * N) == 0 &&
                       reinterpret_cast<unsigned long long>(dst) % (sizeof(Dst) * N) == 0;
  const long long chunks = aligned ? n / N : 0;
  for (long long c = first; c < chunks; c += stride) {
    const Chunk<Src, N> in = reinterpret_cast<const Chunk<Src, N>*>(src)[c];
    Chunk<Dst, N> out;
#pragma unroll
    for (int j = 0; j < N; ++j) out.v[j] = convert<Dst>(in.v[j]);
    reinterpret_cast<Chunk<Dst, N>*>(dst)[c] = out;
  }
  for (long long i = chunks * N + first; i < n; i += stride) dst[i] = convert<Dst>(src[i]);
}

}  // namespace pygpukit
