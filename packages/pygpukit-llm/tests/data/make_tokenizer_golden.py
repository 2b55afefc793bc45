"""Write the reference ("golden") tokenizer outputs that tests/test_tokenizer.py compares against.

Run it on a machine with torch and transformers (the GPU machine has both; it needs no network):

    python packages/pygpukit-llm/tests/data/make_tokenizer_golden.py \\
        --gguf /path/to/SmolLM2-135M-Instruct.Q4_1.gguf --name smollm2 --out packages/pygpukit-llm/tests/data

It loads the tokenizer the way a transformers user would (``AutoTokenizer.from_pretrained(dir,
gguf_file=name)``), so the file records what transformers makes of the GGUF's vocabulary: the ids of
every corpus string with and without special tokens, decodes of id lists, and chat-template renders.
The result is ``tokenizer_golden_<name>.json`` in the output directory; commit it next to this script.

The synthetic SentencePiece vocabulary of tests/conftest.py (``synthetic_spm_metadata``) can be written as GGUF
files first, to record what transformers makes of a "llama" (SentencePiece) vocabulary too:

    python .../make_tokenizer_golden.py --write-synthetic-ggufs /tmp/spm
    python .../make_tokenizer_golden.py --gguf /tmp/spm/synthetic-spm.gguf --name synthetic_spm --out ...
    python .../make_tokenizer_golden.py --gguf /tmp/spm/synthetic-spm_merges.gguf --name synthetic_spm_merges ...

transformers reads GGUF files with the ``gguf`` package, which must be importable too.

Only the standard library, transformers and tokenizers are imported here, so the script can run on a
machine where pygpukit itself is not installed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))

# Conversations whose renders are recorded; each is rendered with and without a generation prompt.
CONVERSATIONS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "Hello!"}],
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another one, in French \u00e9t\u00e9 style \U0001f600."},
    ],
    [
        {"role": "system", "content": "Answer in one word.\nBe nice."},
        {"role": "user", "content": "  spaced  \n"},
        {"role": "assistant", "content": "Okay"},
    ],
]


def _backend_summary(tokenizer: Any) -> dict[str, Any]:
    """The backend tokenizer's JSON without the (large) vocabulary and merges, for diagnosing differences."""
    data = json.loads(tokenizer.backend_tokenizer.to_str())
    model = data.get("model", {})
    data["model"] = {key: value for key, value in model.items() if key not in ("vocab", "merges")}
    return data


def _safe(fn: Any) -> Any:
    """Run ``fn``; record an exception as data so that one failing case does not lose the others."""
    try:
        return fn()
    except Exception as exc:  # the golden records any failure as a value
        return {"error": f"{type(exc).__name__}: {exc}"}


