"""What a drafted decode would gain at given pass costs, on real replies (no GPU).

A drafted decode's speed is its passes' costs times how many passes of each kind a reply takes: plain tokens,
the drafts' build's passes without a draft and with one, and the switches between the builds. The counts depend
only on the reply's tokens, so the greedy replies of the default model replayed through the draft rule and
engine/drafts.py's `BuildSwitch` give them exactly, the CPU reference decoding them from the matrices the GPU holds
(`as_the_gpu_holds`). The costs come from the GPU
(`bench/decode_breakdown.py --trace none --variants npos-5+draft-never,npos-5+draft-always` and a plain token).
This prices a change of the drafts' build (its passes' costs, say the tensor cores' `KOG_MMA`) for the shapes
whose real weights are not on the GPU machine, and a switching rule, before any GPU time goes to them.

    python bench/drafts_model.py --costs 802,960,1895,34 --costs 802,1117,1676,34 [--more] [--rules 4:4,3:6]

Each --costs is PLAIN,WITHOUT,WITH,SWITCH in any one unit (us): a plain token, a pass of the drafts' build without
a draft and with one, a switch's dead time. --more adds eleven prompts to kog bench's five (agent/workloads.py).
It prints, for each prompt, the rate against the plain decode's: the drafts' build throughout, then each rule, then
the best any switching rule could do (`hindsight`: each switch placed knowing the whole reply), which bounds what a
better rule can still win.
"""

from __future__ import annotations

import argparse
import math

from agent.workloads import PROMPTS, agent_task
from bench.lookup_acceptance import greedy_reply, kept_of, parse_rules, replay
from bench.random_models import as_the_gpu_holds
from engine import drafts
from engine.api import load
from engine.backends import DEFAULT_DRAFTS, create_backend
from engine.drafts import ContextDrafts

SIZES = '''def parse_size(text):
    """'10k' -> 10240, '3M' -> 3145728, '512' -> 512."""
    units = {"k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}
    text = text.strip().lower()
    if not text:
        raise ValueError("empty size")
    if text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def format_size(n):
    for unit in ("", "K", "M", "G"):
        if n < 1024:
            return f"{n:.0f}{unit}"
        n /= 1024
    return f"{n:.1f}T"
'''
STACK = '''class Stack:
    def __init__(self):
        self._items = []

    def push(self, item):
        self._items.append(item)

    def pop(self):
        if not self._items:
            raise IndexError("pop from empty stack")
        return self._items.pop()

    def peek(self):
        if not self._items:
            raise IndexError("peek at empty stack")
        return self._items[-1]

    def __len__(self):
        return len(self._items)

    def is_empty(self):
        return len(self._items) == 0
'''
REPORT = '''import csv


def load_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def total_by(rows, key, value):
    totals = {}
    for row in rows:
        totals[row[key]] = totals.get(row[key], 0) + float(row[value])
    return totals


def top(totals, n=3):
    return sorted(totals.items(), key=lambda kv: kv[1], reverse=True)[:n]
'''


MORE = {  # name: (system message or None, user message); the first letter says the kind, as in PROMPTS
    "write-2": (None, "Write a Python class for a simple LRU cache with get and put."),
    "write-3": (None, "Explain the difference between a list and a tuple in Python."),
    "explain-2": (None, f"Explain this code.\n```python\n{REPORT}```"),
    "rename-2": (None, f"Here is a file:\n```python\n{SIZES}```\nAdd type hints to both functions and output the whole file."),
    "rename-3": (None, f"Here is a file:\n```python\n{STACK}```\nRename the class `Stack` to `LifoStack` and output the whole file."),
    "rename-4": (None, f"Here is a file:\n```python\n{REPORT}```\nAdd a docstring to every function and output the whole file."),
    "tests-2": (None, f"Write pytest tests for these functions.\n```python\n{SIZES}```"),
    "tests-3": (None, f"Write pytest tests for this class.\n```python\n{STACK}```"),
    "agent-2": agent_task("tests/test_size.py::test_parse_kilo", "assert 10000 == 10240", "size.py",
                          SIZES.replace('"k": 1024,', '"k": 1000,')),
    "agent-3": agent_task("tests/test_stack.py::test_peek", "assert 1 == 3", "stack.py",
                          STACK.replace("return self._items[-1]", "return self._items[0]")),
    "agent-4": agent_task("tests/test_report.py::test_top", "assert [('b', 1.0)] == [('a', 5.0)]", "report.py",
                          REPORT.replace("reverse=True", "reverse=False")),
}


