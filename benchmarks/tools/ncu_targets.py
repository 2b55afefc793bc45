"""Run a few ops whose kernels we want to inspect with Nsight Compute, each a few times:
``ncu --set basic -k regex:NAME python benchmarks/tools/ncu_targets.py``."""

from __future__ import annotations

import numpy as np

import pygpukit as gp


def main() -> None:
    rng = np.random.default_rng(0)
    x32 = gp.from_numpy(rng.standard_normal((65536, 1024), dtype=np.float32))
    xb = x32.astype(gp.bfloat16)
    w = gp.from_numpy(rng.standard_normal(4096, dtype=np.float32)).astype(gp.bfloat16)
    n = gp.from_numpy(rng.standard_normal((4096, 4096), dtype=np.float32)).astype(gp.bfloat16)
    flat = gp.from_numpy(rng.standard_normal(2**26, dtype=np.float32)).astype(gp.bfloat16)
    wk = gp.from_numpy(rng.standard_normal((4096, 4096), dtype=np.float32)).astype(gp.bfloat16)
    v = gp.from_numpy(rng.standard_normal((1, 4096), dtype=np.float32)).astype(gp.bfloat16)
    for _ in range(3):
        gp.softmax(xb, axis=-1)
        gp.softmax(x32, axis=-1)
        gp.rmsnorm(n, w)
        gp.sum(flat)
        gp.exp(x32)
        gp.matmul(v, wk)
    gp.synchronize()


if __name__ == "__main__":
    main()
