"""Fuzz target: a checkpoint's ``config.json`` (pygpukit.llm.config: ``load_hf_config``, ``config_from_hf``).

Contract: any file gives a dict or ModelConfigError from ``load_hf_config``, and any dict a validated
TransformerConfig or ModelConfigError from ``config_from_hf``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import instrumented, main, scratch_dir

with instrumented("pygpukit.llm.config"):
    from pygpukit.llm.config import ModelConfigError, config_from_hf, load_hf_config

ERRORS = (ModelConfigError,)
_DIR = scratch_dir("model-config")

_LLAMA = {
    "model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True, "bos_token_id": 1,
    "eos_token_id": [2, 3], "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
}  # fmt: skip
_GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 100, "n_positions": 128,
         "layer_norm_epsilon": 1e-5, "eos_token_id": 0}  # fmt: skip
_QWEN3_MOE = {
    "model_type": "qwen3_moe", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
    "head_dim": 16, "num_hidden_layers": 1, "intermediate_size": 128, "moe_intermediate_size": 32,
    "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 100, "norm_topk_prob": True,
}  # fmt: skip
_NESTED = {"model_type": "mistral3", "text_config": {**_LLAMA, "model_type": "mistral", "partial_rotary_factor": 0.5}}


def seeds() -> list[bytes]:
    return [json.dumps(c, indent=1).encode() for c in (_LLAMA, _GPT2, _QWEN3_MOE, _NESTED)] + [b"[" * 5000]


def one_input(data: bytes) -> None:
    (_DIR / "config.json").write_bytes(data)
    try:
        config = load_hf_config(_DIR)
    except ModelConfigError:
        return
    assert isinstance(config, dict)
    try:
        parsed = config_from_hf(config)
    except ModelConfigError:
        return
    assert parsed.num_heads % parsed.num_kv_heads == 0
    assert parsed.q_size > 0
    assert parsed.kv_size > 0


if __name__ == "__main__":
    main("model_config", one_input, seeds)
