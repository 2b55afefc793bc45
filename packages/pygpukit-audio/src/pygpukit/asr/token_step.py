"""One greedy decoding step of Whisper's token rules on the device: the logit filters, the argmax and the
log-probability bookkeeping of :class:`~pygpukit.asr.decoding.TokenRules`, for every row of a batch, from
per-row state kept in device memory, so a captured decode step (:mod:`pygpukit.asr.graph_decode`) needs
nothing from the host but its replay, and the host reads back only the chosen tokens.

The per-row state is an int32 (rows, 5) array: the number of tokens generated so far, the last and the
second-to-last of them, the last timestamp token (-1 before the first) and a finished flag. ``sum_lp``
(float64, (rows,)) accumulates the log-probability of each chosen token (the end token's included).

The rules are those of :meth:`TokenRules.apply` followed by greedy selection, evaluated per row:

- suppressed tokens at every step; ``suppress_blank`` tokens at the first step;
- with timestamps: <|notimestamps|> never; at the first step only timestamps up to
  ``max_initial_timestamp_index``; after a pair of timestamps no timestamp; after a single timestamp
  no text token below <|endoftext|> and no earlier timestamp; after text no timestamp up to the last
  one; and where the rules allow both, the timestamps are forced when their total probability beats
  every text token's;
- the token is the first maximum, its log-probability that of the filtered distribution (sums and
  logarithms in float64 on float32 logits, as the host path computes them; on the GPU each exponential
  exp(v - max) is float32's ``expf``, within 2 ulp, which moves a log-probability by about 1e-7). A
  finished row emits <|endoftext|> and its state and sum stay as they are.

On the CUDA backend one block of 1024 threads per row runs the step (``whisper_greedy_step_*``, compiled
with NVRTC on first use), each thread reading four vocabulary entries (logit and masks) before it uses
any: the row's two passes are bound by load latency, not arithmetic (with one load in flight per thread
and float64 exponentials a step took 85 us on an H100 at Whisper's 51864 tokens). On the CPU backend
NumPy runs it, on the arrays' memory, so a CPU-backend CudaGraph records the call (it is public and
lives outside the opted-in graph module) and replays it.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray
from pygpukit.core.dtypes import DType, float64, int32, uint8, uint64
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.core.jit import JITKernel

__all__ = ["STATE_FIELDS", "beam_rules_topk", "greedy_rules_step", "row_state", "sample_rules_step", "sampling_array"]

STATE_FIELDS = ("count", "last", "penultimate", "last_timestamp", "done")
_BLOCK = 1024
_SUFFIX = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}

_SOURCE = r"""
// KIND 0: float32, 1: float16, 2: bfloat16 (read as bits: no header needed)
template <int KIND>
__device__ __forceinline__ float load(const void* p, long long i) {
    if (KIND == 0) return ((const float*)p)[i];
    unsigned short bits = ((const unsigned short*)p)[i];
    if (KIND == 2) return __uint_as_float(((unsigned int)bits) << 16);
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits));
    return f;
}

#define NEG_INF (-__int_as_float(0x7f800000))
#define DINF (__longlong_as_double(0x7ff0000000000000LL))

struct RowRules {
    int count, last, pen, last_ts, eot, no_ts, tsb, max_init, timestamps, check;
};

// Whether token i is filtered out; sup and blk are suppress[i] and blank[i].
__device__ __forceinline__ bool masked(const RowRules& r, int i, unsigned char sup, unsigned char blk) {
    if (sup) return true;
    if (r.count == 0 && blk) return true;
    if (!r.timestamps) return false;
    if (i == r.no_ts) return true;
    if (r.count == 0) return i < r.tsb || i > r.tsb + r.max_init;
    if (r.last >= r.tsb) {
        if (r.pen >= r.tsb) return i >= r.tsb;
        return i < r.eot || (i >= r.tsb && i < r.last);
    }
    return r.last_ts >= 0 && i >= r.tsb && i <= r.last_ts;
}

// f(value, i) for every entry i of a row the rules keep, this thread's entries tid + k BLOCK: UNROLL of them
// at a time, every load of a group issued before any is used (the row's passes are bound by load latency).
template <int KIND, typename F>
__device__ __forceinline__ void visit_kept(const RowRules& r, int tid, int vocab, const void* x, long long offset,
                                           const unsigned char* suppress, const unsigned char* blank, F&& f) {
    for (int start = tid; start < vocab; start += BLOCK * UNROLL) {
        float v[UNROLL];
        bool keep[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int i = start + u * BLOCK;
            const bool in = i < vocab;
            const unsigned char sup = in ? suppress[i] : 1, blk = in ? blank[i] : 0;
            v[u] = in ? load<KIND>(x, offset + i) : 0.0f;
            keep[u] = in && !masked(r, i, sup, blk);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (keep[u]) f(v[u], start + u * BLOCK);
        }
    }
}

