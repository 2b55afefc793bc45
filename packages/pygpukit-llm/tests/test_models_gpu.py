"""Every architecture against transformers' own model class, on the GPU.

A small random-weight config of each architecture is built with transformers (torch on the GPU
machine), saved as safetensors, loaded with pygpukit and compared: fp32 logits within 1e-4 relative
(max |ours - ref| / max |ref|) for prefills of 1, 17 and 300 tokens and for 32 decode steps over the
KV cache, identical greedy continuations of 32 tokens, and bf16 logits within 3e-2 relative.
torch and transformers are references only; these tests skip where they are missing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

FP32_RTOL = 1e-4
BF16_RTOL = 3e-2
BASE: dict[str, Any] = {
    "vocab_size": 512, "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 384, "max_position_embeddings": 512,
}  # fmt: skip


def _configs() -> dict[str, Callable[[Any], Any]]:
    return {
        "gpt2": lambda t: t.GPT2Config(vocab_size=512, n_embd=256, n_layer=2, n_head=4, n_positions=512),
        "llama": lambda t: t.LlamaConfig(**BASE, rope_theta=5e5),
        "llama3.1": lambda t: t.LlamaConfig(
            **BASE,
            rope_theta=5e5,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 128,
            },
        ),
        "llama3.2-tied": lambda t: t.LlamaConfig(**BASE, tie_word_embeddings=True),
        "qwen2": lambda t: t.Qwen2Config(**BASE),
        "qwen3": lambda t: t.Qwen3Config(**BASE, head_dim=64),
        "mixtral": lambda t: t.MixtralConfig(**BASE, num_local_experts=4, num_experts_per_tok=2),
        "qwen3_moe": lambda t: t.Qwen3MoeConfig(
            **BASE, head_dim=64, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128, norm_topk_prob=True
        ),
    }


@pytest.fixture(scope="module")
def refs() -> Any:
    torch = pytest.importorskip("torch", reason="torch is the reference (GPU machine only)")
    transformers = pytest.importorskip("transformers", reason="transformers is the reference (GPU machine only)")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch, transformers


def _build(refs: Any, arch: str, directory: Path) -> Any:
    torch, transformers = refs
    torch.manual_seed(sum(map(ord, arch)))
    config = _configs()[arch](transformers)
    config.initializer_range = 0.05  # larger than the default, so logits are not all near zero
    model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    with torch.no_grad():  # random norms too, so a wrong norm weight cannot hide
        for name, p in model.named_parameters():
            if "norm" in name or "ln_" in name:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(directory, safe_serialization=True)
    return model.cuda().eval()


def _rel(ours: np.ndarray[Any, Any], ref: np.ndarray[Any, Any]) -> float:
    return float(np.max(np.abs(ours.astype(np.float64) - ref.astype(np.float64))) / np.max(np.abs(ref)))


@pytest.mark.parametrize("arch", list(_configs()))
def test_fp32_logits_and_greedy_match_transformers(refs: Any, arch: str, tmp_path: Path) -> None:
    torch, _ = refs
    import pygpukit.llm as llm

    reference = _build(refs, arch, tmp_path)
    model = llm.load(tmp_path, dtype="float32", progress=False)
    assert model.spec.name == ("llama" if arch.startswith("llama") else arch)
    rng = np.random.default_rng(0)
    for seq in (1, 17, 300):
        ids = rng.integers(0, 512, size=(2, seq), dtype=np.int64)
        with torch.no_grad():
            ref = reference(torch.from_numpy(ids).cuda()).logits.float().cpu().numpy()
        ours = model.forward(ids.astype(np.int32)).to_numpy()
        assert _rel(ours, ref) < FP32_RTOL, (arch, seq, _rel(ours, ref))

    # 32 decode steps over the KV cache, fed the same tokens as the reference.
    prompt = rng.integers(0, 512, size=(1, 17), dtype=np.int64)
    steps = rng.integers(0, 512, size=32, dtype=np.int64)
    with torch.no_grad():
        full = np.concatenate([prompt, steps[None, :]], axis=1)
        ref = reference(torch.from_numpy(full).cuda()).logits.float().cpu().numpy()[0, 16:]
    from pygpukit import from_numpy

    state = model.new_state(1, 64)
    got = [model.prefill(from_numpy(prompt.astype(np.int32)), state).to_numpy()[0]]
    for token in steps:
        got.append(model.decode_step(from_numpy(np.array([token], np.int32)), state).to_numpy()[0])
    assert _rel(np.stack(got), ref) < FP32_RTOL, (arch, "decode", _rel(np.stack(got), ref))

    # Identical greedy continuations of 32 tokens.
    expected = prompt[0].tolist()
    with torch.no_grad():  # greedy by full recomputation: no cache, no generation config involved
        for _ in range(32):
            logits = reference(torch.tensor([expected], device="cuda")).logits[0, -1]
            expected.append(int(torch.argmax(logits)))
    ours_ids = model.generate(prompt[0].tolist(), max_new_tokens=32, temperature=0, ignore_eos=True)
    assert ours_ids == expected


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gpt2", "mixtral"])
def test_bf16_logits_within_bounds(refs: Any, arch: str, tmp_path: Path) -> None:
    torch, _ = refs
    import pygpukit.llm as llm

    reference = _build(refs, arch, tmp_path)
    model = llm.load(tmp_path, dtype="bfloat16", progress=False)
    ids = np.random.default_rng(1).integers(0, 512, size=(1, 33), dtype=np.int64)
    with torch.no_grad():
        ref = reference(torch.from_numpy(ids).cuda()).logits.float().cpu().numpy()
    ours = model.forward(ids.astype(np.int32)).to_numpy().astype(np.float32)
    assert _rel(ours, ref) < BF16_RTOL, (arch, _rel(ours, ref))


def test_batched_generation_equals_one_by_one(refs: Any, tmp_path: Path) -> None:
    import pygpukit.llm as llm

    _build(refs, "qwen2", tmp_path)
    model = llm.load(tmp_path, dtype="float32", progress=False)
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, 512, size=n).tolist() for n in (3, 11, 7)]
    batch = model.generate(prompts, max_new_tokens=12, temperature=0, ignore_eos=True)
    for prompt, row in zip(prompts, batch, strict=True):
        assert model.generate(prompt, max_new_tokens=12, temperature=0, ignore_eos=True) == row


def test_same_seed_same_tokens(refs: Any, tmp_path: Path) -> None:
    import pygpukit.llm as llm

    _build(refs, "llama", tmp_path)
    model = llm.load(tmp_path, dtype="bfloat16", progress=False)
    prompt = [5, 6, 7, 8]
    a = model.generate(prompt, max_new_tokens=24, temperature=0.9, top_k=40, top_p=0.95, seed=7, ignore_eos=True)
    b = model.generate(prompt, max_new_tokens=24, temperature=0.9, top_k=40, top_p=0.95, seed=7, ignore_eos=True)
    c = model.generate(prompt, max_new_tokens=24, temperature=0.9, top_k=40, top_p=0.95, seed=8, ignore_eos=True)
    assert a == b
    assert a != c


def test_a_decode_step_reads_back_only_the_sampled_tokens(refs: Any, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Two generations that differ only in length: the extra steps cost exactly one device-to-host copy
    each (the sampled ids) and no stream, event or device synchronisation from Python."""
    from collections import Counter

    import pygpukit.llm as llm
    from pygpukit.core.backend import native_module

    _build(refs, "qwen3", tmp_path)
    model = llm.load(tmp_path, dtype="bfloat16", progress=False)
    native = native_module()
    counts: Counter[str] = Counter()
    for name in ("memcpy_pageable_dtoh", "stream_synchronize", "device_synchronize", "event_synchronize"):
        original = getattr(native, name)

        def counted(*args: Any, _name: str = name, _original: Any = original) -> Any:
            counts[_name] += 1
            return _original(*args)

        monkeypatch.setattr(native, name, counted)
    kwargs: dict[str, Any] = {"temperature": 0.8, "top_k": 20, "seed": 3, "ignore_eos": True}
    model.generate([1, 2, 3], max_new_tokens=4, **kwargs)  # compiles every kernel
    counts.clear()
    model.generate([1, 2, 3], max_new_tokens=8, **kwargs)
    short = Counter(counts)
    counts.clear()
    model.generate([1, 2, 3], max_new_tokens=24, **kwargs)
    extra = counts - short
    assert dict(extra) == {"memcpy_pageable_dtoh": 16}, (short, counts)
