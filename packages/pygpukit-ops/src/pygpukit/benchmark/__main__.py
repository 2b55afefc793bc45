"""``python -m pygpukit.benchmark``: see the package docstring."""

from __future__ import annotations

import sys

from ._runner import main

if __name__ == "__main__":
    sys.exit(main())
