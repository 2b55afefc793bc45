// Decode GEMVs over GGUF weights on the tensor cores (pygpukit/ops/quant/gemv.py; the scheme shared
// with the FP8 / INT8 kernel is mma_gemv.cuh's):
//
//   gguf_gemv_mma<Type, T>(x, w, y, bias, rows, n, k, ldx, ldy, vector)     Q4_K (12), Q5_K (13)
//   gguf_gemv_mma_q6k<T>(...)                                               Q6_K
//   gguf_gemv_mma_q8_0<T>(...)                                              Q8_0
//       y[m, r] = sum_k x[m, k] * W[r, k] (+ bias[r]) for m < rows <= 8 and r < n, T fp16 or bf16,
//       float32 accumulation; W's rows are blocks of the ggml type back to back. Q4_K / Q5_K need the
//       weight's start 16-byte aligned (so every block and its fields are); Q6_K and Q8_0 blocks start
//       anywhere even (their own comments below).
//
// Work split: a block of `warps` warps (2 to 16) takes 16 rows of W at a time (one mma row tile);
// warp w walks the k-quant blocks w, w + warps, ... of those rows. The grid is at most the blocks the
// device holds at once; block b takes tiles b, b + gridDim.x, ... (mma_gemv.cuh: TileWalk), its
// warps' copies running ahead across tiles. Lane (g, t) = (lane / 4, lane % 4) reads rows g and
// g + 8 of the tile: the block's 16-byte header (d, dmin, the packed 6-bit scales and mins) and, for
// each 32-element sub-block, the quants of elements 8t .. 8t + 7 (8 bytes at a time). So the four
// lanes of a row hold a quarter of every sub-block, and each mma sums over one sub-block only: the
// products of a sub-block are scaled by its d * scale in float32 after the mma, and its min term
// -dmin * min * sum(x) uses the sum of x over the sub-block that an mma with an all-ones A gives in
// the accumulators' layout.
//
// Each warp stages its blocks in shared memory with cp.async (Stages deep, rows padded so that
// the fragment reads are free of bank conflicts), so that two blocks per warp are in flight while one
// is multiplied, whatever the register budget. The block's warps add their partial sums through
// shared memory in a fixed order (the same for any grid): results do not depend on timing. Dynamic
// shared memory: warps * (Stages * 16 * row stride + 2 * 16 * 8 floats) (ops/quant/gemv.py:
// _mma_shared).
#include "gguf_formats.cuh"
#include "mma_gemv.cuh"

