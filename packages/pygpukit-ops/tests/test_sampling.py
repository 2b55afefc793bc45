"""Sampling (pygpukit.ops.sampling): greedy against NumPy's argmax, the filtered distributions against a
float64 NumPy reference, draws against their distribution with a chi-square test, seeds, graph replay
and bad input. The tests without the ``gpu`` marker run on whichever backend is active (the NumPy CPU
backend where there is no GPU); the ``gpu`` ones need the CUDA backend.

Exactness: the kept sets of top-p and min-p depend on comparisons of sums of probabilities. The
device works with integer weights (exp(v - max) * 2**44, truncated) and float32 ``expf``, so a sum can
differ from the float64 reference by about 1e-7 of the total. The tests therefore place top_p and
min_p halfway between two neighbouring values where the reference's decision changes (see
``_snap_top_p`` and ``_snap_min_p``): there the kept set is unambiguous and must be equal exactly.

Chi-square: with ``df`` degrees of freedom the critical value at p = 1e-4 is taken from the
Wilson-Hilferty approximation ``df * (1 - 2/(9 df) + z * sqrt(2/(9 df)))**3`` with z = 3.719016 (the
standard normal's upper 1e-4 quantile); for df >= 3 it lies 0.5% to 3.5% above the exact quantile
(checked against tabulated values below), so a true distribution fails with probability below 1e-4
(scipy is not a dependency).
"""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import pygpukit as gp
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.ops import sampling

Array = np.ndarray[Any, Any]
DTYPES = ["float32", "float16", "bfloat16"]
_NUMPY = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
QWEN_VOCAB = 152064
LLAMA_VOCAB = 128256
Z_1E4 = 3.719016485455709


def _logits(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, scale: float = 2.0) -> Array:
    """Fresh logits in the dtype (as its NumPy type)."""
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(_NUMPY[dtype])


def _device(host: Array) -> gp.GPUArray:
    return gp.from_numpy(host)


# -- float64 reference -----------------------------------------------------------------------------
def _values(x: Array, temperature: float, penalty: float, history: Array | None) -> Array:
    """The transformed logits in float32, as the op defines them (penalty, then temperature)."""
    v = x.astype(np.float32).copy()
    if history is not None and penalty != 1.0:
        ids = np.unique(history[(history >= 0) & (history < v.shape[0])])
        chosen = v[ids]
        r = np.float32(penalty)
        v[ids] = np.where(chosen < 0, chosen * r, chosen / r)
    if temperature > 0:
        v = v / np.float32(temperature)
    return v


def _mass_above(v: Array, probs: Array) -> Array:
    """For each token, the probability of the tokens with strictly larger values."""
    unique, inverse = np.unique(v, return_inverse=True)  # ascending
    group = np.bincount(inverse, weights=probs, minlength=unique.size)
    above = np.cumsum(group[::-1])[::-1] - group  # mass of the larger groups
    result: Array = above[inverse]
    return result


def reference(
    x: Array,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    penalty: float = 1.0,
    history: Array | None = None,
) -> Array:
    """float64 filtered, renormalised distribution of one row (HF's order and tie rules)."""
    v = _values(x, temperature, penalty, history)
    out = np.zeros(v.shape[0])
    if temperature == 0:
        out[int(np.argmax(v))] = 1.0
        return out
    z = v.astype(np.float64)
    e = np.exp(z - z.max())
    # The op's weights are trunc(exp(v - max v) * 2**44) (docs/sampling.md): a token more than about 30.5
    # below the largest logit has weight 0 and is never kept (exp in float32, as the op computes it).
    e = np.where(np.exp((v - v.max()).astype(np.float32)) * np.float32(2.0**44) >= 1, e, 0.0)
    keep = np.ones(v.shape[0], bool)
    if top_k:
        keep &= v >= np.sort(v)[-top_k] if top_k < v.shape[0] else True
    if top_p is not None and top_p < 1:
        probs = np.where(keep, e, 0.0)
        probs /= probs.sum()
        keep &= _mass_above(v, probs) < np.float64(np.float32(top_p))
    if min_p:
        keep &= e >= np.float64(np.float32(min_p))
    out = np.where(keep, e, 0.0)
    result: Array = out / out.sum()
    return result


