"""Benchmark: end-to-end generation speed of a real model, pygpukit next to transformers in one run.

    python benchmarks/tools/llm_decode.py MODEL.gguf [--tokens 128] [--repeats 5] [--json OUT.json]
        [--strategy graph|m1|eager|batch|speculative|jacobi|engine] [--quantized] [--no-fuse] [--fuse-all]
        [--batch-size 8] [--draft-layers K] [--draft DRAFT.gguf] [--num-draft-tokens 4] [--window 4]
        [--requests 64]

For each dtype (float32, bfloat16) both libraries run the same chat prompt with greedy decoding for
``--tokens`` new tokens (no stop on end-of-sequence); the first run of each warms up, the median of
the remaining runs is reported: time to first token and decode tokens/s (tokens after the first over
the time after the first). transformers runs eager (its default), loading the same GGUF; it is
skipped with a note where torch/transformers are missing.

``--strategy`` picks pygpukit's decode loop (pygpukit.llm.decode; default: generate()'s choice, the
CUDA graph on the GPU for batch 1); the decoder is built and its graph captured before the clock
starts, so the figures are steady-state decode. The GGUF weights are dequantized to dense ``dtype``
(as transformers does) unless ``--quantized`` keeps them packed (then only m1/eager run).

``--strategy batch`` decodes ``--batch-size`` copies of the prompt together (DecodeBatch; the figure
is the batch's total tokens/s, next to transformers at batch 1); ``speculative`` drafts
``--num-draft-tokens`` with the model's first ``--draft-layers`` blocks (or the ``--draft`` model) and
verifies them in one forward; ``jacobi`` iterates a ``--window`` of guesses. Their rows also give
the acceptance rate / iterations per token (``decode_info``). ``engine`` submits ``--requests``
copies of the prompt at once to a continuous-batching :class:`pygpukit.llm.Engine` (``max_batch`` =
``--requests``, paged KV cache) and reports its throughput: all generated tokens over the time from
the first step to the last, prefill included; the "ttft" is when the last request got its first token.

pygpukit decodes with its fused kernels (one QKV GEMV, RoPE fused with the KV-cache write:
pygpukit.llm.decode); ``--no-fuse`` also measures the unfused kernels in the same run (first, on a
fresh load, so that its prefill runs the separate projections too) and reports both; ``--fuse-all``
also measures ``fuse="all"`` (the one-row GEMVs with the norms, SwiGLU and residual adds inside:
pygpukit.ops.fused_gemv) on another fresh load.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import time
from pathlib import Path
from typing import Any

PROMPT = [{"role": "user", "content": "Write a short story about a robot learning to paint."}]


def _ours(path: Path, dtype: str, tokens: int, repeats: int, strategy: str | None = None,
          quantized: bool = False, fuse: bool | str = True, strategy_options: dict[str, Any] | None = None,
          ) -> dict[str, Any]:  # fmt: skip
    import pygpukit.llm as llm
    from pygpukit.llm.decode import DecodeM1

    if hasattr(DecodeM1, "fuse_default"):
        DecodeM1.fuse_default = fuse

    options: dict[str, Any] = (
        {"keep_quantized": quantized} if "keep_quantized" in inspect.signature(llm.load).parameters else {}
    )
    model = llm.load(path, dtype=dtype, progress=False, **options)
    ids = model.tokenizer.encode(model.chat_prompt(PROMPT), add_special_tokens=False)
    extra = dict(strategy_options or {})
    batch = int(extra.get("batch_size", 1)) if strategy == "batch" else 1
    if isinstance(extra.get("draft"), Path):
        extra["draft"] = llm.load(extra["draft"], dtype=dtype, progress=False, **options)
    prompt: Any = [ids] * batch if strategy == "batch" else ids
    more: dict[str, Any] = {"strategy_options": extra} if extra else {}
    ttft, rate, info = [], [], {}
    for _ in range(repeats + 1):
        model.generate(prompt, max_new_tokens=tokens, temperature=0, ignore_eos=True, strategy=strategy, **more)
        ttft.append(model.last_stats.time_to_first_token_s)
        rate.append(model.last_stats.decode_tokens_per_s * batch)  # a batch: its total tokens/s
        info = dict(getattr(model.last_stats, "decode_info", None) or {})
    from pygpukit.llm.decode import choose_strategy

    used = choose_strategy(model, 1, None, strategy)
    return {"library": "pygpukit", "dtype": dtype, "backend": model.backend, "prompt_tokens": len(ids),
            "strategy": used, "quantized": quantized, "fused": fuse, "batch": batch, "decode_info": info,
            "ttft_s": statistics.median(ttft[1:]), "decode_tokens_per_s": statistics.median(rate[1:]),
            "runs_tokens_per_s": rate[1:]}  # fmt: skip


def _engine(path: Path, dtype: str, tokens: int, repeats: int, requests: int, quantized: bool) -> dict[str, Any]:
    """``requests`` greedy copies of the prompt through one continuous-batching Engine at once."""
    import pygpukit.llm as llm

    options = {"keep_quantized": quantized} if "keep_quantized" in inspect.signature(llm.load).parameters else {}
    model = llm.load(path, dtype=dtype, progress=False, **options)
    ids = model.tokenizer.encode(model.chat_prompt(PROMPT), add_special_tokens=False)
    engine = llm.Engine(model, max_batch=requests, max_seq_len=len(ids) + tokens, block_size=16)
    ttft, rate, info = [], [], {}
    for _ in range(repeats + 1):
        start = time.perf_counter()
        batch = [engine.submit(ids, max_tokens=tokens, ignore_eos=True) for _ in range(requests)]
        first = None
        while engine.has_work:
            engine.step()
            if first is None and all(r.output for r in batch):
                first = time.perf_counter() - start
        rate.append(requests * tokens / (time.perf_counter() - start))
        ttft.append(first or 0.0)
        info = {
            "preemptions": float(engine.stats.preemptions),
            "blocks": float(engine.num_blocks),
            "graph": float(engine.graph),
        }
    return {"library": "pygpukit", "dtype": dtype, "backend": model.backend, "prompt_tokens": len(ids),
            "strategy": "engine", "quantized": quantized, "fused": True, "batch": requests, "decode_info": info,
            "ttft_s": statistics.median(ttft[1:]), "decode_tokens_per_s": statistics.median(rate[1:]),
            "runs_tokens_per_s": rate[1:]}  # fmt: skip


def _transformers(path: Path, dtype: str, tokens: int, repeats: int) -> dict[str, Any] | None:
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        print(f"transformers skipped: {exc}")
        return None
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tdtype = getattr(torch, dtype)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, torch_dtype=tdtype)
    model = model.to(device).eval()
    ids = tok.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    from pygpukit.llm.benchmark import transformers_decode  # the same timing loop as the shapes benchmark

    timed = transformers_decode(model, tok(ids, add_special_tokens=False)["input_ids"], tokens, repeats)
    return {"library": "transformers", "dtype": dtype, "device": device, "ttft_s": timed["ttft_s"],
            "decode_tokens_per_s": timed["decode_tokens_per_s"], "runs_tokens_per_s": timed["runs"]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--strategy",
        choices=("graph", "m1", "eager", "batch", "speculative", "jacobi", "engine"),
        default=None,
        help="pygpukit's decode strategy (default: generate()'s choice)",
    )
    parser.add_argument("--quantized", action="store_true", help="keep the GGUF weights packed (pygpukit)")
    parser.add_argument("--no-fuse", action="store_true", help="also measure pygpukit's unfused decode kernels")
    parser.add_argument("--fuse-all", action="store_true", help='also measure fuse="all" (fused one-row GEMVs)')
    parser.add_argument("--batch-size", type=int, default=8, help="--strategy batch: sequences decoded together")
    parser.add_argument("--draft-layers", type=int, help="--strategy speculative: the model's first K blocks draft")
    parser.add_argument("--draft", type=Path, help="--strategy speculative: a draft model file instead")
    parser.add_argument("--num-draft-tokens", type=int, default=4, help="--strategy speculative: tokens drafted")
    parser.add_argument("--window", type=int, default=4, help="--strategy jacobi: the window of guessed tokens")
    parser.add_argument("--requests", type=int, default=64, help="--strategy engine: concurrent requests")
    args = parser.parse_args()
    extra: dict[str, Any] = {}
    if args.strategy == "batch":
        extra = {"batch_size": args.batch_size}
    elif args.strategy == "speculative":
        extra = {"num_draft_tokens": args.num_draft_tokens}
        if args.draft is not None:
            extra["draft"] = args.draft
        elif args.draft_layers is not None:
            extra["draft_layers"] = args.draft_layers
    elif args.strategy == "jacobi":
        extra = {"window": args.window}
    rows: list[dict[str, Any]] = []
    for dtype in args.dtypes.split(","):
        if args.no_fuse:
            plain = _ours(args.model, dtype, args.tokens, args.repeats, args.strategy, args.quantized, fuse=False,
                          strategy_options=extra)  # fmt: skip
            rows.append(plain)
            print(f"{dtype}: pygpukit[{plain['strategy']}, unfused] {plain['decode_tokens_per_s']:.1f} tok/s "
                  f"(ttft {plain['ttft_s'] * 1e3:.1f} ms)", flush=True)  # fmt: skip
        if args.fuse_all:
            full = _ours(args.model, dtype, args.tokens, args.repeats, args.strategy, args.quantized, fuse="all",
                         strategy_options=extra)  # fmt: skip
            rows.append(full)
            print(f"{dtype}: pygpukit[{full['strategy']}, fuse=all] {full['decode_tokens_per_s']:.1f} tok/s "
                  f"(ttft {full['ttft_s'] * 1e3:.1f} ms)", flush=True)  # fmt: skip
        if args.strategy == "engine":
            ours = _engine(args.model, dtype, args.tokens, args.repeats, args.requests, args.quantized)
        else:
            ours = _ours(args.model, dtype, args.tokens, args.repeats, args.strategy, args.quantized,
                         strategy_options=extra)  # fmt: skip
        ref = _transformers(args.model, dtype, args.tokens, args.repeats)
        rows += [ours] + ([ref] if ref else [])
        ratio = f", {ours['decode_tokens_per_s'] / ref['decode_tokens_per_s']:.2f}x transformers" if ref else ""
        what = f"{ours['strategy']}, batch {ours['batch']}" if ours["batch"] > 1 else ours["strategy"]
        what += "".join(f", {key} {value:.3g}" for key, value in ours["decode_info"].items())
        print(f"{dtype}: pygpukit[{what}] {ours['decode_tokens_per_s']:.1f} tok/s "
              f"(ttft {ours['ttft_s'] * 1e3:.1f} ms)"
              + (f", transformers {ref['decode_tokens_per_s']:.1f} tok/s (ttft {ref['ttft_s'] * 1e3:.1f} ms)"
                 if ref else "") + ratio, flush=True)  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