// (value, index) maximum with the lower index winning ties, as numpy.argmax.
__device__ __forceinline__ void better(float& v, int& k, float v2, int k2) {
    if (v2 > v || (v2 == v && k2 >= 0 && (k < 0 || k2 < k))) { v = v2; k = k2; }
}

// The row's statistics over the entries the rules keep, in every thread: the first maximum of the text
// tokens (mt at at) and of the timestamps (ms at as), and the sums of exp(v - max) of each group (float64).
struct RowStats {
    float mt, ms;
    int at, as;
    double stx, sts;
};

template <int KIND>
__device__ RowStats row_stats(const RowRules& r, int tid, int vocab, const void* x, long long offset,
                              const unsigned char* suppress, const unsigned char* blank, float (*s_val)[BLOCK],
                              int (*s_idx)[BLOCK], double (*s_sum)[BLOCK]) {
    RowStats o;
    float mt = NEG_INF, ms = NEG_INF;
    int at = -1, as = -1;
    const int tsb = r.tsb;
    // (Ties go to the lower index whatever the order, so the order of the visits does not matter.)
    visit_kept<KIND>(r, tid, vocab, x, offset, suppress, blank, [&](float v, int i) {
        if (i < tsb) better(mt, at, v, i); else better(ms, as, v, i);
    });
    s_val[0][tid] = mt; s_idx[0][tid] = at; s_val[1][tid] = ms; s_idx[1][tid] = as;
    __syncthreads();
    for (int half = BLOCK / 2; half > 0; half >>= 1) {
        if (tid < half) {
            for (int g = 0; g < 2; ++g) {
                float v = s_val[g][tid]; int k = s_idx[g][tid];
                better(v, k, s_val[g][tid + half], s_idx[g][tid + half]);
                s_val[g][tid] = v; s_idx[g][tid] = k;
            }
        }
        __syncthreads();
    }
    o.mt = s_val[0][0]; o.at = s_idx[0][0]; o.ms = s_val[1][0]; o.as = s_idx[1][0];
    double st_sum = 0.0, ss_sum = 0.0;
    const float mt0 = o.mt, ms0 = o.ms;
    // v <= the maximum of its group: exp of a non-positive float32 difference, summed in float64
    visit_kept<KIND>(r, tid, vocab, x, offset, suppress, blank, [&](float v, int i) {
        if (i < tsb) st_sum += (double)expf(v - mt0); else ss_sum += (double)expf(v - ms0);
    });
    __syncthreads();
    s_sum[0][tid] = st_sum; s_sum[1][tid] = ss_sum;
    __syncthreads();
    for (int half = BLOCK / 2; half > 0; half >>= 1) {
        if (tid < half) { s_sum[0][tid] += s_sum[0][tid + half]; s_sum[1][tid] += s_sum[1][tid + half]; }
        __syncthreads();
    }
    o.stx = s_sum[0][0]; o.sts = s_sum[1][0];
    return o;
}

__device__ __forceinline__ void load_rules(RowRules& r, const int* st, int eot, int no_ts, int tsb, int max_init,
                                           int timestamps) {
    r.count = st[0]; r.last = st[1]; r.pen = st[2]; r.last_ts = st[3];
    r.eot = eot; r.no_ts = no_ts; r.tsb = tsb; r.max_init = max_init; r.timestamps = timestamps;
    r.check = timestamps && r.count > 0 && !(r.last >= tsb && r.pen >= tsb);
}

// Whether the timestamps are forced (their total probability beats every text token), and the row's
// log-probability of an entry of value v: v - m - log_total (float64).
__device__ __forceinline__ bool normalizer(const RowRules& r, const RowStats& o, double& m, double& log_total) {
    const double dmt = (double)o.mt, dms = (double)o.ms;
    const bool text_ok = o.at >= 0 && dmt > -DINF, ts_ok = o.as >= 0 && dms > -DINF;
    if (r.check && ts_ok && dms + log(o.sts) > (text_ok ? dmt : -DINF)) {
        m = dms; log_total = log(o.sts);
        return true;
    }
    if (text_ok || ts_ok) {
        m = text_ok && (!ts_ok || dmt >= dms) ? dmt : dms;
        log_total = log((text_ok ? o.stx * exp(dmt - m) : 0.0) + (ts_ok ? o.sts * exp(dms - m) : 0.0));
    } else {
        m = 0.0; log_total = DINF;
    }
    return false;
}

