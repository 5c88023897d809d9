"""`Expr`: a piece of a prompt program before it is appended to a state. `gen()`, `select()` and the
roles return one; `+` concatenates them with text (`"Q: " + question + sgjit.gen("a")`), so a program
reads as in SGLang and stays one static sequence of nodes the tracer can record."""

from __future__ import annotations

from typing import Any, NoReturn

from sgjit.compiler.nodes import ConstText, Node
from sgjit.errors import ProgramError

_NOT_TEXT = (
    "a gen/select/role expression is a program step, not text; append it to the program state "
    "(s += ...) inside an @sgjit.function"
)


class Expr:
    __slots__ = ("nodes",)

    def __init__(self, nodes: tuple[Node, ...]) -> None:
        self.nodes = nodes

    def __add__(self, other: Any) -> Expr:
        return Expr(self.nodes + as_nodes(other))

    def __radd__(self, other: Any) -> Expr:
        return Expr(as_nodes(other) + self.nodes)

    def as_param(self, what: str) -> NoReturn:
        """Called when the expression is given where a plain value belongs (a gen parameter)."""
        raise ProgramError(f"{what} must be a plain value, not a program expression")

    def _not_text(self, *_: Any) -> NoReturn:
        raise ProgramError(_NOT_TEXT)

    __str__ = __bool__ = __format__ = _not_text

    def __repr__(self) -> str:
        return f"Expr({self.nodes!r})"


def as_nodes(item: Any) -> tuple[Node, ...]:
    """The nodes of what `s += item` may take: text, an expression, or a list of them."""
    if isinstance(item, str):
        return (ConstText(item),) if item else ()
    if isinstance(item, Expr):
        return item.nodes
    if isinstance(item, (list, tuple)):
        return tuple(n for part in item for n in as_nodes(part))
    raise ProgramError(
        f"cannot add a {type(item).__name__} to a program; add text (str), sgjit expressions "
        "(gen, select, roles), or a list of them"
    )


def plain(value: Any, what: str) -> Any:
    """`value` unchanged if it holds no expression (lists are searched); else the expression's error."""
    if isinstance(value, Expr):
        value.as_param(what)
    if isinstance(value, (list, tuple)):
        for item in value:
            plain(item, what)
    return value
