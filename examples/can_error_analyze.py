"""Realtime analysis: one fixed instruction prefix applied to a stream of CAN-bus log lines. The
prefix is computed once and then comes from the prefix cache, so each call pays only for its line
and its answer; the per-call latency is printed.

    python examples/can_error_analyze.py
"""

from __future__ import annotations

import time

import sgjit

INSTRUCTIONS = (
    "You analyse CAN bus logs from a vehicle. Each line has the interface, the arbitration ID in hex, "
    "the data length in brackets and the data bytes; error frames carry the controller's error flags. "
    "For every line, name the most likely fault in a few words (for example: bus-off after repeated "
    "transmit errors, a missing termination resistor, a node flooding the bus, a stuck sensor value). "
    "If the line looks healthy, say 'healthy'."
)

LOG_LINES = [
    "can0  0C4   [8]  00 00 00 00 00 00 00 00",
    "can0  20000004   [8]  00 04 00 00 00 00 00 00   ERRORFRAME controller-problem{rx-error-warning}",
    "can0  20000040   [8]  00 00 00 00 00 00 00 00   ERRORFRAME bus-off",
    "can0  1A0   [8]  FF FF FF FF FF FF FF FF",
]


@sgjit.function
def analyze(s, line):
    s += sgjit.system(INSTRUCTIONS)
    s += sgjit.user("Log line: " + line)
    s += sgjit.assistant(sgjit.gen("analysis", max_tokens=16, stop="\n"))


def main(runtime: sgjit.Runtime | None = None) -> list[sgjit.ProgramState]:
    sgjit.set_default_backend(runtime or sgjit.Runtime())
    states = []
    for line in LOG_LINES:  # stands in for a live stream
        t0 = time.perf_counter()
        state = analyze.run(line=line, temperature=0)
        ms = (time.perf_counter() - t0) * 1000
        cached = state.get_meta_info("analysis")["cached_tokens"]
        print(f"{ms:7.1f} ms  cached={cached:4d}  {line[:40]:<40}  -> {state['analysis'].strip()}")
        states.append(state)
    return states


if __name__ == "__main__":
    main()
