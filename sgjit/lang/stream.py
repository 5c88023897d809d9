"""`EventLog`: the text a streaming run produces, piece by piece, for `ProgramState.text_iter` and
`text_async_iter`. Every piece is kept, so an iterator started late (or a second one) still sees the
whole text. A gen's pieces carry SGLang's meta info of their chunk (token counts, and incremental
output logprobs when the gen returns them)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

Piece = tuple[str | None, str, dict[str, Any] | None]  # (variable being generated or None, text, meta)


class EventLog:
    def __init__(self) -> None:
        self._pieces: list[Piece] = []
        self._cond = threading.Condition()
        self._closed = False
        self._error: BaseException | None = None

    def put(self, var_name: str | None, text: str, meta: dict[str, Any] | None = None) -> None:
        with self._cond:
            self._pieces.append((var_name, text, meta))
            self._cond.notify_all()

    def close(self, error: BaseException | None = None) -> None:
        with self._cond:
            self._closed, self._error = True, error
            self._cond.notify_all()

    def iter(self, var_name: str | None = None) -> Iterator[tuple[str, dict[str, Any] | None]]:
        """(text, meta) as they come (only those of `var_name` when given); raises the run's error
        at the end."""
        seen = 0
        while True:
            with self._cond:
                while seen == len(self._pieces) and not self._closed:
                    self._cond.wait()
                batch, closed, error = self._pieces[seen:], self._closed, self._error
                seen += len(batch)
            for name, text, meta in batch:
                if var_name is None or name == var_name:
                    yield text, meta
            if closed:
                if error is not None:
                    raise error
                return
