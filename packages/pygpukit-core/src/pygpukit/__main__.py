"""Command line: ``python -m pygpukit info [--json]``."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pygpukit", description="pygpukit command line")
    sub = parser.add_subparsers(dest="command", required=True)
    info_parser = sub.add_parser("info", help="report backend, driver, devices, NVRTC, cuBLASLt and versions")
    info_parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)

    # "info" is the only command so far; argparse rejects anything else.
    from .core.backend import BackendFallbackWarning
    from .info import collect_info, format_info

    with warnings.catch_warnings():
        # The report states the backend and the reason itself.
        warnings.simplefilter("ignore", BackendFallbackWarning)
        report = collect_info()
    print(json.dumps(report, indent=2) if args.json else format_info(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
