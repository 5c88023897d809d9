"""How `select()` decides among its choices from the token logprobs of each choice after the
program's text. Each method is a named object (`sgjit.token_length_normalized`, ...); a plan stores
the name."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from sgjit.compiler.nodes import CHOICES_METHODS


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _argmax(scores: list[float]) -> int:
    return max(range(len(scores)), key=lambda i: (scores[i], -i))  # first of equals


def _length_normalized(logprobs: list[list[float]], _: list[list[float]] | None) -> tuple[int, list[float]]:
    scores = [_mean(lp) for lp in logprobs]
    return _argmax(scores), scores


def _greedy(logprobs: list[list[float]], _: list[list[float]] | None) -> tuple[int, list[float]]:
    """The choice greedy decoding would pick: compare token by token and keep the best at each
    position (a shorter choice counts its mean beyond its end)."""
    width = max(len(lp) for lp in logprobs)
    rows = [lp + [_mean(lp)] * (width - len(lp)) for lp in logprobs]
    alive = list(range(len(rows)))
    for j in range(width):
        best = max(rows[i][j] for i in alive)
        alive = [i for i in alive if rows[i][j] == best]
        if len(alive) == 1:
            break
    return alive[0], [_mean(lp) for lp in logprobs]


def _unconditional_normalized(
    logprobs: list[list[float]], unconditional: list[list[float]] | None
) -> tuple[int, list[float]]:
    """Mean over the choice's tokens of log p(token | program) - log p(token | no context): a choice
    that is merely common text does not win by being common."""
    assert unconditional is not None
    scores = [_mean([c - u for c, u in zip(lp, ulp)]) for lp, ulp in zip(logprobs, unconditional)]
    return _argmax(scores), scores


@dataclass(frozen=True, slots=True)
class ChoicesMethod:
    name: str
    needs_unconditional: bool
    rule: Callable[[list[list[float]], list[list[float]] | None], tuple[int, list[float]]]

    def decide(
        self,
        logprobs: list[list[float]],
        unconditional: list[list[float]] | None = None,
        temperature: float = 0.0,
    ) -> tuple[int, list[float]]:
        """The chosen index and each choice's score. With temperature > 0 the choice is drawn with
        probability softmax(score / temperature) instead."""
        best, scores = self.rule(logprobs, unconditional)
        if temperature <= 0.0:
            return best, scores
        top = max(scores)
        weights = [math.exp((s - top) / temperature) for s in scores]
        return random.choices(range(len(scores)), weights)[0], scores


token_length_normalized = ChoicesMethod("token_length_normalized", False, _length_normalized)
greedy_token_selection = ChoicesMethod("greedy_token_selection", False, _greedy)
unconditional_likelihood_normalized = ChoicesMethod(
    "unconditional_likelihood_normalized", True, _unconditional_normalized
)

METHODS = {
    m.name: m for m in (token_length_normalized, greedy_token_selection, unconditional_likelihood_normalized)
}
assert tuple(METHODS) == CHOICES_METHODS
