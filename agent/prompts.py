"""Every word the model reads from the harness: the system message, the task, the feedback.

The system message is fixed for a run, and each step only appends to the conversation,
so the local engine's prefix cache covers everything but the newest turn.
"""

from __future__ import annotations

from agent import budget
from agent.budget import Counter
from agent.testcmd import TestRun
from agent.tools import Result

FORMAT = """\
Answer with a short thought, then one or more actions. An action starts on its own line \
with @ and a tool name:

@list_files [DIR]             list the files
@read_file PATH [START-END]   show a file, or its lines START to END
@search REGEX                 find lines matching a Python regex in every file
@edit PATH                    change a file with one or more blocks like this:
<<<<<<< SEARCH
lines copied exactly from the file
=======
the lines to put in their place
>>>>>>> REPLACE
@edit PATH                    or rewrite a whole file with a fenced block:
```
the complete new file
```
@create_file PATH             make a new file; its contents go in a fenced block
@run_tests                    run the tests
{shell}

Example:
The loop skips the last item.
@edit shop/cart.py
<<<<<<< SEARCH
    for item in items[:-1]:
=======
    for item in items:
>>>>>>> REPLACE
"""

RULES = """\
Rules:
- Paths are relative to the repository root.
- A SEARCH block copies lines from the file exactly, without line numbers; keep it short.
- The tests run by themselves after your edits, and you see the result.
{tests}- Nothing outside the format is run; an answer without an action is wasted.
"""


def system(allow_shell: bool, allow_test_edits: bool) -> str:
    shell = "@run_command COMMAND          run a shell command" if allow_shell else "(@run_command is off in this run)"
    tests = "" if allow_test_edits else "- Test files are read-only: make the code do what the tests expect.\n"
    return (
        "You are a coding agent. The tests of this repository fail; change the code so they pass.\n\n"
        + FORMAT.format(shell=shell) + "\n" + RULES.format(tests=tests)
    )


def task(command: str, tests: TestRun, repo_map: str, files: list[tuple[str, str]], output_budget: int, count: Counter) -> str:
    parts = [
        "The tests fail. Make them pass by changing the code.",
        f"Test command: {command}\nResult: {tests.headline()}\nOutput:\n{budget.head_tail(tests.output, output_budget, count)}",
        f"Repository map (file: top-level symbols):\n{repo_map}",
    ]
    parts += [f"--- {path}\n{text}" for path, text in files]
    return "\n\n".join(parts)


def task_brief(command: str) -> str:
    return (f"The tests fail (command: {command}); make them pass by changing the code. "
            "[The first test output, repository map and files were dropped to save room.]")


def results(entries: list[tuple[str, Result]], tests: TestRun | None, output_budget: int, count: Counter) -> tuple[str, str]:
    """The feedback for one step, and its one-line-per-action brief."""
    text = [f"[{n}] {described}\n{result.text}" for n, (described, result) in enumerate(entries, 1)]
    brief = [f"[{n}] {result.brief}" for n, (_, result) in enumerate(entries, 1)]
    if tests is not None:
        text.append(f"Tests: {tests.headline()}\n{budget.head_tail(tests.output, output_budget, count)}")
        brief.append(f"Tests: {tests.headline()}")
    return "\n\n".join(text), "\n".join(brief) + "\n[output dropped to save room]"


def skipped(action: str) -> tuple[str, str]:
    return f"{action}: not run, because an earlier edit failed", f"{action}: not run"


def malformed(error: str) -> str:
    return (f"Your answer could not be used: {error}. Nothing in it was run. "
            "Answer again, with actions in the format of the system message.")