// A counter-based uniform in (0, 1) (24 bits; splitmix64 of the seed and the counter) and its Gumbel
// variate -log(-log(u)): the key v / T + g whose maximum over a row is a sample of softmax(v / T).
__device__ __forceinline__ float gumbel(unsigned long long seed, int row, int step, int i) {
    const unsigned long long counter = ((unsigned long long)step << 36) | ((unsigned long long)row << 20) |
                                       (unsigned long long)i;
    unsigned long long z = seed + (counter + 1ull) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = ((float)(z >> 40) + 0.5f) * 5.9604644775390625e-8f;  // 2^-24
    return -logf(-logf(u));
}

// One decoding step of a row: the token the rules allow, greedy (inv_temp 0: the first maximum) or sampled
// from softmax(v * inv_temp) over the kept entries (Gumbel keys, the first maximum), its log-probability
// in the filtered distribution at temperature 1 added to sum_lp, the row's state updated.
template <int KIND>
__device__ void choose_step(const void* logits, long long row_stride, const unsigned char* suppress,
                            const unsigned char* blank, int* tokens, int* state, double* sum_lp, int eot,
                            int no_ts, int tsb, int max_init, int timestamps, int vocab, float inv_temp,
                            unsigned long long seed) {
    __shared__ float s_val[2][BLOCK];
    __shared__ int s_idx[2][BLOCK];
    __shared__ double s_sum[2][BLOCK];
    const int row = blockIdx.x, tid = threadIdx.x;
    int* st = state + 5 * row;
    RowRules r;
    load_rules(r, st, eot, no_ts, tsb, max_init, timestamps);
    const int done = st[4];
    const long long offset = (long long)row * row_stride;
    const RowStats o = row_stats<KIND>(r, tid, vocab, logits, offset, suppress, blank, s_val, s_idx, s_sum);
    double m, log_total;
    const bool forced = normalizer(r, o, m, log_total);
    int token = eot;
    double lp = -DINF;
    if (inv_temp > 0.0f) {
        float bk = NEG_INF;
        int bi = -1;
        visit_kept<KIND>(r, tid, vocab, logits, offset, suppress, blank, [&](float v, int i) {
            if ((forced && i < tsb) || !(v > NEG_INF)) return;
            better(bk, bi, v * inv_temp + gumbel(seed, row, r.count, i), i);
        });
        s_val[0][tid] = bk; s_idx[0][tid] = bi;
        __syncthreads();
        for (int half = BLOCK / 2; half > 0; half >>= 1) {
            if (tid < half) {
                float v = s_val[0][tid]; int k = s_idx[0][tid];
                better(v, k, s_val[0][tid + half], s_idx[0][tid + half]);
                s_val[0][tid] = v; s_idx[0][tid] = k;
            }
            __syncthreads();
        }
        if (tid != 0) return;
        bi = s_idx[0][0];
        if (bi >= 0) {
            token = bi;
            lp = (double)load<KIND>(logits, offset + bi) - m - log_total;
        }
    } else {
        if (tid != 0) return;
        const double dmt = (double)o.mt, dms = (double)o.ms;
        const bool text_ok = o.at >= 0 && dmt > -DINF, ts_ok = o.as >= 0 && dms > -DINF;
        if (forced) {
            token = o.as;
            lp = -log_total;
        } else if (text_ok || ts_ok) {
            token = text_ok && (!ts_ok || dmt >= dms) ? o.at : o.as;
            lp = -log_total;
        }
    }
    if (done) { tokens[row] = eot; return; }
    sum_lp[row] += lp;
    if (token == eot) {
        st[4] = 1;
    } else {
        st[2] = r.count == 0 ? token : r.last;
        st[1] = token;
        if (token >= tsb) st[3] = token;
        st[0] = r.count + 1;
    }
    tokens[row] = token;
}

// (v, i) strictly after (lv, li) in the order of value descending, then index ascending.
__device__ __forceinline__ bool after(float v, int i, float lv, int li) {
    return v < lv || (v == lv && i > li);
}

