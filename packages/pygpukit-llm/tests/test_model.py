"""CausalTransformerModel on small random checkpoints (any backend; CI runs the CPU backend).

A float64 NumPy forward pass written from the architectures' definitions is the reference for the
logits; the cached decode path must agree with full recomputation; the same weights stored as a GGUF
file (with llama.cpp's Q/K row permutation) and as safetensors must give the same logits. The
comparisons with transformers' own model classes run on the GPU machine (test_models_gpu.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pygpukit as gp
import pygpukit.llm as llm

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTER = 96, 128, 2, 4, 2, 64, 160
EXPERTS, TOP_K = 4, 2


def _config(model_type: str, **extra: Any) -> dict[str, Any]:
    return dict(model_type=model_type, vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, intermediate_size=INTER,
                max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0, **extra)  # fmt: skip


def _weights(config: dict[str, Any], seed: int) -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)

    def w(*shape: int, scale: float = 0.08) -> np.ndarray[Any, Any]:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(n: int) -> np.ndarray[Any, Any]:
        return rng.uniform(0.5, 1.5, n).astype(np.float32)

    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    out = {"model.embed_tokens.weight": w(VOCAB, HIDDEN, scale=1.0), "model.norm.weight": norm(HIDDEN)}
    if not config.get("tie_word_embeddings"):
        out["lm_head.weight"] = w(VOCAB, HIDDEN)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out |= {p + "input_layernorm.weight": norm(HIDDEN), p + "post_attention_layernorm.weight": norm(HIDDEN),
                p + "self_attn.q_proj.weight": w(q, HIDDEN), p + "self_attn.k_proj.weight": w(kv, HIDDEN),
                p + "self_attn.v_proj.weight": w(kv, HIDDEN), p + "self_attn.o_proj.weight": w(HIDDEN, q),
                p + "mlp.gate_proj.weight": w(INTER, HIDDEN), p + "mlp.up_proj.weight": w(INTER, HIDDEN),
                p + "mlp.down_proj.weight": w(HIDDEN, INTER)}  # fmt: skip
        if config["model_type"] == "qwen2":
            out |= {p + "self_attn.q_proj.bias": w(q), p + "self_attn.k_proj.bias": w(kv),
                    p + "self_attn.v_proj.bias": w(kv)}  # fmt: skip
        if config["model_type"] in ("qwen3", "qwen3_moe"):
            out |= {p + "self_attn.q_norm.weight": norm(HEAD_DIM), p + "self_attn.k_norm.weight": norm(HEAD_DIM)}
        if config["model_type"] in ("mixtral", "qwen3_moe"):  # experts replace the dense MLP
            for name in ("gate_proj", "up_proj", "down_proj"):
                del out[p + f"mlp.{name}.weight"]
            mixtral = config["model_type"] == "mixtral"
            out[p + ("block_sparse_moe.gate.weight" if mixtral else "mlp.gate.weight")] = w(EXPERTS, HIDDEN, scale=0.5)
            for e in range(EXPERTS):
                b = f"{p}block_sparse_moe.experts.{e}." if mixtral else f"{p}mlp.experts.{e}."
                gate, up, down = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
                out |= {b + f"{gate}.weight": w(INTER, HIDDEN), b + f"{up}.weight": w(INTER, HIDDEN),
                        b + f"{down}.weight": w(HIDDEN, INTER)}  # fmt: skip
    return out


def _expert_names(config: dict[str, Any], p: str, e: int) -> tuple[str, str, str]:
    if config["model_type"] == "mixtral":
        b = f"{p}block_sparse_moe.experts.{e}."
        return b + "w1.weight", b + "w3.weight", b + "w2.weight"
    b = f"{p}mlp.experts.{e}."
    return b + "gate_proj.weight", b + "up_proj.weight", b + "down_proj.weight"


def _mlp(config: dict[str, Any], f: dict[str, np.ndarray[Any, Any]], p: str, x: np.ndarray[Any, Any]) -> Any:
    """The SwiGLU MLP, or the sparse MoE block: softmax over the router logits, the top 2 experts,
    their weights renormalised (Mixtral always, Qwen3-MoE with norm_topk_prob)."""

    def swiglu(gate: str, up: str, down: str, rows: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        g, u = rows @ f[gate].T, rows @ f[up].T
        out: np.ndarray[Any, Any] = (g / (1 + np.exp(-g)) * u) @ f[down].T
        return out

    if config["model_type"] not in ("mixtral", "qwen3_moe"):
        return swiglu(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", p + "mlp.down_proj.weight", x)
    router = f[p + ("block_sparse_moe.gate.weight" if config["model_type"] == "mixtral" else "mlp.gate.weight")]
    logits = x @ router.T
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        top = np.argsort(-probs[t], kind="stable")[:TOP_K]
        weights = probs[t, top]
        if config["model_type"] == "mixtral" or config.get("norm_topk_prob"):
            weights = weights / weights.sum()
        for e, wt in zip(top, weights, strict=True):
            out[t] += wt * swiglu(*_expert_names(config, p, int(e)), x[t : t + 1])[0]
    return out


def _save(directory: Path, config: dict[str, Any], weights: dict[str, np.ndarray[Any, Any]]) -> Path:
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    save_file(weights, str(directory / "model.safetensors"))
    return directory


def _reference(config: dict[str, Any], w: dict[str, np.ndarray[Any, Any]], ids: list[int]) -> np.ndarray[Any, Any]:
    """float64 logits of every position, straight from the LLaMA/Qwen definitions."""
    f = {k: v.astype(np.float64) for k, v in w.items()}
    eps, seq = config["rms_norm_eps"], len(ids)

    def rms(x: np.ndarray[Any, Any], g: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g

    inv = config["rope_theta"] ** (-np.arange(0, HEAD_DIM, 2) / HEAD_DIM)
    ang = np.arange(seq)[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        a, b = x[..., : HEAD_DIM // 2], x[..., HEAD_DIM // 2 :]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)

    h = f["model.embed_tokens.weight"][ids]
    mask = np.triu(np.full((seq, seq), -np.inf), 1)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        x = rms(h, f[p + "input_layernorm.weight"])

        def proj(name: str, x: np.ndarray[Any, Any] = x, p: str = p) -> np.ndarray[Any, Any]:
            out = x @ f[p + f"self_attn.{name}.weight"].T
            return out + f[p + f"self_attn.{name}.bias"] if p + f"self_attn.{name}.bias" in f else out

        q = proj("q_proj").reshape(seq, HEADS, HEAD_DIM)
        k = proj("k_proj").reshape(seq, KV_HEADS, HEAD_DIM)
        v = proj("v_proj").reshape(seq, KV_HEADS, HEAD_DIM)
        if p + "self_attn.q_norm.weight" in f:
            q, k = rms(q, f[p + "self_attn.q_norm.weight"]), rms(k, f[p + "self_attn.k_norm.weight"])
        q, k = rope(q), rope(k)
        k, v = np.repeat(k, HEADS // KV_HEADS, axis=1), np.repeat(v, HEADS // KV_HEADS, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(HEAD_DIM) + mask
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", probs, v).reshape(seq, HEADS * HEAD_DIM)
        h = h + attn @ f[p + "self_attn.o_proj.weight"].T
        h = h + _mlp(config, f, p, rms(h, f[p + "post_attention_layernorm.weight"]))
    head = f.get("lm_head.weight", f["model.embed_tokens.weight"])
    return rms(h, f["model.norm.weight"]) @ head.T


def _rel(ours: np.ndarray[Any, Any], ref: np.ndarray[Any, Any]) -> float:
    return float(np.max(np.abs(ours.astype(np.float64) - ref)) / np.max(np.abs(ref)))


MOE = {"num_local_experts": EXPERTS, "num_experts": EXPERTS, "num_experts_per_tok": TOP_K}


@pytest.mark.parametrize(
    ("model_type", "extra"),
    [("llama", {}), ("llama", {"tie_word_embeddings": True}), ("qwen2", {}), ("qwen3", {}), ("mixtral", MOE),
     ("qwen3_moe", MOE | {"norm_topk_prob": True}), ("qwen3_moe", MOE | {"norm_topk_prob": False})],
)  # fmt: skip
def test_logits_match_a_float64_reference(model_type: str, extra: dict[str, Any], tmp_path: Path) -> None:
    config = _config(model_type, **extra)
    weights = _weights(config, 0)
    model = llm.load(_save(tmp_path, config, weights), dtype="float32", progress=False)
    assert model.spec.name == model_type
    ids = np.random.default_rng(1).integers(0, VOCAB, 23).tolist()
    ours = model.forward(ids).to_numpy()
    assert ours.shape == (23, VOCAB)
    assert _rel(ours, _reference(config, weights, ids)) < 2e-5


def test_cached_decode_equals_recomputation(tmp_path: Path) -> None:
    config = _config("qwen3")
    model = llm.load(_save(tmp_path, config, _weights(config, 2)), progress=False)
    ids = np.random.default_rng(3).integers(0, VOCAB, 12).tolist()
    full = model.forward(ids).to_numpy()
    state = model.new_state(1, 16)
    got = [model.prefill(gp.from_numpy(np.array([ids[:5]], np.int32)), state).to_numpy()[0]]
    for token in ids[5:]:
        got.append(model.decode_step(gp.from_numpy(np.array([token], np.int32)), state).to_numpy()[0])
    assert _rel(np.stack(got), full[4:].astype(np.float64)) < 1e-5


def test_generate_batch_and_greedy(tmp_path: Path) -> None:
    config = _config("llama")
    weights = _weights(config, 4)
    model = llm.load(_save(tmp_path, config, weights), progress=False)
    prompts = [[3, 4, 5], [7, 8, 9, 10, 11, 12]]
    batch = model.generate(prompts, max_new_tokens=6, temperature=0, ignore_eos=True)
    for prompt, row in zip(prompts, batch, strict=True):
        single = model.generate(prompt, max_new_tokens=6, temperature=0, ignore_eos=True)
        assert row == single
        assert row[: len(prompt)] == prompt
        assert len(row) == len(prompt) + 6
        expected = list(prompt)
        for _ in range(6):  # greedy against the float64 reference, token by token
            expected.append(int(np.argmax(_reference(config, weights, expected)[-1])))
        assert single == expected
    stats = model.last_stats
    assert stats.new_tokens == 6
    assert stats.finish_reason == "length"


def test_stop_token_ids_and_errors(tmp_path: Path) -> None:
    config = _config("llama")
    model = llm.load(_save(tmp_path, config, _weights(config, 5)), progress=False)
    first = model.generate([1, 2], max_new_tokens=5, temperature=0, ignore_eos=True)
    stop = first[-1]
    stopped = model.generate([1, 2], max_new_tokens=5, temperature=0, stop_token_ids=[stop])
    assert stopped == first[: 3 + first[2:].index(stop)]  # the stopping token included, as transformers does
    assert model.last_stats.finish_reason == "stop"
    with pytest.raises(gp.core.errors.ArgumentError, match="outside the vocabulary"):
        model.generate([1, VOCAB], max_new_tokens=2)
    with pytest.raises(gp.core.errors.ArgumentError, match="tokenizer"):
        model.generate("text needs a tokenizer", max_new_tokens=2)
    with pytest.raises(gp.core.errors.ArgumentError, match="max_new_tokens"):
        model.generate([1], max_new_tokens=-1)
    with pytest.raises(TypeError, match=r"^generate\(\) got an unexpected keyword argument 'temprature'"):
        model.generate([1], max_new_tokens=2, temprature=0)
    with pytest.raises(TypeError, match=r"^generate_stream\(\) got an unexpected keyword argument 'topk'"):
        next(iter(model.generate_stream([1], max_new_tokens=2, topk=3)))


def _llama_cpp_permute(w: np.ndarray[Any, Any], heads: int) -> np.ndarray[Any, Any]:
    """llama.cpp's converter's row order for Q and K (written here from its documented effect)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_gguf_and_safetensors_give_the_same_logits(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    config = _config("llama")
    weights = _weights(config, 6)
    st_model = llm.load(_save(tmp_path / "st", config, weights), progress=False)
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTER)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)  # head_dim != hidden / heads here, as llama.cpp records it then
    writer.add_value_length(HEAD_DIM)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(VOCAB)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}  # fmt: skip
    per_layer = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
                 "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}  # fmt: skip
    for i in range(LAYERS):
        for hf, gg in per_layer.items():
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
    for hf, gg in names.items():
        tensor = weights[hf]
        if gg.endswith("attn_q.weight"):
            tensor = _llama_cpp_permute(tensor, HEADS)
        elif gg.endswith("attn_k.weight"):
            tensor = _llama_cpp_permute(tensor, KV_HEADS)
        writer.add_tensor(gg, np.ascontiguousarray(tensor))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    gguf_model = llm.load(path, progress=False)
    assert gguf_model.tokenizer is None
    assert gguf_model.spec.name == "llama"
    ids = [5, 17, 33, 2, 90, 41]
    assert np.array_equal(gguf_model.forward(ids).to_numpy(), st_model.forward(ids).to_numpy())


