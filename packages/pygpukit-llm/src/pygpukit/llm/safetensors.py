"""A validating reader of safetensors checkpoints: single files, sharded checkpoints and directories.

Files are untrusted input. Opening one reads and checks the header only (its read is bounded by the
file's real size and :data:`MAX_HEADER_SIZE`); tensor data is memory-mapped read-only and handed out as
zero-copy NumPy views, so no allocation depends on the shapes a file claims. Every problem with a file
raises :class:`SafeTensorsError` naming the file and the byte offset (and the tensor) concerned.

The module is over 600 lines because the header checks, the single-file and sharded readers and the
device upload share one validated view of the file and are read together when auditing it.
"""

from __future__ import annotations

import abc
import itertools
import json
import math
import mmap
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
from tqdm.auto import tqdm

from pygpukit.core.array import GPUArray, from_numpy
from pygpukit.core.dtypes import DType, as_dtype
from pygpukit.core.errors import DTypeError, PyGPUkitError
from pygpukit.core.stream import Stream

__all__ = [
    "MAX_HEADER_SIZE",
    "MAX_INDEX_SIZE",
    "MAX_RANK",
    "SafeTensorsError",
    "SafeTensorsFile",
    "SafeTensorsNotFoundError",
    "ShardedSafeTensorsFile",
    "TensorInfo",
    "TensorNotFoundError",
    "load_safetensors",
    "upload_all",
]

MAX_HEADER_SIZE = 100_000_000
"""Largest accepted JSON header, in bytes (the limit of the reference implementation)."""

MAX_INDEX_SIZE = 64 * 1024 * 1024
"""Largest accepted ``model.safetensors.index.json``, in bytes."""

MAX_RANK = 16
"""Most dimensions a tensor may have."""

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"

# Valid shapes and offsets fit in 20 digits (21 with a sign); longer integer literals are refused
# before int() sees them, since int() of a huge digit string takes quadratic time (Python 3.10 has no cap).
_MAX_INT_LITERAL = 21
_MAX_SHOWN = 120  # characters of a tensor name quoted in an error message

_NUMPY_DTYPES: dict[str, np.dtype[Any]] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
    "C64": np.dtype("<c8"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype(np.bool_),
}


# -- errors -----------------------------------------------------------------------------------------
class SafeTensorsError(PyGPUkitError, ValueError):
    """A safetensors file (or index) is missing, unreadable or malformed, or a tensor is not in it.

    ``path`` is the file concerned, ``offset`` the byte offset in it where the problem lies (None when
    the problem has no position, e.g. a missing file) and ``tensor`` the tensor concerned, if any.
    """

    def __init__(
        self, detail: str, *, path: str | os.PathLike[str] = "", offset: int | None = None, tensor: str | None = None
    ) -> None:
        self.detail = detail
        self.path = os.fspath(path)
        self.offset = offset
        self.tensor = tensor
        where = f" (at byte offset {offset})" if offset is not None else ""
        message = f"{self.path}: {detail}{where}" if self.path else f"{detail}{where}"
        super().__init__(message)

    def __str__(self) -> str:
        # KeyError (a base of TensorNotFoundError) would otherwise print the repr of the message.
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_error, (type(self), self.detail, self.path, self.offset, self.tensor))


class TensorNotFoundError(SafeTensorsError, KeyError):
    """The file or checkpoint has no tensor of the requested name."""


class SafeTensorsNotFoundError(SafeTensorsError, FileNotFoundError):
    """A file, shard or directory to read does not exist (or a directory holds no checkpoint)."""


def _rebuild_error(
    cls: type[SafeTensorsError], detail: str, path: str, offset: int | None, tensor: str | None
) -> SafeTensorsError:
    return cls(detail, path=path, offset=offset, tensor=tensor)


class _JsonRejectedError(Exception):
    """Raised by the JSON hooks; turned into a SafeTensorsError by the caller, which knows the file."""


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _JsonRejectedError(f"duplicate key {_show(key)} in a JSON object")
            seen.add(key)
    return result


def _bounded_int(text: str) -> int:
    if len(text) > _MAX_INT_LITERAL:
        raise _JsonRejectedError(f"integer literal with {len(text)} characters (at most {_MAX_INT_LITERAL})")
    return int(text)


def _show(name: str) -> str:
    """A tensor name for an error message: quoted, escaped to ASCII, and cut when very long."""
    shown = ascii(name[:_MAX_SHOWN])
    return shown + "..." if len(name) > _MAX_SHOWN else shown


