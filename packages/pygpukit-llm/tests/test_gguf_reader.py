"""pygpukit.llm.gguf: files written by gguf.GGUFWriter read back (metadata, NumPy-order shapes, raw
bytes, to_gpu), crafted malformed files each rejected with a GGUFError naming the file and the offset,
the SmolLM2-135M GGUF when present (checked against gguf.GGUFReader), and hypothesis fuzzing of real
headers: flipped bytes, truncation and huge count/length fields open and read, or raise GGUFError and
nothing else, with bounded memory."""

from __future__ import annotations

import contextlib
import random
import re
import struct
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import ml_dtypes
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QType
from gguf.quants import dequantize, quantize
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import pygpukit as gp
from pygpukit.core.errors import PyGPUkitError
from pygpukit.llm.gguf import GGUFError, GGUFFile, GGUFTensorInfo

Array = np.ndarray[Any, Any]

MiB = 1 << 20
PLAIN = {"F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"}


# -- writing test files ------------------------------------------------------------------------------
def _tokens(n: int) -> list[str]:
    # A tokenizer-like vocabulary: specials, byte-level pieces, multi-byte UTF-8.
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    pieces = ["\u0120the", "\u0120a", "in", "\u65e5\u672c", "\u00e9t\u00e9", "\U0001f600", "\n", "<0x0A>"]
    return specials + [f"{pieces[i % len(pieces)]}{i}" for i in range(n - len(specials))]


