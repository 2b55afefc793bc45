// conv1d as an implicit GEMM (pygpukit/ops/convolution.py), like torch.nn.functional.conv1d:
//
//   out[n, g * Mg + co, l] = act(bias + sum over ci < Cg, k < K of
//                                weight[g * Mg + co, ci, k] * x[n, g * Cg + ci, l * stride - padding + k *
//                                dilation])
//
// Per sample n and group g this is a GEMM: A = the group's weight rows (Mg x Cg K, row-major as
// stored: kk = ci * K + k), B = the im2col matrix of x (Cg K x L_out), never materialised: each tile of
// B is gathered from x into shared memory, with zeros for positions in the padding and past the ends.
// The output tile of a block is BM output channels x BN positions of one (n, g); grid (L_out tiles,
// groups * channel tiles, N).
//
//   conv1d_mma<T>(args)   fp16/bf16: 4 warps, 64 x 64 tile, K steps of 32 through two shared-memory
//       buffers (the next step's global loads are in registers while the tensor cores work on this
//       one). mma.sync m16n8k16 with float accumulators; fragments read with ldmatrix from tiles whose
//       16-byte chunks are XOR-swizzled (gemm_common.cuh). Weight rows are read as 16-byte vectors when
//       the weight is contiguous and aligned.
//   conv1d_simt<T>(args)  float32 in float32: 256 threads, 64 x 64 tile, 4 x 4 outputs per thread,
//       K steps of 16, the same double buffering.
//
// Epilogue in float: + bias[channel], then the activation (codes::Activation, matmul::activate),
// rounded once to T.
// Strides are arbitrary for x and out (elements); the accumulation order is fixed by the shape, so
// results are bitwise reproducible.
#include "../gemm/gemm_common.cuh"

