// What the built-in GEMM kernels (gemm_mma.cu for every architecture, gemm_wgmma.cu for SM 90)
// share: cp.async, shared-memory tile layouts and the copies into them, and the epilogue.
#pragma once

#include "matmul_common.cuh"

namespace pygpukit {
namespace ops {
namespace gemm {

constexpr int kGroupM = 8;

// The first row and column (m0, n0) of the BM x BN output tile of this block of a one-dimensional grid
// over an m x n output. Blocks run in groups of kGroupM tile rows, column by column, so that the
// tiles resident together share rows of A and columns of B in L2.
template <int BM, int BN>
__device__ __forceinline__ void tile_origin(int m, int n, int& m0, int& n0) {
  const int tiles_m = (m + BM - 1) / BM;
  const int tiles_n = (n + BN - 1) / BN;
  const int per_group = kGroupM * tiles_n;
  const int pid = static_cast<int>(blockIdx.x);
  const int first_m = (pid / per_group) * kGroupM;
  const int group_rows = min(tiles_m - first_m, kGroupM);
  m0 = (first_m + (pid % per_group) % group_rows) * BM;
  n0 = ((pid % per_group) / group_rows) * BN;
}

// Choose<C, A, B>::type is A when C, else B (NVRTC has no <type_traits>).
template <bool C, typename A, typename B>
struct Choose {
  using type = A;
};
template <typename A, typename B>
struct Choose<false, A, B> {
  using type = B;
};

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async_16(unsigned dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}

// Four 8x8 b16 matrices from shared memory into mma.sync fragments (plain and transposed).
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Element offset of (row, col) in a shared tile with COLS elements per row. Chunk c (8 elements) of
// row r is stored at chunk c ^ s(r): rows shorter than 128 bytes share a 128-byte line, so s(r) steps
// once per line. Then the 8 rows of one ldmatrix phase (the same chunk of 8 consecutive rows) and the 8
// chunks of one cp.async phase land in 8 distinct 16-byte bank groups.
template <int COLS>
__device__ __forceinline__ int swizzled(int row, int col) {
  constexpr int kChunks = COLS / 8;
  static_assert(kChunks == 2 || kChunks == 4 || kChunks % 8 == 0, "unsupported shared tile width");
  int chunk = col >> 3;
  if constexpr (kChunks >= 8) {
    chunk ^= row & 7;
  } else {
    chunk ^= (row / (8 / kChunks)) & (kChunks - 1);
  }
  return row * COLS + chunk * 8 + (col & 7);
}

// The slow path of load_tile: one 16-byte chunk read element by element, zero outside the operand.
template <typename T>
__device__ __noinline__ void load_chunk_elementwise(T* dst, const T* __restrict__ src, long long ld, int row,
                                                    int rows, int col, int cols) {
  unsigned words[4] = {0u, 0u, 0u, 0u};
  if (row < rows) {
    const unsigned short* row_bits = reinterpret_cast<const unsigned short*>(src + row * ld);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (col + e < cols) words[e / 2] |= static_cast<unsigned>(row_bits[col + e]) << (16 * (e % 2));
    }
  }
  *reinterpret_cast<uint4*>(dst) = make_uint4(words[0], words[1], words[2], words[3]);
}

// Shared-memory tile layouts: where element (row, col) of a ROWS x COLS tile lives, and how far
// the offset moves when row advances by a multiple of 8 (the period of every swizzle below).
//
// RowSwizzled<COLS>: row-major, 16-byte chunks XOR-swizzled per row (swizzled() above). With 64
// 16-bit elements per row this is also wgmma's 128-byte-swizzled K-major layout.
template <int COLS>
struct RowSwizzled {
  __device__ __forceinline__ static int offset(int row, int col) { return swizzled<COLS>(row, col); }
  __host__ __device__ static constexpr int advance(int rows) { return rows * COLS; }
};

// ColumnBlocks<ROWS>: wgmma's 128-byte-swizzled MN-major layout for a tile whose rows are k and whose
// contiguous columns are m or n: blocks of 64 columns, each ROWS rows of 128 bytes, chunks swizzled
// by row.
template <int ROWS>
struct ColumnBlocks {
  __device__ __forceinline__ static int offset(int row, int col) {
    return ((col >> 6) * ROWS + row) * 64 + ((((col >> 3) & 7) ^ (row & 7)) << 3) + (col & 7);
  }
  __host__ __device__ static constexpr int advance(int rows) { return rows * 64; }
};

// Copies ROWS x COLS tiles of a row-major operand (COLS along its contiguous dimension) into shared
// memory laid out by Layout. Thread t copies the chunk at column (t % chunks per row) * 8 of rows
// t / (chunks per row) + i * kRowStep; kRowStep is a multiple of the swizzle period, so the shared
// offsets of a thread's chunks differ by constants.
template <typename T, int ROWS, int COLS, int THREADS, typename Layout>
struct TileCopy {
  static constexpr int kChunksPerRow = COLS / 8;
  static constexpr int kRowStep = THREADS / kChunksPerRow;
  static constexpr int kPerThread = ROWS / kRowStep;
  static_assert(THREADS % kChunksPerRow == 0 && ROWS % kRowStep == 0 && kRowStep % 8 == 0,
                "tile chunks must divide evenly among the threads");

