// Sampling token ids from logits (batch, vocab) without sorting: greedy, temperature, top-k, top-p,
// min-p and the repetition penalty, in HF's order (penalty, temperature, top-k, top-p, min-p).
//
//   sample_pass<T>(logits, args)       one pass over every row, grid (chunks, rows), 256 threads
//   sample_mark(args)                  sets the bit of every history token in the per-row bitmap
//   sample_argmax_rows<T>(...)         greedy without a workspace: one block of 1024 threads per row
//
// Each row is split into `chunks` blocks. A pass folds its chunk into a shared histogram (2048 bins of
// 64-bit integers), adds the non-empty bins to the row's histogram in the workspace with atomics, and
// takes a ticket; the last block of the row to finish (a "last block" reduction) reads the histogram,
// makes the row's decision for the next pass, and clears it. Everything a decision depends on is an
// integer sum, so every run, eager or replayed from a graph, takes bitwise the same decisions.
//
// Values: v = x (float32), penalised if its token is in the history (v < 0 ? v * r : v / r), divided by
// the temperature (rows with temperature 0 are greedy), and +0 added (so -0 is +0). key(v) is the
// order-preserving uint32 of v (NaN largest). The weight of a token is q = trunc(expf(v - max) * 2^44),
// an integer; the row's probabilities are q / sum(q), exact integer sums in any order.
//   pass kStats   max and argmax (atomicMax of key << 32 | ~index); the first top-k digit (counts)
//   kTopK1/2      the next digits of the key of the k-th largest value (radix select, 11+11+10 bits);
//                 every token with a key >= it is kept (ties with the k-th value too: HF's rule)
//   kTopP0/1/2    radix select on the weights of the top-k set: the largest key K whose tokens
//                 with keys >= K hold at least ceil(top_p * total) of the weight (whole tie groups)
//   kDraw         per chunk, the weight kept (key >= threshold, expf(v - max) >= min_p); the last block
//                 draws r = floor(u * total) with u from Philox4x32-10 (seed, row, step), finds the
//                 chunk holding r and scans it in index order for the token. Or (filtered_probs) it
//                 keeps the total.
//   kProbs        the renormalised probabilities q / total (filtered_probs)
// The last pass of a call clears what the call left in the workspace (argmax, history bits) and, for
// a draw, the last row to finish advances the step counter, so each call (or graph replay) draws anew.
#include "../common/types.cuh"

