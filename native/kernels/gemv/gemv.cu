// Built-in GEMV and skinny GEMM for the decode path: y = act(x @ op(W) + bias) for up to 8 rows of x,
// with float, fp16 or bf16 elements (x, W, bias and y of one type) and float accumulation.
//
//   layout "nk": W stored N x K row-major (a linear layer's weight): y[m, n] = sum_k x[m, k] * W[n, k]
//   layout "kn": W stored K x N row-major:                            y[m, n] = sum_k x[m, k] * W[k, n]
//
// All of them are bound by reading W, so every W element is read exactly once, 16 bytes per load
// with L1 bypassed, several loads in flight per thread, and each W chunk serves every row of x.
//
// gemv_nk / gemv_kn (float FMAs; float weights, and one row of x in 16 bits). Their launch bounds
// ask for one resident block only so that ptxas keeps all U loads of a thread in flight: aiming at
// full occupancy it would otherwise cap the registers and issue each load just before its use.
//   gemv_nk: each warp owns R consecutive rows of W and walks their K extent, lanes striding over
//   16-byte chunks; the dot products end with a warp-shuffle reduction.
//   gemv_kn: a block owns 32 chunks of columns (one warp-wide row segment of W); its 8 warps take
//   every eighth row of the block's K range and are reduced through shared memory.
// gemv_nk_mma / gemv_kn_mma (fp16 and bf16, two to eight rows of x): mma.sync with x as the B operand
//   (see the comment above them), because the float FMAs of more rows would cost more instructions
//   per byte of W than the memory system delivers.
//
// Split K: when N alone gives too few blocks to fill the device, grid.y splits K. Each block writes
// its float partial sums to partial[split][m][n]; the last block of a column group to finish (a
// counter per blockIdx.x, which that block resets to zero) adds the partials in split order, so the
// result is deterministic, and applies bias and activation. counters must be zero before the first
// launch, and two launches sharing counters must not run concurrently.
// gemv_kn_cluster (SM 90+): the same split for gemv_kn, with the splits of a column group in one
// thread-block cluster that adds them up in distributed shared memory, also in split order.
//
// vector != 0 promises that x and W rows start on 16-byte boundaries (aligned base pointers and
// leading dimensions that are multiples of 16 bytes); otherwise every element is loaded singly.
// A K (nk) or N (kn) tail that does not fill a chunk is handled element by element.
//
// Every kernel here is launched programmatically on SM90+ (common/overlap.cuh): it waits for the kernel
// before it with overlap_wait() before touching memory; the nk kernels first ask L2 for their rows of W.
#include "../common/completion.cuh"
#include "../common/overlap.cuh"
#include "../gemm/matmul_common.cuh"

