// What the tensor-core decode GEMVs share (gguf_gemv_mma.cu: GGUF k-quants and Q8_0;
// wo_gemv_mma.cu: FP8 / INT8 with per-channel scales): y (M x N, M <= 8) = x @ W.T with W's rows in
// 16-row tiles as the A operand of mma.sync.m16n8k16 and x's rows as the 8 columns of B.
//
// Why tensor cores for a GEMV: decoding a weight to float and one FMA per row of x costs about five
// instructions per weight, as much issue time as the H100 needs to stream the packed bytes. Here the
// quants stay small integers, which fp16 and bf16 hold exactly, and the multiply-add is one
// mma.sync.m16n8k16 per 16 x 16 weights: the eight rows of x are the eight columns of B.
//
// Fragment layout (PTX m16n8k16, row.col): A register 0 holds row g at k slots 2t, 2t + 1, register 2
// slots 2t + 8, 2t + 9 (registers 1 and 3 the same for row g + 8); B register 0 holds slots 2t, 2t + 1
// of column g, register 1 slots 2t + 8, 2t + 9. The dot product does not depend on which element sits
// in which slot as long as A and B agree: for the four elements e0 .. e3 a lane contributes per mma,
// slots (2t, 2t + 1) take (e0, e2) and slots (2t + 8, 2t + 9) take (e1, e3). Then a quant word's bytes
// 0 and 2 form one A register ((word & 0x000f000f) | magic: each 16-bit half becomes the float
// 128 + q in bf16, 1024 + q in fp16, exact) and bytes 1 and 3 the other; one packed fma removes the
// magic (exact: small integers); x's (e0, e1), (e2, e3) words are permuted to (e0, e2), (e1, e3).
//
#pragma once

#include "../gemm/gemm_common.cuh"
#include "../gemm/matmul_common.cuh"

