"""Benchmark: end-to-end generation speed of a real model, pygpukit next to transformers in one run.

    python benchmarks/tools/llm_decode.py MODEL.gguf [--tokens 128] [--repeats 5] [--json OUT.json]
        [--strategy graph|m1|eager] [--quantized]

For each dtype (float32, bfloat16) both libraries run the same chat prompt with greedy decoding for
``--tokens`` new tokens (no stop on end-of-sequence); the first run of each warms up, the median of
the remaining runs is reported: time to first token and decode tokens/s (tokens after the first over
the time after the first). transformers runs eager (its default), loading the same GGUF; it is
skipped with a note where torch/transformers are missing.

``--strategy`` picks pygpukit's decode loop (pygpukit.llm.decode; default: generate()'s choice, the
CUDA graph on the GPU for batch 1); the decoder is built and its graph captured before the clock
starts, so the figures are steady-state decode. The GGUF weights are dequantized to dense ``dtype``
(as transformers does) unless ``--quantized`` keeps them packed (then only m1/eager run).
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
          quantized: bool = False) -> dict[str, Any]:  # fmt: skip
    import pygpukit.llm as llm

    options: dict[str, Any] = (
        {"keep_quantized": quantized} if "keep_quantized" in inspect.signature(llm.load).parameters else {}
    )
    model = llm.load(path, dtype=dtype, progress=False, **options)
    ids = model.tokenizer.encode(model.chat_prompt(PROMPT), add_special_tokens=False)
    ttft, rate = [], []
    for _ in range(repeats + 1):
        model.generate(ids, max_new_tokens=tokens, temperature=0, ignore_eos=True, strategy=strategy)
        ttft.append(model.last_stats.time_to_first_token_s)
        rate.append(model.last_stats.decode_tokens_per_s)
    from pygpukit.llm.decode import choose_strategy

    used = choose_strategy(model, 1, None, strategy)
    return {"library": "pygpukit", "dtype": dtype, "backend": model.backend, "prompt_tokens": len(ids),
            "strategy": used, "quantized": quantized,
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
    prompt = torch.tensor([tok(ids, add_special_tokens=False)["input_ids"]], device=device)
    ttft, rate = [], []
    with torch.no_grad():
        for _ in range(repeats + 1):
            torch.cuda.synchronize() if device == "cuda" else None
            start = time.perf_counter()
            out = model(prompt, use_cache=True)
            token = int(torch.argmax(out.logits[0, -1]))  # the read-back synchronises
            first = time.perf_counter()
            past = out.past_key_values
            for _ in range(tokens - 1):
                out = model(torch.tensor([[token]], device=device), past_key_values=past, use_cache=True)
                past = out.past_key_values
                token = int(torch.argmax(out.logits[0, -1]))
            end = time.perf_counter()
            ttft.append(first - start)
            rate.append((tokens - 1) / (end - first))
    return {"library": "transformers", "dtype": dtype, "device": device, "ttft_s": statistics.median(ttft[1:]),
            "decode_tokens_per_s": statistics.median(rate[1:]), "runs_tokens_per_s": rate[1:]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--strategy",
        choices=("graph", "m1", "eager"),
        default=None,
        help="pygpukit's decode strategy (default: generate()'s choice)",
    )
    parser.add_argument("--quantized", action="store_true", help="keep the GGUF weights packed (pygpukit)")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for dtype in args.dtypes.split(","):
        ours = _ours(args.model, dtype, args.tokens, args.repeats, args.strategy, args.quantized)
        ref = _transformers(args.model, dtype, args.tokens, args.repeats)
        rows += [ours] + ([ref] if ref else [])
        ratio = f", {ours['decode_tokens_per_s'] / ref['decode_tokens_per_s']:.2f}x transformers" if ref else ""
        print(f"{dtype}: pygpukit[{ours['strategy']}] {ours['decode_tokens_per_s']:.1f} tok/s "
              f"(ttft {ours['ttft_s'] * 1e3:.1f} ms)"
              + (f", transformers {ref['decode_tokens_per_s']:.1f} tok/s (ttft {ref['ttft_s'] * 1e3:.1f} ms)"
                 if ref else "") + ratio, flush=True)  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