namespace pygpukit {
namespace ops {
namespace gemv {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// Before overlap_wait(): L2 prefetch of elements [begin, end) of W row `row` (nothing for rows past n or
// without the 16-byte promise of `vector`).
template <typename T>
__device__ __forceinline__ void prefetch_row(const T* w, long long ldw, int row, int n, int begin, int end,
                                             int vector) {
  if (vector == 0 || row >= n) return;
  const unsigned bytes = static_cast<unsigned>(max(end - begin, 0) * static_cast<int>(sizeof(T))) & ~15u;
  if (bytes != 0) prefetch_l2(w + static_cast<long long>(row) * ldw + begin, bytes);
}

// 16 bytes of elements, unpacked to float.
template <typename T>
struct Pack;

template <>
struct Pack<float> {
  static constexpr int kElems = 4;
  __device__ __forceinline__ static void unpack(const uint4& v, float (&f)[kElems]) {
    f[0] = __uint_as_float(v.x);
    f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z);
    f[3] = __uint_as_float(v.w);
  }
};

template <>
struct Pack<__nv_bfloat16> {
  static constexpr int kElems = 8;
  __device__ __forceinline__ static void unpack(const uint4& v, float (&f)[kElems]) {
    const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(words[i] << 16);
      f[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
  }
};

template <>
struct Pack<__half> {
  static constexpr int kElems = 8;
  __device__ __forceinline__ static void unpack(const uint4& v, float (&f)[kElems]) {
    const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 pair = __half22float2(*reinterpret_cast<const __half2*>(&words[i]));
      f[2 * i] = pair.x;
      f[2 * i + 1] = pair.y;
    }
  }
};

// W is streamed: each byte is used once, so keep it out of L1.
__device__ __forceinline__ uint4 load_weights(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Waits here for N loaded chunks, all issued before the first wait (load_weights is volatile and so
// keeps its order against these volatile statements), so that N loads are in flight per thread.
// The loops below also use row 0 of x unconditionally (the kernels run only with m >= 1): a W
// chunk used only under `if (i < m)` lets ptxas sink its load into that branch, next to the use.
template <int N>
__device__ __forceinline__ void await_loads(uint4* values) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    asm volatile("" : "+r"(values[i].x), "+r"(values[i].y), "+r"(values[i].z), "+r"(values[i].w));
  }
}

// x is small and read by every block: the ordinary read-only path, which caches it.
__device__ __forceinline__ uint4 load_activations(const void* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// The finished dot product of (row of x, column of W): plus the bias, through the activation, rounded
// once to T.
template <typename T>
__device__ __forceinline__ void store_output(T* __restrict__ y, const T* __restrict__ bias, int activation,
                                             long long ldy, int row, int col, float sum) {
  if (bias != nullptr) sum += matmul::to_float(bias[col]);
  y[row * ldy + col] = matmul::from_float<T>(matmul::activate(sum, activation));
}

// Split K: after this block stored its partial sums (for `count` outputs per row of x starting at
// column `first`), the last block of its group adds up every split's partials, in split order, adds
// the bias, applies the activation and stores y. Called by all threads of the block.
template <typename T>
__device__ __forceinline__ void finish_splits(T* __restrict__ y, const T* __restrict__ bias, int activation,
                                              const float* partial, unsigned* counters, int m, int n,
                                              long long ldy, int splits, int first, int count) {
  __shared__ bool last;
  __syncthreads();  // the block's partials, then one acq_rel count (completion.cuh)
  if (threadIdx.x == 0) last = arrive(&counters[blockIdx.x]) == static_cast<unsigned>(splits - 1);
  __syncthreads();
  if (!last) return;
  for (int i = static_cast<int>(threadIdx.x); i < m * count; i += kThreads) {
    const int row = i / count;
    const int col = first + i % count;
    if (col >= n) continue;
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s) sum += __ldcg(partial + (static_cast<long long>(s) * m + row) * n + col);
    store_output(y, bias, activation, ldy, row, col, sum);
  }
  if (threadIdx.x == 0) counters[blockIdx.x] = 0u;  // ready for the next launch
}

// One result: stored to y (with the bias) without split K, else as this split's partial sum.
template <typename T>
__device__ __forceinline__ void emit(T* __restrict__ y, const T* __restrict__ bias, int activation,
                                     float* partial, int m, int n, long long ldy, int splits, int row,
                                     int col, float sum) {
  if (splits == 1) {
    store_output(y, bias, activation, ldy, row, col, sum);
  } else {
    partial[(static_cast<long long>(blockIdx.y) * m + row) * n + col] = sum;
  }
}

// Rows handled per block by gemv_nk: kWarps * R. Grid: (ceil(n / (kWarps * R)), splits).
template <typename T, int MT, int R, int U>
__global__ void __launch_bounds__(kThreads, 1)
    gemv_nk(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, const T* __restrict__ bias,
            int m, int n, int k, long long ldx, long long ldw, long long ldy, int activation, int splits,
            float* partial, unsigned* counters, int vector) {
  constexpr int E = Pack<T>::kElems;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int row0 = (static_cast<int>(blockIdx.x) * kWarps + warp) * R;
  const int split = static_cast<int>(blockIdx.y);
  if (lane < R) {
    const int per = ((k / E + splits - 1) / splits) * E;
    prefetch_row(w, ldw, row0 + lane, n, split * per, min(k, (split + 1) * per), vector);
  }
  overlap_wait();

  // Rows past n read row n - 1 (in bounds, results discarded) so the loops stay branch-free.
  const T* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = w + static_cast<long long>(min(row0 + r, n - 1)) * ldw;

  float acc[MT][R];
#pragma unroll
  for (int i = 0; i < MT; ++i) {
#pragma unroll
    for (int r = 0; r < R; ++r) acc[i][r] = 0.0f;
  }

  int tail_begin;  // elements [tail_begin, tail_end) are left for the element-wise loop
  int tail_end;
  if (vector != 0) {
    const int chunks = k / E;
    const int per_split = (chunks + splits - 1) / splits;
    const int c_begin = split * per_split;
    const int c_end = min(chunks, c_begin + per_split);
    // Chunk cc of the rows (their loaded words wu) against every row of x, into acc.
    auto add_chunk = [&](int cc, const uint4(&wu)[R]) {
      float wf[R][E];
#pragma unroll
      for (int r = 0; r < R; ++r) Pack<T>::unpack(wu[r], wf[r]);
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        if (i == 0 || i < m) {
          float xf[E];
          Pack<T>::unpack(load_activations(x + i * ldx + static_cast<long long>(cc) * E), xf);
#pragma unroll
          for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int e = 0; e < E; ++e) acc[i][r] = fmaf(xf[e], wf[r][e], acc[i][r]);
          }
        }
      }
    };
    int c = c_begin + lane;
    for (; c + (U - 1) * 32 < c_end; c += U * 32) {
      uint4 wv[U][R];
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int r = 0; r < R; ++r) wv[u][r] = load_weights(rows[r] + static_cast<long long>(c + u * 32) * E);
      }
      await_loads<U * R>(&wv[0][0]);
