"""Docstrings and comments of the product packages say what code does and why, not when or on which host.

Measurements belong in bench/RESULTS.md, with their host, date and command; a docstring or comment keeps
the reason for a design in words and points to the RESULTS.md section that holds the numbers. This test
parses every module of ``envs``, ``rollout``, ``rewards`` and ``rl`` (not ``bench``, not ``tests``) with
``ast`` and ``tokenize`` and fails on a CPU or GPU model name, a calendar date or a clock time in UTC, a
FLOP-rate figure, a speed-up figure ("1.2x faster"), a work-session reference ("stop 22") or a timing
("took 2.4 s") in any docstring (every bare string statement, attribute docstrings included) or comment.
``rl/config`` is checked in all its string literals as well: the recipe knobs' one-line docs live there
and flow into the generated docs/recipe-reference.md. Other string literals (task data with dates, a log
line's ``GFLOP/s`` format) are not checked. ``ALLOWED`` lists the hits that are legitimate, each with
its reason.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("envs", "rollout", "rewards", "rl")
# Packages whose every string literal is checked (the recipe knobs' docs), not only docstrings and comments.
ALL_STRINGS = ("rl/config/",)

RULES = {
    "a host (CPU or GPU model)": re.compile(
        r"\b(EPYC|Xeon|Zen ?[1-9]|Ryzen|Graviton|Sapphire Rapids|Granite Rapids|Emerald Rapids|Ice Lake|"
        r"Cascade Lake|Skylake|H100|H200|A100|A10G|L40S?)\b"
    ),
    "a date or a clock time": re.compile(r"\b20[0-9]{2}-[01][0-9]-[0-3][0-9]\b|\b[0-2]?[0-9]:[0-5][0-9] UTC\b"),
    "a FLOP-rate figure": re.compile(r"\d[\d.,]*\s*[GTP]FLOP/?s\b|\bat \d[\d.,]* ?[GTP]FLOP", re.IGNORECASE),
    "a speed-up figure": re.compile(r"\b\d+(\.\d+)?x (faster|slower|as fast)\b"),
    "a work-session reference": re.compile(
        r"\bstop \d+\b(?! ?(s|ms|seconds?|steps?|tokens?|engines?|workers?|samples?|times?)\b)"
    ),
    "a timing": re.compile(r"\btook ~?\d[\d.]* ?(ms|s|min|minutes|seconds)\b"),
}

# (file, matched text): hits that are not a host, a date of a run or a measurement, each with its reason.
ALLOWED = {
    # Example values of the tool-call answer checker's date parsing (a date in a task's answer), not when.
    ("rewards/toolcall.py", "2024-05-03"),
    ("rewards/toolcall.py", "2024-05-28"),
}


def _texts(path: Path, src: str, all_strings: bool) -> list[tuple[int, str]]:
    """(line, text) of every docstring and comment of ``src`` (every string literal if ``all_strings``)."""
    out = []
    for node in ast.walk(ast.parse(src, filename=str(path))):
        if all_strings and isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append((node.lineno, node.value))
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            out.append((node.lineno, node.value.value))
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
    return out


def hits(path: Path, src: str) -> list[str]:
    """``file:line: what: 'match' in '...context...'`` for each rule hit in ``src``'s docstrings and comments."""
    rel = path.relative_to(REPO).as_posix() if path.is_absolute() else path.as_posix()
    out = []
    for line, text in _texts(path, src, rel.startswith(ALL_STRINGS)):
        for what, rule in RULES.items():
            for m in rule.finditer(text):
                if (rel, m.group(0)) in ALLOWED:
                    continue
                at = line + text.count("\n", 0, m.start())  # a docstring's own line of the hit
                context = " ".join(text[max(0, m.start() - 50) : m.end() + 30].split())
                out.append(f"{rel}:{at}: {what}: {m.group(0)!r} in '...{context}...'")
    return out


def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def test_docstrings_and_comments_name_no_host_date_or_measurement():
    found = [h for p in _modules() for h in hits(p, p.read_text(encoding="utf-8"))]
    assert not found, (
        "docstrings and comments say what code does and why, not when or on which host: move the figure to "
        "bench/RESULTS.md and point to its section (or add a legitimate hit to ALLOWED in tests/test_docstrings.py "
        "with its reason):\n" + "\n".join(found)
    )


def test_every_allowed_hit_still_occurs():
    """An allow-list entry whose text is gone would silently allow the next such hit: it must be removed."""
    for rel, text in ALLOWED:
        assert text in (REPO / rel).read_text(encoding="utf-8"), f"ALLOWED entry ({rel}, {text!r}) matches nothing"


@pytest.mark.parametrize(
    "src, what",
    [
        ('"""Faster (AMD EPYC Zen4, 2 cores)."""\n', "a host (CPU or GPU model)"),
        ("x = 1  # run on an H200\n", "a host (CPU or GPU model)"),
        ('def f():\n    """Profiled 2026-12-03."""\n', "a date or a clock time"),
        ("# measured 14:21 UTC\n", "a date or a clock time"),
        ('class C:\n    """Matmuls at 150 GFLOP/s here."""\n', "a FLOP-rate figure"),
        ("# jemalloc ran 1.21x faster\n", "a speed-up figure"),
        ("# (2026-12-02, stop 22)\n", "a work-session reference"),
        ('X = 1\n"""The product took 2.4 s."""\n', "a timing"),
    ],
)
def test_each_rule_catches_its_kind(src, what):
    found = hits(Path("rl/trainer/example.py"), src)
    assert any(f": {what}: " in h for h in found), found


@pytest.mark.parametrize(
    "src",
    [
        '"""Waits at most 3 s for a stack; a 64 MiB buffer; 1.25x the settled level."""\n',
        "# stop 2 engines; stop 3 steps early\n",
        'log = f"matmul {rate:.0f} GFLOP/s"  # the log line names the rate, which is no docstring\n',
        'TASK = "Find flights on 2024-09-14."\n',
        '"""Ages: 2024-05-03 parses."""\n',
    ],
)
def test_what_is_not_a_hit(src):
    path = Path("rewards/toolcall.py") if "2024-05-03" in src else Path("rl/trainer/example.py")
    assert hits(path, src) == []


def test_config_knob_docs_are_checked_in_every_string():
    src = 'A = knob(0.5, "bf16 ran 2.1x faster on a Xeon")\n'
    assert len(hits(Path("rl/config/example.py"), src)) == 2
    assert hits(Path("rl/trainer/example.py"), src) == []
