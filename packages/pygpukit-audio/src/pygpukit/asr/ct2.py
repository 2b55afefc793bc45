"""A reader of CTranslate2 ``model.bin`` files (the format faster-whisper loads), treating the file as
untrusted input.

Layout (little-endian; learnt from CTranslate2's src/models/model.cc): uint32 binary version (1..6); for
version >= 2 a string (the spec name, e.g. ``WhisperSpec``) and a uint32 spec revision; uint32 variable
count; per variable: string name, uint8 rank, ``rank`` uint32 dimensions, then for version >= 4 a uint8
type id (0 float32, 1 int8, 2 int16, 3 int32, 4 float16, 5 bfloat16) and a uint32 byte count, before that
a uint8 item size and a uint32 element count; then the payload. Version >= 3 ends with a uint32 alias
count and (alias, target) string pairs. A string is a uint16 length that counts a final NUL, then the bytes.

Every read is bounds-checked: truncation, impossible sizes, unknown types, duplicate names and trailing
bytes raise :class:`ModelFormatError` naming the file offset.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pygpukit.core.errors import PyGPUkitError

__all__ = ["CT2Model", "ModelFormatError", "read_model_bin"]

Array = np.ndarray[Any, Any]

_MAX_VERSION = 6
_MAX_VARIABLES = 1 << 20
_MAX_RANK = 8
# CTranslate2's DataType order; bfloat16 is kept as its uint16 bit pattern and widened on demand.
_TYPES: dict[int, tuple[str, np.dtype[Any]]] = {
    0: ("float32", np.dtype("<f4")),
    1: ("int8", np.dtype("i1")),
    2: ("int16", np.dtype("<i2")),
    3: ("int32", np.dtype("<i4")),
    4: ("float16", np.dtype("<f2")),
    5: ("bfloat16", np.dtype("<u2")),
}
_ITEM_SIZES = {4: 0, 1: 1, 2: 4}  # binary version < 4: item size -> type id (4 bytes float32, 2 bytes float16)


class ModelFormatError(PyGPUkitError, ValueError):
    """A model file is truncated, corrupt or of an unsupported kind; ``offset`` is where reading failed."""

    def __init__(self, message: str, *, path: str = "", offset: int | None = None) -> None:
        where = f" at byte offset {offset}" if offset is not None else ""
        super().__init__(f"{path or 'model file'}: {message}{where}")
        self.path = path
        self.offset = offset


@dataclass
class CT2Model:
    """The parsed file: spec name and revision, the variables (NumPy arrays; bfloat16 as uint16 bits,
    see :attr:`dtypes`) and the aliases (name -> target name)."""

    binary_version: int
    spec: str
    spec_revision: int
    variables: dict[str, Array]
    dtypes: dict[str, str]
    aliases: dict[str, str] = field(default_factory=dict)

    def get(self, name: str) -> Array:
        """The variable (or alias target) ``name`` as float32 for float types, else as stored. Quantized
        weights (int8 with a per-row ``<name>_scale``, int16 with a scalar one) come back dequantized to
        float32 (``value / scale``, CTranslate2's rule)."""
        key = self.aliases.get(name, name)
        if key not in self.variables:
            raise ModelFormatError(f"the model has no variable {name!r}")
        value = self.variables[key]
        scale_name = key + "_scale"
        if self.dtypes[key] in ("int8", "int16") and scale_name in self.variables:
            scale = self.get(scale_name).astype(np.float32)
            # An explicit row length: reshape(rows, -1) is ambiguous for a tensor with no elements.
            flat = (value.shape[0], math.prod(value.shape[1:])) if value.ndim else ()
            rows = value.reshape(flat).astype(np.float32)
            if scale.ndim == 0 or scale.size == 1:
                return (rows / scale.reshape(())).reshape(value.shape)  # type: ignore[no-any-return]
            if value.ndim == 0 or scale.shape != (value.shape[0],):
                raise ModelFormatError(f"{scale_name} has shape {scale.shape}, {key} has {value.shape}")
            return (rows / scale[:, None]).reshape(value.shape)  # type: ignore[no-any-return]
        if self.dtypes[key] == "bfloat16":
            return (value.astype(np.uint32) << 16).view(np.float32)
        if self.dtypes[key] in ("float16", "float32"):
            return value.astype(np.float32, copy=False)
        return value

    def scalar(self, name: str, default: Any = None) -> Any:
        key = self.aliases.get(name, name)
        if key not in self.variables:
            return default
        value = self.variables[key]
        if value.size == 0:
            raise ModelFormatError(f"variable {name!r} is empty where a scalar is expected")
        return value.reshape(-1)[0].item()

    def __contains__(self, name: object) -> bool:
        return name in self.variables or name in self.aliases


class _Reader:
    def __init__(self, data: memoryview, path: str) -> None:
        self.data = data
        self.pos = 0
        self.path = path

    def fail(self, message: str, offset: int | None = None) -> ModelFormatError:
        return ModelFormatError(message, path=self.path, offset=self.pos if offset is None else offset)

    def take(self, size: int, what: str) -> memoryview:
        end = self.pos + size
        if size < 0 or end > len(self.data):
            raise self.fail(f"truncated: {what} needs {size} bytes, {len(self.data) - self.pos} remain")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def unpack(self, fmt: str, what: str) -> int:
        value: int = struct.unpack("<" + fmt, self.take(struct.calcsize(fmt), what))[0]
        return value

    def string(self, what: str) -> str:
        start = self.pos
        length = self.unpack("H", f"the length of {what}")
        if length == 0:
            raise self.fail(f"{what} has length 0 (the length counts a final NUL)", start)
        raw = bytes(self.take(length, what))
        if raw[-1] != 0:
            raise self.fail(f"{what} does not end with NUL", start)
        try:
            return raw[:-1].decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8", start) from None


def read_model_bin(path: str | os.PathLike[str]) -> CT2Model:
    """Parse a CTranslate2 ``model.bin``; raises :class:`ModelFormatError` for anything malformed."""
    text = os.fspath(path)
    try:
        with open(text, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ModelFormatError(f"cannot read: {exc.strerror or exc}", path=text) from exc
    return parse_model_bin(raw, text)


def parse_model_bin(raw: bytes, path: str = "model.bin") -> CT2Model:
    """Parse the bytes of a ``model.bin`` (see :func:`read_model_bin`)."""
    r = _Reader(memoryview(raw), path)
    version = r.unpack("I", "the binary version")
    if not 1 <= version <= _MAX_VERSION:
        raise r.fail(f"unsupported binary version {version} (this reader knows 1..{_MAX_VERSION})", 0)
    spec, revision = "", 1
    if version >= 2:
        spec = r.string("the spec name")
        revision = r.unpack("I", "the spec revision")
    count_at = r.pos
    count = r.unpack("I", "the variable count")
    if count > _MAX_VARIABLES:
        raise r.fail(f"variable count {count} exceeds {_MAX_VARIABLES}", count_at)
    variables: dict[str, Array] = {}
    dtypes: dict[str, str] = {}
    for index in range(count):
        start = r.pos
        name = r.string(f"the name of variable {index}")
        if name in variables:
            raise r.fail(f"duplicate variable {name!r}", start)
        rank = r.unpack("B", f"the rank of {name!r}")
        if rank > _MAX_RANK:
            raise r.fail(f"variable {name!r} has rank {rank} (at most {_MAX_RANK})")
        dims = struct.unpack(f"<{rank}I", r.take(4 * rank, f"the dimensions of {name!r}"))
        type_at = r.pos
        if version >= 4:
            type_id = r.unpack("B", f"the type of {name!r}")
            nbytes = r.unpack("I", f"the byte count of {name!r}")
        else:
            item = r.unpack("B", f"the item size of {name!r}")
            if item not in _ITEM_SIZES:
                raise r.fail(f"variable {name!r} has item size {item}", type_at)
            type_id = _ITEM_SIZES[item]
            nbytes = r.unpack("I", f"the element count of {name!r}") * item
        if type_id not in _TYPES:
            raise r.fail(f"variable {name!r} has unknown type id {type_id}", type_at)
        type_name, np_dtype = _TYPES[type_id]
        elements = math.prod(dims)  # exact: NumPy's int64 product wraps for dimensions near 2**16 each
        if math.prod(d for d in dims if d) * np_dtype.itemsize >= 1 << 63:  # NumPy refuses it even when empty
            raise r.fail(f"variable {name!r} has dimensions {tuple(dims)} too large for an array", type_at)
        if nbytes != elements * np_dtype.itemsize:
            raise r.fail(f"variable {name!r} of shape {tuple(dims)} and type {type_name} needs "
                         f"{elements * np_dtype.itemsize} bytes, the file says {nbytes}", type_at)  # fmt: skip
        payload = r.take(nbytes, f"the data of {name!r}")
        variables[name] = np.frombuffer(payload, dtype=np_dtype).reshape(dims)
        dtypes[name] = type_name
    aliases: dict[str, str] = {}
    if version >= 3:
        n_alias = r.unpack("I", "the alias count")
        if n_alias > _MAX_VARIABLES:
            raise r.fail(f"alias count {n_alias} exceeds {_MAX_VARIABLES}", r.pos - 4)
        for index in range(n_alias):
            start = r.pos
            alias = r.string(f"alias {index}")
            target = r.string(f"the target of alias {alias!r}")
            if target not in variables:
                raise r.fail(f"alias {alias!r} names the unknown variable {target!r}", start)
            aliases[alias] = target
    if r.pos != len(raw):
        raise r.fail(f"{len(raw) - r.pos} unexpected bytes after the last record")
    return CT2Model(version, spec, revision, variables, dtypes, aliases)