#pragma unroll
      for (int u = 0; u < U; ++u) add_chunk(c + u * 32, wv[u]);
    }
    // At most U - 1 chunks are left to a lane: their loads go out together (a short row, K of a few
    // hundred, would otherwise wait for each in turn), then they are added in the same order.
    constexpr int kLeft = U > 1 ? U - 1 : 1;
    if (c < c_end) {
      uint4 wv[kLeft][R];
#pragma unroll
      for (int u = 0; u < kLeft; ++u) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          wv[u][r] = c + u * 32 < c_end ? load_weights(rows[r] + static_cast<long long>(c + u * 32) * E)
                                        : make_uint4(0u, 0u, 0u, 0u);
        }
      }
      await_loads<kLeft * R>(&wv[0][0]);
#pragma unroll
      for (int u = 0; u < kLeft; ++u) {
        if (c + u * 32 < c_end) add_chunk(c + u * 32, wv[u]);
      }
    }
    tail_begin = chunks * E;
    tail_end = split == splits - 1 ? k : tail_begin;
  } else {
    const int per_split = (k + splits - 1) / splits;
    tail_begin = split * per_split;
    tail_end = min(k, tail_begin + per_split);
  }
  for (int kk = tail_begin + lane; kk < tail_end; kk += 32) {
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      if (i < m) {
        const float xv = matmul::to_float(x[i * ldx + kk]);
#pragma unroll
        for (int r = 0; r < R; ++r) acc[i][r] = fmaf(xv, matmul::to_float(rows[r][kk]), acc[i][r]);
      }
    }
  }

#pragma unroll
  for (int i = 0; i < MT; ++i) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float sum = warp_sum(acc[i][r]);
      if (lane == 0 && i < m && row0 + r < n)
        emit(y, bias, activation, partial, m, n, ldy, splits, i, row0 + r, sum);
    }
  }
  if (splits > 1) {
    finish_splits(y, bias, activation, partial, counters, m, n, ldy, splits,
                  static_cast<int>(blockIdx.x) * kWarps * R, kWarps * R);
  }
}

