"""Options of ``python -m pygpukit.benchmark``: dtype names and their aliases, sizes, sequence lengths."""

from __future__ import annotations

__all__ = ["DTYPE_ALIASES", "SUITE_DTYPES", "TOLERANCE", "parse_dtypes", "parse_seq_lens", "parse_size"]

TOLERANCE = {"float64": 1e-12, "float32": 1e-5, "tf32": 5e-3, "float16": 2e-3, "bfloat16": 1e-2}
# Short names accepted wherever dtypes are given (--dtypes): the full names work too.
DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32",
                 "fp64": "float64", "double": "float64", "tf32": "tf32", "fp8": "fp8", "float8_e4m3fn": "fp8",
                 "e4m3": "fp8"}  # fmt: skip
# The dtypes each suite runs ("fp8": scaled_matmul with float8_e4m3fn operands, bfloat16 result).
SUITE_DTYPES = {
    "gemm": ("float64", "float32", "tf32", "float16", "bfloat16", "fp8"),
    "gemv": ("float32", "tf32", "float16", "bfloat16", "fp8"),
    "elementwise": ("float64", "float32", "float16", "bfloat16"),
    "reduction": ("float64", "float32", "float16", "bfloat16"),
    "attention": ("float32", "float16", "bfloat16"),
}


def parse_size(text: str) -> int:
    text = text.strip()
    if "^" in text:
        base, exp = text.split("^")
        value: int = int(base) ** int(exp)
    else:
        value = int(text)
    if value < 1:
        raise ValueError(f"sizes must be positive, got {text!r}")
    return value


def parse_dtypes(text: str) -> list[str]:
    """``--dtypes``: comma-separated names or aliases (bf16, fp16, fp32, fp64, tf32, fp8) to the
    benchmark's dtype names, in order, without repeats; ValueError naming an unknown one."""
    names: list[str] = []
    for raw in text.split(","):
        item = raw.strip().lower()
        name = DTYPE_ALIASES.get(item, item)
        if name not in TOLERANCE and name != "fp8":
            accepted = sorted({*TOLERANCE, *DTYPE_ALIASES})
            raise ValueError(f"unknown dtype {raw.strip()!r} (accepted: {', '.join(accepted)})")
        if name not in names:
            names.append(name)
    return names


def parse_seq_lens(text: str) -> list[int]:
    """``--seq-lens``: comma-separated positive sequence lengths; ValueError otherwise."""
    lengths = []
    for raw in text.split(","):
        try:
            value = int(raw.strip())
        except ValueError:
            raise ValueError(f"sequence lengths must be integers, got {raw.strip()!r}") from None
        if value < 1:
            raise ValueError(f"sequence lengths must be positive, got {value}")
        lengths.append(value)
    return lengths