def write_synthetic_ggufs(out_dir: str) -> list[str]:
    """Write the synthetic SentencePiece vocabulary of tests/conftest.py as two small GGUF files (scores only,
    and with merges); returns their paths."""
    import importlib.util

    import gguf
    import numpy as np

    spec = importlib.util.spec_from_file_location("_llm_conftest", os.path.join(HERE, os.pardir, "conftest.py"))
    if spec is None or spec.loader is None:
        raise ImportError("cannot load tests/conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for with_merges, name in ((False, "synthetic-spm"), (True, "synthetic-spm_merges")):
        meta = conftest.synthetic_spm_metadata(with_merges=with_merges)
        tokens = meta["tokenizer.ggml.tokens"]
        path = os.path.join(out_dir, f"{name}.gguf")
        w = gguf.GGUFWriter(path, "llama")
        w.add_name(meta["general.name"])
        # A minimal model description: transformers reads a config from every GGUF it opens.
        w.add_block_count(1)
        w.add_context_length(64)
        w.add_embedding_length(8)
        w.add_feed_forward_length(16)
        w.add_head_count(2)
        w.add_head_count_kv(2)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_rope_dimension_count(4)
        w.add_vocab_size(len(tokens))
        w.add_tokenizer_model(meta["tokenizer.ggml.model"])
        w.add_tokenizer_pre(meta["tokenizer.ggml.pre"])
        w.add_token_list(tokens)
        w.add_token_scores(meta["tokenizer.ggml.scores"])
        w.add_token_types(meta["tokenizer.ggml.token_type"])
        if with_merges:
            w.add_token_merges(meta["tokenizer.ggml.merges"])
        w.add_bos_token_id(meta["tokenizer.ggml.bos_token_id"])
        w.add_eos_token_id(meta["tokenizer.ggml.eos_token_id"])
        w.add_unk_token_id(meta["tokenizer.ggml.unknown_token_id"])
        w.add_add_bos_token(meta["tokenizer.ggml.add_bos_token"])
        w.add_add_eos_token(meta["tokenizer.ggml.add_eos_token"])
        w.add_add_space_prefix(meta["tokenizer.ggml.add_space_prefix"])
        w.add_chat_template(meta["tokenizer.chat_template"])
        w.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", help="path of the GGUF file")
    parser.add_argument("--name", default="smollm2", help="model name in the output file name (default smollm2)")
    parser.add_argument("--out", help="output directory")
    parser.add_argument("--corpus", default=os.path.join(HERE, "tokenizer_corpus.json"), help="corpus JSON")
    parser.add_argument("--write-synthetic-ggufs", metavar="DIR", help="write the synthetic SentencePiece GGUFs")
    args = parser.parse_args(argv)
    if args.write_synthetic_ggufs:
        for path in write_synthetic_ggufs(args.write_synthetic_ggufs):
            print(f"wrote {path}")
        return 0
    if not args.gguf or not args.out:
        parser.error("--gguf and --out are required")

    import tokenizers
    import transformers
    from transformers import AutoTokenizer

    with open(args.corpus, encoding="utf-8") as f:
        corpus: list[str] = json.load(f)

    gguf_path = os.path.abspath(args.gguf)
    tok = AutoTokenizer.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path))

    encodings = []
    for text in corpus:
        ids = tok.encode(text, add_special_tokens=False)
        encodings.append(
            {
                "text": text,
                "ids": ids,
                "ids_special": tok.encode(text, add_special_tokens=True),
                "decoded": tok.decode(ids, skip_special_tokens=False),
                "decoded_skip": tok.decode(ids, skip_special_tokens=True),
            }
        )

    # Id lists that no corpus string produces: runs of low ids (the special tokens of most vocabularies),
    # single ids, and random lists, which include partial UTF-8 sequences of byte-level vocabularies.
    vocab_size = len(tok)
    rng = random.Random(1234)
    id_lists: list[list[int]] = [[], list(range(min(vocab_size, 64)))]
    id_lists += [[i] for i in range(0, vocab_size, max(1, vocab_size // 97))]
    id_lists += [[rng.randrange(vocab_size) for _ in range(rng.randint(1, 24))] for _ in range(60)]
    decodes = [
        {
            "ids": ids,
            "decoded": _safe(lambda ids=ids: tok.decode(ids, skip_special_tokens=False)),
            "decoded_skip": _safe(lambda ids=ids: tok.decode(ids, skip_special_tokens=True)),
            "tokens": _safe(lambda ids=ids: tok.convert_ids_to_tokens(ids)),
        }
        for ids in id_lists
    ]

    chats = []
    for messages in CONVERSATIONS:
        for add_generation_prompt in (True, False):
            rendered = _safe(
                lambda messages=messages, agp=add_generation_prompt: tok.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=agp
                )
            )
            chats.append(
                {
                    "messages": messages,
                    "add_generation_prompt": add_generation_prompt,
                    "rendered": rendered,
                    "ids": tok.encode(rendered, add_special_tokens=False) if isinstance(rendered, str) else None,
                }
            )

    golden = {
        "generator": "make_tokenizer_golden.py",
        "versions": {
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "python": sys.version.split()[0],
        },
        "gguf_file": os.path.basename(gguf_path),
        "tokenizer_class": type(tok).__name__,
        "len": vocab_size,
        "vocab_size": tok.vocab_size,
        "bos_token": tok.bos_token,
        "bos_token_id": tok.bos_token_id,
        "eos_token": tok.eos_token,
        "eos_token_id": tok.eos_token_id,
        "pad_token": tok.pad_token,
        "pad_token_id": tok.pad_token_id,
        "unk_token": tok.unk_token,
        "unk_token_id": tok.unk_token_id,
        "add_bos_token": getattr(tok, "add_bos_token", None),
        "add_eos_token": getattr(tok, "add_eos_token", None),
        "special_tokens_map": {key: str(value) for key, value in tok.special_tokens_map.items()},
        "all_special_tokens": list(tok.all_special_tokens),
        "all_special_ids": list(tok.all_special_ids),
        "added_tokens": {str(i): str(t) for i, t in sorted(tok.added_tokens_decoder.items())},
        "chat_template": tok.chat_template,
        "backend": _backend_summary(tok),
        "encodings": encodings,
        "decodes": decodes,
        "chats": chats,
    }

    os.makedirs(args.out, exist_ok=True)
    out_path = os.path.join(args.out, f"tokenizer_golden_{args.name}.json")
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=True, indent=1)
        f.write("\n")
    print(f"wrote {out_path}: {len(encodings)} encodings, {len(decodes)} decodes, {len(chats)} chats")
    return 0


if __name__ == "__main__":
    sys.exit(main())
