"""The ``@triton.jit`` kernels behind :mod:`pygpukit.triton.kernels`. Importing this module imports
Triton, so :mod:`pygpukit.triton.kernels` imports it on first use only.

Every kernel computes in float32 (float64 for float64 softmax) and rounds once to the output dtype;
row kernels loop over the row in ``BLOCK``-wide chunks, so any row length works with one program per
row. Strides are in elements.
"""

# mypy: ignore-errors
# ruff: noqa: N803 - Triton kernels spell constexpr parameters in capitals

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def rmsnorm_kernel(x_ptr, w_ptr, out_ptr, x_stride, out_stride, n, eps,
                   HAS_WEIGHT: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_stride
    out_row = out_ptr + row * out_stride
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < n, other=0.0).to(tl.float32)
        acc += x * x
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n + eps)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n
        y = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32) * rstd
        if HAS_WEIGHT:
            y = y * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_row + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def layernorm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, x_stride, out_stride, n, eps,
                     HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_stride
    out_row = out_ptr + row * out_stride
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        acc += tl.load(x_row + cols, mask=cols < n, other=0.0).to(tl.float32)
    mean = tl.sum(acc, axis=0) / n
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n, BLOCK):  # the variance from the centred values: no cancellation
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n
        d = tl.where(mask, tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32) - mean, 0.0)
        acc += d * d
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n + eps)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n
        y = (tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32) - mean) * rstd
        if HAS_WEIGHT:
            y = y * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y = y + tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_row + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def softmax_kernel(x_ptr, out_ptr, n, inner, x_stride, out_stride,
                   ACC: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """One program per (outer, inner) pair; the axis has ``n`` elements ``inner`` apart; ``x_stride``
    and ``out_stride`` are the distances between consecutive ``outer`` indices."""
    pid = tl.program_id(0).to(tl.int64)
    outer = pid // inner
    j = pid % inner
    x_base = x_ptr + outer * x_stride + j
    out_base = out_ptr + outer * out_stride + j
    m = tl.full([BLOCK], float("-inf"), dtype=ACC)
    s = tl.zeros([BLOCK], dtype=ACC)
    for start in range(0, n, BLOCK):  # online max and sum, per lane
        idx = start + tl.arange(0, BLOCK)
        x = tl.load(x_base + idx * inner, mask=idx < n, other=float("-inf")).to(ACC)
        new_m = tl.maximum(m, x)
        scale = tl.where(new_m == float("-inf"), 0.0, tl.exp(m - new_m))
        s = s * scale + tl.where(new_m == float("-inf"), 0.0, tl.exp(x - new_m))
        m = new_m
    row_max = tl.max(m, axis=0)
    total = tl.sum(tl.where(m == float("-inf"), 0.0, s * tl.exp(m - row_max)), axis=0)
    for start in range(0, n, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        mask = idx < n
        x = tl.load(x_base + idx * inner, mask=mask, other=float("-inf")).to(ACC)
        y = tl.exp(x - row_max) / total
        tl.store(out_base + idx * inner, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rope_kernel(x_ptr, cos_ptr, sin_ptr, pos_ptr, sb, ss, sh, pb, ps, seq, heads, half, max_positions, offset,
                NEOX: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """One program per (token, head): rotate the first 2 * half dimensions of that head in place."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    b = token // seq
    t = token % seq
    pos = tl.load(pos_ptr + b * pb + t * ps) + offset
    pos = tl.minimum(tl.maximum(pos, 0), max_positions - 1).to(tl.int64)
    base = x_ptr + b * sb + t * ss + head * sh
    for start in range(0, half, BLOCK):
        i = start + tl.arange(0, BLOCK)
        mask = i < half
        c = tl.load(cos_ptr + pos * half + i, mask=mask, other=0.0).to(tl.float32)
        s = tl.load(sin_ptr + pos * half + i, mask=mask, other=0.0).to(tl.float32)
        if NEOX:
            first = base + i
            second = base + half + i
        else:
            first = base + 2 * i
            second = base + 2 * i + 1
        x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(second, mask=mask, other=0.0).to(tl.float32)
        tl.store(first, (x1 * c - x2 * s).to(x_ptr.dtype.element_ty), mask=mask)
        tl.store(second, (x2 * c + x1 * s).to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def swiglu_kernel(gate_ptr, up_ptr, out_ptr, gate_stride, up_stride, out_stride, n, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    g = tl.load(gate_ptr + row * gate_stride + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + row * up_stride + cols, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + row * out_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, m, n, k, sab, sam, sak, sbb, sbk, sbn, scb, scm, scn,
                  PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_M: tl.constexpr):  # fmt: skip
    """C[batch] = A[batch] @ B[batch], float32 accumulation; grid (tiles, batch), grouped tile order."""
    pid = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)
    tiles_m = tl.cdiv(m, BLOCK_M)
    tiles_n = tl.cdiv(n, BLOCK_N)
    group = GROUP_M * tiles_n
    first_m = (pid // group) * GROUP_M
    size_m = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    rk = tl.arange(0, BLOCK_K).to(tl.int64)
    a_ptrs = a_ptr + batch * sab + rm[:, None] * sam + rk[None, :] * sak
    b_ptrs = b_ptr + batch * sbb + rk[:, None] * sbk + rn[None, :] * sbn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in range(0, k, BLOCK_K):
        a = tl.load(a_ptrs, mask=(rm[:, None] < m) & (rk[None, :] + start < k), other=0.0)
        b = tl.load(b_ptrs, mask=(rk[:, None] + start < k) & (rn[None, :] < n), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * sak
        b_ptrs += BLOCK_K * sbk
    c_ptrs = c_ptr + batch * scb + rm[:, None] * scm + rn[None, :] * scn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < m) & (rn[None, :] < n))
