"""Whisper logits against transformers' WhisperForConditionalGeneration in float32 (issue 17): a random
configuration and the real tiny.en (CTranslate2 weights converted by pygpukit.asr.hf_export), eager and
SDPA attention, relative error max|ours - theirs| / max|theirs| <= 1e-4. The ``cuda`` cases (marker gpu)
run both on the GPU; the ``cpu`` cases run transformers on the CPU against pygpukit's current backend.
torch and transformers are not dependencies: without them those tests skip. The weight conversion itself
is checked without them, through the safetensors round trip."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pygpukit.asr.ct2 import ModelFormatError
from pygpukit.asr.hf_export import save_transformers, transformers_config, transformers_state_dict
from pygpukit.asr.weights import WhisperConfig, load_safetensors

_spec = importlib.util.spec_from_file_location("asr_reference", Path(__file__).with_name("asr_reference.py"))
assert _spec is not None
assert _spec.loader is not None
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)

TOLERANCE = 1e-4
RANDOM = WhisperConfig(n_mels=128, n_audio_ctx=64, d_model=256, encoder_layers=2, encoder_heads=4, n_vocab=51866,
                       n_text_ctx=32, decoder_layers=2, decoder_heads=4)  # fmt: skip
TOKENS = np.array([50257, 50363, 843, 1770, 13, 1757, 16189, 3822, 550, 788])
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


def test_safetensors_round_trip(tmp_path: Path) -> None:
    cfg = WhisperConfig(n_mels=80, n_audio_ctx=12, d_model=128, encoder_layers=2, encoder_heads=2, n_vocab=50,
                        n_text_ctx=16, decoder_layers=2, decoder_heads=2)  # fmt: skip
    weights = ref.random_weights(cfg, seed=3)
    state = transformers_state_dict(weights, cfg)
    np.testing.assert_array_equal(state["proj_out.weight"], weights["dec.embed"])  # tied
    assert "model.decoder.layers.1.encoder_attn.k_proj.bias" not in state
    assert state["model.decoder.layers.1.encoder_attn.v_proj.weight"].shape == (128, 128)
    config, loaded = load_safetensors(save_transformers(tmp_path, weights, cfg))
    assert config == cfg
    assert loaded.keys() == weights.keys()
    for name, value in weights.items():
        np.testing.assert_array_equal(loaded[name], value, err_msg=name)
    weights["dec.1.cross_kv.b"][3] = 0.5  # a key bias transformers cannot hold
    with pytest.raises(ModelFormatError, match=r"dec\.1\.cross_kv: transformers' k_proj has no bias"):
        transformers_state_dict(weights, cfg)


def _torch(device: str) -> Any:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return torch


def _theirs(torch: Any, cfg: WhisperConfig, weights: dict[str, np.ndarray], mel: np.ndarray, device: str,
            attn: str) -> np.ndarray:  # fmt: skip
    from transformers import WhisperConfig as HFConfig
    from transformers import WhisperForConditionalGeneration

    model = WhisperForConditionalGeneration(HFConfig(**transformers_config(cfg), attn_implementation=attn))
    state = {k: torch.from_numpy(v) for k, v in transformers_state_dict(weights, cfg).items()}
    model.load_state_dict(state, strict=True)
    model = model.to(device=device, dtype=torch.float32).eval()
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # IEEE fp32, as ours
    try:
        with torch.no_grad():
            out = model(input_features=torch.from_numpy(mel)[None].to(device),
                        decoder_input_ids=torch.from_numpy(TOKENS)[None].to(device)).logits[0]  # fmt: skip
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    return out.double().cpu().numpy()  # type: ignore[no-any-return]


def _compare(cfg: WhisperConfig, weights: dict[str, np.ndarray], mel: np.ndarray, device: str) -> None:
    from pygpukit.asr import WhisperModel

    torch = _torch(device)
    ours = WhisperModel(cfg, weights, dtype="float32").forward(mel, TOKENS).to_numpy()[0].astype(np.float64)
    for attn in ("eager", "sdpa"):
        theirs = _theirs(torch, cfg, weights, mel, device, attn)
        assert ours.shape == theirs.shape
        rel = float(np.abs(ours - theirs).max() / np.abs(theirs).max())
        print(f"{device} {attn}: relative error {rel:.2e}")
        assert rel <= TOLERANCE, (attn, rel)
        assert (ours.argmax(-1) == theirs.argmax(-1)).all()


@pytest.mark.parametrize("device", DEVICES)
def test_random_config_logits(device: str) -> None:
    weights = ref.random_weights(RANDOM, seed=17)
    mel = np.random.default_rng(18).standard_normal((RANDOM.n_mels, 2 * RANDOM.n_audio_ctx)).astype(np.float32)
    _compare(RANDOM, weights, mel, device)


@pytest.mark.audio_data
@pytest.mark.parametrize("device", DEVICES)
def test_tiny_en_logits(whisper_tiny: Path, speech_16k: list[Path], device: str) -> None:
    import soundfile as sf

    from pygpukit.asr import whisper_features
    from pygpukit.asr.weights import load_ct2

    _torch(device)
    cfg, weights = load_ct2(whisper_tiny)
    root = next(p for p in speech_16k if p.name == "001.wav").parent.parent
    audio, _ = sf.read(root / "librivox/sense_and_sensibility_01_austen_64kb-0870.wav", dtype="float32")
    _compare(cfg, weights, whisper_features(audio).to_numpy(), device)
