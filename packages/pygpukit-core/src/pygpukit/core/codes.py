"""Integer codes shared with the kernels, read from their one definition: native/kernels/common/codes.cuh.

The header is parsed (it ships in the wheel with the kernel sources), so no number is written twice.
``ACTIVATION_CODES`` maps activation names ("none", "relu", "gelu" = exact erf form, "gelu_tanh",
"silu") to codes; ``DTYPE_CODES`` maps dtype names to the codes kernels switch on at run time.
"""

from __future__ import annotations

import functools
import re

from .builtins import kernel_root
from .errors import PyGPUkitError

__all__ = ["ACTIVATION_CODES", "DTYPE_CODES", "activation_code", "enum_values"]

_ENUM = re.compile(r"enum\s+(\w+)\s*:\s*int\s*\{([^}]*)\}", re.S)
_ENTRY = re.compile(r"^\s*(k\w+)\s*=\s*(\d+)\s*$")


@functools.cache
def enum_values(enum: str) -> dict[str, int]:
    """``{enumerator: value}`` of ``enum Name : int {...}`` in common/codes.cuh, in declaration order."""
    path = kernel_root() / "common" / "codes.cuh"
    text = path.read_text()
    for match in _ENUM.finditer(text):
        if match.group(1) != enum:
            continue
        values: dict[str, int] = {}
        for item in match.group(2).split(","):
            item = item.strip()
            if not item:
                continue
            entry = _ENTRY.match(item)
            if entry is None:
                raise PyGPUkitError(f"{path}: enum {enum}: cannot parse {item!r} (expected kName = number)")
            values[entry.group(1)] = int(entry.group(2))
        return values
    raise PyGPUkitError(f"{path}: no enum {enum!r}")


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _activations() -> dict[str, int]:
    return {_snake(k[len("kAct") :]): v for k, v in enum_values("Activation").items()}


def _dtypes() -> dict[str, int]:
    from .dtypes import all_dtypes

    values = enum_values("DType")
    names = [d.name for d in all_dtypes()]
    if len(values) != len(names) or sorted(values.values()) != list(range(len(names))):
        raise PyGPUkitError(f"common/codes.cuh enum DType has {len(values)} codes; pygpukit has {len(names)} dtypes")
    return dict(zip(names, sorted(values.values()), strict=True))


ACTIVATION_CODES: dict[str, int] = _activations()
DTYPE_CODES: dict[str, int] = _dtypes()


def activation_code(activation: str | None, op: str) -> int:
    """The code of ``activation`` (None means "none"); ValueError naming the op and the choices."""
    name = "none" if activation is None else activation
    code = ACTIVATION_CODES.get(name) if isinstance(name, str) else None
    if code is None:
        choices = ", ".join(repr(k) for k in ACTIVATION_CODES)
        raise ValueError(f"{op}: unknown activation {activation!r}; expected None or one of {choices}")
    return code
