"""``python -m pygpukit.llm.benchmark`` (also ``python -m pygpukit.benchmark --llm``): decode and prefill
speed of model shapes with random weights (:func:`pygpukit.llm.random_model`), with the peers measured
in the same run::

    python -m pygpukit.llm.benchmark --shapes qwen2.5-0.5b,qwen2.5-7b --batches 1,8 --prompts 128,2048
    python -m pygpukit.llm.benchmark --shapes llama3-8b --peers compiled --json run.json

For each shape (bf16 by default) it reports, each the median of ``--repeats`` timed runs after one
warm-up run:

- decode tokens/s at every ``--batches`` size (greedy, ``--tokens`` new tokens after a
  ``--decode-prompt``-token prompt of random ids, no stop; batch 1 through generate()'s default, the
  CUDA-graph step; larger batches through ``DecodeBatch``; the figure is the batch's total), with its
  share of the bandwidth limit: weight bytes x tokens/s (at batch 1) / the device's copy bandwidth
  (``dst.copy_(src)`` of 1 GiB, bytes read + written);
- ``--engine N``: N requests at once through the continuous-batching :class:`pygpukit.llm.Engine`;
- ``--quant q4_k`` (any GGUF block format): the linear weights kept packed as random blocks (issue
  18's 7B Q4_K decode target); the bandwidth share then counts the packed bytes;
- time to first token and prefill tokens/s for every ``--prompts`` length (batch 1).

Peers (``--peers``, each skipped with a note where torch is missing): ``compiled``, the plain-PyTorch
decode loop with a static KV cache compiled by ``torch.compile(mode="reduce-overhead")`` (the gpt-fast
recipe: ``benchmarks/reference/torch_decode.py`` of the repository, found from the working directory
or given by ``--reference``), built from the same weights, so its greedy tokens are compared with
ours (the first divergence is reported); and ``transformers``, its default eager path on a model of
the same config with its own random weights (speed only), at batch 1 and for the prefill lengths.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .shapes import MODEL_SHAPES, random_model

__all__ = ["main", "run_shape", "transformers_decode"]

_REFERENCE = Path("benchmarks") / "reference" / "torch_decode.py"


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def _prompts(rng: np.random.Generator, vocab: int, batch: int, length: int) -> list[list[int]]:
    return [[int(t) for t in rng.integers(1, vocab, size=length)] for _ in range(batch)]


def _ours_decode(model: Any, prompts: list[list[int]], tokens: int, repeats: int) -> dict[str, Any]:
    batch = len(prompts)
    options: dict[str, Any] = {"strategy": "batch", "strategy_options": {"batch_size": batch}} if batch > 1 else {}
    prompt: Any = prompts if batch > 1 else prompts[0]
    rates, ttft, out = [], [], None
    for _ in range(repeats + 1):
        out = model.generate(prompt, max_new_tokens=tokens, temperature=0, ignore_eos=True, **options)
        stats = model.last_stats
        rates.append(stats.decode_tokens_per_s * batch)
        ttft.append(stats.time_to_first_token_s)
    rows: list[Any] = list(out) if batch > 1 else [out]  # type: ignore[arg-type]
    new = [list(row[-tokens:]) for row in rows]
    return {"decode_tokens_per_s": _median(rates[1:]), "runs": rates[1:], "ttft_s": _median(ttft[1:]),
            "strategy": model.last_stats.strategy, "tokens": new}  # fmt: skip


def _profile_decode(model: Any, prompt: list[int], tokens: int, path: Path) -> str:
    """One eager (``"m1"``) greedy decode of ``tokens`` new tokens after ``prompt`` under the profiler:
    device time per kernel, the prompt's prefill included. Writes the chrome trace to ``path`` and
    returns the summary table (where a decode step's time goes, kernel by kernel)."""
    from pygpukit.profiling import Profiler

    model.generate(prompt, max_new_tokens=2, temperature=0, ignore_eos=True, strategy="m1")  # buffers made
    with Profiler(memory=False) as profiler:
        model.generate(prompt, max_new_tokens=tokens, temperature=0, ignore_eos=True, strategy="m1")
    path.parent.mkdir(parents=True, exist_ok=True)
    profiler.export_chrome_trace(path)
    return str(profiler.summary(top=30))


def _ours_engine(model: Any, prompts: list[list[int]], tokens: int, repeats: int) -> dict[str, Any]:
    from .engine import Engine

    requests = len(prompts)
    engine = Engine(model, max_batch=requests, max_seq_len=len(prompts[0]) + tokens, block_size=16)
    rates = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        for ids in prompts:
            engine.submit(ids, max_tokens=tokens, ignore_eos=True)
        while engine.has_work:
            engine.step()
        rates.append(requests * tokens / (time.perf_counter() - start))
    return {"decode_tokens_per_s": _median(rates[1:]), "runs": rates[1:], "graph": bool(engine.graph)}


def _ours_prefill(model: Any, prompt: list[int], repeats: int) -> dict[str, Any]:
    ttft = []
    for _ in range(repeats + 1):
        model.generate(prompt, max_new_tokens=1, temperature=0, ignore_eos=True)
        ttft.append(model.last_stats.time_to_first_token_s)
    t = _median(ttft[1:])
    return {"ttft_s": t, "prefill_tokens_per_s": len(prompt) / t}


def _first_divergence(ours: list[list[int]], theirs: list[list[int]]) -> int | None:
    for row_a, row_b in zip(ours, theirs, strict=True):
        for i, (a, b) in enumerate(zip(row_a, row_b, strict=False)):
            if a != b:
                return i
    return None


def _load_reference(path: Path | None) -> Any:
    path = path or Path.cwd() / _REFERENCE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (run from the repository or pass --reference)")
    spec = importlib.util.spec_from_file_location("pygpukit_torch_reference", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _reference_decode(module: Any, model: Any, prompts: list[list[int]], tokens: int,
                      repeats: int) -> dict[str, Any]:  # fmt: skip
    decoder = module.TorchDecoder.from_pygpukit(model, len(prompts[0]) + tokens, batch=len(prompts), compile=True)
    compile_start = time.perf_counter()
    rates, ttft, new = [], [], None
    for i in range(repeats + 1):
        new, stats = decoder.generate(prompts, tokens)
        if i == 0:
            compile_s = time.perf_counter() - compile_start
        rates.append(stats["decode_tokens_per_s"])
        ttft.append(stats["ttft_s"])
    del decoder
    return {"decode_tokens_per_s": _median(rates[1:]), "runs": rates[1:], "ttft_s": _median(ttft[1:]),
            "warmup_s": compile_s, "tokens": new}  # fmt: skip


def _peer(name: str) -> Any:
    """A peer library (torch, transformers), imported only when a peer runs."""
    return importlib.import_module(name)


def _transformers_model(config: dict[str, Any], dtype: str) -> Any:
    torch = _peer("torch")
    auto = _peer("transformers")
    AutoConfig, AutoModelForCausalLM = auto.AutoConfig, auto.AutoModelForCausalLM  # noqa: N806

    settings = dict(config)
    cfg = AutoConfig.for_model(settings.pop("model_type"), **settings)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=getattr(torch, dtype))
    return model.eval()


def transformers_decode(model: Any, prompt: list[int], tokens: int, repeats: int) -> dict[str, Any]:
    """A transformers model's greedy decode of ``tokens`` new tokens after ``prompt`` with its KV cache
    (its default eager path), ``repeats`` timed runs after a warm-up: median time to first token and
    decode tokens/s (tokens after the first over the time after the first)."""
    torch = _peer("torch")

    device = next(model.parameters()).device
    ids = torch.tensor([prompt], device=device)
    rates, ttft = [], []
    with torch.no_grad():
        for _ in range(repeats + 1):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = model(ids, use_cache=True)
            token = int(torch.argmax(out.logits[0, -1]))  # the read-back synchronises
            first = time.perf_counter()
            past = out.past_key_values
            for _ in range(tokens - 1):
                out = model(torch.tensor([[token]], device=device), past_key_values=past, use_cache=True)
                past = out.past_key_values
                token = int(torch.argmax(out.logits[0, -1]))
            end = time.perf_counter()
            ttft.append(first - start)
            rates.append((tokens - 1) / (end - first) if tokens > 1 else 0.0)
    return {"decode_tokens_per_s": _median(rates[1:]), "runs": rates[1:], "ttft_s": _median(ttft[1:])}


def _note(notes: list[str], text: str) -> None:
    notes.append(text)
    print(f"note: {text}", flush=True)


def _free() -> None:
    import pygpukit as gp

    gc.collect()
    gp.synchronize()
    from pygpukit.core.memory import empty_cache

    empty_cache()
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def run_shape(shape: str, *, dtype: str = "bfloat16", batches: Sequence[int] = (1, 8), tokens: int = 128,
              decode_prompt: int = 128, prompts: Sequence[int] = (128, 2048), engine: int = 0, repeats: int = 3,
              peers: Sequence[str] = ("compiled", "transformers"), reference: Path | None = None,
              num_layers: int | None = None, copy_gbps: float | None = None, seed: int = 0, quant: str | None = None,
              profile: Path | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:  # fmt: skip
    """Every measurement of one shape (see the module docstring); returns the JSON row."""
    notes: list[str] = []
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    model = random_model(shape, dtype, seed=seed, num_layers=num_layers, quant=quant, progress=False)
    weight_bytes = model.weights.nbytes
    log(f"{shape}: {weight_bytes / 1e9:.2f} GB of {dtype} weights made in {time.perf_counter() - start:.1f} s")
    vocab = model.config.vocab_size
    row: dict[str, Any] = {"shape": shape, "dtype": dtype, "quant": quant, "layers": model.config.num_layers,
                           "weight_bytes": weight_bytes, "backend": model.backend, "copy_gbps": copy_gbps,
                           "decode": [], "prefill": [], "notes": notes}  # fmt: skip
    decode_prompts = {b: _prompts(rng, vocab, b, decode_prompt) for b in batches}
    for b in batches:
        ours = _ours_decode(model, decode_prompts[b], tokens, repeats)
        entry: dict[str, Any] = {"batch": b, "ours": ours}
        if b == 1 and copy_gbps:
            entry["bandwidth_share"] = weight_bytes * ours["decode_tokens_per_s"] / (copy_gbps * 1e9)
        row["decode"].append(entry)
        share = f", {entry['bandwidth_share']:.0%} of the bandwidth limit" if "bandwidth_share" in entry else ""
        log(f"{shape} batch {b}: pygpukit[{ours['strategy']}] {ours['decode_tokens_per_s']:.1f} tok/s{share}")
    if profile is not None:
        trace = profile / f"{shape}{'-' + quant if quant else ''}-decode.json"
        log(f"{shape}: eager decode of {min(tokens, 32)} tokens, kernel by kernel (trace {trace}):")
        log(_profile_decode(model, decode_prompts[batches[0]][0][:8], min(tokens, 32), trace))
        row["profile"] = str(trace)
    if engine:
        ours = _ours_engine(model, _prompts(rng, vocab, engine, decode_prompt), tokens, repeats)
        row["engine"] = {"requests": engine, "ours": ours}
        log(f"{shape} engine, {engine} requests: {ours['decode_tokens_per_s']:.1f} tok/s (graph {ours['graph']})")
    prefill_prompts = {length: _prompts(rng, vocab, 1, length)[0] for length in prompts}
    for length in prompts:
        ours = _ours_prefill(model, prefill_prompts[length], repeats)
        row["prefill"].append({"tokens": length, "ours": ours})
        rate = ours["prefill_tokens_per_s"]
        log(f"{shape} prefill {length}: pygpukit {ours['ttft_s'] * 1e3:.2f} ms ({rate:.0f} tok/s)")
    if "compiled" in peers and quant is not None:
        _note(notes, "compiled reference skipped: it runs dense weights, this model is packed")
    elif "compiled" in peers:
        try:
            module = _load_reference(reference)
            for entry in row["decode"]:
                b = entry["batch"]
                ref = _reference_decode(module, model, decode_prompts[b], tokens, repeats)
                entry["compiled"] = ref
                entry["compiled_ratio"] = entry["ours"]["decode_tokens_per_s"] / ref["decode_tokens_per_s"]
                entry["first_divergence"] = _first_divergence(entry["ours"]["tokens"], ref["tokens"])
                same = "same tokens" if entry["first_divergence"] is None else (
                    f"tokens differ from step {entry['first_divergence']}")  # fmt: skip
                log(f"{shape} batch {b}: compiled reference {ref['decode_tokens_per_s']:.1f} tok/s "
                    f"(warm-up {ref['warmup_s']:.0f} s), ours {entry['compiled_ratio']:.2f}x, {same}")  # fmt: skip
                _free()
        except (ImportError, FileNotFoundError) as exc:
            _note(notes, f"compiled reference skipped: {exc}")
    if "transformers" in peers:
        del model
        _free()
        try:
            hf = _transformers_model(dict(MODEL_SHAPES[shape], **({"num_hidden_layers": num_layers} if num_layers
                                                                   else {})), dtype)  # fmt: skip
            first = next(e for e in row["decode"] if e["batch"] == 1) if 1 in batches else None
            if first is not None:
                ref = transformers_decode(hf, decode_prompts[1][0], tokens, repeats)
                first["transformers"] = ref
                first["transformers_ratio"] = first["ours"]["decode_tokens_per_s"] / ref["decode_tokens_per_s"]
                log(f"{shape} batch 1: transformers {ref['decode_tokens_per_s']:.1f} tok/s, "
                    f"ours {first['transformers_ratio']:.2f}x")  # fmt: skip
            for entry in row["prefill"]:
                ref = transformers_decode(hf, prefill_prompts[entry["tokens"]], 1, repeats)
                entry["transformers"] = ref
                entry["transformers_ratio"] = ref["ttft_s"] / entry["ours"]["ttft_s"]
                log(f"{shape} prefill {entry['tokens']}: transformers {ref['ttft_s'] * 1e3:.2f} ms, "
                    f"ours {entry['transformers_ratio']:.2f}x")  # fmt: skip
            del hf
            _free()
        except ImportError as exc:
            _note(notes, f"transformers skipped: {exc}")
    return row


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pygpukit.llm.benchmark", description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="smollm2-135m,qwen2.5-0.5b", help=f"comma list of {', '.join(MODEL_SHAPES)}")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batches", type=_ints, default=[1, 8], help="decode batch sizes (default 1,8)")
    p.add_argument("--tokens", type=int, default=128, help="new tokens per decode run")
    p.add_argument("--decode-prompt", type=int, default=128, help="prompt length of the decode runs")
    p.add_argument("--prompts", type=_ints, default=[128, 2048], help="prefill lengths (time to first token)")
    p.add_argument("--engine", type=int, default=0, help="requests through the continuous-batching engine")
    p.add_argument("--repeats", type=int, default=3, help="timed runs after one warm-up (the median is reported)")
    p.add_argument("--peers", default="compiled,transformers", help="comma list of compiled, transformers or none")
    p.add_argument("--reference", type=Path, help=f"the compiled reference (default ./{_REFERENCE})")
    p.add_argument("--num-layers", type=int, help="override the depth (quick checks)")
    p.add_argument(
        "--quant",
        help="keep the linear weights packed in this GGUF format (random blocks), e.g. q4_k, "
        "or a llama.cpp mix: q4_k_m, q5_k_m",
    )
    p.add_argument(
        "--fuse",
        choices=("true", "false", "all"),
        default="true",
        help="the decode step's fusions (DecodeM1's fuse: true is the default, all adds the fused GEMVs)",
    )
    p.add_argument(
        "--programmatic",
        action="store_true",
        help="launch the kernels that allow it with programmatic dependent launch (SM90+; off by default)",
    )
    p.add_argument("--json", type=Path, help="write every row here")
    p.add_argument("--profile", type=Path, metavar="DIR",
                   help="also profile one eager decode per shape: a kernel table, a chrome trace in DIR")  # fmt: skip
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    shapes = [s.strip().lower() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in MODEL_SHAPES]
    if unknown:
        print(f"unknown shapes {', '.join(unknown)} (known: {', '.join(MODEL_SHAPES)})", file=sys.stderr)
        return 2
    if args.repeats < 1 or args.tokens < 2:
        print("--repeats must be >= 1 and --tokens >= 2", file=sys.stderr)
        return 2
    import pygpukit as gp
    from pygpukit.core.jit import set_programmatic_launch

    from .decode import DecodeM1

    fuse_levels: dict[str, bool | str] = {"true": True, "false": False, "all": "all"}
    DecodeM1.fuse_default = fuse_levels[args.fuse]
    set_programmatic_launch(args.programmatic)
    print(f"decode fusions: {args.fuse}; programmatic launch: {'on' if args.programmatic else 'off'}", flush=True)
    peers = [] if args.peers == "none" else [p.strip() for p in args.peers.split(",") if p.strip()]
    copy_gbps = None
    if gp.backend_state().name == "cuda":
        from pygpukit.benchmark.quant_gemv import copy_bandwidth

        copy_gbps = copy_bandwidth()
        print(f"device copy bandwidth: {copy_gbps:.0f} GB/s (read + write)", flush=True)
    else:
        print("CPU simulation backend: the figures are the simulation's; peers are not measured", flush=True)
        peers = []
    rows = []
    for shape in shapes:
        rows.append(run_shape(shape, dtype=args.dtype, batches=args.batches, tokens=args.tokens,
                              decode_prompt=args.decode_prompt, prompts=args.prompts, engine=args.engine,
                              repeats=args.repeats, peers=peers, reference=args.reference,
                              num_layers=args.num_layers, copy_gbps=copy_gbps, quant=args.quant,
                              profile=args.profile, log=lambda text: print(text, flush=True)))  # fmt: skip
        if args.json:  # after every shape, so a run cut short keeps what it measured
            args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "fuse": args.fuse,
                                              "programmatic": args.programmatic, "rows": rows},
                                             indent=1) + "\n")  # fmt: skip
    print(report(rows))
    return 0


