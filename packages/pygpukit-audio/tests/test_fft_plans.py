"""The FFT plans of the CUDA backend (pygpukit/audio/_fft_plan.py), checked without a GPU: each plan's launches
are replayed by a NumPy model of the fft_smem / fft_pack / fft_unpack kernels (native/kernels/audio/fft.cu;
the in-kernel transform of one row is numpy.fft.fft, which the gpu-marked tests of test_fft.py compare the
device's own against). This checks the plan's wiring: buffers, strides, rows, twiddles, conjugations,
scales and the launch shapes, for the single-launch, four-step and pack/core/unpack paths."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from pygpukit.audio import _fft_plan, _kernels
from pygpukit.audio._common import host
from pygpukit.audio._launch import PAD_MODES
from pygpukit.audio.spectral import fft_window
from pygpukit.core.backend import current_backend
from pygpukit.core.dtypes import float32, float64

# The model reads the arrays' bytes on the host (host_view): the CPU backend's arrays. On the CUDA backend
# the kernels themselves run, in test_fft.py's gpu-marked tests.
pytestmark = pytest.mark.skipif(current_backend() != "cpu", reason="a NumPy model of the kernels: CPU backend only")

Array = np.ndarray[Any, Any]
LOAD = _fft_plan._LOAD
STORE = _fft_plan._STORE


@pytest.fixture
def model_plans(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Plans built with fake kernels (no compilation, no device query); each test sets a small shared-memory
    budget (4 KiB for float32, 8 KiB for float64) so that short lengths take the long-length paths."""

    def fake_kernel(name: str, dtype: Any, params: Any) -> Any:
        return SimpleNamespace(name=name, attributes={"max_threads_per_block": 1024, "num_regs": 40},
                               set_max_dynamic_shared_memory=lambda size: None)  # fmt: skip

    monkeypatch.setattr(_fft_plan, "_kernel", fake_kernel)
    monkeypatch.setattr(_kernels, "sm_limits", lambda: (233472, 2048))  # an H100's SM
    monkeypatch.setattr(_kernels, "grid_for", lambda work, *args, **kwargs: 1)
    _fft_plan._PLANS.clear()
    yield
    _fft_plan._PLANS.clear()