namespace pygpukit {
namespace ops {
namespace conv {

// pygpukit/ops/convolution.py declares it as a KernelStruct (the compile check asserts the layout).
struct ConvArgs {
  const void* x;
  const void* weight;
  const void* bias;  // null: none
  void* out;
  index_t x_n, x_c, x_l;  // element strides
  index_t w_o, w_c, w_k;
  index_t o_n, o_c, o_l;
  int batch;
  int c_in_group;
  int c_out_group;
  int groups;
  int l_in;
  int l_out;
  int ksize;
  int stride;
  int padding;  // on the left; the right padding only shows in l_out
  int dilation;
  int activation;  // codes::Activation
  int vector_w;    // weight contiguous, rows 16-byte aligned
};

using gemm::ldmatrix_x4;
using gemm::ldmatrix_x4_trans;
template <typename T>
__device__ __forceinline__ void store2(T* dst, float v0, float v1);
template <>
__device__ __forceinline__ void store2<__half>(__half* dst, float v0, float v1) {
  *reinterpret_cast<__half2*>(dst) = __floats2half2_rn(v0, v1);
}
template <>
__device__ __forceinline__ void store2<__nv_bfloat16>(__nv_bfloat16* dst, float v0, float v1) {
  *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(v0, v1);
}

constexpr int kBM = 64;
constexpr int kBN = 64;
constexpr int kBK = 32;
constexpr int kThreads = 128;

template <typename T>
__global__ void __launch_bounds__(kThreads) conv1d_mma(ConvArgs a) {
  __shared__ __align__(128) T smem_a[2][kBM * kBK];
  __shared__ __align__(128) T smem_b[2][kBK * kBN];
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int warp_m = (warp / 2) * 32;
  const int warp_n = (warp % 2) * 32;
  const int quad = lane >> 3;
  const int quad_row = lane & 7;
  const int m_tiles = (a.c_out_group + kBM - 1) / kBM;
  const int g = static_cast<int>(blockIdx.y) / m_tiles;
  const int m0 = (static_cast<int>(blockIdx.y) % m_tiles) * kBM;
  const int l0 = static_cast<int>(blockIdx.x) * kBN;
  const index_t n = blockIdx.z;
  const int kdim = a.c_in_group * a.ksize;
  const int k_tiles = (kdim + kBK - 1) / kBK;
  const unsigned short* x =
      static_cast<const unsigned short*>(a.x) + n * a.x_n + static_cast<index_t>(g) * a.c_in_group * a.x_c;
  const unsigned short* w =
      static_cast<const unsigned short*>(a.weight) + static_cast<index_t>(g) * a.c_out_group * a.w_o;

  uint4 a_regs[2];
  uint4 b_regs[2];
  auto load_global = [&](int kt) {
    const int k0 = kt * kBK;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int c = tid + i * kThreads;
      {  // A: kBM rows x kBK / 8 chunks
        const int row = c >> 2;
        const int kk = k0 + (c & 3) * 8;
        const int co = m0 + row;
        unsigned words[4] = {0u, 0u, 0u, 0u};
        if (co < a.c_out_group) {
          const unsigned short* wr = w + co * a.w_o;
          if (a.vector_w && kk + 8 <= kdim) {
            const uint4 v = *reinterpret_cast<const uint4*>(wr + kk);
            words[0] = v.x;
            words[1] = v.y;
            words[2] = v.z;
            words[3] = v.w;
          } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) {
              if (kk + e < kdim) {
                const int ci = (kk + e) / a.ksize;
                const int k = kk + e - ci * a.ksize;
                words[e / 2] |= static_cast<unsigned>(wr[ci * a.w_c + k * a.w_k]) << (16 * (e % 2));
              }
            }
          }
        }
        a_regs[i] = make_uint4(words[0], words[1], words[2], words[3]);
      }
      {  // B: kBK rows (kk) x kBN / 8 chunks (positions)
        const int row = c >> 3;
        const int col = (c & 7) * 8;
        const int kk = k0 + row;
        unsigned words[4] = {0u, 0u, 0u, 0u};
        if (kk < kdim) {
          const int ci = kk / a.ksize;
          const int k = kk - ci * a.ksize;
          const unsigned short* xr = x + ci * a.x_c;
          const int l = l0 + col;
          int p = l * a.stride - a.padding + k * a.dilation;
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            if (l + e < a.l_out && p >= 0 && p < a.l_in) {
              words[e / 2] |= static_cast<unsigned>(xr[p * a.x_l]) << (16 * (e % 2));
            }
            p += a.stride;
          }
        }
        b_regs[i] = make_uint4(words[0], words[1], words[2], words[3]);
      }
    }
  };
  auto store_shared = [&](int buffer) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int c = tid + i * kThreads;
      *reinterpret_cast<uint4*>(&smem_a[buffer][gemm::swizzled<kBK>(c >> 2, (c & 3) * 8)]) = a_regs[i];
      *reinterpret_cast<uint4*>(&smem_b[buffer][gemm::swizzled<kBN>(c >> 3, (c & 7) * 8)]) = b_regs[i];
    }
  };

  float acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    }
  }

  if (k_tiles > 0) {
    load_global(0);
    store_shared(0);
  }
  __syncthreads();
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int cur = kt & 1;
    if (kt + 1 < k_tiles) load_global(kt + 1);
    const unsigned base_a = gemm::shared_address(&smem_a[cur][0]);
    const unsigned base_b = gemm::shared_address(&smem_b[cur][0]);
#pragma unroll
    for (int step = 0; step < kBK / 16; ++step) {
      const int kk = step * 16;
      unsigned fa[2][4];
      unsigned fb[4][2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int offset =
            gemm::swizzled<kBK>(warp_m + i * 16 + (quad & 1) * 8 + quad_row, kk + (quad >> 1) * 8);
        ldmatrix_x4(fa[i], base_a + offset * static_cast<int>(sizeof(T)));
      }
#pragma unroll
      for (int j = 0; j < 4; j += 2) {
        unsigned r[4];
        const int offset =
            gemm::swizzled<kBN>(kk + (quad & 1) * 8 + quad_row, warp_n + j * 8 + (quad >> 1) * 8);
        ldmatrix_x4_trans(r, base_b + offset * static_cast<int>(sizeof(T)));
        fb[j][0] = r[0];
        fb[j][1] = r[1];
        fb[j + 1][0] = r[2];
        fb[j + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) matmul::Mma<T>::run(acc[i][j], fa[i], fb[j][0], fb[j][1]);
      }
    }
    if (kt + 1 < k_tiles) store_shared(cur ^ 1);
    __syncthreads();
  }

  const T* bias = static_cast<const T*>(a.bias);
  T* out = static_cast<T*>(a.out) + n * a.o_n;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int co_local = m0 + warp_m + i * 16 + (lane >> 2) + 8 * h;
      if (co_local >= a.c_out_group) continue;
      const index_t co = static_cast<index_t>(g) * a.c_out_group + co_local;
      const float b = bias != nullptr ? matmul::to_float(bias[co]) : 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int l = l0 + warp_n + j * 8 + (lane & 3) * 2;
        if (l >= a.l_out) continue;
        const float v0 = matmul::activate(acc[i][j][2 * h] + b, a.activation);
        const float v1 = matmul::activate(acc[i][j][2 * h + 1] + b, a.activation);
        T* dst = out + co * a.o_c + l * a.o_l;
        if (a.o_l == 1 && l + 1 < a.l_out && (reinterpret_cast<unsigned long long>(dst) & 3u) == 0) {
          store2<T>(dst, v0, v1);
        } else {
          dst[0] = matmul::from_float<T>(v0);
          if (l + 1 < a.l_out) dst[a.o_l] = matmul::from_float<T>(v1);
        }
      }
    }
  }
}