namespace pygpukit {
namespace ops {

constexpr int kSampleThreads = 256;
constexpr int kSampleBins = 2048;
constexpr int kSampleMaxChunks = 256;
constexpr int kSamplePerThread = 16;  // contiguous elements per thread when a chunk is scanned in order
constexpr int kSampleHeader = 8;      // workspace words before the rows: seed, step, rows done
constexpr int kRowHist = 8;
constexpr int kRowChunks = kRowHist + kSampleBins;
constexpr int kRowWords = kRowChunks + kSampleMaxChunks;
// Words of a row's state.
constexpr int kBest = 0;
constexpr int kRemaining = 1;
constexpr int kKeptTotal = 2;
constexpr int kTicket = 3;
constexpr int kPrefix = 4;
constexpr int kTopkKey = 5;
constexpr int kThreshold = 6;

// Passes and flags (common/codes.cuh, read by pygpukit.ops.sampling).
constexpr int kStats = codes::kSampleStats;
constexpr int kTopK1 = codes::kSampleTopK1;
constexpr int kTopK2 = codes::kSampleTopK2;
constexpr int kTopP0 = codes::kSampleTopP0;
constexpr int kTopP1 = codes::kSampleTopP1;
constexpr int kTopP2 = codes::kSampleTopP2;
constexpr int kDraw = codes::kSampleDraw;
constexpr int kProbs = codes::kSampleProbs;

// kFlagFinal: the last pass of the call, clear the row's state afterwards; kFlagAdvance: advance the
// step counter once every row is done; kFlagPenalty: the history bitmap is marked; kFlagToken:
// kDraw/kStats write the token (else kDraw keeps the total).
constexpr int kFlagFinal = codes::kSampleFinal;
constexpr int kFlagAdvance = codes::kSampleAdvance;
constexpr int kFlagPenalty = codes::kSamplePenalty;
constexpr int kFlagToken = codes::kSampleToken;

// Per-row parameters: a device buffer (batch,) when the pointer is set, else the value.
struct SampleArgs {
  const float* temperature;
  const int* top_k;
  const float* top_p;
  const float* min_p;
  const float* penalty;
  const int* history;
  int* out;
  float* probs;
  unsigned long long* state;
  unsigned int* bitmap;
  long long row_stride;
  long long vocab;
  long long chunk;
  long long history_len;
  long long history_stride;
  long long bitmap_words;
  float temperature_value;
  float top_p_value;
  float min_p_value;
  float penalty_value;
  int top_k_value;
  int pass;
  int flags;
  int rows;
};

struct SampleRow {
  float temperature;
  float top_p;
  float min_p;
  float penalty;
  int top_k;
  bool greedy;
  bool topk;
  bool topp;
  bool minp;
  bool penalised;
};

__device__ __forceinline__ SampleRow sample_row(const SampleArgs& a, int row) {
  SampleRow p;
  p.temperature = a.temperature ? a.temperature[row] : a.temperature_value;
  p.top_k = a.top_k ? a.top_k[row] : a.top_k_value;
  p.top_p = a.top_p ? a.top_p[row] : a.top_p_value;
  p.min_p = a.min_p ? a.min_p[row] : a.min_p_value;
  p.penalty = a.penalty ? a.penalty[row] : a.penalty_value;
  p.greedy = !(p.temperature > 0.0f);  // 0, negative or NaN
  p.topk = !p.greedy && p.top_k > 0 && static_cast<long long>(p.top_k) < a.vocab;
  p.topp = !p.greedy && p.top_p < 1.0f;  // NaN: off
  p.minp = !p.greedy && p.min_p > 0.0f;
  p.penalised = (a.flags & kFlagPenalty) != 0 && p.penalty > 0.0f && p.penalty != 1.0f;
  return p;
}

__device__ __forceinline__ float sample_value(float x, const SampleRow& p, const unsigned int* bits,
                                              unsigned int i) {
  if (p.penalised && ((bits[i >> 5] >> (i & 31u)) & 1u)) x = x < 0.0f ? x * p.penalty : x / p.penalty;
  if (!p.greedy) x = x / p.temperature;
  return x + 0.0f;
}

__device__ __forceinline__ unsigned int sample_key(float v) {
  const unsigned int b = __float_as_uint(v);
  if (v != v) return 0xffffffffu;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float sample_key_value(unsigned int k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

__device__ __forceinline__ float sample_exp(float v, float max) {
  const float d = v - max;
  return d <= 0.0f ? expf(d) : 0.0f;  // NaN (from NaN or infinite logits): weight 0
}

__device__ __forceinline__ unsigned long long sample_quantise(float e) {
  return __float2ull_rz(e * 17592186044416.0f);  // 2^44: a vocabulary of 2^19 sums below 2^63
}

// The weight a token keeps in the final distribution (0 when filtered out).
__device__ __forceinline__ unsigned long long sample_kept(float v, float max, unsigned int threshold,
                                                          const SampleRow& p) {
  if (sample_key(v) < threshold) return 0;
  const float e = sample_exp(v, max);
  if (p.minp && !(e >= p.min_p)) return 0;
  return sample_quantise(e);
}

// -- Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC11) -------------
struct PhiloxBlock {
  unsigned int v[4];
};

__device__ __forceinline__ PhiloxBlock philox4x32_10(PhiloxBlock c, unsigned int k0, unsigned int k1) {
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    if (round) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const unsigned int hi0 = __umulhi(0xD2511F53u, c.v[0]);
    const unsigned int lo0 = 0xD2511F53u * c.v[0];
    const unsigned int hi1 = __umulhi(0xCD9E8D57u, c.v[2]);
    const unsigned int lo1 = 0xCD9E8D57u * c.v[2];
    PhiloxBlock next;
    next.v[0] = hi1 ^ c.v[1] ^ k0;
    next.v[1] = lo1;
    next.v[2] = hi0 ^ c.v[3] ^ k1;
    next.v[3] = lo0;
    c = next;
  }
  return c;
}

// 64 random bits for (seed, row, step): counter (step lo, step hi, row, 0), key (seed lo, seed hi).
__device__ __forceinline__ unsigned long long sample_random(unsigned long long seed, unsigned long long step,
                                                            unsigned int row) {
  PhiloxBlock c;
  c.v[0] = static_cast<unsigned int>(step);
  c.v[1] = static_cast<unsigned int>(step >> 32);
  c.v[2] = row;
  c.v[3] = 0;
  const PhiloxBlock r =
      philox4x32_10(c, static_cast<unsigned int>(seed), static_cast<unsigned int>(seed >> 32));
  return (static_cast<unsigned long long>(r.v[1]) << 32) | r.v[0];
}

// -- block-wide helpers (blockDim.x a multiple of 32, at most 1024) -----------------------------------
__device__ __forceinline__ unsigned long long sample_block_max(unsigned long long v,
                                                               unsigned long long* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const unsigned long long other = __shfl_xor_sync(0xffffffffu, v, offset);
    v = other > v ? other : v;
  }
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? scratch[lane] : 0ull;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      const unsigned long long other = __shfl_xor_sync(0xffffffffu, v, offset);
      v = other > v ? other : v;
    }
    if (lane == 0) scratch[32] = v;
  }
  __syncthreads();
  const unsigned long long result = scratch[32];
  __syncthreads();
  return result;
}

