"""The agent loop over real fixture repositories, with a scripted model (a test double).

The fixes land and the tests turn green; every failure path leaves the files as they were.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import sys

import pytest
from agent_fixtures.repos import git, ignore, make_repo, snapshot
from agent_fixtures.scripted_model import ENDLESS, ScriptedModel
from rich.console import Console

from agent import trajectory
from agent.checkpoint import undo
from agent.display import Display, LiveDisplay
from agent.loop import Agent, Options, fix
from engine.errors import KogError

FIX_MEAN = """The mean divides by one too few.
@edit stats.py
<<<<<<< SEARCH
    return total(values) / (len(values) - 1)
=======
    return total(values) / len(values)
>>>>>>> REPLACE
"""
MEAN_DIFF = """--- a/stats.py
+++ b/stats.py
@@ -8,7 +8,7 @@
 def mean(values):
     if not values:
         raise ValueError("mean of an empty list")
-    return total(values) / (len(values) - 1)
+    return total(values) / len(values)
 
 
 def spread(values):
"""
QUICK_MEAN_TEST = f"{sys.executable} -c \"import stats; assert stats.mean([2, 4, 6]) == 4\""


@pytest.fixture(autouse=True)
def no_pytest_plugins(monkeypatch):
    """The fixture repositories need no pytest plugins; not loading this venv's saves ~1 s a test run."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def run(root, answers, tmp_path, live=False, dry_run=False, context_size=16384, **options):
    """Run the agent with the scripted model; return (summary, model, records, shown text)."""
    model = ScriptedModel(answers, context_size=context_size)
    out = io.StringIO()
    console = Console(file=out, width=120, highlight=False)
    display = LiveDisplay(console) if live else Display(console)
    log = tmp_path / f"log{len(list(tmp_path.glob('log*.jsonl')))}.jsonl"  # one log per run
    try:
        summary = fix(root, model, Options(**options), display, log, dry_run)
    finally:
        display.close()
    return summary, model, trajectory.read(log), out.getvalue()


