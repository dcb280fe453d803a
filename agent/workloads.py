"""What an agent's model is asked, as text to decode: `kog bench --drafts` and bench/lookup_acceptance.py time
the decode of these replies. Three copy their context as an agent's replies do (a file rewritten with a change,
tests of a class, an agent's fix of a failing test); two copy little (free prose, an explanation), where a draft
copied from the context seldom holds."""

from __future__ import annotations

from agent import prompts

CODE = '''import json
from pathlib import Path


class Inventory:
    """Items and their counts, saved as JSON."""

    def __init__(self, path):
        self.path = Path(path)
        self.items = {}
        if self.path.exists():
            self.items = json.loads(self.path.read_text())

    def add(self, name, count=1):
        if count <= 0:
            raise ValueError("count must be positive")
        self.items[name] = self.items.get(name, 0) + count

    def remove(self, name, count=1):
        have = self.items.get(name, 0)
        if count > have:
            raise ValueError(f"only {have} of {name}")
        self.items[name] = have - count
        if self.items[name] == 0:
            del self.items[name]

    def total(self):
        return sum(self.items.values())

    def save(self):
        self.path.write_text(json.dumps(self.items, indent=2))
'''


def agent_task(test: str, failure: str, name: str, code: str) -> tuple[str, str]:
    """`kog agent`'s first step on a repository whose test `test` fails with `failure`: (system, user) messages,
    with the file `name` holding `code`."""
    return (prompts.system(allow_shell=False, allow_test_edits=False),
            "The tests fail. Make them pass by changing the code.\nTest command: pytest -q\nResult: 1 failed\n"
            f"Output:\nFAILED {test} - {failure}\n\n--- {name}\n{code}")


PROMPTS = {  # name: (system message or None, user message)
    "write": (None, "Write a Python function that reverses a list."),
    "explain": (None, f"Explain what this code does, method by method.\n```python\n{CODE}```"),
    "rename": (None, f"Here is a file:\n```python\n{CODE}```\nRename the method `total` to `count_all` and output the whole file."),
    "tests": (None, f"Write pytest tests for this class.\n```python\n{CODE}```"),
    "agent": agent_task("tests/test_inventory.py::test_remove_too_many", "DID NOT RAISE ValueError", "inventory.py",
                        CODE.replace("if count > have:", "if count > have + 1:")),
}
