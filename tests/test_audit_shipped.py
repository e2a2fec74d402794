"""``jointrl audit`` on every shipped task file, through the recipe that trains on it.

Every reference solution must score 1, and every finding must be one of :data:`KNOWN_OPEN`: the
holes issue #39 names (items 1-4, fixed on other branches) and the env bugs the audit found,
each with its reason. A finding of any other (domain, strategy, kind) fails the test, so a
new hole or a regressed reference shows up here; when a fix lands, its entries are deleted (the
slow tests print the findings of each file). The fast tier audits the first task of each domain's
files; the whole files are slow.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from envs.sandbox import SandboxUnavailable, check_sandbox
from rl.cli.main import main

try:
    check_sandbox()
    _NO_SANDBOX = ""
except SandboxUnavailable as exc:  # pragma: no cover - CI installs bubblewrap
    _NO_SANDBOX = str(exc)
needs_sandbox = pytest.mark.skipif(bool(_NO_SANDBOX), reason=f"bubblewrap sandbox unavailable: {_NO_SANDBOX}")

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "recipes" / "data"

_CONSTS = ("int_0", "int_1", "int_-1", "float_0", "bool_true", "bool_false", "none", "str_empty")
_CONSTS += ("list_empty", "dict_empty", "tuple_empty")
KNOWN_OPEN: dict[tuple[str, str, str], str] = {
    ("code", "feedback_lookup", "above_baseline"): "#39 item 1: multi-turn feedback shows the scored tests' values",
    ("code", "example_echo", "above_baseline"): "#39 item 3: the prompt's example output earns its test",
    ("code", "example_lookup", "above_baseline"): "#39 item 3: the prompt's example output earns its test",
    ("code", "identity", "above_baseline"): "#39 item 3: echoing the input passes tests whose answer is the input",
    **{
        ("code", f"const_{c}", "above_baseline"): "#39 item 3: a constant passes boolean/small-range/edge tests"
        for c in _CONSTS
    },
    ("terminal", "noop", "noop_paid"): "#39 item 3: a no-op scores 0.09 on terminal-permissions-fix-tree",
    ("terminal", "kill_all", "above_baseline"): "#39 item 2: a process check cannot tell killing all from the one",
    ("terminal", "truncate_all", "above_baseline"): "#39 item 2: a reference kept in the work dir can be forged",
    ("terminal", "forge_hash_refs", "above_baseline"): "#39 item 2: a reference kept in the work dir can be forged",
    ("terminal", "delete_everything", "above_baseline"): "#39 item 3: removal sub-checks pay without the rest",
    ("terminal", "named_symlinks", "above_baseline"): "#39 item 3: symlinks pass 'is a file' checks",
    ("terminal", "named_files_rev_expr", "above_baseline"): "#39 item 3: a revision expression passes 'is a hash'",
    **{
        ("terminal", f"named_files_{c}", "above_baseline"): "#39 item 3: a constant in the named output earns the "
        "'file exists' sub-checks (0.33 on terminal_ladder backup_txt); named_files_empty also does the work of "
        "terminal_ladder touch_file (create an empty file), a finding by construction"
        for c in ("empty", "0", "1", "yes", "ok")
    },
    ("terminal", "enumerate", "above_baseline"): "#39 item 3: candidates in the named outputs earn sub-checks "
    "(0.5 on terminal_ladder two_counts, 0.33 on backup_txt)",
    ("terminal", "deeply_nested", "error"): "found by the audit: envs.terminal_git.find_git_dirs (os.walk) raises "
    "RecursionError on a directory tree 1,500 deep, so the episode raises instead of scoring",
    ("tool_call", "huge_int", "error"): "#39 item 4: a 400-digit integer argument makes ToolCallReward raise",
    ("tool_call", "enumerate", "above_baseline"): "#39 item 4: an answer listing many candidates scores",
    ("tool_call", "deeply_nested", "error"): "found by the audit: ToolCallEnv's call parsing (json) raises "
    "RecursionError on arguments nested 5,000 deep",
    ("tool_call", "const_empty", "above_baseline"): "found by the audit: an empty string where an optional "
    'parameter may be omitted ("" allowed) earns that argument\'s credit',
}

ANSWER_RECIPE = {
    "rollout": {
        "max_turns": 4,
        "envs": [{"domain": "tool_call", "cls": "envs.toolcall.ToolCallEnv", "kwargs": {"max_turns": 4}}],
    },
    "rewards": [
        {"cls": "rewards.toolcall.ToolCallReward", "domains": ["tool_call"]},
        {"cls": "rewards.toolcall.ToolAnswerReward", "domains": ["tool_call"]},
    ],
}

# (recipe, task file): each shipped file with the recipe that trains on it; toolcall_tasks (calls and
# answer mode) with a recipe that scores both modes (no shipped recipe trains on it).
SHIPPED = [
    *[("joint_rl.yaml", f"{d}_ladder.{s}.jsonl") for d in ("code", "terminal", "toolcall") for s in ("train", "eval")],
    *[("joint_rl_gpu.yaml", f"{d}.{s}.jsonl") for d in ("code_tasks", "terminal_tasks") for s in ("train", "eval")],
    *[("joint_rl_gpu.yaml", f"toolcall_quickstart.{s}.jsonl") for s in ("train", "eval")],
    ("joint_rl_gpu.yaml", "code_tasks.jsonl"),
    ("joint_rl_gpu.yaml", "terminal_tasks.jsonl"),
    *[("answer", f"toolcall_tasks{s}.jsonl") for s in ("", ".train", ".eval")],
]


def _audit(tmp_path: Path, capsys, recipe: str, task_file: str, *extra: str) -> dict:
    if recipe == "answer":
        path = tmp_path / "answer.yaml"
        path.write_text(yaml.safe_dump(ANSWER_RECIPE))
        recipe = str(path)
    else:
        recipe = str(REPO / "recipes" / recipe)
    out = tmp_path / "audit.json"
    rc = main(["audit", str(DATA / task_file), "--recipe", recipe, "--json", str(out), *extra])
    text = capsys.readouterr().out
    assert rc in (0, 1), text
    rep = json.loads(out.read_text())
    assert (rc == 1) == bool(rep["findings"]), text
    return rep


def _check(rep: dict) -> list[str]:
    """The findings outside KNOWN_OPEN (references below 1 are never known), as readable lines."""
    bad = []
    for f in rep["findings"]:
        if (f["domain"], f["strategy"], f["kind"]) not in KNOWN_OPEN:
            bad.append(f"{f['task_id']}: {f['strategy']} {f['kind']} reward={f['reward']} {f['detail'][:200]}")
    for t in rep["per_task"]:
        if t["reference_from"]:
            assert t["reference_reward"] == 1.0, (t["task_id"], t["reference_reward"])
    return bad


FAST = [
    ("joint_rl.yaml", "code_ladder.eval.jsonl"),
    ("joint_rl_gpu.yaml", "terminal_tasks.eval.jsonl"),
    ("joint_rl.yaml", "toolcall_ladder.eval.jsonl"),
    ("answer", "toolcall_tasks.eval.jsonl"),
]


@needs_sandbox
@pytest.mark.parametrize("recipe,task_file", FAST, ids=[f for _, f in FAST])
def test_the_first_shipped_task_of_each_domain_has_no_unknown_finding(tmp_path, capsys, recipe, task_file):
    rep = _audit(tmp_path, capsys, recipe, task_file, "--limit", "1")
    assert rep["tasks"] == 1
    assert _check(rep) == []


@pytest.mark.slow
@needs_sandbox
@pytest.mark.parametrize("recipe,task_file", SHIPPED, ids=[f for _, f in SHIPPED])
def test_every_shipped_task_file_has_no_unknown_finding(tmp_path, capsys, recipe, task_file):
    rep = _audit(tmp_path, capsys, recipe, task_file)
    with capsys.disabled():
        print(f"\n{task_file}: {rep['flagged_tasks']} of {rep['tasks']} tasks flagged")
        for f in rep["findings"]:
            print(f"  {f['task_id']} {f['strategy']} {f['kind']} {f['reward']}")
    assert _check(rep) == []


def test_the_shipped_list_names_every_shipped_task_file():
    assert sorted(f for _, f in SHIPPED) == sorted(p.name for p in DATA.glob("*.jsonl"))
