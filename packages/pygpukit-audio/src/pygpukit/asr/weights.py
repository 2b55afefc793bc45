"""Whisper weights from a CTranslate2 model directory or a Hugging Face safetensors checkpoint, mapped to one
layout (NumPy float32 arrays) and checked against the configuration they imply.

Names of the common layout (``i`` is the layer): ``enc.conv1.w`` (d, n_mels, 3), ``enc.conv2.w`` (d, d, 3)
and biases, ``enc.pos`` (n_audio_ctx, d); per encoder layer ``enc.i.attn_ln.{g,b}``, ``enc.i.qkv.{w,b}``
(3d, d) with a zero key bias, ``enc.i.out.{w,b}``, ``enc.i.mlp_ln.{g,b}``, ``enc.i.fc1.{w,b}``,
``enc.i.fc2.{w,b}``; ``enc.ln.{g,b}``. Decoder: ``dec.embed`` (n_vocab, d) (also the output projection),
``dec.pos`` (n_text_ctx, d), per layer the same self-attention and MLP names plus ``dec.i.cross_ln.{g,b}``,
``dec.i.cross_q.{w,b}``, ``dec.i.cross_kv.{w,b}`` (2d, d), ``dec.i.cross_out.{w,b}``; ``dec.ln.{g,b}``.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .ct2 import ModelFormatError, read_model_bin

__all__ = ["WhisperConfig", "load_ct2", "load_pretrained", "load_safetensors", "parse_safetensors"]

Array = np.ndarray[Any, Any]
HEAD_DIM = 64


@dataclass(frozen=True)
class WhisperConfig:
    """The dimensions of a Whisper model (every released size has 64-wide attention heads)."""

    n_mels: int
    n_audio_ctx: int
    d_model: int
    encoder_layers: int
    encoder_heads: int
    n_vocab: int
    n_text_ctx: int
    decoder_layers: int
    decoder_heads: int
    alignment_heads: tuple[tuple[int, int], ...] = field(default=())

    @property
    def multilingual(self) -> bool:
        return self.n_vocab >= 51865


def _f32(x: Array) -> Array:
    return np.ascontiguousarray(x, dtype=np.float32)


def _layer_names(prefix: str, cross: bool) -> list[str]:
    names = ["attn_ln.g", "attn_ln.b", "qkv.w", "qkv.b", "out.w", "out.b", "mlp_ln.g", "mlp_ln.b", "fc1.w",
             "fc1.b", "fc2.w", "fc2.b"]  # fmt: skip
    if cross:
        names += ["cross_ln.g", "cross_ln.b", "cross_q.w", "cross_q.b", "cross_kv.w", "cross_kv.b", "cross_out.w",
                  "cross_out.b"]  # fmt: skip
    return [f"{prefix}.{n}" for n in names]


def expected_shapes(c: WhisperConfig) -> dict[str, tuple[int, ...]]:
    d, ff = c.d_model, 4 * c.d_model
    layer = {"attn_ln.g": (d,), "attn_ln.b": (d,), "qkv.w": (3 * d, d), "qkv.b": (3 * d,), "out.w": (d, d),
             "out.b": (d,), "mlp_ln.g": (d,), "mlp_ln.b": (d,), "fc1.w": (ff, d), "fc1.b": (ff,), "fc2.w": (d, ff),
             "fc2.b": (d,), "cross_ln.g": (d,), "cross_ln.b": (d,), "cross_q.w": (d, d), "cross_q.b": (d,),
             "cross_kv.w": (2 * d, d), "cross_kv.b": (2 * d,), "cross_out.w": (d, d), "cross_out.b": (d,)}  # fmt: skip
    shapes: dict[str, tuple[int, ...]] = {
        "enc.conv1.w": (d, c.n_mels, 3), "enc.conv1.b": (d,), "enc.conv2.w": (d, d, 3), "enc.conv2.b": (d,),
        "enc.pos": (c.n_audio_ctx, d), "enc.ln.g": (d,), "enc.ln.b": (d,), "dec.embed": (c.n_vocab, d),
        "dec.pos": (c.n_text_ctx, d), "dec.ln.g": (d,), "dec.ln.b": (d,),
    }  # fmt: skip
    for i in range(c.encoder_layers):
        for name in _layer_names(f"enc.{i}", False):
            shapes[name] = layer[name.split(".", 2)[2]]
    for i in range(c.decoder_layers):
        for name in _layer_names(f"dec.{i}", True):
            shapes[name] = layer[name.split(".", 2)[2]]
    return shapes


def check_weights(config: WhisperConfig, weights: dict[str, Array], source: str) -> None:
    """Every expected tensor is present with its shape and finite values, or ModelFormatError names it."""
    if config.d_model % HEAD_DIM or config.d_model // HEAD_DIM not in (config.encoder_heads,):
        raise ModelFormatError(f"d_model {config.d_model} with {config.encoder_heads} heads is not 64-wide heads",
                               path=source)  # fmt: skip
    for name, shape in expected_shapes(config).items():
        if name not in weights:
            raise ModelFormatError(f"missing tensor {name}", path=source)
        if weights[name].shape != shape:
            raise ModelFormatError(f"tensor {name} has shape {weights[name].shape}, expected {shape}", path=source)
        if not np.isfinite(weights[name]).all():
            raise ModelFormatError(f"tensor {name} has non-finite values", path=source)


# -- CTranslate2 -----------------------------------------------------------------------------------
_CT2_LAYER = {
    "self_attention/layer_norm/gamma": "attn_ln.g", "self_attention/layer_norm/beta": "attn_ln.b",
    "self_attention/linear_0/weight": "qkv.w", "self_attention/linear_0/bias": "qkv.b",
    "self_attention/linear_1/weight": "out.w", "self_attention/linear_1/bias": "out.b",
    "ffn/layer_norm/gamma": "mlp_ln.g", "ffn/layer_norm/beta": "mlp_ln.b",
    "ffn/linear_0/weight": "fc1.w", "ffn/linear_0/bias": "fc1.b", "ffn/linear_1/weight": "fc2.w",
    "ffn/linear_1/bias": "fc2.b", "attention/layer_norm/gamma": "cross_ln.g", "attention/layer_norm/beta": "cross_ln.b",
    "attention/linear_0/weight": "cross_q.w", "attention/linear_0/bias": "cross_q.b",
    "attention/linear_1/weight": "cross_kv.w", "attention/linear_1/bias": "cross_kv.b",
    "attention/linear_2/weight": "cross_out.w", "attention/linear_2/bias": "cross_out.b",
}  # fmt: skip


def _count_layers(names: Any, prefix: str) -> int:
    found = set()
    for name in names:
        if name.startswith(prefix):
            head = name[len(prefix) :].split("/" if "/" in name else ".", 1)[0]
            if head.isdigit():
                found.add(int(head))
    count = len(found)
    if found != set(range(count)):
        raise ModelFormatError(f"layers {sorted(found)} under {prefix!r} are not numbered 0..{count - 1}")
    return count


def load_ct2(directory: str | os.PathLike[str]) -> tuple[WhisperConfig, dict[str, Array]]:
    """Read ``model.bin`` (and ``config.json`` when present) of a CTranslate2 Whisper directory."""
    folder = Path(directory)
    path = folder / "model.bin"
    model = read_model_bin(path)
    if model.spec and model.spec != "WhisperSpec":
        raise ModelFormatError(f"the model is a {model.spec}, not a WhisperSpec", path=str(path))
    names = list(model.variables) + list(model.aliases)
    n_enc = _count_layers(names, "encoder/layer_")
    n_dec = _count_layers(names, "decoder/layer_")
    w: dict[str, Array] = {
        "enc.conv1.w": model.get("encoder/conv1/weight"), "enc.conv1.b": model.get("encoder/conv1/bias"),
        "enc.conv2.w": model.get("encoder/conv2/weight"), "enc.conv2.b": model.get("encoder/conv2/bias"),
        "enc.pos": model.get("encoder/position_encodings/encodings"),
        "enc.ln.g": model.get("encoder/layer_norm/gamma"), "enc.ln.b": model.get("encoder/layer_norm/beta"),
        "dec.embed": model.get("decoder/embeddings/weight"),
        "dec.pos": model.get("decoder/position_encodings/encodings"),
        "dec.ln.g": model.get("decoder/layer_norm/gamma"), "dec.ln.b": model.get("decoder/layer_norm/beta"),
    }  # fmt: skip
    for side, count in (("encoder", n_enc), ("decoder", n_dec)):
        short = side[:3]
        for i in range(count):
            for ct2_name, ours in _CT2_LAYER.items():
                full = f"{side}/layer_{i}/{ct2_name}"
                if full in model:
                    w[f"{short}.{i}.{ours}"] = model.get(full)
    w = {k: _f32(v) for k, v in w.items()}
    for key in ("enc.pos", "dec.embed", "dec.pos"):
        if w[key].ndim != 2:
            raise ModelFormatError(f"{key} has shape {w[key].shape}, expected (rows, d_model)", path=str(path))
    if "decoder/projection/weight" in model:
        projection = model.get("decoder/projection/weight")
        if projection.shape != w["dec.embed"].shape or not np.array_equal(projection, w["dec.embed"]):
            raise ModelFormatError("the output projection is not tied to the embedding", path=str(path))
    try:
        heads = int(model.scalar("encoder/num_heads", w["enc.pos"].shape[1] // HEAD_DIM))
        dec_heads = int(model.scalar("decoder/num_heads", heads))
    except (ValueError, OverflowError) as exc:  # NaN or infinite head counts (ModelFormatError passes)
        if isinstance(exc, ModelFormatError):
            raise
        raise ModelFormatError(f"the head counts are not integers: {exc}", path=str(path)) from exc
    alignment: tuple[tuple[int, int], ...] = ()
    cfg_path = folder / "config.json"
    if cfg_path.is_file():
        try:
            raw = json.loads(cfg_path.read_text(encoding="utf-8"))
            if not isinstance(raw, dict):
                raise TypeError(f"a JSON {type(raw).__name__}, not an object")
            alignment = tuple((int(a), int(b)) for a, b in raw.get("alignment_heads", ()))
        except (ValueError, TypeError, OverflowError) as exc:  # OverflowError: int(Infinity)
            raise ModelFormatError(f"config.json is malformed: {exc}", path=str(cfg_path)) from exc
    conv1 = w["enc.conv1.w"]
    if conv1.ndim != 3:
        raise ModelFormatError(f"encoder/conv1/weight has shape {conv1.shape}, expected (d, n_mels, 3)", path=str(path))
    config = WhisperConfig(
        n_mels=conv1.shape[1], n_audio_ctx=w["enc.pos"].shape[0], d_model=w["enc.pos"].shape[1],
        encoder_layers=n_enc, encoder_heads=heads, n_vocab=w["dec.embed"].shape[0], n_text_ctx=w["dec.pos"].shape[0],
        decoder_layers=n_dec, decoder_heads=dec_heads, alignment_heads=alignment,
    )  # fmt: skip
    check_weights(config, w, str(path))
    return config, w


# -- Hugging Face safetensors ----------------------------------------------------------------------
_ST_DTYPES: dict[str, np.dtype[Any]] = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "F64": np.dtype("<f8"),
}


def parse_safetensors(raw: bytes, path: str = "model.safetensors") -> dict[str, Array]:
    """The float tensors of a safetensors file (bf16 widened to float32), bounds-checked."""
    if len(raw) < 8:
        raise ModelFormatError(f"truncated: {len(raw)} bytes, the header length needs 8", path=path, offset=0)
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8 or n > 100 << 20:
        raise ModelFormatError(f"header length {n} exceeds the file ({len(raw)} bytes)", path=path, offset=0)
    try:
        header = json.loads(raw[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ModelFormatError(f"the header is not JSON: {exc}", path=path, offset=8) from exc
    if not isinstance(header, dict):
        raise ModelFormatError("the header is not a JSON object", path=path, offset=8)
    base, size = 8 + n, len(raw) - 8 - n
    out: dict[str, Array] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = meta["dtype"], tuple(int(s) for s in meta["shape"]), meta["data_offsets"]
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelFormatError(f"tensor {name!r} has a malformed entry", path=path, offset=8) from exc
        if not isinstance(dtype, str) or dtype not in _ST_DTYPES:
            raise ModelFormatError(f"tensor {name!r} has unsupported dtype {dtype}", path=path, offset=8)
        np_dtype = _ST_DTYPES[dtype]
        count = math.prod(shape)  # exact: NumPy's int64 product wraps
        if math.prod(d for d in shape if d) * np_dtype.itemsize >= 1 << 63:  # NumPy refuses it even when empty
            raise ModelFormatError(f"tensor {name!r} has shape {shape}, too large for an array", path=path, offset=8)
        offsets_ok = type(start) is int and type(end) is int and 0 <= start <= end <= size
        if min(shape, default=0) < 0 or not offsets_ok or end - start != count * np_dtype.itemsize:
            raise ModelFormatError(f"tensor {name!r} of shape {shape} and dtype {dtype} has data offsets "
                                   f"[{start}, {end}) that do not fit the {size}-byte data", path=path,
                                   offset=base + int(start) if isinstance(start, int) else 8)  # fmt: skip
        values = np.frombuffer(raw, dtype=np_dtype, count=count, offset=base + start).reshape(shape)
        if dtype == "BF16":
            values = (values.astype(np.uint32) << 16).view(np.float32)
        out[name] = values
    return out


def load_safetensors(directory: str | os.PathLike[str]) -> tuple[WhisperConfig, dict[str, Array]]:
    """A transformers WhisperForConditionalGeneration checkpoint: config.json + model.safetensors."""
    folder = Path(directory)
    path = folder / "model.safetensors"
    try:
        raw = path.read_bytes()
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except OSError as exc:
        raise ModelFormatError(f"cannot read: {exc.strerror or exc}", path=str(folder)) from exc
    except ValueError as exc:
        raise ModelFormatError(f"config.json is not JSON: {exc}", path=str(folder / "config.json")) from exc
    t = {k.removeprefix("model."): v for k, v in parse_safetensors(raw, str(path)).items()}
    try:
        config = WhisperConfig(
            n_mels=int(cfg["num_mel_bins"]), n_audio_ctx=int(cfg["max_source_positions"]), d_model=int(cfg["d_model"]),
            encoder_layers=int(cfg["encoder_layers"]), encoder_heads=int(cfg["encoder_attention_heads"]),
            n_vocab=int(cfg["vocab_size"]), n_text_ctx=int(cfg["max_target_positions"]),
            decoder_layers=int(cfg["decoder_layers"]), decoder_heads=int(cfg["decoder_attention_heads"]),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelFormatError(f"config.json lacks or mistypes {exc}", path=str(folder / "config.json")) from exc

    def get(name: str) -> Array:
        if name not in t:
            raise ModelFormatError(f"missing tensor {name}", path=str(path))
        return t[name]

    d = config.d_model
    w: dict[str, Array] = {
        "enc.conv1.w": get("encoder.conv1.weight"), "enc.conv1.b": get("encoder.conv1.bias"),
        "enc.conv2.w": get("encoder.conv2.weight"), "enc.conv2.b": get("encoder.conv2.bias"),
        "enc.pos": get("encoder.embed_positions.weight"), "enc.ln.g": get("encoder.layer_norm.weight"),
        "enc.ln.b": get("encoder.layer_norm.bias"), "dec.embed": get("decoder.embed_tokens.weight"),
        "dec.pos": get("decoder.embed_positions.weight"), "dec.ln.g": get("decoder.layer_norm.weight"),
        "dec.ln.b": get("decoder.layer_norm.bias"),
    }  # fmt: skip
    for side, count in (("encoder", config.encoder_layers), ("decoder", config.decoder_layers)):
        for i in range(count):
            p, o = f"{side}.layers.{i}.", f"{side[:3]}.{i}."
            for attn, ours in (("self_attn", ""), ("encoder_attn", "cross_")):
                if attn == "encoder_attn" and side == "encoder":
                    continue
                q, k, v = (get(f"{p}{attn}.{x}_proj.weight") for x in "qkv")
                qb, vb = get(f"{p}{attn}.q_proj.bias"), get(f"{p}{attn}.v_proj.bias")
                kb = t.get(f"{p}{attn}.k_proj.bias", np.zeros(d, np.float32))
                if ours:
                    w[o + "cross_q.w"], w[o + "cross_q.b"] = q, qb
                    w[o + "cross_kv.w"], w[o + "cross_kv.b"] = np.concatenate([k, v]), np.concatenate([kb, vb])
                else:
                    w[o + "qkv.w"], w[o + "qkv.b"] = np.concatenate([q, k, v]), np.concatenate([qb, kb, vb])
                w[o + ours + "out.w"] = get(f"{p}{attn}.out_proj.weight")
                w[o + ours + "out.b"] = get(f"{p}{attn}.out_proj.bias")
                ln = "self_attn_layer_norm" if not ours else "encoder_attn_layer_norm"
                w[o + ("attn_ln" if not ours else "cross_ln") + ".g"] = get(f"{p}{ln}.weight")
                w[o + ("attn_ln" if not ours else "cross_ln") + ".b"] = get(f"{p}{ln}.bias")
            for src, ours in (("fc1", "fc1"), ("fc2", "fc2")):
                w[o + ours + ".w"], w[o + ours + ".b"] = get(f"{p}{src}.weight"), get(f"{p}{src}.bias")
            w[o + "mlp_ln.g"], w[o + "mlp_ln.b"] = get(f"{p}final_layer_norm.weight"), get(f"{p}final_layer_norm.bias")
    w = {k: _f32(v) for k, v in w.items()}
    check_weights(config, w, str(path))
    return config, w


def load_pretrained(path: str | os.PathLike[str]) -> tuple[WhisperConfig, dict[str, Array]]:
    """A CTranslate2 directory (model.bin) or a transformers one (model.safetensors + config.json)."""
    folder = Path(path)
    if folder.is_file():
        folder = folder.parent
    if (folder / "model.bin").is_file():
        return load_ct2(folder)
    if (folder / "model.safetensors").is_file():
        return load_safetensors(folder)
    raise ModelFormatError("no model.bin (CTranslate2) or model.safetensors (transformers) in the directory",
                           path=str(folder))  # fmt: skip
