"""RoPE and KV-cache writes next to torch in the same run (issue 6's bars: apply_rope >= 0.85x the copy
bandwidth for large inputs and faster than transformers' eager rotate_half implementation).

- apply_rope on Llama-3-8B shapes, bf16: a prefill (1, 4096, 32, 128) q + (1, 4096, 8, 128) k and a
  decode step of 32 sequences. pygpukit rotates in place in one launch; the torch peer is transformers'
  ``apply_rotary_pos_emb`` (q * cos + rotate_half(q) * sin, then the same for k) with cos/sin gathered
  from precomputed float32 tables by position and cast to bf16 (cheaper than transformers, which also
  recomputes the angles every forward). ``copy`` is torch copying q and k once (read + write): the
  bandwidth reference. ``bytes`` counts q and k read and written once.
- KV writes, bf16, Llama-3-8B kv heads: the decode append of 32 sequences at per-sequence device
  positions (torch: advanced-index assignment), a 4096-token prefill (torch: copy into the transposed
  cache slice), and the paged decode step (append + advance; pygpukit only).

Each round runs ITERATIONS ops on one stream and synchronizes once.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import pygpukit as gp

pytestmark = pytest.mark.gpu

ITERATIONS = 20
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
MAX_POSITIONS = 16384
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}  # fmt: skip
# name: (batch, seq)
ROPE_SHAPES = {"prefill 1x4096": (1, 4096), "prefill 4x8192": (4, 8192), "decode 32x1": (32, 1)}


def _torch() -> Any:
    return pytest.importorskip("torch")


def _rope_inputs(batch: int, seq: int) -> tuple[np.ndarray[Any, Any], ...]:
    rng = np.random.default_rng(0)
    q = rng.uniform(-2, 2, (batch, seq, HEADS, HEAD_DIM)).astype(np.float32)
    k = rng.uniform(-2, 2, (batch, seq, KV_HEADS, HEAD_DIM)).astype(np.float32)
    positions = (np.arange(seq)[None, :] + rng.integers(0, MAX_POSITIONS - seq, (batch, 1))).astype(np.int32)
    return q, k, positions


def _rope_group(name: str) -> str:
    batch, seq = ROPE_SHAPES[name]
    return f"apply_rope {name} bf16 (q {(batch, seq, HEADS, HEAD_DIM)}, k {(batch, seq, KV_HEADS, HEAD_DIM)})"


def _rope_bytes(name: str) -> int:
    batch, seq = ROPE_SHAPES[name]
    return 2 * 2 * batch * seq * (HEADS + KV_HEADS) * HEAD_DIM * ITERATIONS  # bf16 q and k, read + write


@pytest.mark.parametrize("name", list(ROPE_SHAPES))
def test_rope_pygpukit(benchmark: Any, name: str) -> None:
    hq, hk, hp = _rope_inputs(*ROPE_SHAPES[name])
    cos, sin = gp.rope_cos_sin(HEAD_DIM, MAX_POSITIONS, 5e5, scaling=LLAMA3)
    q, k = gp.from_numpy(hq).astype(gp.bfloat16), gp.from_numpy(hk).astype(gp.bfloat16)
    positions = gp.from_numpy(hp)
    stream = gp.Stream()
    benchmark.group = _rope_group(name)

    def run() -> None:
        with stream:
            for _ in range(ITERATIONS):
                gp.apply_rope(q, k, cos, sin, positions)
        stream.synchronize()

    benchmark.pedantic(run, rounds=10, warmup_rounds=2)
    benchmark.extra_info["bytes"] = _rope_bytes(name)


def _torch_rope_setup(name: str) -> tuple[Any, ...]:
    torch = _torch()
    hq, hk, hp = _rope_inputs(*ROPE_SHAPES[name])
    cos_table, sin_table = gp.rope_cos_sin(HEAD_DIM, MAX_POSITIONS, 5e5, scaling=LLAMA3)
    q = torch.from_numpy(hq).to("cuda", torch.bfloat16)
    k = torch.from_numpy(hk).to("cuda", torch.bfloat16)
    positions = torch.from_numpy(hp).to("cuda", torch.int64)
    cos = torch.from_numpy(cos_table.to_numpy()).to("cuda")
    sin = torch.from_numpy(sin_table.to_numpy()).to("cuda")
    return torch, q, k, positions, cos, sin


def _rotate_half(x: Any) -> Any:
    half = x.shape[-1] // 2
    return _torch().cat((-x[..., half:], x[..., :half]), dim=-1)


@pytest.mark.parametrize("name", list(ROPE_SHAPES))
def test_rope_torch_hf_eager(benchmark: Any, name: str) -> None:
    torch, q, k, positions, cos_table, sin_table = _torch_rope_setup(name)
    stream = torch.cuda.Stream()
    benchmark.group = _rope_group(name)

    def rope() -> tuple[Any, Any]:
        # transformers' LlamaRotaryEmbedding output: cat(freqs, freqs) per position, cast to x's dtype;
        # apply_rotary_pos_emb with unsqueeze_dim for the (batch, seq, heads, head_dim) layout.
        cos = torch.cat((cos_table[positions], cos_table[positions]), dim=-1).to(q.dtype).unsqueeze(2)
        sin = torch.cat((sin_table[positions], sin_table[positions]), dim=-1).to(q.dtype).unsqueeze(2)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin

    def run() -> None:
        with torch.cuda.stream(stream):
            for _ in range(ITERATIONS):
                rope()
        stream.synchronize()

    benchmark.pedantic(run, rounds=10, warmup_rounds=2)
    benchmark.extra_info["bytes"] = _rope_bytes(name)


@pytest.mark.parametrize("name", list(ROPE_SHAPES))
def test_rope_torch_copy_reference(benchmark: Any, name: str) -> None:
    torch, q, k, _, _, _ = _torch_rope_setup(name)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    stream = torch.cuda.Stream()
    benchmark.group = _rope_group(name)

    def run() -> None:
        with torch.cuda.stream(stream):
            for _ in range(ITERATIONS):
                q_out.copy_(q)
                k_out.copy_(k)
        stream.synchronize()

    benchmark.pedantic(run, rounds=10, warmup_rounds=2)
    benchmark.extra_info["bytes"] = _rope_bytes(name)


# -- KV cache writes -------------------------------------------------------------------------------
BATCH, MAX_SEQ, PREFILL = 32, 4096, 4096


def _kv_host(shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    return np.random.default_rng(1).uniform(-4, 4, shape).astype(np.float32)


def test_kv_append_pygpukit(benchmark: Any) -> None:
    cache = gp.KVCache(1, BATCH, KV_HEADS, MAX_SEQ, HEAD_DIM, gp.bfloat16)
    k = gp.from_numpy(_kv_host((BATCH, 1, KV_HEADS, HEAD_DIM))).astype(gp.bfloat16)
    v = gp.from_numpy(_kv_host((BATCH, 1, KV_HEADS, HEAD_DIM))).astype(gp.bfloat16)
    positions = gp.from_numpy(np.random.default_rng(2).integers(0, MAX_SEQ, BATCH).astype(np.int32))
    stream = gp.Stream()
    benchmark.group = f"kv append bf16 ({BATCH} sequences, {KV_HEADS} kv heads, head_dim {HEAD_DIM})"

    def run() -> None:
        with stream:
            for _ in range(ITERATIONS):
                cache.append(0, k, v, positions)
        stream.synchronize()

    benchmark.pedantic(run, rounds=10, warmup_rounds=2)
    benchmark.extra_info["bytes"] = 2 * 2 * k.nbytes * ITERATIONS


def test_kv_append_torch(benchmark: Any) -> None:
    torch = _torch()
    k_cache = torch.empty((BATCH, KV_HEADS, MAX_SEQ, HEAD_DIM), dtype=torch.bfloat16, device="cuda")
    v_cache = torch.empty_like(k_cache)
    k = torch.from_numpy(_kv_host((BATCH, 1, KV_HEADS, HEAD_DIM))).to("cuda", torch.bfloat16)
    v = torch.from_numpy(_kv_host((BATCH, 1, KV_HEADS, HEAD_DIM))).to("cuda", torch.bfloat16)
    positions = torch.from_numpy(np.random.default_rng(2).integers(0, MAX_SEQ, BATCH)).to("cuda")
    rows = torch.arange(BATCH, device="cuda")
    stream = torch.cuda.Stream()
    benchmark.group = f"kv append bf16 ({BATCH} sequences, {KV_HEADS} kv heads, head_dim {HEAD_DIM})"

    def run() -> None:
        with torch.cuda.stream(stream):
            for _ in range(ITERATIONS):
                k_cache[rows, :, positions] = k[:, 0]
                v_cache[rows, :, positions] = v[:, 0]
        stream.synchronize()

    benchmark.pedantic(run, rounds=10, warmup_rounds=2)
    benchmark.extra_info["bytes"] = 2 * 2 * k.numel() * 2 * ITERATIONS


def test_kv_paged_decode_step_pygpukit(benchmark: Any) -> None:
    block = 16
    cache = gp.PagedKVCache(1, BATCH * MAX_SEQ // block, block, KV_HEADS, HEAD_DIM, gp.bfloat16, max_batch=BATCH,
                            max_blocks_per_seq=MAX_SEQ // block)  # fmt: skip
    for _ in range(BATCH):
        slot = cache.add_sequence(100)
        cache.ensure_capacity(slot, MAX_SEQ)
    k = gp.from_numpy(_kv_host((BATCH, 1, KV_HEADS, HEAD_DIM))).astype(gp.bfloat16)
    v = gp.from_numpy(_kv_host((BATCH, 1, KV_HEADS, HEAD_DIM))).astype(gp.bfloat16)
    stream = gp.Stream()
    benchmark.group = f"kv paged append + advance bf16 ({BATCH} sequences, block {block})"

    def run() -> None:
        with stream:
            for _ in range(ITERATIONS):
                cache.append(0, k, v)
                cache.advance()  # 240 steps in all: the sequences stay within their blocks
        stream.synchronize()

    benchmark.pedantic(run, rounds=10, warmup_rounds=2)
    benchmark.extra_info["bytes"] = 2 * 2 * k.nbytes * ITERATIONS


def test_kv_prefill_pygpukit(benchmark: Any) -> None:
    cache = gp.KVCache(1, 1, KV_HEADS, MAX_SEQ, HEAD_DIM, gp.bfloat16)
    k = gp.from_numpy(_kv_host((1, PREFILL, KV_HEADS, HEAD_DIM))).astype(gp.bfloat16)
    v = gp.from_numpy(_kv_host((1, PREFILL, KV_HEADS, HEAD_DIM))).astype(gp.bfloat16)
    stream = gp.Stream()
    benchmark.group = f"kv prefill write bf16 (1 x {PREFILL} tokens, {KV_HEADS} kv heads)"

    def run() -> None:
        with stream:
            for _ in range(ITERATIONS):
                cache.write_prefill(0, k, v)
        stream.synchronize()

    benchmark.pedantic(run, rounds=10, warmup_rounds=2)
    benchmark.extra_info["bytes"] = 2 * 2 * k.nbytes * ITERATIONS


def test_kv_prefill_torch(benchmark: Any) -> None:
    torch = _torch()
    k_cache = torch.empty((1, KV_HEADS, MAX_SEQ, HEAD_DIM), dtype=torch.bfloat16, device="cuda")
    v_cache = torch.empty_like(k_cache)
    k = torch.from_numpy(_kv_host((1, PREFILL, KV_HEADS, HEAD_DIM))).to("cuda", torch.bfloat16)
    v = torch.from_numpy(_kv_host((1, PREFILL, KV_HEADS, HEAD_DIM))).to("cuda", torch.bfloat16)
    stream = torch.cuda.Stream()
    benchmark.group = f"kv prefill write bf16 (1 x {PREFILL} tokens, {KV_HEADS} kv heads)"

    def run() -> None:
        with torch.cuda.stream(stream):
            for _ in range(ITERATIONS):
                k_cache[:, :, :PREFILL].copy_(k.transpose(1, 2))
                v_cache[:, :, :PREFILL].copy_(v.transpose(1, 2))
        stream.synchronize()

    benchmark.pedantic(run, rounds=10, warmup_rounds=2)
    benchmark.extra_info["bytes"] = 2 * 2 * k.numel() * 2 * ITERATIONS
