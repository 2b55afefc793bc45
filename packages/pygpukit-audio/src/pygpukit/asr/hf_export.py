"""Whisper weights in transformers' layout: the names and tensors of ``WhisperForConditionalGeneration``
from pygpukit.asr's layout (so from a CTranslate2 model.bin, through :func:`~pygpukit.asr.weights.load_ct2`),
its configuration, and a ``model.safetensors`` + ``config.json`` writer (NumPy only).

The mapping (``i`` a layer; CTranslate2 name -> ours -> transformers'):

- ``encoder/conv{1,2}/{weight,bias}`` -> ``enc.conv{1,2}.{w,b}`` -> ``model.encoder.conv{1,2}.{weight,bias}``;
  ``encoder/position_encodings/encodings`` -> ``enc.pos`` -> ``model.encoder.embed_positions.weight``;
  ``encoder/layer_norm/{gamma,beta}`` -> ``enc.ln.{g,b}`` -> ``model.encoder.layer_norm.{weight,bias}``;
- ``decoder/embeddings/weight`` -> ``dec.embed`` -> ``model.decoder.embed_tokens.weight`` and the tied
  ``proj_out.weight``; ``decoder/position_encodings/encodings`` -> ``dec.pos`` ->
  ``model.decoder.embed_positions.weight``; ``decoder/layer_norm`` -> ``model.decoder.layer_norm``;
- per layer ``{side}/layer_i/self_attention/linear_0`` (fused q, k, v) -> ``{enc,dec}.i.qkv`` -> the three
  ``model.{side}.layers.i.self_attn.{q,k,v}_proj`` (``k_proj`` has no bias: ours must be zero),
  ``.../self_attention/linear_1`` -> ``out`` -> ``self_attn.out_proj``, ``.../self_attention/layer_norm`` ->
  ``attn_ln`` -> ``self_attn_layer_norm``; decoder cross-attention ``attention/linear_0`` (q) and
  ``linear_1`` (fused k, v) -> ``cross_q``, ``cross_kv`` -> ``encoder_attn.{q,k,v}_proj``, ``linear_2`` ->
  ``cross_out`` -> ``encoder_attn.out_proj``, ``attention/layer_norm`` -> ``cross_ln`` ->
  ``encoder_attn_layer_norm``; ``ffn/linear_{0,1}`` -> ``fc{1,2}`` -> ``fc{1,2}``, ``ffn/layer_norm`` ->
  ``mlp_ln`` -> ``final_layer_norm``.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from .ct2 import ModelFormatError
from .weights import WhisperConfig, check_weights, load_ct2

__all__ = ["ct2_to_transformers", "save_transformers", "transformers_config", "transformers_state_dict"]

Array = np.ndarray[Any, Any]


def transformers_config(config: WhisperConfig, **extra: Any) -> dict[str, Any]:
    """The ``transformers.WhisperConfig`` keyword arguments of ``config`` (English-only token ids unless
    ``extra`` overrides them; ``extra`` is merged last)."""
    eot = 50257 if config.multilingual else 50256  # <|endoftext|>; <|startoftranscript|> follows it
    out: dict[str, Any] = {
        "vocab_size": config.n_vocab, "num_mel_bins": config.n_mels, "d_model": config.d_model,
        "encoder_layers": config.encoder_layers, "decoder_layers": config.decoder_layers,
        "encoder_attention_heads": config.encoder_heads, "decoder_attention_heads": config.decoder_heads,
        "encoder_ffn_dim": 4 * config.d_model, "decoder_ffn_dim": 4 * config.d_model,
        "max_source_positions": config.n_audio_ctx, "max_target_positions": config.n_text_ctx,
        "decoder_start_token_id": eot + 1, "eos_token_id": eot, "pad_token_id": eot, "bos_token_id": eot,
        "activation_function": "gelu", "scale_embedding": False, "tie_word_embeddings": True,
    }  # fmt: skip
    out.update(extra)
    return out


def transformers_state_dict(weights: dict[str, Array], config: WhisperConfig) -> dict[str, Array]:
    """pygpukit.asr's weights -> ``WhisperForConditionalGeneration``'s state dict (float32 NumPy arrays)."""
    check_weights(config, weights, "transformers_state_dict")
    d = config.d_model
    t: dict[str, Array] = {"proj_out.weight": weights["dec.embed"]}
    top = {"conv1.weight": "enc.conv1.w", "conv1.bias": "enc.conv1.b", "conv2.weight": "enc.conv2.w",
           "conv2.bias": "enc.conv2.b", "embed_positions.weight": "enc.pos", "layer_norm.weight": "enc.ln.g",
           "layer_norm.bias": "enc.ln.b"}  # fmt: skip
    for name, ours in top.items():
        t["model.encoder." + name] = weights[ours]
    for name, ours in (("embed_tokens.weight", "dec.embed"), ("embed_positions.weight", "dec.pos"),
                       ("layer_norm.weight", "dec.ln.g"), ("layer_norm.bias", "dec.ln.b")):  # fmt: skip
        t["model.decoder." + name] = weights[ours]
    for side, count in (("encoder", config.encoder_layers), ("decoder", config.decoder_layers)):
        for i in range(count):
            p, o = f"model.{side}.layers.{i}.", f"{side[:3]}.{i}."
            blocks = [("self_attn", "qkv", "", "out", "attn_ln", "self_attn_layer_norm")]
            if side == "decoder":
                blocks.append(("encoder_attn", "cross_kv", "cross_q", "cross_out", "cross_ln",
                               "encoder_attn_layer_norm"))  # fmt: skip
            for attn, fused, query, out, ln, ln_name in blocks:
                w, b = weights[o + fused + ".w"], weights[o + fused + ".b"]
                if query:
                    w = np.concatenate([weights[o + query + ".w"], w])
                    b = np.concatenate([weights[o + query + ".b"], b])
                if np.any(b[d : 2 * d] != 0):
                    raise ModelFormatError(f"{o}{fused}: transformers' k_proj has no bias, but this key bias is "
                                           f"not zero (max |b| {np.abs(b[d : 2 * d]).max():.3g})")  # fmt: skip
                for j, x in enumerate("qkv"):
                    t[f"{p}{attn}.{x}_proj.weight"] = w[j * d : (j + 1) * d]
                    if x != "k":
                        t[f"{p}{attn}.{x}_proj.bias"] = b[j * d : (j + 1) * d]
                t[f"{p}{attn}.out_proj.weight"] = weights[o + out + ".w"]
                t[f"{p}{attn}.out_proj.bias"] = weights[o + out + ".b"]
                t[f"{p}{ln_name}.weight"], t[f"{p}{ln_name}.bias"] = weights[o + ln + ".g"], weights[o + ln + ".b"]
            for fc in ("fc1", "fc2"):
                t[f"{p}{fc}.weight"], t[f"{p}{fc}.bias"] = weights[o + fc + ".w"], weights[o + fc + ".b"]
            t[f"{p}final_layer_norm.weight"] = weights[o + "mlp_ln.g"]
            t[f"{p}final_layer_norm.bias"] = weights[o + "mlp_ln.b"]
    return {k: np.ascontiguousarray(v, np.float32) for k, v in t.items()}


def ct2_to_transformers(directory: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Array]]:
    """A CTranslate2 Whisper directory (model.bin) -> (transformers config kwargs, state dict)."""
    config, weights = load_ct2(directory)
    return transformers_config(config), transformers_state_dict(weights, config)


def save_transformers(directory: str | os.PathLike[str], weights: dict[str, Array], config: WhisperConfig) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (float32; ``proj_out.weight`` left out, tied as
    transformers saves it) of a WhisperForConditionalGeneration into ``directory``; returns it."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v for k, v in transformers_state_dict(weights, config).items() if k != "proj_out.weight"}
    header: dict[str, Any] = {}
    offset = 0
    for name, value in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(value.shape), "data_offsets": [offset, offset + value.nbytes]}
        offset += value.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(folder / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for value in tensors.values():
            f.write(value.astype("<f4").tobytes())
    cfg = {"architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper", **transformers_config(config)}
    (folder / "config.json").write_text(json.dumps(cfg, indent=1) + "\n", encoding="utf-8")
    return folder