  int row;     // the thread's first row within the tile
  int col;     // its column within the tile
  int offset;  // element offset of its first chunk in the shared tile

  __device__ __forceinline__ TileCopy()
      : row(static_cast<int>(threadIdx.x) / kChunksPerRow),
        col(static_cast<int>(threadIdx.x) % kChunksPerRow * 8),
        offset(Layout::offset(row, col)) {}

  // Every chunk of the tile lies inside the operand and the operand is aligned; src points at the
  // thread's first chunk.
  __device__ __forceinline__ void full(unsigned tile, const T* src, long long ld) const {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      cp_async_16(tile + (offset + Layout::advance(i * kRowStep)) * static_cast<int>(sizeof(T)),
                  src + i * kRowStep * ld);
    }
  }

  // The general case: the tile starts at (row0, col0) of an operand of rows x cols elements;
  // elements outside it become zero.
  __device__ __forceinline__ void checked(unsigned tile, T* tile_pointer, const T* __restrict__ src,
                                          long long ld, int row0, int rows, int col0, int cols,
                                          bool vector) const {
    const int gcol = col0 + col;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int grow = row0 + row + i * kRowStep;
      const int at = offset + Layout::advance(i * kRowStep);
      if (vector && grow < rows && gcol + 8 <= cols) {
        cp_async_16(tile + at * static_cast<int>(sizeof(T)), src + grow * ld + gcol);
      } else if (grow >= rows || gcol >= cols) {
        *reinterpret_cast<uint4*>(tile_pointer + at) = make_uint4(0u, 0u, 0u, 0u);
      } else {
        load_chunk_elementwise(tile_pointer + at, src, ld, grow, rows, gcol, cols);
      }
    }
  }
};

// Where a thread's TileCopy chunks of A and B start for k tile 0 of the block tile at (m0, n0), and
// how far they move per k tile (BK elements along K); shared by the mma.sync and wgmma main loops.
template <typename T, bool TRANS_A, bool TRANS_B, int BK>
struct OperandCursors {
  const T* a_first;
  const T* b_first;
  long long a_step;
  long long b_step;

  template <typename CopyA, typename CopyB>
  __device__ __forceinline__ OperandCursors(const T* a, const T* b, long long lda, long long ldb, int m0,
                                            int n0, const CopyA& copy_a, const CopyB& copy_b)
      : a_first(TRANS_A ? a + copy_a.row * lda + (m0 + copy_a.col)
                        : a + (m0 + copy_a.row) * lda + copy_a.col),
        b_first(TRANS_B ? b + (n0 + copy_b.row) * ldb + copy_b.col
                        : b + copy_b.row * ldb + (n0 + copy_b.col)),
        a_step(TRANS_A ? BK * lda : BK),
        b_step(TRANS_B ? BK : BK * ldb) {}

  __device__ __forceinline__ const T* a_at(int k_tile) const { return a_first + k_tile * a_step; }
  __device__ __forceinline__ const T* b_at(int k_tile) const { return b_first + k_tile * b_step; }
};

template <typename OutT>
__device__ __forceinline__ void store4(OutT* dst, const float (&v)[4]);

