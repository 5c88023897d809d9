"""`ProgramExecutor`: runs the nodes of one program sequence, in order, on its own worker thread.

Both ways of running a program end here: the interpreter (the Python function appending nodes as it
runs) and the plan executor (walking a `GraphPlan`). Appending returns at once; reading a variable
waits for the steps before it. So `s.fork(n)` branches filled one after another in Python still run
at the same time, and their requests batch in the engine.

Token boundaries: before each gen or select the program's whole text so far is tokenized afresh, so
the model always reads exactly the tokens of the concatenated text, never a join of separately
tokenized pieces. The part computed before costs nothing: the sequence keeps its pages resident and
the radix cache matches them."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from sgjit.compiler.chat import STATIC_NODES, ChatTranscript, static_text
from sgjit.compiler.nodes import Gen, Node, Select, VarScopeBegin, VarScopeEnd
from sgjit.errors import ProgramError
from sgjit.lang.backend import Backend, ProgramSequence
from sgjit.lang.choices import METHODS
from sgjit.lang.defaults import RunDefaults
from sgjit.lang.stream import EventLog
from sgjit.nvtx import nvtx_range

log = logging.getLogger(__name__)

_END = object()


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class ProgramExecutor:
    def __init__(
        self,
        backend: Backend,
        defaults: RunDefaults,
        sequence: ProgramSequence,
        *,
        text: str = "",
        chat: ChatTranscript | None = None,
        variables: dict[str, Any] | None = None,
        meta_info: dict[str, Any] | None = None,
        events: EventLog | None = None,
        encoder: Callable[[str, bool], list[int] | None] | None = None,
    ) -> None:
        """`encoder` (a compiled plan's) tokenizes a step reusing the constant prefix's tokens, or
        returns None to have the whole text tokenized."""
        self.backend = backend
        self.encoder = encoder
        self.defaults = defaults
        self.sequence = sequence
        self.text = text
        self.fork_start = len(text)  # where a branch's own text begins
        self.chat = chat or ChatTranscript()
        self.variables: dict[str, Any] = dict(variables or {})
        self.meta_info: dict[str, Any] = dict(meta_info or {})
        self.inherited = set(self.variables)  # a branch's names from its parent, not gathered at join
        self.events = events
        self._scope_starts: dict[str, int] = {}
        self._children: list[ProgramExecutor] = []
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._cond = threading.Condition()
        self._submitted = 0
        self._done = 0
        self._error: BaseException | None = None
        self._closed = False
        self._discard = False
        self._worker = threading.Thread(target=self._work, name="sgjit-program", daemon=True)
        self._worker.start()

    # ----- called by the program (any thread but the worker) -----
    def append(self, node: Node) -> None:
        self._enqueue(partial(self._apply, node))

    def fork(self, n: int) -> list[ProgramExecutor]:
        """n branches continuing from everything appended so far."""
        self.sync()
        if n > 1 and self.text:
            self.sequence.prefill(self._encode(self.text))  # computed once, then shared by every branch
        children = [
            ProgramExecutor(
                self.backend,
                self.defaults,
                self.sequence.fork(),
                text=self.text,
                chat=self.chat.copy(),
                variables=self.variables,
                meta_info=self.meta_info,
                encoder=self.encoder,
            )
            for _ in range(n)
        ]
        self._children.extend(children)
        return children

    def join(self, children: list[ProgramExecutor], mode: str) -> None:
        self._enqueue(partial(self._join, children, mode))

    def sync(self) -> None:
        """Wait for every step appended so far; raise the first error a step hit."""
        with self._cond:
            target = self._submitted
            self._cond.wait_for(lambda: self._done >= target)
        if self._error is not None:
            raise self._error

    def read_var(self, name: str) -> Any:
        self.sync()
        if name not in self.variables:
            raise ProgramError(f"the program has no variable {name!r}; it has {sorted(self.variables)}")
        return self.variables[name]

    def read_meta(self, name: str) -> Any:
        self.read_var(name)
        return self.meta_info.get(name)

    def read_variables(self) -> dict[str, Any]:
        self.sync()
        return dict(self.variables)

    def write_var(self, name: str, value: Any) -> None:
        self.sync()
        self.variables[name] = value
        self.meta_info.setdefault(name, None)

    def read_text(self) -> str:
        self.sync()
        return self.text

    def read_messages(self) -> list[dict[str, str]]:
        self.sync()
        return self.chat.snapshot(self.text)

    def close(self, discard: bool = False) -> None:
        """Run what is queued (skip it with `discard`, when the program failed), stop the worker, and
        release this sequence and its branches' pages. Errors stay for `sync` to raise."""
        if self._closed:
            return
        self._closed = True
        self._discard = discard
        self._queue.put(_END)
        self._worker.join()
        for child in self._children:
            child.close(discard)
        self.sequence.close()

    # ----- worker thread -----
    def _enqueue(self, op: Callable[[], None]) -> None:
        if self._closed:
            raise ProgramError("this program (or fork) has finished; start a new run to add to it")
        with self._cond:
            self._submitted += 1
        self._queue.put(op)

    def _work(self) -> None:
        while (op := self._queue.get()) is not _END:
            if self._error is None and not self._discard:
                try:
                    op()
                except BaseException as e:  # noqa: BLE001 - raised to the program by sync()
                    log.debug("program step failed: %s", e)
                    self._error = e
            with self._cond:
                self._done += 1
                self._cond.notify_all()

    def _apply(self, node: Node) -> None:
        with nvtx_range(f"plan node {node.kind} {getattr(node, 'name', '') or ''}"):
            self._apply_node(node)

    def _apply_node(self, node: Node) -> None:
        if isinstance(node, STATIC_NODES):
            self._append(static_text(node, self.chat, self._render, self.text))
        elif isinstance(node, Gen):
            self._gen(node)
        elif isinstance(node, Select):
            self._select(node)
        elif isinstance(node, VarScopeBegin):
            self._scope_starts[node.name] = len(self.text)
        elif isinstance(node, VarScopeEnd):
            self._set(node.name, self.text[self._scope_starts.pop(node.name) :], {})
        else:
            raise ProgramError(f"a {node.kind} node cannot run as a step (arguments are bound first)")

    def _append(self, text: str, var_name: str | None = None) -> None:
        self.text += text
        if self.events is not None and text:
            self.events.put(var_name, text)

    def _set(self, name: str | None, value: Any, meta: Any) -> None:
        if name is not None:
            self.variables[name] = value
            self.meta_info[name] = meta

    def _render(self, messages: list[dict[str, str]]) -> str:
        return self.backend.apply_chat_template(messages, add_generation_prompt=False)

    def _encode(self, text: str) -> list[int]:
        # Chat-template text carries its own BOS where the model wants one.
        add_special = not self.chat.used
        if self.encoder is not None and (ids := self.encoder(text, add_special)) is not None:
            return ids
        return self.backend.encode(text, add_special_tokens=add_special)

    def _gen(self, node: Gen) -> None:
        events = self.events
        on_text = None if events is None else (lambda piece, meta: events.put(node.name, piece, meta))
        out = self.sequence.generate(self.defaults.step_for(node, self._encode(self.text)), on_text)
        self.text += out.text  # already streamed piece by piece
        self._set(node.name, out.text, out.meta_info)

    def _select(self, node: Select) -> None:
        method = METHODS[node.choices_method]
        prefix = self._encode(self.text)
        if not prefix:
            raise ProgramError(f"select({node.name!r}) needs text before it to score its choices against")
        prompts = [self._encode(self.text + choice) for choice in node.choices]
        # A choice may merge with the prefix's last tokens; score from where its tokens part ways.
        starts = [max(1, _common_prefix(prefix, ids)) for ids in prompts]
        self.sequence.prefill(prefix)
        entries = self.sequence.score(prompts, starts)
        logprobs = [[e[0] for e in es] for es in entries]
        unconditional = None
        if method.needs_unconditional:
            context = self.backend.unconditional_prefix()
            tails = [context + ids[s:] for ids, s in zip(prompts, starts)]
            unconditional = [
                [e[0] for e in es] for es in self.sequence.score(tails, [len(context)] * len(tails))
            ]
        best, scores = method.decide(logprobs, unconditional, node.temperature)
        meta: dict[str, Any] = {
            "choices": list(node.choices),
            "selected": best,
            "scores": scores,
            "token_logprobs": logprobs,
            "choices_method": method.name,
            # SGLang's keys: each choice's mean logprob, its token entries, and no output tokens
            "normalized_prompt_logprobs": [sum(lp) / len(lp) for lp in logprobs],
            "input_token_logprobs": entries,
            "output_token_logprobs": [[] for _ in entries],
        }
        if unconditional is not None:
            meta["unconditional_token_logprobs"] = unconditional
        self._append(node.choices[best], node.name)
        self._set(node.name, node.choices[best], meta)

    def _join(self, children: list[ProgramExecutor], mode: str) -> None:
        for child in children:
            child.sync()
        if mode == "gather_variable":
            names = dict.fromkeys(n for c in children for n in c.variables if n not in c.inherited)
            for name in names:
                self.variables[name] = [c.variables.get(name) for c in children]
                self.meta_info[name] = [c.meta_info.get(name) for c in children]
        else:  # concate_and_append
            for child in children:
                self._append(child.text[child.fork_start :])
        for child in children:
            child.close()
