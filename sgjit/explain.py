"""`sgjit explain module:function`: trace a prompt program, compile it for a runtime, and print the
plan, the kernels chosen with their reasons, the decode-graph buckets and the memory reservation."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from sgjit.errors import SgjitError


def load_function(target: str):
    """`pkg.module:function` or `path/to/file.py:function`."""
    module_name, _, func_name = target.partition(":")
    if not func_name:
        raise SgjitError(
            f"give the program as module:function (e.g. examples.code_complete:code_complete), not {target!r}"
        )
    if module_name.endswith(".py"):
        path = Path(module_name).resolve()
        sys.path.insert(0, str(path.parent))
        module_name = path.stem
    else:
        sys.path.insert(0, str(Path.cwd()))
    module = importlib.import_module(module_name)
    fn = getattr(module, func_name, None)
    if fn is None or not hasattr(fn, "explain"):
        raise SgjitError(f"{target!r} is not an @sgjit.function")
    return fn


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="sgjit explain", description=__doc__.split("\n\n")[0])
    p.add_argument("target", help="module:function or file.py:function")
    p.add_argument("--model", default=None)
    p.add_argument("--device", default="auto")
    args = p.parse_args(argv)
    from sgjit.runtime.runtime import Runtime

    try:
        fn = load_function(args.target)
        rt = Runtime(args.model, device=args.device, enable_jit=True)
        try:
            print(fn.explain(backend=rt))
        finally:
            rt.shutdown()
    except SgjitError as e:
        print(f"sgjit explain: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