template <>
__device__ __forceinline__ void store4<float>(float* dst, const float (&v)[4]) {
  *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
}
template <>
__device__ __forceinline__ void store4<__half>(__half* dst, const float (&v)[4]) {
  const __half2 lo = __floats2half2_rn(v[0], v[1]);
  const __half2 hi = __floats2half2_rn(v[2], v[3]);
  *reinterpret_cast<uint2*>(dst) =
      make_uint2(*reinterpret_cast<const unsigned*>(&lo), *reinterpret_cast<const unsigned*>(&hi));
}
template <>
__device__ __forceinline__ void store4<__nv_bfloat16>(__nv_bfloat16* dst, const float (&v)[4]) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(v[0], v[1]);
  const __nv_bfloat162 hi = __floats2bfloat162_rn(v[2], v[3]);
  *reinterpret_cast<uint2*>(dst) =
      make_uint2(*reinterpret_cast<const unsigned*>(&lo), *reinterpret_cast<const unsigned*>(&hi));
}

// Applies the epilogue to four consecutive accumulators of one output row, from column col on, and
// stores those inside the matrix (one vector store when all four are and vector is set).
template <typename OutT>
__device__ __forceinline__ void finish4(OutT* dst_row, const OutT* __restrict__ bias, int col, int n,
                                        float4 sums, float alpha, float beta, int activation, bool vector) {
  float v[4] = {sums.x, sums.y, sums.z, sums.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if (col + e < n) {
      float x = alpha * v[e];
      if (beta != 0.0f) x += beta * matmul::to_float(dst_row[col + e]);
      if (bias != nullptr) x += matmul::to_float(bias[col + e]);
      v[e] = matmul::activate(x, activation);
    }
  }
  if (vector && col + 4 <= n) {
    store4<OutT>(dst_row + col, v);
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (col + e < n) dst_row[col + e] = matmul::from_float<OutT>(v[e]);
    }
  }
}

// Stores one warp's accumulators, kTilesM x kTilesN m16n8 fragments (the mma.sync and wgmma
// accumulator layout: lane (g, t) holds rows g and g + 8, columns 2 t and 2 t + 1 of each) covering
// rows row0.. and columns col0.. of out. They pass, 16 rows at a time, through `staged`, this warp's
// 16 x (8 kTilesN + 8) floats of shared memory, so that a lane then finishes 4 consecutive columns of
// one row and stores them as one vector (coalesced along the row), and the epilogue code exists once
// per pass rather than once per accumulator register.
template <typename OutT, int kTilesM, int kTilesN>
__device__ __forceinline__ void store_warp_tile(const float (&acc)[kTilesM][kTilesN][4], float* staged,
                                                OutT* out, const OutT* __restrict__ bias, int m, int n,
                                                long long ldc, int row0, int col0, float alpha, float beta,
                                                int activation) {
  constexpr int kWarpN = kTilesN * 8;
  constexpr int kPitch = kWarpN + 8;  // the pad spreads the float2 writes of a warp over all banks
  constexpr int kLanesPerRow = kWarpN / 4 < 32 ? kWarpN / 4 : 32;
  constexpr int kRowsPerPass = 32 / kLanesPerRow;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int group_row = lane >> 2;
  const int pair_col = (lane & 3) * 2;
  const int lane_row = lane / kLanesPerRow;
  const int lane_col = (lane % kLanesPerRow) * 4;
  const bool vector_out =
      n % 4 == 0 && ldc % 4 == 0 && reinterpret_cast<unsigned long long>(out) % (4 * sizeof(OutT)) == 0;
#pragma unroll
  for (int i = 0; i < kTilesM; ++i) {
#pragma unroll
    for (int j = 0; j < kTilesN; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        *reinterpret_cast<float2*>(staged + (group_row + 8 * h) * kPitch + j * 8 + pair_col) =
            make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
      }
    }
    __syncwarp();
#pragma unroll 1
    for (int r = lane_row; r < 16; r += kRowsPerPass) {
      const int row = row0 + i * 16 + r;
      if (row >= m) break;
#pragma unroll 1
      for (int c = lane_col; c < kWarpN; c += 4 * kLanesPerRow) {
        const int col = col0 + c;
        if (col >= n) break;
        const float4 sums = *reinterpret_cast<const float4*>(staged + r * kPitch + c);
        finish4<OutT>(out + row * ldc, bias, col, n, sums, alpha, beta, activation, vector_out);
      }
    }
    __syncwarp();
  }
}

}  // namespace gemm
}  // namespace ops
}  // namespace pygpukit
