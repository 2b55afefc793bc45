"""pygpukit.llm.safetensors: round trips against the reference writer, every header validation rule,
sharded checkpoints, uploads, and fuzzing that malformed files only ever raise SafeTensorsError."""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst
from safetensors.numpy import save_file

import pygpukit as gp
from pygpukit.core.errors import DTypeError, PyGPUkitError
from pygpukit.llm import safetensors as sft
from pygpukit.llm.safetensors import (
    SafeTensorsError,
    SafeTensorsFile,
    SafeTensorsNotFoundError,
    ShardedSafeTensorsFile,
    TensorNotFoundError,
    load_safetensors,
    upload_all,
)

ST_NAMES = {
    np.dtype(np.float64): "F64",
    np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16",
    np.dtype(ml_dtypes.bfloat16): "BF16",
    np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3",
    np.dtype(ml_dtypes.float8_e5m2): "F8_E5M2",
    np.dtype(np.int64): "I64",
    np.dtype(np.int32): "I32",
    np.dtype(np.int16): "I16",
    np.dtype(np.int8): "I8",
    np.dtype(np.uint64): "U64",
    np.dtype(np.uint32): "U32",
    np.dtype(np.uint16): "U16",
    np.dtype(np.uint8): "U8",
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.complex64): "C64",
}
# What safetensors.numpy writes itself; the ml_dtypes types are written by write_file below.
REFERENCE_DTYPES = [
    np.float64,
    np.float32,
    np.float16,
    np.int64,
    np.int32,
    np.int16,
    np.int8,
    np.uint64,
    np.uint32,
    np.uint16,
    np.uint8,
    np.bool_,
    np.complex64,
]
ML_DTYPES = [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2]