// Columns handled per block by gemv_kn: L * (16 / sizeof(T)), L lanes side by side covering one row
// segment (L = 32: 512 contiguous bytes of a row per warp load; L = 8: 128 bytes of each of 4 rows).
// Narrower blocks give more of them along N, so that a moderate N (4096) needs fewer K splits.
// Row r of a block's K range goes to the warp and lane group ("row slot") r % (8 * 32 / L).
template <typename T, int L>
struct KnShape {
  static_assert(L == 4 || L == 8 || L == 16 || L == 32, "lanes per row segment");
  static constexpr int E = Pack<T>::kElems;
  static constexpr int kCols = L * E;
  static constexpr int kSlots = kWarps * (32 / L);  // rows in flight per block step
};

// One block's sums over its split of K (blockIdx.y of `splits`) for its kCols columns and every row of
// x, added up over the row slots: sums[i][c] for row i of x and column block_col + c.
template <typename T, int MT, int U, int L>
__device__ __forceinline__ void kn_block_sums(const T* __restrict__ x, const T* __restrict__ w, int m, int n,
                                              int k, long long ldx, long long ldw, int splits, int vector,
                                              float (&sums)[MT][KnShape<T, L>::kCols]) {
  using S = KnShape<T, L>;
  constexpr int E = S::E;
  constexpr int kCols = S::kCols;
  constexpr int kSlots = S::kSlots;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int slot = warp * (32 / L) + lane / L;
  const int block_col = static_cast<int>(blockIdx.x) * kCols;
  const int col = block_col + (lane % L) * E;
  // Whole U * kSlots-row steps per split (the host picks splits to match), so that no warp ends with
  // a tail of single loads.
  constexpr int kStep = U * kSlots;
  const int per_split = ((k + splits - 1) / splits + kStep - 1) / kStep * kStep;
  const int k_begin = static_cast<int>(blockIdx.y) * per_split;
  const int k_end = min(k, k_begin + per_split);

  float acc[MT][E];
#pragma unroll
  for (int i = 0; i < MT; ++i) {
#pragma unroll
    for (int e = 0; e < E; ++e) acc[i][e] = 0.0f;
  }

  if (vector != 0 && col + E <= n) {
    const T* column = w + col;
    int kk = k_begin + slot;
    for (; kk + (U - 1) * kSlots < k_end; kk += U * kSlots) {
      uint4 wv[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        wv[u] = load_weights(column + static_cast<long long>(kk + u * kSlots) * ldw);
      await_loads<U>(wv);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float wf[E];
        Pack<T>::unpack(wv[u], wf);
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          if (i == 0 || i < m) {
            const float xv = matmul::to_float(x[i * ldx + kk + u * kSlots]);
#pragma unroll
            for (int e = 0; e < E; ++e) acc[i][e] = fmaf(xv, wf[e], acc[i][e]);
          }
        }
      }
    }
    for (; kk < k_end; kk += kSlots) {
      float wf[E];
      Pack<T>::unpack(load_weights(column + static_cast<long long>(kk) * ldw), wf);
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        if (i < m) {
          const float xv = matmul::to_float(x[i * ldx + kk]);
#pragma unroll
          for (int e = 0; e < E; ++e) acc[i][e] = fmaf(xv, wf[e], acc[i][e]);
        }
      }
    }
  } else if (col < n) {
    for (int kk = k_begin + slot; kk < k_end; kk += kSlots) {
      const T* w_row = w + static_cast<long long>(kk) * ldw;
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        if (i < m) {
          const float xv = matmul::to_float(x[i * ldx + kk]);
#pragma unroll
          for (int e = 0; e < E; ++e) {
            if (col + e < n) acc[i][e] = fmaf(xv, matmul::to_float(w_row[col + e]), acc[i][e]);
          }
        }
      }
    }
  }

  // Add up the row slots' sums through shared memory, one row of x at a time.
  __shared__ float slots[kSlots][kCols];
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    if (i < m) {
#pragma unroll
      for (int e = 0; e < E; ++e) slots[slot][(lane % L) * E + e] = acc[i][e];
      __syncthreads();
      if (threadIdx.x < kCols) {
        float sum = 0.0f;
#pragma unroll
        for (int v = 0; v < kSlots; ++v) sum += slots[v][threadIdx.x];
        sums[i][threadIdx.x] = sum;
      }
      __syncthreads();
    }
  }
}

