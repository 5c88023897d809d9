"""The `sgjit` command: `generate`, `serve`, `bench`, `explain`. Subcommands import their modules only
when run, so `sgjit --help` stays quick."""

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
    sub.add_parser("serve", help="HTTP server: SGLang's /generate and the OpenAI API", add_help=False)
    sub.add_parser(
        "bench",
        help="benchmarks: latency, throughput, serving, program, kernels, jit, generate",
        add_help=False,
    )
    sub.add_parser(
        "explain", help="compile a prompt program and show its plan, kernels and reservation", add_help=False
    )
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    command, rest = argv[0], argv[1:]
    if command == "generate":
        from sgjit.generate import main as generate_main

        return generate_main(rest)
    if command == "serve":
        return serve_main(rest)
    if command == "bench":
        from sgjit.bench.__main__ import main as bench_main

        return bench_main(rest)
    if command == "explain":
        from sgjit.explain import main as explain_main

        return explain_main(rest)
    parser.parse_args(argv)  # reports the unknown command
    return 2


def serve_main(argv: list[str]) -> int:
    from sgjit.errors import SgjitError
    from sgjit.server.args import add_serve_arguments, server_args_from

    parser = argparse.ArgumentParser(
        prog="sgjit serve",
        description="Serve a model over HTTP: SGLang's /generate and the OpenAI API (/v1/chat/completions, "
        "/v1/completions, /v1/models), plus /health, /metrics and server info. With no --model it serves "
        "the bundled SmolLM2-135M-Instruct.",
    )
    add_serve_arguments(parser)
    ns = parser.parse_args(argv)
    try:
        args = server_args_from(ns)
        from sgjit.server.launch import serve

        return serve(args)
    except SgjitError as e:
        print(f"sgjit serve: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