def sample(dtype: Any, shape: tuple[int, ...], seed: int = 0) -> np.ndarray[Any, Any]:
    """Deterministic values: random raw bytes for the integer types, normal samples for the others."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt == np.bool_:
        values = rng.integers(0, 2, size=shape).astype(np.bool_)
    elif dt.kind in "iu":
        values = rng.integers(0, 256, size=(*shape, dt.itemsize), dtype=np.uint8).view(dt).reshape(shape)
    elif dt.kind == "c":
        values = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    else:
        values = (rng.standard_normal(shape) * 4).astype(dt)
    return np.asarray(values)


def same_bits(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> None:
    assert a.dtype == b.dtype
    assert a.shape == b.shape
    assert a.tobytes() == b.tobytes()


def header_bytes(header: dict[str, Any], align: int = 8) -> bytes:
    raw = json.dumps(header).encode()
    return raw + b" " * (-len(raw) % align)


def write_raw(path: Path, header: dict[str, Any] | bytes, data: bytes = b"", align: int = 8) -> Path:
    """A file from a header (a dict, or its exact bytes) and a data section."""
    raw = header if isinstance(header, bytes) else header_bytes(header, align)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def write_file(
    path: Path, tensors: dict[str, np.ndarray[Any, Any]], metadata: dict[str, str] | None = None, align: int = 8
) -> Path:
    """A small safetensors writer for any dtype (safetensors.numpy cannot write bf16 or fp8)."""
    header: dict[str, Any] = {"__metadata__": metadata} if metadata is not None else {}
    data = b""
    for name, array in tensors.items():
        raw = np.ascontiguousarray(array).tobytes()
        header[name] = {
            "dtype": ST_NAMES[array.dtype],
            "shape": list(array.shape),
            "data_offsets": [len(data), len(data) + len(raw)],
        }
        data += raw
    return write_raw(path, header, data, align)


def entry_offset(path: Path, name: str) -> int:
    return path.read_bytes().find(json.dumps(name).encode())


def assert_error(exc: pytest.ExceptionInfo[SafeTensorsError], path: Path, offset: int | None, *words: str) -> None:
    message = str(exc.value)
    assert str(path) in message
    assert exc.value.path == str(path)
    assert exc.value.offset == offset
    if offset is not None:
        assert f"byte offset {offset}" in message
    for word in words:
        assert word in message, (word, message)


# -- round trips ------------------------------------------------------------------------------------
SHAPES = [(), (0,), (3, 0, 2), (7,), (2, 3, 5)]


def test_reference_writer_round_trip_bit_for_bit(tmp_path: Path) -> None:
    tensors = {
        f"{np.dtype(dt).name}.{i}": sample(dt, shape, i) for dt in REFERENCE_DTYPES for i, shape in enumerate(SHAPES)
    }
    path = tmp_path / "ref.safetensors"
    save_file(tensors, str(path), metadata={"format": "np", "note": "caf\u00e9"})
    with SafeTensorsFile(path) as st:
        assert sorted(st.tensor_names) == sorted(tensors)
        assert st.num_tensors == len(st) == len(tensors)
        assert st.metadata == {"format": "np", "note": "caf\u00e9"}
        for name, expected in tensors.items():
            view = st.numpy(name)
            same_bits(view, expected)
            info = st.info(name)
            assert info.name == name
            assert info.dtype == ST_NAMES[expected.dtype]
            assert info.shape == expected.shape
            assert info.nbytes == expected.nbytes == info.data_offsets[1] - info.data_offsets[0]
            assert info.numpy_dtype == expected.dtype
            assert not view.flags.writeable
            same_bits(st[name], expected)


@pytest.mark.parametrize("dtype", ML_DTYPES, ids=lambda d: np.dtype(d).name)
def test_bf16_and_fp8_round_trip_bit_for_bit(tmp_path: Path, dtype: Any) -> None:
    tensors = {f"t{i}": sample(dtype, shape, i) for i, shape in enumerate(SHAPES)}
    # Every bit pattern, NaNs included, must come back unchanged.
    bits = np.arange(
        2 ** (8 * np.dtype(dtype).itemsize), dtype=np.uint16 if np.dtype(dtype).itemsize == 2 else np.uint8
    )
    tensors["all_bits"] = bits.view(dtype)
    with SafeTensorsFile(write_file(tmp_path / "m.safetensors", tensors)) as st:
        for name, expected in tensors.items():
            same_bits(st.numpy(name), expected)
        assert st.info("t1").dtype == ST_NAMES[np.dtype(dtype)]


def test_views_are_zero_copy_and_read_only(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", {"w": np.arange(1 << 16, dtype=np.float32)})
    tracemalloc.start()
    try:
        with SafeTensorsFile(path) as st:
            view = st.numpy("w")
            _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024  # far below the tensor's 256 KiB: nothing was read into memory
    assert not view.flags.owndata
    with pytest.raises(ValueError, match="read-only"):
        view[0] = 1
    assert float(view[12345]) == 12345.0  # still valid after close


def test_tensor_names_follow_header_order_and_metadata_defaults_to_empty(tmp_path: Path) -> None:
    tensors = {"z": np.zeros(2, np.float32), "a": np.ones(3, np.int8), "m": np.zeros((), np.float64)}
    with SafeTensorsFile(write_file(tmp_path / "m.safetensors", tensors)) as st:
        assert st.tensor_names == ["z", "a", "m"]
        assert list(st) == ["z", "a", "m"]
        assert st.metadata == {}
        assert "a" in st
        assert "b" not in st
        assert ["a"] not in st
        assert st.numpy("m").shape == ()
        assert "3 tensors" in repr(st)


def test_unaligned_data_gaps_and_trailing_bytes_are_accepted(tmp_path: Path) -> None:
    a, b = sample(np.float32, (5,)), sample(np.int64, (3,), 1)
    header = {
        "a": {"dtype": "F32", "shape": [5], "data_offsets": [3, 23]},
        "b": {"dtype": "I64", "shape": [3], "data_offsets": [30, 54]},
        "e": {"dtype": "F16", "shape": [0, 4], "data_offsets": [10, 10]},
    }
    data = b"xyz" + a.tobytes() + b"1234567" + b.tobytes() + b"trailing"
    with SafeTensorsFile(write_raw(tmp_path / "m.safetensors", header, data, align=1)) as st:
        same_bits(st.numpy("a"), a)
        same_bits(st.numpy("b"), b)
        assert st.numpy("e").shape == (0, 4)


def test_header_padding_with_spaces_is_accepted(tmp_path: Path) -> None:
    header = json.dumps({"x": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}).encode() + b" " * 13
    with SafeTensorsFile(write_raw(tmp_path / "m.safetensors", header, b"\x01\x02")) as st:
        assert st.numpy("x").tolist() == [1, 2]


def test_a_file_with_no_tensors(tmp_path: Path) -> None:
    with SafeTensorsFile(write_raw(tmp_path / "m.safetensors", {"__metadata__": {"k": "v"}})) as st:
        assert st.tensor_names == []
        assert len(st) == 0
        assert st.metadata == {"k": "v"}


def test_missing_tensor_raises_a_key_error_naming_file_and_tensor(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", {"w": np.zeros(1, np.float32)})
    with SafeTensorsFile(path) as st:
        for call in (st.info, st.numpy, st.to_gpu, st.__getitem__):
            with pytest.raises(TensorNotFoundError) as exc:
                call("nope")
            assert isinstance(exc.value, KeyError)
            assert isinstance(exc.value, SafeTensorsError)
            assert isinstance(exc.value, PyGPUkitError)
            assert str(exc.value) == f"{path}: no tensor named 'nope'"  # no KeyError quoting
            assert exc.value.tensor == "nope"
        with pytest.raises(KeyError):
            st.info("__metadata__")


def test_close_releases_the_file_and_later_reads_raise(tmp_path: Path) -> None:
    path = write_file(tmp_path / "m.safetensors", {"w": np.arange(4, dtype=np.int32)})
    st = SafeTensorsFile(path)
    kept = st.numpy("w")
    st.close()
    st.close()  # idempotent
    assert st.closed
    assert kept.tolist() == [0, 1, 2, 3]
    with pytest.raises(SafeTensorsError, match="closed") as exc:
        st.numpy("w")
    assert str(path) in str(exc.value)
    assert st.info("w").shape == (4,)  # the header stays available
    with SafeTensorsFile(path) as other:
        pass
    assert other.closed


def test_errors_pickle_with_their_attributes(tmp_path: Path) -> None:
    error = TensorNotFoundError("no tensor named 'x'", path=tmp_path / "f", offset=12, tensor="x")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is TensorNotFoundError
    assert (str(copy), copy.path, copy.offset, copy.tensor) == (str(error), str(tmp_path / "f"), 12, "x")


# -- uploads ----------------------------------------------------------------------------------------
def test_to_gpu_uploads_the_stored_values(tmp_path: Path) -> None:
    tensors = {
        "f32": sample(np.float32, (4, 5)),
        "bf16": sample(ml_dtypes.bfloat16, (6,), 1),
        "fp8": sample(ml_dtypes.float8_e4m3fn, (3, 2), 2),
        "i64": sample(np.int64, (3,), 3),
        "scalar": np.asarray(2.5, np.float16),
        "empty": np.zeros((0, 3), np.float32),
        "flag": sample(np.bool_, (5,), 4),
    }
    with SafeTensorsFile(write_file(tmp_path / "m.safetensors", tensors)) as st:
        for name, expected in tensors.items():
            array = st.to_gpu(name)
            assert isinstance(array, gp.GPUArray)
            assert array.shape == expected.shape
            assert array.dtype == gp.as_dtype(expected.dtype)
            same_bits(array.to_numpy(), expected)


@pytest.mark.parametrize(
    ("name", "target"),
    [
        ("bf16", "float32"),
        ("f32", gp.bfloat16),
        ("f32", "float16"),
        ("fp8", "float32"),
        ("i64", "float32"),
        ("scalar", "float32"),
        ("f32", "float32"),
    ],
)
def test_to_gpu_converts_on_the_device(tmp_path: Path, name: str, target: Any) -> None:
    tensors = {
        "f32": sample(np.float32, (4, 5)),
        "bf16": sample(ml_dtypes.bfloat16, (6,), 1),
        "fp8": sample(ml_dtypes.float8_e4m3fn, (3, 2), 2),
        "i64": np.arange(-3, 3, dtype=np.int64),
        "scalar": np.asarray(2.5, np.float16),
    }
    with SafeTensorsFile(write_file(tmp_path / "m.safetensors", tensors)) as st:
        array = st.to_gpu(name, dtype=target)
    expected = tensors[name].astype(gp.as_dtype(target).numpy)
    assert array.dtype == gp.as_dtype(target)
    assert array.shape == expected.shape
    np.testing.assert_array_equal(array.to_numpy(), expected)


def test_to_gpu_of_a_dtype_pygpukit_lacks_raises_dtype_error(tmp_path: Path) -> None:
    path = tmp_path / "c.safetensors"
    save_file({"c": np.ones(2, np.complex64)}, str(path))
    with SafeTensorsFile(path) as st:
        assert st.info("c").gpu_dtype is None
        with pytest.raises(DTypeError, match="C64") as exc:
            st.to_gpu("c")
        assert str(path) in str(exc.value)
        assert "'c'" in str(exc.value)


def test_upload_all_uploads_every_tensor_and_converts_only_floats(tmp_path: Path) -> None:
    tensors = {
        "w": sample(ml_dtypes.bfloat16, (4, 4)),
        "ids": np.arange(5, dtype=np.int32),
        "b": sample(np.float32, (4,), 1),
    }
    with SafeTensorsFile(write_file(tmp_path / "m.safetensors", tensors)) as st:
        arrays = upload_all(st, progress=False)
        assert list(arrays) == list(tensors)
        for name, expected in tensors.items():
            same_bits(arrays[name].to_numpy(), expected)
        converted = upload_all(st, names=["w", "ids"], dtype="float32", progress=False)
    assert list(converted) == ["w", "ids"]
    assert converted["w"].dtype == gp.float32
    np.testing.assert_array_equal(converted["w"].to_numpy(), tensors["w"].astype(np.float32))
    assert converted["ids"].dtype == gp.int32


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_upload_all_checks_every_name_before_uploading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = SafeTensorsFile(write_file(tmp_path / "m.safetensors", {"a": np.zeros(4, np.uint8)}))
    uploads: list[str] = []
    monkeypatch.setattr(st, "to_gpu", lambda name, dtype=None: uploads.append(name))
    with pytest.raises(TensorNotFoundError, match="missing"):
        upload_all(st, names=["a", "missing"], progress=False)
    assert uploads == []


def test_upload_all_shows_a_byte_progress_bar_only_on_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tensors = {"a": np.zeros(1024, np.uint8), "b": np.zeros(512, np.float32)}
    with SafeTensorsFile(write_file(tmp_path / "m.safetensors", tensors)) as st:
        for progress, terminal, shown in ((True, True, True), (True, False, False), (False, True, False)):
            stream = FakeTerminal() if terminal else io.StringIO()
            monkeypatch.setattr(sys, "stderr", stream)
            upload_all(st, progress=progress)
            output = stream.getvalue()
            assert ("3.00k/3.00k" in output) is shown, (progress, terminal, output)


@pytest.mark.gpu
def test_to_gpu_stages_a_large_tensor_onto_the_device(tmp_path: Path) -> None:
    weights = sample(ml_dtypes.bfloat16, (1024, 4096))  # 8 MiB: large enough for the pinned staging path
    with SafeTensorsFile(write_file(tmp_path / "m.safetensors", {"w": weights})) as st:
        array = st.to_gpu("w")
        converted = st.to_gpu("w", dtype=gp.float32)
    assert array.on_gpu
    same_bits(array.to_numpy(), weights)
    np.testing.assert_array_equal(converted.to_numpy(), weights.astype(np.float32))


# -- header validation ------------------------------------------------------------------------------
def good_header() -> dict[str, Any]:
    return {
        "__metadata__": {"format": "pt"},
        "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
        "b": {"dtype": "I8", "shape": [4], "data_offsets": [16, 20]},
    }


def broken(**changes: Any) -> dict[str, Any]:
    header = good_header()
    for name, entry in changes.items():
        if entry is None:
            del header[name]
        elif isinstance(entry, dict) and isinstance(header.get(name), dict) and name != "__metadata__":
            header[name] = {k: v for k, v in {**header[name], **entry}.items() if v is not ...}
        else:
            header[name] = entry
    return header


def test_the_good_header_opens(tmp_path: Path) -> None:
    with SafeTensorsFile(write_raw(tmp_path / "m.safetensors", good_header(), bytes(20))) as st:
        assert st.tensor_names == ["a", "b"]


ENTRY_CASES = {
    "not_an_object": (broken(a=[1, 2]), "a", "not a JSON object"),
    "no_dtype": (broken(a={"dtype": ...}), "a", "no 'dtype'"),
    "no_shape": (broken(a={"shape": ...}), "a", "no 'shape'"),
    "no_offsets": (broken(a={"data_offsets": ...}), "a", "no 'data_offsets'"),
    "unknown_dtype": (broken(a={"dtype": "F33"}), "a", "unknown dtype 'F33'"),
    "dtype_not_a_string": (broken(a={"dtype": 4}), "a", "unknown dtype 4"),
    "shape_not_a_list": (broken(a={"shape": 4}), "a", "list of at most 16"),
    "rank_too_high": (broken(b={"shape": [1] * 17 + [4]}), "b", "list of at most 16"),
    "negative_dim": (broken(a={"shape": [-2, -2]}), "a", "non-negative integers"),
    "bool_dim": (broken(b={"shape": [True, 4]}), "b", "non-negative integers"),
    "float_dim": (broken(b={"shape": [4.0]}), "b", "non-negative integers"),
    "string_dim": (broken(b={"shape": ["4"]}), "b", "non-negative integers"),
    "offsets_not_a_pair": (broken(b={"data_offsets": [16]}), "b", "two integers"),
    "offsets_not_ints": (broken(b={"data_offsets": [16, 20.0]}), "b", "two integers"),
    "offsets_bool": (broken(b={"data_offsets": [False, True]}), "b", "two integers"),
    "begin_after_end": (broken(b={"data_offsets": [20, 16]}), "b", "0 <= begin <= end"),
    "negative_begin": (broken(b={"data_offsets": [-4, 0]}), "b", "0 <= begin <= end"),
    "size_mismatch": (broken(b={"shape": [5]}), "b", "span 4 bytes, but shape [5] of I8 needs 5"),
    "size_mismatch_dtype": (broken(a={"dtype": "F64"}), "a", "needs 32"),
    "empty_name": (broken(**{"": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}}), "", "non-empty"),
    "lone_surrogate_name": (
        broken(**{"\ud800": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}}),
        "\ud800",
        "Unicode",
    ),
    "huge_shape": (broken(b={"shape": [2**40, 2**40, 2**40]}), "b", "too large"),
    "huge_zero_size_shape": (broken(b={"shape": [0, 2**62, 2**62], "data_offsets": [20, 20]}), "b", "too large"),
}


@pytest.mark.parametrize("case", ENTRY_CASES)
def test_invalid_entries_name_the_file_tensor_and_offset(tmp_path: Path, case: str) -> None:
    header, tensor, words = ENTRY_CASES[case]
    path = write_raw(tmp_path / "m.safetensors", header, bytes(20))
    with pytest.raises(SafeTensorsError) as exc:
        SafeTensorsFile(path)
    assert_error(exc, path, entry_offset(path, tensor), words)
    assert exc.value.tensor == tensor


def test_metadata_must_map_strings_to_strings(tmp_path: Path) -> None:
    for metadata in ({"n": 1}, ["a"], "text", {"k": ["v"]}, {"k": "\udc00"}):
        path = write_raw(tmp_path / "m.safetensors", broken(__metadata__=metadata), bytes(20))
        with pytest.raises(SafeTensorsError) as exc:
            SafeTensorsFile(path)
        assert_error(exc, path, entry_offset(path, "__metadata__"), "__metadata__")


def test_range_past_the_end_of_the_file_names_the_data_offset(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "m.safetensors", good_header(), bytes(19))
    with pytest.raises(SafeTensorsError) as exc:
        SafeTensorsFile(path)
    data_start = 8 + len(header_bytes(good_header()))
    assert_error(exc, path, data_start + 16, "tensor 'b'", "past the end", "(19 bytes)")


def test_overlapping_tensors_are_rejected(tmp_path: Path) -> None:
    header = broken(b={"data_offsets": [12, 16]})  # inside a's [0, 16]
    path = write_raw(tmp_path / "m.safetensors", header, bytes(20))
    with pytest.raises(SafeTensorsError) as exc:
        SafeTensorsFile(path)
    data_start = 8 + len(header_bytes(header))
    assert_error(exc, path, data_start + 12, "'b'", "overlaps tensor 'a'")
    identical = broken(b={"dtype": "F32", "shape": [4], "data_offsets": [0, 16]})
    with pytest.raises(SafeTensorsError, match="overlaps"):
        SafeTensorsFile(write_raw(tmp_path / "m.safetensors", identical, bytes(20)))


def test_duplicate_keys_are_rejected(tmp_path: Path) -> None:
    entry = '{"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}'
    cases = {
        "top": f'{{"x": {entry}, "x": {entry}}}',
        "entry": '{"x": {"dtype": "U8", "dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}',
        "metadata": '{"__metadata__": {"k": "a", "k": "b"}}',
    }
    for key, text in cases.items():
        path = write_raw(tmp_path / f"{key}.safetensors", text.encode(), b"\x00")
        with pytest.raises(SafeTensorsError) as exc:
            SafeTensorsFile(path)
        assert_error(exc, path, 8, "duplicate key")


@pytest.mark.parametrize(
    ("content", "offset", "words"),
    [
        (b"", 0, "has 0 bytes"),
        (b"\x02\x00\x00\x00\x00\x00\x00", 0, "has 7 bytes"),
        (struct.pack("<Q", 100_000_001) + b"{}", 0, "exceeds the limit of 100000000"),
        (struct.pack("<Q", 2**64 - 1) + b"{}", 0, "exceeds the limit"),
        (struct.pack("<Q", 3) + b"{}", 0, "exceeds the 2 bytes"),
        (struct.pack("<Q", 4) + b'{"\xff"}', 10, "not valid UTF-8"),
        (struct.pack("<Q", 9) + b'{"a": 1,}', 16, "not valid JSON"),
        (struct.pack("<Q", 4) + b"[{}]", 8, "does not start with '{'"),
        (struct.pack("<Q", 3) + b" {}", 8, "does not start with '{'"),
        (struct.pack("<Q", 0), 8, "does not start with '{'"),
        (struct.pack("<Q", 4) + b"{}\x00\x00", 10, "not valid JSON"),
        (struct.pack("<Q", 2) + b"{}" + b"data", None, None),
    ],
)
def test_file_level_rules(tmp_path: Path, content: bytes, offset: int | None, words: str | None) -> None:
    path = tmp_path / "m.safetensors"
    path.write_bytes(content)
    if words is None:
        assert SafeTensorsFile(path).tensor_names == []
        return
    with pytest.raises(SafeTensorsError) as exc:
        SafeTensorsFile(path)
    assert_error(exc, path, offset, words)


def test_json_error_offsets_count_bytes_not_characters(tmp_path: Path) -> None:
    text = '{"\u00e9\u00e9": 1 2}'.encode()
    path = write_raw(tmp_path / "m.safetensors", text)
    with pytest.raises(SafeTensorsError) as exc:
        SafeTensorsFile(path)
    assert_error(exc, path, 8 + text.index(b"2"), "not valid JSON")


def test_hostile_json_is_rejected_quickly(tmp_path: Path) -> None:
    for text, words in (
        (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "too deeply"),
        (
            b'{"a": {"dtype": "U8", "shape": [' + b"9" * 100_000 + b'], "data_offsets": [0, 0]}}',
            "integer literal with 100000 characters",
        ),
    ):
        path = write_raw(tmp_path / "m.safetensors", text)
        with pytest.raises(SafeTensorsError) as exc:
            SafeTensorsFile(path)
        assert_error(exc, path, 8, words)


def test_a_huge_claimed_shape_is_rejected_before_any_allocation(tmp_path: Path) -> None:
    # 2**60 float32 elements would be 4 EiB; the claim must fail on arithmetic alone.
    header = {"w": {"dtype": "F32", "shape": [2**30, 2**30], "data_offsets": [0, 2**62]}}
    path = write_raw(tmp_path / "m.safetensors", header, bytes(64))
    tracemalloc.start()
    try:
        with pytest.raises(SafeTensorsError) as exc:
            SafeTensorsFile(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert_error(exc, path, 8 + len(header_bytes(header)), "past the end")
    assert peak < 1 << 20


def test_a_huge_zero_size_shape_that_numpy_accepts_opens(tmp_path: Path) -> None:
    header = {"w": {"dtype": "U8", "shape": [0, 2**40], "data_offsets": [0, 0]}}
    with SafeTensorsFile(write_raw(tmp_path / "m.safetensors", header)) as st:
        assert st.numpy("w").shape == (0, 2**40)


def test_io_problems_are_typed(tmp_path: Path) -> None:
    with pytest.raises(SafeTensorsNotFoundError) as missing:
        SafeTensorsFile(tmp_path / "absent.safetensors")
    assert isinstance(missing.value, FileNotFoundError)
    assert isinstance(missing.value, SafeTensorsError)
    assert str(tmp_path / "absent.safetensors") in str(missing.value)
    with pytest.raises(SafeTensorsError, match="is a directory"):
        SafeTensorsFile(tmp_path)


# -- sharded checkpoints ----------------------------------------------------------------------------
def make_sharded(directory: Path, shards: int = 3, per_shard: int = 3) -> dict[str, np.ndarray[Any, Any]]:
    tensors: dict[str, np.ndarray[Any, Any]] = {}
    weight_map: dict[str, str] = {}
    for s in range(shards):
        shard_name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {f"layers.{s}.w{i}": sample(np.float32, (s + 1, i + 2), 10 * s + i) for i in range(per_shard)}
        save_file(part, str(directory / shard_name))
        tensors.update(part)
        weight_map.update(dict.fromkeys(part, shard_name))
    index = {
        "metadata": {"total_size": sum(t.nbytes for t in tensors.values()), "format": "pt"},
        "weight_map": weight_map,
    }
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return tensors


def test_sharded_checkpoint_round_trip(tmp_path: Path) -> None:
    tensors = make_sharded(tmp_path)
    total = sum(t.nbytes for t in tensors.values())
    with ShardedSafeTensorsFile(tmp_path / "model.safetensors.index.json") as st:
        assert st.tensor_names == list(tensors)
        assert len(st) == st.num_tensors == 9
        assert list(st) == list(tensors)
        assert st.metadata == {"total_size": str(total), "format": "pt"}
        assert [Path(p).name for p in st.shard_files] == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
        assert st._shard_files == st.shard_files
        assert "layers.1.w2" in st
        assert "nope" not in st
        for name, expected in tensors.items():
            same_bits(st.numpy(name), expected)
            same_bits(st[name], expected)
            assert st.info(name).shape == expected.shape
            same_bits(st.to_gpu(name).to_numpy(), expected)
        arrays = upload_all(st, dtype="bfloat16", progress=False)
        assert arrays["layers.2.w0"].dtype == gp.bfloat16
        with pytest.raises(TensorNotFoundError) as exc:
            st.numpy("nope")
        assert str(tmp_path / "model.safetensors.index.json") in str(exc.value)
        assert "3 shards" in repr(st)
    with pytest.raises(SafeTensorsError, match="closed"):
        st.numpy("layers.0.w0")


def test_shards_open_lazily(tmp_path: Path) -> None:
    tensors = make_sharded(tmp_path)
    (tmp_path / "model-00003-of-00003.safetensors").write_bytes(b"garbage!garbage")
    with ShardedSafeTensorsFile(tmp_path / "model.safetensors.index.json") as st:
        same_bits(st.numpy("layers.0.w1"), tensors["layers.0.w1"])
        with pytest.raises(SafeTensorsError) as exc:
            st.numpy("layers.2.w0")
        assert "model-00003-of-00003.safetensors" in str(exc.value)
        assert exc.value.offset == 0


def test_a_tensor_missing_from_its_shard_names_tensor_and_shard(tmp_path: Path) -> None:
    make_sharded(tmp_path)
    index_path = tmp_path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["layers.0.w0"] = "model-00002-of-00003.safetensors"
    index_path.write_text(json.dumps(index))
    with ShardedSafeTensorsFile(index_path) as st:
        same_bits(st.numpy("layers.0.w1"), st.numpy("layers.0.w1"))
        with pytest.raises(TensorNotFoundError) as exc:
            st.numpy("layers.1.w1")  # any tensor of the shard: the shard is checked as a whole on opening
    message = str(exc.value)
    assert "'layers.0.w0'" in message
    assert "model-00002-of-00003.safetensors" in message
    assert str(index_path) in message
    assert exc.value.tensor == "layers.0.w0"


@pytest.mark.parametrize(
    ("index", "words"),
    [
        (b"[1, 2]", "not a JSON object"),
        (b"{nope", "not valid JSON"),
        (b'{"weight_map": {"a": "x.safetensors"}, "weight_map": {}}', "duplicate key"),
        (b'{"metadata": {}}', "no 'weight_map'"),
        (b'{"weight_map": ["a"]}', "no 'weight_map'"),
        (b'{"metadata": [], "weight_map": {}}', "'metadata' is not a JSON object"),
        (b'{"weight_map": {"a": 3}}', "not a plain file name"),
        (b'{"weight_map": {"a": "/etc/passwd"}}', "not a plain file name"),
        (b'{"weight_map": {"a": "../x.safetensors"}}', "not a plain file name"),
        (b'{"weight_map": {"a": "sub/x.safetensors"}}', "not a plain file name"),
        (b'{"weight_map": {"a": "sub\\\\x.safetensors"}}', "not a plain file name"),
        (b'{"weight_map": {"a": ".."}}', "not a plain file name"),
        (b'{"weight_map": {"a": ""}}', "not a plain file name"),
        (b'{"weight_map": {"a": "x\\u0000.safetensors"}}', "not a plain file name"),
        (b'{"weight_map": {"": "x.safetensors"}}', "empty or invalid tensor name"),
    ],
)
def test_invalid_indexes_are_rejected(tmp_path: Path, index: bytes, words: str) -> None:
    path = tmp_path / "model.safetensors.index.json"
    path.write_bytes(index)
    with pytest.raises(SafeTensorsError) as exc:
        ShardedSafeTensorsFile(path)
    assert str(path) in str(exc.value)
    assert words in str(exc.value)


def test_a_missing_shard_is_reported_on_opening(tmp_path: Path) -> None:
    make_sharded(tmp_path)
    os.remove(tmp_path / "model-00002-of-00003.safetensors")
    with pytest.raises(SafeTensorsNotFoundError) as exc:
        ShardedSafeTensorsFile(tmp_path / "model.safetensors.index.json")
    assert isinstance(exc.value, FileNotFoundError)
    assert "model-00002-of-00003.safetensors" in str(exc.value)
    assert "model.safetensors.index.json" in str(exc.value)


def test_index_size_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sft, "MAX_INDEX_SIZE", 100)
    path = tmp_path / "model.safetensors.index.json"
    path.write_text(json.dumps({"weight_map": {f"t{i}": "x.safetensors" for i in range(20)}}))
    with pytest.raises(SafeTensorsError, match="larger than 100 bytes") as exc:
        ShardedSafeTensorsFile(path)
    assert exc.value.offset == 100


# -- load_safetensors -------------------------------------------------------------------------------
def test_load_safetensors_finds_the_checkpoint(tmp_path: Path) -> None:
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    make_sharded(sharded, shards=2)
    (sharded / "model.safetensors").write_bytes(b"ignored: the index wins")
    assert isinstance(load_safetensors(sharded), ShardedSafeTensorsFile)
    assert isinstance(load_safetensors(sharded / "model.safetensors.index.json"), ShardedSafeTensorsFile)
    assert isinstance(load_safetensors(str(sharded / "model-00001-of-00002.safetensors")), SafeTensorsFile)

    single = tmp_path / "single"
    single.mkdir()
    save_file({"w": np.ones(3, np.float32)}, str(single / "model.safetensors"))
    save_file({"v": np.ones(3, np.float32)}, str(single / "other.safetensors"))
    with load_safetensors(single) as st:
        assert isinstance(st, SafeTensorsFile)
        assert st.tensor_names == ["w"]

    lone = tmp_path / "lone"
    lone.mkdir()
    save_file({"v": np.ones(3, np.float32)}, str(lone / "weights.safetensors"))
    with load_safetensors(lone) as st:
        assert st.tensor_names == ["v"]


def test_load_safetensors_lists_what_it_looked_for(tmp_path: Path) -> None:
    with pytest.raises(SafeTensorsNotFoundError) as exc:
        load_safetensors(tmp_path)
    message = str(exc.value)
    assert str(tmp_path) in message
    assert "model.safetensors.index.json" in message
    assert "model.safetensors" in message
    assert "(none)" in message
    for name in ("a.safetensors", "b.safetensors"):
        save_file({"v": np.ones(1, np.float32)}, str(tmp_path / name))
    with pytest.raises(SafeTensorsNotFoundError, match=r"found 2: a\.safetensors, b\.safetensors"):
        load_safetensors(tmp_path)
    with pytest.raises(SafeTensorsNotFoundError):
        load_safetensors(tmp_path / "absent.safetensors")
    with pytest.raises(SafeTensorsNotFoundError):
        load_safetensors(tmp_path / "absent.index.json")


# -- fuzzing ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def seed_file(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    tensors = {
        "emb": sample(ml_dtypes.bfloat16, (4, 3)),
        "norm": sample(np.float32, (3,), 1),
        "ids": sample(np.int64, (2,), 2),
        "s": np.asarray(1.5, np.float16),
        "z": np.zeros((0,), np.int8),
    }
    path = write_file(tmp_path_factory.mktemp("seed") / "seed.safetensors", tensors, {"format": "pt"})
    return path.read_bytes()


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def open_and_read_everything(content: bytes, directory: Path) -> None:
    """Opening and reading every tensor must work or raise SafeTensorsError; nothing else."""
    path = directory / "fuzz.safetensors"
    path.write_bytes(content)
    try:
        st = SafeTensorsFile(path)
    except SafeTensorsError as exc:
        error = exc
    else:
        error = None
    if error is not None:
        assert str(path) in str(error)
        return
    with st:
        for name in st:
            info = st.info(name)
            view = st.numpy(name)
            assert view.nbytes == info.nbytes <= len(content)
            assert view.shape == info.shape
            assert 8 + info.data_offsets[1] <= len(content)
            view.tobytes()  # touch every byte of the mapping


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(edits=hst.lists(hst.tuples(hst.integers(0, 10_000), hst.integers(0, 255)), min_size=1, max_size=8))
def test_fuzz_byte_edits(seed_file: bytes, fuzz_dir: Path, edits: list[Any]) -> None:
    content = bytearray(seed_file)
    header_end = 8 + int.from_bytes(seed_file[:8], "little")
    for position, value in edits:
        content[position % header_end] = value  # the length prefix and the header, where the checks are
    open_and_read_everything(bytes(content), fuzz_dir)


@FUZZ
@given(length=hst.integers(0, 4000), prefix=hst.one_of(hst.none(), hst.integers(0, 2**64 - 1), hst.integers(-16, 16)))
def test_fuzz_truncation_and_length_prefix(seed_file: bytes, fuzz_dir: Path, length: int, prefix: int | None) -> None:
    content = bytearray(seed_file[:length])
    if prefix is not None and len(content) >= 8:
        value = prefix if prefix > 16 or prefix < -16 else int.from_bytes(seed_file[:8], "little") + prefix
        content[:8] = struct.pack("<Q", value % 2**64)
    open_and_read_everything(bytes(content), fuzz_dir)


JSON_VALUES = hst.recursive(
    hst.none() | hst.booleans() | hst.integers(-(2**65), 2**65) | hst.floats() | hst.text(max_size=6),
    lambda inner: hst.lists(inner, max_size=3) | hst.dictionaries(hst.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


@FUZZ
@given(data=hst.data())
def test_fuzz_header_fields(seed_file: bytes, fuzz_dir: Path, data: Any) -> None:
    length = int.from_bytes(seed_file[:8], "little")
    header = json.loads(seed_file[8 : 8 + length])
    names = sorted(header)
    for _ in range(data.draw(hst.integers(1, 3))):
        name = data.draw(hst.sampled_from(names))
        field = data.draw(hst.sampled_from(["dtype", "shape", "data_offsets", "format", None]))
        small = hst.integers(-2, 200)
        value = data.draw(
            hst.one_of(JSON_VALUES, hst.lists(small, max_size=4), hst.sampled_from(list(sft._NUMPY_DTYPES)))
        )
        if field is None or not isinstance(header[name], dict):
            header[name] = value
        else:
            header[name][field] = value
    raw = json.dumps(header).encode()
    body = seed_file[8 + length :]
    open_and_read_everything(struct.pack("<Q", len(raw)) + raw + body, fuzz_dir)