namespace pygpukit {
namespace ops {
namespace qgemv {

// A lane's bytes of one block of one row, read from the block's staged copy: the 16-byte header and,
// per pair of sub-blocks, the 8 quant bytes of elements 8t .. 8t + 7 (Q5_K also its 8 bytes of fifth
// bits).
struct KRaw {
  uint4 head;
  uint2 q[4];
  uint2 h;
};

template <int Type>
struct MmaFormat;

template <>
struct MmaFormat<12> {  // Q4_K: header, then 4 x 32 bytes of nibbles (low: sub-block 2j, high: 2j + 1)
  static constexpr int kBytes = 144;
  __device__ __forceinline__ static KRaw load(const unsigned char* block, int t) {
    KRaw r;
    r.head = *reinterpret_cast<const uint4*>(block);
#pragma unroll
    for (int j = 0; j < 4; ++j) r.q[j] = *reinterpret_cast<const uint2*>(block + 16 + 32 * j + 8 * t);
    r.h = make_uint2(0u, 0u);
    return r;
  }
  // The quants (0 .. 15) of sub-block sb's elements 8t + 4 * half + (0 .. 3), one per byte.
  __device__ __forceinline__ static unsigned quad(const KRaw& r, int sb, int half) {
    const unsigned w = half == 0 ? r.q[sb >> 1].x : r.q[sb >> 1].y;
    return (w >> (4 * (sb & 1))) & 0x0f0f0f0fu;
  }
};

template <>
struct MmaFormat<13> {  // Q5_K: header, 32 bytes of fifth bits (bit sb: sub-block sb), Q4_K's nibbles
  static constexpr int kBytes = 176;
  __device__ __forceinline__ static KRaw load(const unsigned char* block, int t) {
    KRaw r;
    r.head = *reinterpret_cast<const uint4*>(block);
    r.h = *reinterpret_cast<const uint2*>(block + 16 + 8 * t);
#pragma unroll
    for (int j = 0; j < 4; ++j) r.q[j] = *reinterpret_cast<const uint2*>(block + 48 + 32 * j + 8 * t);
    return r;
  }
  __device__ __forceinline__ static unsigned quad(const KRaw& r, int sb, int half) {
    const unsigned w = half == 0 ? r.q[sb >> 1].x : r.q[sb >> 1].y;
    const unsigned h = half == 0 ? r.h.x : r.h.y;
    return ((w >> (4 * (sb & 1))) & 0x0f0f0f0fu) | (((h >> sb) & 0x01010101u) << 4);
  }
};

// Staging of a warp's 16 rows of one block in shared memory: row stride in 4-byte words the smallest
// multiple of 4 (16-byte rows) at or above the block that is 8 or 24 modulo 32, so that the 64-bit
// reads of a half warp (rows g .. g + 3, lanes t at 8-byte steps) hit 32 distinct banks.
template <int Bytes>
struct MmaStage {
  __host__ __device__ static constexpr int stride_words(int w) {
    return (w % 32 == 8 || w % 32 == 24) ? w : stride_words(w + 4);
  }
  static constexpr int kStride = 4 * stride_words((Bytes + 15) / 16 * 4);
  static constexpr int kChunks =
      Bytes / 16;  // 16-byte copies per row (the k-quant blocks are multiples of 16)
  static constexpr int kBytes = kMmaTileRows * kStride;
};

// Stages (a template argument, 2 or 3): the blocks of a warp staged at once, Stages - 1 loading while one
// is multiplied. Three keep two blocks per warp in flight; two need less shared memory, so that three
// blocks of 8 warps fit on an SM instead of two.

// The scale d * sc and offset -dmin * m of sub-block sb from a Q4_K / Q5_K header: the 6-bit fields
// unpacked four at a time, d * sc as fma(d, 2^23 + sc, -d * 2^23) (one rounding, as d * float(sc)).
struct KScales {
  float d, dmin, dk, mk;
  unsigned sc0, sc1, mn0, mn1;
  __device__ __forceinline__ explicit KScales(const uint4& head) {
    d = float_from_half_bits(head.x & 0xffffu);
    dmin = float_from_half_bits(head.x >> 16);
    dk = -d * 8388608.0f;
    mk = dmin * 8388608.0f;
    sc0 = head.y & 0x3f3f3f3fu;
    mn0 = head.z & 0x3f3f3f3fu;
    sc1 = (head.w & 0x0f0f0f0fu) | ((head.y >> 2) & 0x30303030u);
    mn1 = ((head.w >> 4) & 0x0f0f0f0fu) | ((head.z >> 2) & 0x30303030u);
  }
  __device__ __forceinline__ float scale(int sb) const {
    return fmaf(d, magic_byte(sb < 4 ? sc0 : sc1, sb & 3), dk);
  }
  __device__ __forceinline__ float offset(int sb) const {
    return fmaf(-dmin, magic_byte(sb < 4 ? mn0 : mn1, sb & 3), mk);
  }
};

template <int Type, typename T, int Stages>
__global__ void __launch_bounds__(kMmaMaxThreads, 3)
    gguf_gemv_mma(const T* __restrict__ x, const unsigned char* __restrict__ w, T* __restrict__ y,
                  const T* __restrict__ bias, int rows, int n, int k, long long ldx, long long ldy,
                  int vector) {
  using F = MmaFormat<Type>;
  using S = MmaStage<F::kBytes>;
  using M = Magic<T>;
  constexpr int kCopies = (kMmaTileRows * S::kChunks + 31) / 32;  // weight chunks per lane and block
  // bf16 keeps the magic 128 in the A values (removed through the sum of x, below): exact products,
  // the sum about 17 times the size of the dot product; fp16's 1024 would be too large, it strips it.
  constexpr bool kFold = !IsHalf<T>::value;
  extern __shared__ __align__(16) unsigned char smem[];  // [warps][stages][W rows, x rows], then sums

  const int tid = static_cast<int>(threadIdx.x);
  const int warps = static_cast<int>(blockDim.x) >> 5;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int blocks_per_row = k / 256;
  const long long row_bytes = static_cast<long long>(blocks_per_row) * F::kBytes;
  const bool vec = vector != 0;
  const int x_rows = vec ? rows : 0;  // rows of x staged with the weights (16-byte aligned x only)
  const int stage_bytes = S::kBytes + x_rows * kMmaXStride;
  unsigned char* stages = smem + warp * (Stages * stage_bytes);
  float* partial = reinterpret_cast<float*>(smem + warps * (Stages * stage_bytes));  // [2][warps][16][8]
  const bool has_x = g < rows;
  const T* x_row = x + (has_x ? static_cast<long long>(g) * ldx : 0) + 8 * t;
  const unsigned ones[4] = {M::kOne, M::kOne, M::kOne, M::kOne};
  const int mine = blocks_per_row > warp ? (blocks_per_row - warp + warps - 1) / warps : 0;
  const TileWalk tiles(n);
  const int items = tiles.count * mine;

  // This lane's weight chunks of every block: chunk c = lane + 32 j of the tile's 16 x kChunks (rows
  // past n read row n - 1, whose sums are not stored): its row in the tile, its offset in the block
  // and its destination in the stage.
  int src_row[kCopies], src_off[kCopies], dst[kCopies];
#pragma unroll
  for (int j = 0; j < kCopies; ++j) {
    const int c = min(lane + 32 * j, kMmaTileRows * S::kChunks - 1);
    const int r = c / S::kChunks, chunk = c - r * S::kChunks;
    src_row[j] = r;
    src_off[j] = 16 * chunk;
    dst[j] = r * S::kStride + 16 * chunk;
  }
  // Copy the cursor's item (block warp + j * warps of each row of its tile) and the matching 256
  // elements of every row of x into stage item % Stages.
  CopyCursor next;
  auto copy = [&]() {
    if (next.item < items) {
      const int b = warp + next.j * warps;
      const int row0 = TileWalk::row0(next.tile);
      const unsigned char* block = w + static_cast<long long>(b) * F::kBytes;
      unsigned char* stage = stages + (next.item % Stages) * stage_bytes;
      const unsigned base = gemm::shared_address(stage);
#pragma unroll
      for (int j = 0; j < kCopies; ++j) {
        if (lane + 32 * j < kMmaTileRows * S::kChunks) {
          gemm::cp_async_16(base + dst[j], block + row_bytes * min(row0 + src_row[j], n - 1) + src_off[j]);
        }
      }
      stage_x(base + S::kBytes, x, ldx, x_rows, static_cast<long long>(b) * 256, k, lane);
      next.advance(mine);
    }
    gemm::cp_async_commit();  // an empty group past the end keeps the wait count uniform
  };
#pragma unroll
  for (int i = 0; i < Stages - 1; ++i) copy();

  int i = 0;  // the warp's item being multiplied
#pragma unroll 1
  for (int tile = 0; tile < tiles.count; ++tile) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 1
    for (int j = 0; j < mine; ++j, ++i) {
      copy();
      gemm::cp_async_wait<Stages - 1>();
      __syncwarp();
      const unsigned char* stage = stages + (i % Stages) * stage_bytes;
      const KRaw raw_a = F::load(stage + g * S::kStride, t);
      const KRaw raw_b = F::load(stage + (g + 8) * S::kStride, t);
      const KScales scales_a(raw_a.head), scales_b(raw_b.head);
      const unsigned char* xs = stage + S::kBytes + g * kMmaXStride + 16 * t;
      const T* xb = x_row + static_cast<long long>(warp + j * warps) * 256;
#pragma unroll
      for (int sb = 0; sb < 8; ++sb) {
        // x: elements 8t .. 8t + 7 of the sub-block for column g (zeros for columns past rows)
        uint4 xv = make_uint4(0u, 0u, 0u, 0u);
        if (has_x && vec) {
          xv = *reinterpret_cast<const uint4*>(xs + 64 * sb);
        } else if (has_x) {
          const unsigned short* p = reinterpret_cast<const unsigned short*>(xb + 32 * sb);
          xv.x = static_cast<unsigned>(__ldg(p)) | (static_cast<unsigned>(__ldg(p + 1)) << 16);
          xv.y = static_cast<unsigned>(__ldg(p + 2)) | (static_cast<unsigned>(__ldg(p + 3)) << 16);
          xv.z = static_cast<unsigned>(__ldg(p + 4)) | (static_cast<unsigned>(__ldg(p + 5)) << 16);
          xv.w = static_cast<unsigned>(__ldg(p + 6)) | (static_cast<unsigned>(__ldg(p + 7)) << 16);
        }
        float dot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const unsigned x01 = half == 0 ? xv.x : xv.z;
          const unsigned x23 = half == 0 ? xv.y : xv.w;
          const unsigned b0 = __byte_perm(x01, x23, 0x5410u);  // (e0, e2)
          const unsigned b1 = __byte_perm(x01, x23, 0x7632u);  // (e1, e3)
          const unsigned qa = F::quad(raw_a, sb, half);
          const unsigned qb = F::quad(raw_b, sb, half);
          unsigned a[4];
          if constexpr (kFold) {
            a_fragment_magic<T>(qa, qb, a);
          } else {
            a_fragment<T, 0>(qa, qb, a);
          }
          matmul::Mma<T>::run(dot, a, b0, b1);
          matmul::Mma<T>::run(sum, ones, b0, b1);  // the sum of x over the sub-block, per column
        }
        const float sa = scales_a.scale(sb), sb_ = scales_b.scale(sb);
        // with the magic kept, dot = sum (q + 128) x: the offset term takes -128 s
        const float oa = kFold ? fmaf(-128.0f, sa, scales_a.offset(sb)) : scales_a.offset(sb);
        const float ob = kFold ? fmaf(-128.0f, sb_, scales_b.offset(sb)) : scales_b.offset(sb);
        acc[0] = fmaf(sa, dot[0], fmaf(oa, sum[0], acc[0]));
        acc[1] = fmaf(sa, dot[1], fmaf(oa, sum[1], acc[1]));
        acc[2] = fmaf(sb_, dot[2], fmaf(ob, sum[2], acc[2]));
        acc[3] = fmaf(sb_, dot[3], fmaf(ob, sum[3], acc[3]));
      }
      __syncwarp();  // every lane has read the stage before a later copy overwrites it
    }
    store_tile(acc, tile_sums(partial, tile, warps), y, bias, rows, n, ldy, TileWalk::row0(tile));
  }
  gemm::cp_async_wait<0>();
}

// Q6_K (210-byte blocks: 128 bytes of low nibbles ql, 64 of 2-bit highs qh, 16 int8 scales, f16 d;
// element e = 128 h + 32 Q + l has q = (ql[64 h + 32 (Q & 1) + l] >> 4 (Q >> 1)) & 15 | ((qh[32 h + l] >> 2
// Q) & 3) << 4, minus 32, and scale d * scales[e / 16]). Its blocks start only 2-byte aligned, so each warp
// stages the 16-byte aligned chunks that hold a block (14 of them: the block's start is `lead` bytes past the
// first, lead even and at most 14) and reads its words at lead + offset with two aligned 4-byte reads and a
// funnel shift. A group of 16 elements shares a scale: one mma per group (lane t: elements 4t .. 4t + 3, one
// ql and one qh word per row), no minimum, so no sum of x.
constexpr int kQ6Bytes = 210;
constexpr int kQ6Chunks = 14;              // 16-byte chunks from a block's aligned-down start
constexpr int kQ6Stride = 16 * kQ6Chunks;  // 56 words: 24 modulo 32
constexpr int kQ6StageBytes = kMmaTileRows * kQ6Stride;

// Copy into `stage` the aligned 16-byte chunks that hold bytes [offset, offset + span) of each of the
// tile's 16 rows (rows past n read row n - 1): chunk c of row r to r * Stride + 16 c. Chunks past the
// span or the row's last byte are skipped (never read; a 16-byte aligned chunk that holds a byte of the
// weight never crosses a page).
template <int Chunks, int Stride>
__device__ __forceinline__ void copy_unaligned(unsigned char* stage, const unsigned char* w,
                                               long long row_bytes, int row0, int n, long long offset,
                                               int span, int lane) {
  for (int c = lane; c < kMmaTileRows * Chunks; c += 32) {
    const int r = c / Chunks, chunk = c - r * Chunks;
    const unsigned char* row = w + row_bytes * min(row0 + r, n - 1);
    const unsigned long long start = reinterpret_cast<unsigned long long>(row + offset);
    const unsigned long long last = reinterpret_cast<unsigned long long>(row + row_bytes);
    const unsigned long long src = (start & ~15ull) + 16ull * chunk;
    if (src < last && src < start + span) {
      gemm::cp_async_16(gemm::shared_address(stage + r * Stride + 16 * chunk),
                        reinterpret_cast<const void*>(src));
    }
  }
}

// The 4 bytes at byte p (even) of a staged row.
__device__ __forceinline__ unsigned staged_word(const unsigned char* row, int p) {
  const unsigned* words = reinterpret_cast<const unsigned*>(row + (p & ~3));
  return __funnelshift_r(words[0], words[1], (p & 3) * 8);
}

template <typename T, int Stages>
__global__ void __launch_bounds__(kMmaMaxThreads, 3)
    gguf_gemv_mma_q6k(const T* __restrict__ x, const unsigned char* __restrict__ w, T* __restrict__ y,
                      const T* __restrict__ bias, int rows, int n, int k, long long ldx, long long ldy,
                      int vector) {
  extern __shared__ __align__(16) unsigned char smem[];  // [warps][stages][16 rows][stride], then sums

  const int tid = static_cast<int>(threadIdx.x);
  const int warps = static_cast<int>(blockDim.x) >> 5;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int blocks_per_row = k / 256;
  const long long row_bytes = static_cast<long long>(blocks_per_row) * kQ6Bytes;
  const bool vec = vector != 0;
  const int x_rows = vec ? rows : 0;  // rows of x staged with the weights (16-byte aligned x only)
  const int stage_bytes = kQ6StageBytes + x_rows * kMmaXStride;
  unsigned char* stages = smem + warp * (Stages * stage_bytes);
  float* partial = reinterpret_cast<float*>(smem + warps * (Stages * stage_bytes));
  const bool has_x = g < rows;
  const T* x_row = x + (has_x ? static_cast<long long>(g) * ldx : 0) + 4 * t;
  const int mine = blocks_per_row > warp ? (blocks_per_row - warp + warps - 1) / warps : 0;
  const TileWalk tiles(n);
  const int items = tiles.count * mine;

  // Copy the aligned chunks holding the cursor's block of each row of its tile, and the matching 256
  // elements of every row of x, into stage item % Stages.
  CopyCursor next;
  auto copy = [&]() {
    if (next.item < items) {
      const int b = warp + next.j * warps;
      unsigned char* stage = stages + (next.item % Stages) * stage_bytes;
      copy_unaligned<kQ6Chunks, kQ6Stride>(stage, w, row_bytes, TileWalk::row0(next.tile), n,
                                           static_cast<long long>(b) * kQ6Bytes, kQ6Bytes, lane);
      stage_x(gemm::shared_address(stage + kQ6StageBytes), x, ldx, x_rows, static_cast<long long>(b) * 256, k,
              lane);
      next.advance(mine);
    }
    gemm::cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < Stages - 1; ++i) copy();

  int i = 0;
#pragma unroll 1
  for (int tile = 0; tile < tiles.count; ++tile) {
    const int row0 = TileWalk::row0(tile);
    const unsigned char* row_a = w + row_bytes * min(row0 + g, n - 1);
    const unsigned char* row_b = w + row_bytes * min(row0 + g + 8, n - 1);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 1
    for (int jb = 0; jb < mine; ++jb, ++i) {
      copy();
      gemm::cp_async_wait<Stages - 1>();
      __syncwarp();
      const int b = warp + jb * warps;
      const unsigned char* stage = stages + (i % Stages) * stage_bytes;
      const unsigned char* xs = stage + kQ6StageBytes + g * kMmaXStride + 8 * t;
      const int lead_a = static_cast<int>(
          reinterpret_cast<unsigned long long>(row_a + static_cast<long long>(b) * kQ6Bytes) & 15);
      const int lead_b = static_cast<int>(
          reinterpret_cast<unsigned long long>(row_b + static_cast<long long>(b) * kQ6Bytes) & 15);
      const float da = float_from_half_bits(staged_word(stage + g * kQ6Stride, lead_a + 208) & 0xffffu);
      const float db = float_from_half_bits(staged_word(stage + (g + 8) * kQ6Stride, lead_b + 208) & 0xffffu);
      const T* xb = x_row + static_cast<long long>(b) * 256;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // int8 scales of the half's 8 groups, biased to unsigned bytes (^ 0x80)
        const unsigned sca0 = staged_word(stage + g * kQ6Stride, lead_a + 192 + 8 * h) ^ 0x80808080u;
        const unsigned sca1 = staged_word(stage + g * kQ6Stride, lead_a + 196 + 8 * h) ^ 0x80808080u;
        const unsigned scb0 = staged_word(stage + (g + 8) * kQ6Stride, lead_b + 192 + 8 * h) ^ 0x80808080u;
        const unsigned scb1 = staged_word(stage + (g + 8) * kQ6Stride, lead_b + 196 + 8 * h) ^ 0x80808080u;
#pragma unroll
        for (int i16 = 0; i16 < 2; ++i16) {
          const int l = 16 * i16 + 4 * t;
          const unsigned qha = staged_word(stage + g * kQ6Stride, lead_a + 128 + 32 * h + l);
          const unsigned qhb = staged_word(stage + (g + 8) * kQ6Stride, lead_b + 128 + 32 * h + l);
#pragma unroll
          for (int qodd = 0; qodd < 2; ++qodd) {
            const unsigned qla = staged_word(stage + g * kQ6Stride, lead_a + 64 * h + 32 * qodd + l);
            const unsigned qlb = staged_word(stage + (g + 8) * kQ6Stride, lead_b + 64 * h + 32 * qodd + l);
#pragma unroll
            for (int qhigh = 0; qhigh < 2; ++qhigh) {
              const int quarter = 2 * qhigh + qodd;         // Q
              const int group = 8 * h + 2 * quarter + i16;  // elements 16 group .. 16 group + 15
              const unsigned va =
                  ((qla >> (4 * qhigh)) & 0x0f0f0f0fu) | (((qha >> (2 * quarter)) & 0x03030303u) << 4);
              const unsigned vb =
                  ((qlb >> (4 * qhigh)) & 0x0f0f0f0fu) | (((qhb >> (2 * quarter)) & 0x03030303u) << 4);
              unsigned a[4];
              a_fragment<T, 32>(va, vb, a);
              unsigned b0, b1;
              x_quad_staged(xs + 32 * group, xb + 16 * group, has_x, vec, b0, b1);
              float dot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
              matmul::Mma<T>::run(dot, a, b0, b1);
              const int j = group & 7;  // the scale's byte within the half's 8
              const float ka = magic_byte(j < 4 ? sca0 : sca1, j & 3) - 8388736.0f;  // 2^23 + 128
              const float kb = magic_byte(j < 4 ? scb0 : scb1, j & 3) - 8388736.0f;
              add_scaled(acc, da * ka, db * kb, dot);
            }
          }
        }
      }
      __syncwarp();
    }
    store_tile(acc, tile_sums(partial, tile, warps), y, bias, rows, n, ldy, row0);
  }
  gemm::cp_async_wait<0>();
}