// One beam-search step of a row: the k entries the rules keep with the highest log-probabilities (ties:
// lower index first), as indices and score + log-probability (float64); -1 and -inf past the kept entries.
// k rounds, each a block-wide maximum over the entries after the previous round's winner.
template <int KIND>
__device__ void beam_topk(const void* logits, long long row_stride, const unsigned char* suppress,
                          const unsigned char* blank, const int* state, const double* scores, int eot, int no_ts,
                          int tsb, int max_init, int timestamps, int vocab, int k, int* out_idx, double* out_val) {
    __shared__ float s_val[2][BLOCK];
    __shared__ int s_idx[2][BLOCK];
    __shared__ double s_sum[2][BLOCK];
    __shared__ double s_norm[2];
    __shared__ int s_forced;
    const int row = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    RowRules r;
    load_rules(r, state + 5 * row, eot, no_ts, tsb, max_init, timestamps);
    const long long offset = (long long)row * row_stride;
    const RowStats o = row_stats<KIND>(r, tid, vocab, logits, offset, suppress, blank, s_val, s_idx, s_sum);
    if (tid == 0) {
        double m, log_total;
        s_forced = normalizer(r, o, m, log_total) ? 1 : 0;
        s_norm[0] = m; s_norm[1] = log_total;
    }
    __syncthreads();
    const bool forced = s_forced != 0;
    const double base = scores[row] - s_norm[0] - s_norm[1];
    float lv = __int_as_float(0x7f800000);
    int li = -1;
    for (int round = 0; round < k; ++round) {
        float bv = NEG_INF;
        int bi = -1;
        visit_kept<KIND>(r, tid, vocab, logits, offset, suppress, blank, [&](float v, int i) {
            // -inf (and NaN) logits are not candidates: probability 0, as the host's kept entries
            if (!(forced && i < tsb) && v > NEG_INF && after(v, i, lv, li)) better(bv, bi, v, i);
        });
        for (int delta = 16; delta > 0; delta >>= 1) {
            const float v2 = __shfl_down_sync(0xffffffffu, bv, delta);
            const int i2 = __shfl_down_sync(0xffffffffu, bi, delta);
            better(bv, bi, v2, i2);
        }
        if (lane == 0) { s_val[0][warp] = bv; s_idx[0][warp] = bi; }
        __syncthreads();
        if (warp == 0) {
            bv = lane < BLOCK / 32 ? s_val[0][lane] : NEG_INF;
            bi = lane < BLOCK / 32 ? s_idx[0][lane] : -1;
            for (int delta = 16; delta > 0; delta >>= 1) {
                const float v2 = __shfl_down_sync(0xffffffffu, bv, delta);
                const int i2 = __shfl_down_sync(0xffffffffu, bi, delta);
                better(bv, bi, v2, i2);
            }
            if (lane == 0) {
                s_val[1][0] = bv; s_idx[1][0] = bi;
                out_idx[(long long)row * k + round] = bi;
                out_val[(long long)row * k + round] = bi >= 0 ? base + (double)bv : -DINF;
            }
        }
        __syncthreads();
        lv = s_val[1][0]; li = s_idx[1][0];
        if (li < 0) lv = NEG_INF;  // nothing left: every later round finds nothing either
    }
}

