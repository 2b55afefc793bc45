"""A validating reader of GGUF files (versions 2 and 3, little-endian), the format of llama.cpp.

A GGUF file is a header -- magic ``GGUF``, version, tensor count, metadata count, the metadata
key/value records, one info record per tensor (name, dims, type, data offset) -- then, after padding to
``general.alignment``, the data section holding every tensor's bytes::

    from pygpukit.llm.gguf import GGUFFile

    with GGUFFile("SmolLM2-135M-Instruct.Q4_1.gguf") as f:
        print(f.architecture, f.get("llama.block_count"), len(f))
        info = f.tensors["blk.0.ffn_down.weight"]  # GGUFTensorInfo(qtype="Q4_1", shape=(576, 1536), ...)
        w = f.to_gpu("blk.0.ffn_down.weight")  # float32 GPUArray, dequantized on the device

Files come from users and are untrusted. Design:

* The header is parsed here, in full, by a small bounds-checked parser; ``gguf.GGUFReader`` is not used
  to parse. That reader walks metadata arrays element by element, building two NumPy views per string
  (about 160 MB of Python objects and 2 to 7 s for the 1.8 MB header of SmolLM2-135M), and its reads
  past the end of the file silently return empty arrays, so a corrupt array count makes it loop (and
  allocate) for up to 2**64 iterations without ever advancing -- no pre-check short of a full parse
  makes it safe, and after a full parse it has nothing left to do. The ``gguf`` package still supplies
  what it is good at: the tables of tensor types (``GGMLQuantizationType``, ``GGML_QUANT_SIZES``) and
  value types (``GGUFValueType``), so new quantization types are known as soon as it knows them.
* Every length and count is checked against the bytes left in the file *before* it is used: a string
  length must fit in what remains, an array of ``n`` scalars needs ``n * itemsize`` bytes, an array of
  ``n`` strings at least ``8 * n``, the tensor and key/value counts at least 32 and 13 bytes per record.
  So no loop runs longer, and no read reaches further, than the file allows.
* Two passes keep memory bounded. The first walks the whole header and checks its structure and every
  tensor without building metadata values (it keeps only the keys and one small record per tensor);
  only a header that holds together is then turned into Python values. A corrupt count in a large
  file (a bit flip that makes the vocabulary array swallow gigabytes of tensor data) therefore fails in
  the first pass, before Python lists of that length exist. Python objects cost up to ~20 times the
  bytes they come from (an int in a list of uint16), so fixed limits far above any real model also
  bound what a *well-formed* hostile file can make us build: at most 2**23 metadata array items in all
  (SmolLM2-135M has 147k, a 256k-vocabulary model about 800k), 2**16 metadata keys and 2**20 tensors.
  Tensor data is never read here, only memory-mapped.
* Tensors are checked as llama.cpp checks them: a known type id, rank 1..4 with positive dims, the
  first (fastest) dim a multiple of the type's block size, the offset a multiple of
  ``general.alignment`` (a uint32 power of two, default 32), the data range inside the file, no two
  tensors overlapping, no duplicate tensor names or metadata keys. Strings must be valid UTF-8 and
  bools 0 or 1; nested metadata arrays are read up to a depth of 4.
* Every problem raises :class:`GGUFError` (a ``ValueError``) naming the file and the byte offset of the
  offending field. A missing or unreadable file raises the usual ``OSError``.

Tensor shapes are given in NumPy's row-major order: GGUF lists dims fastest-first, so a weight with
GGUF dims ``[576, 1536]`` is a ``(1536, 576)`` matrix here. Big-endian GGUF files are rejected: their
tensor bytes would need swapping before the device kernels could read them.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import mmap
import os
import struct
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from pygpukit.core.errors import PyGPUkitError

if TYPE_CHECKING:
    from pygpukit.core.array import GPUArray
    from pygpukit.core.stream import Stream

__all__ = ["GGUFError", "GGUFFile", "GGUFTensorInfo"]

_MAGIC = b"GGUF"
_SUPPORTED_VERSIONS = (2, 3)
_HEADER_BYTES = 24  # magic u32, version u32, tensor_count u64, kv_count u64
_DEFAULT_ALIGNMENT = 32
_MAX_DIMS = 4  # GGML_MAX_DIMS
_MAX_ARRAY_DEPTH = 4  # nested arrays are legal but unused in practice; the cap bounds the recursion
# The smallest possible records: an empty key, a type and a one-byte value; an empty name, one dim, a
# type and an offset. Counts above size / these are impossible and are rejected before any loop.
_MIN_KV_BYTES = 8 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8
# Far above real models (see the module docstring); they bound the Python objects built from a header.
_MAX_KV = 1 << 16
_MAX_TENSORS = 1 << 20
_MAX_ARRAY_ITEMS = 1 << 23

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

# Scalar value types: the struct format of one element (little-endian, standard sizes). Arrays of them
# are read with NumPy, whose dtype strings are the same letters.
_SCALAR_FORMATS: dict[int, str] = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<B",  # checked to be 0 or 1, then converted
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
_SCALAR_STRUCTS = {t: struct.Struct(fmt) for t, fmt in _SCALAR_FORMATS.items()}
_SCALARS: dict[int, np.dtype[Any]] = {t: np.dtype(fmt) for t, fmt in _SCALAR_FORMATS.items()}
_STRING = int(GGUFValueType.STRING)
_ARRAY = int(GGUFValueType.ARRAY)
_BOOL = int(GGUFValueType.BOOL)
_UINT32 = int(GGUFValueType.UINT32)

# Tensor types whose bytes are plain elements: uploaded as they are and converted on the device.
_PLAIN_TYPES: dict[str, np.dtype[Any]] = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F64": np.dtype("<f8"),
    "I8": np.dtype("<i1"),
    "I16": np.dtype("<i2"),
    "I32": np.dtype("<i4"),
    "I64": np.dtype("<i8"),
}


class GGUFError(PyGPUkitError, ValueError):
    """A GGUF file is malformed, unsupported or inconsistent.

    ``path`` is the file, ``offset`` the byte offset of the field found at fault (0 for problems of the
    file as a whole); both are also in the message.
    """

    def __init__(self, message: str, *, path: str = "", offset: int = 0) -> None:
        super().__init__(message)
        self.path = path
        self.offset = offset


@dataclass(frozen=True, slots=True)
class GGUFTensorInfo:
    """One tensor of a GGUF file, as validated by :class:`GGUFFile`.

    ``qtype`` is the ``GGMLQuantizationType`` name (``"F32"``, ``"Q8_0"``, ``"Q4_K"``...) and ``type_id``
    its number. ``shape`` is in NumPy (row-major) order, the reverse of the GGUF dims. ``offset`` is the
    absolute byte offset of the data in the file and ``nbytes`` its length.
    """

    name: str
    qtype: str
    type_id: int
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    n_elements: int


class _Parser:
    """Bounds-checked reads from a mapped file; every failure is a GGUFError.

    :meth:`skip` checks a metadata value's structure and steps over it (the first pass), :meth:`value`
    builds it (the second)."""

    def __init__(self, buf: mmap.mmap, size: int, path: str) -> None:
        self.buf = buf
        self.size = size
        self.path = path
        self.pos = 0
        self.items = 0  # metadata array items seen by skip(), against _MAX_ARRAY_ITEMS

    def fail(self, message: str, offset: int) -> GGUFError:
        return GGUFError(f"{self.path}: {message} (at byte offset {offset})", path=self.path, offset=offset)

    def need(self, nbytes: int, what: str) -> None:
        if nbytes > self.size - self.pos:
            left = self.size - self.pos
            raise self.fail(f"{what} needs {nbytes} bytes, but the file ends {left} bytes further", self.pos)

    def u32(self, what: str) -> int:
        self.need(4, what)
        (value,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return int(value)

    def u64(self, what: str) -> int:
        self.need(8, what)
        (value,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return int(value)

    def string_span(self, what: str) -> tuple[int, int]:
        """Step over a string; its bytes are [start, end)."""
        at = self.pos
        length = self.u64(f"length of {what}")
        if length > self.size - self.pos:
            raise self.fail(f"{what} has length {length}, past the end of the file ({self.size} bytes)", at)
        start = self.pos
        self.pos += length
        return start, self.pos

    def string(self, what: str) -> str:
        start, end = self.string_span(what)
        try:
            return self.buf[start:end].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{what} is not valid UTF-8", start + exc.start) from None

    def value_type(self, what: str) -> int:
        at = self.pos
        vtype = self.u32(f"value type of {what}")
        if vtype not in _SCALARS and vtype not in (_STRING, _ARRAY):
            raise self.fail(f"{what} has unknown value type {vtype}", at)
        return vtype

    def array_header(self, what: str, depth: int) -> tuple[int, int]:
        """The item type and count of an array, the count checked against the bytes left."""
        if depth >= _MAX_ARRAY_DEPTH:
            raise self.fail(f"{what} nests arrays deeper than {_MAX_ARRAY_DEPTH} levels", self.pos)
        item_type = self.value_type(f"items of {what}")
        count_at = self.pos
        count = self.u64(f"length of {what}")
        left = self.size - self.pos
        dtype = _SCALARS.get(item_type)
        # The least each item can take: a count that could not fit is rejected before it drives a loop.
        least = dtype.itemsize if dtype is not None else 8 if item_type == _STRING else 12
        if count > left // least:
            raise self.fail(
                f"{what} claims {count} items of type {GGUFValueType(item_type).name}, which need at least "
                f"{count * least} bytes, but only {left} remain",
                count_at,
            )
        return item_type, count

    # -- first pass: structure only --------------------------------------------------------------------
    def skip(self, vtype: int, what: str, depth: int = 0) -> None:
        scalar = _SCALAR_STRUCTS.get(vtype)
        if scalar is not None:
            self.need(scalar.size, what)
            self.pos += scalar.size
        elif vtype == _STRING:
            self.string_span(what)
        else:
            count_at = self.pos + 4
            item_type, count = self.array_header(what, depth)
            self.items += count
            if self.items > _MAX_ARRAY_ITEMS:
                raise self.fail(
                    f"{what} brings the metadata to more than {_MAX_ARRAY_ITEMS} array items (the limit of this "
                    f"reader; real models have under a million)",
                    count_at,
                )
            dtype = _SCALARS.get(item_type)
            if dtype is not None:
                self.pos += count * dtype.itemsize  # fits: array_header checked it
            elif item_type == _STRING:
                self.skip_strings(count, what)
            else:
                for i in range(count):
                    self.skip(_ARRAY, f"item {i} of {what}", depth + 1)

    def skip_strings(self, count: int, what: str) -> None:
        # Hot loop of a tokenizer's vocabulary (about 100k strings): string_span() inlined.
        buf, size, pos = self.buf, self.size, self.pos
        unpack = _U64.unpack_from
        for i in range(count):
            if size - pos < 8:
                raise self.fail(f"length of item {i} of {what} runs past the end of the file", pos)
            (length,) = unpack(buf, pos)
            if length > size - pos - 8:
                raise self.fail(f"item {i} of {what} has length {length}, past the end of the file ({size} bytes)", pos)
            pos += 8 + length
        self.pos = pos

    # -- second pass: Python values --------------------------------------------------------------------
    def value(self, vtype: int, what: str, depth: int = 0) -> Any:
        scalar = _SCALAR_STRUCTS.get(vtype)
        if scalar is not None:
            at = self.pos
            self.need(scalar.size, what)
            (value,) = scalar.unpack_from(self.buf, self.pos)
            self.pos += scalar.size
            if vtype == _BOOL:
                if value > 1:
                    raise self.fail(f"{what} is a bool stored as {value} (must be 0 or 1)", at)
                return bool(value)
            return value
        if vtype == _STRING:
            return self.string(what)
        item_type, count = self.array_header(what, depth)
        dtype = _SCALARS.get(item_type)
        if dtype is not None:
            items = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos)
            if item_type == _BOOL:
                bad = np.flatnonzero(items > 1)
                if bad.size:
                    i = int(bad[0])
                    raise self.fail(f"item {i} of {what} is a bool stored as {items[i]} (must be 0 or 1)", self.pos + i)
                values: list[Any] = (items != 0).tolist()
            else:
                values = items.tolist()
            del items  # releases the export of the mapping now, so close() can unmap it
            self.pos += count * dtype.itemsize
            return values
        if item_type == _STRING:
            return self.strings(count, what)
        return [self.value(_ARRAY, f"item {i} of {what}", depth + 1) for i in range(count)]

    def strings(self, count: int, what: str) -> list[str]:
        # Hot loop of a tokenizer's vocabulary: string() inlined. The first pass checked the lengths.
        buf, size, pos = self.buf, self.size, self.pos
        unpack = _U64.unpack_from
        out: list[str] = []
        append = out.append
        for i in range(count):
            if size - pos < 8:
                raise self.fail(f"length of item {i} of {what} runs past the end of the file", pos)
            (length,) = unpack(buf, pos)
            start = pos + 8
            end = start + length
            if end > size:
                raise self.fail(f"item {i} of {what} has length {length}, past the end of the file ({size} bytes)", pos)
            try:
                append(buf[start:end].decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise self.fail(f"item {i} of {what} is not valid UTF-8", start + exc.start) from None
            pos = end
        self.pos = pos
        return out


@dataclass(slots=True)
class _RawTensor:
    name: str
    dims: list[int]  # GGUF order, fastest first
    dims_at: int
    type_id: int
    type_at: int
    rel_offset: int
    rel_offset_at: int


class GGUFFile:
    """A GGUF file, validated when opened and memory-mapped for reading tensor data.

    ``metadata`` maps every key to a plain Python value (``str``, ``int``, ``float``, ``bool`` or a list
    of them); ``tensors`` maps names to :class:`GGUFTensorInfo` in file order. :meth:`raw` gives a
    tensor's bytes without copying, :meth:`to_gpu` uploads and dequantizes them. Use it as a context
    manager, or call :meth:`close`, to release the mapping.

    Raises :class:`GGUFError` for any malformed or unsupported file; ``OSError`` if it cannot be opened.
    """

    path: str
    version: int
    metadata: dict[str, Any]
    alignment: int
    data_offset: int
    tensors: dict[str, GGUFTensorInfo]

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._map: mmap.mmap | None = None
        self._bytes: np.ndarray[Any, np.dtype[np.uint8]] | None = None
        with open(self.path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < _HEADER_BYTES:
                raise GGUFError(
                    f"{self.path}: too short for a GGUF header ({size} bytes, at least {_HEADER_BYTES} needed)"
                    f" (at byte offset {size})",
                    path=self.path,
                    offset=size,
                )
            mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        parser = _Parser(mapped, size, self.path)
        try:
            self._parse(parser)
        except GGUFError:
            _unmap(mapped)
            raise
        except (ValueError, IndexError, KeyError, OverflowError, struct.error, UnicodeError) as exc:
            # Defence in depth: the checks above are meant to leave nothing for these to catch.
            _unmap(mapped)
            raise parser.fail(f"malformed GGUF header ({type(exc).__name__}: {exc})", parser.pos) from exc
        self._map = mapped
        self._bytes = np.frombuffer(mapped, dtype=np.uint8)

    # -- parsing -------------------------------------------------------------------------------------
    def _parse(self, p: _Parser) -> None:
        magic = p.buf[0:4]
        if magic != _MAGIC:
            raise p.fail(f"not a GGUF file: magic is {magic!r}, expected {_MAGIC!r}", 0)
        p.pos = 4
        version = p.u32("version")
        if version not in _SUPPORTED_VERSIONS:
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            if swapped in (1, 2, 3):
                raise p.fail("big-endian GGUF files are not supported", 4)
            raise p.fail(f"unsupported version {version} (supported: 2 and 3)", 4)
        self.version = version
        tensor_count = p.u64("tensor count")
        kv_count = p.u64("metadata count")
        left = p.size - p.pos
        if kv_count > min(left // _MIN_KV_BYTES, _MAX_KV):
            message = f"metadata count {kv_count} cannot fit in the {left} bytes after the header"
            raise p.fail(f"{message} or exceeds the limit of {_MAX_KV}", 16)
        if tensor_count > min((left - kv_count * _MIN_KV_BYTES) // _MIN_TENSOR_INFO_BYTES, _MAX_TENSORS):
            message = f"tensor count {tensor_count} cannot fit in the {left} bytes after the header"
            raise p.fail(f"{message} or exceeds the limit of {_MAX_TENSORS}", 8)

        # First pass over the metadata: keys, types and where each value starts; values only stepped over.
        entries: list[tuple[str, int, int]] = []
        keys: set[str] = set()
        alignment = _DEFAULT_ALIGNMENT
        for i in range(kv_count):
            at = p.pos
            key = p.string(f"key of metadata entry {i}")
            if key in keys:
                raise p.fail(f"duplicate metadata key {key!r}", at)
            keys.add(key)
            vtype_at = p.pos
            vtype = p.value_type(repr(key))
            entries.append((key, vtype, p.pos))
            if key == "general.alignment":
                if vtype != _UINT32:
                    raise p.fail(f"general.alignment must be a uint32, not {GGUFValueType(vtype).name}", vtype_at)
                alignment = p.u32("general.alignment")
                if alignment == 0 or alignment & (alignment - 1):
                    raise p.fail(f"general.alignment {alignment} is not a power of two", vtype_at + 4)
            else:
                p.skip(vtype, repr(key))
        self.alignment = alignment

        raw: list[_RawTensor] = []
        names: set[str] = set()
        for i in range(tensor_count):
            at = p.pos
            name = p.string(f"name of tensor {i}")
            if name in names:
                raise p.fail(f"duplicate tensor name {name!r}", at)
            names.add(name)
            n_dims_at = p.pos
            n_dims = p.u32(f"rank of tensor {name!r}")
            if not 1 <= n_dims <= _MAX_DIMS:
                raise p.fail(f"tensor {name!r} has rank {n_dims} (must be 1 to {_MAX_DIMS})", n_dims_at)
            dims_at = p.pos
            dims = [p.u64(f"dims of tensor {name!r}") for _ in range(n_dims)]
            for d, dim in enumerate(dims):
                if dim == 0:
                    raise p.fail(f"tensor {name!r} has a zero dim (GGUF dims {dims})", dims_at + 8 * d)
            type_at = p.pos
            type_id = p.u32(f"type of tensor {name!r}")
            rel_at = p.pos
            rel = p.u64(f"data offset of tensor {name!r}")
            raw.append(_RawTensor(name, dims, dims_at, type_id, type_at, rel, rel_at))

        # The data section starts at the first multiple of the alignment after the tensor infos.
        data_offset = -(-p.pos // alignment) * alignment
        self.data_offset = data_offset
        tensors: dict[str, GGUFTensorInfo] = {}
        for t in raw:
            tensors[t.name] = self._check_tensor(p, t, data_offset)
        spans = sorted((info.offset, info.offset + info.nbytes, name) for name, info in tensors.items())
        for (_, end, first), (start, _, second) in itertools.pairwise(spans):
            if start < end:
                at = next(t.rel_offset_at for t in raw if t.name == second)
                raise p.fail(f"tensor {second!r} overlaps tensor {first!r} (bytes {start} to {end})", at)
        self.tensors = tensors

        # Second pass: the header holds together, so its values can be built.
        metadata: dict[str, Any] = {}
        for key, vtype, at in entries:
            p.pos = at
            metadata[key] = p.value(vtype, repr(key))
        self.metadata = metadata

    def _check_tensor(self, p: _Parser, t: _RawTensor, data_offset: int) -> GGUFTensorInfo:
        try:
            qtype = GGMLQuantizationType(t.type_id)
            block, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise p.fail(f"tensor {t.name!r} has unknown type id {t.type_id}", t.type_at) from None
        if t.dims[0] % block:
            raise p.fail(
                f"tensor {t.name!r} of type {qtype.name}: its first GGUF dim {t.dims[0]} is not a multiple of "
                f"the block size {block}",
                t.dims_at,
            )
        n_elements = math.prod(t.dims)
        nbytes = n_elements // block * type_size
        if t.rel_offset % self.alignment:
            raise p.fail(
                f"tensor {t.name!r} has data offset {t.rel_offset}, not a multiple of the alignment {self.alignment}",
                t.rel_offset_at,
            )
        offset = data_offset + t.rel_offset
        if nbytes > p.size - offset:
            raise p.fail(
                f"tensor {t.name!r} ({qtype.name}, GGUF dims {t.dims}) needs bytes {offset} to {offset + nbytes}, "
                f"past the end of the file ({p.size} bytes)",
                t.rel_offset_at,
            )
        shape = tuple(reversed(t.dims))
        return GGUFTensorInfo(t.name, qtype.name, t.type_id, shape, offset, nbytes, n_elements)

    # -- access --------------------------------------------------------------------------------------
    @property
    def architecture(self) -> str:
        """``general.architecture`` (``"llama"``, ``"qwen2"``...); GGUFError if missing or not a string."""
        value = self.metadata.get("general.architecture")
        if not isinstance(value, str):
            problem = "has no general.architecture" if value is None else "has a general.architecture that is no string"
            # The offset: where the metadata starts, there being no one field to blame.
            message = f"{self.path}: the metadata {problem} (at byte offset {_HEADER_BYTES})"
            raise GGUFError(message, path=self.path, offset=_HEADER_BYTES)
        return value

    @property
    def tensor_names(self) -> list[str]:
        """The tensor names in file order."""
        return list(self.tensors)

    def get(self, key: str, default: Any = None) -> Any:
        """The metadata value of ``key``, or ``default``."""
        return self.metadata.get(key, default)

    def info(self, name: str) -> GGUFTensorInfo:
        """The :class:`GGUFTensorInfo` of tensor ``name`` (KeyError naming the file if there is none)."""
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"{self.path} has no tensor {name!r} ({len(self.tensors)} tensors)") from None

    def raw(self, name: str) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """The bytes of tensor ``name``: a read-only uint8 view of the memory-mapped file, no copy."""
        info = self.info(name)
        if self._bytes is None:
            message = f"{self.path}: the file is closed (at byte offset {info.offset})"
            raise GGUFError(message, path=self.path, offset=info.offset)
        return self._bytes[info.offset : info.offset + info.nbytes]

    def to_gpu(self, name: str, dtype: Any = None, stream: Stream | None = None) -> GPUArray:
        """Tensor ``name`` as a device array of its ``shape`` and ``dtype`` (float32 when None).

        The stored bytes are uploaded as they are; quantized types are dequantized on the device by
        :func:`pygpukit.ops.dequantize_gguf` (float32, float16 or bfloat16 results), plain types (F32,
        F16, BF16, F64, I8..I64) converted there when ``dtype`` differs. ``stream``: where the upload
        and the conversion run (the current stream when None).
        """
        from pygpukit.core.array import from_numpy
        from pygpukit.core.dtypes import as_dtype, float32

        info = self.info(name)
        target = float32 if dtype is None else as_dtype(dtype)
        data = self.raw(name)
        plain = _PLAIN_TYPES.get(info.qtype)
        if plain is not None:
            array = from_numpy(data.view(plain).reshape(info.shape), stream=stream)
            return array if array.dtype == target else array.astype(target, stream=stream)
        from pygpukit.ops import dequantize_gguf  # lazily: pygpukit.ops loads its kernels

        with stream if stream is not None else contextlib.nullcontext():
            device_bytes = from_numpy(data, stream=stream)
            result: GPUArray = dequantize_gguf(device_bytes, info.qtype, info.shape, target)
        return result

    def close(self) -> None:
        """Release the mapping. Views from :meth:`raw` keep it alive until they are gone."""
        mapped, self._map, self._bytes = self._map, None, None
        if mapped is not None:
            _unmap(mapped)

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def __len__(self) -> int:
        return len(self.tensors)

    def __repr__(self) -> str:
        arch = self.metadata.get("general.architecture")
        return f"GGUFFile({self.path!r}, version={self.version}, architecture={arch!r}, tensors={len(self.tensors)})"


def _unmap(mapped: mmap.mmap) -> None:
    # NumPy views handed out by raw() export the buffer; then the mapping is released with the last one.
    with contextlib.suppress(BufferError):
        mapped.close()