// Grid: (ceil(n / kCols), splits); with splits > 1 the partial sums meet through global memory
// (finish_splits).
template <typename T, int MT, int U, int L = 32>
__global__ void __launch_bounds__(kThreads, 1)
    gemv_kn(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, const T* __restrict__ bias,
            int m, int n, int k, long long ldx, long long ldw, long long ldy, int activation, int splits,
            float* partial, unsigned* counters, int vector) {
  constexpr int kCols = KnShape<T, L>::kCols;
  __shared__ float sums[MT][kCols];
  overlap_wait();
  kn_block_sums<T, MT, U, L>(x, w, m, n, k, ldx, ldw, splits, vector, sums);
  const int block_col = static_cast<int>(blockIdx.x) * kCols;
  for (int idx = static_cast<int>(threadIdx.x); idx < m * kCols; idx += kThreads) {
    const int i = idx / kCols;
    const int out_col = block_col + idx % kCols;
    if (out_col < n) emit(y, bias, activation, partial, m, n, ldy, splits, i, out_col, sums[i][idx % kCols]);
  }
  if (splits > 1) finish_splits(y, bias, activation, partial, counters, m, n, ldy, splits, block_col, kCols);
}

// SM 90+: the C splits of a column group form one thread-block cluster (grid (ceil(n / kCols), C),
// cluster (1, C, 1)) and meet in distributed shared memory: after a cluster barrier, block r of the
// cluster adds up columns [r * kCols / C, (r + 1) * kCols / C) over the C blocks' sums, in split
// order, and stores y; a second barrier keeps every block's shared memory alive until all of the
// cluster has read it. No partials in global memory, no counters. Elsewhere the body is empty (the
// host launches it only on SM 90 and newer).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PYGPUKIT_KN_CLUSTER_DIMS(c) __cluster_dims__(1, c, 1)
#else
#define PYGPUKIT_KN_CLUSTER_DIMS(c)
#endif

// Waits for every block of the cluster. Release (the shared-memory sums written before it are seen
// by the blocks that read them after it) or relaxed (only the order of execution).
template <bool Release>
__device__ __forceinline__ void cluster_barrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (Release) {
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
  } else {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
  }
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}

// The float at `local` (a shared-memory address of this block) in cluster block `rank`'s copy.
__device__ __forceinline__ float cluster_load(const float* local, unsigned rank) {
  float v = 0.0f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(local));
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(address), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(remote) : "memory");
#endif
  return v;
}

template <typename T, int MT, int U, int L, int C>
__global__ void __launch_bounds__(kThreads, 1) PYGPUKIT_KN_CLUSTER_DIMS(C)
    gemv_kn_cluster(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                    const T* __restrict__ bias, int m, int n, int k, long long ldx, long long ldw,
                    long long ldy, int activation, int splits, float* partial, unsigned* counters,
                    int vector) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kCols = KnShape<T, L>::kCols;
  static_assert(kCols % C == 0, "each cluster block finishes an equal share of the columns");
  constexpr int kShare = kCols / C;
  (void)splits;
  (void)partial;
  (void)counters;
  __shared__ float sums[MT][kCols];
  overlap_wait();
  kn_block_sums<T, MT, U, L>(x, w, m, n, k, ldx, ldw, C, vector, sums);
  cluster_barrier<true>();
  const unsigned rank = blockIdx.y;  // == %cluster_ctarank: the cluster spans all of grid.y
  const int block_col = static_cast<int>(blockIdx.x) * kCols;
  for (int idx = static_cast<int>(threadIdx.x); idx < m * kShare; idx += kThreads) {
    const int i = idx / kShare;
    const int c = static_cast<int>(rank) * kShare + idx % kShare;
    float parts[C];
#pragma unroll
    for (int s = 0; s < C; ++s) parts[s] = cluster_load(&sums[i][c], s);
    float sum = 0.0f;
#pragma unroll
    for (int s = 0; s < C; ++s) sum += parts[s];
    if (block_col + c < n) store_output(y, bias, activation, ldy, i, block_col + c, sum);
  }
  cluster_barrier<false>();  // this block's sums stay until the whole cluster has read them
