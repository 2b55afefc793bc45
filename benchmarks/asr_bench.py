"""Whisper on the GPU: pygpukit.asr against transformers (fp16, SDPA), and logits against transformers' fp32.

    python benchmarks/asr_bench.py --model-dir ~/.cache/pygpukit/models/whisper-tiny.en \
        --clips ~/.cache/pygpukit/audio-testdata/pocketsphinx-testdata/pocketsphinx/test/data --out $OUT/asr.json

- ``logits``: WhisperForConditionalGeneration (fp32, eager and SDPA) built from the same weights (the
  CTranslate2 tiny.en converted to transformers' names here, and a random config) against
  ``WhisperModel.forward`` in fp32: relative error max|ours - theirs| / max|theirs| (issue 17: <= 1e-4).
- ``speed``: the ten pocketsphinx clips concatenated and repeated to ``--minutes`` of audio, transcribed
  greedily at batch 1 (temperature 0 only, timestamps on) by pygpukit.asr in fp16 and by transformers'
  ASR pipeline in fp16 with SDPA (30 s chunks, batch 1); wall time and real-time factor of each, after one
  warm-up call, in the same run; and 16 files (the clips, six of them twice) one by one against
  ``transcribe_batch`` with batch 16 (issue 17: >= 8x).

torch and transformers are imported only here (they exist on the GPU machine, not in pygpukit's
dependencies). Results go to ``--out`` as JSON and a summary to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

TINY = {"vocab_size": 51864, "num_mel_bins": 80, "d_model": 384, "encoder_layers": 4, "decoder_layers": 4,
        "encoder_attention_heads": 6, "decoder_attention_heads": 6, "encoder_ffn_dim": 1536,
        "decoder_ffn_dim": 1536, "max_source_positions": 1500, "max_target_positions": 448}  # fmt: skip


def hf_state_dict(weights: dict[str, np.ndarray], cfg: Any) -> dict[str, np.ndarray]:
    """pygpukit.asr's weight layout -> transformers' WhisperForConditionalGeneration names."""
    d = cfg.d_model
    t = {"model.encoder.conv1.weight": weights["enc.conv1.w"], "model.encoder.conv1.bias": weights["enc.conv1.b"],
         "model.encoder.conv2.weight": weights["enc.conv2.w"], "model.encoder.conv2.bias": weights["enc.conv2.b"],
         "model.encoder.embed_positions.weight": weights["enc.pos"],
         "model.encoder.layer_norm.weight": weights["enc.ln.g"], "model.encoder.layer_norm.bias": weights["enc.ln.b"],
         "model.decoder.embed_tokens.weight": weights["dec.embed"],
         "model.decoder.embed_positions.weight": weights["dec.pos"],
         "model.decoder.layer_norm.weight": weights["dec.ln.g"], "model.decoder.layer_norm.bias": weights["dec.ln.b"],
         "proj_out.weight": weights["dec.embed"]}  # fmt: skip
    for side, n in (("encoder", cfg.encoder_layers), ("decoder", cfg.decoder_layers)):
        for i in range(n):
            p, o = f"model.{side}.layers.{i}.", f"{side[:3]}.{i}."
            parts = [("self_attn", "qkv", "out", "attn_ln", "self_attn_layer_norm")]
            if side == "decoder":
                parts.append(("encoder_attn", "cross_kv", "cross_out", "cross_ln", "encoder_attn_layer_norm"))
            for attn, fused, out, ln, ln_name in parts:
                w, b = weights[o + fused + ".w"], weights[o + fused + ".b"]
                if fused == "cross_kv":
                    w = np.concatenate([weights[o + "cross_q.w"], w])
                    b = np.concatenate([weights[o + "cross_q.b"], b])
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
    return t


def hf_model(weights: dict[str, np.ndarray], cfg: Any, dtype: Any, attn: str) -> Any:
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    config = WhisperConfig(
        vocab_size=cfg.n_vocab, num_mel_bins=cfg.n_mels, d_model=cfg.d_model, encoder_layers=cfg.encoder_layers,
        decoder_layers=cfg.decoder_layers, encoder_attention_heads=cfg.encoder_heads,
        decoder_attention_heads=cfg.decoder_heads, encoder_ffn_dim=4 * cfg.d_model, decoder_ffn_dim=4 * cfg.d_model,
        max_source_positions=cfg.n_audio_ctx, max_target_positions=cfg.n_text_ctx, decoder_start_token_id=50257,
        eos_token_id=50256, pad_token_id=50256, bos_token_id=50256, attn_implementation=attn,
    )  # fmt: skip
    model = WhisperForConditionalGeneration(config)
    state = {k: torch.from_numpy(np.ascontiguousarray(v, np.float32)) for k, v in hf_state_dict(weights, cfg).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if [m for m in missing if m != "proj_out.weight"] or unexpected:
        raise RuntimeError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    return model.to(device="cuda", dtype=dtype).eval()


def check_logits(model_dir: Path, clips: Path) -> dict[str, Any]:
    import soundfile as sf
    import torch

    from pygpukit.asr import WhisperConfig, WhisperModel, whisper_features
    from pygpukit.asr.weights import load_ct2

    out: dict[str, Any] = {}
    rng = np.random.default_rng(0)
    random_cfg = WhisperConfig(n_mels=128, n_audio_ctx=1500, d_model=256, encoder_layers=2, encoder_heads=4,
                               n_vocab=51866, n_text_ctx=448, decoder_layers=2, decoder_heads=4)  # fmt: skip
    random_w = _random_weights(random_cfg, rng)
    real_cfg, real_w = load_ct2(model_dir)
    audio, _ = sf.read(clips / "librivox/sense_and_sensibility_01_austen_64kb-0870.wav", dtype="float32")
    for name, cfg, w in (("random", random_cfg, random_w), ("tiny.en", real_cfg, real_w)):
        mel = whisper_features(audio, cfg.n_mels).to_numpy()
        tokens = np.array([50257, 50363, 843, 1770, 13, 1757, 16189, 3822, 550, 788])
        ours = WhisperModel(cfg, w, dtype="float32").forward(mel, tokens).to_numpy()[0].astype(np.float64)
        for attn in ("eager", "sdpa"):
            model = hf_model(w, cfg, torch.float32, attn)
            with torch.no_grad():
                theirs = model(input_features=torch.from_numpy(mel)[None].cuda(),
                               decoder_input_ids=torch.from_numpy(tokens)[None].cuda()).logits[0]  # fmt: skip
            theirs_np = theirs.double().cpu().numpy()
            rel = float(np.abs(ours - theirs_np).max() / np.abs(theirs_np).max())
            out[f"{name}/{attn}"] = rel
            print(f"logits {name:8s} vs transformers fp32 {attn:5s}: relative error {rel:.2e}")
    return out


def _random_weights(cfg: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
    from pygpukit.asr.weights import expected_shapes

    out = {}
    for name, shape in expected_shapes(cfg).items():
        if name.endswith(".g"):
            out[name] = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name in ("enc.pos", "dec.pos", "dec.embed"):
            out[name] = 0.5 * rng.standard_normal(shape)
        else:
            fan = shape[1] * (shape[2] if len(shape) == 3 else 1) if len(shape) > 1 else 10
            out[name] = rng.standard_normal(shape) / np.sqrt(fan)
    for name in out:
        if name.endswith("qkv.b"):
            out[name][cfg.d_model : 2 * cfg.d_model] = 0.0
        if name.endswith("cross_kv.b"):
            out[name][: cfg.d_model] = 0.0
    return {k: v.astype(np.float32) for k, v in out.items()}


_CLIPS: list[np.ndarray] = []


def _clips_16() -> list[np.ndarray]:
    """The ten clips then the first six again: 16 files of 1 to 7 s (filled by long_audio)."""
    return (_CLIPS + _CLIPS[:6])[:16] if _CLIPS else []


def long_audio(clips: Path, minutes: float) -> np.ndarray:
    import soundfile as sf

    wavs = sorted(clips.glob("cards/*.wav")) + sorted(clips.glob("librivox/*.wav"))
    _CLIPS[:] = [sf.read(w, dtype="float32")[0] for w in wavs]
    one = np.concatenate(_CLIPS)
    reps = int(np.ceil(minutes * 60 * 16000 / len(one)))
    return np.tile(one, reps)[: int(minutes * 60 * 16000)]


def speed(model_dir: Path, audio: np.ndarray, skip_transformers: bool) -> dict[str, Any]:
    from pygpukit.asr import WhisperModel, transcribe

    seconds = len(audio) / 16000
    out: dict[str, Any] = {"audio_seconds": seconds}
    model = WhisperModel.from_pretrained(model_dir, dtype="float16")
    transcribe(model, audio[: 16000 * 5], beam_size=1, temperature=0.0)  # warm-up: kernels compiled
    start = time.perf_counter()
    result = transcribe(model, audio, beam_size=1, temperature=0.0)
    ours = time.perf_counter() - start
    out["pygpukit"] = {"seconds": ours, "rtf": ours / seconds, "segments": len(result.segments),
                       "text_head": result.text[:200]}  # fmt: skip
    print(f"pygpukit.asr fp16 greedy: {ours:.2f} s for {seconds:.0f} s of audio, RTF {ours / seconds:.4f}")
    clips = _clips_16()
    if clips:
        from pygpukit.asr import transcribe_batch

        start = time.perf_counter()
        for clip in clips:
            transcribe(model, clip, beam_size=1, temperature=0.0)
        single = time.perf_counter() - start
        transcribe_batch(model, clips[:2], beam_size=1, temperature=0.0, batch_size=2)  # warm-up of batch shapes
        start = time.perf_counter()
        transcribe_batch(model, clips, beam_size=1, temperature=0.0, batch_size=16)
        batched = time.perf_counter() - start
        out["files16"] = {"one_by_one_seconds": single, "batched_seconds": batched, "speedup": single / batched}
        print(f"16 files: one by one {single:.2f} s, batch 16 {batched:.2f} s ({single / batched:.2f}x)")
    if skip_transformers:
        return out
    try:
        import torch
        from transformers import GenerationConfig, WhisperFeatureExtractor, WhisperTokenizerFast, pipeline

        from pygpukit.asr.weights import load_ct2

        cfg, w = load_ct2(model_dir)
        hf = hf_model(w, cfg, torch.float16, "sdpa")
        hf.generation_config = GenerationConfig(
            decoder_start_token_id=50257, eos_token_id=50256, pad_token_id=50256, max_length=448,
            no_timestamps_token_id=50362, is_multilingual=False, begin_suppress_tokens=[220, 50256],
            suppress_tokens=model.tokenizer.non_speech_tokens if model.tokenizer else None,
        )  # fmt: skip
        asr = pipeline("automatic-speech-recognition", model=hf,
                       tokenizer=WhisperTokenizerFast(tokenizer_file=str(model_dir / "tokenizer.json")),
                       feature_extractor=WhisperFeatureExtractor(feature_size=cfg.n_mels), torch_dtype=torch.float16,
                       device="cuda:0", chunk_length_s=30, batch_size=1)  # fmt: skip
        asr(audio[: 16000 * 5].copy())
        torch.cuda.synchronize()
        start = time.perf_counter()
        theirs_result = asr(audio.copy())
        torch.cuda.synchronize()
        theirs = time.perf_counter() - start
        out["transformers"] = {"seconds": theirs, "rtf": theirs / seconds, "text_head": theirs_result["text"][:200]}
        out["speedup"] = theirs / ours
        print(f"transformers pipeline fp16 sdpa: {theirs:.2f} s, RTF {theirs / seconds:.4f}; ours {theirs / ours:.2f}x")
    except Exception as exc:  # the peer's failure is a result to report, not a reason to lose ours
        out["transformers_error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        print(f"transformers pipeline failed: {out['transformers_error']}", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--clips", type=Path, required=True, help="pocketsphinx test/data (cards/, librivox/)")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--skip-logits", action="store_true")
    p.add_argument("--skip-transformers", action="store_true")
    args = p.parse_args(argv)
    import platform

    report: dict[str, Any] = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                              "python": platform.python_version()}  # fmt: skip
    try:
        import torch

        report["device"] = torch.cuda.get_device_name(0)
    except Exception:  # no torch: ours only
        report["device"] = "unknown (torch not importable)"
    if not args.skip_logits:
        try:
            report["logits_relative_error"] = check_logits(args.model_dir, args.clips)
        except Exception as exc:  # the logit check failing must not lose the speed figures
            report["logits_error"] = traceback.format_exc()
            print(f"logit check failed: {exc}", file=sys.stderr)
    report["speed"] = speed(args.model_dir, long_audio(args.clips, args.minutes), args.skip_transformers)
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