#define KIND_f32 0
#define KIND_f16 1
#define KIND_bf16 2
#define ENTRY(SUFFIX)                                                                                        \
extern "C" __global__ void __launch_bounds__(BLOCK) whisper_greedy_step_##SUFFIX(                             \
        const void* logits, long long row_stride, const unsigned char* suppress, const unsigned char* blank, \
        int* tokens, int* state, double* sum_lp, const int* params, int vocab) {                            \
    choose_step<KIND_##SUFFIX>(logits, row_stride, suppress, blank, tokens, state, sum_lp, params[0],       \
                               params[1], params[2], params[3], params[4], vocab, 0.0f, 0ull);               \
}                                                                                                            \
extern "C" __global__ void __launch_bounds__(BLOCK) whisper_sample_step_##SUFFIX(                             \
        const void* logits, long long row_stride, const unsigned char* suppress, const unsigned char* blank, \
        int* tokens, int* state, double* sum_lp, const int* params, int vocab,                              \
        const unsigned long long* sampling) {                                                                \
    choose_step<KIND_##SUFFIX>(logits, row_stride, suppress, blank, tokens, state, sum_lp, params[0],       \
                               params[1], params[2], params[3], params[4], vocab,                            \
                               __uint_as_float((unsigned)sampling[1]), sampling[0]);                        \
}
ENTRY(f32)
ENTRY(f16)
ENTRY(bf16)
#define BEAM_ENTRY(SUFFIX)                                                                                   \
extern "C" __global__ void __launch_bounds__(BLOCK) whisper_beam_topk_##SUFFIX(                               \
        const void* logits, long long row_stride, const unsigned char* suppress, const unsigned char* blank, \
        const int* state, const double* scores, const int* params, int vocab, int k, int* out_idx,           \
        double* out_val) {                                                                                   \
    beam_topk<KIND_##SUFFIX>(logits, row_stride, suppress, blank, state, scores, params[0], params[1],        \
                             params[2], params[3], params[4], vocab, k, out_idx, out_val);                   \
}
BEAM_ENTRY(f32)
BEAM_ENTRY(f16)
BEAM_ENTRY(bf16)
""".replace("BLOCK", str(_BLOCK)).replace("UNROLL", "4")


@functools.cache
def _kernel(suffix: str) -> JITKernel:
    from pygpukit.core.jit import Param

    pointer = [Param(n, "void*", "pointer", "Q") for n in ("logits",)]
    params = [
        *pointer,
        Param("row_stride", "long long", "scalar", "q"),
        *[Param(n, "void*", "pointer", "Q") for n in ("suppress", "blank", "tokens", "state", "sum_lp", "params")],
        Param("vocab", "int", "scalar", "i"),
    ]
    return JITKernel(_SOURCE, f"whisper_greedy_step_{suffix}", params=params)


@functools.cache
def _sample_kernel(suffix: str) -> JITKernel:
    from pygpukit.core.jit import Param

    params = [
        Param("logits", "void*", "pointer", "Q"),
        Param("row_stride", "long long", "scalar", "q"),
        *[Param(n, "void*", "pointer", "Q") for n in ("suppress", "blank", "tokens", "state", "sum_lp", "params")],
        Param("vocab", "int", "scalar", "i"),
        Param("sampling", "void*", "pointer", "Q"),
    ]
    return JITKernel(_SOURCE, f"whisper_sample_step_{suffix}", params=params)


@functools.cache
def _beam_kernel(suffix: str) -> JITKernel:
    from pygpukit.core.jit import Param

    def pointers(*names: str) -> list[Param]:
        return [Param(n, "void*", "pointer", "Q") for n in names]

    params = [*pointers("logits"), Param("row_stride", "long long", "scalar", "q"),
              *pointers("suppress", "blank", "state", "scores", "params"), Param("vocab", "int", "scalar", "i"),
              Param("k", "int", "scalar", "i"), *pointers("out_idx", "out_val")]  # fmt: skip
    return JITKernel(_SOURCE, f"whisper_beam_topk_{suffix}", params=params)


def _is_cuda() -> bool:
    from pygpukit.core import backend

    return backend.backend_state().name == "cuda"


def rules_arrays(rules: Any) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The host values of a :class:`~pygpukit.asr.decoding.TokenRules` that the step reads from the
    device: the suppress and first-step masks (uint8 (vocab,)) and the int32 parameters (eot,
    no_timestamps, timestamp_begin, max_initial_timestamp_index, timestamps)."""
    suppress = np.zeros(rules.vocab_size, np.uint8)
    blank = np.zeros(rules.vocab_size, np.uint8)
    for mask, ids in ((suppress, rules.suppress), (blank, rules.suppress_blank)):
        index = np.asarray(ids, np.int64)
        if index.size and (index.min() < 0 or index.max() >= rules.vocab_size):
            raise ShapeError(f"token rules: token ids {index.min()}..{index.max()} outside the vocabulary of "
                             f"{rules.vocab_size}")  # fmt: skip
        mask[index] = 1
    params = np.array([rules.eot, rules.no_timestamps, rules.timestamp_begin, rules.max_initial_timestamp_index,
                       int(bool(rules.timestamps))], np.int32)  # fmt: skip
    return suppress, blank, params


