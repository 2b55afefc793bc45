"""Sampling token ids from logits: greedy, temperature, top-k, top-p, min-p and the repetition penalty,
seeded and reproducible, on the device without sorting and without host synchronisation.

Logits are ``(batch, vocab)`` float32, float16 or bfloat16 (the vocabulary axis contiguous, rows at
any stride, vocab up to 2**19); the chosen ids are written as int32 into ``out`` of shape ``(batch,)``.
The filters run in Hugging Face's order: repetition penalty, temperature, top-k, top-p, min-p.

Per row, in float32: ``v = x``; a token present in the row's history gets ``v * r`` if ``v < 0`` else
``v / r`` (HF's rule, once per distinct id; ids outside ``[0, vocab)``, such as -1 padding, are
ignored); ``v = v / temperature`` (a row with temperature 0 is greedy: it takes the first index of the
largest penalised logit, and the other filters do not apply to it). The weight of a token is
``q = trunc(exp(v - max v) * 2**44)``, an integer, so every sum below is exact and independent of the
order of summation; the probabilities are ``q / sum(q)``.

- top-k keeps every token whose value is at least the k-th largest (ties with it are all kept, HF's
  rule). ``k`` 0, None or >= vocab: off.
- top-p keeps, of the top-k set, the tokens in decreasing order of value, whole groups of equal values
  at a time, until their weight reaches ``ceil(top_p * total)``: a token is kept when the weight of
  the tokens strictly larger than it is below ``top_p`` of the total (HF's rule); every token tying
  with the last one taken is kept too. ``top_p`` 1 or None: off.
- min-p keeps the tokens with ``exp(v - max v) >= min_p`` (probability at least ``min_p`` times the
  largest one). 0 or None: off.

The draw: ``r = floor(u * total)`` with 64 random bits ``u`` from Philox4x32-10 keyed by the seed with
counter (step, row), and the token is the first index whose inclusive prefix sum of kept weights (in
index order) exceeds ``r``: exactly the renormalised filtered distribution (to the 2**-44 resolution of
the weights). A row whose kept weight is zero (all logits -inf, or NaN / +inf among them) gets its
greedy token.

On the GPU no pass sorts: each filter is a radix select over the order-preserving uint32 keys of ``v``
(three digits of 11, 11 and 10 bits; counts for top-k, weights for top-p), each row spread over many
blocks that meet through atomics on a workspace. The CPU backend computes the same quantities with
NumPy and draws with the same Philox stream, so its tokens normally agree with the GPU's, but float
rounding of ``exp`` may differ in the last place: only reproducibility per backend is promised.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from pygpukit.core.abi import KernelStruct
from pygpukit.core.array import GPUArray, allocate, empty, from_numpy
from pygpukit.core.codes import enum_values
from pygpukit.core.dtypes import DType, as_dtype, bfloat16, float16, float32, int32
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.core.jit import JITKernel
from pygpukit.core.plans import PlanCache
from pygpukit.core.stream import thread_device

from . import _cpu
from ._kernels import (
    NAMESPACE,
    Groups,
    grid_for,
    group,
    launch,
    pointer,
    register_enumerator,
    size_param,
    sm_count,
)
from ._layout import check_devices, is_cuda

__all__ = ["Sampler", "filtered_probs", "greedy", "sample"]

_FILE = "sampling/sampling.cu"
_DTYPES = (float32, float16, bfloat16)
_THREADS = 256
_BINS = 2048
_MAX_CHUNKS = 256
_HEADER = 8
_ROW_WORDS = 8 + _BINS + _MAX_CHUNKS
_MAX_VOCAB = 2**19
_MAX_BATCH = 65535
_CHUNK_LIMIT = 8192  # elements of a chunk at most (the last block scans one chunk in order)
_CHUNK_LEAST = 512
_SCALE = np.float32(2.0**44)
_F32_MAX = float(np.finfo(np.float32).max)
_MASK32 = 0xFFFFFFFF

# Passes and flags of sample_pass (common/codes.cuh).
_PASSES = enum_values("SamplePass")
_STATS, _TOPK1, _TOPK2 = _PASSES["kSampleStats"], _PASSES["kSampleTopK1"], _PASSES["kSampleTopK2"]
_TOPP0, _TOPP1, _TOPP2 = _PASSES["kSampleTopP0"], _PASSES["kSampleTopP1"], _PASSES["kSampleTopP2"]
_DRAW, _PROBS = _PASSES["kSampleDraw"], _PASSES["kSampleProbs"]
_FLAGS = enum_values("SampleFlag")
_FINAL, _ADVANCE = _FLAGS["kSampleFinal"], _FLAGS["kSampleAdvance"]
_PENALTY, _TOKEN = _FLAGS["kSamplePenalty"], _FLAGS["kSampleToken"]

# The argument of sample_pass and sample_mark (sampling.cu), declared once.
_ARGS = KernelStruct(f"{NAMESPACE}SampleArgs", _FILE, [
    ("temperature", "const float*"), ("top_k", "const int*"), ("top_p", "const float*"), ("min_p", "const float*"),
    ("penalty", "const float*"), ("history", "const int*"), ("out", "int*"), ("probs", "float*"),
    ("state", "unsigned long long*"), ("bitmap", "unsigned int*"),
    ("row_stride", "long long"), ("vocab", "long long"), ("chunk", "long long"), ("history_len", "long long"),
    ("history_stride", "long long"), ("bitmap_words", "long long"),
    ("temperature_value", "float"), ("top_p_value", "float"), ("min_p_value", "float"), ("penalty_value", "float"),
    ("top_k_value", "int"), ("pass", "int"), ("flags", "int"), ("rows", "int"),
])  # fmt: skip
# Every field is a scalar, so a field's index is its place among pack_flat's values.
_PASS_AT = [name for name, _, _ in _ARGS.fields].index("pass")
_FLAGS_AT = [name for name, _, _ in _ARGS.fields].index("flags")
_PASS_PARAMS = [pointer("logits"), _ARGS.param("args")]
_MARK_PARAMS = [_ARGS.param("args")]
_PLANS: PlanCache[tuple[JITKernel, JITKernel, int, int]] = PlanCache("ops.sampling")
_ARGMAX_PARAMS = [pointer("logits"), pointer("out"), size_param("row_stride"), size_param("vocab")]
# greedy() calls already checked once, by the logits' layout and device: (kernel, result shape, row stride, vocab).
_GREEDY: PlanCache[tuple[Any, ...]] = PlanCache("ops.sampling.greedy")


def _expressions(dtype: DType) -> tuple[str, str, str]:
    return (f"{NAMESPACE}sample_pass<{dtype.ctype}>", f"{NAMESPACE}sample_argmax_rows<{dtype.ctype}>",
            f"{NAMESPACE}sample_mark")  # fmt: skip


# -- Philox4x32-10 (the kernel's generator, for the CPU backend and tests) --------------------------
def _philox4x32_10(counter: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, int, int, int]:
    """One block of Philox4x32-10 (Salmon et al., SC11; Random123's known answers hold)."""
    c0, c1, c2, c3 = (c & _MASK32 for c in counter)
    k0, k1 = (k & _MASK32 for k in key)
    for round_ in range(10):
        if round_:
            k0 = (k0 + 0x9E3779B9) & _MASK32
            k1 = (k1 + 0xBB67AE85) & _MASK32
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & _MASK32, p1 & _MASK32, ((p0 >> 32) ^ c3 ^ k1) & _MASK32, p0 & _MASK32
    return c0, c1, c2, c3


def _random64(seed: int, step: int, row: int) -> int:
    """The 64 random bits of (seed, row, step), as the kernel forms them."""
    block = _philox4x32_10((step & _MASK32, (step >> 32) & _MASK32, row, 0), (seed & _MASK32, seed >> 32))
    return (block[1] << 32) | block[0]


# -- arguments -------------------------------------------------------------------------------------
class _Row:
    """One per-row parameter: a scalar, or a device buffer (batch,) of float32 (int32 for top_k)."""

    __slots__ = ("array", "value")

    def __init__(self, value: float | int, array: GPUArray | None = None) -> None:
        self.value = value
        self.array = array

    def pointer(self) -> int:
        return self.array.device_ptr if self.array is not None else 0

    def host(self, batch: int, dtype: Any) -> np.ndarray[Any, Any]:
        if self.array is not None:
            return np.asarray(_cpu.host(self.array))
        return np.full(batch, self.value, dtype=dtype)


def _number(name: str, value: Any, integral: bool) -> float | int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        kind = "an int" if integral else "a number"
        raise DTypeError(f"{name} must be {kind} or a device array, got {type(value).__name__}")
    if integral:
        if not isinstance(value, (int, np.integer)):
            raise DTypeError(f"{name} must be an int or a device int32 array, got {value!r}")
        return int(value)
    return float(value)


def _row_param(name: str, value: Any, batch: int, integral: bool, check: Any, rule: str) -> _Row:
    if isinstance(value, GPUArray):
        want = int32 if integral else float32
        if value.dtype != want:
            raise DTypeError(f"{name}: a per-row array must be {want.name}, got {value.dtype}")
        if value.shape != (batch,):
            raise ShapeError(f"{name}: a per-row array must have shape ({batch},), got {value.shape}")
        if batch > 1 and value.strides[0] != value.itemsize:
            raise ShapeError(f"{name}: a per-row array must be contiguous")
        check_devices(name, [value])
        return _Row(0, value)
    number = _number(name, value, integral)
    if not check(number):
        raise ArgumentError(f"{name} must be {rule}, got {value!r}")
    return _Row(number)


class _Settings:
    __slots__ = ("history", "min_p", "penalised", "penalty", "temperature", "top_k", "top_p")

    def __init__(
        self, batch: int, vocab: int, temperature: Any, top_k: Any, top_p: Any, min_p: Any, penalty: Any, history: Any
    ) -> None:
        self.temperature = _row_param("temperature", temperature, batch, False,
                                      lambda t: 0 <= t <= _F32_MAX, "a finite number >= 0")  # fmt: skip
        self.top_k = _row_param("top_k", 0 if top_k is None else top_k, batch, True, lambda k: k >= 0,
                                "an int >= 0 (0 or None: off)")  # fmt: skip
        self.top_p = _row_param("top_p", 1.0 if top_p is None else top_p, batch, False, lambda p: 0 < p <= 1,
                                "in (0, 1] (1 or None: off)")  # fmt: skip
        self.min_p = _row_param("min_p", 0.0 if min_p is None else min_p, batch, False, lambda p: 0 <= p <= 1,
                                "in [0, 1] (0 or None: off)")  # fmt: skip
        self.penalty = _row_param("repetition_penalty", 1.0 if penalty is None else penalty, batch, False,
                                  lambda r: 0 < r <= _F32_MAX, "finite and > 0 (1 or None: off)")  # fmt: skip
        if history is not None:
            if not isinstance(history, GPUArray):
                raise DTypeError(f"history must be a device int32 array (batch, n), got {type(history).__name__}")
            if history.dtype != int32:
                raise DTypeError(f"history must be int32, got {history.dtype}")
            if history.ndim != 2 or history.shape[0] != batch:
                raise ShapeError(f"history must have shape ({batch}, n), got {history.shape}")
            if history.shape[1] > 1 and history.strides[1] != history.itemsize:
                raise ShapeError("history rows must be contiguous (stride 1 along n)")
            check_devices("history", [history])
        uses_penalty = self.penalty.array is not None or self.penalty.value != 1.0
        if uses_penalty and history is None:
            raise ArgumentError("repetition_penalty needs history (the token ids generated so far, -1 padded)")
        self.history: GPUArray | None = history
        self.penalised = uses_penalty and history is not None and history.shape[1] > 0

    @property
    def all_greedy(self) -> bool:
        return self.temperature.array is None and self.temperature.value == 0

    def passes(self, vocab: int, probs: bool) -> list[int]:
        """The passes a call launches (rows that need fewer skip the others on the device)."""
        if self.all_greedy:
            return [_STATS, _PROBS] if probs else [_STATS]
        result = [_STATS]
        if self.top_k.array is not None or 0 < int(self.top_k.value) < vocab:
            result += [_TOPK1, _TOPK2]
        if self.top_p.array is not None or self.top_p.value < 1:
            result += [_TOPP0, _TOPP1, _TOPP2]
        result.append(_DRAW)
        if probs:
            result.append(_PROBS)
        return result


def _check_logits(name: str, logits: Any) -> GPUArray:
    if not isinstance(logits, GPUArray):
        raise DTypeError(f"{name}: logits must be a GPUArray, got {type(logits).__name__}")
    if logits.dtype not in _DTYPES:
        raise DTypeError(f"{name}: logits must be float32, float16 or bfloat16, got {logits.dtype}")
    if logits.ndim != 2:
        raise ShapeError(f"{name}: logits must have shape (batch, vocab), got {logits.shape}")
    vocab = logits.shape[1]
    if not 1 <= vocab <= _MAX_VOCAB:
        raise ShapeError(f"{name}: the vocabulary must have 1 to {_MAX_VOCAB} entries, got {vocab}")
    if vocab > 1 and logits.strides[1] != logits.itemsize:
        raise ShapeError(f"{name}: the vocabulary axis of logits must be contiguous (strides {logits.strides})")
    check_devices(name, [logits])
    return logits


def _row_stride(logits: GPUArray) -> int:
    """The distance between rows of logits in elements (0 for a single row; any sign)."""
    return logits.strides[0] // logits.itemsize if logits.shape[0] > 1 else 0


def _check_out(name: str, out: Any, shape: tuple[int, ...], dtype: DType) -> GPUArray:
    if not isinstance(out, GPUArray):
        raise DTypeError(f"{name}: out must be a GPUArray, got {type(out).__name__}")
    if out.dtype != dtype:
        raise DTypeError(f"{name}: out must be {dtype.name}, got {out.dtype}")
    if out.shape != shape:
        raise ShapeError(f"{name}: out must have shape {shape}, got {out.shape}")
    if not out.is_contiguous:
        raise ShapeError(f"{name}: out must be contiguous")
    check_devices(name, [out])
    return out


def _chunking(batch: int, vocab: int) -> tuple[int, int]:
    """(blocks per row, elements per block): about two blocks per SM over the batch, at most 8192 and
    at least 512 elements a block (one block for small rows)."""
    chunks = max(-(-2 * sm_count() // batch), -(-vocab // _CHUNK_LIMIT))
    chunks = max(1, min(chunks, _MAX_CHUNKS, vocab // _CHUNK_LEAST))
    per_block = -(-vocab // chunks)
    chunk = -(-per_block // 64) * 64
    return -(-vocab // chunk), chunk


# -- the CPU backend -------------------------------------------------------------------------------
def _keys(v: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    bits = v.view(np.uint32)
    keys = np.where(bits & np.uint32(0x80000000), ~bits, bits | np.uint32(0x80000000)).astype(np.uint32)
    keys[np.isnan(v)] = _MASK32
    return keys


def _key_value(key: int) -> Any:
    bits = key & 0x7FFFFFFF if key & 0x80000000 else ~key & _MASK32
    return np.float32(struct.unpack("<f", struct.pack("<I", bits))[0])


def _cpu_row(
    x: np.ndarray[Any, Any], t: float, k: int, p: float, mp: float, r: float, ids: np.ndarray[Any, Any] | None
) -> tuple[int, np.ndarray[Any, Any] | None]:
    """(greedy token, kept weights or None for a greedy row) of one row, as the kernels compute them."""
    vocab = x.shape[0]
    v = x.astype(np.float32, copy=True)
    greedy_row = not t > 0
    with np.errstate(all="ignore"):
        if ids is not None and r > 0 and r != 1:
            chosen = np.unique(ids[(ids >= 0) & (ids < vocab)])
            values = v[chosen]
            rf = np.float32(r)
            v[chosen] = np.where(values < 0, values * rf, values / rf)
        if not greedy_row:
            v = v / np.float32(t)
        v = v + np.float32(0)
        keys = _keys(v)
        argmax = int(np.argmax(keys))
        if greedy_row:
            return argmax, None
        d = v - _key_value(int(keys[argmax]))
        e = np.where(d <= 0, np.exp(np.where(d <= 0, d, 0)), np.float32(0)).astype(np.float32)
    q = (e * _SCALE).astype(np.uint64)
    low = 0
    if 0 < k < vocab:
        low = int(np.partition(keys, vocab - k)[vocab - k])
    threshold = low
    if p < 1:
        mask = keys >= low
        order = np.argsort(keys[mask], kind="stable")[::-1]
        sorted_keys = keys[mask][order]
        sorted_q = q[mask][order]
        starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
        cumulative = np.cumsum(np.add.reduceat(sorted_q, starts), dtype=np.uint64)
        total = int(cumulative[-1])
        target = math.ceil(float(np.float32(p)) * float(total))
        need = max(1, total if target >= float(total) else target)
        at = int(np.searchsorted(cumulative, np.uint64(need), side="left"))
        threshold = int(sorted_keys[starts[at]]) if at < len(starts) else _MASK32
    kept = keys >= threshold
    if mp > 0:
        kept &= e >= np.float32(mp)
    return argmax, np.where(kept, q, np.uint64(0))


# -- the sampler -----------------------------------------------------------------------------------
class Sampler:
    """Draws token ids from logits (max_batch, vocab) of ``dtype``; owns the device state (seed, step)
    and the workspace, so :meth:`sample` with ``out`` given allocates nothing, never synchronises and
    can be captured in a CUDA graph: every call, and every replay, advances the step by one, so each
    draws new numbers. The same seed from the same state gives the same tokens."""

    def __init__(self, seed: int, max_batch: int, vocab: int, dtype: Any = float32) -> None:
        seed = self._check_seed(seed)
        if not isinstance(max_batch, (int, np.integer)) or not 1 <= max_batch <= _MAX_BATCH:
            raise ArgumentError(f"max_batch must be an int in [1, {_MAX_BATCH}], got {max_batch!r}")
        if not isinstance(vocab, (int, np.integer)) or not 1 <= vocab <= _MAX_VOCAB:
            raise ArgumentError(f"vocab must be an int in [1, {_MAX_VOCAB}], got {vocab!r}")
        dt = as_dtype(dtype)
        if dt not in _DTYPES:
            raise DTypeError(f"Sampler: dtype must be float32, float16 or bfloat16, got {dt}")
        self.max_batch = int(max_batch)
        self.vocab = int(vocab)
        self.dtype = dt
        self._bitmap_words = -(-self.vocab // 32)
        # Synchronous copies: the workspace is ready for work on any stream once the constructor returns.
        state = np.zeros(_HEADER + self.max_batch * _ROW_WORDS, np.uint64)
        state[0] = seed
        self._state = from_numpy(state)
        self._bitmap = from_numpy(np.zeros(self.max_batch * self._bitmap_words, np.uint32))
        self._seed = seed

    @staticmethod
    def _check_seed(seed: Any) -> int:
        if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
            raise DTypeError(f"seed must be an int, got {type(seed).__name__}")
        if not 0 <= int(seed) < 2**64:
            raise ArgumentError(f"seed must be in [0, 2**64), got {seed}")
        return int(seed)

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def step(self) -> int:
        """The device step counter (reads the device: synchronises)."""
        return int(self._state[1:2].to_numpy()[0])

    def reset(self, seed: int | None = None, step: int = 0) -> None:
        """Set the seed (default: keep it) and the step (default 0), as a copy queued on the current
        stream (ordered with the sampling queued there): call it outside graph captures."""
        seed = self._seed if seed is None else self._check_seed(seed)
        if not isinstance(step, (int, np.integer)) or isinstance(step, bool) or not 0 <= int(step) < 2**64:
            raise ArgumentError(f"step must be an int in [0, 2**64), got {step!r}")
        self._seed = seed
        self._state[0:_HEADER].copy_(np.array([seed, int(step)] + [0] * (_HEADER - 2), dtype=np.uint64))

    def _prepare(self, name: str, logits: Any) -> tuple[GPUArray, int]:
        logits = _check_logits(name, logits)
        batch, vocab = logits.shape
        if vocab != self.vocab:
            raise ShapeError(f"{name}: this sampler has vocab {self.vocab}, logits have shape {logits.shape}")
        if logits.dtype != self.dtype:
            raise DTypeError(f"{name}: this sampler takes {self.dtype.name} logits, got {logits.dtype}")
        if batch > self.max_batch:
            raise ShapeError(f"{name}: batch {batch} exceeds this sampler's max_batch {self.max_batch}")
        check_devices(name, [logits, self._state])
        return logits, batch

    def sample(
        self,
        logits: GPUArray,
        out: GPUArray | None = None,
        temperature: Any = 1.0,
        top_k: Any = None,
        top_p: Any = None,
        min_p: Any = None,
        repetition_penalty: Any = None,
        history: GPUArray | None = None,
    ) -> GPUArray:
        """Token ids (batch,) int32 drawn from ``logits`` (batch, vocab); each parameter a number, or a
        device array (batch,) (float32; int32 for top_k) for per-row settings. Advances the step."""
        logits, batch = self._prepare("Sampler.sample", logits)
        settings = _Settings(batch, self.vocab, temperature, top_k, top_p, min_p, repetition_penalty, history)
        out = empty(batch, int32) if out is None else _check_out("Sampler.sample", out, (batch,), int32)
        if batch:
            self._run(logits, settings, out, None)
        return out

    def filtered_probs(
        self,
        logits: GPUArray,
        out: GPUArray | None = None,
        temperature: Any = 1.0,
        top_k: Any = None,
        top_p: Any = None,
        min_p: Any = None,
        repetition_penalty: Any = None,
        history: GPUArray | None = None,
    ) -> GPUArray:
        """The renormalised distribution :meth:`sample` draws from, float32 (batch, vocab): zero where
        filtered out (a one-hot row for greedy rows). For inspection and tests; leaves the step alone."""
        logits, batch = self._prepare("Sampler.filtered_probs", logits)
        settings = _Settings(batch, self.vocab, temperature, top_k, top_p, min_p, repetition_penalty, history)
        shape = (batch, self.vocab)
        out = empty(shape, float32) if out is None else _check_out("Sampler.filtered_probs", out, shape, float32)
        if batch:
            self._run(logits, settings, None, out)
        return out

    # -- execution ---------------------------------------------------------------------------------
    def _run(self, logits: GPUArray, s: _Settings, out: GPUArray | None, probs: GPUArray | None) -> None:
        if not is_cuda():
            self._run_cpu(logits, s, out, probs)
            return
        batch, vocab = logits.shape
        key = (self.dtype, batch, vocab, thread_device())
        plan = _PLANS.get(key)
        if plan is None:
            pass_expr, _, mark_expr = _expressions(self.dtype)
            kernels = group(_FILE, _expressions(self.dtype))
            plan = _PLANS.put(key, (kernels.kernel(pass_expr, _PASS_PARAMS), kernels.kernel(mark_expr, _MARK_PARAMS),
                                    *_chunking(batch, vocab)))  # fmt: skip
        launch, mark, chunks, chunk = plan
        history = s.history
        base = _PENALTY if s.penalised else 0
        token = out is not None

        values = [
            s.temperature.pointer(), s.top_k.pointer(), s.top_p.pointer(), s.min_p.pointer(), s.penalty.pointer(),
            history.device_ptr if history is not None else 0, out.device_ptr if out is not None else 0,
            probs.device_ptr if probs is not None else 0, self._state.device_ptr, self._bitmap.device_ptr,
            _row_stride(logits), vocab, chunk, history.shape[1] if history is not None else 0,
            history.strides[0] // history.itemsize if history is not None else 0, self._bitmap_words,
            float(s.temperature.value), float(s.top_p.value), float(s.min_p.value), float(s.penalty.value),
            min(int(s.top_k.value), vocab), _STATS, base, batch,
        ]  # fmt: skip
        if s.penalised:
            assert history is not None
            mark(_ARGS.pack_flat(*values), grid=grid_for(batch * history.shape[1]), block=_THREADS)
        passes = s.passes(vocab, probs is not None)
        for index, pass_ in enumerate(passes):
            flags = base | (_TOKEN if token else 0)
            if index == len(passes) - 1:
                flags |= _FINAL | (_ADVANCE if token else 0)
            values[_PASS_AT] = pass_
            values[_FLAGS_AT] = flags
            # The raw address: rows may lie at any stride (SampleArgs::row_stride), no copy.
            launch(logits.device_ptr, _ARGS.pack_flat(*values), grid=(chunks, batch), block=_THREADS)

    def _run_cpu(self, logits: GPUArray, s: _Settings, out: GPUArray | None, probs: GPUArray | None) -> None:
        batch, vocab = logits.shape
        x = np.asarray(_cpu.host(logits)).astype(np.float32)
        temperature = s.temperature.host(batch, np.float32)
        top_k = s.top_k.host(batch, np.int64)
        top_p = s.top_p.host(batch, np.float32)
        min_p = s.min_p.host(batch, np.float32)
        penalty = s.penalty.host(batch, np.float32)
        history = np.asarray(_cpu.host(s.history)) if s.penalised and s.history is not None else None
        state = _cpu.host(self._state)
        seed, step = int(state[0]), int(state[1])
        tokens = np.empty(batch, np.int32)
        result = np.zeros((batch, vocab), np.float32) if probs is not None else None
        for row in range(batch):
            argmax, weights = _cpu_row(x[row], float(temperature[row]), int(top_k[row]), float(top_p[row]),
                                       float(min_p[row]), float(penalty[row]),
                                       history[row] if history is not None else None)  # fmt: skip
            total = int(weights.sum(dtype=np.uint64)) if weights is not None else 0
            if result is not None:
                if weights is None or total == 0:
                    result[row, argmax] = 1.0
                else:
                    result[row] = (weights.astype(np.float64) / float(total)).astype(np.float32)
                continue
            if weights is None or total == 0:
                tokens[row] = argmax
                continue
            r = (_random64(seed, step, row) * total) >> 64
            cumulative = np.cumsum(weights, dtype=np.uint64)
            tokens[row] = int(np.searchsorted(cumulative, np.uint64(r), side="right"))
        if result is not None and probs is not None:
            _cpu.store(probs, result)
        if out is not None:
            _cpu.store(out, tokens)
            state[1] = np.uint64((step + 1) % 2**64)


# -- functional forms ------------------------------------------------------------------------------
def greedy(logits: GPUArray, out: GPUArray | None = None) -> GPUArray:
    """int32 (batch,) index of the largest logit of each row (the first on ties; NaN counts as the
    largest, as in NumPy's argmax). No workspace: one block of 1024 threads per row on the GPU."""
    key: tuple[Any, ...] | None = None
    if out is None and type(logits) is GPUArray:
        # A repeated call (same layout and device) is one lookup, an allocation and the launch.
        key = (logits._dtype, logits._shape, logits._strides, logits._buffer.device, thread_device())
        known = _GREEDY.get(key)
        if known is not None:
            result = allocate(known[1], int32)
            launch(known[0], (logits.device_ptr, result, *known[2:]), known[1][0], 1024)
            return result
    logits = _check_logits("greedy", logits)
    batch, vocab = logits.shape
    out = empty(batch, int32) if out is None else _check_out("greedy", out, (batch,), int32)
    if batch == 0:
        return out
    if not is_cuda():
        keys = _keys(np.asarray(_cpu.host(logits)).astype(np.float32) + np.float32(0))
        _cpu.store(out, np.argmax(keys, axis=1).astype(np.int32))
        return out
    _, argmax_expr, _ = _expressions(logits.dtype)
    kernel = group(_FILE, _expressions(logits.dtype)).kernel(argmax_expr, _ARGMAX_PARAMS)
    # The raw address and the row stride in elements: rows may lie at any stride, no copy.
    row_stride = _row_stride(logits)
    launch(kernel, (logits.device_ptr, out, row_stride, vocab), batch, 1024)
    if key is not None:
        _GREEDY.put(key, (kernel, (batch,), row_stride, vocab))
    return out


def sample(
    logits: GPUArray,
    out: GPUArray | None = None,
    *,
    temperature: Any = 1.0,
    top_k: Any = None,
    top_p: Any = None,
    min_p: Any = None,
    repetition_penalty: Any = None,
    history: GPUArray | None = None,
    seed: int = 0,
    step: int = 0,
) -> GPUArray:
    """Token ids drawn as ``Sampler(seed, batch, vocab, logits.dtype)`` at ``step`` would draw them (a
    fresh workspace per call; use a :class:`Sampler` in a decode loop or a graph)."""
    logits = _check_logits("sample", logits)
    batch, vocab = logits.shape
    sampler = Sampler(seed, max(1, batch), vocab, logits.dtype)
    if step:
        sampler.reset(seed, step)
    return sampler.sample(logits, out, temperature, top_k, top_p, min_p, repetition_penalty, history)


def filtered_probs(
    logits: GPUArray,
    out: GPUArray | None = None,
    *,
    temperature: Any = 1.0,
    top_k: Any = None,
    top_p: Any = None,
    min_p: Any = None,
    repetition_penalty: Any = None,
    history: GPUArray | None = None,
) -> GPUArray:
    """float32 (batch, vocab): the renormalised distribution :func:`sample` draws from with these
    settings (zero outside the kept set; one-hot for temperature 0). For inspection and tests."""
    logits = _check_logits("filtered_probs", logits)
    batch, vocab = logits.shape
    sampler = Sampler(0, max(1, batch), vocab, logits.dtype)
    return sampler.filtered_probs(logits, out, temperature, top_k, top_p, min_p, repetition_penalty, history)


def _enumerate() -> Groups:
    return {_FILE: [_expressions(d) for d in _DTYPES]}


register_enumerator(_enumerate)
