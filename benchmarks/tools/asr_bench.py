"""Whisper on the GPU in one run (issue 17): pygpukit.asr against transformers, offline.

    python benchmarks/tools/asr_bench.py --model ~/.cache/pygpukit/models/whisper-tiny.en \
        --audio ~/.cache/pygpukit/audio-testdata/pocketsphinx-testdata/pocketsphinx/test/data

``--model`` is a CTranslate2 Whisper directory (model.bin, config.json, tokenizer.json), ``--audio`` the
pocketsphinx-testdata ``test/data`` folder (cards/, librivox/). Nothing is downloaded: transformers' model
is built from our configuration (pygpukit.asr.hf_export) and the converted weights, its tokenizer from
the model's tokenizer.json and its feature extractor from arguments. Writes ``$OUT/asr_bench.json`` (or
``--out``) and a summary on stdout.

- ``logits``: WhisperForConditionalGeneration in float32 (eager and SDPA attention, TF32 off) against
  ``WhisperModel.forward`` in float32 on a random configuration and on tiny.en: relative error
  max|ours - theirs| / max|theirs| (target <= 1e-4).
- ``long``: the ten clips concatenated and repeated to ``--minutes`` (10) of speech, transcribed greedily at
  batch 1 (temperature 0, timestamps on) by pygpukit.asr in ``--dtype`` (float16) with the CUDA-graph
  decode step and with the eager loop, and by transformers' ASR pipeline in float16 with SDPA (30 s chunks,
  batch 1): wall time, real-time factor, speed-up (targets: >= 2x transformers, RTF <= 0.005).
- ``files16``: 16 files (the ten clips, six of them twice: 1.1 to 7.1 s, mixed lengths) one by one against
  ``transcribe_batch`` with batch 16, greedy (temperature 0): throughput ratio ``speedup`` (target >= 8x),
  ``same_text``, and the decode step bound (below).
- ``files16_equal``: 16 files of equal length, 30 s each, cut one after another from the long speech of
  ``long`` (the clips concatenated and repeated), with the same settings and figures as ``files16`` (target
  >= 8x too). Why both: a batch decodes until its longest transcript ends, so the mixed-length clips are
  bounded by their longest clip's step count (the short clips' rows idle meanwhile), whereas recordings of
  about 30 s, each a full window with a transcript of similar length, are what batched transcription
  serves; the two parts tell a step-count limit apart from the cost of a batched step.

The decode step bound: each file's decoder steps, taken from its one-by-one result as the tokens of its
segments + 1 (the <|endoftext|> step) per decoded 30 s window (``steps_from_segment_tokens``: results do
not expose the step count; tokens of dropped empty segments and of skipped no-speech windows are not
seen), and ``step_bound`` = sum of the steps / the largest: the most batching can gain when a batched step
costs what a single one does. ``transcribe_batch`` advances the files in lockstep, window by window (the
windows of a step encoded and decoded together), so ``step_bound_lockstep`` = sum of the steps / the sum
over window steps of the largest window's steps is the bound of that path (equal to ``step_bound`` when
every file is one window).

Every timing is the median of ``--repeat`` (3) timed calls after one warm-up call of the same kind; the
JSON keeps each call's time (``runs``, ``one_by_one_runs``, ``batched_runs``) beside the median under the
keys of one-call reports. A failing part is recorded as an error in the JSON and the others still run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

SR = 16000
TOKENS = np.array([50257, 50363, 843, 1770, 13, 1757, 16189, 3822, 550, 788])


def _clips(audio_dir: Path) -> list[np.ndarray]:
    import soundfile as sf

    wavs = sorted(audio_dir.glob("cards/*.wav")) + sorted(audio_dir.glob("librivox/*.wav"))
    if len(wavs) < 10:
        raise SystemExit(f"--audio {audio_dir}: expected cards/*.wav and librivox/*.wav (10 clips), found {len(wavs)}")
    return [sf.read(w, dtype="float32")[0] for w in wavs]


def _hf_model(torch: Any, cfg: Any, weights: dict[str, np.ndarray], dtype: Any, attn: str, device: str) -> Any:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    from pygpukit.asr.hf_export import transformers_config, transformers_state_dict

    model = WhisperForConditionalGeneration(WhisperConfig(**transformers_config(cfg), attn_implementation=attn))
    model.load_state_dict({k: torch.from_numpy(v) for k, v in transformers_state_dict(weights, cfg).items()})
    return model.to(device=device, dtype=dtype).eval()


def logits(model_dir: Path, clips: list[np.ndarray], device: str) -> dict[str, float]:
    import torch

    from pygpukit.asr import WhisperConfig, WhisperModel, whisper_features
    from pygpukit.asr.weights import expected_shapes, load_ct2

    rng = np.random.default_rng(0)
    random_cfg = WhisperConfig(n_mels=128, n_audio_ctx=1500, d_model=256, encoder_layers=2, encoder_heads=4,
                               n_vocab=51866, n_text_ctx=448, decoder_layers=2, decoder_heads=4)  # fmt: skip
    random_w = {}
    for name, shape in expected_shapes(random_cfg).items():
        fan = shape[1] * (shape[2] if len(shape) == 3 else 1) if len(shape) > 1 else 10
        scale = 0.1 if name.endswith(".g") else 0.5 if name in ("enc.pos", "dec.pos", "dec.embed") else fan**-0.5
        value = rng.standard_normal(shape) * scale + (1.0 if name.endswith(".g") else 0.0)
        if name.endswith("qkv.b"):
            value[shape[0] // 3 : 2 * shape[0] // 3] = 0.0
        if name.endswith("cross_kv.b"):
            value[: shape[0] // 2] = 0.0
        random_w[name] = value.astype(np.float32)
    real_cfg, real_w = load_ct2(model_dir)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    out = {}
    for name, cfg, w in (("random", random_cfg, random_w), ("tiny.en", real_cfg, real_w)):
        mel = whisper_features(clips[-2], cfg.n_mels).to_numpy()
        ours = WhisperModel(cfg, w, dtype="float32").forward(mel, TOKENS).to_numpy()[0].astype(np.float64)
        for attn in ("eager", "sdpa"):
            hf = _hf_model(torch, cfg, w, torch.float32, attn, device)
            with torch.no_grad():
                theirs = hf(input_features=torch.from_numpy(mel)[None].to(device),
                            decoder_input_ids=torch.from_numpy(TOKENS)[None].to(device)).logits[0]  # fmt: skip
            ref = theirs.double().cpu().numpy()
            out[f"{name}/{attn}"] = rel = float(np.abs(ours - ref).max() / np.abs(ref).max())
            print(f"logits {name:8s} vs transformers fp32 {attn:5s}: relative error {rel:.2e}", flush=True)
    return out


def _time(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def _median_time(fn: Any, repeat: int) -> tuple[float, list[float], Any]:
    """The median wall time of ``repeat`` calls of ``fn``, each call's time, and the last call's result."""
    runs: list[float] = []
    result = None
    for _ in range(max(1, repeat)):
        wall, result = _time(fn)
        runs.append(wall)
    return float(np.median(runs)), runs, result


def _window_steps(result: Any) -> list[int]:
    """Decoder steps of each decoded 30 s window of a TranscriptionResult, in order: the tokens of the
    window's segments (segments of one window share ``seek``) + 1 for the <|endoftext|> step. An
    approximation (the results do not expose the step count): tokens of empty segments that transcribe drops
    and windows skipped as no speech are not seen; a result without segments counts as one window of 1."""
    tokens: dict[int, int] = {}
    for segment in result.segments:
        tokens[segment.seek] = tokens.get(segment.seek, 0) + len(segment.tokens)
    return [n + 1 for n in tokens.values()] or [1]


def _step_figures(results: list[Any]) -> dict[str, Any]:
    """Per-file decoder steps (from segment tokens, see _window_steps) and the step bounds of a batch."""
    windows = [_window_steps(r) for r in results]
    steps = [sum(w) for w in windows]
    depth = max(len(w) for w in windows)
    lockstep = sum(max(w[k] if k < len(w) else 0 for w in windows) for k in range(depth))
    return {"steps_from_segment_tokens": steps, "windows": [len(w) for w in windows],
            "step_bound": sum(steps) / max(steps),
            "step_bound_lockstep": sum(steps) / lockstep}  # fmt: skip


def ours_long(model: Any, audio: np.ndarray, repeat: int = 3) -> dict[str, Any]:
    from pygpukit.asr import transcribe

    seconds = len(audio) / SR
    out: dict[str, Any] = {"audio_seconds": seconds, "repeat": repeat}
    for label, flag in (("graph", True), ("eager", False)):
        model.graph_decode = flag
        transcribe(model, audio[: SR * 20], beam_size=1, temperature=0.0)  # warm-up: kernels, plans, the graph
        wall, runs, result = _median_time(lambda: transcribe(model, audio, beam_size=1, temperature=0.0), repeat)
        out[label] = {"seconds": wall, "runs": runs, "rtf": wall / seconds, "segments": len(result.segments),
                      "words": len(result.text.split()), "text_head": result.text[:160]}  # fmt: skip
        print(f"pygpukit.asr {model.dtype.name} greedy ({label}): {wall:.2f} s for {seconds:.0f} s, RTF "
              f"{wall / seconds:.5f} (median of {len(runs)})", flush=True)  # fmt: skip
    model.graph_decode = None
    return out


def _one_by_one_vs_batch(model: Any, files: list[np.ndarray], repeat: int, label: str) -> dict[str, Any]:
    """``files`` transcribed one by one (transcribe) and with transcribe_batch(batch_size=16), greedy: the
    median times, the throughput ratio, whether the texts agree, and the decode steps (_step_figures)."""
    from pygpukit.asr import transcribe, transcribe_batch

    seconds = sum(len(c) for c in files) / SR
    transcribe(model, files[0], beam_size=1, temperature=0.0)
    single, single_runs, singles = _median_time(
        lambda: [transcribe(model, c, beam_size=1, temperature=0.0) for c in files], repeat)  # fmt: skip
    transcribe_batch(model, files, beam_size=1, temperature=0.0, batch_size=16)  # warm-up of the batch-16 shapes
    batched, batched_runs, results = _median_time(
        lambda: transcribe_batch(model, files, beam_size=1, temperature=0.0, batch_size=16), repeat)  # fmt: skip
    steps = _step_figures(singles)
    print(f"{label}: {len(files)} files ({seconds:.0f} s), median of {len(single_runs)}: one by one {single:.3f} s, "
          f"batch 16 {batched:.3f} s ({single / batched:.2f}x); step bound {steps['step_bound']:.2f}x "
          f"(windows in lockstep: {steps['step_bound_lockstep']:.2f}x, "
          f"{sum(steps['steps_from_segment_tokens'])} steps)", flush=True)  # fmt: skip
    return {"audio_seconds": seconds, "files": len(files), "repeat": repeat, "one_by_one_seconds": single,
            "one_by_one_runs": single_runs, "batched_seconds": batched, "batched_runs": batched_runs,
            "speedup": single / batched, "same_text": [r.text for r in results] == [r.text for r in singles],
            **steps}  # fmt: skip


def files16(model: Any, clips: list[np.ndarray], repeat: int = 3) -> dict[str, Any]:
    """The ten clips, six of them twice (mixed lengths), one by one against batch 16."""
    return _one_by_one_vs_batch(model, (clips + clips[:6])[:16], repeat, "files16")


def files16_equal(model: Any, audio: np.ndarray, repeat: int = 3, count: int = 16, seconds: float = 30.0
                  ) -> dict[str, Any]:  # fmt: skip
    """``count`` files of ``seconds`` each, cut one after another from ``audio`` (the long part's speech,
    repeated when shorter than count x seconds), one by one against batch 16."""
    n = round(seconds * SR)
    if len(audio) < count * n:
        audio = np.tile(audio, int(np.ceil(count * n / len(audio))))
    files = [np.ascontiguousarray(audio[i * n : (i + 1) * n]) for i in range(count)]
    return {"file_seconds": seconds, **_one_by_one_vs_batch(model, files, repeat, "files16_equal")}


def transformers_long(model_dir: Path, audio: np.ndarray, device: str, repeat: int = 3) -> dict[str, Any]:
    import torch
    from transformers import GenerationConfig, WhisperFeatureExtractor, WhisperTokenizerFast, pipeline

    from pygpukit.asr import WhisperModel
    from pygpukit.asr.weights import load_ct2

    cfg, w = load_ct2(model_dir)
    dtype = torch.float16 if device == "cuda" else torch.float32
    hf = _hf_model(torch, cfg, w, dtype, "sdpa", device)
    tok = WhisperModel.from_pretrained(model_dir, dtype="float32").tokenizer
    assert tok is not None
    hf.generation_config = GenerationConfig(
        decoder_start_token_id=tok.sot, eos_token_id=tok.eot, pad_token_id=tok.eot, max_length=cfg.n_text_ctx,
        no_timestamps_token_id=tok.no_timestamps, is_multilingual=False, return_timestamps=True,
        begin_suppress_tokens=[*tok.encode(" "), tok.eot], suppress_tokens=list(tok.suppressed_tokens((-1,))),
    )  # fmt: skip
    asr = pipeline("automatic-speech-recognition", model=hf,
                   tokenizer=WhisperTokenizerFast(tokenizer_file=str(model_dir / "tokenizer.json")),
                   feature_extractor=WhisperFeatureExtractor(feature_size=cfg.n_mels), device=device,
                   chunk_length_s=30, batch_size=1)  # fmt: skip
    seconds = len(audio) / SR
    asr(audio[: SR * 20].copy(), return_timestamps=True)

    def run() -> Any:
        result = asr(audio.copy(), return_timestamps=True)
        if device == "cuda":
            torch.cuda.synchronize()
        return result

    wall, runs, result = _median_time(run, repeat)
    print(f"transformers pipeline {dtype} sdpa: {wall:.2f} s, RTF {wall / seconds:.5f} (median of {len(runs)})",
          flush=True)  # fmt: skip
    return {"seconds": wall, "runs": runs, "repeat": repeat, "rtf": wall / seconds,
            "words": len(result["text"].split()), "text_head": result["text"][:160]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, required=True, help="CTranslate2 Whisper directory (tiny.en)")
    p.add_argument("--audio", type=Path, required=True, help="pocketsphinx-testdata test/data (cards/, librivox/)")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--dtype", default="float16")
    p.add_argument("--device", default="cuda", help="transformers' device (cuda; cpu for a local smoke run)")
    p.add_argument("--out", type=Path, default=None, help="default: $OUT/asr_bench.json")
    p.add_argument("--repeat", type=int, default=3, help="timed calls per timing (after one warm-up); the median")
    p.add_argument("--skip", action="append", default=[],
                   choices=["logits", "long", "files16", "files16_equal", "transformers"])  # fmt: skip
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error(f"--repeat must be >= 1, got {args.repeat}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing from the hub, ever
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    out_path = args.out or Path(os.environ.get("OUT", ".")) / "asr_bench.json"
    report: dict[str, Any] = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "python": platform.python_version(), "repeat": args.repeat, "targets": {
                              "logits_rel": 1e-4, "speedup_vs_transformers": 2.0, "rtf": 0.005,
                              "files16_speedup": 8.0, "files16_equal_speedup": 8.0}}  # fmt: skip
    from pygpukit.asr import WhisperModel
    from pygpukit.core import backend

    report["pygpukit_backend"] = backend.backend_state().name
    try:
        import torch

        report["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
        report["torch"] = torch.__version__
    except Exception as exc:
        report["device"] = f"unknown (torch: {exc})"
    clips = _clips(args.audio)
    one = np.concatenate(clips)
    audio = np.tile(one, int(np.ceil(args.minutes * 60 * SR / len(one))))[: int(args.minutes * 60 * SR)]

    def part(name: str, fn: Any) -> None:
        if name in args.skip:
            return
        try:
            report[name] = fn()
        except Exception:
            report[name + "_error"] = traceback.format_exc()
            print(f"{name} failed:\n{report[name + '_error']}", file=sys.stderr, flush=True)
        out_path.write_text(json.dumps(report, indent=1) + "\n")

    part("logits", lambda: logits(args.model, clips, args.device))
    model = WhisperModel.from_pretrained(args.model, dtype=args.dtype)
    part("long", lambda: ours_long(model, audio, args.repeat))
    part("files16", lambda: files16(model, clips, args.repeat))
    part("files16_equal", lambda: files16_equal(model, audio, args.repeat))
    part("transformers", lambda: transformers_long(args.model, audio, args.device, args.repeat))
    long, hf = report.get("long"), report.get("transformers")
    summary: dict[str, Any] = {"repeat": args.repeat}
    print(f"summary (every time the median of {args.repeat}):", flush=True)
    if long and hf:
        summary.update({"speedup_vs_transformers": hf["seconds"] / long["graph"]["seconds"],
                        "rtf": long["graph"]["rtf"], "graph_vs_eager": long["eager"]["seconds"] /
                        long["graph"]["seconds"]})  # fmt: skip
        print(f"  long: graph {long['graph']['seconds']:.2f} s, RTF {summary['rtf']:.5f}; "
              f"{summary['speedup_vs_transformers']:.1f}x transformers ({hf['seconds']:.2f} s); "
              f"graph {summary['graph_vs_eager']:.2f}x eager", flush=True)  # fmt: skip
    for name in ("files16", "files16_equal"):
        got = report.get(name)
        summary[name + "_speedup"] = got["speedup"] if got else None
        if got:
            summary[name + "_step_bound"] = got["step_bound"]
            summary[name + "_step_bound_lockstep"] = got["step_bound_lockstep"]
            print(f"  {name}: {got['files']} files ({got['audio_seconds']:.0f} s): one by one "
                  f"{got['one_by_one_seconds']:.3f} s, batch 16 {got['batched_seconds']:.3f} s: "
                  f"{got['speedup']:.2f}x (target >= 8x); step bound {got['step_bound']:.2f}x (first windows "
                  f"lockstep {got['step_bound_lockstep']:.2f}x); same text {got['same_text']}",
                  flush=True)  # fmt: skip
    report["summary"] = summary
    print(json.dumps(summary), flush=True)
    out_path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
