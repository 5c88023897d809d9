"""`python -m sgjit.bench.program`: prompt-program workloads, each with the JIT on and off and with
the prefix cache on and off, in one run: programs/s and per-program latency.

Workloads: few-shot classification with a long shared prefix and `select`; a fork of 4 branches
joined; JSON extraction under a schema; a two-turn chat; the log-analysis loop (one instruction
prefix, a stream of lines). Programs of a workload run `--concurrency` at a time (run_batch)."""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

from tqdm import tqdm

import sgjit
from sgjit.bench.report import add_model_args, add_output_args, environment, finish, model_arg

log = logging.getLogger(__name__)

LABELS = ["positive", "negative", "neutral"]
REVIEWS = ["Loved every minute of it.", "A waste of money and time.", "It was fine, nothing more.",
           "The best purchase I made this year.", "Broke after two days.", "Does what it says."]  # fmt: skip


def few_shot_prefix(target_tokens: int, encode: Callable[[str], list[int]]) -> str:
    shots, text = 0, ""
    while len(encode(text)) < target_tokens:
        r = REVIEWS[shots % len(REVIEWS)]
        text += f"Review #{shots}: {r}\nSentiment: {LABELS[shots % 3]}\n\n"
        shots += 1
    return text


def workloads(prefix: str) -> dict[str, tuple[Any, list[dict[str, Any]]]]:
    @sgjit.function
    def few_shot_select(s, review):
        s += prefix + "Review: " + review + "\nSentiment: "
        s += sgjit.select("label", choices=LABELS)

    @sgjit.function
    def fork_join(s, topic):
        s += "Give one short fact about " + topic + ".\n"
        forks = s.fork(4)
        forks += [sgjit.gen("fact", max_tokens=8, temperature=0, stop="\n")] * 4
        forks.join()

    @sgjit.function
    def json_extract(s, text):
        s += "Extract the person as JSON.\nText: " + text + "\nJSON: "
        s += sgjit.gen("person", max_tokens=48, temperature=0, json_schema={
            "type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                             "age": {"type": "integer"}}, "required": ["name", "age"]})  # fmt: skip

    @sgjit.function
    def chat(s, question):
        s += sgjit.system("You answer in one short sentence.")
        s += sgjit.user(question)
        s += sgjit.assistant(sgjit.gen("a1", max_tokens=12, temperature=0))
        s += sgjit.user("Now say it in five words.")
        s += sgjit.assistant(sgjit.gen("a2", max_tokens=8, temperature=0))

    @sgjit.function
    def log_analysis(s, line):
        s += sgjit.system("You analyse CAN bus log lines; name the most likely fault in a few words, "
                          "or say 'healthy'. " * 4)  # fmt: skip
        s += sgjit.user("Log line: " + line)
        s += sgjit.assistant(sgjit.gen("analysis", max_tokens=10, temperature=0, stop="\n"))

    lines = ["can0 0C4 [8] 00 00 00 00", "can0 20000040 [8] ERRORFRAME bus-off", "can0 1A0 [8] FF FF FF FF"]
    people = ["Ada Lovelace, 36, wrote the first program.", "Alan Turing was 41.", "Grace Hopper, aged 85."]
    topics = ["owls", "glaciers", "jazz"]
    return {
        "few_shot_select": (few_shot_select, [{"review": r} for r in REVIEWS]),
        "fork_join": (fork_join, [{"topic": t} for t in topics]),
        "json_extract": (json_extract, [{"text": t} for t in people]),
        "chat": (chat, [{"question": q} for q in ["What is the sun?", "Why is the sea salty?"]]),
        "log_analysis": (log_analysis, [{"line": x} for x in lines]),
    }


def measure(fn, items: list[dict[str, Any]], rt, repeat: int, concurrency: int) -> tuple[float, float]:
    """(programs/s, median per-program latency in ms) over `repeat` rounds of all items."""
    fn.run_batch(items, backend=rt, num_threads=concurrency)  # warm-up (compiles with the JIT on)
    latencies, t0, n = [], time.perf_counter(), 0
    for _ in range(repeat):
        for i in range(0, len(items), concurrency):
            chunk = items[i : i + concurrency]
            t = time.perf_counter()
            fn.run_batch(chunk, backend=rt, num_threads=concurrency)
            latencies.append((time.perf_counter() - t) * 1000)
            n += len(chunk)
        if not rt.config.enable_prefix_cache:
            rt.flush_cache()
    return n / (time.perf_counter() - t0), statistics.median(latencies)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m sgjit.bench.program", description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument("--device", default="auto")
    p.add_argument("--prefix-tokens", type=int, default=1024, help="shared prefix of the few-shot workload")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument(
        "--max-total-tokens", type=int, default=None,
        help="KV pool of each of the four runtimes (on a GPU set it so four copies of the model fit)",
    )  # fmt: skip
    p.add_argument("--workloads", nargs="+", default=None)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, for tests")
    add_output_args(p)
    args = p.parse_args(argv)
    if args.smoke:
        args.prefix_tokens, args.repeat = 64, 1
    rows = []
    configs = [(jit, cache) for jit in (True, False) for cache in (True, False)]
    runtimes = {c: sgjit.Runtime(model_arg(args), device=args.device, enable_jit=c[0], enable_prefix_cache=c[1],
                                max_total_tokens=args.max_total_tokens)
                for c in configs}  # fmt: skip
    try:
        any_rt = runtimes[configs[0]]
        prefix = few_shot_prefix(args.prefix_tokens, lambda t: any_rt.tokenizer.encode(t))
        chosen = workloads(prefix)
        names = args.workloads or list(chosen)
        for name in tqdm(names, desc="workloads", leave=False):
            fn, items = chosen[name]
            if args.smoke:
                items = items[:2]
            for (jit, cache), rt in runtimes.items():
                rate, latency = measure(fn, items, rt, args.repeat, args.concurrency)
                rows.append({"workload": name, "jit": jit, "prefix_cache": cache,
                             "programs_s": rate, "latency_ms_p50": latency})  # fmt: skip
        for name in names:
            ref = next(r for r in rows if r["workload"] == name and r["jit"] and not r["prefix_cache"])
            for r in rows:
                if r["workload"] == name:
                    r["vs_no_prefix_cache"] = r["programs_s"] / ref["programs_s"]
    finally:
        for rt in runtimes.values():
            rt.shutdown()
    result = {"benchmark": "program", "model": any_rt.model_config.name, "device": str(any_rt.device),
              "prefix_tokens": args.prefix_tokens, "environment": environment(), "rows": rows}  # fmt: skip
    columns = ["workload", "jit", "prefix_cache", "programs_s", "latency_ms_p50", "vs_no_prefix_cache"]
    return finish(args, result, rows, columns)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
