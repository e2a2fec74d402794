"""bench/code_turns.py: each multi-turn training episode's first and last answers scored alone, on a synthetic run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.code_turns import main, split_turns  # noqa: E402
from rl.config.recipe import load_recipe, recipe_to_dict  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TASK = "code_ladder-train-add_suffix-000"  # add_suffix_42(s) -> s + '42'; prefill "```python\ndef add_suffix_42(...):"
HEAD = "```python\ndef add_suffix_42(s: str) -> str:"
RIGHT, WRONG = HEAD + "\n    return s + '42'\n```", HEAD + "\n    return s + '24'\n```"
RIGHT2 = "```python\ndef add_suffix_42(s: str) -> str:\n    return s + '4' + '2'\n```"
WRONG2 = "```python\ndef add_suffix_42(s: str) -> str:\n    return '42' + s\n```"


def record(turns: list[str], reward: float, domain: str = "code", tokens: int = 10, chars: bool = True, **kw) -> dict:
    r = {"step": 1, "split": "train", "domain": domain, "task_id": TASK, "group": 0, "response": "\n".join(turns)}
    r |= {"reward": reward, "reward_shaping": 0.0, "scores": {"code_tests": reward}, "response_tokens": tokens}
    if chars:
        r["turn_chars"] = [len(t) for t in turns]
    return r | kw


def make_run(d: Path, rows: list[dict]) -> Path:
    d.mkdir(parents=True)
    cfg = recipe_to_dict(load_recipe(ROOT / "recipes" / "joint_rl.yaml"))
    (d / "recipe.resolved.yaml").write_text(yaml.safe_dump(cfg))
    (d / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def test_split_turns_by_turn_chars_by_fence_and_one():
    turns = [RIGHT, "prose\n" + WRONG2]  # a later turn that opens with prose: only turn_chars splits it right
    assert split_turns(record(turns, 0.0)) == (turns, "turn_chars")
    assert split_turns(record([RIGHT, WRONG2], 0.0, chars=False)) == ([RIGHT, WRONG2], "fence")
    assert split_turns(record([RIGHT], 1.0, chars=False)) == ([RIGHT], "one")
    assert split_turns(record(["", ""], 0.0)) == (["", ""], "turn_chars")  # empty turns keep their places
    with pytest.raises(ValueError, match="do not add up"):
        split_turns(record([RIGHT, WRONG], 0.0) | {"turn_chars": [3, 4]})


def test_counts_each_answer_scored_alone_against_hand_labels(tmp_path, capsys):
    rows = [
        record([WRONG, RIGHT2], 1.0),  # the second answer fixes the first
        record([RIGHT, WRONG2], 0.0),  # the second breaks a right first answer
        record([WRONG, WRONG2], 0.0),  # both wrong: equal
        record([WRONG, RIGHT2], 1.0, chars=False),  # an old record: split at its second fence
        record([RIGHT], 1.0, tokens=30),  # one turn: counted as an episode, not compared
        record([WRONG, RIGHT2], 0.0),  # logged 0 where the last answer scores 1: a mismatch the output shows
        record([WRONG, RIGHT2], 1.0, reward_error="sandbox: harness"),  # a harness failure: not compared
        record([RIGHT, WRONG2], 0.0, split="eval"),  # held-out records are not read
        record(["<tool_call>{}</tool_call>"], 1.0, domain="tool_call", tokens=40),
    ]
    run = make_run(tmp_path / "seed_0", rows)
    out_json = tmp_path / "rows.json"
    assert main([str(run), "--json", str(out_json)]) == 0
    (row,) = json.loads(out_json.read_text())
    assert row["episodes"] == 7 and row["multi_turn"] == 5 and row["scored"] == 5
    assert (row["last_above_first"], row["last_below_first"], row["equal"]) == (3, 1, 1)
    assert row["mean_first"] == pytest.approx(1 / 5) and row["mean_last"] == pytest.approx(3 / 5)
    assert row["last_differs_from_logged"] == 1
    assert row["split_by"] == {"turn_chars": 6, "fence": 1}
    assert row["domain_token_share"] == pytest.approx(90 / 130)  # 6 x 10 + 30 code tokens of 130 train tokens
    later = 4 * len(RIGHT2) + 2 * len(WRONG2)
    first = 5 * len(WRONG) + 2 * len(RIGHT)
    assert row["later_turn_text_share"] == pytest.approx(later / (later + first))
    assert "| seed_0 | 7 | 5 | 3 | 1 | 1 | 0.200 | 0.600 | 1 |" in capsys.readouterr().out


def test_two_runs_add_an_all_row_and_keep_same_named_folders_apart(tmp_path, capsys):
    a = make_run(tmp_path / "a" / "seed_0", [record([WRONG, RIGHT2], 1.0)])
    b = make_run(tmp_path / "b" / "seed_0", [record([RIGHT, WRONG2], 0.0)])
    assert main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "| a/seed_0 | 1 | 1 | 1 | 0 |" in out and "| b/seed_0 | 1 | 1 | 0 | 1 |" in out
    assert "| all | 2 | 2 | 1 | 1 | 0 |" in out


def test_bad_input_names_the_file_and_the_cause(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere")]) == 2
    assert "no rollouts.jsonl" in capsys.readouterr().err
    bad = make_run(tmp_path / "bad", [record([WRONG, RIGHT2], 1.0), record([RIGHT, WRONG], 0.0) | {"turn_chars": [1]}])
    assert main([str(bad)]) == 2
    assert f"{bad / 'rollouts.jsonl'}:2: turn_chars [1] do not add up" in capsys.readouterr().err
    gone = make_run(tmp_path / "gone", [record([WRONG, RIGHT2], 1.0, task_id="code_ladder-train-nope-000")])
    assert main([str(gone)]) == 2
    assert "task 'code_ladder-train-nope-000' is in no training file" in capsys.readouterr().err
    assert main([]) == 2 and "no run folder given" in capsys.readouterr().err


def test_a_last_answer_that_opens_with_prose_is_scored_as_the_run_scored_it(tmp_path):
    """The task's prefill belongs to the first answer only: put before a later answer's prose it would break that
    answer's code block."""
    run = make_run(tmp_path / "seed_0", [record([WRONG, "Here is the fixed function:\n" + RIGHT2], 1.0)])
    out_json = tmp_path / "rows.json"
    assert main([str(run), "--json", str(out_json)]) == 0
    (row,) = json.loads(out_json.read_text())
    assert (row["last_above_first"], row["mean_last"], row["last_differs_from_logged"]) == (1, 1.0, 0)
