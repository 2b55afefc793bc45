// Grouped GEMM over MoE experts stored in a GGUF block format, for more routed rows than the grouped
// GEMV takes (pygpukit/ops/quant/experts.py):
//
//   gguf_grouped_gemm<Type, T, BM, BN, WARPS_M, WARPS_N>(a, w, out, offsets, experts, total_rows, n, k,
//                                                        lda, ldc, worst_m, vector_a)
//       out[r, f] = sum_k a[r, k] * W_e[f, k] for every permuted token row r in expert e's group
//       [offsets[e], offsets[e + 1]) and feature f < n, in T (fp16 / bf16) with float32 accumulation;
//       W_e is expert e's (n, k) weight: rows e * n .. e * n + n - 1 of the stacked weight, each k / QK
//       blocks of ggml type `Type`. Rows outside every group are not written.
//
// The grid is the dense grouped GEMM's (grouped_gemm.cu): worst_m row tiles (the most that any split
// of total_rows rows among the experts can need) times ceil(n / BN) column tiles, row tile fastest;
// each block finds its expert and rows from the offsets on the device (moe_common.cuh) and leaves at
// once when the groups have fewer tiles. So no host synchronisation, and a step can be captured.
//
// A block walks K one span at a time: 256 elements, 8 blocks of the 32-element formats or one k-quant
// block. It copies the raw bytes of its BN weight rows' span into shared memory (2- or 4-byte words,
// as the format's block size and the weight's start allow), then for each 32-wide k tile of the span: A's BM
// x 32 tile through cp.async (the dense GEMM's tile copy, zero outside the group), W's BN x 32 tile decoded
// from the staged bytes (gguf_formats.cuh: s * q + o, rounded to T) and stored in the layout the mma.sync
// main loop reads, then two m16n8k16 steps of that loop's fragments (mma_mainloop.cuh). The epilogue
// is the dense GEMM's. Each weight block is decoded once per row tile that uses it: the weights are
// read from memory once per block row of the grid and reused from L2 across its row tiles.
#include "../gemm/mma_mainloop.cuh"
#include "../moe/moe_common.cuh"
#include "gguf_formats.cuh"