#else
  __trap();
#endif
}

// -- tensor-core kernels (fp16 and bf16) ------------------------------------------------------------
//
// For up to 8 rows of x the float FMAs of the kernels above cost more instructions per byte of W
// than the memory system delivers, so the 16-bit kernels compute y^T = W' x^T with mma.m16n8k16:
// 16 outputs of W' (rows of the MMA's A) by the 8 rows of x (columns of its B; rows of x past m
// are zero). The fragments come straight from registers loaded from global memory, without shared
// memory: a dot product does not depend on the order of its terms, so the physical k (and, for
// gemv_kn_mma, n) behind each fragment slot is chosen to match what a lane loaded, as long as A and B
// agree on it, which they do because the mapping depends only on the lane's column t = lane % 4.

// 16 bytes at p (elements [col, col + 8) of a row with `limit` elements), with zeros past the end;
// fast when the chunk is whole and vector is set.
template <typename T>
__device__ __forceinline__ uint4 load_chunk(const T* p, int col, int limit, bool vector, bool stream) {
  if (vector && col + 8 <= limit) {
    return stream ? load_weights(p) : load_activations(p);
  }
  unsigned words[4] = {0u, 0u, 0u, 0u};
  const unsigned short* bits = reinterpret_cast<const unsigned short*>(p);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    if (col + e < limit) words[e / 2] |= static_cast<unsigned>(bits[e]) << (16 * (e % 2));
  }
  return make_uint4(words[0], words[1], words[2], words[3]);
}

// Two elements (k, k + 1) of one row as one word, zeros past limit.
template <typename T>
__device__ __forceinline__ unsigned load_pair(const T* p, int col, int limit, bool vector) {
  if (vector && col + 2 <= limit) return __ldg(reinterpret_cast<const unsigned*>(p));
  const unsigned short* bits = reinterpret_cast<const unsigned short*>(p);
  unsigned word = 0u;
  if (col < limit) word = bits[0];
  if (col + 1 < limit) word |= static_cast<unsigned>(bits[1]) << 16;
  return word;
}

// Adds the 8 warps' accumulator fragments (kValues floats per lane) through shared memory, then
// calls store(lane, value index, sum) for each of the 32 * kValues sums, spread over the block.
template <int kValues, typename Store>
__device__ __forceinline__ void reduce_warps(const float (&values)[kValues], Store store) {
  __shared__ float sums[kWarps][32][kValues];
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
#pragma unroll
  for (int e = 0; e < kValues; ++e) sums[warp][lane][e] = values[e];
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < 32 * kValues; i += kThreads) {
    const int l = i / kValues;
    const int e = i % kValues;
    float sum = 0.0f;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) sum += sums[v][l][e];
    store(l, e, sum);
  }
}

