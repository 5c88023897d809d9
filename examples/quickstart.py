"""Quickstart: a prompt program with a system prompt, a question and a generated answer.

python examples/quickstart.py
"""

from __future__ import annotations

import sgjit


@sgjit.function
def answer(s, question):
    s += sgjit.system("You are a concise assistant.")
    s += sgjit.user(question)
    s += sgjit.assistant(sgjit.gen("answer", max_tokens=24))


def main(runtime: sgjit.Runtime | None = None) -> sgjit.ProgramState:
    sgjit.set_default_backend(runtime or sgjit.Runtime())
    state = answer.run(question="What is the capital of France?", temperature=0)
    print(state["answer"])
    print(answer.trace().dump())  # the static plan the program traced into
    return state


if __name__ == "__main__":
    main()