def _check(logits: Any, arrays: dict[str, tuple[Any, tuple[int, ...], DType]], name: str) -> tuple[int, int]:
    if not isinstance(logits, GPUArray) or logits.ndim != 2 or logits._strides[-1] != 1:
        raise ShapeError(f"{name}: logits must be a (rows, vocab) GPUArray with unit last stride, got "
                         f"{getattr(logits, 'shape', type(logits).__name__)}")  # fmt: skip
    if logits.dtype.name not in _SUFFIX:
        raise DTypeError(f"{name}: logits must be float32, float16 or bfloat16, got {logits.dtype.name}")
    rows, vocab = logits.shape
    for key, (array, shape, dtype) in arrays.items():
        shape = tuple(rows if s == -1 else vocab if s == -2 else s for s in shape)
        if not isinstance(array, GPUArray) or array.shape != shape or not array.is_contiguous:
            found = array.shape if isinstance(array, GPUArray) else type(array).__name__
            raise ShapeError(f"{name}: {key} must be a contiguous {shape} GPUArray, got {found}")
        if array.dtype != dtype:
            raise DTypeError(f"{name}: {key} must be {dtype.name}, got {array.dtype.name}")
    return rows, vocab


def greedy_rules_step(logits: GPUArray, tokens: GPUArray, state: GPUArray, sum_lp: GPUArray, suppress: GPUArray,
                      blank: GPUArray, params: GPUArray) -> None:  # fmt: skip
    """Apply the token rules to ``logits`` (rows, vocab), pick each row's token into ``tokens`` (rows,)
    int32 and update ``state`` (rows, 5) int32 and ``sum_lp`` (rows,) float64 in place; ``suppress``,
    ``blank`` and ``params`` are the device copies of :func:`rules_arrays`."""
    _rules_step("greedy_rules_step", logits, tokens, state, sum_lp, suppress, blank, params, None)


def sampling_array(temperature: float, seed: int) -> np.ndarray[Any, Any]:
    """The host value of :func:`sample_rules_step`'s ``sampling``: uint64 [seed, bits of float32 1 / T]."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 < temperature < np.inf:
        raise ArgumentError(f"sampling_array: temperature must be a finite number > 0, got {temperature!r}")
    inv_temp = np.float32(1.0 / float(temperature))
    return np.array([int(seed) & (2**64 - 1), int(inv_temp.view(np.uint32))], np.uint64)


def sample_rules_step(logits: GPUArray, tokens: GPUArray, state: GPUArray, sum_lp: GPUArray, suppress: GPUArray,
                      blank: GPUArray, params: GPUArray, sampling: GPUArray) -> None:  # fmt: skip
    """:func:`greedy_rules_step` with each row's token sampled from the softmax of the kept logits divided by
    a temperature instead of the maximum. ``sampling`` is the device copy of :func:`sampling_array` (T and a
    seed: device memory, so a captured step samples at whatever they are set to). Gumbel-max keys
    ``v / T - log(-log(u))`` with ``u`` a counter-based uniform of (seed, row, the row's token count,
    token), so a seed gives the same tokens on every run. The log-probability added to ``sum_lp`` is the
    token's in the filtered distribution at temperature 1, as the host path scores samples."""
    _rules_step("sample_rules_step", logits, tokens, state, sum_lp, suppress, blank, params, sampling)


def _rules_step(name: str, logits: GPUArray, tokens: GPUArray, state: GPUArray, sum_lp: GPUArray, suppress: GPUArray,
                blank: GPUArray, params: GPUArray, sampling: GPUArray | None) -> None:  # fmt: skip
    arrays = {"tokens": (tokens, (-1,), int32), "state": (state, (-1, len(STATE_FIELDS)), int32),
              "sum_lp": (sum_lp, (-1,), float64), "suppress": (suppress, (-2,), uint8),
              "blank": (blank, (-2,), uint8), "params": (params, (5,), int32)}  # fmt: skip
    if sampling is not None:
        arrays["sampling"] = (sampling, (2,), uint64)
    rows, vocab = _check(logits, arrays, name)
    if _is_cuda():
        args = (logits.device_ptr, logits._strides[0], suppress.device_ptr, blank.device_ptr, tokens.device_ptr,
                state.device_ptr, sum_lp.device_ptr, params.device_ptr, vocab)  # fmt: skip
        if sampling is not None:
            _sample_kernel(_SUFFIX[logits.dtype.name])(*args, sampling.device_ptr, grid=rows, block=_BLOCK)
        else:
            _kernel(_SUFFIX[logits.dtype.name])(*args, grid=rows, block=_BLOCK)
        return
    x = logits._host_view()
    eot, _, tsb, _, _ = (int(v) for v in params._host_view())
    st, out, sums = state._host_view(), tokens._host_view(), sum_lp._host_view()
    seed, inv_temp = 0, np.float32(0)
    if sampling is not None:
        seed_word, temp_word = (int(v) for v in sampling._host_view())
        seed, inv_temp = seed_word, np.uint32(temp_word).view(np.float32)
    for row in range(rows):
        count, last, _, last_ts, done = (int(v) for v in st[row])
        values, check = _filtered(x[row], st[row], suppress, blank, params)
        if sampling is not None:
            token, lp = _sample(values, tsb, check, eot, inv_temp, seed, row, count)
        else:
            token, lp = _choose(values, tsb, check, eot)
        if done:
            out[row] = eot
            continue
        sums[row] += lp
        if token == eot:
            st[row, 4] = 1
        else:
            st[row, :4] = (count + 1, token, token if count == 0 else last, token if token >= tsb else last_ts)
        out[row] = token