// W stored N x K. A block owns 16 rows of W; its warps take turns over 64-wide k steps of the
// block's K range (warp w: steps w, w + 8, ...), so together they stream 1 KiB of each row at a
// time. Lane (g, t) = (lane / 4, lane % 4) loads 32 bytes of rows g and g + 8 and of row g of x at
// k + 16 t. Grid: (ceil(n / 16), splits).
template <typename T, int U>
__global__ void __launch_bounds__(kThreads)
    gemv_nk_mma(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                const T* __restrict__ bias, int m, int n, int k, long long ldx, long long ldw, long long ldy,
                int activation, int splits, float* partial, unsigned* counters, int vector) {
  constexpr int kStep = 64;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int n0 = static_cast<int>(blockIdx.x) * 16;
  const bool vec = vector != 0;
  // Rows past n read row n - 1 (results discarded); rows of x past m are zero.
  const T* row_lo = w + static_cast<long long>(min(n0 + g, n - 1)) * ldw;
  const T* row_hi = w + static_cast<long long>(min(n0 + g + 8, n - 1)) * ldw;
  const T* x_row = x + static_cast<long long>(min(g, m - 1)) * ldx;
  const bool x_live = g < m;

  const int steps = (k + kStep - 1) / kStep;
  const int per_split = (steps + splits - 1) / splits;
  const int step_begin = static_cast<int>(blockIdx.y) * per_split;
  const int step_end = min(steps, step_begin + per_split);
  if (threadIdx.x < 16) {
    prefetch_row(w, ldw, n0 + static_cast<int>(threadIdx.x), n, step_begin * kStep, min(k, step_end * kStep),
                 vector);
  }
  overlap_wait();

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  auto consume = [&](const uint4(&lo)[2], const uint4(&hi)[2], const uint4(&xs)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const unsigned lw[4] = {lo[h].x, lo[h].y, lo[h].z, lo[h].w};
      const unsigned hw[4] = {hi[h].x, hi[h].y, hi[h].z, hi[h].w};
      const unsigned xw[4] = {xs[h].x, xs[h].y, xs[h].z, xs[h].w};
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const unsigned a[4] = {lw[2 * j], hw[2 * j], lw[2 * j + 1], hw[2 * j + 1]};
        matmul::Mma<T>::run(acc, a, xw[2 * j], xw[2 * j + 1]);
      }
    }
  };
  auto load = [&](int step, uint4(&lo)[2], uint4(&hi)[2], uint4(&xs)[2]) {
    const int col = step * kStep + 16 * t;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      lo[h] = load_chunk(row_lo + col + 8 * h, col + 8 * h, k, vec, true);
      hi[h] = load_chunk(row_hi + col + 8 * h, col + 8 * h, k, vec, true);
      xs[h] =
          x_live ? load_chunk(x_row + col + 8 * h, col + 8 * h, k, vec, false) : make_uint4(0u, 0u, 0u, 0u);
    }
  };

  int step = step_begin + warp;
  for (; step + (U - 1) * kWarps < step_end; step += U * kWarps) {
    uint4 lo[U][2];
    uint4 hi[U][2];
    uint4 xs[U][2];
#pragma unroll
    for (int u = 0; u < U; ++u) load(step + u * kWarps, lo[u], hi[u], xs[u]);
    await_loads<2 * U>(&lo[0][0]);
    await_loads<2 * U>(&hi[0][0]);
#pragma unroll
    for (int u = 0; u < U; ++u) consume(lo[u], hi[u], xs[u]);
  }
  for (; step < step_end; step += kWarps) {
    uint4 lo[2];
    uint4 hi[2];
    uint4 xs[2];
    load(step, lo, hi, xs);
    consume(lo, hi, xs);
  }

  // acc[e]: row g + 8 * (e / 2) of the 16, row 2 t + e % 2 of x.
  reduce_warps<4>(acc, [&](int l, int e, float sum) {
    const int row = 2 * (l & 3) + (e & 1);
    const int col = n0 + (l >> 2) + 8 * (e >> 1);
    if (row < m && col < n) emit(y, bias, activation, partial, m, n, ldy, splits, row, col, sum);
  });
  if (splits > 1) finish_splits(y, bias, activation, partial, counters, m, n, ldy, splits, n0, 16);
}