def tokens(answer: str) -> int:
    return -(-len(answer) // 4)  # the scripted model streams four characters per token


def tree_digest(root) -> str:
    """Everything under root, .git included."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(str(path.relative_to(root)).encode())
        if path.is_file() and not path.is_symlink():
            digest.update(path.read_bytes())
    return digest.hexdigest()


# --- fixes land ------------------------------------------------------------------------------

def test_an_off_by_one_is_fixed_with_a_search_replace_edit(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    answers = ["Let me look at mean.\n@read_file stats.py 9-11\n", FIX_MEAN]
    summary, model, records, shown = run(root, answers, tmp_path, live=True)

    assert summary["fixed"] and summary["stop_reason"] == "fixed" and summary["steps"] == 2
    assert summary["tests_before"] | {"exit_code": 1} == {
        "headline": "fail (exit 1): 2 failed, 3 passed", "green": False, "passed": 3, "failed": 2,
        "exit_code": 1, "timed_out": False}
    assert summary["tests_after"]["headline"] == "pass: 5 passed"
    assert summary["diff"] == MEAN_DIFF
    assert summary["files_changed"] == ["stats.py"]
    assert summary["generated_tokens"] == sum(tokens(a) for a in answers)
    assert summary["tests_s"] > 0 and summary["generation_s"] >= 0 and summary["checkpoint"]["kind"] == "git"
    assert "return total(values) / len(values)" in (root / "stats.py").read_text()

    # What the model was shown: the failure, a map, the file the failure names, then each result.
    system, first, _ = model.prompts[0]
    assert "@edit PATH" in system and "Test files are read-only" in system
    task = first[0]["content"]
    assert "ZeroDivisionError" in task and "2 failed, 3 passed" in task
    assert "stats.py: total, mean, spread" in task
    assert "--- stats.py\n" in task and "(len(values) - 1)" in task
    second = model.prompts[1][1]
    assert [m["role"] for m in second] == ["user", "assistant", "user"]
    assert second[2]["content"].startswith("[1] @read_file stats.py 9-11\nstats.py (lines 9-11 of 15):\n")

    # The log holds the exact model input and output of every step, and the summary.
    assert [r["type"] for r in records] == ["start", "tests", "step", "step", "end"]
    assert records[2]["input"] == model.prompts[0][1] and records[2]["output"] == answers[0]
    assert records[0]["system"] == system
    assert records[3]["actions"][0]["blocks"][0][1] == "    return total(values) / len(values)\n"
    assert records[3]["tests"]["green"] and records[-1]["summary"]["diff"] == MEAN_DIFF
    assert "step 2" in shown and "fixed: the tests pass" in shown and "tok/s" in shown


def test_a_string_bug_is_fixed_by_rewriting_the_whole_file_outside_git(tmp_path):
    root = make_repo(tmp_path, "py_slug", use_git=False)
    answer = """Lowercase and join with dashes.
@edit slug.py
```python
import re


def slugify(title):
    \"\"\"'Hello, World!' -> 'hello-world'\"\"\"
    words = re.findall(r"[A-Za-z0-9]+", title)
    return "-".join(words).lower()
```
"""
    summary, _, _, _ = run(root, [answer], tmp_path)
    assert summary["fixed"] and summary["steps"] == 1 and summary["checkpoint"]["kind"] == "copy"
    assert summary["test_command"].endswith("-m unittest")
    assert summary["tests_before"]["headline"] == "fail (exit 1): 2 failed, 1 passed"
    assert summary["tests_after"]["headline"] == "pass: 3 passed"
    assert '-    return "_".join(words)\n+    return "-".join(words).lower()\n' in summary["diff"]


def test_a_missing_module_and_a_wrong_sort_are_fixed_in_one_answer(tmp_path):
    root = make_repo(tmp_path, "py_inventory")
    before = snapshot(root)
    # The SEARCH block lost its indentation: the whitespace-tolerant match still places it.
    answer = """units.py is missing, and the order is reversed.
@create_file inventory/units.py
```python
def kilograms(grams):
    return grams / 1000
```
@edit inventory/report.py
<<<<<<< SEARCH
ordered = sorted(items, key=lambda item: item.grams)
=======
ordered = sorted(items, key=lambda item: item.grams, reverse=True)
>>>>>>> REPLACE
"""
    summary, model, _, _ = run(root, [answer], tmp_path)
    assert summary["fixed"], summary["tests_after"]
    assert "ModuleNotFoundError" in model.prompts[0][1][0]["content"]
    assert "    ordered = sorted(items, key=lambda item: item.grams, reverse=True)\n" in (root / "inventory/report.py").read_text()
    assert "+++ b/inventory/units.py" in summary["diff"] and summary["files_changed"] == ["inventory/report.py", "inventory/units.py"]

    assert "before run" in undo(root)
    assert snapshot(root) == before  # byte for byte, the created file gone


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node")
def test_a_javascript_index_bug_is_fixed(tmp_path):
    root = make_repo(tmp_path, "js_days")
    answer = "Months are 1-based.\n@edit days.js\n<<<<<<< SEARCH\n  return days[month];\n=======\n  return days[month - 1];\n>>>>>>> REPLACE\n"
    summary, _, _, _ = run(root, [answer], tmp_path)
    assert summary["test_command"] == "npm test --silent"
    assert summary["tests_before"]["failed"] == 1 and summary["fixed"]
    assert summary["tests_after"]["passed"] == 2


def test_nothing_to_do_when_the_tests_already_pass(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    summary, model, _, _ = run(root, [], tmp_path, test_cmd="true")
    assert summary["fixed"] and summary["stop_reason"] == "already passing" and summary["steps"] == 0
    assert model.prompts == [] and summary["diff"] == "" and summary["checkpoint"] is None


def test_a_dry_run_shows_the_diff_and_writes_nothing(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    before = tree_digest(root)
    summary, _, _, shown = run(root, [FIX_MEAN], tmp_path, dry_run=True)
    assert summary["fixed"] and summary["dry_run"] and summary["diff"] == MEAN_DIFF
    assert summary["repo"] == str(root) and summary["checkpoint"] is None
    assert tree_digest(root) == before and not (root / ".kog").exists()
    assert "[dry run]" in shown


# --- failure paths: the files stay as they were -------------------------------------------------

def test_malformed_answers_end_the_run_untouched(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    before = snapshot(root)
    answers = ["I would change the mean.", "edit stats.py: use len(values)", "@edit stats.py\n<<<<<<< SEARCH\nx\n"]
    summary, model, records, _ = run(root, answers, tmp_path, test_cmd=QUICK_MEAN_TEST)
    assert summary["stop_reason"] == "malformed answers" and summary["steps"] == 3 and not summary["fixed"]
    assert "no action found" in model.prompts[1][1][-1]["content"]
    assert records[4]["format_error"].endswith("has no ======= line")
    assert snapshot(root) == before and summary["checkpoint"] is None and summary["diff"] == ""


def test_a_search_that_matches_nothing_is_answered_with_the_closest_lines(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    before = snapshot(root)
    wrong = FIX_MEAN.replace("(len(values) - 1)", "(len(vals) - 1)")
    summary, model, _, _ = run(root, [wrong, FIX_MEAN], tmp_path, test_cmd=QUICK_MEAN_TEST)
    feedback = model.prompts[1][1][-1]["content"]
    assert "stats.py: the SEARCH block matches nothing" in feedback
    assert "closest lines (11-11)" in feedback and "(len(values) - 1)" in feedback
    assert summary["fixed"] and summary["steps"] == 2
    assert undo(root) and snapshot(root) == before


def test_path_escapes_and_git_writes_are_refused(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.py").write_text("SECRET = 1\n")
    (root / "escape.py").symlink_to(outside / "secret.py")
    git(root, "add", "escape.py")
    git(root, "commit", "-q", "-m", "link")
    before_outside, before_repo = tree_digest(outside), tree_digest(root)
    attempts = [
        "@read_file /etc/hostname\n",
        "@create_file ../outside/evil.py\n```\nx = 1\n```\n",
        "@edit escape.py\n```\nSECRET = 2\n```\n",
        "@create_file .git/hooks/pre-commit\n```\n#!/bin/sh\n```\n",
        "@edit tests/../../outside/secret.py\n```\nSECRET = 3\n```\n",
    ]
    summary, _, records, _ = run(root, attempts, tmp_path, test_cmd=QUICK_MEAN_TEST, max_steps=5)
    errors = [r["results"][0]["text"] for r in records if r["type"] == "step"]
    assert "absolute paths are not allowed" in errors[0]
    assert "'..' is not allowed" in errors[1] and "'..' is not allowed" in errors[4]
    assert "outside the repository" in errors[2]
    assert ".git and .kog are off limits" in errors[3]
    assert summary["stop_reason"] == "max steps" and summary["checkpoint"] is None
    assert tree_digest(outside) == before_outside
    assert tree_digest(root) == before_repo  # .git included


def test_test_files_are_read_only_unless_allowed(tmp_path):
    weaken = "@edit tests/test_stats.py\n<<<<<<< SEARCH\n    assert mean([2, 4, 6]) == 4\n=======\n    assert True\n>>>>>>> REPLACE\n"
    root = make_repo(tmp_path, "py_mean")
    before = snapshot(root)
    summary, _, records, _ = run(root, [weaken], tmp_path, max_steps=1)
    assert "--allow-test-edits" in records[2]["results"][0]["text"]
    assert snapshot(root) == before and not summary["fixed"]

    allowed = make_repo(tmp_path / "allowed", "py_mean")
    summary, model, _, _ = run(allowed, [weaken], tmp_path, max_steps=1, allow_test_edits=True)
    assert "Test files are read-only" not in model.prompts[0][0]
    assert "assert True" in (allowed / "tests/test_stats.py").read_text()
    assert summary["tests_after"]["failed"] == 1  # the other failing test still fails


def test_a_failed_edit_skips_the_rest_of_the_answer(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    before = snapshot(root)
    answer = "@edit stats.py\n<<<<<<< SEARCH\nnot there\n=======\nx\n>>>>>>> REPLACE\n" + FIX_MEAN
    _, _, records, _ = run(root, [answer], tmp_path, test_cmd=QUICK_MEAN_TEST, max_steps=1)
    first, second = records[2]["results"]
    assert not first["ok"] and "not run, because an earlier edit failed" in second["text"]
    assert records[2]["tests"] is None and snapshot(root) == before


def test_a_hanging_test_command_is_killed_on_timeout(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    hang = f"{sys.executable} -c 'import time; time.sleep(60)'"
    summary, _, records, _ = run(root, [FIX_MEAN], tmp_path, test_cmd=hang, test_timeout_s=1.0, max_steps=1)
    assert records[1]["tests"]["timed_out"] and summary["tests_before"]["headline"].startswith("timed out after 1 s")
    assert summary["tests_after"]["timed_out"] and not summary["fixed"] and summary["stop_reason"] == "max steps"
    assert summary["tests_s"] < 10


def test_a_model_that_repeats_itself_is_stopped(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    before = snapshot(root)
    summary, model, records, _ = run(root, ["@read_file stats.py\n"] * 3 + ["@run_tests\n"], tmp_path,
                                     test_cmd=QUICK_MEAN_TEST, max_steps=10)
    assert summary["stop_reason"] == "repeating" and summary["steps"] == 3 and len(model.answers) == 1
    assert records[-2]["repeated"] == 3 and "results" not in records[-2]
    assert snapshot(root) == before


def test_the_token_budget_cuts_the_answer_and_ends_the_run(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    before = snapshot(root)
    summary, model, records, _ = run(root, [FIX_MEAN], tmp_path, test_cmd=QUICK_MEAN_TEST, max_tokens=10)
    assert model.prompts[0][2] == 10 and records[2]["generation"]["stop_reason"] == "length"
    assert summary["generated_tokens"] == 10 and summary["stop_reason"] == "max tokens"
    assert snapshot(root) == before


def test_the_time_budget_ends_the_run(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    summary, model, _, _ = run(root, [FIX_MEAN], tmp_path, timeout_s=0.01)
    assert summary["stop_reason"] == "timeout" and summary["steps"] == 0 and model.prompts == []


def test_the_deadline_cuts_a_long_answer_short(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    before = snapshot(root)
    huge = 10**9
    summary, _, records, _ = run(root, [ENDLESS], tmp_path, context_size=huge, test_cmd=QUICK_MEAN_TEST,
                                 timeout_s=1.0, step_tokens=huge, max_tokens=huge)
    assert summary["stop_reason"] == "timeout" and summary["steps"] == 1
    assert records[2]["generation"]["stop_reason"] == "cancelled" and summary["wall_s"] < 5
    assert snapshot(root) == before


def test_run_command_needs_allow_shell_and_is_checkpointed(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    before = snapshot(root)
    command = "@run_command sed -i 's/(len(values) - 1)/len(values)/' stats.py\n"
    summary, model, records, _ = run(root, [command], tmp_path, test_cmd=QUICK_MEAN_TEST, max_steps=1)
    assert "--allow-shell" in records[2]["results"][0]["text"] and snapshot(root) == before
    assert "@run_command is off" in model.prompts[0][0]

    summary, _, records, _ = run(root, [command], tmp_path, test_cmd=QUICK_MEAN_TEST, allow_shell=True)
    assert records[2]["results"][0]["text"].startswith("$ sed -i") and summary["fixed"]
    assert summary["diff"] == MEAN_DIFF
    undo(root)
    assert snapshot(root) == before


# git clean -x: the checkpoint's copies of ignored files must not lie where it reaches (.kog/)
@pytest.mark.parametrize("command", ["rm .env", "git clean -fdxq"])
def test_undo_brings_back_an_ignored_file_a_command_deleted(tmp_path, command):
    root = make_repo(tmp_path, "py_mean")
    ignore(root, ".env")
    (root / ".env").write_text("TOKEN=secret\n")
    before = snapshot(root)
    summary, _, _, _ = run(root, [f"@run_command {command}\n", FIX_MEAN], tmp_path, test_cmd=QUICK_MEAN_TEST,
                           allow_shell=True)
    assert summary["fixed"] and not (root / ".env").exists()
    undo(root)
    assert snapshot(root) == before


def test_a_run_that_deletes_a_file_whose_name_is_not_utf8_ends_whole(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    (root / os.fsdecode(b"caf\xe9.txt")).write_text("a Latin-1 name\n")
    before = snapshot(root)
    summary, _, _, _ = run(root, ["@run_command rm caf*.txt\n", FIX_MEAN], tmp_path, test_cmd=QUICK_MEAN_TEST,
                           allow_shell=True)  # the diff's name once stopped the log's end, and the seal after it
    assert summary["fixed"] and "--- a/caf\\xe9.txt\n+++ /dev/null\n" in summary["diff"]
    (root / "stats.py").write_text("the user's, after the run\n")
    with pytest.raises(KogError, match="changed since run"):
        undo(root)
    undo(root, force=True)
    assert snapshot(root) == before


def test_a_server_failing_mid_run_still_ends_it_whole_so_undo_guards_later_work(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    before = snapshot(root)
    wrong_fix = FIX_MEAN.replace("/ len(values)", "/ (len(values) - 2)")  # an edit that fixes nothing
    with pytest.raises(KogError, match="answered 500"):
        run(root, [wrong_fix, KogError("the server answered 500")], tmp_path, test_cmd=QUICK_MEAN_TEST)
    records = trajectory.read(tmp_path / "log0.jsonl")
    assert records[-1]["type"] == "end" and records[-1]["summary"]["stop_reason"] == "error"
    assert records[-1]["summary"]["files_changed"] == ["stats.py"]
    (root / "stats.py").write_text("# the user's own work after the run\n")
    with pytest.raises(KogError, match="changed since run"):
        undo(root)
    assert (root / "stats.py").read_text() == "# the user's own work after the run\n"
    undo(root, force=True)
    assert snapshot(root)["stats.py"] == before["stats.py"]


def test_a_log_inside_the_repository_does_not_stop_undo(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    before = snapshot(root)
    display = Display(Console(file=io.StringIO()))
    summary = fix(root, ScriptedModel([FIX_MEAN]), Options(test_cmd=QUICK_MEAN_TEST), display, root / "run.jsonl")
    assert summary["fixed"]
    undo(root)  # the log's lines after the checkpoint are the run's own: the seal comes after its last one
    assert snapshot(root)["stats.py"] == before["stats.py"]


def test_old_output_is_dropped_to_stay_inside_a_small_window(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    (root / "big.py").write_text("".join(f"value_{i} = {i}  # padding padding padding\n" for i in range(400)))
    reads = [f"@read_file big.py {1 + 50 * i}-{50 * (i + 1)}\n" for i in range(6)]
    summary, model, _, _ = run(root, reads + [FIX_MEAN], tmp_path, context_size=3000, test_cmd=QUICK_MEAN_TEST)
    assert summary["fixed"] and summary["steps"] == 7
    for system, messages, max_tokens in model.prompts:
        assert model.prompt_tokens(system, messages) + max_tokens <= 3000
    last = model.prompts[-1][1]
    assert any("[output dropped to save room]" in m["content"] for m in last)
    assert "value_251 = 251" in last[-1]["content"]  # the newest result is never dropped


def test_a_context_too_small_for_the_agent_is_a_clear_error(tmp_path):
    root = make_repo(tmp_path, "py_mean")
    with pytest.raises(KogError, match="too small for the agent"):
        Agent(root, ScriptedModel([], context_size=600), Options(), Display())


def test_a_log_cut_inside_a_character_still_replays(tmp_path):
    log = tmp_path / "run.jsonl"
    whole = ['{"type": "start", "note": "a → b"}', '{"type": "step", "output": "x → y"}']
    data = ("\n".join(whole) + "\n").encode()
    log.write_bytes(data[: data.rindex("→".encode()) + 1])  # killed while writing the arrow's second byte
    assert [r["type"] for r in trajectory.read(log)] == ["start"]


@pytest.mark.parametrize("use_git", [True, False])
def test_a_file_whose_name_is_not_utf8_is_saved_but_not_shown(tmp_path, use_git):
    """The checkpoint saves it as the bytes it is named by; the model, whose text cannot hold such a name, is not
    shown it."""
    root = make_repo(tmp_path, "py_mean", use_git=use_git)
    odd = root / os.fsdecode(b"caf\xe9.py")
    odd.write_text("y = 2\n")
    before = snapshot(root)
    summary, model, _, _ = run(root, [FIX_MEAN], tmp_path)
    assert summary["fixed"] and "caf" not in model.prompts[0][1][0]["content"]
    undo(root)
    assert snapshot(root) == before