namespace pygpukit {
namespace ops {
namespace qgemv {

constexpr int kMmaTileRows = 16;     // rows of W per block (the mma's M)
constexpr int kMmaMaxRows = 8;       // rows of x (the mma's N)
constexpr int kMmaXStride = 576;     // bytes per staged row of x: 256 elements + 64 (conflict-free reads)
constexpr int kMmaMaxThreads = 256;  // the GGUF kernels' largest block: 8 warps on one tile

// The packed-integer trick per element type: kMagic ORed into a half holding a small integer q gives
// the float kBase + q; strip(v) returns the pair's values minus kBase (and minus Bias), exactly.
template <typename T>
struct Magic;

template <>
struct Magic<__nv_bfloat16> {
  static constexpr unsigned kMagic = 0x43004300u;  // 128.0 in both halves; 7 mantissa bits hold q < 128
  static constexpr unsigned kOne = 0x3f803f80u;
  template <int Bias>
  __device__ __forceinline__ static unsigned strip(unsigned v) {
    static_assert(Bias >= 0 && Bias < 128, "bf16 holds 128 + q exactly for q < 128");
    constexpr unsigned kNeg = 0xc300u | static_cast<unsigned>(Bias);  // -(128 + Bias)
    unsigned r;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(v), "r"(kOne), "r"(kNeg | (kNeg << 16)));
    return r;
  }
};

template <>
struct Magic<__half> {
  static constexpr unsigned kMagic = 0x64006400u;  // 1024.0 in both halves
  static constexpr unsigned kOne = 0x3c003c00u;
  template <int Bias>
  __device__ __forceinline__ static unsigned strip(unsigned v) {
    static_assert(Bias >= 0 && Bias < 1024, "fp16 holds 1024 + q exactly for q < 1024");
    constexpr unsigned kNeg = 0xe400u | static_cast<unsigned>(Bias);  // -(1024 + Bias)
    unsigned r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(v), "r"(kOne), "r"(kNeg | (kNeg << 16)));
    return r;
  }
};

// The 16-row tiles a block of a persistent launch takes (ops/quant/gemv.py launches at most as many
// blocks as fit on the device at once): tiles blockIdx.x + i * gridDim.x for i < count. A warp's items
// are (tile i, its j-th block of the tile) numbered i * mine + j (mine: the warp's blocks per tile); its
// copies run Stages - 1 items ahead of the item it multiplies, across tile boundaries, so the next
// tile's weights are in flight while a tile's sums are added. A block ends each tile with store_tile
// into one of two partial-sum buffers (alternating: one barrier per tile suffices).
struct TileWalk {
  int count;
  __device__ __forceinline__ explicit TileWalk(int n) {
    const int tiles = (n + kMmaTileRows - 1) / kMmaTileRows;
    const int b = static_cast<int>(blockIdx.x), grid = static_cast<int>(gridDim.x);
    count = b < tiles ? (tiles - 1 - b) / grid + 1 : 0;
  }
  __device__ __forceinline__ static int row0(int i) {
    return (static_cast<int>(blockIdx.x) + i * static_cast<int>(gridDim.x)) * kMmaTileRows;
  }
};

// The partial-sum buffer of a block's tile-th tile: two alternate (after TileWalk's barrier-per-tile rule).
__device__ __forceinline__ float* tile_sums(float* partial, int tile, int warps) {
  return partial + (tile & 1) * (warps * kMmaTileRows * kMmaMaxRows);
}

// acc += the dot products of one scale group: rows g (scale s_a) and g + 8 (scale s_b).
__device__ __forceinline__ void add_scaled(float (&acc)[4], float s_a, float s_b, const float (&dot)[4]) {
  acc[0] = fmaf(s_a, dot[0], acc[0]);
  acc[1] = fmaf(s_a, dot[1], acc[1]);
  acc[2] = fmaf(s_b, dot[2], acc[2]);
  acc[3] = fmaf(s_b, dot[3], acc[3]);
}

// The next item a warp copies: its number, tile index and block within the tile.
struct CopyCursor {
  int item = 0, tile = 0, j = 0;
  __device__ __forceinline__ void advance(int mine) {
    ++item;
    if (++j == mine) {
      j = 0;
      ++tile;
    }
  }
};

// 2^23 + byte j of w as a float (one byte permute).
__device__ __forceinline__ float magic_byte(unsigned w, int j) {
  return __uint_as_float(__byte_perm(w, 0x4b000000u, 0x7440u | static_cast<unsigned>(j)));
}

// The block's epilogue: each warp's accumulators (rows g and g + 8 of the tile, columns 2t and
// 2t + 1) into `partial` ([warps][16][8] floats), then the threads add the warps' sums in order,
// multiply by the row's scale (when given), add the bias and store rows of y that exist.
template <typename T>
__device__ __forceinline__ void store_tile(const float (&acc)[4], float* partial, T* __restrict__ y,
                                           const T* __restrict__ bias, int rows, int n, long long ldy,
                                           int row0, const float* __restrict__ row_scale = nullptr) {
  const int tid = static_cast<int>(threadIdx.x);
  const int warps = static_cast<int>(blockDim.x) >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  float* own = partial + (tid >> 5) * (kMmaTileRows * kMmaMaxRows);
  own[g * kMmaMaxRows + 2 * t] = acc[0];
  own[g * kMmaMaxRows + 2 * t + 1] = acc[1];
  own[(g + 8) * kMmaMaxRows + 2 * t] = acc[2];
  own[(g + 8) * kMmaMaxRows + 2 * t + 1] = acc[3];
  __syncthreads();
  for (int item = tid; item < kMmaTileRows * kMmaMaxRows; item += static_cast<int>(blockDim.x)) {
    const int r = item & (kMmaTileRows - 1);
    const int c = item >> 4;
    const int row = row0 + r;
    if (c < rows && row < n) {
      float total = 0.0f;
      for (int p = 0; p < warps; ++p)
        total += partial[p * (kMmaTileRows * kMmaMaxRows) + r * kMmaMaxRows + c];
      if (row_scale != nullptr) total *= row_scale[row];
      if (bias != nullptr) total += to_float(bias[row]);
      y[c * ldy + row] = from_float<T>(total);
    }
  }
}

// The four x elements of column g at p as one B-fragment pair: (e0, e2), (e1, e3) (zeros past rows).
template <typename T>
__device__ __forceinline__ void x_quad(const T* p, bool has_x, bool vec, unsigned& b0, unsigned& b1) {
  unsigned x01 = 0u, x23 = 0u;
  if (has_x && vec) {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
    x01 = v.x;
    x23 = v.y;
  } else if (has_x) {
    const unsigned short* h = reinterpret_cast<const unsigned short*>(p);
    x01 = static_cast<unsigned>(__ldg(h)) | (static_cast<unsigned>(__ldg(h + 1)) << 16);
    x23 = static_cast<unsigned>(__ldg(h + 2)) | (static_cast<unsigned>(__ldg(h + 3)) << 16);
  }
  b0 = __byte_perm(x01, x23, 0x5410u);
  b1 = __byte_perm(x01, x23, 0x7632u);
}

// Stage elements [k0, k0 + 256) of each of the first x_rows rows of x (16-byte aligned rows) at
// dst + m * kMmaXStride with cp.async, 16 bytes per lane; elements at or past k are not read.
template <typename T>
__device__ __forceinline__ void stage_x(unsigned dst, const T* x, long long ldx, int x_rows, long long k0,
                                        int k, int lane) {
  if (k0 + 8 * lane >= k) return;
  for (int m = 0; m < x_rows; ++m)
    gemm::cp_async_16(dst + m * kMmaXStride + 16 * lane, x + m * ldx + k0 + 8 * lane);
}

// x_quad from x's staged copy when `staged` (xs: the lane's four elements in shared memory), else
// from global memory at xg.
template <typename T>
__device__ __forceinline__ void x_quad_staged(const unsigned char* xs, const T* xg, bool has_x, bool staged,
                                              unsigned& b0, unsigned& b1) {
  if (has_x && staged) {
    const uint2 v = *reinterpret_cast<const uint2*>(xs);
    b0 = __byte_perm(v.x, v.y, 0x5410u);
    b1 = __byte_perm(v.x, v.y, 0x7632u);
  } else {
    x_quad(xg, has_x, false, b0, b1);
  }
}

// A fragment registers holding kBase + q (the magic kept: the caller corrects with the sum of x): one
// byte permute each, quant bytes 0 and 2 (1 and 3) under the magic's high byte.
template <typename T>
__device__ __forceinline__ void a_fragment_magic(unsigned qa, unsigned qb, unsigned (&a)[4]) {
  constexpr unsigned kHigh = (Magic<T>::kMagic >> 8) * 0x01010101u;  // the magic's exponent byte, four times
  a[0] = __byte_perm(qa, kHigh, 0x4240u);
  a[1] = __byte_perm(qb, kHigh, 0x4240u);
  a[2] = __byte_perm(qa, kHigh, 0x4341u);
  a[3] = __byte_perm(qb, kHigh, 0x4341u);
}

// A fragment registers from the quant bytes of rows g (qa) and g + 8 (qb), each byte q + Bias < 128:
// bytes 0 and 2 at k slots (2t, 2t + 1), bytes 1 and 3 at (2t + 8, 2t + 9).
template <typename T, int Bias>
__device__ __forceinline__ void a_fragment(unsigned qa, unsigned qb, unsigned (&a)[4]) {
  a_fragment_magic<T>(qa, qb, a);
#pragma unroll
  for (int i = 0; i < 4; ++i) a[i] = Magic<T>::template strip<Bias>(a[i]);
}

// A fragment registers of 16 h from the high nibbles of u (rows g and g + 8): bf16 only.
__device__ __forceinline__ void a_fragment_high16(unsigned ha, unsigned hb, unsigned (&a)[4]) {
  using M = Magic<__nv_bfloat16>;
  constexpr unsigned kSixteen = 0x41804180u;  // 16.0 in both halves
  constexpr unsigned kNeg = 0xc508c508u;      // -(128 + 8) * 16 = -2176
  const unsigned v[4] = {(ha & 0x00ff00ffu) | M::kMagic, (hb & 0x00ff00ffu) | M::kMagic,
                         ((ha >> 8) & 0x00ff00ffu) | M::kMagic, ((hb >> 8) & 0x00ff00ffu) | M::kMagic};
#pragma unroll
  for (int i = 0; i < 4; ++i)
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(a[i]) : "r"(v[i]), "r"(kSixteen), "r"(kNeg));
}

template <typename T>
struct IsHalf {
  static constexpr bool value = false;
};
template <>
struct IsHalf<__half> {
  static constexpr bool value = true;
};

// dot += the products of one k16 step of Q8_0 quant words (rows g and g + 8) with x's fragment.
template <typename T>
__device__ __forceinline__ void q8_mma(unsigned wa, unsigned wb, unsigned b0, unsigned b1, float (&dot)[4]) {
  const unsigned ua = wa ^ 0x80808080u, ub = wb ^ 0x80808080u;  // u = q + 128
  unsigned a[4];
  if constexpr (IsHalf<T>::value) {
    a_fragment<T, 128>(ua, ub, a);  // fp16: 1024 + u exact
    matmul::Mma<T>::run(dot, a, b0, b1);
  } else {
    a_fragment_high16((ua >> 4) & 0x0f0f0f0fu, (ub >> 4) & 0x0f0f0f0fu, a);
    matmul::Mma<T>::run(dot, a, b0, b1);
    a_fragment<T, 0>(ua & 0x0f0f0f0fu, ub & 0x0f0f0f0fu, a);
    matmul::Mma<T>::run(dot, a, b0, b1);
  }
}

}  // namespace qgemv
}  // namespace ops
}  // namespace pygpukit
