"""Fuzz target: safetensors checkpoints (pygpukit.llm.safetensors): single files and the index JSON of
sharded ones.

Contract: opening any input either succeeds or raises SafeTensorsError (or a subclass); every tensor of
a file that opens can be read as a NumPy view of its stated shape and dtype (its bytes lie inside the
file), and small ones uploaded (any PyGPUkitError: the upload refuses dtypes pygpukit lacks). The first
input byte chooses the form: even for a ``.safetensors`` file, odd for a ``model.safetensors.index.json``
beside two valid shards.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import checked, instrumented, main, scratch_dir

with instrumented("pygpukit.llm.safetensors"):
    from pygpukit.core.errors import PyGPUkitError
    from pygpukit.llm.safetensors import SafeTensorsError, load_safetensors

Tensors = dict[str, np.ndarray[Any, Any]]
ERRORS = (SafeTensorsError,)
_DIR = scratch_dir("safetensors")
_SINGLE = _DIR / "model.safetensors"
_INDEX = _DIR / "index" / "model.safetensors.index.json"


def _shards() -> dict[str, Tensors]:
    rng = np.random.default_rng(3)
    first: Tensors = {"a": rng.standard_normal((2, 3)).astype(np.float32), "b": np.arange(4, dtype=np.int64)}
    second: Tensors = {"c": rng.standard_normal(5).astype(np.float16)}
    return {"model-00001-of-00002.safetensors": first, "model-00002-of-00002.safetensors": second}


def seeds() -> list[bytes]:
    from safetensors.numpy import save, save_file

    rng = np.random.default_rng(5)
    _INDEX.parent.mkdir(exist_ok=True)
    shards = _shards()
    for file, tensors in shards.items():
        save_file(tensors, str(_INDEX.parent / file))
    weight_map = {name: file for file, tensors in shards.items() for name in tensors}
    index = {"metadata": {"total_size": 64, "format": "pt"}, "weight_map": weight_map}
    mixed: Tensors = {
        "w": rng.standard_normal((3, 4)).astype(np.float32),
        "i": np.arange(6, dtype=np.int32).reshape(2, 3),
        "h": rng.standard_normal(7).astype(np.float16),
        "s": np.array(1.5),
        "e": np.zeros((0, 3), np.uint8),
    }
    small: Tensors = {"u": rng.integers(0, 9, (2, 2)).astype(np.uint16), "b": np.array([True, False])}
    singles = [save(mixed, metadata={"format": "pt", "note": "seed"}), save(small)]
    return [b"\x00" + s for s in singles] + [b"\x01" + json.dumps(index).encode()]


def one_input(data: bytes) -> None:
    if not data:
        return
    path = _INDEX if data[0] & 1 else _SINGLE
    path.write_bytes(data[1:])
    try:
        reader = load_safetensors(path)
    except SafeTensorsError:
        return
    with reader:
        repr(reader)
        reader.metadata  # noqa: B018 - validated on access
        for name in reader.tensor_names:
            info = checked(ERRORS, lambda name=name: reader.info(name))  # a shard may fail when first opened
            view = checked(ERRORS, lambda name=name: reader.numpy(name))
            if info is None or view is None:
                continue
            assert view.shape == info.shape, (name, view.shape, info.shape)
            assert view.nbytes == info.nbytes
            if info.nbytes <= 1 << 14:
                array = checked((PyGPUkitError,), lambda name=name: reader.to_gpu(name))
                if array is not None:
                    assert array.shape == info.shape
                    assert array.to_numpy().tobytes() == view.tobytes()


if __name__ == "__main__":
    main("safetensors", one_input, seeds)