def _gpt2_config_weights() -> tuple[dict[str, Any], dict[str, np.ndarray[Any, Any]]]:
    """A random GPT-2 config and its weights in HF names (Conv1D weights stored (in, out)): hidden 128 in
    2 heads, LAYERS layers, 64 positions, biases everywhere."""
    rng = np.random.default_rng(8)
    heads, hidden, positions = 2, 128, 64

    def w(*shape: int, scale: float = 0.08) -> np.ndarray[Any, Any]:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    weights = {"transformer.wte.weight": w(VOCAB, hidden, scale=1.0), "transformer.wpe.weight": w(positions, hidden),
               "transformer.ln_f.weight": w(hidden) + 1, "transformer.ln_f.bias": w(hidden)}  # fmt: skip
    for i in range(LAYERS):
        p = f"transformer.h.{i}."
        weights |= {p + "ln_1.weight": w(hidden) + 1, p + "ln_1.bias": w(hidden), p + "ln_2.weight": w(hidden) + 1,
                    p + "ln_2.bias": w(hidden), p + "attn.c_attn.weight": w(hidden, 3 * hidden),
                    p + "attn.c_attn.bias": w(3 * hidden), p + "attn.c_proj.weight": w(hidden, hidden),
                    p + "attn.c_proj.bias": w(hidden), p + "mlp.c_fc.weight": w(hidden, 4 * hidden),
                    p + "mlp.c_fc.bias": w(4 * hidden), p + "mlp.c_proj.weight": w(4 * hidden, hidden),
                    p + "mlp.c_proj.bias": w(hidden)}  # fmt: skip
    config = {"model_type": "gpt2", "vocab_size": VOCAB, "n_embd": hidden, "n_layer": LAYERS, "n_head": heads,
              "n_positions": positions, "layer_norm_epsilon": 1e-5}  # fmt: skip
    return config, weights