def decode_time(passes: dict[str, int], costs: tuple[float, ...]) -> float:
    """A decode's time from its passes by kind (`replay`'s counts) at `costs` (PLAIN, WITHOUT, WITH, SWITCH)."""
    plain, without, drafted, switch = costs
    return (passes["plain"] * plain + passes["without"] * without + passes["drafted"] * drafted
            + passes["switches"] * switch)


def hindsight(prompt: list[int], reply: list[int], positions: int, costs: tuple[float, ...]) -> float:
    """The least time a switching decode of `reply` can take at `costs` (PLAIN, WITHOUT, WITH, SWITCH), every switch
    placed knowing the whole reply: a shortest path over (tokens done, build running), starting in the plain build as
    BuildSwitch does. A pass of the drafts' build at a token keeps what `replay` says it keeps, whatever ran before
    (the draft reads only the context)."""
    plain, without, drafted, switch = costs
    context, steps, costs_at = ContextDrafts(prompt), [], []
    for done in range(len(reply)):  # the drafts' build's pass from here: tokens it yields and its cost
        guess = context.draft(positions - 1)
        steps.append(min(kept_of(guess, reply, done) + 1, len(reply) - done))
        costs_at.append(drafted if guess else without)
        context.append(reply[done])
    best_plain, best_drafts = [math.inf] * (len(reply) + 1), [math.inf] * (len(reply) + 1)
    best_plain[0] = 0.0
    for done in range(len(reply)):  # every pass moves forward, so one sweep settles each position
        best_plain[done] = min(best_plain[done], best_drafts[done] + switch)
        best_drafts[done] = min(best_drafts[done], best_plain[done] + switch)
        best_plain[done + 1] = min(best_plain[done + 1], best_plain[done] + plain)
        nxt = done + steps[done]
        best_drafts[nxt] = min(best_drafts[nxt], best_drafts[done] + costs_at[done])
    return min(best_plain[-1], best_drafts[-1])


def report(label: str, rates: dict[str, float]) -> None:
    """One line: the replies' rates against the plain decode's, and their geometric mean."""
    geo = math.exp(sum(map(math.log, rates.values())) / len(rates))
    print(f"  {label:24s} all {geo:.3f}x: " + ", ".join(f"{k} {v:.2f}x" for k, v in rates.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--costs", action="append", required=True, metavar="PLAIN,WITHOUT,WITH,SWITCH")
    parser.add_argument("--positions", type=int, default=DEFAULT_DRAFTS, help="positions a pass of the drafts' build")
    parser.add_argument("--rules", default=f"{drafts.COPY_MATCH}:{drafts.DRY_PASSES}", metavar="COPY:DRY,...")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--more", action="store_true", help="eleven prompts more than kog bench's five")
    args = parser.parse_args()
    try:
        rules = parse_rules(args.rules)
    except ValueError as e:
        parser.error(str(e))
    try:
        cost_sets = [tuple(float(x) for x in c.split(",")) for c in args.costs]
        if any(len(c) != 4 for c in cost_sets):
            raise ValueError
    except ValueError:
        parser.error("--costs takes four numbers")
    model = as_the_gpu_holds(load(None))
    backend = create_backend(model, "cpu", 4096)
    replies = {name: greedy_reply(model, backend, system, text, args.tokens)
               for name, (system, text) in (PROMPTS | (MORE if args.more else {})).items()}
    for costs in cost_sets:
        plain, without, drafted, switch = costs
        print(f"costs: plain {plain:g}, a pass without a draft {without:g}, with one {drafted:g}, a switch {switch:g}")
        for rule in [None] + rules:
            report(f"switching {rule}" if rule else "drafts' build throughout", {
                name: len(reply) * plain / decode_time(replay(prompt, reply, args.positions, rule), costs)
                for name, (prompt, reply) in replies.items()})
        report("switching in hindsight", {
            name: len(reply) * plain / hindsight(prompt, reply, args.positions, costs)
            for name, (prompt, reply) in replies.items()})


if __name__ == "__main__":
    main()
