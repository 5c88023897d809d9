"""The `sgjit` command: `sgjit generate`, and the subcommands later issues add (serve, bench, explain)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="sgjit", description="sgjit: a JIT-compiling runtime for prompt programs."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser(
        "generate", help="one-shot completion of a prompt (python -m sgjit.generate)", add_help=False
    )
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    command, rest = argv[0], argv[1:]
    if command == "generate":
        from sgjit.generate import main as generate_main

        return generate_main(rest)
    parser.parse_args(argv)  # reports the unknown command
    return 2


if __name__ == "__main__":
    sys.exit(main())