def _write_model(path: Path, *, alignment: int | None = None, n_tokens: int = 2000) -> dict[str, tuple[str, Array]]:
    """A small llama-like GGUF; returns name -> (qtype, the logical float/int values or the raw bytes)."""
    rng = np.random.default_rng(1234)
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_block_count(2)
    w.add_string("general.name", "tiny test model")
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -7)
    w.add_uint16("test.u16", 65000)
    w.add_int16("test.i16", -30000)
    w.add_int32("test.i32", -123456)
    w.add_uint64("test.u64", 2**63 + 5)
    w.add_int64("test.i64", -(2**62))
    w.add_float32("test.f32", 0.5)
    w.add_float64("test.f64", 1e-300)
    w.add_bool("test.bool", True)
    w.add_array("test.bools", [True, False, True])
    w.add_array("test.nested", [[1, 2], [3]])
    w.add_array("tokenizer.ggml.tokens", _tokens(n_tokens))
    w.add_array("tokenizer.ggml.token_type", [1 + i % 3 for i in range(n_tokens)])
    w.add_array("tokenizer.ggml.scores", [float(-i) for i in range(n_tokens)])
    w.add_array("tokenizer.ggml.merges", ["\u0120 t", "i n", "\u65e5 \u672c"])
    w.add_string("tokenizer.chat_template", "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    if alignment is not None:
        w.add_custom_alignment(alignment)

    tensors: dict[str, tuple[str, Array]] = {}

    def add(name: str, qtype: QType, values: Array, stored: Array | None = None) -> None:
        if stored is None:
            w.add_tensor(name, values)
        else:
            w.add_tensor(name, stored, raw_dtype=qtype)
        tensors[name] = (qtype.name, values)

    add("f32", QType.F32, rng.standard_normal((3, 8)).astype(np.float32))
    add("bias", QType.F32, rng.standard_normal(7).astype(np.float32))
    add("f16", QType.F16, rng.standard_normal((4, 5)).astype(np.float16))
    add("rank4", QType.F32, rng.standard_normal((2, 3, 4, 5)).astype(np.float32))
    add("i32", QType.I32, rng.integers(-1000, 1000, (2, 3), dtype=np.int32))
    bf16 = rng.standard_normal((2, 6)).astype(np.float32)
    add("bf16", QType.BF16, bf16.astype(ml_dtypes.bfloat16).astype(np.float32), quantize(bf16, QType.BF16))
    for qtype, shape in ((QType.Q8_0, (4, 64)), (QType.Q4_1, (3, 32)), (QType.Q4_0, (2, 96)), (QType.Q5_1, (2, 32))):
        x = rng.standard_normal(shape).astype(np.float32)
        q = quantize(x, qtype)
        add(f"q.{qtype.name}", qtype, dequantize(q, qtype), q)
    # No NumPy quantizer for K-quants: random blocks with a finite f16 scale d (the last 2 bytes of a block).
    q6 = rng.integers(0, 256, (2, 210), dtype=np.uint8)
    q6[:, 208:210] = np.array([0.01], dtype="<f2").view(np.uint8)
    add("q.Q6_K", QType.Q6_K, dequantize(q6, QType.Q6_K), q6)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


def _stored_bytes(qtype: str, values: Array) -> bytes:
    if qtype == "BF16":
        return values.astype(ml_dtypes.bfloat16).tobytes()
    return values.tobytes()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gguf")


@pytest.fixture(scope="module")
def written(model_dir: Path) -> tuple[Path, dict[str, tuple[str, Array]]]:
    path = model_dir / "tiny.gguf"
    return path, _write_model(path)


# -- crafted files -----------------------------------------------------------------------------------
def _s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def _kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return _s(key) + struct.pack("<I", vtype) + payload


def _tensor(name: str | bytes, dims: list[int], type_id: int, rel: int) -> bytes:
    return (_s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
            + struct.pack("<IQ", type_id, rel))  # fmt: skip


ARCH = _kv("general.architecture", 8, _s("llama"))


def _build(
    kvs: list[bytes] | None = None,
    infos: list[bytes] | None = None,
    data: bytes = b"",
    *,
    version: bytes = struct.pack("<I", 3),
    magic: bytes = b"GGUF",
    counts: tuple[int, int] | None = None,
    alignment: int = 32,
) -> bytes:
    kvs = [ARCH] if kvs is None else kvs
    infos = [] if infos is None else infos
    n_tensors, n_kv = (len(infos), len(kvs)) if counts is None else counts
    head = magic + version + struct.pack("<QQ", n_tensors, n_kv) + b"".join(kvs) + b"".join(infos)
    return head + b"\0" * (-len(head) % alignment) + data


def _u32(key: str, value: int) -> bytes:
    return _kv(key, 4, struct.pack("<I", value))


def _nested(depth: int) -> bytes:
    # depth arrays, each holding one array, the innermost holding one uint8
    payload = struct.pack("<IQ", 0, 1) + b"\x07"
    for _ in range(depth - 1):
        payload = struct.pack("<IQ", 9, 1) + payload
    return _kv("test.nested", 9, payload)


F32_16 = bytes(64)  # 16 float32 zeros
BAD_FILES: dict[str, tuple[bytes, str, int | None]] = {
    # name: (file bytes, fragment of the message, offset or None for "somewhere in the file")
    "empty": (b"", "too short", 0),
    "short": (b"GGUF\x03\x00\x00\x00", "too short", 8),
    "magic": (_build(magic=b"GGML"), "not a GGUF file", 0),
    "version 1": (_build(version=struct.pack("<I", 1)), "unsupported version 1", 4),
    "version 4": (_build(version=struct.pack("<I", 4)), "unsupported version 4", 4),
    "big-endian": (_build(version=struct.pack(">I", 3)), "big-endian", 4),
    "huge kv count": (_build(counts=(0, 2**64 - 1)), "metadata count", 16),
    "huge tensor count": (_build(counts=(2**40, 1)), "tensor count", 8),
    "kv count past the end": (_build(counts=(0, 3), alignment=1), "needs 8 bytes", 69),
    "huge key length": (_build([struct.pack("<Q", 2**63) + b"abc" * 8]), "past the end", 24),
    "huge string length": (_build([_kv("k", 8, struct.pack("<Q", 2**64 - 1) + b"x" * 16)]), "past the end", None),
    "huge array count": (_build([_kv("k", 9, struct.pack("<IQ", 4, 2**62) + bytes(16))]), "claims", 24 + 9 + 4 + 4),
    "huge string array count": (_build([_kv("k", 9, struct.pack("<IQ", 8, 2**61) + bytes(16))]), "claims", 41),
    "string array item past the end": (
        _build([_kv("k", 9, struct.pack("<IQ", 8, 2) + _s("a") + struct.pack("<Q", 99))]),
        "past the end",
        None,
    ),
    "unknown value type": (_build([_kv("k", 13, bytes(8))]), "unknown value type 13", 33),
    "unknown array item type": (
        _build([_kv("k", 9, struct.pack("<IQ", 77, 1) + bytes(8))]),
        "unknown value type 77",
        37,
    ),
    "duplicate key": (_build([ARCH, ARCH]), "duplicate metadata key 'general.architecture'", 24 + len(ARCH)),
    "bad UTF-8 key": (_build([_kv(b"ab\xff", 4, bytes(4))]), "not valid UTF-8", 34),
    "bad UTF-8 value": (_build([_kv("k", 8, _s(b"\xc3("))]), "not valid UTF-8", 45),
    "bad UTF-8 array item": (
        _build([_kv("k", 9, struct.pack("<IQ", 8, 2) + _s("ok") + _s(b"x\x80"))]),
        "item 1 of 'k' is not valid UTF-8",
        24 + 13 + 12 + 10 + 8 + 1,
    ),
    "bool 2": (_build([_kv("k", 7, b"\x02")]), "must be 0 or 1", 37),
    "bool array item 5": (_build([_kv("k", 9, struct.pack("<IQ", 7, 3) + b"\x00\x01\x05")]), "bool stored as 5", 51),
    "alignment 48": (_build([ARCH, _u32("general.alignment", 48)]), "not a power of two", None),
    "alignment 0": (_build([ARCH, _u32("general.alignment", 0)]), "not a power of two", None),
    "alignment u64": (_build([ARCH, _kv("general.alignment", 10, struct.pack("<Q", 32))]), "must be a uint32", None),
    "arrays nested 5 deep": (_build([ARCH, _nested(5)]), "deeper than 4", None),
    "rank 0": (_build(infos=[_tensor("t", [], 0, 0)], data=F32_16), "rank 0", None),
    "rank 5": (_build(infos=[_tensor("t", [1, 1, 1, 1, 1], 0, 0)], data=F32_16), "rank 5", None),
    "zero dim": (_build(infos=[_tensor("t", [4, 0], 0, 0)], data=F32_16), "zero dim", None),
    "huge dims": (_build(infos=[_tensor("t", [2**63, 2**63], 0, 0)], data=F32_16), "past the end", None),
    "removed type Q4_2": (_build(infos=[_tensor("w", [32], 4, 0)], data=F32_16), "'w' has unknown type id 4", None),
    "type 1000": (_build(infos=[_tensor("w", [32], 1000, 0)], data=F32_16), "unknown type id 1000", None),
    "partial block": (_build(infos=[_tensor("w", [33, 2], 8, 0)], data=bytes(256)), "block size 32", None),
    "misaligned offset": (_build(infos=[_tensor("t", [4], 0, 16)], data=F32_16), "alignment 32", None),
    "data past the end": (_build(infos=[_tensor("t", [17], 0, 0)], data=F32_16), "past the end", None),
    "overlap": (_build(infos=[_tensor("a", [16], 0, 0), _tensor("b", [4], 0, 32)], data=bytes(128)), "overlaps", None),
    "duplicate tensor": (
        _build(infos=[_tensor("a", [4], 0, 0), _tensor("a", [4], 0, 32)], data=bytes(64)),
        "duplicate tensor name 'a'",
        None,
    ),
    "bad UTF-8 tensor name": (_build(infos=[_tensor(b"\xffw", [4], 0, 0)], data=F32_16), "not valid UTF-8", None),
    "tensor info cut short": (_build(infos=[_tensor("t", [4], 0, 0)[:-3]], alignment=1), "needs 8 bytes", None),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_malformed_files_raise_gguf_error_naming_file_and_offset(tmp_path: Path, case: str) -> None:
    blob, fragment, offset = BAD_FILES[case]
    path = tmp_path / "bad.gguf"
    path.write_bytes(blob)
    with pytest.raises(GGUFError) as info:
        GGUFFile(path)
    err = info.value
    message = str(err)
    assert fragment in message
    assert isinstance(err, ValueError)
    assert isinstance(err, PyGPUkitError)
    assert err.path == str(path)
    assert message.startswith(f"{path}: ")
    assert f"at byte offset {err.offset}" in message
    assert 0 <= err.offset <= len(blob)
    if offset is not None:
        assert err.offset == offset, message


def test_valid_crafted_edge_cases(tmp_path: Path) -> None:
    # Alignment 1 puts float32 data at an odd offset; nested arrays; a file with no tensors.
    values = np.arange(5, dtype=np.float32)
    blob = _build([ARCH, _u32("general.alignment", 1), _nested(4)],
                  [_tensor("odd", [5], 0, 0)], values.tobytes(), alignment=1)  # fmt: skip
    path = tmp_path / "edge.gguf"
    path.write_bytes(blob)
    with GGUFFile(path) as f:
        assert f.alignment == 1
        assert f.tensors["odd"].offset % 4 != 0
        assert f.metadata["test.nested"] == [[[[7]]]]
        np.testing.assert_array_equal(f.raw("odd").view("<f4"), values)
        np.testing.assert_array_equal(f.to_gpu("odd").to_numpy(), values)
    path.write_bytes(_build())
    with GGUFFile(path) as f:
        assert len(f) == 0
        assert f.tensor_names == []
        assert f.architecture == "llama"


def test_missing_architecture_and_tensor(tmp_path: Path) -> None:
    path = tmp_path / "noarch.gguf"
    path.write_bytes(_build([_u32("llama.block_count", 2)]))
    with GGUFFile(path) as f:
        assert f.get("llama.block_count") == 2
        assert f.get("nope", "default") == "default"
        with pytest.raises(GGUFError, match=r"general\.architecture"):
            _ = f.architecture
        with pytest.raises(KeyError, match="no tensor 'x'"):
            f.raw("x")


def test_corrupt_count_fails_before_values_are_built(tmp_path: Path) -> None:
    # A uint16 array whose count swallows 8 MiB that should have been tensor infos and data: the first
    # pass finds the tensor info missing, so the 4M-item list (150 MB of Python ints) is never built.
    n = 4 << 20
    path = tmp_path / "swallow.gguf"
    path.write_bytes(
        _build([ARCH, _kv("k", 9, struct.pack("<IQ", 2, n))], counts=(1, 2), alignment=1) + b"\xff" * 2 * n
    )
    with _tracing():
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        with pytest.raises(GGUFError, match="name of tensor 0 needs 8 bytes"):
            GGUFFile(path)
        peak = tracemalloc.get_traced_memory()[1] - before
    assert peak < 4 * MiB


def test_metadata_item_limit(tmp_path: Path) -> None:
    n = (1 << 23) + 1
    path = tmp_path / "many.gguf"
    path.write_bytes(_build([ARCH, _kv("k", 9, struct.pack("<IQ", 0, n) + bytes(n))]))
    with pytest.raises(GGUFError, match="more than 8388608 array items") as info:
        GGUFFile(path)
    assert info.value.offset == 24 + len(ARCH) + 13 + 4  # the count field


def test_missing_file_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        GGUFFile(tmp_path / "absent.gguf")


# -- files from GGUFWriter ---------------------------------------------------------------------------
def test_reads_back_metadata(written: tuple[Path, dict[str, tuple[str, Array]]]) -> None:
    path, _ = written
    with GGUFFile(path) as f:
        assert f.version == 3
        assert f.architecture == "llama"
        assert f.alignment == 32
        m = f.metadata
        assert m["llama.block_count"] == 2
        assert m["general.name"] == "tiny test model"
        assert (m["test.u8"], m["test.i8"], m["test.u16"], m["test.i16"]) == (200, -7, 65000, -30000)
        assert (m["test.i32"], m["test.u64"], m["test.i64"]) == (-123456, 2**63 + 5, -(2**62))
        assert m["test.f32"] == 0.5
        assert m["test.f64"] == 1e-300
        assert m["test.bool"] is True
        assert m["test.bools"] == [True, False, True]
        assert m["test.nested"] == [[1, 2], [3]]
        assert m["tokenizer.ggml.tokens"] == _tokens(2000)
        assert m["tokenizer.ggml.token_type"] == [1 + i % 3 for i in range(2000)]
        assert m["tokenizer.ggml.scores"][:3] == [0.0, -1.0, -2.0]
        assert m["tokenizer.ggml.merges"][2] == "\u65e5 \u672c"
        assert isinstance(m["tokenizer.chat_template"], str)
        for value in m.values():  # plain Python values only
            assert type(value) in (str, int, float, bool, list)


def test_reads_back_tensors(written: tuple[Path, dict[str, tuple[str, Array]]]) -> None:
    path, expected = written
    reference = gguf.GGUFReader(path)
    with GGUFFile(path) as f:
        assert f.tensor_names == list(expected)
        assert len(f) == len(expected)
        assert "f32" in f
        assert "nope" not in f
        for ref in reference.tensors:
            info = f.tensors[ref.name]
            qtype, values = expected[ref.name]
            assert isinstance(info, GGUFTensorInfo)
            assert info.qtype == qtype == ref.tensor_type.name
            assert info.type_id == int(ref.tensor_type)
            assert info.shape == values.shape  # NumPy order
            assert info.shape == tuple(reversed(ref.shape.tolist()))
            assert info.n_elements == values.size
            assert (info.offset, info.nbytes) == (ref.data_offset, ref.n_bytes)
            assert info.offset % 32 == 0
            raw = f.raw(ref.name)
            assert raw.dtype == np.uint8
            assert not raw.flags.writeable
            assert raw.tobytes() == ref.data.tobytes()
            if qtype in PLAIN:
                assert raw.tobytes() == _stored_bytes(qtype, values)


def test_custom_alignment(model_dir: Path) -> None:
    path = model_dir / "aligned.gguf"
    _write_model(path, alignment=256, n_tokens=10)
    with GGUFFile(path) as f:
        assert f.alignment == 256
        assert f.data_offset % 256 == 0
        assert all(t.offset % 256 == 0 for t in f.tensors.values())


@pytest.mark.parametrize("name", ["f32", "bias", "f16", "rank4", "i32", "bf16"])
def test_to_gpu_plain_types(written: tuple[Path, dict[str, tuple[str, Array]]], name: str) -> None:
    path, expected = written
    _, values = expected[name]
    with GGUFFile(path) as f:
        out = f.to_gpu(name)
        assert out.dtype == gp.float32
        assert out.shape == values.shape
        np.testing.assert_array_equal(out.to_numpy(), values.astype(np.float32))
        native = {"f16": gp.float16, "i32": gp.int32, "bf16": gp.bfloat16}.get(name, gp.float32)
        kept = f.to_gpu(name, dtype=native, stream=gp.Stream())
        assert kept.dtype == native
        assert kept.to_numpy().tobytes() == f.raw(name).tobytes()


@pytest.mark.parametrize("name", ["q.Q8_0", "q.Q4_1", "q.Q4_0", "q.Q5_1", "q.Q6_K"])
@pytest.mark.parametrize("dtype", [None, gp.float16])
def test_to_gpu_quantized_types(written: tuple[Path, dict[str, tuple[str, Array]]], name: str, dtype: Any) -> None:
    path, expected = written
    _, values = expected[name]
    with GGUFFile(path) as f:
        out = f.to_gpu(name, dtype=dtype)
    assert out.shape == values.shape
    assert out.dtype == (gp.float32 if dtype is None else dtype)
    np.testing.assert_allclose(out.to_numpy().astype(np.float32), values, rtol=1e-3, atol=1e-3)


def test_close_keeps_handed_out_views(written: tuple[Path, dict[str, tuple[str, Array]]]) -> None:
    path, expected = written
    f = GGUFFile(path)
    view = f.raw("f32")
    f.close()
    f.close()  # twice is fine
    assert view.tobytes() == expected["f32"][1].tobytes()  # the mapping lives as long as the view
    assert f.metadata["llama.block_count"] == 2
    with pytest.raises(GGUFError, match="closed"):
        f.raw("f32")
    with GGUFFile(path) as g:
        assert "GGUFFile(" in repr(g)
        assert "architecture='llama'" in repr(g)


# -- the real model ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2(smollm2_gguf: Path) -> Path:
    return smollm2_gguf


def test_smollm2(smollm2: Path) -> None:
    with GGUFFile(smollm2) as f:
        assert f.version == 3
        assert f.architecture == "llama"
        assert len(f) == 272
        embed = f.tensors["token_embd.weight"]
        assert (embed.qtype, embed.shape) == ("Q8_0", (49152, 576))
        down = f.tensors["blk.0.ffn_down.weight"]
        assert (down.qtype, down.shape, down.nbytes) == ("Q4_1", (576, 1536), 576 * 1536 // 32 * 20)
        assert f.get("llama.block_count") == 30
        assert len(f.metadata["tokenizer.ggml.tokens"]) == 49152
        assert isinstance(f.get("tokenizer.chat_template"), str)
        norm = f.to_gpu("blk.0.attn_norm.weight")
        np.testing.assert_array_equal(norm.to_numpy(), f.raw("blk.0.attn_norm.weight").view("<f4"))


def test_smollm2_matches_gguf_reader(smollm2: Path) -> None:
    reference = gguf.GGUFReader(smollm2)  # about 2 s
    with GGUFFile(smollm2) as f:
        assert f.data_offset == reference.data_offset
        assert f.tensor_names == [t.name for t in reference.tensors]
        for ref in reference.tensors:
            info = f.tensors[ref.name]
            assert (info.offset, info.nbytes, info.n_elements) == (ref.data_offset, ref.n_bytes, ref.n_elements)
            assert info.shape == tuple(reversed(ref.shape.tolist()))
        for name in ("token_embd.weight", "blk.0.ffn_down.weight", "blk.29.attn_k.weight", "output_norm.weight"):
            ref = next(t for t in reference.tensors if t.name == name)
            assert f.raw(name).tobytes() == ref.data.tobytes()
        for key, field in reference.fields.items():
            if not key.startswith("GGUF."):
                assert f.metadata[key] == field.contents(), key


def test_smollm2_dequantizes_like_gguf(smollm2: Path) -> None:
    with GGUFFile(smollm2) as f:
        for name in ("blk.0.ffn_down.weight", "blk.0.attn_q.weight"):
            info = f.tensors[name]
            ref = dequantize(f.raw(name).reshape(info.shape[0], -1), QType[info.qtype])
            np.testing.assert_allclose(f.to_gpu(name).to_numpy(), ref, rtol=1e-5, atol=1e-6)


# -- fuzzing -----------------------------------------------------------------------------------------
class Header:
    """A valid file's first bytes and the (offset, width) of each integer field of its header."""

    def __init__(
        self, blob: bytes, fields: list[tuple[int, int]], tensor_fields: list[tuple[int, int]], end: int, size: int
    ) -> None:
        self.blob = blob
        self.fields = fields  # every count, length, type, rank, dim and tensor offset
        self.tensor_fields = tensor_fields  # those of the tensor infos
        self.end = end  # where the tensor infos end
        self.size = size  # of the whole file

    def __repr__(self) -> str:  # hypothesis prints it with a failing example: keep it short
        return f"Header({len(self.blob)} bytes, {len(self.fields)} fields, end={self.end}, size={self.size})"


def _header(blob: bytes, size: int) -> Header:
    """Find the fields of a *valid* header; written independently of the reader under test, it trusts
    its input and only locates fields."""
    fields = [(4, 4), (8, 8), (16, 8)]
    n_tensors, n_kv = struct.unpack_from("<QQ", blob, 8)
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def string(pos: int) -> int:
        fields.append((pos, 8))
        return int(pos + 8 + struct.unpack_from("<Q", blob, pos)[0])

    def value(pos: int, vtype: int) -> int:
        if vtype in sizes:
            return pos + sizes[vtype]
        if vtype == 8:
            return string(pos)
        fields.extend([(pos, 4), (pos + 4, 8)])
        item_type, count = struct.unpack_from("<IQ", blob, pos)
        pos += 12
        if item_type in sizes:
            return int(pos + count * sizes[item_type])
        for _ in range(count):
            pos = value(pos, item_type)
        return pos

    pos = 24
    for _ in range(n_kv):
        pos = string(pos)
        fields.append((pos, 4))
        pos = value(pos + 4, struct.unpack_from("<I", blob, pos)[0])
    first_tensor_field = len(fields)
    for _ in range(n_tensors):
        pos = string(pos)
        fields.append((pos, 4))
        n_dims = struct.unpack_from("<I", blob, pos)[0]
        pos += 4
        fields.extend((pos + 8 * d, 8) for d in range(n_dims))
        pos += 8 * n_dims
        fields.extend([(pos, 4), (pos + 4, 8)])
        pos += 12
    return Header(blob, fields, fields[first_tensor_field:] or fields, pos, size)


HUGE = [0, 1, 2, 255, 2**31, 2**32 - 1, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1]


def _mutate(data: st.DataObject, header: Header) -> bytes:
    """1 to 3 of: a byte overwritten (often with printable ASCII, which keeps strings valid UTF-8), a bit
    flipped, an integer field (half the time one of a tensor info) set to a huge, random, small or
    nearby value, the file truncated."""
    out = bytearray(header.blob)
    # Positions come from a plain Random seeded by hypothesis: its own integers (and st.randoms) favour
    # small values, which would put most mutations into the magic and the counts.
    rnd = random.Random(data.draw(st.integers(0, 2**32 - 1), label="seed of the positions"))
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        kind = data.draw(st.sampled_from(["byte", "bit", "field", "truncate"]), label="kind")
        if kind in ("byte", "bit"):
            pos = rnd.randrange(header.end)
            if pos >= len(out):
                continue
            if kind == "byte":
                out[pos] = data.draw(st.one_of(st.integers(0x20, 0x7E), st.integers(0, 255)), label="byte")
            else:
                out[pos] ^= 1 << data.draw(st.integers(0, 7), label="bit")
        elif kind == "field":
            pool = header.tensor_fields if data.draw(st.booleans(), label="tensor field") else header.fields
            at, width = rnd.choice(pool)
            if at + width > len(out):
                continue
            top = (1 << (8 * width)) - 1
            old = int.from_bytes(out[at : at + width], "little")
            special = sorted({min(v, top) for v in [*HUGE, len(header.blob), len(header.blob) + 1]})
            value = data.draw(
                st.one_of(
                    st.sampled_from(special),
                    st.integers(0, top),
                    st.integers(0, 64),
                    st.integers(max(old - 8, 0), min(old + 8, top)),
                ),
                label="value",
            )
            out[at : at + width] = value.to_bytes(width, "little")
        else:
            del out[rnd.randrange(len(out) + 1) :]
    return bytes(out)


@contextlib.contextmanager
def _tracing() -> Iterator[None]:
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        yield
    finally:
        if started:
            tracemalloc.stop()


def _open_and_read_all(path: Path, written_bytes: int) -> None:
    """Open, read every tensor; only GGUFError may escape, and Python allocations stay bounded."""
    before = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    size = path.stat().st_size
    error: GGUFError | None = None
    try:
        with GGUFFile(path) as f:
            for name, info in f.tensors.items():
                raw = f.raw(name)
                assert raw.nbytes == info.nbytes
                assert info.offset + info.nbytes <= size
                int(raw[:64].sum())  # touch the mapping
                if info.qtype in PLAIN and info.nbytes <= MiB:
                    f.to_gpu(name)
            with contextlib.suppress(GGUFError):
                _ = f.architecture
        event("opened")
    except GGUFError as err:
        error = err
    if error is not None:
        # The kind of rejection, for --hypothesis-show-statistics: the message without names and numbers.
        event("rejected: " + re.sub(r"'[^']*'|\[[^]]*\]|\d+", "#", str(error)[len(str(path)) + 2 :])[:70])
        assert error.path == str(path)
        assert 0 <= error.offset <= size
        assert f"at byte offset {error.offset}" in str(error)
    peak = tracemalloc.get_traced_memory()[1] - before
    assert peak < 4 * written_bytes + 50 * MiB, f"peak {peak} bytes for a {written_bytes}-byte file"


@pytest.fixture(scope="module")
def writer_header(written: tuple[Path, dict[str, tuple[str, Array]]]) -> Header:
    blob = written[0].read_bytes()[: 64 * 1024]
    return _header(blob, len(blob))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_writer_header(data: st.DataObject, writer_header: Header, model_dir: Path) -> None:
    mutated = _mutate(data, writer_header)
    path = model_dir / "fuzz.gguf"
    path.write_bytes(mutated)
    with _tracing():
        _open_and_read_all(path, len(mutated))


def test_every_count_and_length_field_set_huge(writer_header: Header, model_dir: Path) -> None:
    # Deterministic companion of the fuzz test: 8-byte fields (every count, length, dim and tensor
    # offset outside the vocabulary, every 10th string length inside it) at values no file of this size
    # can honour. Memory is traced for a subset only: tracing makes each parse 20 times slower.
    blob = writer_header.blob
    path = model_dir / "huge.gguf"
    wide = [at for at, width in writer_header.fields if width == 8]
    edges = [at for i, at in enumerate(wide) if i < 40 or i >= len(wide) - 100]
    sample = sorted({*edges, *wide[::10]})

    def must_fail(at: int, value: int) -> None:
        mutated = bytearray(blob)
        mutated[at : at + 8] = value.to_bytes(8, "little")
        path.write_bytes(mutated)
        with pytest.raises(GGUFError), GGUFFile(path) as f:
            pytest.fail(f"opened with the field at {at} set to {value}: {f}")

    for at in sample:
        for value in (len(blob), 2**63, 2**64 - 1):
            must_fail(at, value)
    with _tracing():
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        for at in edges[:40] + edges[-30:]:
            must_fail(at, 2**64 - 1)
        peak = tracemalloc.get_traced_memory()[1] - before
    assert peak < 4 * len(blob) + 50 * MiB


@pytest.fixture(scope="module")
def smollm2_header(smollm2: Path) -> Header:
    with GGUFFile(smollm2) as f:
        data_offset = f.data_offset
    with open(smollm2, "rb") as fh:
        blob = fh.read(data_offset + 64 * 1024)  # the header and the start of the data
    return _header(blob, smollm2.stat().st_size)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_fuzz_smollm2_header(data: st.DataObject, smollm2_header: Header, model_dir: Path) -> None:
    mutated = _mutate(data, smollm2_header)
    path = model_dir / "fuzz-smollm2.gguf"
    path.write_bytes(mutated)
    if data.draw(st.integers(0, 3), label="sparse full size") > 0:
        # Zero-filled (sparse) up to the real size, so that intact tensor infos pass and get read.
        with open(path, "r+b") as fh:
            fh.truncate(max(smollm2_header.size, len(mutated)))
    with _tracing():
        _open_and_read_all(path, len(mutated))