// Exclusive prefix sum over the block in thread order; *total gets the block's sum.
__device__ __forceinline__ unsigned long long sample_block_scan(unsigned long long v,
                                                                unsigned long long* scratch,
                                                                unsigned long long* total) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  unsigned long long inclusive = v;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const unsigned long long other = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  if (lane == 31) scratch[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    unsigned long long w = lane < warps ? scratch[lane] : 0ull;
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
      const unsigned long long other = __shfl_up_sync(0xffffffffu, w, offset);
      if (lane >= offset) w += other;
    }
    scratch[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  const unsigned long long before = (warp > 0 ? scratch[warp - 1] : 0ull) + inclusive - v;
  *total = scratch[warps - 1];
  __syncthreads();
  return before;
}

__device__ __forceinline__ unsigned long long sample_block_sum(unsigned long long v,
                                                               unsigned long long* scratch) {
  unsigned long long total;
  sample_block_scan(v, scratch, &total);
  return total;
}

// Whether this block is the last of its row to finish the pass (a ticket per row, reset by the last).
__device__ __forceinline__ bool sample_last_block(unsigned long long* ticket, int* flag) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned long long taken = atomicAdd(ticket, 1ull);
    const bool last = taken == static_cast<unsigned long long>(gridDim.x) - 1;
    if (last) atomicExch(ticket, 0ull);
    *flag = last;
  }
  __syncthreads();
  const bool last = *flag != 0;
  if (last) __threadfence();
  return last;
}

struct SamplePick {
  unsigned int bin;
  unsigned int found;
  unsigned long long above;  // weight (or count) in the bins above `bin`
  unsigned long long total;
  unsigned long long need;
};

// The bin of the row's histogram where the running sum from the top bin down first reaches `need`
// (need_of(total)); clears the histogram. Each thread reads bins / blockDim consecutive bins.
template <typename Need>
__device__ SamplePick sample_pick(unsigned long long* hist, int bins, Need need_of,
                                  unsigned long long* scratch, SamplePick* shared) {
  const int per = bins / static_cast<int>(blockDim.x);
  unsigned long long local[kSampleBins / kSampleThreads];
  unsigned long long sum = 0;
#pragma unroll
  for (int j = 0; j < kSampleBins / kSampleThreads; ++j) {
    local[j] = 0;
    if (j < per) {
      const int bin = bins - 1 - (static_cast<int>(threadIdx.x) * per + j);
      local[j] = __ldcg(hist + bin);
      hist[bin] = 0;
      sum += local[j];
    }
  }
  if (threadIdx.x == 0) {
    shared->bin = static_cast<unsigned int>(bins - 1);
    shared->found = 0;
    shared->above = 0;
  }
  unsigned long long total;
  const unsigned long long before = sample_block_scan(sum, scratch, &total);
  const unsigned long long need = need_of(total);
  if (before < need && need <= before + sum) {
    unsigned long long acc = before;
#pragma unroll
    for (int j = 0; j < kSampleBins / kSampleThreads; ++j) {
      if (j < per) {
        if (need <= acc + local[j]) {
          shared->bin = static_cast<unsigned int>(bins - 1 - (static_cast<int>(threadIdx.x) * per + j));
          shared->found = 1;
          shared->above = acc;
          break;
        }
        acc += local[j];
      }
    }
  }
  __syncthreads();
  SamplePick result = *shared;
  result.total = total;
  result.need = need;
  __syncthreads();
  return result;
}

