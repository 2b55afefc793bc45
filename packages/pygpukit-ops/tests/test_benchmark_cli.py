"""python -m pygpukit.benchmark: options, checked results, JSON, comparison (runs on any backend)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import pygpukit as gp
from pygpukit.benchmark import main

FAST = ["--elementwise", "--reduction", "--sizes", "1024", "--iterations", "1", "--warmup", "0", "--no-progress"]


def test_runs_checks_and_saves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "run.json"
    assert main([*FAST, "--save", str(saved), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("| suite | op | dtype |")
    data = json.loads(saved.read_text())
    ops = {(r["suite"], r["op"], r["dtype"]) for r in data["results"]}
    assert ("elementwise", "add", "bfloat16") in ops
    assert ("reduction", "softmax rows", "float32") in ops
    assert all(r["check"] == "ok" and r["pygpukit_us"] > 0 for r in data["results"])


def test_compare_finds_regressions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "base.json"
    assert main([*FAST, "--save", str(saved)]) == 0
    data = json.loads(saved.read_text())
    for r in data["results"]:
        r["pygpukit_us"] = 1e-3  # pretend the baseline took a nanosecond (a ratio of the measured time would
        # not do: one timed iteration without warm-up can be a 1000x outlier on a loaded machine)
    saved.write_text(json.dumps(data))
    assert main([*FAST, "--compare", str(saved), "--threshold", "0.05"]) == 0  # reported, not fatal
    assert "REGRESSION elementwise/add/float32/1024" in capsys.readouterr().err
    assert main([*FAST, "--compare", str(saved), "--fail-on-regression"]) == 1


def test_bad_options_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--iterations", "0"]) == 2
    assert main(["--gemm", "--dtypes", "int4", "--no-progress"]) == 2
    assert main(["--elementwise", "--sizes", "lots", "--no-progress"]) == 2
    capsys.readouterr()


# -- dtype aliases, --attention --seq-lens, --fp8 -------------------------------------------------------
def test_dtype_aliases() -> None:
    from pygpukit.benchmark._options import parse_dtypes

    assert parse_dtypes("bf16,fp16,fp32,fp8,tf32") == ["bfloat16", "float16", "float32", "fp8", "tf32"]
    assert parse_dtypes("BFloat16, fp64,bf16") == ["bfloat16", "float64"]
    assert parse_dtypes("float8_e4m3fn") == ["fp8"]
    with pytest.raises(ValueError, match="unknown dtype 'int4'"):
        parse_dtypes("bf16,int4")


def test_aliases_select_the_same_cases() -> None:
    from pygpukit.benchmark._runner import _parser, select_cases

    def keys(*argv: str) -> list[str]:
        return [case.key for case in select_cases(_parser().parse_args(list(argv)))]

    short = keys("--gemm", "--elementwise", "--dtypes", "bf16,fp32", "--sizes", "64")
    assert short == keys("--gemm", "--elementwise", "--dtypes", "bfloat16,float32", "--sizes", "64")
    assert "gemm/matmul/bfloat16/64^3" in short
    assert keys("--gemv", "--dtypes", "bf16,fp8", "--quick") == [
        "gemv/matmul M=1/bfloat16/4096x4096", "gemv/matmul M=1/bfloat16/3584x18944",
        "gemv/scaled_matmul M=1/fp8/4096x4096", "gemv/scaled_matmul M=1/fp8/3584x18944",
    ]  # fmt: skip
    assert keys("--fp8", "--sizes", "64,128") == [
        "gemm/scaled_matmul/fp8/64^3", "gemm/scaled_matmul/fp8/128^3",
        "gemm/scaled_matmul block 1x128/128x128/fp8/64^3", "gemm/scaled_matmul block 1x128/128x128/fp8/128^3",
    ]  # fmt: skip
    assert keys("--gemm", "--fp8", "--dtypes", "fp8", "--sizes", "64") == ["gemm/scaled_matmul/fp8/64^3"]
    assert len(keys("--all", "--fp8", "--quick")) == len(keys("--all", "--quick")) + 2  # plain and block-scaled
    assert keys("--attention", "--seq-lens", "512,2048", "--dtypes", "fp16") == [
        "attention/sdpa_causal/float16/s512 h32/8 d128", "attention/sdpa_causal/float16/s2048 h32/8 d128",
    ]  # fmt: skip


def test_attention_runs_and_is_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "attention.json"
    argv = ["--attention", "--seq-lens", "16,33", "--dtypes", "bf16,fp32", *FAST[4:], "--save", str(saved)]
    assert main(argv) == 0
    results = json.loads(saved.read_text())["results"]
    assert [(r["dtype"], r["size"].split()[0]) for r in results] == [
        ("bfloat16", "s16"), ("bfloat16", "s33"), ("float32", "s16"), ("float32", "s33"),
    ]  # fmt: skip
    assert all(r["check"] == "ok" and r["metric"].endswith("TFLOP/s") for r in results)
    capsys.readouterr()


def hopper_only_dropped() -> bool:
    from pygpukit.core.backend import backend_state

    return backend_state().name == "cuda" and gp.get_device_capabilities().compute_capability[0] != 9


def test_fp8_gemm_runs_and_is_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pygpukit.benchmark._runner import fp8_problem

    if fp8_problem() is not None:
        assert main(["--fp8", "--sizes", "64", *FAST[4:]]) == 2
        assert "compute capability 8.9 or newer" in capsys.readouterr().err
        return
    saved = tmp_path / "fp8.json"
    assert main(["--fp8", "--sizes", "32,64", *FAST[4:], "--save", str(saved)]) == 0
    results = json.loads(saved.read_text())["results"]
    assert [(r["op"], r["dtype"], r["size"], r["check"]) for r in results] == [
        ("scaled_matmul", "fp8", "32^3", "ok"), ("scaled_matmul", "fp8", "64^3", "ok"),
        *([] if hopper_only_dropped() else [("scaled_matmul block 1x128/128x128", "fp8", "32^3", "ok"),
                                             ("scaled_matmul block 1x128/128x128", "fp8", "64^3", "ok")]),
    ]  # fmt: skip
    capsys.readouterr()


def test_fp8_needs_compute_capability_8_9(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CUDA device below 8.9 the fp8 cases are dropped with a message naming the GPU."""
    import types

    from pygpukit.benchmark import _runner

    cuda = types.SimpleNamespace(name="cuda", reason="test")
    a100 = types.SimpleNamespace(fp8=False, compute_capability=(8, 0), name="NVIDIA A100")
    monkeypatch.setattr(_runner, "backend_state", lambda: cuda)
    monkeypatch.setattr(_runner.gp, "get_device_capabilities", lambda: a100)
    problem = _runner.fp8_problem()
    assert problem is not None
    assert "needs compute capability 8.9 or newer; this GPU (NVIDIA A100) is 8.0" in problem
    monkeypatch.setattr(_runner.gp, "get_device_capabilities", lambda: types.SimpleNamespace(fp8=True))
    assert _runner.fp8_problem() is None