def _parse_json(raw: bytes, path: str, base: int, what: str) -> Any:
    """Parse UTF-8 JSON ``raw`` that starts at byte ``base`` of ``path``, refusing duplicate keys."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SafeTensorsError(f"the {what} is not valid UTF-8", path=path, offset=base + exc.start) from None
    try:
        return json.loads(text, object_pairs_hook=_unique_object, parse_int=_bounded_int)
    except json.JSONDecodeError as exc:
        at = base + len(text[: exc.pos].encode("utf-8", "surrogatepass"))
        raise SafeTensorsError(f"the {what} is not valid JSON: {exc.msg}", path=path, offset=at) from None
    except _JsonRejectedError as exc:
        raise SafeTensorsError(f"the {what} is invalid: {exc}", path=path, offset=base) from None
    except RecursionError:
        raise SafeTensorsError(f"the {what} nests JSON too deeply", path=path, offset=base) from None
    except ValueError as exc:  # e.g. Python's limit on the digits of an int
        raise SafeTensorsError(f"the {what} is not valid JSON: {exc}", path=path, offset=base) from None


def _is_unicode(text: str) -> bool:
    """False for strings holding lone surrogates (JSON escapes allow them; UTF-8 does not)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# -- tensor info ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorInfo:
    """One tensor's header entry, validated.

    ``data_offsets`` is relative to the start of the data section (as stored in the header);
    ``nbytes`` is the size of the tensor's data.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    data_offsets: tuple[int, int]
    nbytes: int

    @property
    def numpy_dtype(self) -> np.dtype[Any]:
        """The NumPy dtype of the data (ml_dtypes types for BF16 and the FP8 formats)."""
        return _NUMPY_DTYPES[self.dtype]

    @property
    def gpu_dtype(self) -> DType | None:
        """The pygpukit dtype the tensor uploads as, or None when pygpukit has no such type (C64, F8_E8M0)."""
        try:
            return as_dtype(_NUMPY_DTYPES[self.dtype])
        except DTypeError:
            return None

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)


# -- the shared reader interface --------------------------------------------------------------------
class _Reader(abc.ABC):
    """What single files and sharded checkpoints have in common; subclasses provide the lookups."""

    path: str

    @property
    @abc.abstractmethod
    def tensor_names(self) -> list[str]: ...

    @property
    @abc.abstractmethod
    def metadata(self) -> dict[str, str]: ...

    @abc.abstractmethod
    def info(self, name: str) -> TensorInfo: ...

    @abc.abstractmethod
    def numpy(self, name: str) -> np.ndarray[Any, Any]: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    @property
    @abc.abstractmethod
    def num_tensors(self) -> int: ...

    def to_gpu(self, name: str, dtype: Any = None, stream: Stream | None = None) -> GPUArray:
        """Upload tensor ``name`` to a new device array, converted to ``dtype`` on the device if given.

        Conversion never happens on the host: the stored bytes are uploaded (staged through pinned
        buffers when large) and :meth:`GPUArray.astype` converts them. Raises :class:`DTypeError` for a
        stored dtype pygpukit does not support (C64, F8_E8M0).
        """
        view = self.numpy(name)
        try:
            as_dtype(view.dtype)
        except DTypeError:
            info = self.info(name)
            raise DTypeError(
                f"{self.path}: tensor {_show(name)} has dtype {info.dtype}, which pygpukit arrays do not support"
            ) from None
        array = from_numpy(view, stream=stream)
        if array.shape != view.shape:  # from_numpy makes 0-d arrays 1-d (np.ascontiguousarray)
            array = array.reshape(view.shape)
        if dtype is not None and as_dtype(dtype) != array.dtype:
            array = array.astype(dtype, stream=stream)
        return array

    def __getitem__(self, name: str) -> np.ndarray[Any, Any]:
        return self.numpy(name)

    def __len__(self) -> int:
        return self.num_tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensor_names)

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- single files -----------------------------------------------------------------------------------
def _open_error(exc: OSError, path: str, what: str) -> SafeTensorsError:
    if isinstance(exc, FileNotFoundError):
        return SafeTensorsNotFoundError(f"{what} does not exist", path=path)
    return SafeTensorsError(f"cannot read the {what}: {exc.strerror or exc}", path=path)


class SafeTensorsFile(_Reader):
    """One ``.safetensors`` file, opened lazily: the constructor reads and validates the header only and
    memory-maps the file read-only; :meth:`numpy` returns zero-copy views of the mapping.

    ``tensor_names`` lists the tensors in header order. Use as a context manager, or call
    :meth:`close`; arrays already returned by :meth:`numpy` stay valid after closing.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._closed = False
        try:
            with open(self.path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                header = self._read_header(handle, size)
                self._data_start = 8 + len(header)
                self._infos, self._metadata = self._validate(header, size)
                # mmap keeps its own duplicate of the descriptor, so the file can be closed right away.
                self._map: mmap.mmap | None = (
                    mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if size > self._data_start else None
                )
        except IsADirectoryError as exc:
            raise SafeTensorsError("is a directory, not a safetensors file", path=self.path) from exc
        except OSError as exc:
            raise _open_error(exc, self.path, "file") from exc
        self._names = list(self._infos)

    def _read_header(self, handle: Any, size: int) -> bytes:
        if size < 8:
            raise SafeTensorsError(
                f"the file has {size} bytes; a safetensors file has at least 8", path=self.path, offset=0
            )
        length = int.from_bytes(handle.read(8), "little")
        if length > MAX_HEADER_SIZE:
            raise SafeTensorsError(
                f"the header length {length} exceeds the limit of {MAX_HEADER_SIZE} bytes", path=self.path, offset=0
            )
        if length > size - 8:
            raise SafeTensorsError(
                f"the header length {length} exceeds the {size - 8} bytes after the length prefix",
                path=self.path,
                offset=0,
            )
        header: bytes = handle.read(length)
        if len(header) != length:
            raise SafeTensorsError(
                f"the file ended inside the header ({len(header)} of {length} bytes)",
                path=self.path,
                offset=8 + len(header),
            )
        return header

    def _entry_offset(self, header: bytes, name: str) -> int:
        """Best-effort byte offset of ``name``'s entry in the file (the header start when not found)."""
        for ensure_ascii in (False, True):
            key = json.dumps(name, ensure_ascii=ensure_ascii).encode("utf-8", "surrogatepass")
            at = header.find(key)
            if at >= 0:
                return 8 + at
        return 8

    def _validate(self, header: bytes, size: int) -> tuple[dict[str, TensorInfo], dict[str, str]]:
        if not header.startswith(b"{"):
            raise SafeTensorsError("the header does not start with '{'", path=self.path, offset=8)
        parsed = _parse_json(header, self.path, 8, "header")
        if not isinstance(parsed, dict):
            raise SafeTensorsError("the header is not a JSON object", path=self.path, offset=8)
        data_size = size - 8 - len(header)
        infos: dict[str, TensorInfo] = {}
        metadata: dict[str, str] = {}
        for name, entry in parsed.items():
            if name == "__metadata__":
                metadata = self._validate_metadata(header, entry)
            else:
                infos[name] = self._validate_entry(header, name, entry, data_size)
        self._check_overlaps(infos)
        return infos, metadata

    def _validate_metadata(self, header: bytes, entry: Any) -> dict[str, str]:
        if entry is None:
            return {}
        if not isinstance(entry, dict) or not all(
            isinstance(value, str) and _is_unicode(key) and _is_unicode(value) for key, value in entry.items()
        ):
            raise SafeTensorsError(
                "__metadata__ must map strings to strings",
                path=self.path,
                offset=self._entry_offset(header, "__metadata__"),
            )
        return dict(entry)

    def _validate_entry(self, header: bytes, name: str, entry: Any, data_size: int) -> TensorInfo:
        def fail(problem: str) -> SafeTensorsError:
            return SafeTensorsError(
                f"tensor {_show(name)}: {problem}", path=self.path, offset=self._entry_offset(header, name), tensor=name
            )

        if not name or not _is_unicode(name):
            raise fail("a tensor name must be a non-empty Unicode string")
        if not isinstance(entry, dict):
            raise fail("the entry is not a JSON object")
        for key in ("dtype", "shape", "data_offsets"):
            if key not in entry:
                raise fail(f"the entry has no {key!r}")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str) or dtype not in _NUMPY_DTYPES:
            known = ", ".join(_NUMPY_DTYPES)
            shown = _show(dtype) if isinstance(dtype, str) else ascii(dtype)[:_MAX_SHOWN]
            raise fail(f"unknown dtype {shown}; known: {known}")
        if not isinstance(shape, list) or len(shape) > MAX_RANK:
            raise fail(f"the shape must be a list of at most {MAX_RANK} dimensions")
        if not all(type(dim) is int and dim >= 0 for dim in shape):
            raise fail(f"the shape {shape} must hold non-negative integers")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(v) is int for v in offsets)):
            raise fail("data_offsets must be a list of two integers [begin, end]")
        begin, end = offsets
        if not 0 <= begin <= end:
            raise fail(f"data_offsets [{begin}, {end}] must satisfy 0 <= begin <= end")
        itemsize = _NUMPY_DTYPES[dtype].itemsize
        # NumPy refuses shapes whose non-zero dimensions multiply past its index range, even when
        # another dimension is 0; Python ints cannot overflow here.
        if math.prod(max(dim, 1) for dim in shape) * itemsize >= 2**63:
            raise fail(f"the shape {shape} is too large")
        nbytes = math.prod(shape) * itemsize
        if end - begin != nbytes:
            raise fail(
                f"data_offsets [{begin}, {end}] span {end - begin} bytes, but shape {shape} of {dtype} needs {nbytes}"
            )
        if end > data_size:
            raise SafeTensorsError(
                f"tensor {_show(name)}: data_offsets [{begin}, {end}] extend past the end of the data section "
                f"({data_size} bytes)",
                path=self.path,
                offset=self._data_start + begin,
                tensor=name,
            )
        return TensorInfo(name, dtype, tuple(shape), (begin, end), nbytes)

    def _check_overlaps(self, infos: dict[str, TensorInfo]) -> None:
        # Empty tensors own no bytes and may sit anywhere; gaps between tensors are allowed.
        ranges = sorted((i.data_offsets, i.name) for i in infos.values() if i.nbytes)
        for ((_, prev_end), prev), ((begin, end), name) in itertools.pairwise(ranges):
            if begin < prev_end:
                raise SafeTensorsError(
                    f"tensor {_show(name)} (data_offsets [{begin}, {end}]) overlaps tensor {_show(prev)} "
                    f"(ending at {prev_end})",
                    path=self.path,
                    offset=self._data_start + begin,
                    tensor=name,
                )

    # -- lookups ------------------------------------------------------------------------------------
    @property
    def tensor_names(self) -> list[str]:
        """Tensor names, in header order."""
        return list(self._names)

    @property
    def metadata(self) -> dict[str, str]:
        """The ``__metadata__`` entry ({} when the file has none)."""
        return dict(self._metadata)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def num_tensors(self) -> int:
        """Number of tensors."""
        return len(self._infos)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._infos

    def info(self, name: str) -> TensorInfo:
        """The header entry of tensor ``name``; raises :class:`TensorNotFoundError`."""
        if name in self:
            return self._infos[name]
        raise TensorNotFoundError(f"no tensor named {_show(str(name))}", path=self.path, tensor=str(name))

    def numpy(self, name: str) -> np.ndarray[Any, Any]:
        """Tensor ``name`` as a read-only, zero-copy NumPy view of the mapped file."""
        info = self.info(name)
        if self._closed:
            raise SafeTensorsError(f"cannot read tensor {_show(name)}: the file is closed", path=self.path, tensor=name)
        if info.nbytes == 0 or self._map is None:
            empty = np.empty(info.shape, info.numpy_dtype)  # no data: nothing to map
            empty.flags.writeable = False
            return empty
        view: np.ndarray[Any, Any] = np.ndarray(
            info.shape, info.numpy_dtype, buffer=self._map, offset=self._data_start + info.data_offsets[0]
        )
        view.flags.writeable = False
        return view

    def close(self) -> None:
        """Release the mapping. Views already handed out keep it alive until they are gone."""
        self._closed = True
        # Never mmap.close(): NumPy views hold a reference to the mapping but no buffer export, so
        # closing would unmap memory they still point at. Dropping the reference unmaps it as soon as
        # the last view is gone (at once when there is none).
        self._map = None

    def __enter__(self) -> SafeTensorsFile:
        return self

    def __repr__(self) -> str:
        state = ", closed" if self._closed else ""
        return f"SafeTensorsFile({self.path!r}, {len(self._names)} tensors{state})"