// Q8_0 (34-byte blocks of 32 elements: f16 d, 32 int8 quants): a warp step covers 8 blocks (256
// elements, 272 bytes) of each of its 16 rows, staged as the 18 aligned 16-byte chunks that hold them
// (their start is `lead` bytes past the first chunk); K need only be a multiple of 32 (a last step of
// fewer blocks). Lane t takes elements 8t .. 8t + 7 of each block: two mma steps of 4. int8 quants
// are not exact in bf16 after the 128 + q trick, so with u = q + 128 = 16 (h + 8) + l the A fragment
// is 16 h (exact: a multiple of 16 below 128 in magnitude) plus, in a second mma into the same
// accumulators, l (0 .. 15); fp16 holds 1024 + u and takes one mma of q.
constexpr int kQ8Bytes = 34;
constexpr int kQ8StepBlocks = 8;
constexpr int kQ8Chunks = 18;              // (15 + 8 * 34) bytes round up to 16-byte chunks
constexpr int kQ8Stride = 16 * kQ8Chunks;  // 72 words: 8 modulo 32
constexpr int kQ8StageBytes = kMmaTileRows * kQ8Stride;

template <typename T, int Stages>
__global__ void __launch_bounds__(kMmaMaxThreads, 3)
    gguf_gemv_mma_q8_0(const T* __restrict__ x, const unsigned char* __restrict__ w, T* __restrict__ y,
                       const T* __restrict__ bias, int rows, int n, int k, long long ldx, long long ldy,
                       int vector) {
  extern __shared__ __align__(16) unsigned char smem[];  // [warps][stages][16 rows][stride], then sums

  const int tid = static_cast<int>(threadIdx.x);
  const int warps = static_cast<int>(blockDim.x) >> 5;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int blocks_per_row = k / 32;
  const int steps = (blocks_per_row + kQ8StepBlocks - 1) / kQ8StepBlocks;
  const long long row_bytes = static_cast<long long>(blocks_per_row) * kQ8Bytes;
  const bool vec = vector != 0;
  const int x_rows = vec ? rows : 0;  // rows of x staged with the weights (16-byte aligned x only)
  const int stage_bytes = kQ8StageBytes + x_rows * kMmaXStride;
  unsigned char* stages = smem + warp * (Stages * stage_bytes);
  float* partial = reinterpret_cast<float*>(smem + warps * (Stages * stage_bytes));
  const bool has_x = g < rows;
  const T* x_row = x + (has_x ? static_cast<long long>(g) * ldx : 0) + 8 * t;
  const int mine = steps > warp ? (steps - warp + warps - 1) / warps : 0;
  const TileWalk tiles(n);
  const int items = tiles.count * mine;
  constexpr int kSpan = kQ8StepBlocks * kQ8Bytes;

  // Copy the aligned chunks holding the cursor's step of each row of its tile, and the matching (up
  // to) 256 elements of every row of x, into stage item % Stages.
  CopyCursor next;
  auto copy = [&]() {
    if (next.item < items) {
      const int step = warp + next.j * warps;
      unsigned char* stage = stages + (next.item % Stages) * stage_bytes;
      copy_unaligned<kQ8Chunks, kQ8Stride>(stage, w, row_bytes, TileWalk::row0(next.tile), n,
                                           static_cast<long long>(step) * kSpan, kSpan, lane);
      stage_x(gemm::shared_address(stage + kQ8StageBytes), x, ldx, x_rows,
              static_cast<long long>(step) * (kQ8StepBlocks * 32), k, lane);
      next.advance(mine);
    }
    gemm::cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < Stages - 1; ++i) copy();

  int i = 0;
#pragma unroll 1
  for (int tile = 0; tile < tiles.count; ++tile) {
    const int row0 = TileWalk::row0(tile);
    const unsigned char* row_a = w + row_bytes * min(row0 + g, n - 1);
    const unsigned char* row_b = w + row_bytes * min(row0 + g + 8, n - 1);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 1
    for (int js = 0; js < mine; ++js, ++i) {
      copy();
      gemm::cp_async_wait<Stages - 1>();
      __syncwarp();
      const int step = warp + js * warps;
      const long long offset = static_cast<long long>(step) * kSpan;
      const unsigned char* stage = stages + (i % Stages) * stage_bytes;
      const unsigned char* xstage = stage + kQ8StageBytes + g * kMmaXStride + 16 * t;
      const unsigned char* sa = stage + g * kQ8Stride;
      const unsigned char* sb = stage + (g + 8) * kQ8Stride;
      const int lead_a = static_cast<int>(reinterpret_cast<unsigned long long>(row_a + offset) & 15);
      const int lead_b = static_cast<int>(reinterpret_cast<unsigned long long>(row_b + offset) & 15);
      const int blocks = min(kQ8StepBlocks, blocks_per_row - step * kQ8StepBlocks);
      const T* xs = x_row + static_cast<long long>(step) * (kQ8StepBlocks * 32);
#pragma unroll
      for (int j = 0; j < kQ8StepBlocks; ++j) {
        if (j < blocks) {  // uniform over the warp
          const int at_a = lead_a + kQ8Bytes * j, at_b = lead_b + kQ8Bytes * j;
          float dot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            unsigned b0, b1;
            x_quad_staged(xstage + 64 * j + 8 * half, xs + 32 * j + 4 * half, has_x, vec, b0, b1);
            q8_mma<T>(staged_word(sa, at_a + 2 + 8 * t + 4 * half),
                      staged_word(sb, at_b + 2 + 8 * t + 4 * half), b0, b1, dot);
          }
          const float da = float_from_half_bits(staged_word(sa, at_a) & 0xffffu);
          const float db = float_from_half_bits(staged_word(sb, at_b) & 0xffffu);
          add_scaled(acc, da, db, dot);
        }
      }
      __syncwarp();
    }
    store_tile(acc, tile_sums(partial, tile, warps), y, bias, rows, n, ldy, row0);
  }
  gemm::cp_async_wait<0>();
}

}  // namespace qgemv
}  // namespace ops
}  // namespace pygpukit