// W stored K x N. A block owns 64 columns; its warps take turns over 16-row k steps (warp w: steps
// w, w + 8, ...). Lane (g, t) loads 16 bytes (columns 8 g .. 8 g + 7) of rows k + 2 t, k + 2 t + 1,
// k + 2 t + 8 and k + 2 t + 9, and pairs them with byte permutes into A fragments whose rows are
// columns 8 g + 2 j (fragment row g) and 8 g + 2 j + 1 (row g + 8) for MMA j = 0..3.
// Grid: (ceil(n / 64), splits).
template <typename T, int U>
__global__ void __launch_bounds__(kThreads)
    gemv_kn_mma(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                const T* __restrict__ bias, int m, int n, int k, long long ldx, long long ldw, long long ldy,
                int activation, int splits, float* partial, unsigned* counters, int vector) {
  constexpr int kStep = 16;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int n0 = static_cast<int>(blockIdx.x) * 64;
  const int col = n0 + 8 * g;
  const bool vec = vector != 0;
  const T* x_row = x + static_cast<long long>(min(g, m - 1)) * ldx;
  const bool x_live = g < m;

  const int steps = (k + kStep - 1) / kStep;
  const int per_split = (steps + splits - 1) / splits;
  const int step_begin = static_cast<int>(blockIdx.y) * per_split;
  const int step_end = min(steps, step_begin + per_split);
  overlap_wait();

  float acc[4][4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
  }
  // rows[r]: W rows k + 2 t + {0, 1, 8, 9}[r]; zero past k.
  auto load = [&](int step, uint4(&rows)[4], unsigned (&xs)[2]) {
    const int k0 = step * kStep + 2 * t;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int kr = k0 + (r & 1) + 8 * (r >> 1);
      rows[r] = kr < k ? load_chunk(w + static_cast<long long>(kr) * ldw + col, col, n, vec, true)
                       : make_uint4(0u, 0u, 0u, 0u);
    }
    xs[0] = x_live ? load_pair(x_row + k0, k0, k, vec) : 0u;
    xs[1] = x_live ? load_pair(x_row + k0 + 8, k0 + 8, k, vec) : 0u;
  };
  auto consume = [&](const uint4(&rows)[4], const unsigned (&xs)[2]) {
    const unsigned r0[4] = {rows[0].x, rows[0].y, rows[0].z, rows[0].w};
    const unsigned r1[4] = {rows[1].x, rows[1].y, rows[1].z, rows[1].w};
    const unsigned r8[4] = {rows[2].x, rows[2].y, rows[2].z, rows[2].w};
    const unsigned r9[4] = {rows[3].x, rows[3].y, rows[3].z, rows[3].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const unsigned a[4] = {__byte_perm(r0[j], r1[j], 0x5410), __byte_perm(r0[j], r1[j], 0x7632),
                             __byte_perm(r8[j], r9[j], 0x5410), __byte_perm(r8[j], r9[j], 0x7632)};
      matmul::Mma<T>::run(acc[j], a, xs[0], xs[1]);
    }
  };

  int step = step_begin + warp;
  for (; step + (U - 1) * kWarps < step_end; step += U * kWarps) {
    uint4 rows[U][4];
    unsigned xs[U][2];
#pragma unroll
    for (int u = 0; u < U; ++u) load(step + u * kWarps, rows[u], xs[u]);
    await_loads<4 * U>(&rows[0][0]);
#pragma unroll
    for (int u = 0; u < U; ++u) consume(rows[u], xs[u]);
  }
  for (; step < step_end; step += kWarps) {
    uint4 rows[4];
    unsigned xs[2];
    load(step, rows, xs);
    consume(rows, xs);
  }

  // acc[j][e]: column 8 g + 2 j + e / 2, row 2 t + e % 2 of x.
  float flat[16];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) flat[4 * j + e] = acc[j][e];
  }
  reduce_warps<16>(flat, [&](int l, int v, float sum) {
    const int row = 2 * (l & 3) + (v & 1);
    const int out_col = n0 + 8 * (l >> 2) + 2 * (v >> 2) + ((v >> 1) & 1);
    if (row < m && out_col < n) emit(y, bias, activation, partial, m, n, ldy, splits, row, out_col, sum);
  });
  if (splits > 1) finish_splits(y, bias, activation, partial, counters, m, n, ldy, splits, n0, 64);
}

}  // namespace gemv
}  // namespace ops
}  // namespace pygpukit