# -- sharded checkpoints ----------------------------------------------------------------------------
def _plain_file_name(name: str) -> bool:
    """A file name directly inside a directory: no separators, no '.' or '..', nothing absolute."""
    return (
        bool(name)
        and name not in (".", "..")
        and "/" not in name
        and "\\" not in name
        and "\x00" not in name
        and not os.path.isabs(name)
        and os.path.basename(name) == name
        and _is_unicode(name)
    )


class ShardedSafeTensorsFile(_Reader):
    """A sharded checkpoint described by ``model.safetensors.index.json``
    (``{"metadata": {...}, "weight_map": {tensor: shard file name}}``).

    The index is validated on construction and every shard must exist; shards themselves are opened
    (header only, as :class:`SafeTensorsFile`) on the first access to one of their tensors, when each
    tensor the index assigns to them must be present. ``tensor_names`` lists the tensors in index order,
    ``shard_files`` the shard paths, sorted. ``metadata`` is the index's ``metadata`` object, with
    values that are not strings (such as ``total_size``) given as their JSON text.
    """

    def __init__(self, index_path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(index_path)
        self._directory = os.path.dirname(os.path.abspath(self.path))
        self._closed = False
        self._lock = threading.Lock()
        self._shards: dict[str, SafeTensorsFile] = {}
        parsed = _parse_json(self._read_index(), self.path, 0, "index")
        if not isinstance(parsed, dict):
            raise SafeTensorsError("the index is not a JSON object", path=self.path, offset=0)
        self._metadata = self._validate_metadata(parsed.get("metadata"))
        weight_map = parsed.get("weight_map")
        if not isinstance(weight_map, dict):
            raise SafeTensorsError("the index has no 'weight_map' object", path=self.path)
        for tensor, shard in weight_map.items():
            if not tensor or not _is_unicode(tensor):
                raise SafeTensorsError("weight_map has an empty or invalid tensor name", path=self.path, tensor=tensor)
            if not isinstance(shard, str) or not _plain_file_name(shard):
                shown = _show(shard) if isinstance(shard, str) else repr(shard)[:_MAX_SHOWN]
                raise SafeTensorsError(
                    f"weight_map maps tensor {_show(tensor)} to {shown}, which is not a plain file name in the "
                    f"index's directory",
                    path=self.path,
                    tensor=tensor,
                )
        self._weight_map: dict[str, str] = dict(weight_map)
        self._shard_names = sorted(set(self._weight_map.values()))
        for shard in self._shard_names:
            shard_path = os.path.join(self._directory, shard)
            if not os.path.isfile(shard_path):
                raise SafeTensorsNotFoundError(
                    f"shard {_show(shard)} named by the index {self.path} does not exist", path=shard_path
                )

    def _read_index(self) -> bytes:
        try:
            with open(self.path, "rb") as handle:
                raw: bytes = handle.read(MAX_INDEX_SIZE + 1)
        except IsADirectoryError as exc:
            raise SafeTensorsError("is a directory, not an index file", path=self.path) from exc
        except OSError as exc:
            raise _open_error(exc, self.path, "index") from exc
        if len(raw) > MAX_INDEX_SIZE:
            raise SafeTensorsError(
                f"the index is larger than {MAX_INDEX_SIZE} bytes", path=self.path, offset=MAX_INDEX_SIZE
            )
        return raw

    def _validate_metadata(self, metadata: Any) -> dict[str, str]:
        if metadata is None:
            return {}
        if not isinstance(metadata, dict):
            raise SafeTensorsError("the index's 'metadata' is not a JSON object", path=self.path)
        result: dict[str, str] = {}
        for key, value in metadata.items():
            text = value if isinstance(value, str) else json.dumps(value)
            if not _is_unicode(key) or not _is_unicode(text):
                raise SafeTensorsError("the index's 'metadata' holds invalid Unicode", path=self.path)
            result[key] = text
        return result

    # -- shards -------------------------------------------------------------------------------------
    @property
    def shard_files(self) -> list[str]:
        """Paths of the shard files, sorted."""
        return [os.path.join(self._directory, shard) for shard in self._shard_names]

    @property
    def _shard_files(self) -> list[str]:
        return self.shard_files

    def _shard(self, name: str) -> SafeTensorsFile:
        shard = self._weight_map[name]
        with self._lock:
            if self._closed:
                raise SafeTensorsError(
                    f"cannot read tensor {_show(name)}: the checkpoint is closed", path=self.path, tensor=name
                )
            opened = self._shards.get(shard)
            if opened is None:
                opened = SafeTensorsFile(os.path.join(self._directory, shard))
                missing = [t for t, s in self._weight_map.items() if s == shard and t not in opened]
                if missing:
                    opened.close()
                    raise TensorNotFoundError(
                        f"tensor {_show(missing[0])} is assigned to this shard by the index {self.path}, but the "
                        f"shard has no such tensor ({len(missing)} missing in all)",
                        path=opened.path,
                        tensor=missing[0],
                    )
                self._shards[shard] = opened
            return opened

    # -- lookups ------------------------------------------------------------------------------------
    @property
    def tensor_names(self) -> list[str]:
        """Tensor names, in index (weight_map) order."""
        return list(self._weight_map)

    @property
    def metadata(self) -> dict[str, str]:
        """The index's ``metadata`` ({} when it has none); non-string values as JSON text."""
        return dict(self._metadata)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def num_tensors(self) -> int:
        """Number of tensors."""
        return len(self._weight_map)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._weight_map

    def _check_name(self, name: str) -> None:
        if name not in self:
            raise TensorNotFoundError(f"no tensor named {_show(str(name))}", path=self.path, tensor=str(name))

    def info(self, name: str) -> TensorInfo:
        """The header entry of tensor ``name`` (opening its shard); raises :class:`TensorNotFoundError`."""
        self._check_name(name)
        return self._shard(name).info(name)

    def numpy(self, name: str) -> np.ndarray[Any, Any]:
        """Tensor ``name`` as a read-only, zero-copy NumPy view of its mapped shard."""
        self._check_name(name)
        return self._shard(name).numpy(name)

    def close(self) -> None:
        """Close every opened shard; views already handed out stay valid."""
        with self._lock:
            self._closed = True
            shards, self._shards = self._shards, {}
        for shard in shards.values():
            shard.close()

    def __enter__(self) -> ShardedSafeTensorsFile:
        return self

    def __repr__(self) -> str:
        state = ", closed" if self._closed else ""
        return (
            f"ShardedSafeTensorsFile({self.path!r}, {len(self._weight_map)} tensors in "
            f"{len(self._shard_names)} shards{state})"
        )


# -- entry points -----------------------------------------------------------------------------------
def load_safetensors(path: str | os.PathLike[str]) -> SafeTensorsFile | ShardedSafeTensorsFile:
    """Open a checkpoint: a ``.safetensors`` file, an index ``.json`` file, or a directory.

    A directory is searched for ``model.safetensors.index.json``, then ``model.safetensors``, then a
    single ``*.safetensors`` file; :class:`SafeTensorsNotFoundError` lists what was looked for otherwise.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        index = os.path.join(path, INDEX_NAME)
        if os.path.isfile(index):
            return ShardedSafeTensorsFile(index)
        single = os.path.join(path, SINGLE_NAME)
        if os.path.isfile(single):
            return SafeTensorsFile(single)
        try:
            found = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
        except OSError as exc:
            raise _open_error(exc, path, "directory") from exc
        if len(found) == 1:
            return SafeTensorsFile(os.path.join(path, found[0]))
        seen = f"found {len(found)}: {', '.join(found[:8])}{', ...' if len(found) > 8 else ''}" if found else "none"
        raise SafeTensorsNotFoundError(
            f"no checkpoint in this directory: looked for {INDEX_NAME}, {SINGLE_NAME}, or exactly one *.safetensors "
            f"file ({seen})",
            path=path,
        )
    if path.endswith(".json"):
        return ShardedSafeTensorsFile(path)
    return SafeTensorsFile(path)


def upload_all(
    st: SafeTensorsFile | ShardedSafeTensorsFile,
    names: Iterable[str] | None = None,
    dtype: Any = None,
    progress: bool = True,
) -> dict[str, GPUArray]:
    """Upload tensors (all by default, else ``names``) and return ``{name: GPUArray}``.

    ``dtype`` converts the floating-point tensors on the device; integer and bool tensors keep their
    stored dtype. The progress bar counts bytes and shows only when ``progress`` is true and the output
    is a terminal. Every name is checked before anything is uploaded.
    """
    selected = st.tensor_names if names is None else list(names)
    infos = [st.info(name) for name in selected]
    total = sum(info.nbytes for info in infos)
    target = None if dtype is None else as_dtype(dtype)
    result: dict[str, GPUArray] = {}
    with tqdm(
        total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="upload", disable=None if progress else True
    ) as bar:
        for info in infos:
            stored = info.gpu_dtype
            convert = target if stored is not None and stored.is_floating else None
            result[info.name] = st.to_gpu(info.name, dtype=convert)
            bar.update(info.nbytes)
    return result
