"""No function in rl/, rollout/ or rewards/ is over 60 code lines.

Code lines: the lines of a function (its nested functions included), less its docstring, blank
lines and comment-only lines. rl/data/tasks/ is left out: its generators are task data written
as code (long literal tables of task text), not logic.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("rl", "rollout", "rewards")
EXCLUDED = (ROOT / "rl" / "data" / "tasks",)
MAX_LINES = 60


def code_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> int:
    """Lines of ``fn`` that are not its docstring, blank or a comment."""
    skip: set[int] = set()
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str):
            skip = set(range(body[0].lineno, body[0].end_lineno + 1))
    n = 0
    for i in range(fn.lineno, fn.end_lineno + 1):
        s = lines[i - 1].strip()
        if i not in skip and s and not s.startswith("#"):
            n += 1
    return n


def long_functions(src: str, limit: int = MAX_LINES) -> list[tuple[int, str, int]]:
    """``(line, name, code lines)`` of each function in ``src`` over ``limit`` code lines."""
    lines = src.splitlines()
    out = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = code_lines(node, lines)
            if n > limit:
                out.append((node.lineno, node.name, n))
    return out


def test_counting_skips_docstring_comments_and_blanks():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES - 1))
    src = f'def f():\n    """Doc.\n\n    More doc.\n    """\n    # a comment\n\n{body}\n'
    assert long_functions(src) == []  # def line + 59 statements = 60
    assert long_functions(src + "    return x0\n") == [(1, "f", MAX_LINES + 1)]


def test_nested_functions_count_in_their_parent_and_alone():
    inner = "\n".join(f"        y{i} = {i}" for i in range(MAX_LINES))
    src = f"def outer():\n    def inner():\n{inner}\n    return inner\n"
    names = {name for _, name, _ in long_functions(src)}
    assert names == {"outer", "inner"}


def test_no_function_over_60_code_lines():
    over = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if any(path.is_relative_to(x) for x in EXCLUDED):
                continue
            for line, name, n in long_functions(path.read_text()):
                over.append(f"{path.relative_to(ROOT)}:{line} {name}: {n} code lines")
    assert not over, (
        f"functions over {MAX_LINES} code lines (split them into functions that do one job each):\n" + "\n".join(over)
    )