// Calls f(index in the row, value) for the elements [begin, end) of `row` this thread owns: 16-byte
// packs strided over the block (Depth loads in flight), scalars before the first aligned pack and after
// the last.
template <int Depth = 2, typename T, typename F>
__device__ __forceinline__ void sample_visit(const T* row, index_t begin, index_t end, F&& f) {
  constexpr int V = 16 / sizeof(T);
  const index_t n = end - begin;
  if (n <= 0) return;
  const T* base = row + begin;
  const unsigned long long address = reinterpret_cast<unsigned long long>(base);
  index_t head = static_cast<index_t>(((16 - (address & 15)) & 15) / sizeof(T));
  if (address % sizeof(T) != 0 || head > n) head = n;
  const index_t step = blockDim.x;
  for (index_t j = threadIdx.x; j < head; j += step) f(begin + j, convert<float>(base[j]));
  const index_t packs = (n - head) / V;
  const Pack<T, V>* p = reinterpret_cast<const Pack<T, V>*>(base + head);
  const index_t first = begin + head;
  index_t k = threadIdx.x;
  for (; k + (Depth - 1) * step < packs; k += Depth * step) {
    Pack<T, V> loaded[Depth];
#pragma unroll
    for (int d = 0; d < Depth; ++d) loaded[d] = p[k + d * step];
#pragma unroll
    for (int d = 0; d < Depth; ++d) {
#pragma unroll
      for (int j = 0; j < V; ++j) f(first + (k + d * step) * V + j, convert<float>(loaded[d].v[j]));
    }
  }
  for (; k < packs; k += step) {
    const Pack<T, V> a = p[k];
#pragma unroll
    for (int j = 0; j < V; ++j) f(first + k * V + j, convert<float>(a.v[j]));
  }
  for (index_t j = head + packs * V + threadIdx.x; j < n; j += step) f(begin + j, convert<float>(base[j]));
}

__device__ __forceinline__ void sample_clear_shared(unsigned long long* hist) {
  for (int b = threadIdx.x; b < kSampleBins; b += blockDim.x) hist[b] = 0;
  __syncthreads();
}

__device__ __forceinline__ void sample_flush(const unsigned long long* hist, unsigned long long* global,
                                             int bins) {
  __syncthreads();
  for (int b = threadIdx.x; b < bins; b += blockDim.x) {
    const unsigned long long v = hist[b];
    if (v) atomicAdd(global + b, v);
  }
}

__device__ __forceinline__ unsigned int sample_argmax(unsigned long long best) {
  return 0xffffffffu - static_cast<unsigned int>(best);
}

