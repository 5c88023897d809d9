"""`python -m sgjit.bench <name> [args]`: run one benchmark by name."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = {
    "generate": "sgjit.bench.generate",
    "throughput": "sgjit.bench.throughput",
    "latency": "sgjit.bench.latency",
    "serving": "sgjit.bench.serving",
    "program": "sgjit.bench.program",
    "kernels": "sgjit.bench.kernels",
    "jit": "sgjit.bench.jit",
    "http_overhead": "sgjit.bench.http_overhead",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in BENCHMARKS:
        print(f"usage: python -m sgjit.bench {{{','.join(BENCHMARKS)}}} [options]", file=sys.stderr)
        return 2
    importlib.import_module(BENCHMARKS[argv[0]]).main(argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
