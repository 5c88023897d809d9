"""A two-turn chat: each answer stays in the conversation (and in the KV cache) for the next turn.

python examples/chat_multi_turn.py
"""

from __future__ import annotations

import sgjit


@sgjit.function
def chat(s, first, second):
    s += sgjit.system("You are a helpful assistant. Answer in one short sentence.")
    s += sgjit.user(first)
    s += sgjit.assistant(sgjit.gen("answer1", max_tokens=24))
    with s.user():
        s += second
    with s.assistant():
        s += sgjit.gen("answer2", max_tokens=24)


def main(runtime: sgjit.Runtime | None = None) -> sgjit.ProgramState:
    sgjit.set_default_backend(runtime or sgjit.Runtime())
    state = chat.run(first="What is the capital of France?", second="And of Italy?", temperature=0)
    for message in state.messages():
        print(f"{message['role']:>9}: {message['content']}")
    return state


if __name__ == "__main__":
    main()