def report(rows: Sequence[dict[str, Any]]) -> str:
    """A markdown table of the decode and prefill figures."""
    lines = ["| shape | batch | pygpukit tok/s | compiled ref tok/s | ratio | transformers tok/s | ratio | "
             "bandwidth share |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for row in rows:
        for e in row["decode"]:
            ref, hf = e.get("compiled"), e.get("transformers")
            lines.append(
                f"| {row['shape']} | {e['batch']} | {e['ours']['decode_tokens_per_s']:.1f} | "
                f"{ref['decode_tokens_per_s']:.1f} | {e['compiled_ratio']:.2f} | " if ref else
                f"| {row['shape']} | {e['batch']} | {e['ours']['decode_tokens_per_s']:.1f} | - | - | "
            )  # fmt: skip
            lines[-1] += f"{hf['decode_tokens_per_s']:.1f} | {e['transformers_ratio']:.2f} | " if hf else "- | - | "
            lines[-1] += f"{e['bandwidth_share']:.0%} |" if "bandwidth_share" in e else "- |"
    lines += ["", "| shape | prompt tokens | pygpukit ttft ms | transformers ttft ms | ratio |",
              "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for row in rows:
        for e in row["prefill"]:
            hf = e.get("transformers")
            theirs = f"{hf['ttft_s'] * 1e3:.2f} | {e['transformers_ratio']:.2f} |" if hf else "- | - |"
            lines.append(f"| {row['shape']} | {e['tokens']} | {e['ours']['ttft_s'] * 1e3:.2f} | {theirs}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
