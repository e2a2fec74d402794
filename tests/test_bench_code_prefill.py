"""bench/code_prefill.py: the code ladder's pre-start endings, greedy first turns scored in the sandbox."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.code_prefill import def_head, empty_body, main  # noqa: E402
from envs.io import load_tasks  # noqa: E402

EVAL = Path(__file__).resolve().parents[1] / "recipes" / "data" / "code_ladder.eval.jsonl"


def test_empty_body_tells_a_closed_fence_from_a_body():
    assert empty_body("```python\ndef f(x: int) -> int:\n```\n")
    assert empty_body("```python\ndef f(x: int) -> int:\n   \n```\n")
    assert not empty_body("```python\ndef f(x: int) -> int:\n    return x + 1\n```\n")
    # a body cut by the token limit (no closing fence) is a body, not an empty one
    assert not empty_body("```python\ndef f(x: int) -> int:\n    return")


def test_def_head_is_the_shipped_prestart_and_rejects_others():
    rung_low = [t for t in load_tasks(EVAL) if t.meta["rung"] <= 2]
    assert rung_low and all(def_head(t) == t.prefill for t in rung_low)
    fence_only = next(t for t in load_tasks(EVAL) if t.meta["rung"] == 3)
    with pytest.raises(ValueError, match="does not end at a def line's colon"):
        def_head(fence_only)


def test_runs_all_three_endings_on_the_tiny_model(capsys):
    assert main(["--limit", "2", "--model", "embedded:tiny", "--max-new-tokens", "8", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    for ending in ("colon", "newline", "indent"):
        assert f"| {ending} | " in out
    assert out.count(" / 2 |") == 6  # empty bodies and fully right, per ending, over the 2 tasks
