"""The compiled PyTorch reference of the LLM benchmark (benchmarks/reference/torch_decode.py) computes
what pygpukit.llm computes: on small random float32 checkpoints (LLaMA, LLaMA with tied embeddings,
llama3 RoPE scaling and a partial rotary dimension, Qwen2 with q/k/v biases, Qwen3 with q/k norms and
YaRN) its prefill logits equal pygpukit's within 1e-4 of their scale and its greedy tokens equal
``model.generate``'s, for one row and for a batch of two. Weights are copied bit for bit (bfloat16
too, fused QKV or not); quantized weights, MoE and GPT-2 models are refused by name. Runs eagerly on
the CPU simulation backend (compile=False); skipped where torch is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch reference decoder (benchmarks/reference) needs torch")

import pygpukit.llm as llm  # noqa: E402
import pygpukit.ops as ops  # noqa: E402

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTER = 80, 128, 2, 4, 2, 64, 160
PROMPT = [5, 17, 3, 40, 22, 9]
NEW_TOKENS = 16


def _load_reference() -> Any:
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "reference" / "torch_decode.py"
    spec = importlib.util.spec_from_file_location("_pygpukit_torch_reference", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


ref = _load_reference()

# name -> (model_type, extra config.json entries)
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", {}),
    "llama-tied-llama3-partial": ("llama", {
        "tie_word_embeddings": True, "partial_rotary_factor": 0.5,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 64},
    }),
    "qwen2-bias": ("qwen2", {}),
    "qwen3-qknorm-yarn": ("qwen3", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                      "original_max_position_embeddings": 32}}),
}  # fmt: skip


def _config(model_type: str, **extra: Any) -> dict[str, Any]:
    return dict(model_type=model_type, vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, intermediate_size=INTER,
                max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0, **extra)  # fmt: skip


def _weights(config: dict[str, Any], seed: int) -> dict[str, np.ndarray[Any, Any]]:
    """Random Hugging Face-named tensors for a dense LLaMA / Qwen2 / Qwen3 config, or a Mixtral one."""
    rng = np.random.default_rng(seed)

    def w(*shape: int, scale: float = 0.08) -> np.ndarray[Any, Any]:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(n: int) -> np.ndarray[Any, Any]:
        return rng.uniform(0.5, 1.5, n).astype(np.float32)

    kind = config["model_type"]
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    tied = bool(config.get("tie_word_embeddings"))
    # A tied head reads the embedding: a small one keeps the blocks' outputs (not the input token's own
    # embedding) deciding the next token.
    embed = w(VOCAB, HIDDEN, scale=0.05 if tied else 1.0)
    out = {"model.embed_tokens.weight": embed, "model.norm.weight": norm(HIDDEN)}
    if not tied:
        out["lm_head.weight"] = w(VOCAB, HIDDEN)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        out |= {p + "input_layernorm.weight": norm(HIDDEN), p + "post_attention_layernorm.weight": norm(HIDDEN),
                a + "q_proj.weight": w(q, HIDDEN), a + "k_proj.weight": w(kv, HIDDEN),
                a + "v_proj.weight": w(kv, HIDDEN), a + "o_proj.weight": w(HIDDEN, q)}  # fmt: skip
        if kind == "qwen2":
            out |= {a + "q_proj.bias": w(q), a + "k_proj.bias": w(kv), a + "v_proj.bias": w(kv)}
        if kind == "qwen3":
            out |= {a + "q_norm.weight": norm(HEAD_DIM), a + "k_norm.weight": norm(HEAD_DIM)}
        if kind == "mixtral":
            out[p + "block_sparse_moe.gate.weight"] = w(4, HIDDEN, scale=0.5)
            for e in range(4):
                b = f"{p}block_sparse_moe.experts.{e}."
                out |= {b + "w1.weight": w(INTER, HIDDEN), b + "w3.weight": w(INTER, HIDDEN),
                        b + "w2.weight": w(HIDDEN, INTER)}  # fmt: skip
        else:
            out |= {p + "mlp.gate_proj.weight": w(INTER, HIDDEN), p + "mlp.up_proj.weight": w(INTER, HIDDEN),
                    p + "mlp.down_proj.weight": w(HIDDEN, INTER)}  # fmt: skip
    return out


def _save(directory: Path, config: dict[str, Any], weights: dict[str, np.ndarray[Any, Any]]) -> Path:
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    save_file(weights, str(directory / "model.safetensors"))
    return directory


def _model(tmp_path: Path, variant: str = "llama", **load: Any) -> Any:
    model_type, extra = VARIANTS[variant]
    config = _config(model_type, **extra)
    return llm.load(_save(tmp_path / variant, config, _weights(config, 7)), progress=False, **load)


def _pygpukit_new_tokens(model: Any, prompts: list[list[int]]) -> list[list[int]]:
    out = model.generate(prompts, max_new_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    return [row[len(p) :] for row, p in zip(out, prompts, strict=True)]


def _relative_error(got: np.ndarray[Any, Any], expected: np.ndarray[Any, Any]) -> float:
    return float(np.max(np.abs(got - expected)) / np.max(np.abs(expected)))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_prefill_logits_and_greedy_tokens_equal_pygpukit(variant: str, tmp_path: Path) -> None:
    model = _model(tmp_path, variant)
    decoder = ref.TorchDecoder.from_pygpukit(model, max_seq_len=len(PROMPT) + NEW_TOKENS, compile=False)
    logits = decoder.logits([PROMPT]).numpy()
    expected = model.forward(np.asarray([PROMPT], np.int32)).to_numpy()
    assert logits.shape == expected.shape == (1, len(PROMPT), VOCAB)
    assert _relative_error(logits, expected) <= 1e-4
    tokens, stats = decoder.generate([PROMPT], NEW_TOKENS)
    assert tokens == _pygpukit_new_tokens(model, [PROMPT])
    assert set(stats) == {"ttft_s", "decode_s", "decode_tokens_per_s"}
    assert stats["ttft_s"] > 0
    assert stats["decode_tokens_per_s"] > 0
    # The cache of the last run is overwritten by the next one: the same call gives the same tokens.
    assert decoder.generate([PROMPT], NEW_TOKENS)[0] == tokens


@pytest.mark.parametrize("variant", ["llama", "qwen3-qknorm-yarn"])
def test_batch_of_two_equals_pygpukit(variant: str, tmp_path: Path) -> None:
    model = _model(tmp_path, variant)
    prompts = [PROMPT, [8, 2, 61, 33, 70, 1]]
    decoder = ref.TorchDecoder.from_pygpukit(model, max_seq_len=32, batch=2, compile=False)
    tokens, stats = decoder.generate(prompts, NEW_TOKENS)
    assert tokens == _pygpukit_new_tokens(model, prompts)
    assert tokens[0] != tokens[1]
    assert stats["decode_tokens_per_s"] > 0
    logits = decoder.logits(prompts).numpy()
    assert _relative_error(logits, model.forward(np.asarray(prompts, np.int32)).to_numpy()) <= 1e-4
    with pytest.raises(ValueError, match="equal lengths"):
        decoder.generate([PROMPT, PROMPT[:-1]], 4)
    with pytest.raises(ValueError, match="1 prompts for a batch of 2"):
        decoder.generate([PROMPT], 4)


def test_fused_qkv_views_copy_the_same_weights(tmp_path: Path) -> None:
    model = _model(tmp_path, "qwen2-bias")
    separate = ref.TorchDecoder.from_pygpukit(model, max_seq_len=24, compile=False)
    assert model.fuse_qkv() == LAYERS
    layer = model.weights.layers[0]
    assert layer.w_qkv is not None
    assert layer.b_qkv is not None
    fused = ref.TorchDecoder.from_pygpukit(model, max_seq_len=24, compile=False)
    for a, b in zip(separate.model.state_dict().values(), fused.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    qkv = fused.model.layers[0].w_qkv
    assert qkv.is_contiguous()
    assert np.array_equal(qkv[: HEADS * HEAD_DIM].numpy(), layer.wq.to_numpy())
    assert np.array_equal(fused.model.layers[0].b_qkv.numpy(), layer.b_qkv.to_numpy())
    assert fused.generate([PROMPT], 8)[0] == separate.generate([PROMPT], 8)[0]


def test_bfloat16_weights_arrive_bit_for_bit(tmp_path: Path) -> None:
    model = _model(tmp_path, "qwen3-qknorm-yarn", dtype="bfloat16")
    decoder = ref.TorchDecoder.from_pygpukit(model, max_seq_len=24, compile=False)
    assert decoder.dtype == torch.bfloat16
    block = decoder.model.layers[1]

    def bits(t: Any) -> np.ndarray[Any, Any]:
        return np.asarray(t.contiguous().view(torch.int16).numpy())

    layer = model.weights.layers[1]
    assert np.array_equal(bits(block.w_gate_up), layer.w_gate_up.to_numpy().view(np.int16))
    assert np.array_equal(bits(block.q_norm), layer.q_norm.to_numpy().view(np.int16))
    assert np.array_equal(bits(decoder.model.embed), model.weights.embed.to_numpy().view(np.int16))
    logits = decoder.logits([PROMPT]).numpy()
    expected = model.forward(np.asarray([PROMPT], np.int32)).to_numpy().astype(np.float32)
    assert _relative_error(logits, expected) <= 3e-2  # bfloat16 rounding of different summation orders


def test_rope_frequencies_equal_pygpukit_for_every_scaling_type() -> None:
    cases: list[dict[str, Any] | None] = [
        None,
        {"rope_type": "linear", "factor": 2.0},
        {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 64},
        {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 8192},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096},
        {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0,
         "mscale_all_dim": 0.707, "beta_fast": 16, "truncate": False},
    ]  # fmt: skip
    for scaling in cases:
        for head_dim, rotary in ((128, None), (64, 32)):
            got, factor = ref.rope_inv_freq(head_dim, 500000.0, rotary, scaling, 131072)
            expected, expected_factor = ops.rope_inv_freq(head_dim, 500000.0, rotary, scaling, seq_len=131072)
            np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12, err_msg=str(scaling))
            assert factor == pytest.approx(expected_factor, rel=1e-12)
    with pytest.raises(NotImplementedError, match="'longrope'"):
        ref.rope_inv_freq(64, 10000.0, None, {"rope_type": "longrope", "factor": 2.0})


def test_quantized_moe_and_gpt2_models_are_refused(tmp_path: Path) -> None:
    quantized = _model(tmp_path, "llama", quantize="q8_0")
    with pytest.raises(TypeError, match=r"(lm_head|layers\[\d+\]\.\w+) is a QuantizedTensor"):
        ref.TorchDecoder.from_pygpukit(quantized, max_seq_len=16, compile=False)
    config = _config("mixtral", num_local_experts=4, num_experts_per_tok=2)
    mixtral = llm.load(_save(tmp_path / "mixtral", config, _weights(config, 3)), progress=False)
    with pytest.raises(NotImplementedError, match="MoE"):
        ref.TorchDecoder.from_pygpukit(mixtral, max_seq_len=16, compile=False)
    rng = np.random.default_rng(5)
    gpt2 = {"transformer.wte.weight": rng.standard_normal((VOCAB, HIDDEN)), "transformer.wpe.weight":
            rng.standard_normal((32, HIDDEN)), "transformer.ln_f.weight": np.ones(HIDDEN),
            "transformer.ln_f.bias": np.zeros(HIDDEN)}  # fmt: skip
    for i in range(LAYERS):
        p = f"transformer.h.{i}."
        gpt2 |= {p + "ln_1.weight": np.ones(HIDDEN), p + "ln_1.bias": np.zeros(HIDDEN),
                 p + "ln_2.weight": np.ones(HIDDEN), p + "ln_2.bias": np.zeros(HIDDEN),
                 p + "attn.c_attn.weight": rng.standard_normal((HIDDEN, 3 * HIDDEN)),
                 p + "attn.c_attn.bias": np.zeros(3 * HIDDEN), p + "attn.c_proj.weight": np.eye(HIDDEN),
                 p + "attn.c_proj.bias": np.zeros(HIDDEN), p + "mlp.c_fc.weight": np.ones((HIDDEN, 4 * HIDDEN)),
                 p + "mlp.c_fc.bias": np.zeros(4 * HIDDEN), p + "mlp.c_proj.weight": np.ones((4 * HIDDEN, HIDDEN)),
                 p + "mlp.c_proj.bias": np.zeros(HIDDEN)}  # fmt: skip
    gpt2_config = {"model_type": "gpt2", "vocab_size": VOCAB, "n_embd": HIDDEN, "n_layer": LAYERS, "n_head": 2,
                   "n_positions": 32}  # fmt: skip
    weights = {k: v.astype(np.float32) for k, v in gpt2.items()}
    model = llm.load(_save(tmp_path / "gpt2", gpt2_config, weights), progress=False)
    with pytest.raises(NotImplementedError, match="GPT-2"):
        ref.TorchDecoder.from_pygpukit(model, max_seq_len=16, compile=False)


def test_argument_checks(tmp_path: Path) -> None:
    model = _model(tmp_path, "llama")
    with pytest.raises(ValueError, match="max_position_embeddings"):
        ref.TorchDecoder.from_pygpukit(model, max_seq_len=1000, compile=False)
    decoder = ref.TorchDecoder.from_pygpukit(model, max_seq_len=10, compile=False)
    with pytest.raises(ValueError, match="exceed max_seq_len"):
        decoder.generate([PROMPT], 5)
    with pytest.raises(ValueError, match="new_tokens"):
        decoder.generate([PROMPT], 0)
    tokens, stats = decoder.generate([PROMPT], 1)
    assert len(tokens[0]) == 1
    assert stats["decode_tokens_per_s"] == 0.0
