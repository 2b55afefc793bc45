"""Fuzz target: CTranslate2 ``model.bin`` files (pygpukit.asr.ct2), the Whisper weights mapped from them
(pygpukit.asr.weights: ``load_ct2``, with an optional ``config.json``) and the safetensors reader of
pygpukit.asr.weights (``parse_safetensors``, for transformers checkpoints).

Contract: any bytes give a CT2Model whose every variable ``get`` and ``scalar`` answer, or
ModelFormatError; any model directory gives a checked (WhisperConfig, weights) or ModelFormatError; any
safetensors bytes give float arrays or ModelFormatError. The first input byte chooses the mode: bit 0
set, the rest is a model directory (``model.bin``, then after the marker below, if present,
``config.json``) loaded by ``load_ct2``; else bit 1 set, the rest is a safetensors file; else the rest is
``model.bin`` parsed from memory and every variable read back.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import checked, instrumented, main, scratch_dir

with instrumented("pygpukit.asr.ct2", "pygpukit.asr.weights"):
    from pygpukit.asr.ct2 import ModelFormatError, parse_model_bin
    from pygpukit.asr.weights import load_ct2, parse_safetensors

ERRORS = (ModelFormatError,)
_DIR = scratch_dir("ct2")
_CONFIG = b"\n--config.json--\n"
_TYPE_IDS = {"float32": 0, "int8": 1, "int16": 2, "int32": 3, "float16": 4}


def _string(text: str) -> bytes:
    raw = text.encode() + b"\0"
    return struct.pack("<H", len(raw)) + raw


def _model_bin(variables: dict[str, Any], aliases: dict[str, str], version: int = 6) -> bytes:
    out = [struct.pack("<I", version), _string("WhisperSpec"), struct.pack("<I", 3), struct.pack("<I", len(variables))]
    for name, value in variables.items():
        arr = np.ascontiguousarray(value)
        out += [_string(name), struct.pack("<B", arr.ndim), struct.pack(f"<{arr.ndim}I", *arr.shape)]
        if version >= 4:
            out += [struct.pack("<B", _TYPE_IDS[arr.dtype.name]), struct.pack("<I", arr.nbytes)]
        else:
            out += [struct.pack("<B", arr.itemsize), struct.pack("<I", arr.size)]
        out.append(arr.tobytes())
    out.append(struct.pack("<I", len(aliases)))
    for alias, target in aliases.items():
        out += [_string(alias), _string(target)]
    return b"".join(out)


def _whisper(rng: np.random.Generator) -> dict[str, Any]:
    """The smallest Whisper that load_ct2 accepts: d_model 64 (one head), no layers, one mel, one position."""
    d = 64

    def f16(*shape: int) -> Any:
        return rng.standard_normal(shape).astype(np.float16)

    return {
        "encoder/num_heads": np.array(1, np.int16), "decoder/num_heads": np.array(1, np.int16),
        "encoder/conv1/weight": f16(d, 1, 3), "encoder/conv1/bias": f16(d),
        "encoder/conv2/weight": rng.integers(-127, 128, (d, d, 3)).astype(np.int8),
        "encoder/conv2/weight_scale": np.array(50.0, np.float32), "encoder/conv2/bias": f16(d),
        "encoder/position_encodings/encodings": f16(1, d), "encoder/layer_norm/gamma": f16(d),
        "encoder/layer_norm/beta": f16(d), "decoder/embeddings/weight": f16(2, d),
        "decoder/position_encodings/encodings": f16(1, d), "decoder/layer_norm/gamma": f16(d),
        "decoder/layer_norm/beta": f16(d),
    }  # fmt: skip


def seeds() -> list[bytes]:
    rng = np.random.default_rng(21)
    small: dict[str, Any] = {
        "a/weight": rng.standard_normal((3, 4)).astype(np.float16),
        "b/bias": rng.standard_normal(5).astype(np.float32),
        "n": np.array(6, np.int16),
        "q": rng.integers(-100, 100, (2, 2)).astype(np.int8),
        "q_scale": np.array([2.0, 4.0], np.float32),
        "i": np.arange(3, dtype=np.int32),
    }
    whisper = _whisper(rng)
    tied = {"decoder/projection/weight": "decoder/embeddings/weight"}
    config = b'{"alignment_heads": [[0, 0]]}'
    entries = {"w": {"dtype": "F16", "shape": [2, 3], "data_offsets": [0, 12]},
               "b": {"dtype": "BF16", "shape": [2], "data_offsets": [12, 16]}}  # fmt: skip
    header = json.dumps({"__metadata__": {"format": "pt"}, **entries}).encode()
    safetensors = struct.pack("<Q", len(header)) + header + rng.standard_normal(8).astype(np.float16).tobytes()
    return [
        b"\x02" + safetensors,
        b"\x00" + _model_bin(small, {"c/weight": "a/weight"}),
        b"\x00" + _model_bin({k: v for k, v in small.items() if v.dtype.itemsize in (1, 2, 4)}, {}, version=3),
        b"\x01" + _model_bin(whisper, tied),
        b"\x01" + _model_bin(whisper, tied) + _CONFIG + config,
    ]


def one_input(data: bytes) -> None:
    if not data:
        return
    raw = data[1:]
    if data[0] & 3 == 2:
        try:
            tensors = parse_safetensors(raw)
        except ModelFormatError:
            return
        assert all(value.dtype.kind == "f" for value in tensors.values())
        return
    if not data[0] & 1:
        try:
            model = parse_model_bin(raw)
        except ModelFormatError:
            return
        for name in [*model.variables, *model.aliases]:
            try:
                value = model.get(name)
            except ModelFormatError:
                continue
            assert isinstance(value, np.ndarray)
            checked(ERRORS, lambda: model.scalar(name))  # noqa: B023 - called at once
        return
    model_bin, _, config = raw.partition(_CONFIG)
    (_DIR / "model.bin").write_bytes(model_bin)
    config_path = _DIR / "config.json"
    if config:
        config_path.write_bytes(config)
    elif config_path.exists():
        config_path.unlink()
    try:
        whisper, weights = load_ct2(_DIR)
    except ModelFormatError:
        return
    assert whisper.d_model % 64 == 0
    assert all(value.dtype == np.float32 for value in weights.values())


if __name__ == "__main__":
    main("ct2", one_input, seeds)
