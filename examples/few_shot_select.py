"""Few-shot classification with `select`: the model scores each label after a few examples and the
review, all labels in one batched forward pass. A batch of reviews runs concurrently.

    python examples/few_shot_select.py
"""

from __future__ import annotations

import sgjit

LABELS = ["positive", "negative"]

EXAMPLES = (
    "Review: The food was wonderful and the staff were friendly.\nSentiment: positive\n\n"
    "Review: Cold soup, rude waiter, never again.\nSentiment: negative\n\n"
    "Review: Lovely view and great coffee.\nSentiment: positive\n\n"
)


@sgjit.function
def classify(s, review):
    s += EXAMPLES
    s += "Review: " + review + "\nSentiment: "
    s += sgjit.select("label", choices=LABELS)


def main(runtime: sgjit.Runtime | None = None) -> list[sgjit.ProgramState]:
    sgjit.set_default_backend(runtime or sgjit.Runtime())
    reviews = [
        "Terrible service and the pasta was burnt.",
        "Absolutely delicious, I will come back!",
        "The dessert was amazing.",
    ]
    states = classify.run_batch([{"review": r} for r in reviews])
    for review, state in zip(reviews, states):
        print(f"{state['label']:<9} {review}")
    return states


if __name__ == "__main__":
    main()
