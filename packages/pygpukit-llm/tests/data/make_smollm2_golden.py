"""Write the reference generations of SmolLM2-135M-Instruct (Q4_1 GGUF) with transformers.

Run on a machine with torch, transformers and gguf (the lent GPU machine; no network needed):

    python make_smollm2_golden.py /path/to/SmolLM2-135M-Instruct.Q4_1.gguf OUT_DIR

transformers dequantizes the GGUF to float32 and runs its own LLaMA model; for each of five prompts
(three chat turns rendered with the GGUF's chat template, two raw texts) the script records the prompt
ids and 64 greedy tokens (argmax at every step, no stop on end-of-sequence ids), as
``smollm2_golden.json``. ``packages/pygpukit-llm/tests/test_smollm2.py`` compares pygpukit's ids
with these on the CPU backend (CI) and on the GPU.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
from pathlib import Path
from typing import Any

NEW_TOKENS = 64
CHATS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Write a haiku about GPUs."},
    ],
    [{"role": "user", "content": "Explain in two sentences why the sky is blue."}],
]
RAW = ["The quick brown fox", "def fibonacci(n):\n"]


def _greedy(torch: Any, model: Any, ids: list[int], new_tokens: int, device: str) -> list[int]:
    """Greedy decoding over transformers' KV cache, never stopping early."""
    out: list[int] = []
    past = None
    step = torch.tensor([ids], device=device)
    with torch.no_grad():
        for _ in range(new_tokens):
            result = model(step, past_key_values=past, use_cache=True)
            past = result.past_key_values
            token = int(torch.argmax(result.logits[0, -1].float()))
            out.append(token)
            step = torch.tensor([[token]], device=device)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    directory, name = str(args.gguf.parent), args.gguf.name
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, torch_dtype=torch.float32).to(device)
    model.eval()

    cases: list[dict[str, Any]] = []
    for messages in CHATS:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        cases.append({"kind": "chat", "messages": messages, "prompt_text": text, "prompt_ids": ids})
    for text in RAW:
        ids = tokenizer(text)["input_ids"]
        cases.append({"kind": "raw", "prompt_text": text, "prompt_ids": ids})
    for case in cases:
        case["new_ids"] = _greedy(torch, model, case["prompt_ids"], NEW_TOKENS, device)
        case["new_text"] = tokenizer.decode(case["new_ids"], skip_special_tokens=True)
        print(repr(case["prompt_text"][-60:]), "->", repr(case["new_text"][:80]), flush=True)

    digest = hashlib.sha256(args.gguf.read_bytes()).hexdigest()
    meta = {
        "model": name, "sha256": digest, "transformers": transformers.__version__, "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor(), "dtype": "float32",
        "new_tokens": NEW_TOKENS, "eos_token_id": tokenizer.eos_token_id, "bos_token_id": tokenizer.bos_token_id,
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "smollm2_golden.json").write_text(json.dumps({"meta": meta, "cases": cases}, indent=1) + "\n")


if __name__ == "__main__":
    main()
