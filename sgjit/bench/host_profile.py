"""`python -m sgjit.bench.host_profile`: where the engine thread's time per decode step goes. A
greedy generation of --output-len tokens a row at each --batch-size runs three times: the first warms
and captures (on the CPU the bucketed decode path runs eagerly: the GPU's path without graphs); the
second times the phases of each multi-step launch with plain clocks (schedule, load the graph's
inputs, replay, complete less its wait for the device, queue the hand-out) and gives the engine's
`host_us_per_step` (what bench.latency reports); during the third, cProfile records the engine
thread inside its launch and completion methods (`Engine._launch_multi`, `_launch_rows`,
`_complete`), and each multi-step graph replay's host time is taken alone. Prints those figures and
the profile's top functions by own and by cumulative time.

cProfile slows Python several-fold and times wall clock: a function that releases the GIL (an
event wait, a numpy fill) and gets it back late, because the output thread holds it, is charged for
the wait. Read the profile for where the time goes, and take figures from bench.latency."""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from pathlib import Path
from typing import Any

from sgjit.bench.report import add_model_args, model_arg

ENGINE_METHODS = ("_launch_multi", "_launch_rows", "_complete")
# (part of the engine, method): the phases of a multi-step launch, timed in the second generation
# (`_launch_multi` holds the three after it)
PHASES = (
    ("engine", "_launch_multi"), ("scheduler", "schedule_decode_ahead"), ("graphs", "_load"),
    ("graphs", "_execute"), ("engine", "_complete"), ("output", "deliver"),
)  # fmt: skip


def _time_phases(rt, seconds: dict[str, float]) -> None:
    """Wrap the PHASES methods of `rt`'s engine to add their wall time to `seconds` (`_complete` less
    its wait for the device)."""
    engine = rt.engine
    parts = {
        "engine": engine,
        "scheduler": engine.scheduler,
        "graphs": engine.runner.graphs,
        "output": engine.output,
    }
    for part, name in PHASES:
        obj = parts[part]
        if obj is None:
            continue
        key, method = f"{part}.{name}", getattr(obj, name)
        seconds.setdefault(key, 0.0)

        def timed(*args: Any, _method=method, _key=key, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return _method(*args, **kwargs)
            finally:
                waited = args[0].readback.wait_seconds if _key == "engine._complete" else 0.0
                seconds[_key] += time.perf_counter() - t - waited

        setattr(obj, name, timed)


def _profile_engine(rt, prof: cProfile.Profile) -> None:
    """Profile the engine's launch and completion methods (they run on the engine thread)."""
    for name in ENGINE_METHODS:
        method = getattr(rt.engine, name)

        def profiled(*args: Any, _method=method, **kwargs: Any) -> Any:
            prof.enable()
            try:
                return _method(*args, **kwargs)
            finally:
                prof.disable()

        setattr(rt.engine, name, profiled)


def _time_replays(rt, seconds: list[float]) -> None:
    """Host time of each multi-step graph launch (load excluded: the replay call alone)."""
    graphs = rt.engine.runner.graphs
    if graphs is None:
        return
    execute = graphs._execute

    def timed(bs: int, ctx: int, steps: int, sampled: bool = False) -> None:
        t = time.perf_counter()
        execute(bs, ctx, steps, sampled)
        if steps > 1:
            seconds.append(time.perf_counter() - t)

    graphs._execute = timed


def run_one(
    model: str | None, device: str, bs: int, input_len: int, output_len: int, top: int
) -> dict[str, Any]:
    from sgjit.runtime.runtime import Runtime

    rt = Runtime(
        model, device=device, enable_jit=True, max_total_tokens=bs * (input_len + output_len + 32),
        enable_prefix_cache=False, bucketed_decode=True if device == "cpu" else None,
    )  # fmt: skip
    try:
        prompts = [[100 + i] * input_len for i in range(bs)]
        params = {"temperature": 0, "max_new_tokens": output_len, "ignore_eos": True}
        rt.generate(input_ids=prompts, sampling_params=params)  # warm: compile, capture
        phases: dict[str, float] = {}
        _time_phases(rt, phases)
        before = rt.stats()
        rt.generate(input_ids=prompts, sampling_params=params)
        after, timed = rt.stats(), dict(phases)
        prof, replays = cProfile.Profile(), []
        _profile_engine(rt, prof)
        _time_replays(rt, replays)
        rt.generate(input_ids=prompts, sampling_params=params)
    finally:
        rt.shutdown()
    launches = after["multi_step_launches"] - before["multi_step_launches"]
    steps = launches * rt.config.multi_step
    host = (after["multi_step_host_us"] - before["multi_step_host_us"]) / steps if steps else None
    per_launch = {k: round(v / launches * 1e6, 1) for k, v in timed.items()} if launches else {}
    replays.sort()
    listing = {}
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(key).print_stats(top)
        listing[key] = s.getvalue()
    return {
        "batch": bs, "multi_step_launches": launches, "host_us_per_step": host, "phases_us_per_launch": per_launch,
        "replay_host_us_median": replays[len(replays) // 2] * 1e6 if replays else None,
        "profile_by_own_time": listing["tottime"], "profile_by_cumulative_time": listing["cumulative"],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(
        prog="python -m sgjit.bench.host_profile", description=__doc__.split("\n\n")[0]
    )
    add_model_args(p)
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch-size", type=int, nargs="+", default=[1, 32])
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=129)
    p.add_argument("--top", type=int, default=30, help="functions listed in each profile")
    p.add_argument("--out", default=None, help="write the result as JSON here")
    args = p.parse_args(argv)
    result = {"benchmark": "host_profile", "model": model_arg(args), "device": args.device, "rows": []}
    for bs in args.batch_size:
        row = run_one(model_arg(args), args.device, bs, args.input_len, args.output_len, args.top)
        result["rows"].append(row)
        print(
            f"batch {bs}: {row['multi_step_launches']} multi-step launches, host {row['host_us_per_step']} us a "
            f"step, a multi-step replay call {row['replay_host_us_median']} us\n"
            f"phases, us a launch: {row['phases_us_per_launch']}\n"
            f"{row['profile_by_own_time']}\n{row['profile_by_cumulative_time']}"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
