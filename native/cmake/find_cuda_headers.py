"""Print the include directory of the CUDA headers from the pip runtime wheel for one CUDA major.

CUDA 13 wheels put every header in nvidia/cu13/include; CUDA 12 wheels in nvidia/cuda_runtime/include.
An explicit PYGPUKIT_CUDA_INCLUDE_DIR wins. Exits 1 with a message when nothing is found.
"""

import os
import sys
from pathlib import Path

major = sys.argv[1]
explicit = os.environ.get(f"PYGPUKIT_CUDA{major}_INCLUDE_DIR") or os.environ.get("PYGPUKIT_CUDA_INCLUDE_DIR")
candidates = [Path(explicit)] if explicit else []
relative = Path("nvidia", "cu13", "include") if major == "13" else Path("nvidia", "cuda_runtime", "include")
candidates += [Path(entry) / relative for entry in sys.path if entry]
for candidate in candidates:
    header = candidate / "cuda.h"
    if header.is_file():
        text = header.read_text(errors="replace")
        if f"#define CUDA_VERSION {major}" in text:
            print(candidate.resolve())
            sys.exit(0)
sys.stderr.write(
    f"CUDA {major} headers (cuda.h) not found; the build needs the nvidia-cuda-runtime wheel for CUDA {major} "
    f"or PYGPUKIT_CUDA{major}_INCLUDE_DIR. Looked in:\n  " + "\n  ".join(str(c) for c in candidates) + "\n"
)
sys.exit(1)
