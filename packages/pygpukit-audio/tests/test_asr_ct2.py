"""The CTranslate2 model.bin reader, the safetensors reader and the weight loaders: round trips through a
writer of the format, the real tiny.en file, and typed errors with offsets for every truncation and
corruption."""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from pygpukit.asr.ct2 import ModelFormatError, parse_model_bin, read_model_bin
from pygpukit.asr.weights import WhisperConfig, load_ct2, load_pretrained, load_safetensors, parse_safetensors

_spec = importlib.util.spec_from_file_location("asr_reference", Path(__file__).with_name("asr_reference.py"))
assert _spec is not None
assert _spec.loader is not None
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)

SMALL = WhisperConfig(n_mels=80, n_audio_ctx=8, d_model=128, encoder_layers=1, encoder_heads=2, n_vocab=40,
                      n_text_ctx=6, decoder_layers=1, decoder_heads=2)  # fmt: skip


def _sample() -> tuple[bytes, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    variables = {
        "a/weight": rng.standard_normal((3, 4)).astype(np.float16),
        "b/bias": rng.standard_normal(5).astype(np.float32),
        "n": np.array(6, np.int16),
        "q": rng.integers(-100, 100, (2, 2)).astype(np.int8),
    }
    return ref.ct2_bytes(variables, {"c/weight": "a/weight"}), variables


def test_round_trip() -> None:
    raw, variables = _sample()
    model = parse_model_bin(raw)
    assert (model.binary_version, model.spec, model.spec_revision) == (6, "WhisperSpec", 3)
    assert model.dtypes == {"a/weight": "float16", "b/bias": "float32", "n": "int16", "q": "int8"}
    for name, value in variables.items():
        np.testing.assert_array_equal(model.variables[name], value)
    np.testing.assert_array_equal(model.get("c/weight"), variables["a/weight"].astype(np.float32))
    assert model.scalar("n") == 6
    assert model.scalar("missing", 7) == 7
    assert "c/weight" in model


def test_every_truncation_raises_with_offset() -> None:
    raw, _ = _sample()
    for cut in range(len(raw)):
        with pytest.raises(ModelFormatError, match="at byte offset") as info:
            parse_model_bin(raw[:cut])
        assert info.value.offset is not None
        assert 0 <= info.value.offset <= cut


def test_corruptions_raise_typed_errors() -> None:
    raw, _ = _sample()
    bad_version = struct.pack("<I", 99) + raw[4:]
    with pytest.raises(ModelFormatError, match=r"binary version 99.*offset 0"):
        parse_model_bin(bad_version)
    with pytest.raises(ModelFormatError, match="unexpected bytes"):
        parse_model_bin(raw + b"\0")
    # the first variable's type id sits after: version, spec string, revision, count, name, rank, 2 dims
    head = 4 + 2 + len("WhisperSpec") + 1 + 4 + 4
    type_at = head + 2 + len("a/weight") + 1 + 1 + 8
    assert raw[type_at] == 4
    with pytest.raises(ModelFormatError, match=f"unknown type id 9 at byte offset {type_at}"):
        parse_model_bin(raw[:type_at] + b"\x09" + raw[type_at + 1 :])
    with pytest.raises(ModelFormatError, match="needs 24 bytes, the file says 25"):
        parse_model_bin(raw[: type_at + 1] + struct.pack("<I", 25) + raw[type_at + 5 :])
    single = ref.ct2_bytes({"x": np.zeros(1, np.float32)})
    record = single[head:-4]
    with pytest.raises(ModelFormatError, match=f"duplicate variable 'x' at byte offset {head + len(record)}"):
        parse_model_bin(single[: head - 4] + struct.pack("<I", 2) + record + record + struct.pack("<I", 0))
    with pytest.raises(ModelFormatError, match="unknown variable 'nope'"):
        parse_model_bin(ref.ct2_bytes({"x": np.zeros(1, np.float32)}, {"y": "nope"}))
    with pytest.raises(ModelFormatError, match="length 0"):
        parse_model_bin(struct.pack("<IH", 6, 0))


def test_read_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(ModelFormatError, match="cannot read"):
        read_model_bin(tmp_path / "absent.bin")
    with pytest.raises(ModelFormatError, match=r"no model\.bin"):
        load_pretrained(tmp_path)


def test_ct2_directory_round_trip_and_checks(tmp_path: Path) -> None:
    weights = ref.random_weights(SMALL)
    ref.write_ct2(tmp_path / "ok", weights, SMALL, np.float32)
    config, loaded = load_ct2(tmp_path / "ok")
    assert config == SMALL
    for name, value in weights.items():
        np.testing.assert_array_equal(loaded[name], value)
    broken = dict(weights)
    broken["enc.0.fc1.w"] = broken["enc.0.fc1.w"][:, :5]
    ref.write_ct2(tmp_path / "bad", broken, SMALL, np.float32)
    with pytest.raises(ModelFormatError, match=r"enc.0.fc1.w has shape \(512, 5\)"):
        load_ct2(tmp_path / "bad")
    nan = dict(weights)
    nan["dec.ln.g"] = np.full_like(nan["dec.ln.g"], np.nan)
    ref.write_ct2(tmp_path / "nan", nan, SMALL, np.float32)
    with pytest.raises(ModelFormatError, match="non-finite"):
        load_ct2(tmp_path / "nan")


def _hf_tensors(weights: dict[str, np.ndarray], cfg: WhisperConfig) -> dict[str, np.ndarray]:
    d = cfg.d_model
    t = {"model.encoder.conv1.weight": weights["enc.conv1.w"], "model.encoder.conv1.bias": weights["enc.conv1.b"],
         "model.encoder.conv2.weight": weights["enc.conv2.w"], "model.encoder.conv2.bias": weights["enc.conv2.b"],
         "model.encoder.embed_positions.weight": weights["enc.pos"],
         "model.encoder.layer_norm.weight": weights["enc.ln.g"], "model.encoder.layer_norm.bias": weights["enc.ln.b"],
         "model.decoder.embed_tokens.weight": weights["dec.embed"],
         "model.decoder.embed_positions.weight": weights["dec.pos"],
         "model.decoder.layer_norm.weight": weights["dec.ln.g"],
         "model.decoder.layer_norm.bias": weights["dec.ln.b"]}  # fmt: skip
    for side, n in (("encoder", cfg.encoder_layers), ("decoder", cfg.decoder_layers)):
        for i in range(n):
            p, o = f"model.{side}.layers.{i}.", f"{side[:3]}.{i}."
            attns = [("self_attn", "qkv", "out", "attn_ln", "self_attn_layer_norm")]
            if side == "decoder":
                attns.append(("encoder_attn", "cross_kv", "cross_out", "cross_ln", "encoder_attn_layer_norm"))
            for attn, fused, out, ln, ln_name in attns:
                w, b = weights[o + fused + ".w"], weights[o + fused + ".b"]
                if fused == "cross_kv":
                    w = np.concatenate([weights[o + "cross_q.w"], w])
                    b = np.concatenate([weights[o + "cross_q.b"], b])
                for j, x in enumerate("qkv"):
                    t[f"{p}{attn}.{x}_proj.weight"] = w[j * d : (j + 1) * d]
                    if x != "k":
                        t[f"{p}{attn}.{x}_proj.bias"] = b[j * d : (j + 1) * d]
                t[f"{p}{attn}.out_proj.weight"], t[f"{p}{attn}.out_proj.bias"] = (
                    weights[o + out + ".w"],
                    weights[o + out + ".b"],
                )
                t[f"{p}{ln_name}.weight"], t[f"{p}{ln_name}.bias"] = weights[o + ln + ".g"], weights[o + ln + ".b"]
            for fc in ("fc1", "fc2"):
                t[f"{p}{fc}.weight"], t[f"{p}{fc}.bias"] = weights[o + fc + ".w"], weights[o + fc + ".b"]
            t[f"{p}final_layer_norm.weight"], t[f"{p}final_layer_norm.bias"] = (
                weights[o + "mlp_ln.g"],
                weights[o + "mlp_ln.b"],
            )
    return t


def _safetensors_bytes(tensors: dict[str, np.ndarray]) -> bytes:
    header, blobs, offset = {}, [], 0
    for name, value in tensors.items():
        data = np.ascontiguousarray(value, np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(value.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + b"".join(blobs)


def test_safetensors_checkpoint(tmp_path: Path) -> None:
    weights = ref.random_weights(SMALL, seed=3)
    (tmp_path / "model.safetensors").write_bytes(_safetensors_bytes(_hf_tensors(weights, SMALL)))
    (tmp_path / "config.json").write_text(json.dumps({
        "num_mel_bins": 80, "max_source_positions": 8, "d_model": 128, "encoder_layers": 1,
        "encoder_attention_heads": 2, "vocab_size": 40, "max_target_positions": 6, "decoder_layers": 1,
        "decoder_attention_heads": 2}))  # fmt: skip
    config, loaded = load_safetensors(tmp_path)
    assert config == SMALL
    for name, value in weights.items():
        np.testing.assert_array_equal(loaded[name], value, err_msg=name)
    raw = (tmp_path / "model.safetensors").read_bytes()
    for cut in (0, 7, 20, len(raw) - 1):
        with pytest.raises(ModelFormatError):
            parse_safetensors(raw[:cut])


@pytest.mark.slow
def test_real_tiny_en_model_bin(whisper_tiny: Path) -> None:
    model = read_model_bin(whisper_tiny / "model.bin")
    assert model.spec == "WhisperSpec"
    assert len(model.variables) == 148
    config, _weights = load_ct2(whisper_tiny)
    assert (config.d_model, config.encoder_layers, config.decoder_layers, config.n_vocab) == (384, 4, 4, 51864)
    assert config.alignment_heads[0] == (1, 0)
    assert not config.multilingual
    raw = (whisper_tiny / "model.bin").read_bytes()
    with pytest.raises(ModelFormatError, match=r"truncated.*at byte offset"):
        parse_model_bin(raw[: len(raw) // 2])


def test_int8_quantized_weights(tmp_path: Path) -> None:
    from pygpukit.asr.model import WhisperModel

    weights = ref.random_weights(SMALL, seed=5)
    variables = ref.to_ct2(weights, SMALL, np.float32)
    for name in [n for n in variables if n.endswith("/weight")]:
        value = variables[name]
        rows = value.reshape(value.shape[0], -1)
        scale = (127.0 / np.abs(rows).max(axis=1)).astype(np.float32)  # CTranslate2's int8 rule
        variables[name] = np.rint(rows * scale[:, None]).astype(np.int8).reshape(value.shape)
        variables[name + "_scale"] = scale
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "model.bin").write_bytes(ref.ct2_bytes(variables))
    config, loaded = load_ct2(tmp_path / "q")
    for name, value in weights.items():
        step = np.abs(value.reshape(value.shape[0], -1)).max(axis=1) / 127.0 if value.ndim > 1 else None
        if step is None:
            np.testing.assert_array_equal(loaded[name], value)
        else:
            err = np.abs(loaded[name] - value).reshape(value.shape[0], -1).max(axis=1)
            assert (err <= step * 0.5 + 1e-7).all(), name
    mel = np.random.default_rng(1).standard_normal((80, 16)).astype(np.float32)
    tokens = np.array([1, 2, 3])
    expected = ref.forward(weights, SMALL, mel, tokens)
    got = WhisperModel(config, loaded).forward(mel, tokens).to_numpy()[0]
    assert np.abs(got - expected).max() / np.abs(expected).max() < 5e-2
    variables["decoder/ln_bad/weight"] = np.zeros((3, 2), np.int8)
    variables["decoder/ln_bad/weight_scale"] = np.ones(5, np.float32)
    with pytest.raises(ModelFormatError, match="weight_scale has shape"):
        parse_model_bin(ref.ct2_bytes(variables)).get("decoder/ln_bad/weight")