constexpr int kSimtBM = 64;
constexpr int kSimtBN = 64;
constexpr int kSimtBK = 16;
constexpr int kSimtThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kSimtThreads) conv1d_simt(ConvArgs a) {
  __shared__ float sa[2][kSimtBK][kSimtBM + 1];
  __shared__ float sb[2][kSimtBK][kSimtBN];
  const int tid = static_cast<int>(threadIdx.x);
  const int tx = tid % 16;
  const int ty = tid / 16;
  const int m_tiles = (a.c_out_group + kSimtBM - 1) / kSimtBM;
  const int g = static_cast<int>(blockIdx.y) / m_tiles;
  const int m0 = (static_cast<int>(blockIdx.y) % m_tiles) * kSimtBM;
  const int l0 = static_cast<int>(blockIdx.x) * kSimtBN;
  const index_t n = blockIdx.z;
  const int kdim = a.c_in_group * a.ksize;
  const int k_tiles = (kdim + kSimtBK - 1) / kSimtBK;
  const T* x = static_cast<const T*>(a.x) + n * a.x_n + static_cast<index_t>(g) * a.c_in_group * a.x_c;
  const T* w = static_cast<const T*>(a.weight) + static_cast<index_t>(g) * a.c_out_group * a.w_o;

  float ra[4];
  float rb[4];
  auto load_global = [&](int kt) {
    const int k0 = kt * kSimtBK;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int c = tid + i * kSimtThreads;
      {
        const int co = m0 + c / kSimtBK;
        const int kk = k0 + c % kSimtBK;
        float v = 0.0f;
        if (co < a.c_out_group && kk < kdim) {
          const int ci = kk / a.ksize;
          const int k = kk - ci * a.ksize;
          v = matmul::to_float(w[co * a.w_o + ci * a.w_c + k * a.w_k]);
        }
        ra[i] = v;
      }
      {
        const int kk = k0 + c / kSimtBN;
        const int l = l0 + c % kSimtBN;
        float v = 0.0f;
        if (kk < kdim && l < a.l_out) {
          const int ci = kk / a.ksize;
          const int k = kk - ci * a.ksize;
          const int p = l * a.stride - a.padding + k * a.dilation;
          if (p >= 0 && p < a.l_in) v = matmul::to_float(x[ci * a.x_c + p * a.x_l]);
        }
        rb[i] = v;
      }
    }
  };
  auto store_shared = [&](int buffer) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int c = tid + i * kSimtThreads;
      sa[buffer][c % kSimtBK][c / kSimtBK] = ra[i];
      sb[buffer][c / kSimtBN][c % kSimtBN] = rb[i];
    }
  };

  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
  }
  if (k_tiles > 0) {
    load_global(0);
    store_shared(0);
  }
  __syncthreads();
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int cur = kt & 1;
    if (kt + 1 < k_tiles) load_global(kt + 1);
#pragma unroll
    for (int kk = 0; kk < kSimtBK; ++kk) {
      float av[4];
      float bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = sa[cur][kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = sb[cur][kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
      }
    }
    if (kt + 1 < k_tiles) store_shared(cur ^ 1);
    __syncthreads();
  }

  const T* bias = static_cast<const T*>(a.bias);
  T* out = static_cast<T*>(a.out) + n * a.o_n;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int co_local = m0 + ty + 16 * i;
    if (co_local >= a.c_out_group) continue;
    const index_t co = static_cast<index_t>(g) * a.c_out_group + co_local;
    const float b = bias != nullptr ? matmul::to_float(bias[co]) : 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int l = l0 + tx + 16 * j;
      if (l < a.l_out)
        out[co * a.o_c + l * a.o_l] = matmul::from_float<T>(matmul::activate(acc[i][j] + b, a.activation));
    }
  }
}

}  // namespace conv
}  // namespace ops
}  // namespace pygpukit