def _snap_top_p(x: Array, nominal: float, temperature: float = 1.0, top_k: int | None = None) -> float:
    """A top_p near ``nominal`` halfway between two neighbouring cumulative masses of the reference."""
    v = _values(x, temperature, 1.0, None)
    z = v.astype(np.float64)
    e = np.exp(z - z.max())
    if top_k and top_k < v.shape[0]:
        e = np.where(v >= np.sort(v)[-top_k], e, 0.0)
    probs = e / e.sum()
    levels = np.unique(_mass_above(v, probs)[probs > 0])  # where the decision changes
    upper = int(np.searchsorted(levels, nominal))
    upper = min(max(upper, 1), levels.size - 1)
    return float((levels[upper - 1] + levels[upper]) / 2)


def _snap_min_p(x: Array, nominal: float, temperature: float = 1.0) -> float:
    v = _values(x, temperature, 1.0, None)
    z = v.astype(np.float64)
    levels = np.unique(np.exp(z - z.max()))
    upper = min(max(int(np.searchsorted(levels, nominal)), 1), levels.size - 1)
    return float(math.sqrt(levels[upper - 1] * levels[upper]))


def _check_probs(got: Array, expected: Array, what: str) -> None:
    assert got.dtype == np.float32
    kept, want = got > 0, expected > 0
    differ = np.flatnonzero(kept != want)
    assert differ.size == 0, f"{what}: kept sets differ at {differ[:10]} (got {kept.sum()}, want {want.sum()})"
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=1e-12, err_msg=what)


# -- Philox ----------------------------------------------------------------------------------------
def test_philox_known_answers() -> None:
    # Random123's kat_vectors for philox4x32_10.
    assert sampling._philox4x32_10((0, 0, 0, 0), (0, 0)) == (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)
    full = (0xFFFFFFFF,) * 4
    assert sampling._philox4x32_10(full, (0xFFFFFFFF, 0xFFFFFFFF)) == (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)
    pi = (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344)
    assert sampling._philox4x32_10(pi, (0xA4093822, 0x299F31D0)) == (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)


@pytest.mark.parametrize("vocab", [1, 7, 1000, QWEN_VOCAB])
def test_uniform_logits_follow_the_philox_stream(vocab: int) -> None:
    # Equal logits: every weight is exactly 2**44, so the token is floor(u * vocab) with u the 64 Philox
    # bits of (seed, row, step): checks the generator, its counter layout and the scan on any backend.
    batch, seed = 5, 0x1234_5678_9ABC_DEF0
    x = _device(np.full((batch, vocab), 0.25, np.float32))
    sampler = gp.Sampler(seed, batch, vocab)
    for step in range(3):
        got = sampler.sample(x).to_numpy()
        want = [(sampling._random64(seed, step, row) * vocab) >> 64 for row in range(batch)]
        assert got.tolist() == want, step


