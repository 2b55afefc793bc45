"""Short runs of the audio benchmark (benchmarks/tools/audio_bench.py) and the real-time streaming example
(examples/realtime_stream.py) on the current backend, with small sizes, so that both keep working."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600, cwd=ROOT, check=False)


def test_audio_bench_small_run(tmp_path: Path) -> None:
    out = tmp_path / "audio_bench.json"
    sizes = ["--batch", "2", "--seconds", "0.25", "--fft-log2", "9"]
    sizes += ["--repeat", "2", "--calls", "1", "--cpu-repeat", "1"]
    done = _run([str(ROOT / "benchmarks" / "tools" / "audio_bench.py"), *sizes, "--out", str(out)])
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    results = report["results"]
    expected = {"stft_n400", "stft_n2048", "stft_n400_sync_check", "melspectrogram", "fft_2^9", "rfft_2^9",
                "resample_44k1_16k"}  # fmt: skip
    assert set(results) == expected
    for name, entry in results.items():
        ours = entry["pygpukit"]
        assert "error" not in ours, (name, ours)
        assert ours["wall_ms"] > 0, name
        assert ours["repeat"] == 2, name
        for peer, timing in entry.items():
            if peer in ("pygpukit", "target", "ratios"):
                continue
            assert "wall_ms" in timing or "absent" in timing, (name, peer, timing)
            assert "error" not in timing, (name, peer, timing)
    assert "numpy.fft" in results["fft_2^9"]["ratios"]
    assert report["environment"]["finite_check"] == "deferred"


def test_realtime_example_short_run(tmp_path: Path) -> None:
    out = tmp_path / "realtime.json"
    done = _run([str(ROOT / "examples" / "realtime_stream.py"), "--synthetic", "--seconds", "0.5", "--no-pace",
                 "--json", str(out)])  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["chunks"] == 25
    assert report["chunk_samples"] == 320
    assert report["log_mel_frames"] == 1 + 25 * 320 // 160
    assert report["max_abs_db_error_vs_offline"] < 1e-2
    lat = report["latency_ms"]
    assert 0 < lat["median"] <= lat["p99"] <= lat["max"]
    assert 0 < report["speech_fraction"] < 1
    assert "latency per chunk: median" in done.stdout