def _filtered(row: Any, state: Any, suppress: GPUArray, blank: GPUArray, params: GPUArray
              ) -> tuple[np.ndarray[Any, Any], bool]:  # fmt: skip
    """One row of logits (host values) with the entries the rules filter out at -inf, in float64, and
    whether the forced-timestamp rule applies to it (the CPU backend's form of the kernels' ``masked``)."""
    eot, no_timestamps, tsb, max_initial, timestamps = (int(v) for v in params._host_view())
    count, last, pen, last_ts = (int(v) for v in state[:4])
    always, first = suppress._host_view().astype(bool), blank._host_view().astype(bool)
    index = np.arange(always.shape[0])
    mask = always | first if count == 0 else always.copy()
    check = False
    if timestamps:
        mask[no_timestamps] = True
        if count == 0:
            mask |= (index < tsb) | (index > tsb + max_initial)
        elif last >= tsb:
            if pen >= tsb:
                mask |= index >= tsb
            else:
                mask |= (index < eot) | ((index >= tsb) & (index < last))
                check = True
        else:
            check = True
            if last_ts >= 0:
                mask |= (index >= tsb) & (index <= last_ts)
    return np.where(mask, -np.inf, np.asarray(row, np.float32).astype(np.float64)), check


def row_state(seq: list[int], timestamp_begin: int) -> list[int]:
    """The int32 state (:data:`STATE_FIELDS`) of a row that generated ``seq`` and is not finished."""
    last = seq[-1] if seq else -1
    pen = seq[-2] if len(seq) >= 2 else last
    stamps = [t for t in seq if t >= timestamp_begin]
    return [len(seq), last, pen, stamps[-1] if stamps else -1, 0]


def beam_rules_topk(logits: GPUArray, state: GPUArray, scores: GPUArray, suppress: GPUArray, blank: GPUArray,
                    params: GPUArray, k: int, *, out_idx: GPUArray | None = None,
                    out_val: GPUArray | None = None) -> tuple[GPUArray, GPUArray]:  # fmt: skip
    """One beam-search step of the token rules on the device: for each row of ``logits`` (rows, vocab), the
    ``k`` tokens the rules keep with the highest log-probabilities (filtered log-softmax in float64; ties:
    lower token first) as int32 indices (rows, k) and ``scores[row]`` + their log-probabilities as float64
    (rows, k), -1 and -inf past the tokens kept. ``state`` (rows, 5) int32 describes each row's tokens
    (:func:`row_state`), ``scores`` (rows,) float64 the rows' cumulative log-probabilities. The host reads
    back 2 x rows x k values per step instead of the rows' logits. ``out_idx`` / ``out_val`` receive the
    results when given (nothing allocated: a captured step)."""
    rows, vocab = _check(logits, {"state": (state, (-1, len(STATE_FIELDS)), int32), "scores": (scores, (-1,), float64),
                                  "suppress": (suppress, (-2,), uint8), "blank": (blank, (-2,), uint8),
                                  "params": (params, (5,), int32)}, "beam_rules_topk")  # fmt: skip
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= vocab:
        raise ShapeError(f"beam_rules_topk: k must be an int in [1, {vocab}], got {k!r}")
    from pygpukit.core.array import empty

    for name, given, dtype in (("out_idx", out_idx, int32), ("out_val", out_val, float64)):
        if given is not None and (not isinstance(given, GPUArray) or given.shape != (rows, int(k))
                                  or given.dtype != dtype or not given.is_contiguous):  # fmt: skip
            raise ShapeError(f"beam_rules_topk: {name} must be a contiguous {dtype.name} ({rows}, {k}) GPUArray")
    out_idx = empty((rows, int(k)), int32) if out_idx is None else out_idx
    out_val = empty((rows, int(k)), float64) if out_val is None else out_val
    if _is_cuda():
        _beam_kernel(_SUFFIX[logits.dtype.name])(
            logits.device_ptr, logits._strides[0], suppress.device_ptr, blank.device_ptr, state.device_ptr,
            scores.device_ptr, params.device_ptr, vocab, int(k), out_idx.device_ptr, out_val.device_ptr,
            grid=rows, block=_BLOCK,
        )  # fmt: skip
        return out_idx, out_val
    x, st, sc = logits._host_view(), state._host_view(), scores._host_view()
    tsb = int(params._host_view()[2])
    idx, val = out_idx._host_view(), out_val._host_view()
    for row in range(rows):
        values, check = _filtered(x[row], st[row], suppress, blank, params)
        forced, m, log_total = _normalizer(values, tsb, check)
        if forced:
            values = np.concatenate([np.full(tsb, -np.inf), values[tsb:]])
        kept = np.flatnonzero(values > -np.inf)
        order = kept[np.lexsort((kept, -values[kept]))][:k]
        idx[row] = -1
        val[row] = -np.inf
        idx[row, : order.shape[0]] = order
        val[row, : order.shape[0]] = float(sc[row]) + (values[order] - m - log_total)
    return out_idx, out_val