// The last block of a row in the call's last pass: clear the row's state, advance the step.
__device__ void sample_finish(const SampleArgs& a, int row, unsigned long long* rs) {
  if (threadIdx.x == 0) {
    rs[kBest] = 0;
    rs[kKeptTotal] = 0;
  }
  if (a.flags & kFlagPenalty) {
    unsigned int* bits = a.bitmap + row * a.bitmap_words;
    const int* ids = a.history + row * a.history_stride;
    for (index_t j = threadIdx.x; j < a.history_len; j += blockDim.x) {
      const int id = ids[j];
      if (id >= 0 && id < a.vocab) bits[id >> 5] = 0;
    }
  }
  if ((a.flags & kFlagAdvance) && threadIdx.x == 0) {
    __threadfence();
    const unsigned long long done = atomicAdd(a.state + 2, 1ull);
    if (done == static_cast<unsigned long long>(a.rows) - 1) {
      atomicExch(a.state + 2, 0ull);
      atomicAdd(a.state + 1, 1ull);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kSampleThreads) sample_pass(const T* __restrict__ logits, SampleArgs a) {
  __shared__ unsigned long long hist[kSampleBins];
  __shared__ unsigned long long scratch[33];
  __shared__ SamplePick pick;
  __shared__ int flag;
  __shared__ unsigned int found_token;
  __shared__ unsigned int found_chunk;
  __shared__ unsigned long long found_rest;

  const int row = blockIdx.y;
  const SampleRow p = sample_row(a, row);
  unsigned long long* rs = a.state + kSampleHeader + static_cast<index_t>(row) * kRowWords;
  const T* x = logits + static_cast<index_t>(row) * a.row_stride;
  const unsigned int* bits = a.bitmap + (a.bitmap ? static_cast<index_t>(row) * a.bitmap_words : 0);
  const index_t begin = static_cast<index_t>(blockIdx.x) * a.chunk;
  const index_t end = begin + a.chunk < a.vocab ? begin + a.chunk : a.vocab;
  const bool last_pass = (a.flags & kFlagFinal) != 0;

  switch (a.pass) {
    case kStats: {
      if (p.topk) sample_clear_shared(hist);
      unsigned long long best = 0;
      sample_visit(x, begin, end, [&](index_t i, float raw) {
        const unsigned int key = sample_key(sample_value(raw, p, bits, static_cast<unsigned int>(i)));
        const unsigned long long packed =
            (static_cast<unsigned long long>(key) << 32) | (0xffffffffu - static_cast<unsigned int>(i));
        best = packed > best ? packed : best;
        if (p.topk) atomicAdd(&hist[key >> 21], 1ull);
      });
      best = sample_block_max(best, scratch);
      if (threadIdx.x == 0) atomicMax(rs + kBest, best);
      if (p.topk) sample_flush(hist, rs + kRowHist, kSampleBins);
      if (!sample_last_block(rs + kTicket, &flag)) return;
      if (threadIdx.x == 0) {
        rs[kTopkKey] = 0;
        rs[kThreshold] = 0;
      }
      if (p.topk) {
        const unsigned long long k = static_cast<unsigned long long>(p.top_k);
        const SamplePick s =
            sample_pick(rs + kRowHist, kSampleBins, [k](unsigned long long) { return k; }, scratch, &pick);
        if (threadIdx.x == 0) {
          rs[kPrefix] = s.bin;
          rs[kRemaining] = k - s.above;
        }
      }
      if (last_pass) {
        if (threadIdx.x == 0 && (a.flags & kFlagToken))
          a.out[row] = static_cast<int>(sample_argmax(__ldcg(rs + kBest)));
        __syncthreads();
        sample_finish(a, row, rs);
      }
      return;
    }
    case kTopK1:
    case kTopK2: {
      if (!p.topk) return;
      const bool second = a.pass == kTopK2;
      const unsigned int prefix = static_cast<unsigned int>(rs[kPrefix]);
      sample_clear_shared(hist);
      sample_visit(x, begin, end, [&](index_t i, float raw) {
        const unsigned int key = sample_key(sample_value(raw, p, bits, static_cast<unsigned int>(i)));
        if (!second && (key >> 21) == prefix) atomicAdd(&hist[(key >> 10) & 2047u], 1ull);
        if (second && (key >> 10) == prefix) atomicAdd(&hist[key & 1023u], 1ull);
      });
      const int bins = second ? 1024 : kSampleBins;
      sample_flush(hist, rs + kRowHist, bins);
      if (!sample_last_block(rs + kTicket, &flag)) return;
      const unsigned long long need = rs[kRemaining];
      const SamplePick s =
          sample_pick(rs + kRowHist, bins, [need](unsigned long long) { return need; }, scratch, &pick);
      if (threadIdx.x == 0) {
        if (second) {
          rs[kTopkKey] = (prefix << 10) | s.bin;
          rs[kThreshold] = (prefix << 10) | s.bin;
        } else {
          rs[kPrefix] = (prefix << 11) | s.bin;
          rs[kRemaining] = need - s.above;
        }
      }
      return;
    }
    case kTopP0:
    case kTopP1:
    case kTopP2: {
      if (!p.topp) return;
      const int digit = a.pass - kTopP0;
      const float max = sample_key_value(static_cast<unsigned int>(rs[kBest] >> 32));
      const unsigned int low = static_cast<unsigned int>(rs[kTopkKey]);
      const unsigned int prefix = static_cast<unsigned int>(rs[kPrefix]);
      sample_clear_shared(hist);
      sample_visit(x, begin, end, [&](index_t i, float raw) {
        const float v = sample_value(raw, p, bits, static_cast<unsigned int>(i));
        const unsigned int key = sample_key(v);
        if (key < low) return;
        unsigned int bin;
        if (digit == 0) {
          bin = key >> 21;
        } else if (digit == 1) {
          if ((key >> 21) != prefix) return;
          bin = (key >> 10) & 2047u;
        } else {
          if ((key >> 10) != prefix) return;
          bin = key & 1023u;
        }
        const unsigned long long q = sample_quantise(sample_exp(v, max));
        if (q) atomicAdd(&hist[bin], q);
      });
      const int bins = digit == 2 ? 1024 : kSampleBins;
      sample_flush(hist, rs + kRowHist, bins);
      if (!sample_last_block(rs + kTicket, &flag)) return;
      const unsigned long long remaining = rs[kRemaining];
      const float top_p = p.top_p;
      const SamplePick s = sample_pick(
          rs + kRowHist, bins,
          [digit, remaining, top_p](unsigned long long total) {
            if (digit != 0) return remaining;
            // ceil(top_p * total), at most the total (rounding) and at least 1.
            const double target = ceil(static_cast<double>(top_p) * static_cast<double>(total));
            const unsigned long long need =
                target >= static_cast<double>(total) ? total : static_cast<unsigned long long>(target);
            return need < 1ull ? 1ull : need;
          },
          scratch, &pick);
      if (threadIdx.x == 0) {
        if (digit == 2) {
          rs[kThreshold] = (prefix << 10) | s.bin;
        } else {
          rs[kPrefix] = digit == 0 ? s.bin : ((prefix << 11) | s.bin);
          rs[kRemaining] = s.need - s.above;
        }
      }
      return;
    }
    case kDraw: {
      const float max = sample_key_value(static_cast<unsigned int>(rs[kBest] >> 32));
      const unsigned int threshold = static_cast<unsigned int>(rs[kThreshold]);
      unsigned long long sum = 0;
      if (!p.greedy) {
        sample_visit(x, begin, end, [&](index_t i, float raw) {
          sum += sample_kept(sample_value(raw, p, bits, static_cast<unsigned int>(i)), max, threshold, p);
        });
      }
      sum = sample_block_sum(sum, scratch);
      if (threadIdx.x == 0) rs[kRowChunks + blockIdx.x] = sum;
      if (!sample_last_block(rs + kTicket, &flag)) return;
      const unsigned int chunks = gridDim.x;
      const unsigned long long mine = threadIdx.x < chunks ? __ldcg(rs + kRowChunks + threadIdx.x) : 0ull;
      unsigned long long total;
      const unsigned long long before = sample_block_scan(mine, scratch, &total);
      if (a.flags & kFlagToken) {
        if (threadIdx.x == 0) {
          found_token = sample_argmax(__ldcg(rs + kBest));
          found_chunk = 0xffffffffu;
        }
        __syncthreads();
        if (!p.greedy && total > 0) {
          const unsigned long long seed = __ldcg(a.state);
          const unsigned long long step = __ldcg(a.state + 1);
          const unsigned long long r =
              __umul64hi(sample_random(seed, step, static_cast<unsigned int>(row)), total);
          if (threadIdx.x < chunks && before <= r && r < before + mine) {
            found_chunk = threadIdx.x;
            found_rest = r - before;
          }
          __syncthreads();
          const unsigned int c = found_chunk;
          unsigned long long rest = found_rest;
          if (c != 0xffffffffu) {
            const index_t cbegin = static_cast<index_t>(c) * a.chunk;
            const index_t cend = cbegin + a.chunk < a.vocab ? cbegin + a.chunk : a.vocab;
            for (index_t tile = cbegin; tile < cend;
                 tile += static_cast<index_t>(blockDim.x) * kSamplePerThread) {
              const index_t start = tile + static_cast<index_t>(threadIdx.x) * kSamplePerThread;
              // The kept weight of element i (0 past the chunk), recomputed by the one thread that walks.
              auto weight = [&](index_t i) {
                return i < cend ? sample_kept(sample_value(convert<float>(x[i]), p, bits,
                                                           static_cast<unsigned int>(i)),
                                              max, threshold, p)
                                : 0ull;
              };
              unsigned long long own = 0;
#pragma unroll 4
              for (int j = 0; j < kSamplePerThread; ++j) own += weight(start + j);
              unsigned long long tile_total;
              const unsigned long long prior = sample_block_scan(own, scratch, &tile_total);
              if (rest < tile_total) {
                if (prior <= rest && rest < prior + own) {
                  unsigned long long acc = prior;
                  for (int j = 0; j < kSamplePerThread; ++j) {
                    acc += weight(start + j);
                    if (rest < acc) {
                      found_token = static_cast<unsigned int>(start + j);
                      break;
                    }
                  }
                }
                break;
              }
              rest -= tile_total;
            }
          }
        }
        __syncthreads();
        if (threadIdx.x == 0) a.out[row] = static_cast<int>(found_token);
      } else if (threadIdx.x == 0) {
        rs[kKeptTotal] = total;
      }
      __syncthreads();
      if (last_pass) sample_finish(a, row, rs);
      return;
    }
    case kProbs: {
      const unsigned long long best = rs[kBest];
      const float max = sample_key_value(static_cast<unsigned int>(best >> 32));
      const unsigned int argmax = sample_argmax(best);
      const unsigned int threshold = static_cast<unsigned int>(rs[kThreshold]);
      const unsigned long long total = rs[kKeptTotal];
      float* out = a.probs + static_cast<index_t>(row) * a.vocab;
      sample_visit(x, begin, end, [&](index_t i, float raw) {
        float prob;
        if (p.greedy || total == 0) {
          prob = static_cast<unsigned int>(i) == argmax ? 1.0f : 0.0f;
        } else {
          const unsigned long long q =
              sample_kept(sample_value(raw, p, bits, static_cast<unsigned int>(i)), max, threshold, p);
          prob = static_cast<float>(static_cast<double>(q) / static_cast<double>(total));
        }
        out[i] = prob;
      });
      if (!sample_last_block(rs + kTicket, &flag)) return;
      if (last_pass) sample_finish(a, row, rs);
      return;
    }
    default:
      return;
  }
}

// Marks the history: bit id of row `row` for every id in [0, vocab) of history[row, :].
__global__ void sample_mark(SampleArgs a) {
  const index_t n = static_cast<index_t>(a.rows) * a.history_len;
  for (index_t i = global_thread(); i < n; i += grid_threads()) {
    const index_t row = i / a.history_len;
    const int id = a.history[row * a.history_stride + (i - row * a.history_len)];
    if (id >= 0 && id < a.vocab) atomicOr(a.bitmap + row * a.bitmap_words + (id >> 5), 1u << (id & 31));
  }
}

// Greedy without a workspace: the first index of each row's largest value (NaN counts as largest).
template <typename T>
__global__ void __launch_bounds__(1024)
    sample_argmax_rows(const T* __restrict__ logits, int* __restrict__ out, long long row_stride,
                       long long vocab) {
  __shared__ unsigned long long scratch[33];
  const T* x = logits + static_cast<index_t>(blockIdx.x) * row_stride;
  unsigned long long best = 0;
  sample_visit<4>(x, 0, vocab, [&](index_t i, float raw) {
    const unsigned long long packed = (static_cast<unsigned long long>(sample_key(raw + 0.0f)) << 32) |
                                      (0xffffffffu - static_cast<unsigned int>(i));
    best = packed > best ? packed : best;
  });
  best = sample_block_max(best, scratch);
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<int>(sample_argmax(best));
}

}  // namespace ops
}  // namespace pygpukit