def _gpt2_checkpoint(tmp_path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray[Any, Any]], Path]:
    """:func:`_gpt2_config_weights` saved as safetensors."""
    config, weights = _gpt2_config_weights()
    return config, weights, _save(tmp_path / "st", config, weights)


def _gpt2_gguf(path: Path, config: dict[str, Any], weights: dict[str, np.ndarray[Any, Any]], qtype: Any) -> Path:
    """The same GPT-2 in llama.cpp's GGUF layout (its converter's names; Conv1D weights transposed to (out,
    in) rows; the output head tied, so no output.weight); ``qtype`` for the linear weights."""
    gguf = pytest.importorskip("gguf")
    from gguf.quants import quantize

    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_block_count(config["n_layer"])
    writer.add_context_length(config["n_positions"])
    writer.add_embedding_length(config["n_embd"])
    writer.add_feed_forward_length(4 * config["n_embd"])
    writer.add_head_count(config["n_head"])
    writer.add_layer_norm_eps(config["layer_norm_epsilon"])
    writer.add_vocab_size(VOCAB)
    names = {"transformer.wte.weight": "token_embd.weight", "transformer.wpe.weight": "position_embd.weight",
             "transformer.ln_f.weight": "output_norm.weight", "transformer.ln_f.bias": "output_norm.bias"}  # fmt: skip
    per_layer = {"ln_1": "attn_norm", "ln_2": "ffn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
                 "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}  # fmt: skip
    for i in range(config["n_layer"]):
        for hf, gg in per_layer.items():
            for kind in ("weight", "bias"):
                names[f"transformer.h.{i}.{hf}.{kind}"] = f"blk.{i}.{gg}.{kind}"
    for hf, gg in names.items():
        tensor = weights[hf]
        if tensor.ndim == 2 and gg.startswith("blk."):
            tensor = np.ascontiguousarray(tensor.T)  # Conv1D (in, out) -> (out, in)
            if qtype != gguf.GGMLQuantizationType.F32:
                writer.add_tensor(gg, quantize(tensor, qtype), raw_dtype=qtype)
                continue
        writer.add_tensor(gg, np.ascontiguousarray(tensor))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_gpt2_gives_the_safetensors_logits(tmp_path: Path) -> None:
    """GPT-2 from llama.cpp's GGUF layout (fused attn_qkv split into Q, K, V; learned positions; LayerNorm
    biases; tied head): F32 equal to the safetensors checkpoint; Q8_0 linear weights kept in their blocks
    equal to the same file dequantized, and within Q8_0's error of the float model."""
    gguf = pytest.importorskip("gguf")
    config, weights, st_path = _gpt2_checkpoint(tmp_path)
    st_model = llm.load(st_path, progress=False)
    ids = [5, 17, 33, 2, 90, 41, 7]
    want = st_model.forward(ids).to_numpy()
    f32 = llm.load(_gpt2_gguf(tmp_path / "f32.gguf", config, weights, gguf.GGMLQuantizationType.F32), progress=False)
    assert f32.spec.name == "gpt2"
    assert f32.config.max_position_embeddings == config["n_positions"]
    np.testing.assert_allclose(f32.forward(ids).to_numpy(), want, rtol=1e-5, atol=1e-5)
    q_path = _gpt2_gguf(tmp_path / "q8.gguf", config, weights, gguf.GGMLQuantizationType.Q8_0)
    packed = llm.load(q_path, progress=False)
    assert type(packed.weights.layers[0].wq).__name__ == "QuantizedTensor"
    assert tuple(packed.weights.layers[0].wv.shape) == (128, 128)
    dense = llm.load(q_path, progress=False, keep_quantized=False)
    got, ref = packed.forward(ids).to_numpy(), dense.forward(ids).to_numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    assert np.abs(ref - want).max() < 0.05 * np.abs(want).max()
    assert packed.generate(ids, max_new_tokens=4, temperature=0) == dense.generate(ids, max_new_tokens=4, temperature=0)


def test_gguf_gpt2_refuses_a_wrong_qkv_shape(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    config, weights, _ = _gpt2_checkpoint(tmp_path)
    weights["transformer.h.0.attn.c_attn.weight"] = weights["transformer.h.0.attn.c_attn.weight"][:, :256]
    path = _gpt2_gguf(tmp_path / "bad.gguf", config, weights, gguf.GGMLQuantizationType.F32)
    with pytest.raises(llm.ModelConfigError, match="attn_qkv"):
        llm.load(path, progress=False)


def test_detect_model_spec_and_configs() -> None:
    assert llm.detect_model_spec(["model.layers.0.self_attn.q_proj.weight"]) is llm.LLAMA_SPEC
    assert llm.detect_model_spec(["model.layers.0.self_attn.q_proj.bias"] * 1 +
                                 ["model.layers.0.self_attn.q_proj.weight"]) is llm.QWEN2_SPEC  # fmt: skip
    assert llm.detect_model_spec(["model.layers.0.self_attn.q_norm.weight"]) is llm.QWEN3_SPEC
    assert llm.detect_model_spec(["h.0.attn.c_attn.weight"]) is llm.GPT2_SPEC
    assert llm.detect_model_spec(["model.layers.0.block_sparse_moe.gate.weight"]) is llm.MIXTRAL_SPEC
    moe = ["model.layers.0.self_attn.q_norm.weight", "model.layers.0.mlp.gate.weight",
           "model.layers.0.mlp.experts.0.up_proj.weight"]  # fmt: skip
    assert llm.detect_model_spec(moe) is llm.QWEN3_MOE_SPEC
    with pytest.raises(llm.ModelConfigError, match="no supported architecture"):
        llm.detect_model_spec(["encoder.weight"])
    with pytest.raises(llm.ModelConfigError, match="not a multiple"):
        llm.config_from_hf(_config("llama") | {"num_key_value_heads": 3})
    with pytest.raises(llm.ModelConfigError, match="not supported"):
        llm.config_from_hf({"model_type": "bert"})
    c = llm.config_from_hf(_config("llama") | {"rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 64}})  # fmt: skip
    assert c.rope_scaling is not None
    assert c.rope_scaling["rope_type"] == "llama3"


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    config = _config("llama")
    weights = _weights(config, 7)
    del weights["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(llm.MissingWeightError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        llm.load(_save(tmp_path, config, weights), progress=False)


def test_gpt2_matches_a_float64_reference(tmp_path: Path) -> None:
    """GPT-2: learned positions, LayerNorm with bias, Conv1D weights stored (in, out), fused QKV,
    GELU (tanh form), tied head."""
    config, weights = _gpt2_config_weights()
    heads, hidden = config["n_head"], config["n_embd"]
    model = llm.load(_save(tmp_path, config, weights), progress=False)
    assert model.spec is llm.GPT2_SPEC
    ids = [3, 50, 7, 7, 91, 0, 12]
    f = {k: v.astype(np.float64) for k, v in weights.items()}

    def ln(x: np.ndarray[Any, Any], name: str) -> np.ndarray[Any, Any]:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + 1e-5) * f[name + ".weight"] + f[name + ".bias"]

    seq, dim = len(ids), hidden // heads
    h = f["transformer.wte.weight"][ids] + f["transformer.wpe.weight"][:seq]
    mask = np.triu(np.full((seq, seq), -np.inf), 1)
    for i in range(LAYERS):
        p = f"transformer.h.{i}."
        qkv = ln(h, p + "ln_1") @ f[p + "attn.c_attn.weight"] + f[p + "attn.c_attn.bias"]
        q, k, v = (qkv[:, j * hidden : (j + 1) * hidden].reshape(seq, heads, dim) for j in range(3))
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(dim) + mask
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", probs, v).reshape(seq, hidden)
        h = h + attn @ f[p + "attn.c_proj.weight"] + f[p + "attn.c_proj.bias"]
        a = ln(h, p + "ln_2") @ f[p + "mlp.c_fc.weight"] + f[p + "mlp.c_fc.bias"]
        gelu = 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a**3)))
        h = h + gelu @ f[p + "mlp.c_proj.weight"] + f[p + "mlp.c_proj.bias"]
    ref = ln(h, "transformer.ln_f") @ f["transformer.wte.weight"].T
    assert _rel(model.forward(ids).to_numpy(), ref) < 2e-5
    # cached decode over learned positions equals recomputation
    state = model.new_state(1, 16)
    got = [model.prefill(gp.from_numpy(np.array([ids[:3]], np.int32)), state).to_numpy()[0]]
    for token in ids[3:]:
        got.append(model.decode_step(gp.from_numpy(np.array([token], np.int32)), state).to_numpy()[0])
    assert _rel(np.stack(got), ref[2:]) < 2e-5
