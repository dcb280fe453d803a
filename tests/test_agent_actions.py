"""The answer format: what parses, what each action holds, and the errors sent back."""

from __future__ import annotations

import pytest

from agent.actions import Action, FormatError, parse


def test_prose_around_simple_actions_is_ignored():
    answer = "I should look first.\n@list_files src\n@read_file `src/app.py` 3-9\n@search def \\w+\\(\n@run_tests\nDone."
    assert parse(answer) == [
        Action("list_files", arg="src"),
        Action("read_file", path="src/app.py", arg="3-9"),
        Action("search", arg="def \\w+\\("),
        Action("run_tests"),
    ]


def test_edit_with_several_blocks_keeps_exact_text():
    answer = """Two fixes.
@edit calc.py
<<<<<<< SEARCH
    return a - b
=======
    return a + b
>>>>>>> REPLACE

<<<<<<< SEARCH
x = 1
=======
>>>>>>> REPLACE
@run_tests
"""
    edit, tests = parse(answer)
    assert edit == Action("edit", path="calc.py", blocks=(("    return a - b\n", "    return a + b\n"), ("x = 1\n", "")))
    assert tests == Action("run_tests")
    assert edit.describe() == "@edit calc.py (2 blocks)"


def test_blocks_inside_a_fence_and_marker_lengths_are_tolerated():
    answer = "@edit a.py\n```python\n<<<<<< SEARCH\nold\n========\nnew\n>>>>>>>> REPLACE\n```\n"
    assert parse(answer) == [Action("edit", path="a.py", blocks=(("old\n", "new\n"),))]


def test_whole_file_edit_and_create_file_take_a_fenced_body():
    answer = "@edit a.md\n````\n# title\n```\ncode\n```\n````\n@create_file pkg/new.py\n```python\n@decorator\ndef f():\n    pass\n```\n"
    edit, create = parse(answer)
    assert edit.body == "# title\n```\ncode\n```\n"
    assert create == Action("create_file", path="pkg/new.py", body="@decorator\ndef f():\n    pass\n")


def test_decorators_and_lookalikes_are_not_actions():
    # "@search.route" is a decorator, not @search; the edit block's contents are never headers.
    answer = "@search.route('/x')\n@edit app.py\n<<<<<<< SEARCH\n@run_tests\n=======\n@edit other\n>>>>>>> REPLACE\n"
    assert parse(answer) == [Action("edit", path="app.py", blocks=(("@run_tests\n", "@edit other\n"),))]


@pytest.mark.parametrize("answer, fragment", [
    ("I think the bug is in line 3.", "no action found"),
    ("@read_file", "needs a path"),
    ("@read_file a.py 9-3", "line range"),
    ("@read_file a.py lines", "line range"),
    ("@run_tests now", "takes no arguments"),
    ("@search", "needs a regex"),
    ("@run_command", "needs a command"),
    ("@list_files a b", "at most one folder"),
    ("@edit a.py", "expected SEARCH/REPLACE blocks"),
    ("@edit a.py b.py\n```\nx\n```", "takes only a path"),
    ("@edit a.py\n<<<<<<< SEARCH\nold\n", "no ======= line"),
    ("@edit a.py\n<<<<<<< SEARCH\nold\n=======\nnew\n", "no >>>>>>> REPLACE line"),
    ("@edit a.py\n<<<<<<< SEARCH\nold\n<<<<<<< SEARCH\n", "new SEARCH block starts"),
    ("@create_file a.py\n```\nnever closed\n", "never closed"),
    ("@create_file a.py\nplain text", "fenced block"),
])
def test_malformed_answers_say_what_is_wrong(answer, fragment):
    with pytest.raises(FormatError, match=fragment):
        parse(answer)


def test_one_malformed_action_rejects_the_whole_answer():
    with pytest.raises(FormatError, match="line 2"):
        parse("@read_file good.py\n@read_file\n")