def test_bad_attention_and_fp8_options_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--attention", "--seq-lens", "0", "--no-progress"]) == 2
    assert main(["--attention", "--seq-lens", "long", "--no-progress"]) == 2
    assert "sequence lengths must be integers, got 'long'" in capsys.readouterr().err
    assert main(["--fp8", "--sizes", "40", "--no-progress"]) == 2
    assert "multiples of 16; not 40^3" in capsys.readouterr().err
    assert main(["--elementwise", "--dtypes", "fp8", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "the elementwise suite has no fp8 case" in err
    assert "no benchmark case matches" in err
    assert main(["--attention", "--dtypes", "fp64", "--no-progress"]) == 2


@pytest.mark.gpu
def test_gpu_attention_and_fp8_against_the_peers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "gpu.json"
    argv = ["--attention", "--seq-lens", "512", "--fp8", "--sizes", "1024", "--iterations", "3", "--warmup", "1",
            "--no-progress", "--save", str(saved)]  # fmt: skip
    status = main(argv)
    results = json.loads(saved.read_text())["results"]
    assert status == 0, results
    assert {r["suite"] for r in results} >= {"attention"}
    assert all(r["check"] == "ok" for r in results)
    capsys.readouterr()


def test_quant_cases_are_selected_checked_and_named() -> None:
    from pygpukit.benchmark._runner import _parser, run_cases, select_cases

    def keys(*argv: str) -> list[str]:
        return [c.key for c in select_cases(_parser().parse_args(list(argv)))]

    assert keys("--quant", "--quick") == [
        "quant/linear Q4_K M=1/bfloat16/4096x4096", "quant/linear Q8_0 M=1/bfloat16/4096x4096",
        "quant/linear FP8 M=1/bfloat16/4096x4096", "quant/linear AWQ M=1/bfloat16/4096x4096",
        "quant/linear Q4_K M=256/bfloat16/4096x4096", "quant/linear AWQ M=256/bfloat16/4096x4096",
        "quant/moe_mlp Q4_K 128x2048x768 k8/bfloat16/1 tokens", "quant/moe_mlp Q4_K 128x2048x768 k8/bfloat16/64 tokens",
        "quant/moe_mlp Q8_0 128x2048x768 k8/bfloat16/1 tokens", "quant/moe_mlp Q8_0 128x2048x768 k8/bfloat16/64 tokens",
        "elementwise/copy/bfloat16/16777216",  # the copy bandwidth of the same run
    ]  # fmt: skip
    assert len(keys("--quant", "q6_k,nvf4")) == 3 * 2 + 1 + 1  # three decode shapes each, NVF4's prefill, the copy
    assert len(keys("--quant", "q4_k")) == 3 + 1 + 3 + 1  # decode shapes, prefill, the MoE layer at 1/64/512, copy
    with pytest.raises(ValueError, match="unknown --quant formats Q7_K"):
        keys("--quant", "Q7_K")
    assert main(["--quant", "Q7_K", "--no-progress"]) == 2
    cases = select_cases(_parser().parse_args(["--quant", "Q8_0,FP8_BLOCK", "--quick"]))
    results = run_cases(cases[:2], warmup=0, iterations=1, progress=False)
    assert [r.check for r in results] == ["ok", "ok"]