def _smem(buffers: dict[Any, Array], args: tuple[Any, ...], launch: Any) -> None:
    (src, dst, tw, edge, rows, inner, in_outer, in_inner, in_elem, out_outer, out_inner, out_elem, n, in_len,
     out_count, _npass, _radices, _tw_pass, tw_post, load, store, conj_in, conj_out, rows_fast, scale, window,
     x_len, pad_left, pad_mode, power) = args  # fmt: skip
    tx, ry, _ = launch.block
    assert launch.grid * ry >= rows
    assert tx * ry <= 1024
    complex_bytes = 16 if buffers["dtype"] == float64 else 8
    pad = 0 if not rows_fast else (1 if ry >= 32 else 32 // ry)
    assert launch.shared == ry * (2 * n + pad) * complex_bytes <= _fft_plan._smem_limit()
    post = None if not tw_post else (lambda q: buffers[tw][q])
    _rows(buffers, SimpleNamespace(**{k: v for k, v in locals().items() if k not in ("buffers", "args", "launch")}),
          lambda x: np.fft.fft(x, axis=1), post)  # fmt: skip


def _reg_transform(x: Array, elements: int, tw: Array, shift: int = 4) -> Array:
    """fft_reg.cu's transform of rows ``x`` (rows, L), step by step: thread jt of a row holds positions
    jt + e L / E; each radix-R pass takes butterflies j = jt + i L / E, twiddles them from the W_L table and
    sends the outputs through a padded shared-memory row (NaN where nothing was written, so a read of an
    unwritten position shows; a word of padding every 2^shift positions). The R-point DFTs are numpy's
    (the kernel's own are checked on the GPU)."""
    rows, length = x.shape
    per_row = length // elements
    jt = np.arange(per_row)
    e = np.arange(elements)

    def bank(p: Array) -> Array:
        padded: Array = p + (p >> shift)
        return padded

    v = x[:, jt[:, None] + e[None, :] * per_row]
    ns = 1
    while True:
        radix = min(elements, length // ns)
        group = elements // radix
        smem = np.full((rows, length + (length >> shift) + 1), np.nan + 0j)
        out = v.copy()
        for i in range(group):
            j = jt + i * per_row
            k = j & (ns - 1)
            u = np.stack([v[:, :, i + r * group] for r in range(radix)], axis=-1)
            for r in range(1, radix):
                u[:, :, r] *= tw[r * k * (length // (ns * radix))]
            u = np.fft.fft(u, axis=-1)
            for r in range(radix):
                if ns * radix == length:
                    out[:, :, i + r * group] = u[:, :, r]
                else:
                    smem[:, bank((j - k) * radix + k + r * ns)] = u[:, :, r]
        if ns * radix == length:
            result = np.empty_like(x)
            result[:, jt[:, None] + e[None, :] * per_row] = out
            return result
        v = smem[:, bank(jt[:, None] + e[None, :] * per_row)]
        assert not np.isnan(v).any(), "a pass read a position no butterfly wrote"
        ns *= radix


def _reg(buffers: dict[Any, Array], args: tuple[Any, ...], launch: Any) -> None:
    (src, dst, tw, edge, post_lo, post_hi, rows, inner, in_outer, in_inner, in_elem, out_outer, out_inner,
     out_elem, in_len, out_count, post_shift, tw_post, load, store, conj_in, conj_out, rows_fast, thread_rows,
     scale, window, x_len, pad_left, pad_mode, power, pad_shift, row_words) = args  # fmt: skip
    name = launch.kernel.name
    copies = 2 if name.endswith("_2buf") else 1  # the _2buf kernels: two shared-memory buffers
    elements, n = (int(part) for part in name.removeprefix("fft_reg").removesuffix("_2buf").split("_"))
    threads = launch.block
    ry = threads // (n // elements)
    assert threads == ry * (n // elements) <= 1024
    assert launch.grid * ry >= rows
    assert 3 <= pad_shift <= 5
    assert row_words >= 2 * (n + (n >> pad_shift) + 1), "the shared-memory rows of a block overlap"
    assert launch.shared == copies * ry * row_words * (8 if buffers["dtype"] == float64 else 4)
    assert launch.shared <= _fft_plan._smem_limit()
    direct_store = store in (STORE["kStoreComplex"], STORE["kStoreReal"])
    assert thread_rows == int(bool(rows_fast & (2 if direct_store else 1)))
    mask = (1 << post_shift) - 1
    post = None if not tw_post else (lambda q: buffers[post_lo][q & mask] * buffers[post_hi][q >> post_shift])
    _rows(buffers, SimpleNamespace(**{k: v for k, v in locals().items() if k not in ("buffers", "args", "launch")}),
          lambda x: _reg_transform(x, elements, buffers[tw], pad_shift), post)  # fmt: skip


def _rows(buffers: dict[Any, Array], a: Any, transform: Any, post: Any) -> None:
    """The read, transform and write of one fft_smem or fft_reg launch (the launch's arguments in ``a``)."""
    assert a.load in (LOAD["kLoadComplex"], LOAD["kLoadFramePairs"]), "the model reads complex values or frames"
    assert a.store in (STORE["kStoreComplex"], STORE["kStoreR2cEven"], STORE["kStoreR2cPower"]), a.store
    n, rows, inner = a.n, a.rows, a.inner
    row = np.arange(rows)
    outer, i = np.divmod(row, inner)
    e = np.arange(n)
    if a.load == LOAD["kLoadFramePairs"]:
        signal = buffers[a.src].real.reshape(-1, a.x_len)  # float rows of x_len samples (in_outer == x_len)
        assert a.in_outer == a.x_len
        mode = next(name for name, code in PAD_MODES.items() if code == a.pad_mode)
        padded = np.pad(signal, ((0, 0), (a.pad_left, 2 * n + a.in_inner * inner)), mode=mode)  # type: ignore[call-overload]
        j = np.arange(2 * n)
        frames = padded[outer[:, None], (i * a.in_inner)[:, None] + j[None, :]] * buffers[a.window][None, :]
        x = frames[:, 0::2] + 1j * frames[:, 1::2]
    else:
        x = buffers[a.src][(outer * a.in_outer + i * a.in_inner)[:, None] + e[None, :] * a.in_elem]
        x = np.where(e[None, :] < a.in_len, x, 0)
    if a.conj_in:
        x = np.conj(x)
    k = np.arange(a.out_count)
    full = transform(x)
    if a.store in (STORE["kStoreR2cEven"], STORE["kStoreR2cPower"]):
        zk, zc = full[:, k % n], np.conj(full[:, (n - k) % n])
        z = ((zk + zc) + buffers[a.edge][k] * -1j * (zk - zc)) * 0.5
        if a.store == STORE["kStoreR2cPower"]:
            z = np.abs(z * a.scale) ** a.power / a.scale  # the kernel scales before the power; scale is 1 here
    else:
        z = full[:, : a.out_count]
    if a.conj_out:
        z = np.conj(z)
    if post is not None:
        z = z * post(k[None, :] * (i * a.tw_post)[:, None])
    buffers[a.dst][(outer * a.out_outer + i * a.out_inner)[:, None] + k[None, :] * a.out_elem] = z * a.scale


def _wavefronts(length: int, elements: int, wide: bool, thread_rows: bool, ry: int, shift: int,
                row_words: int) -> float:  # fmt: skip
    """Mean shared-memory wavefronts per exchange instruction of one fft_reg launch (fft_reg.cu's RegPass
    writes and reads, every warp of a block): per 32-lane request (float32: 32 banks of words; float64: two
    16-lane halves over 16 double-word banks), the most distinct addresses that share a bank. Written apart
    from the planner's vectorized _reg_wavefronts on purpose (the test compares the two)."""
    per_row = length // elements
    threads = np.arange(ry * per_row)
    rr, jt = (threads % ry, threads // ry) if thread_rows else (threads // per_row, threads % per_row)
    banks, lanes = (16, 16) if wide else (32, 32)
    costs = []

    def request(words: Array) -> None:
        for start in range(0, words.size, lanes):  # a warp, or half a warp for float64 (the last may be short)
            half = words[start : start + lanes]
            found: dict[int, set[int]] = {}
            for w in half.tolist():
                found.setdefault(w % banks, set()).add(w)
            costs.append(max(len(v) for v in found.values()))

    ns = 1
    while ns * min(elements, length // ns) < length:
        radix = min(elements, length // ns)
        for i in range(elements // radix):
            j = jt + i * per_row
            k = j & (ns - 1)
            for r in range(radix):
                p = (j - k) * radix + k + r * ns
                request(rr * row_words + p + (p >> shift))
        for e in range(elements):
            p = jt + e * per_row
            request(rr * row_words + p + (p >> shift))
        ns *= radix
    return float(np.mean(costs))


def test_reg_buffers_only_where_no_block_is_lost() -> None:
    """fft_reg's second shared-memory buffer (one barrier an exchange): taken where the blocks an SM holds
    by threads and registers still fit its shared memory with twice the bytes, never at a block's cost."""
    h100 = (233472, 2048)
    # 2^20's launches: 1024 threads of 64 registers (one block an SM), 8 rows of 1024 float32 (about 70 KB).
    assert _fft_plan._reg_buffers(8 * 2178 * 4, 1024, 64, *h100) == 2
    # The STFT's 128-thread blocks of one 1024-point row: 8 blocks an SM by registers; 8 x 2 x 8.7 KB fits.
    assert _fft_plan._reg_buffers(2178 * 4, 128, 64, *h100) == 2
    # 32 registers: 16 blocks an SM by threads, and 16 x (2 x 8.7 + 1) KB does not fit 228 KB.
    assert _fft_plan._reg_buffers(2178 * 4, 128, 32, *h100) == 1
    # An A100's SM (164 KB) with the 2^20 launch: 2 x 70 KB + 1 KB fits; three 512-thread blocks would not.
    assert _fft_plan._reg_buffers(8 * 2178 * 4, 1024, 64, 167936, 2048) == 2
    assert _fft_plan._reg_buffers(4 * 2178 * 4, 512, 40, 167936, 2048) == 1
    # Unknown registers (0) or the knob off: one buffer.
    assert _fft_plan._reg_buffers(1024, 128, 0, *h100) == 1


@pytest.mark.parametrize(("length", "elements", "thread_rows", "ry"),
                         [(1024, 8, 1, 8), (1024, 16, 1, 8), (1024, 8, 0, 1), (2048, 8, 0, 1), (4096, 16, 0, 1),
                          (512, 8, 1, 4), (256, 16, 1, 3), (128, 8, 0, 8), (64, 8, 1, 16)])  # fmt: skip
@pytest.mark.parametrize("dtype", [float32, float64])
def test_reg_layout_spreads_the_exchanges_over_the_banks(
    length: int, elements: int, thread_rows: int, ry: int, dtype: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """_reg_layout's shared-memory rows cost no more bank conflicts than the layout of before (a word
    every 16, rows 2 (L + L/16 + 1) apart) for any launch shape, and remove them from the four-step's
    strided launches (8 rows of 1024 points a block: 2.0 wavefronts an exchange -> 1.0)."""
    wide = dtype == float64
    shift, words = _fft_plan._reg_layout(length, elements, dtype, thread_rows, ry)
    assert words >= 2 * (length + (length >> shift) + 1)
    new = _wavefronts(length, elements, wide, bool(thread_rows), ry, shift, words)
    assert _fft_plan._reg_wavefronts(length, elements, wide, thread_rows, ry, shift, words) == new  # planner's model
    monkeypatch.setattr(_fft_plan, "reg_banks", False)
    old_shift, old_words = _fft_plan._reg_layout(length, elements, dtype, thread_rows, ry)
    assert (old_shift, old_words) == (4, 2 * (length + length // 16 + 1))
    old = _wavefronts(length, elements, wide, bool(thread_rows), ry, old_shift, old_words)
    assert new <= old, (new, old)
    if (length, elements, thread_rows, ry) == (1024, 8, 1, 8):
        assert (old, new) == ((1.1666666666666667, 1.0) if wide else (2.0, 1.0))


def _use_reg(monkeypatch: pytest.MonkeyPatch, elements: int, dtype: Any) -> None:
    """Plans with fft_reg of ``elements`` per thread (0: fft_smem only)."""
    monkeypatch.setattr(_fft_plan, "reg_enabled", elements > 0)
    if elements:
        monkeypatch.setattr(_fft_plan, "reg_elements", {dtype.name: elements})


def _run_model(plan: Any, x: Array, out_size: int, dtype: Any) -> Array:
    """Replay ``plan`` on the complex rows ``x`` (flattened) into an output of ``out_size`` complex values."""
    buffers: dict[Any, Any] = {"in": x.ravel().astype(np.complex128), "out": np.zeros(out_size, np.complex128),
                               "dtype": dtype}  # fmt: skip
    for i, size in enumerate(plan.scratch):
        buffers[f"s{i}"] = np.full(size, np.nan + 0j)  # stale scratch: every value read must be written first
    for table in plan.tables:
        values = host(table).astype(np.float64)
        buffers[table.device_ptr] = values[..., 0] + 1j * values[..., 1] if values.ndim == 2 else values
    for launch in plan.launches:
        args = launch.args
        if launch.kernel.name == "fft_smem":
            _smem(buffers, args, launch)
        elif launch.kernel.name.startswith("fft_reg"):
            _reg(buffers, args, launch)
        elif launch.kernel.name == "fft_pack":
            src, dst, _edge, chirp, rows, in_row, in_elem, n, m, in_len, load, conj = args
            assert load == LOAD["kLoadComplex"]
            assert chirp == 0
            e = np.arange(m)
            values = buffers[src][(np.arange(rows) * in_row)[:, None] + np.minimum(e, in_len - 1)[None, :] * in_elem]
            values = np.where(e[None, :] < min(n, in_len), values, 0)
            buffers[dst][: rows * m] = (np.conj(values) if conj else values).ravel()
        elif launch.kernel.name == "fft_unpack":
            src, dst, edge, chirp, rows, out_row, out_elem, n, m, count, store, conj, scale = args
            assert store in (STORE["kStoreComplex"], STORE["kStoreR2cEven"])
            assert chirp == 0
            k = np.arange(count)
            rows_z = buffers[src][: rows * m].reshape(rows, m)
            if store == STORE["kStoreR2cEven"]:
                zk, zc = rows_z[:, k % n], np.conj(rows_z[:, (n - k) % n])
                z = ((zk + zc) + buffers[edge][k] * -1j * (zk - zc)) * 0.5
            else:
                z = rows_z[:, :count]
            z = np.conj(z) if conj else z
            buffers[dst][(np.arange(rows) * out_row)[:, None] + k[None, :] * out_elem] = z * scale
        else:
            raise AssertionError(f"no model of {launch.kernel.name}")
    result: Array = buffers["out"]
    return result


@pytest.mark.usefixtures("model_plans")
@pytest.mark.parametrize("dtype", [float32, float64])
@pytest.mark.parametrize(
    ("kind", "n", "in_row", "rows"),
    [
        ("fft", 4096, 4096, 3),  # four-step 64 x 64, two launches
        ("ifft", 4096, 4096, 2),
        ("fft", 3 * 4096, 3 * 4096, 2),  # an odd smooth length: 96 x 128
        ("ifft", 5 * 7 * 64, 5 * 7 * 64 + 5, 2),  # cropped input rows
        ("fft", 4096, 1000, 2),  # zero padding: pack, a four-step core, unpack
        ("fft", 200, 200, 4),  # one launch
    ],
)
@pytest.mark.parametrize("reg", [0, 8, 16], ids=["smem", "reg8", "reg16"])
def test_plans_compute_the_dft(dtype: Any, kind: str, n: int, in_row: int, rows: int, reg: int,
                               monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(_fft_plan, "smem_limit_override", 4096 if dtype == float32 else 8192)
    _use_reg(monkeypatch, reg, dtype)
    rng = np.random.default_rng()
    x = rng.standard_normal((rows, in_row)) + 1j * rng.standard_normal((rows, in_row))
    for norm in ("backward", "ortho", "forward"):
        plan = _fft_plan.get_plan(kind, n, in_row, rows, dtype, norm)
        names = [launch.kernel.name for launch in plan.launches]
        if n == in_row and n > 256:
            assert len(names) == 2, names
            assert plan.scratch == (rows * n,)
        if not reg:
            assert not any(name.startswith("fft_reg") for name in names), names
        elif n in (4096, 3 * 4096):  # the power-of-two halves run fft_reg (64 x 64, 96 x 128)
            assert f"fft_reg{reg}_{64 if n == 4096 else 128}" in names, names
        got = _run_model(plan, x, rows * n, dtype).reshape(rows, n)
        want = getattr(np.fft, kind)(x, n=n, axis=-1, norm=norm)
        tol = 2e-6 if dtype == float32 else 1e-12  # the twiddle tables are rounded to the dtype
        np.testing.assert_allclose(got, want, rtol=0, atol=tol * np.abs(want).max())


@pytest.mark.usefixtures("model_plans")
def test_four_step_with_two_buffers_computes_the_dft(monkeypatch: pytest.MonkeyPatch) -> None:
    """With an H100's shared memory, the float32 four-step of 2^16 takes fft_reg's _2buf kernels (two copies
    of the rows, twice the bytes) for both launches, wired as the one-buffer kernels are."""
    dtype = float32
    monkeypatch.setattr(_fft_plan, "smem_limit_override", 232448)
    rng = np.random.default_rng()
    n, rows = 1 << 16, 2
    x = rng.standard_normal((rows, n)) + 1j * rng.standard_normal((rows, n))
    plan = _fft_plan.get_plan("fft", n, n, rows, dtype, "backward")
    assert [launch.kernel.name for launch in plan.launches] == ["fft_reg8_256_2buf"] * 2
    got = _run_model(plan, x, rows * n, dtype).reshape(rows, n)
    want = np.fft.fft(x, axis=-1)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max())
    monkeypatch.setattr(_fft_plan, "reg_double", False)
    _fft_plan._PLANS.clear()
    plan = _fft_plan.get_plan("fft", n, n, rows, dtype, "backward")
    assert [launch.kernel.name for launch in plan.launches] == ["fft_reg8_256"] * 2


@pytest.mark.usefixtures("model_plans")
@pytest.mark.parametrize("dtype", [float32, float64])
@pytest.mark.parametrize(("n", "in_row", "aligned"), [(8192, 8192, True), (8192, 8200, True), (8192, 8192, False),
                                                      (8192, 8191, True), (8192, 8193, True)])  # fmt: skip
def test_long_rfft_reads_real_pairs_in_place(dtype: Any, n: int, in_row: int, aligned: bool,
                                             monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """An rfft too long for one launch, without zero padding, on an input whose rows and address hold whole
    pairs: the four-step core reads the real pairs as complex values (no fft_pack) and fft_unpack forms the
    spectrum; else (odd rows, a padded row, an odd address) the pack path."""
    monkeypatch.setattr(_fft_plan, "smem_limit_override", 4096 if dtype == float32 else 8192)
    rng = np.random.default_rng()
    rows = 3
    x = rng.standard_normal((rows, in_row))
    plan = _fft_plan.get_plan("rfft", n, in_row, rows, dtype, "backward", aligned)
    names = [launch.kernel.name for launch in plan.launches]
    if aligned and in_row % 2 == 0:
        assert len(names) == 3, names
        assert names[-1] == "fft_unpack", names
        assert "fft_pack" not in names, names
        flat = x.ravel()
        got = _run_model(plan, flat[0::2] + 1j * flat[1::2], rows * (n // 2 + 1), dtype)
        want = np.fft.rfft(x, n=n, axis=-1)
        tol = 2e-6 if dtype == float32 else 1e-12
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=0, atol=tol * np.abs(want).max())
    else:
        assert names[0] == "fft_pack", names


@pytest.mark.usefixtures("model_plans")
@pytest.mark.parametrize("dtype", [float32, float64])
@pytest.mark.parametrize(("n_fft", "hop"), [(400, 160), (64, 16), (96, 40), (128, 32), (512, 160)])
@pytest.mark.parametrize("pad_mode", ["constant", "reflect", "edge", "symmetric", "wrap"])
@pytest.mark.parametrize("reg", [0, 8, 16], ids=["smem", "reg8", "reg16"])
def test_stft_plan_reads_the_frames_itself(dtype: Any, n_fft: int, hop: int, pad_mode: str, reg: int,
                                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The fused STFT plan (kLoadFramePairs into an r2c store) against numpy's padded, windowed frames; n_fft
    128 and 512 run fft_reg when it is on (halves of 64 and 256 points)."""
    monkeypatch.setattr(_fft_plan, "smem_limit_override", 4096 if dtype == float32 else 8192)
    _use_reg(monkeypatch, reg, dtype)
    rng = np.random.default_rng()
    rows, length, pad = 3, 1000, n_fft // 2
    signal = rng.standard_normal((rows, length))
    n_frames = 1 + (length + 2 * pad - n_fft) // hop
    window = fft_window("stft", "hann", n_fft, n_fft, dtype)
    plan = _fft_plan.stft_plan(n_fft, rows, n_frames, length, hop, pad, PAD_MODES[pad_mode], window, dtype)
    assert plan is not None
    expected = f"fft_reg{reg}_{n_fft // 2}" if reg and n_fft in (128, 512) else "fft_smem"
    assert [launch.kernel.name for launch in plan.launches] == [expected]
    n_freq = n_fft // 2 + 1
    got = _run_model(plan, signal.astype(np.complex128), rows * n_frames * n_freq, dtype).reshape(
        rows, n_frames, n_freq
    )
    padded = np.pad(signal, ((0, 0), (pad, pad)), mode=pad_mode)  # type: ignore[call-overload]
    frames = np.lib.stride_tricks.sliding_window_view(padded, n_fft, axis=-1)[:, ::hop][:, :n_frames]
    want = np.fft.rfft(frames * host(window).astype(np.float64), axis=-1)
    tol = 2e-6 if dtype == float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=0, atol=tol * np.abs(want).max())
    for power in (2.0, 1.0, 1.5):  # |X| ** power written by the FFT kernel (kStoreR2cPower), real values
        fused = _fft_plan.stft_plan(n_fft, rows, n_frames, length, hop, pad, PAD_MODES[pad_mode], window, dtype, power)
        assert fused is not None
        assert fused is not plan
        got_power = _run_model(fused, signal.astype(np.complex128), rows * n_frames * n_freq, dtype)
        want_power = np.abs(want) ** power
        np.testing.assert_allclose(got_power.real.reshape(want.shape), want_power, rtol=0,
                                   atol=power * tol * want_power.max())  # fmt: skip
    assert _fft_plan.stft_plan(n_fft + 1, rows, n_frames, length, hop, pad, 0, window, dtype) is None  # odd n_fft
    assert _fft_plan.stft_plan(2 * 17 * 2, rows, n_frames, length, hop, pad, 0, window, dtype) is None  # 17: Bluestein