# -- greedy ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("batch", "vocab"), [(1, QWEN_VOCAB), (3, LLAMA_VOCAB), (5, 1003), (2, 1)])
def test_greedy_matches_numpy_argmax(dtype: str, batch: int, vocab: int) -> None:
    rng = np.random.default_rng(batch * 7 + vocab)
    host = _logits(rng, (batch, vocab), dtype)
    if vocab > 10:
        host[0, [5, vocab // 2, vocab - 1]] = host[0].max() + 1  # ties: the lowest index wins
        host[-1, 3] = -np.inf
    out = _device(np.full(batch, -7, np.int32))  # poisoned
    got = gp.greedy(_device(host), out=out)
    assert got is out
    np.testing.assert_array_equal(got.to_numpy(), np.argmax(host.astype(np.float32), axis=1).astype(np.int32))
    sampler = gp.Sampler(0, batch, vocab, dtype)
    via_sampler = sampler.sample(_device(host), temperature=0.0).to_numpy()
    np.testing.assert_array_equal(via_sampler, np.argmax(host.astype(np.float32), axis=1))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_greedy_repeated_calls(dtype: str) -> None:
    """A repeated greedy() call of one layout goes through its cached launch (one entry per layout):
    fresh logits at new addresses, strided rows and another layout each still give NumPy's argmax."""
    from pygpukit.core.plans import clear_plan_caches

    rng = np.random.default_rng(17)
    clear_plan_caches()
    for round_ in range(3):
        for shape, rows in (((4, 5003), slice(None)), ((6, 3001), slice(1, None, 2))):
            host = _logits(rng, shape, dtype)
            got = gp.greedy(_device(host)[rows]).to_numpy()
            want = np.argmax(host[rows].astype(np.float32), axis=1).astype(np.int32)
            np.testing.assert_array_equal(got, want, err_msg=f"round {round_}, shape {shape}")
        assert len(sampling._GREEDY) == 2
    with pytest.raises(ShapeError):  # a cached layout does not skip the checks of another one
        gp.greedy(_device(_logits(rng, (4, 5003), dtype)).T)


def test_greedy_special_values() -> None:
    host = np.array([[-np.inf] * 5, [1.0, np.nan, 3.0, np.nan, 3.0], [-0.0, 0.0, -0.0, -1.0, -2.0]], np.float32)
    got = gp.greedy(_device(host)).to_numpy()
    np.testing.assert_array_equal(got, np.argmax(host, axis=1))  # [0, 1 (first NaN), 0 (-0 == +0)]
    sampler = gp.Sampler(3, 3, 5)
    # Rows whose kept weight is zero (all -inf; a NaN) get their greedy token even when sampling.
    tokens = sampler.sample(_device(host[:2])).to_numpy()
    assert tokens.tolist() == [0, 1]


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_rows_every_entry_point(dtype: str) -> None:
    """Rows at any stride (unit stride along the vocabulary) go to the kernels as they are: every entry
    point gives what it gives for a contiguous copy of the rows, bitwise."""
    rng = np.random.default_rng(5)
    vocab = 1001
    host = _logits(rng, (3, 4, vocab), dtype)
    views = {
        "row stride 4 * vocab (rows not 16-byte aligned)": (_device(host)[:, 2, :], host[:, 2, :]),
        "negative row stride": (_device(host)[::-1, 1, 3:], host[::-1, 1, 3:]),
        "every other row, offset": (_device(host.reshape(12, vocab))[1::2, 7:], host.reshape(12, vocab)[1::2, 7:]),
    }
    for what, (view, rows) in views.items():
        assert not view.is_contiguous, what
        n, width = rows.shape
        dense = _device(np.ascontiguousarray(rows))
        want = np.argmax(rows.astype(np.float32), axis=1).astype(np.int32)
        out = _device(np.full(n, -7, np.int32))
        assert gp.greedy(view, out=out) is out
        np.testing.assert_array_equal(out.to_numpy(), want, err_msg=what)
        settings: dict[str, Any] = {"temperature": 0.8, "top_k": 40, "top_p": 0.9}
        drawn = gp.sample(view, seed=9, step=2, **settings).to_numpy()
        np.testing.assert_array_equal(drawn, gp.sample(dense, seed=9, step=2, **settings).to_numpy(), err_msg=what)
        strided, contiguous = gp.Sampler(4, n, width, dtype), gp.Sampler(4, n, width, dtype)
        for _ in range(2):
            np.testing.assert_array_equal(strided.sample(view, **settings).to_numpy(),
                                          contiguous.sample(dense, **settings).to_numpy(), err_msg=what)  # fmt: skip
        np.testing.assert_array_equal(strided.sample(view, temperature=0.0).to_numpy(), want, err_msg=what)
        probs = gp.filtered_probs(view, top_k=10).to_numpy()
        np.testing.assert_array_equal(probs, gp.filtered_probs(dense, top_k=10).to_numpy(), err_msg=what)
        np.testing.assert_array_equal(probs, strided.filtered_probs(view, top_k=10).to_numpy(), err_msg=what)
        for row in range(n):
            _check_probs(probs[row], reference(rows[row], top_k=10), f"{what}: row {row}")


def test_strided_vocabulary_axis_raises_everywhere() -> None:
    """A vocabulary axis that is not contiguous is refused by every entry point with a ShapeError naming
    the strides, before anything runs (no copy is made behind the caller's back)."""
    rng = np.random.default_rng(6)
    host = _logits(rng, (3, 2 * 101), "float32")
    view = _device(host)[:, ::2]  # vocab 101 at a stride of 2 elements
    sampler = gp.Sampler(3, 3, 101)
    out = _device(np.full(3, 99, np.int32))
    probs = _device(np.full((3, 101), 5.0, np.float32))
    calls = {
        "greedy": lambda: gp.greedy(view, out=out),
        "sample": lambda: gp.sample(view, out),
        "filtered_probs": lambda: gp.filtered_probs(view, probs),
        "Sampler.sample": lambda: sampler.sample(view, out),
        "Sampler.filtered_probs": lambda: sampler.filtered_probs(view, probs),
    }
    for name, call in calls.items():
        with pytest.raises(ShapeError, match=r"vocabulary axis .* contiguous .*strides \(808, 8\)"):
            call()
        assert out.to_numpy().tolist() == [99] * 3, name
        assert (probs.to_numpy() == 5.0).all(), name
    assert sampler.step == 0


# -- filtered distributions ------------------------------------------------------------------------
CONFIGS: dict[str, dict[str, Any]] = {
    "plain": {},
    "temperature": {"temperature": 0.7},
    "top_k 50": {"top_k": 50},
    "top_k 1": {"top_k": 1},
    "top_p 0.9": {"top_p": 0.9},
    "top_p 0.3 t 1.3": {"top_p": 0.3, "temperature": 1.3},
    "min_p 0.05": {"min_p": 0.05},
    "all": {"temperature": 0.8, "top_k": 1000, "top_p": 0.8, "min_p": 0.02},
    "greedy": {"temperature": 0.0, "top_k": 5},
}


def _snapped(x: Array, config: dict[str, Any]) -> dict[str, Any]:
    """The config with top_p / min_p moved to unambiguous values for this row."""
    result = dict(config)
    t = config.get("temperature", 1.0)
    if "top_p" in config:
        result["top_p"] = _snap_top_p(x, config["top_p"], t, config.get("top_k"))
    if "min_p" in config:
        result["min_p"] = _snap_min_p(x, config["min_p"], t)
    return result


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize(
    ("dtype", "batch", "vocab"),
    [("float32", 1, QWEN_VOCAB), ("bfloat16", 3, LLAMA_VOCAB), ("float16", 2, 4097), ("float32", 4, 77)],
)
def test_filtered_probs_match_reference(name: str, dtype: str, batch: int, vocab: int) -> None:
    rng = np.random.default_rng(abs(hash((name, dtype, vocab))) % 2**32)
    host = _logits(rng, (batch, vocab), dtype)
    config = _snapped(host[0], CONFIGS[name])  # scalar settings: snapped for row 0, checked on row 0 exactly
    out = _device(np.full((batch, vocab), np.nan, np.float32))
    got = gp.filtered_probs(_device(host), out, **config).to_numpy()
    _check_probs(got[0], reference(host[0], **config), f"{name} row 0")
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_per_row_settings(dtype: str) -> None:
    # One batch mixing greedy, plain, top-k, top-p and min-p rows through device arrays (batch,).
    rng = np.random.default_rng(11)
    vocab = 30011
    host = _logits(rng, (5, vocab), dtype)
    temperature = np.array([0.0, 1.0, 0.9, 1.1, 1.0], np.float32)
    top_k = np.array([0, 0, 40, 0, 0], np.int32)
    top_p = np.ones(5, np.float32)
    min_p = np.zeros(5, np.float32)
    top_p[3] = _snap_top_p(host[3], 0.85, 1.1)
    min_p[4] = _snap_min_p(host[4], 0.1)
    penalty = np.array([1.0, 1.5, 1.0, 1.0, 0.7], np.float32)
    history = rng.integers(-1, vocab, size=(5, 9)).astype(np.int32)
    settings = {"temperature": _device(temperature), "top_k": _device(top_k), "top_p": _device(top_p),
                "min_p": _device(min_p), "repetition_penalty": _device(penalty),
                "history": _device(history)}  # fmt: skip
    sampler = gp.Sampler(9, 8, vocab, dtype)
    got = sampler.filtered_probs(_device(host), **settings).to_numpy()
    for row in range(5):
        expected = reference(host[row], float(temperature[row]), int(top_k[row]) or None, float(top_p[row]),
                             float(min_p[row]) or None, float(penalty[row]), history[row])  # fmt: skip
        _check_probs(got[row], expected, f"row {row}")
    tokens = sampler.sample(_device(host), **settings).to_numpy()
    assert tokens[0] == np.argmax(_values(host[0], 0.0, 1.0, None))
    for row in range(1, 5):
        assert got[row, tokens[row]] > 0, row


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_tokens_far_below_the_largest_have_weight_zero(temperature: float) -> None:
    """Weights are trunc(exp(v - max v) * 2**44): a logit 40 / temperature below the largest is dropped, one
    20 below is kept (the reference models the same resolution; random rows hit it rarely)."""
    host = np.zeros((1, 1000), np.float32)
    host[0, 0], host[0, 5], host[0, 9] = 28.0, -12.0, 8.0
    got = gp.filtered_probs(_device(host), _device(np.full((1, 1000), np.nan, np.float32)), temperature=temperature)
    row = got.to_numpy()[0]
    assert row[5] == 0
    assert row[9] > 0
    _check_probs(row, reference(host[0], temperature), f"temperature {temperature}")


def test_ties_at_the_thresholds_are_kept() -> None:
    host = np.array([[3.0, 1.0, 3.0, 2.0, 3.0, 0.0]], np.float32)
    top_k = gp.filtered_probs(_device(host), top_k=2).to_numpy()[0]
    assert (top_k > 0).tolist() == [True, False, True, False, True, False]  # every tie with the 2nd largest
    # top_p: the group of three 3.0s holds most of the mass, so any top_p below it keeps exactly that group.
    top_p = gp.filtered_probs(_device(host), top_p=0.1).to_numpy()[0]
    assert (top_p > 0).tolist() == [True, False, True, False, True, False]
    np.testing.assert_allclose(top_p[[0, 2, 4]], 1 / 3, rtol=1e-6)


def test_repetition_penalty_matches_reference() -> None:
    rng = np.random.default_rng(21)
    vocab = 50001
    host = _logits(rng, (3, vocab), "float32")
    history = rng.integers(0, vocab, size=(3, 64)).astype(np.int32)
    history[:, :4] = -1  # padding
    history[0, 4:8] = history[0, 8]  # duplicates count once
    history[1, 10] = vocab + 5  # out of range: ignored
    history[2, 5] = int(np.argmax(host[2]))  # the largest logit is divided down
    for penalty in (1.3, 0.8):
        sampler = gp.Sampler(2, 3, vocab)
        got = sampler.filtered_probs(_device(host), repetition_penalty=penalty, history=_device(history)).to_numpy()
        for row in range(3):
            _check_probs(got[row], reference(host[row], penalty=penalty, history=history[row]), f"{penalty} {row}")
        greedy_tokens = sampler.sample(_device(host), temperature=0, repetition_penalty=penalty,
                                       history=_device(history)).to_numpy()  # fmt: skip
        for row in range(3):
            assert greedy_tokens[row] == np.argmax(_values(host[row], 0.0, penalty, history[row])), (penalty, row)
    # The bitmap is cleared after each call: the same sampler without history equals a fresh one.
    plain = sampler.filtered_probs(_device(host)).to_numpy()
    _check_probs(plain[2], reference(host[2]), "after")


# -- draws -----------------------------------------------------------------------------------------
def _chi_square_critical(df: int) -> float:
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + Z_1E4 * math.sqrt(h)) ** 3


def test_chi_square_critical_value() -> None:
    # Tabulated chi-square quantiles at p = 1e-4: df 5 -> 25.745, df 9 -> 33.720, df 20 -> 52.386.
    for df, exact in ((5, 25.745), (9, 33.720), (20, 52.386)):
        assert exact <= _chi_square_critical(df) <= 1.035 * exact


DRAW_CONFIGS: dict[str, dict[str, Any]] = {
    "plain": {"temperature": 1.0},
    "temperature": {"temperature": 0.6},
    "top_k": {"top_k": 5},
    "top_p": {"top_p": 0.7},
    "min_p": {"min_p": 0.3},
    "penalty": {"repetition_penalty": 1.8},
}


@pytest.mark.parametrize("name", list(DRAW_CONFIGS))
def test_draws_follow_the_filtered_distribution(name: str) -> None:
    # 20000 draws: 2000 identical rows (each row has its own random stream) times 10 steps.
    rng = np.random.default_rng(31)
    vocab, batch, steps = 12, 2000, 10
    row = rng.uniform(-1.5, 1.5, vocab).astype(np.float32)
    history_row = np.array([2, 7, -1, 7], np.int32)
    config = _snapped(row, DRAW_CONFIGS[name])
    extra: dict[str, Any] = {}
    if "repetition_penalty" in config:
        extra["history"] = _device(np.tile(history_row, (batch, 1)))
    x = _device(np.tile(row, (batch, 1)))
    sampler = gp.Sampler(1234, batch, vocab)
    out = gp.empty(batch, gp.int32)
    counts = np.zeros(vocab, np.int64)
    for _ in range(steps):
        counts += np.bincount(sampler.sample(x, out, **config, **extra).to_numpy(), minlength=vocab)
    expected_p = reference(row, config.get("temperature", 1.0), config.get("top_k"), config.get("top_p"),
                           config.get("min_p"), config.get("repetition_penalty", 1.0), history_row)  # fmt: skip
    assert counts[expected_p == 0].sum() == 0, "a filtered-out token was drawn"
    kept = expected_p > 0
    expected = expected_p[kept] * batch * steps
    assert expected.min() >= 5
    statistic = float((((counts[kept] - expected) ** 2) / expected).sum())
    df = int(kept.sum()) - 1
    if df == 0:
        return
    assert statistic < _chi_square_critical(df), (name, statistic, df, counts, expected)


def test_seeds_are_reproducible() -> None:
    rng = np.random.default_rng(41)
    vocab = 5003
    x = _device(_logits(rng, (4, vocab), "float32", scale=0.5))

    def run(sampler: gp.Sampler, steps: int = 6) -> Array:
        return np.stack([sampler.sample(x, top_p=0.95, top_k=2000).to_numpy() for _ in range(steps)])

    a = gp.Sampler(7, 4, vocab)
    first = run(a)
    assert a.step == 6
    np.testing.assert_array_equal(first, run(gp.Sampler(7, 4, vocab)))
    a.reset(7)
    assert a.step == 0
    np.testing.assert_array_equal(first, run(a))
    other = run(gp.Sampler(8, 4, vocab))
    assert (other != first).mean() > 0.5
    assert len({tuple(r) for r in first}) > 1  # steps draw new numbers
    # The functional form at a step equals the sampler at that step.
    for step in (0, 3):
        np.testing.assert_array_equal(gp.sample(x, top_p=0.95, top_k=2000, seed=7, step=step).to_numpy(), first[step])
    b = gp.Sampler(7, 4, vocab)
    b.reset(step=3)
    np.testing.assert_array_equal(b.sample(x, top_p=0.95, top_k=2000).to_numpy(), first[3])


def test_filtered_probs_leaves_the_step() -> None:
    x = _device(np.zeros((2, 10), np.float32))
    sampler = gp.Sampler(0, 2, 10)
    sampler.filtered_probs(x, top_p=0.5)
    assert sampler.step == 0
    sampler.sample(x)
    sampler.sample(x, temperature=0)
    assert sampler.step == 2


def test_empty_batch() -> None:
    x = gp.empty((0, 10), gp.float32)
    assert gp.greedy(x).shape == (0,)
    assert gp.Sampler(0, 1, 10).sample(x).shape == (0,)
    assert gp.sample(x).shape == (0,)


# -- bad input -------------------------------------------------------------------------------------
BAD: dict[str, tuple[type[Exception], dict[str, Any]]] = {
    "top_p 0": (ArgumentError, {"top_p": 0.0}),
    "top_p 1.5": (ArgumentError, {"top_p": 1.5}),
    "top_p nan": (ArgumentError, {"top_p": float("nan")}),
    "temperature -1": (ArgumentError, {"temperature": -1.0}),
    "temperature inf": (ArgumentError, {"temperature": float("inf")}),
    "top_k -1": (ArgumentError, {"top_k": -1}),
    "top_k float": (DTypeError, {"top_k": 2.5}),
    "min_p -0.1": (ArgumentError, {"min_p": -0.1}),
    "min_p 1.5": (ArgumentError, {"min_p": 1.5}),
    "penalty 0": (ArgumentError, {"repetition_penalty": 0.0, "history": "ok"}),
    "penalty without history": (ArgumentError, {"repetition_penalty": 1.2}),
    "history float": (DTypeError, {"repetition_penalty": 1.2, "history": "float"}),
    "history batch": (ShapeError, {"repetition_penalty": 1.2, "history": "batch"}),
    "top_k array float": (DTypeError, {"top_k": "float array"}),
    "top_p array shape": (ShapeError, {"top_p": "long array"}),
    "out int64": (DTypeError, {"out": "int64"}),
    "out size": (ShapeError, {"out": "size"}),
    "logits float64": (DTypeError, {"logits": "float64"}),
    "logits fp16": (DTypeError, {"logits": "float16"}),
    "logits 1-D": (ShapeError, {"logits": "1d"}),
    "logits vocab": (ShapeError, {"logits": "vocab"}),
    "logits batch": (ShapeError, {"logits": "batch"}),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_raises_and_leaves_the_state(name: str) -> None:
    error, spec = BAD[name]
    rng = np.random.default_rng(51)
    batch, vocab = 3, 100
    host = _logits(rng, (batch, vocab), "float32")
    x = _device(host)
    arrays = {
        "ok": _device(np.zeros((batch, 4), np.int32)), "float": _device(np.zeros((batch, 4), np.float32)),
        "batch": _device(np.zeros((batch + 1, 4), np.int32)), "float array": _device(np.ones(batch, np.float32)),
        "long array": _device(np.ones(batch + 1, np.float32)), "int64": gp.empty(batch, gp.int64),
        "size": gp.empty(batch + 1, gp.int32), "float64": _device(host.astype(np.float64)),
        "float16": _device(host.astype(np.float16)), "1d": _device(host[0]),
        "vocab": _device(host[:, :50]),
    }  # fmt: skip
    kwargs = {k: (arrays[v] if isinstance(v, str) and v in arrays else v) for k, v in spec.items()}
    if spec.get("logits") == "batch":
        kwargs["logits"] = _device(_logits(rng, (5, vocab), "float32"))
    sampler = gp.Sampler(3, 4, vocab)
    sampler.sample(x)  # step 1
    out = _device(np.full(batch, 99, np.int32))
    logits = kwargs.pop("logits", x)
    with pytest.raises(error):
        sampler.sample(logits, kwargs.pop("out", out), **kwargs)
    assert sampler.step == 1
    assert out.to_numpy().tolist() == [99] * batch
    fresh = gp.Sampler(3, 4, vocab)
    fresh.reset(step=1)
    np.testing.assert_array_equal(sampler.sample(x).to_numpy(), fresh.sample(x).to_numpy())


def test_bad_sampler_arguments() -> None:
    with pytest.raises(ArgumentError):
        gp.Sampler(-1, 1, 10)
    with pytest.raises(ArgumentError):
        gp.Sampler(0, 0, 10)
    with pytest.raises(ArgumentError):
        gp.Sampler(0, 1, 2**20)
    with pytest.raises(DTypeError):
        gp.Sampler(0, 1, 10, gp.float64)
    with pytest.raises(DTypeError):
        gp.greedy(_device(np.zeros((2, 3), np.int32)))
    with pytest.raises(ShapeError):
        gp.greedy(_device(np.zeros((2, 3), np.float32)).T)  # vocab axis not contiguous
    with pytest.raises(ArgumentError):
        gp.filtered_probs(_device(np.zeros((2, 3), np.float32)), top_p=2.0)


# -- GPU only --------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "batch"), [("float32", 1), ("bfloat16", 8), ("float16", 3)])
def test_gpu_graph_replay_equals_eager_steps(dtype: str, batch: int) -> None:
    rng = np.random.default_rng(61)
    vocab, steps = QWEN_VOCAB, 6
    x = _device(_logits(rng, (batch, vocab), dtype, scale=1.0))
    history = _device(rng.integers(-1, vocab, size=(batch, 17)).astype(np.int32))
    temperature = _device(np.linspace(0.5, 1.2, batch).astype(np.float32))
    settings = {"temperature": temperature, "top_k": 500, "top_p": 0.9, "min_p": 0.01, "repetition_penalty": 1.1,
                "history": history}  # fmt: skip
    sampler = gp.Sampler(77, batch, vocab, dtype)
    out = gp.empty(batch, gp.int32)
    with gp.Stream() as stream:
        eager = []
        for _ in range(steps):
            sampler.sample(x, out, **settings)
            eager.append(out.to_numpy().copy())
        sampler.reset(77)
        graph = gp.CudaGraph()
        with graph.capture(stream):
            sampler.sample(x, out, **settings)
        assert sampler.step == 0  # captured, not run
        replayed = []
        for _ in range(steps):
            out.copy_(np.full(batch, -1, np.int32))
            graph.replay(stream)
            stream.synchronize()
            replayed.append(out.to_numpy().copy())
    np.testing.assert_array_equal(np.stack(replayed), np.stack(eager))
    assert sampler.step == steps
    assert len({tuple(r) for r in eager}) > 1


@pytest.mark.gpu
@pytest.mark.parametrize("strided", [False, True])
def test_gpu_greedy_graph_replay(strided: bool) -> None:
    rng = np.random.default_rng(62)
    if strided:  # rows of a (4, 2, vocab) array: the view goes to the kernel as it is
        x = _device(_logits(rng, (4, 2, LLAMA_VOCAB), "bfloat16"))[:, 1, :]
    else:
        x = _device(_logits(rng, (4, LLAMA_VOCAB), "bfloat16"))
    out = gp.empty(4, gp.int32)
    with gp.Stream() as stream:
        gp.greedy(x, out)
        eager = out.to_numpy().copy()
        graph = gp.CudaGraph()
        with graph.capture(stream):
            gp.greedy(x, out)
        out.copy_(np.full(4, -1, np.int32))
        graph.replay(stream)
        stream.synchronize()
    assert out.to_numpy().tobytes() == eager.tobytes()


@pytest.mark.gpu
def test_gpu_tokens_agree_with_the_cpu_pipeline() -> None:
    # The CPU backend's pipeline (NumPy, same Philox stream) on the same logits draws the same tokens
    # except where float32 exp differs in the last place at a boundary: nearly always all of them.
    rng = np.random.default_rng(63)
    batch, vocab = 16, 32000
    host = _logits(rng, (batch, vocab), "float32")
    sampler = gp.Sampler(5, batch, vocab)
    got = sampler.sample(_device(host), top_k=100, top_p=0.9).to_numpy()
    want = []
    for row in range(batch):
        _, weights = sampling._cpu_row(host[row], 1.0, 100, float(np.float32(0.9)), 0.0, 1.0, None)
        assert weights is not None
        total = int(weights.sum(dtype=np.uint64))
        r = (sampling._random64(5, 0, row) * total) >> 64
        want.append(int(np.searchsorted(np.cumsum(weights, dtype=np.uint64), np.uint64(r), side="right")))
    assert (got == np.array(want)).mean() >= 0.9


@pytest.mark.nvrtc
def test_every_sampling_kernel_compiles() -> None:
    from pygpukit.ops._kernels import all_groups, group

    groups = all_groups()["sampling/sampling.cu"]
    assert len({e for g in groups for e in g}) == 7  # sample_pass and sample_argmax_rows x 3 dtypes, sample_mark
    for expressions in groups:
        group("sampling/sampling.cu", expressions).compile("90")
