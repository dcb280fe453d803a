"""Search/replace: exact, then whitespace-tolerant, else an error with the closest lines."""

from __future__ import annotations

import pytest

from agent.edits import apply_blocks
from agent.errors import ToolError

SOURCE = """def add(a, b):
    return a - b


class Box:
    def size(self):
        if self.items:
            return len(self.items) - 1
        return 0
"""


def test_exact_match_replaces_once():
    out = apply_blocks(SOURCE, [("    return a - b\n", "    return a + b\n")], "m.py")
    assert out == SOURCE.replace("a - b", "a + b")


def test_ambiguous_search_is_refused():
    with pytest.raises(ToolError, match="matches 2 places"):
        apply_blocks("x = 1\nx = 1\n", [("x = 1\n", "x = 2\n")], "m.py")


def test_wrong_indentation_is_matched_and_the_replacement_reindented():
    search = "if self.items:\n    return len(self.items) - 1\n"
    replace = "if self.items:\n    return len(self.items)\n"
    out = apply_blocks(SOURCE, [(search, replace)], "m.py")
    assert "        if self.items:\n            return len(self.items)\n        return 0\n" in out
    assert out.count("\n") == SOURCE.count("\n")


def test_trailing_spaces_and_blank_lines_do_not_block_a_match():
    out = apply_blocks(SOURCE, [("def add(a, b):   \n\n    return a - b\n", "def add(a, b):\n    return a + b\n")], "m.py")
    assert out.startswith("def add(a, b):\n    return a + b\n\n\nclass Box:")


def test_no_match_shows_the_closest_lines():
    with pytest.raises(ToolError) as e:
        apply_blocks(SOURCE, [("            return len(items) - 1\n", "x\n")], "m.py")
    message = str(e.value)
    assert "m.py: the SEARCH block matches nothing" in message
    assert "closest lines (8-8)" in message and "return len(self.items) - 1" in message


def test_the_closest_lines_of_a_long_file_are_found():
    """Ranked by shared words first, so that a 3,000-line file is searched in one pass (compared character by
    character everywhere, a 20-line SEARCH text took minutes there), and the near miss is still the one shown."""
    lines = [f"    value_{i} = compute(alpha_{i % 17}, beta={i * 3}) + offset  # step {i}\n" for i in range(3000)]
    lines[2500:2520] = [f"    total_{i} = merge(left_{i}, right={i}) - shift  # note {i}\n" for i in range(20)]
    search = "".join(f"    total_{i} = merge(left_{i}, right={i}) + shift  # note {i}\n" for i in range(20))
    with pytest.raises(ToolError) as e:
        apply_blocks("".join(lines), [(search, "x\n")], "long.py")
    assert "closest lines (2501-2520)" in str(e.value) and "total_19 = merge(left_19, right=19) - shift" in str(e.value)


def test_blocks_apply_all_or_none():
    blocks = [("    return a - b\n", "    return a + b\n"), ("not in the file\n", "x\n")]
    with pytest.raises(ToolError, match="SEARCH block 2 matches nothing"):
        apply_blocks(SOURCE, blocks, "m.py")


def test_crlf_files_keep_their_line_endings():
    text = "a = 1\r\nb = 2\r\n"
    assert apply_blocks(text, [("b = 2\n", "b = 3\n")], "w.py") == "a = 1\r\nb = 3\r\n"


def test_empty_search_fills_an_empty_file_only():
    assert apply_blocks("", [("", "x = 1\n")], "n.py") == "x = 1\n"
    with pytest.raises(ToolError, match="is empty"):
        apply_blocks(SOURCE, [("\n", "x\n")], "m.py")


def test_a_byte_order_mark_is_kept_and_not_part_of_the_first_line():
    text = "\ufeffdef f():\n    return 1\n"
    out = apply_blocks(text, [("def f():  \n    return 1\n", "def f():\n    return 2\n")], "bom.py")  # (matched loosely)
    assert out == "\ufeffdef f():\n    return 2\n"
    assert apply_blocks(text, [("def f():\n", "def g():\n")], "bom.py") == "\ufeffdef g():\n    return 1\n"


def test_a_search_matches_whole_lines_only():
    """Found inside a longer line it is not what the model copied; found after the indentation, it is matched
    loosely, so that a REPLACE of several lines is indented like the line it replaces."""
    with pytest.raises(ToolError, match="matches nothing"):
        apply_blocks("max = 1\ny = 0\n", [("x = 1\n", "x = 2\n")], "m.py")
    out = apply_blocks("def f():\n    x = 1\n    return x\n", [("x = 1\n", "x = 1\ny = 2\n")], "m.py")
    assert out == "def f():\n    x = 1\n    y = 2\n    return x\n"
    with pytest.raises(ToolError, match="matches 2 places"):  # (each at a line's start)
        apply_blocks("x = 1\nx = 1\n", [("x = 1\n", "x = 2\n")], "m.py")


def test_a_tab_indented_file_stays_tab_indented_when_the_model_uses_spaces():
    text = "def f(x):\n\tif x:\n\t\treturn 1\n\treturn 0\n"
    search = "    if x:\n        return 1\n"
    replace = "    if x:\n        if x > 1:\n            return 2\n        return 1\n"
    out = apply_blocks(text, [(search, replace)], "tabs.py")
    assert out == "def f(x):\n\tif x:\n\t\tif x > 1:\n\t\t\treturn 2\n\t\treturn 1\n\treturn 0\n"
    # one level too shallow, in tabs: the level added is a tab too
    assert apply_blocks(text, [("return 1\n", "return 2\n")], "tabs.py") == text.replace("return 1", "return 2")
    assert apply_blocks(text, [("\treturn 1\n", "\treturn 2\n\tpass\n")], "tabs.py") == (
        "def f(x):\n\tif x:\n\t\treturn 2\n\t\tpass\n\treturn 0\n")


def test_a_file_without_a_newline_at_its_end_keeps_so():
    assert apply_blocks("a = 1\nb = 2", [("b = 2\n", "b = 3\n")], "m.py") == "a = 1\nb = 3"
    assert apply_blocks("a = 1\r\nb = 2", [("a = 1\nb = 2\n", "b = 3\nc = 4\n")], "m.py") == "b = 3\r\nc = 4"
    assert apply_blocks("a = 1\nb = 2", [("a = 1\n", "a = 0\n")], "m.py") == "a = 0\nb = 2"
