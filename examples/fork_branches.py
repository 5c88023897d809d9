"""Parallel branches: the program forks after a shared prefix (computed once, its KV pages shared),
each branch expands one tip, and the join gathers the branches' answers as a list.

    python examples/fork_branches.py
"""

from __future__ import annotations

import sgjit


@sgjit.function
def tips(s, topic):
    s += "Here are two tips about " + topic + ": 1. Plan ahead. 2. Take breaks.\n"
    forks = s.fork(2)
    forks += lambda i: f"Tip {i + 1}, explained in one sentence:"
    forks += sgjit.gen("detail", max_tokens=20, stop="\n")
    forks.join()


def main(runtime: sgjit.Runtime | None = None) -> sgjit.ProgramState:
    sgjit.set_default_backend(runtime or sgjit.Runtime())
    state = tips.run(topic="studying", temperature=0)
    for i, detail in enumerate(state["detail"]):
        print(f"tip {i + 1}:{detail}")
    return state


if __name__ == "__main__":
    main()
