"""A map of the repository for the model: its files and their top-level symbols, ranked.

The files a failing test's output names come first, then files that output (or those
files) refers to by module name or symbol, then the rest; the map is cut to a token
budget, so in a large repository the model sees the neighbourhood of the failure.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath

from agent.errors import ToolError
from agent.workspace import Workspace

SOURCE = r"py|pyi|js|mjs|cjs|jsx|ts|tsx|go|rs|rb|java|kt|c|h|cc|cpp|hpp|cs|php|swift|scala|sh"
PATH_IN_OUTPUT = re.compile(r"[\w./-]+\.(?:" + SOURCE + r")\b")
MAX_SYMBOL_BYTES = 256 << 10  # bigger files are listed without symbols
PATTERNS = {  # top-level definitions, by extension
    ".js": r"^(?:export\s+)?(?:default\s+)?(?:async\s+)?(?:function\s*\*?|class)\s+(\w+)|^(?:export\s+)?(?:const|let|var)\s+(\w+)\s*=",
    ".go": r"^func\s+(?:\([^)]*\)\s*)?(\w+)|^type\s+(\w+)",
    ".rs": r"^(?:pub(?:\([^)]*\))?\s+)?(?:fn|struct|enum|trait|mod|type|const)\s+(\w+)",
    ".rb": r"^\s*(?:def|class|module)\s+([\w.]+)",
}
for _ext in (".mjs", ".cjs", ".jsx", ".ts", ".tsx"):
    PATTERNS[_ext] = PATTERNS[".js"]


def failure_files(output: str, workspace: Workspace) -> list[str]:
    """Repository files named in test output, in order of first mention."""
    known = set(workspace.files())
    root = workspace.root.as_posix() + "/"
    found: list[str] = []
    for match in PATH_IN_OUTPUT.findall(output):
        path = match[len(root):] if match.startswith(root) else match.removeprefix("./")
        if path in known and path not in found:
            found.append(path)
    return found


def symbols(path: str, text: str) -> list[str]:
    suffix = PurePosixPath(path).suffix
    if suffix in (".py", ".pyi"):
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            return []  # a syntax error is often the bug itself; the file is still listed
        except (RecursionError, MemoryError):
            return []  # nesting too deep for the parser (a generated `elif` chain or `a + b + ...`): listed too
        out = []
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append(node.name)
            elif isinstance(node, ast.ClassDef):
                methods = [n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
                out.append(f"{node.name}({', '.join(methods)})" if methods else node.name)
            elif isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) and t.id.isupper() for t in node.targets):
                out += [t.id for t in node.targets]
        return out
    pattern = PATTERNS.get(suffix)
    if pattern is None:
        return []
    return [next(g for g in m.groups() if g) for m in re.finditer(pattern, text, re.MULTILINE)]


@dataclass(frozen=True)
class Entry:
    path: str
    symbols: list[str]
    related: bool  # named by the failure, or referred to by it by module name or symbol


def rank(workspace: Workspace, failing: list[str], output: str) -> list[Entry]:
    """Every file with its symbols, most relevant first."""
    texts = {}
    for path in workspace.files():
        try:
            real = workspace.resolve(path)
            texts[path] = workspace.read_text(path) if real.stat().st_size <= MAX_SYMBOL_BYTES else ""
        except (ToolError, OSError):
            texts[path] = ""  # binary, unreadable or a link out of the repository: listed, no symbols
    words = set(re.findall(r"[A-Za-z_]\w*", output + "".join(texts[f] for f in failing)))
    table = {path: symbols(path, text) for path, text in texts.items()}

    def hits(path: str) -> int:
        return sum(name.split("(")[0] in words for name in table[path])

    def related(path: str) -> bool:
        return path in failing or PurePosixPath(path).stem in words or hits(path) > 0

    def score(path: str) -> tuple:
        named = path in failing
        return (not named, failing.index(path) if named else 0, not related(path), -hits(path),
                workspace.is_test_file(path), path)

    return [Entry(path, table[path], related(path)) for path in sorted(table, key=score)]


def render(ranked: list[Entry], budget: int, count: Callable[[str], int]) -> str:
    """One line per file, cut to `budget` tokens with a note of how many files were left out."""
    lines, used = [], 0
    for n, entry in enumerate(ranked):
        line = f"{entry.path}: {', '.join(entry.symbols)}" if entry.symbols else entry.path
        cost = count(line) + 1
        if used + cost > budget:
            lines.append(f"... and {len(ranked) - n} more files (@list_files shows them)")
            break
        lines.append(line)
        used += cost
    return "\n".join(lines)