namespace pygpukit {
namespace ops {
namespace qgemv {

constexpr int kGemmSpan = 256;  // elements of K per staged span
constexpr int kGemmTileK = 32;  // elements of K per mma tile

// Bytes of shared memory gguf_grouped_gemm needs for a BM x BN tile of format Type (launched with
// this much dynamic shared memory; ops/quant/experts.py computes the same).
template <int Type, int BM, int BN>
struct GroupedGemmShared {
  using F = Format<Type>;
  static constexpr int kSpanBlocks = kGemmSpan / F::kElems;
  static constexpr int kSpanBytes = kSpanBlocks * F::kBytes;
  static constexpr int kWord = F::kBytes % 4 == 0 ? 4 : 2;  // the widest load every block start allows
  static constexpr int kRawStride = (kSpanBytes + 15) / 16 * 16;
  static constexpr int kTiles = (BM + BN) * kGemmTileK * 2;     // A and B tiles of 16-bit elements
  static constexpr int kBytes = kTiles + BN * kRawStride + 16;  // the readers may read past a row's end
};

template <int Type, typename T, int BM, int BN, int WARPS_M, int WARPS_N>
__global__ void __launch_bounds__(WARPS_M * WARPS_N * 32)
    gguf_grouped_gemm(const T* __restrict__ a, const unsigned char* __restrict__ w, T* out,
                      const int* __restrict__ offsets, int experts, int total_rows, int n, int k,
                      long long lda, long long ldc, int worst_m, int vector_a) {
  using F = Format<Type>;
  using Shared = GroupedGemmShared<Type, BM, BN>;
  using Mainloop = gemm::MmaMainloop<T, false, true, BM, BN, kGemmTileK, WARPS_M, WARPS_N, 2>;
  using CopyA = typename Mainloop::CopyA;
  using Word = typename gemm::Choose<Shared::kWord == 4, unsigned int, unsigned short>::type;
  constexpr int kThreads = Mainloop::kThreads;
  constexpr int kWordsPerRow = Shared::kSpanBytes / Shared::kWord;
  constexpr int kChunksPerRow = kGemmTileK / 8;
  static_assert(Shared::kSpanBytes % Shared::kWord == 0, "a span is whole words");
  static_assert((BN * kChunksPerRow) % kThreads == 0, "the decoded chunks divide among the threads");
  static_assert(WARPS_M * WARPS_N * 16 * (Mainloop::kWarpN + 8) * 4 <= Shared::kBytes,
                "the epilogue staging must fit in the shared memory");

  const int m_tile = static_cast<int>(blockIdx.x % static_cast<unsigned>(worst_m));
  const int n0 = static_cast<int>(blockIdx.x / static_cast<unsigned>(worst_m)) * BN;
  moe::GroupTile group;
  if (!moe::find_group_tile<kThreads>(offsets, experts, total_rows, BM, m_tile, group)) return;
  a += static_cast<long long>(group.begin) * lda;
  out += static_cast<long long>(group.begin) * ldc;
  const int blocks_per_row = k / F::kElems;
  const long long row_bytes = static_cast<long long>(blocks_per_row) * F::kBytes;
  const unsigned char* wexp = w + static_cast<long long>(group.expert) * n * row_bytes;
  const bool word_aligned = reinterpret_cast<unsigned long long>(w) % Shared::kWord == 0;

  extern __shared__ uint4 shared_words[];
  T* tile_a = reinterpret_cast<T*>(shared_words);
  T* tile_b = tile_a + BM * kGemmTileK;
  unsigned char* raw = reinterpret_cast<unsigned char*>(tile_b + BN * kGemmTileK);
  const unsigned address_a = gemm::shared_address(tile_a);
  const unsigned address_b = gemm::shared_address(tile_b);
  const CopyA copy_a;
  const int tid = static_cast<int>(threadIdx.x);

  typename Mainloop::Accumulators acc;
  Mainloop::zero(acc);
  for (int b0 = 0; b0 < blocks_per_row; b0 += Shared::kSpanBlocks) {
    const int nb = min(Shared::kSpanBlocks, blocks_per_row - b0);
    const int words = nb * F::kBytes / Shared::kWord;
    __syncthreads();  // every warp is done with the previous span's bytes and tiles
    const unsigned char* span = wexp + static_cast<long long>(b0) * F::kBytes;
    if (word_aligned) {
      for (int j = tid; j < BN * kWordsPerRow; j += kThreads) {
        const int row = j / kWordsPerRow;
        const int word = j - row * kWordsPerRow;
        if (n0 + row < n && word < words) {
          const Word* src = reinterpret_cast<const Word*>(span + (n0 + row) * row_bytes) + word;
          *reinterpret_cast<Word*>(raw + row * Shared::kRawStride + word * Shared::kWord) = __ldg(src);
        }
      }
    } else {  // a weight that starts off the word size (a view): byte by byte
      for (int j = tid; j < BN * Shared::kSpanBytes; j += kThreads) {
        const int row = j / Shared::kSpanBytes;
        const int byte = j - row * Shared::kSpanBytes;
        if (n0 + row < n && byte < nb * F::kBytes) {
          raw[row * Shared::kRawStride + byte] = __ldg(span + (n0 + row) * row_bytes + byte);
        }
      }
    }
    const int tiles = nb * F::kElems / kGemmTileK;
    for (int t = 0; t < tiles; ++t) {
      const int k0 = b0 * F::kElems + t * kGemmTileK;
      copy_a.checked(address_a, tile_a, a, lda, group.m0, group.rows, k0, k, vector_a != 0);
      gemm::cp_async_commit();
      if (t == 0) __syncthreads();  // the span's bytes are staged
#pragma unroll
      for (int c = tid; c < BN * kChunksPerRow; c += kThreads) {
        const int row = c / kChunksPerRow;
        const int col = (c % kChunksPerRow) * 8;
        const int at = t * kGemmTileK + col;  // element of the span
        const int blk = at / F::kElems;
        unsigned words4[4] = {0u, 0u, 0u, 0u};
        if (n0 + row < n) {
          const unsigned char* bp = raw + row * Shared::kRawStride + blk * F::kBytes;
          float s, o, q[8];
          F::scale(bp, at % F::kElems, s, o);
          F::quants(bp, at % F::kElems, q);
#pragma unroll
          for (int e = 0; e < 8; e += 2) {
            const T lo = from_float<T>(s * q[e] + o);
            const T hi = from_float<T>(s * q[e + 1] + o);
            words4[e / 2] = static_cast<unsigned>(*reinterpret_cast<const unsigned short*>(&lo)) |
                            (static_cast<unsigned>(*reinterpret_cast<const unsigned short*>(&hi)) << 16);
          }
        }
        *reinterpret_cast<uint4*>(tile_b + gemm::swizzled<kGemmTileK>(row, col)) =
            make_uint4(words4[0], words4[1], words4[2], words4[3]);
      }
      gemm::cp_async_wait<0>();
      __syncthreads();  // both tiles are in place
#pragma unroll
      for (int step = 0; step < kGemmTileK / 16; ++step) {
        typename Mainloop::Fragments fragments;
        Mainloop::load_fragments(fragments, address_a, address_b, step * 16);
        Mainloop::multiply(acc, fragments);
      }
      __syncthreads();  // every warp has read the tiles
    }
  }
  Mainloop::template store<T>(acc, reinterpret_cast<T*>(shared_words), out, nullptr, group.rows, n, ldc,
                              group.m0, n0, 1.0f, 0.0f, codes::kActNone);
}

}  // namespace qgemv
}  // namespace ops
}  // namespace pygpukit
