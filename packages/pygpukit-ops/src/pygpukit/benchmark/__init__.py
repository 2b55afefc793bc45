"""``python -m pygpukit.benchmark``: op benchmarks timed with device events, each result checked
against a NumPy reference, with torch and CuPy measured on the same inputs in the same run when they
are importable, and ratios printed (peer time / pygpukit time: above 1 pygpukit is faster).

    python -m pygpukit.benchmark --quick
    python -m pygpukit.benchmark --gemm --dtypes bfloat16,float16 --sizes 4096,8192 --markdown
    python -m pygpukit.benchmark --gemv --dtypes bf16,fp8
    python -m pygpukit.benchmark --attention --seq-lens 512,2048
    python -m pygpukit.benchmark --all --fp8 --save run.json
    python -m pygpukit.benchmark --all --compare run.json --threshold 0.05 --fail-on-regression
    python -m pygpukit.benchmark --llm --shapes qwen2.5-0.5b,qwen2.5-7b --batches 1,8
    python -m pygpukit.benchmark --quant Q4_K,Q8_0,FP8,AWQ --save quant.json

``--quant [FORMATS]`` adds quantized-weight ``linear`` cases: the decode GEMV (M = 1) at Llama-3-8B's
projection shapes in each format (GGUF Q4_0 .. Q6_K, FP8/INT8 per channel, AWQ/GPTQ INT4, FP8_BLOCK,
NVF4; random blocks or quantized random values), GB/s of the packed bytes, and the 4096-token prefill
of the 4-bit formats, each against torch's bfloat16 linear on the decoded weight.

``--llm`` hands the other arguments to the LLM suite of pygpukit-llm (``python -m
pygpukit.llm.benchmark``: decode tokens/s at batch sizes, time to first token, random-weight models
of published shapes, against a torch.compile reference loop and transformers in the same run).

Suites: gemm, gemv, elementwise, reduction, attention (causal prefill ``sdpa_causal`` at each
``--seq-lens`` length, against torch's default ``scaled_dot_product_attention``). ``--fp8`` adds the
fp8 GEMM (``scaled_matmul``) cases, which need compute capability 8.9 or newer (on an older GPU they
are skipped with a message saying so). ``--dtypes`` takes the full names or the aliases bf16, fp16,
fp32, fp64, tf32 and fp8 (GEMM and GEMV: scaled_matmul). On the CPU simulation backend it still runs
(to check the tool itself); its times are then host times of the simulation and peers are not
measured.
"""

from __future__ import annotations

from ._options import parse_dtypes, parse_seq_lens
from ._runner import Case, Result, compare, main, run_cases, select_cases

__all__ = ["Case", "Result", "compare", "main", "parse_dtypes", "parse_seq_lens", "run_cases", "select_cases"]
