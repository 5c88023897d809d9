"""Code completion: the model continues a function and stops at the closing code fence.

python examples/code_complete.py
"""

from __future__ import annotations

import sgjit


@sgjit.function
def code_complete(s, prompt):
    s += sgjit.system("You are a Python expert. Answer with code only.")
    s += sgjit.user("Complete this function:\n```python\n" + prompt + "\n```")
    s += sgjit.assistant("```python\n" + prompt + sgjit.gen("code", max_tokens=32, stop="```"))


def main(runtime: sgjit.Runtime | None = None) -> sgjit.ProgramState:
    sgjit.set_default_backend(runtime or sgjit.Runtime())
    prompt = "def fib(n):"
    state = code_complete.run(prompt=prompt, temperature=0)
    print(prompt + state["code"])
    print("finish:", state.get_meta_info("code")["finish_reason"])
    return state


if __name__ == "__main__":
    main()
