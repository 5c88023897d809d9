"""Structured extraction: a gen constrained by a JSON schema always yields JSON that parses and fits.

python examples/json_extract.py
"""

from __future__ import annotations

import json

import sgjit

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer"},
        "city": {"type": "string", "maxLength": 20},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


@sgjit.function
def extract(s, text):
    s += sgjit.user("Extract the person's name, age and city as JSON.\nText: " + text)
    s += sgjit.assistant(sgjit.gen("person", json_schema=PERSON, max_tokens=48))


def main(runtime: sgjit.Runtime | None = None) -> dict:
    sgjit.set_default_backend(runtime or sgjit.Runtime())
    state = extract.run(text="Alice is 30 years old and lives in Paris.", temperature=0)
    person = json.loads(state["person"])
    print(person)
    return person


if __name__ == "__main__":
    main()
