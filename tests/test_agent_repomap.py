"""The repository map: each file's top-level symbols, the failure's neighbourhood first."""

from __future__ import annotations

from agent_fixtures.repos import make_repo

from agent import repomap
from agent.checkpoint import Checkpoint
from agent.workspace import Workspace


def test_a_file_nested_too_deep_for_the_parser_is_listed_without_symbols(tmp_path):
    """Generated code (a long `a + b + ...`, a long elif chain) is valid Python that Python's parser still
    cannot build a tree of: the map lists it rather than the run ending in a RecursionError."""
    root = make_repo(tmp_path, "py_mean")
    (root / "table.py").write_text("X = " + " + ".join(f'"s{i}"' for i in range(5000)) + "\n")
    ranked = repomap.rank(Workspace(root, Checkpoint(root, "t")), [], "")
    assert {e.path: e.symbols for e in ranked}["table.py"] == []
    assert "mean" in {e.path: e.symbols for e in ranked}["stats.py"]
