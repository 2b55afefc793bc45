"""Fuzz target: GGUF files (pygpukit.llm.gguf), and what the loader builds from their metadata (the model
config of pygpukit.llm.config and the tokenizer of pygpukit.llm.tokenizer).

Contract: opening any file either succeeds or raises GGUFError, and without the reader's defence-in-depth
catch having to turn a stray ValueError or IndexError into one (the checks are meant to leave it nothing);
every tensor of a file that opens can be read (its bytes lie inside the file) and small ones dequantized
(any PyGPUkitError); the model config raises ModelConfigError and the tokenizer TokenizerError, or they
succeed and the tokenizer encodes and decodes.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import checked, instrumented, main, scratch_dir

with instrumented("pygpukit.llm.gguf", "pygpukit.llm.config", "pygpukit.llm.tokenizer"):
    from pygpukit.core.errors import PyGPUkitError
    from pygpukit.llm.config import ModelConfigError, config_from_gguf_metadata
    from pygpukit.llm.gguf import GGUFError, GGUFFile
    from pygpukit.llm.tokenizer import Tokenizer, TokenizerError

ERRORS = (GGUFError,)
_FILE = scratch_dir("gguf") / "input.gguf"


def _write(path: Path, arch: str, tokenizer: str) -> None:
    import gguf
    from gguf import GGMLQuantizationType as QType
    from gguf.quants import quantize

    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(str(path), arch=arch)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_layer_norm_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_array("test.nested", [[1, 2], [3]])
    w.add_float64("test.f64", 0.25)
    tokens = ["<unk>", "<s>", "</s>", "<0x0A>", "\u2581a", "\u2581the", "a", "b", "ab", "\u0120a", "\u0120", "\u65e5"]
    w.add_tokenizer_model(tokenizer)
    w.add_token_list(tokens)
    w.add_token_types([2, 3, 3, 6, *[1] * (len(tokens) - 4)])
    w.add_token_scores([float(-i) for i in range(len(tokens))])
    w.add_token_merges(["a b", "\u0120 a"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    w.add_tensor("token_embd.weight", rng.standard_normal((12, 32)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 8)).astype(np.float16))
    for qtype in (QType.Q8_0, QType.Q4_0, QType.Q4_1):
        q = quantize(rng.standard_normal((2, 32)).astype(np.float32), qtype)
        w.add_tensor(f"q.{qtype.name}", q, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def seeds() -> list[bytes]:
    found = []
    with tempfile.TemporaryDirectory() as folder:
        for i, (arch, tokenizer) in enumerate((("llama", "llama"), ("qwen2", "gpt2"), ("gpt2", "gpt2"))):
            path = Path(folder) / f"seed{i}.gguf"
            _write(path, arch, tokenizer)
            found.append(path.read_bytes())
    return found


def one_input(data: bytes) -> None:
    _FILE.write_bytes(data)
    try:
        f = GGUFFile(_FILE)
    except GGUFError as exc:
        if exc.__cause__ is not None:  # the reader's last-resort catch: a check it should have made
            raise AssertionError(f"unchecked {type(exc.__cause__).__name__}: {exc}") from exc
        return
    with f:
        repr(f)
        checked(ERRORS, lambda: f.architecture)
        for key in f.metadata:
            f.get(key)
        for name, info in f.tensors.items():
            assert name in f
            raw = f.raw(name)
            assert raw.size == info.nbytes, (name, raw.size, info.nbytes)
            if info.nbytes <= 1 << 14:
                array = checked((PyGPUkitError,), lambda name=name: f.to_gpu(name))
                if array is not None:
                    assert array.shape == info.shape
        checked((ModelConfigError,), lambda: config_from_gguf_metadata(f.metadata))
        tokenizer = checked((TokenizerError,), lambda: Tokenizer.from_gguf_metadata(f.metadata))
        if tokenizer is not None:
            ids = tokenizer.encode("a the ab \u65e5\n")
            tokenizer.decode(ids)


if __name__ == "__main__":
    main("gguf", one_input, seeds)