def _normalizer(values: np.ndarray[Any, Any], tsb: int, check: bool) -> tuple[bool, float, float]:
    """The kernels' ``normalizer`` for one filtered row (float64): whether the timestamps are forced, and m
    and log_total with log-probability v - m - log_total for a kept entry of value v."""
    text, stamps = values[:tsb], values[tsb:]
    mt, ms = float(text.max(initial=-np.inf)), float(stamps.max(initial=-np.inf))
    text_ok, ts_ok = mt > -np.inf, ms > -np.inf
    sts = float(np.exp(stamps[stamps > -np.inf] - ms).sum()) if ts_ok else 0.0
    stx = float(np.exp(text[text > -np.inf] - mt).sum()) if text_ok else 0.0
    if check and ts_ok and ms + np.log(sts) > mt:
        return True, ms, float(np.log(sts))
    if not (text_ok or ts_ok):
        return False, 0.0, float(np.inf)
    m = mt if text_ok and (not ts_ok or mt >= ms) else ms
    total = (stx * np.exp(mt - m) if text_ok else 0.0) + (sts * np.exp(ms - m) if ts_ok else 0.0)
    return False, m, float(np.log(total))


def _choose(values: np.ndarray[Any, Any], tsb: int, check: bool, eot: int) -> tuple[int, float]:
    """The kernel's greedy decision for one filtered row (float64): the token and its log-probability."""
    forced, m, log_total = _normalizer(values, tsb, check)
    text, stamps = values[:tsb], values[tsb:]
    if forced:
        return tsb + int(np.argmax(stamps)), -log_total
    if not log_total < np.inf:
        return eot, -np.inf
    pick_text = text.size > 0 and float(text.max(initial=-np.inf)) == m
    token = int(np.argmax(text)) if pick_text else tsb + int(np.argmax(stamps))
    return token, -log_total


_MASK64 = (1 << 64) - 1


def _gumbel(seed: int, row: int, step: int, index: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The kernels' Gumbel variates of (seed, row, step, index) (splitmix64 of the counter, 24-bit uniform)."""
    counter = np.uint64((step << 36) | (row << 20)) | index.astype(np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + (counter + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    u = ((z >> np.uint64(40)).astype(np.float32) + np.float32(0.5)) * np.float32(2.0**-24)
    result: np.ndarray[Any, Any] = -np.log(-np.log(u))
    return result


def _sample(values: np.ndarray[Any, Any], tsb: int, check: bool, eot: int, inv_temp: np.float32, seed: int, row: int,
            step: int) -> tuple[int, float]:  # fmt: skip
    """The kernel's sampled decision for one filtered row: the first maximum of v / T + Gumbel over the
    eligible entries, and its log-probability at temperature 1."""
    forced, m, log_total = _normalizer(values, tsb, check)
    eligible = np.flatnonzero(values > -np.inf)
    if forced:
        eligible = eligible[eligible >= tsb]
    if eligible.size == 0:
        return eot, -np.inf
    v = values[eligible].astype(np.float32)
    keys = v * inv_temp + _gumbel(seed, row, step, eligible)
    pick = int(np.argmax(keys))
    return int(eligible[pick]), float(v[pick]) - m - log_total
