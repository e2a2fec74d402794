"""``jointrl audit``: work-free strategies against deliberately broken and clean tasks, plug-ins, bad input.

Every broken task here is broken in one named way (a reference that fails, a check a no-op
passes, a check that reads its reference from the work dir, an answer reward that any listed
number satisfies); the audit must exit 1 and name the task and the strategy. The clean sets
must exit 0 under the strategies named in each test.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from envs.io import save_tasks
from envs.sandbox import SandboxUnavailable, check_sandbox
from envs.types import CodeSpec, ExpectedCall, Message, Task, TerminalSpec, ToolCallSpec
from rl.cli.audit import sources, strategies
from rl.cli.audit.runner import run_episode
from rl.cli.audit.strategies import Turn, code_answer, named_paths, prompt_examples
from rl.cli.main import main

try:
    check_sandbox()
    _NO_SANDBOX = ""
except SandboxUnavailable as exc:  # pragma: no cover - CI installs bubblewrap
    _NO_SANDBOX = str(exc)
needs_sandbox = pytest.mark.skipif(bool(_NO_SANDBOX), reason=f"bubblewrap sandbox unavailable: {_NO_SANDBOX}")

USER_SYS = Message("system", "Answer the task.")


def _recipe(tmp_path: Path, envs: list[dict], rewards: list[dict], max_turns: int = 3, name: str = "audit") -> Path:
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump({"rollout": {"max_turns": max_turns, "envs": envs}, "rewards": rewards}))
    return p


CODE_ENV = {"domain": "code", "cls": "envs.code.CodeEnv", "kwargs": {"max_turns": 1}}
CODE_REWARD = {"cls": "rewards.code.CodeTestsReward", "domains": ["code"], "kwargs": {"mode": "fraction"}}
TERM_ENV = {"domain": "terminal", "cls": "envs.terminal.TerminalEnv", "kwargs": {"max_turns": 3}}
TERM_REWARD = {"cls": "rewards.terminal.TerminalCheckReward", "domains": ["terminal"]}
TOOL_ENV = {"domain": "tool_call", "cls": "envs.toolcall.ToolCallEnv", "kwargs": {"max_turns": 3}}


def code_task(tid: str, solution: str, prompt: str = "Write `interleave(a, b)`: merge two lists alternately.") -> Task:
    tests = (
        "assert interleave([1, 2], ['a', 'b']) == [1, 'a', 2, 'b']\n"
        "assert interleave([], [5]) == [5]\n"
        "assert interleave([7, 8, 9], [0]) == [7, 0, 8, 9]\n"
        "assert interleave(['x'], ['y', 'z', 'w']) == ['x', 'y', 'z', 'w']\n"
        "assert interleave([True], [None]) == [True, None]\n"
    )
    spec = CodeSpec(tests=tests, entry_point="interleave", solution=solution)
    return Task(tid, "code", (USER_SYS, Message("user", prompt)), code=spec)


GOOD_INTERLEAVE = (
    "def interleave(a, b):\n    out = []\n    for i in range(max(len(a), len(b))):\n"
    "        out += a[i:i + 1] + b[i:i + 1]\n    return out\n"
)


def term_task(tid: str, prompt: str, setup: str, check: str, solution: str) -> Task:
    return Task(
        tid, "terminal", (USER_SYS, Message("user", prompt)), terminal=TerminalSpec(setup, check, solution, 30.0)
    )


def run_audit(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["audit", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _save(tmp_path: Path, name: str, tasks: list[Task]) -> str:
    p = tmp_path / name
    save_tasks(tasks, p)
    return str(p)


# ---------------------------------------------------------------------------- broken tasks -> exit 1


@needs_sandbox
def test_a_reference_that_fails_is_flagged_by_name(tmp_path, capsys):
    bad = code_task("code-bad-reference", "def interleave(a, b):\n    return a + b\n")
    good = code_task("code-good-reference", GOOD_INTERLEAVE)
    tasks = _save(tmp_path, "t.jsonl", [bad, good])
    recipe = _recipe(tmp_path, [CODE_ENV], [CODE_REWARD])
    rc, out, _ = run_audit(
        capsys, tasks, "--recipe", str(recipe), "--strategies", "noop", "--json", f"{tmp_path}/r.json"
    )
    assert rc == 1, out
    row = next(line for line in out.splitlines() if line.startswith("code-bad-reference"))
    # a + b passes 3 of 5 tests; the constant [5] (a value the tests compare against) passes 1, and
    # the code reward pays only passes above that (envs/code_baseline.py): (3 - 1) / (5 - 1).
    assert "reference=0.50" in row
    assert "1 references below 1" in out
    rep = json.loads((tmp_path / "r.json").read_text())
    assert [(f["task_id"], f["kind"]) for f in rep["findings"]] == [("code-bad-reference", "reference_below_1")]
    good_row = next(r for r in rep["per_task"] if r["task_id"] == "code-good-reference")
    assert good_row["reference_reward"] == 1.0 and good_row["findings"] == []


@needs_sandbox
def test_a_check_that_a_noop_passes_is_flagged(tmp_path, capsys):
    lax = term_task(
        "term-noop-passes",
        "Write the word `hello` into `greeting.txt`.",
        "true",
        "[ ! -e greeting.txt ] || grep -qx hello greeting.txt",  # a missing file passes
        "echo hello > greeting.txt",
    )
    half = term_task(
        "term-noop-half",
        "Create `a.txt` and delete `old.txt`.",
        "echo x > old.txt",
        'n=0; [ -f a.txt ] && n=$((n+1)); [ -e old.txt ] || n=$((n+1)); [ $n = 2 ] && exit 0; echo "0.$((n*5))"; exit 1',
        "touch a.txt; rm old.txt",
    )
    tasks = _save(tmp_path, "t.jsonl", [lax, half])
    recipe = _recipe(tmp_path, [TERM_ENV], [TERM_REWARD])
    rc, out, _ = run_audit(capsys, tasks, "--recipe", str(recipe), "--strategies", "delete_everything")
    assert rc == 1, out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("term-")}
    assert "noop=1.00" in lines["term-noop-passes"]
    # The no-op earns nothing here, but deleting everything earns the "old file gone" half.
    assert "noop=" not in lines["term-noop-half"] and "delete_everything=0.50" in lines["term-noop-half"]


@needs_sandbox
def test_a_strategy_a_task_declares_to_do_its_work_is_excused_and_nothing_else(tmp_path, capsys):
    """ "Create an empty file" is done by writing an empty file into every named path; the task that
    declares so has that result excused (listed with its reason), while the same task without the
    declaration is flagged, and the declaration excuses neither another strategy nor a paid no-op."""
    why = "creating the empty file is the task"
    touch = "Create an empty file named `notes.cfg`."
    check = "[ -f notes.cfg ] && [ ! -L notes.cfg ] && [ ! -s notes.cfg ]"
    declared = term_task("term-touch-declared", touch, "true", check, "touch notes.cfg")
    declared = dataclasses.replace(declared, meta={"audit_does_the_work": {"named_files_empty": why}})
    undeclared = term_task("term-touch-undeclared", touch, "true", check, "touch notes.cfg")
    # Declares named_files_empty, but the no-op passes its lax check: still flagged.
    lax = term_task("term-lax-declared", touch, "true", "[ ! -s notes.cfg ]", "touch notes.cfg")
    lax = dataclasses.replace(lax, meta={"audit_does_the_work": {"named_files_empty": why}})
    tasks = _save(tmp_path, "t.jsonl", [declared, undeclared, lax])
    recipe = _recipe(tmp_path, [TERM_ENV], [TERM_REWARD])
    argv = (tasks, "--recipe", str(recipe), "--strategies", "named_files_empty,named_files_ok")
    rc, out, _ = run_audit(capsys, *argv, "--json", f"{tmp_path}/r.json")
    assert rc == 1, out
    rep = json.loads((tmp_path / "r.json").read_text())
    found = {(f["task_id"], f["strategy"], f["kind"]) for f in rep["findings"]}
    assert ("term-touch-declared", "named_files_empty", "above_baseline") not in found
    assert ("term-touch-undeclared", "named_files_empty", "above_baseline") in found
    assert ("term-lax-declared", "noop", "noop_paid") in found
    assert [(f["task_id"], f["strategy"], f["detail"]) for f in rep["excused"]] == [
        ("term-touch-declared", "named_files_empty", f"declared: {why}")
    ]
    row = next(line for line in out.splitlines() if line.startswith("term-touch-declared"))
    assert "(named_files_empty=1.00 excused: does the work)" in row
    assert "1 excused" in out
    # The declared task alone audits clean.
    alone = _save(tmp_path, "alone.jsonl", [declared])
    rc, out, _ = run_audit(capsys, alone, "--recipe", str(recipe), "--strategies", "named_files_empty,named_files_ok")
    assert rc == 0, out


@needs_sandbox
def test_a_check_that_reads_its_reference_from_the_work_dir_is_forged(tmp_path, capsys):
    forged = term_task(
        "term-reference-in-work-dir",
        "Compute 6 * 7 and write the result into `answer.txt`.",
        "echo 42 > .expected",
        '[ "$(cat answer.txt 2>/dev/null)" = "$(cat .expected)" ]',
        "echo 42 > answer.txt",
    )
    tasks = _save(tmp_path, "t.jsonl", [forged])
    recipe = _recipe(tmp_path, [TERM_ENV], [TERM_REWARD])
    rc, out, _ = run_audit(capsys, tasks, "--recipe", str(recipe), "--strategies", "truncate_all,named_files_empty")
    assert rc == 1, out
    row = next(line for line in out.splitlines() if line.startswith("term-reference-in-work-dir"))
    assert "truncate_all=1.00" in row and "named_files_empty" not in row
    assert " 1.00  0.00" in row  # reference 1, baseline 0


@needs_sandbox
def test_a_hash_reference_kept_in_the_work_dir_is_forged(tmp_path, capsys):
    task = term_task(
        "term-hash-in-work-dir",
        "Write the lines of `in.txt` in reverse order into `out.txt`.",
        "printf 'a\\nb\\n' > in.txt; printf 'b\\na\\n' | sha256sum | cut -c1-64 > .ref",
        '[ -f out.txt ] && [ "$(sha256sum < out.txt | cut -c1-64)" = "$(cat .ref)" ]',
        "tac in.txt > out.txt",
    )
    tasks = _save(tmp_path, "t.jsonl", [task])
    recipe = _recipe(tmp_path, [TERM_ENV], [TERM_REWARD])
    rc, out, _ = run_audit(capsys, tasks, "--recipe", str(recipe), "--strategies", "forge_hash_refs,truncate_all")
    assert rc == 1, out
    row = next(line for line in out.splitlines() if line.startswith("term-hash-in-work-dir"))
    # An empty out.txt hashes as empty input; the forged reference now says exactly that.
    assert row.split()[2:] == ["1.00", "0.00", "forge_hash_refs=1.00"]


LENIENT = '''
import re
from envs.types import Trajectory


class AnyNumberAnswer:
    """Pays when ANY number of the final answer equals the task's answer (a deliberately lax reward)."""

    name = "any_number"
    domains = ("tool_call",)

    def __call__(self, traj: Trajectory):
        spec = traj.task.tool_call
        if spec is None or spec.mode != "answer":
            return None
        last = [m.content for m in traj.messages[len(traj.task.messages):] if m.role == "assistant"][-1]
        want = float(spec.answer[0])
        return 1.0 if any(abs(float(x) - want) < 1e-9 for x in re.findall(r"-?\\d+(?:\\.\\d+)?", last)) else 0.0
'''


def _answer_task(tid: str, answer: str) -> Task:
    tools = ({"name": "lookup_user", "parameters": {"type": "object", "properties": {"user_id": {"type": "integer"}}}},)
    spec = ToolCallSpec(tools=tools, expected=(), mode="answer", answer=(answer,), state={})
    return Task(
        tid, "tool_call", (USER_SYS, Message("user", "How old is user 42? Answer with a number.")), tool_call=spec
    )


def test_a_tool_task_where_enumerating_candidates_pays_is_flagged(tmp_path, capsys, monkeypatch):
    (tmp_path / "lax_reward.py").write_text(LENIENT)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("lax_reward", None)
    tasks = _save(tmp_path, "t.jsonl", [_answer_task("tool-enumerable", "37")])
    recipe = _recipe(tmp_path, [TOOL_ENV], [{"cls": "lax_reward.AnyNumberAnswer", "domains": ["tool_call"]}])
    rc, out, _ = run_audit(capsys, tasks, "--recipe", str(recipe), "--json", f"{tmp_path}/r.json")
    assert rc == 1, out
    rep = json.loads((tmp_path / "r.json").read_text())
    hits = {(f["task_id"], f["strategy"], f["kind"], f["reward"]) for f in rep["findings"]}
    assert ("tool-enumerable", "enumerate", "above_baseline", 1.0) in hits
    row = rep["per_task"][0]
    assert row["baseline"] == 0.0 and row["reference_reward"] is None  # answer-mode tasks carry no reference


RAISING = """
class RaisesOnLongAnswers:
    name = "fragile"
    domains = ("tool_call",)

    def __call__(self, traj):
        if len(traj.completion) > 100_000:
            raise OverflowError("answer too long for this reward")
        return 0.0
"""


def test_a_reward_that_raises_on_an_answer_is_flagged_as_an_error(tmp_path, capsys, monkeypatch):
    (tmp_path / "fragile_reward.py").write_text(RAISING)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("fragile_reward", None)
    tasks = _save(tmp_path, "t.jsonl", [_answer_task("tool-fragile", "37")])
    recipe = _recipe(tmp_path, [TOOL_ENV], [{"cls": "fragile_reward.RaisesOnLongAnswers", "domains": ["tool_call"]}])
    rc, out, _ = run_audit(capsys, tasks, "--recipe", str(recipe), "--strategies", "oversized,const_0")
    assert rc == 1, out
    assert "oversized=ERROR" in out and "const_0" not in out.split("\n")[1]
    assert (
        "oversized: reward: fragile raised OverflowError: answer too long for this reward (1 tasks: tool-fragile)"
        in out
    )


# ---------------------------------------------------------------------------- clean sets -> exit 0


@needs_sandbox
def test_a_clean_code_task_passes_the_whole_catalogue(tmp_path, capsys):
    tasks = _save(tmp_path, "t.jsonl", [code_task("code-clean", GOOD_INTERLEAVE)])
    recipe = _recipe(tmp_path, [CODE_ENV], [CODE_REWARD])
    rc, out, _ = run_audit(capsys, tasks, "--recipe", str(recipe), "--json", f"{tmp_path}/r.json")
    assert rc == 0, out
    rep = json.loads((tmp_path / "r.json").read_text())
    row = rep["per_task"][0]
    assert row["reference_reward"] == 1.0 and row["baseline"] == 0.0
    played = {r["strategy"] for r in row["results"]}
    # example_echo/example_lookup have no example in this prompt to echo: they do not play.
    assert played == set(strategies.STRATEGIES["code"]) - {"example_echo", "example_lookup"}
    assert all(r["reward"] == 0.0 for r in row["results"]), row["results"]


@needs_sandbox
def test_clean_terminal_and_tool_tasks_pass_the_catalogue(tmp_path, capsys):
    term = term_task(
        "term-clean",
        "Write the sum of the numbers in `nums.txt` into `sum.txt`.",
        "printf '3\\n9\\n30\\n' > nums.txt",
        '[ -f sum.txt ] && [ ! -L sum.txt ] && [ "$(tr -d "[:space:]" < sum.txt)" = 42 ] && [ "$(wc -l < nums.txt)" = 3 ]',
        "awk '{s+=$1} END {print s}' nums.txt > sum.txt",
    )
    tools = ({"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},)
    tool = Task(
        "tool-clean",
        "tool_call",
        (USER_SYS, Message("user", "What is the weather in Oslo?")),
        tool_call=ToolCallSpec(tools=tools, expected=(ExpectedCall("get_weather", {"city": ["Oslo"]}),)),
    )
    tasks = _save(tmp_path, "t.jsonl", [term, tool])
    recipe = _recipe(
        tmp_path,
        [TERM_ENV, {**TOOL_ENV, "kwargs": {"max_turns": 1}}],
        [TERM_REWARD, {"cls": "rewards.toolcall.ToolCallReward", "domains": ["tool_call"]}],
    )
    # The whole catalogue: the 400-digit and 5,000-deep arguments and the 1,500-deep directory tree
    # that made ToolCallReward, ToolCallEnv and the git vetting raise (#38, #39 item 4) now score.
    names = {n for d in ("terminal", "tool_call") for n in strategies.STRATEGIES[d]}
    rc, out, _ = run_audit(capsys, tasks, "--recipe", str(recipe), "--strategies", ",".join(sorted(names)))
    assert rc == 0, out
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:3]}
    assert rows["term-clean"][2:4] == ["1.00", "0.00"]
    assert rows["tool-clean"][2:4] == ["1.00", "0.50"]  # format + name credit of the right-shaped wrong call


# ---------------------------------------------------------------------------- plug-ins


ARITH = """
import re
from envs.types import Message, Task


class ArithEnv:
    def reset(self, task):
        self.done = False
        return list(task.messages)

    def step(self, action):
        if self.done:
            raise RuntimeError("episode ended")
        self.done = True
        return [], True, False, {}

    def close(self):
        self.done = True


class LastNumberReward:
    name = "arith"
    domains = ("arith",)

    def __call__(self, traj):
        nums = re.findall(r"-?\\d+", traj.completion)
        return 1.0 if nums and int(nums[-1]) == traj.task.meta["answer"] else 0.0
"""


class ArithSource:
    """A task source for ``*.arith`` files: one ``a+b`` question per line; the reference is the sum."""

    name = "arith-test"

    def accepts(self, path: Path) -> bool:
        return path.suffix == ".arith"

    def load(self, path: Path, done_marker: str) -> list[sources.AuditTask]:
        out = []
        for i, line in enumerate(path.read_text().split()):
            a, b = map(int, line.split("+"))
            t = Task(f"arith-{i}", "arith", (Message("user", f"What is {line}?"),), meta={"answer": a + b})
            out.append(sources.AuditTask(t, (str(a + b),), "sum", str(path)))
        return out


def test_a_registered_source_and_strategy_audit_a_users_domain(tmp_path, capsys, monkeypatch):
    (tmp_path / "arith_mod.py").write_text(ARITH)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("arith_mod", None)
    monkeypatch.setitem(sources.SOURCES, "arith-test", ArithSource())
    (tmp_path / "q.arith").write_text("0+1\n40+2\n")
    recipe = _recipe(
        tmp_path,
        [{"domain": "arith", "cls": "arith_mod.ArithEnv"}],
        [{"cls": "arith_mod.LastNumberReward", "domains": ["arith"]}],
    )
    # Generic text strategies play a domain without its own: "1" answers 0+1 right by luck, and is flagged.
    rc, out, _ = run_audit(capsys, str(tmp_path / "q.arith"), "--recipe", str(recipe))
    assert rc == 1, out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("arith-")}
    assert "const_1=1.00" in rows["arith-0"] and rows["arith-0"].split()[2] == "1.00"
    assert rows["arith-1"].split()[2:5] == ["1.00", "0.00", "-"]
    # A strategy registered for the domain replaces the generic catalogue there.
    monkeypatch.setitem(strategies.STRATEGIES, "arith", {})
    strategies.register_strategy("arith", "noop", "nothing", "noop")(lambda t: "" if t.turn == 1 else None)
    strategies.register_strategy("arith", "answer_42", "always 42")(lambda t: "42" if t.turn == 1 else None)
    rc, out, _ = run_audit(capsys, str(tmp_path / "q.arith"), "--recipe", str(recipe))
    assert rc == 1
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("arith-")}
    assert rows["arith-0"].split()[-1] == "-" and "answer_42=1.00" in rows["arith-1"]


def test_a_source_must_implement_the_protocol():
    with pytest.raises(TypeError, match="not a TaskSource"):
        sources.register_source(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="role"):
        strategies.register_strategy("code", "x", "doc", role="sneaky")


# ---------------------------------------------------------------------------- strategies, episodes


def test_examples_are_read_off_backticks_asserts_and_doctests():
    t = Task(
        "t",
        "code",
        (Message("user", "Write `f(x)`. Example: `f(2) == 4` and `f('a') == 'aa'`; not `g(1) == 1`."),),
        code=CodeSpec(
            tests="assert f(1) == 2\n",
            entry_point="f",
            prompt_code='def f(x):\n    """\n    >>> f(3)\n    6\n    """\n',
        ),
    )
    assert prompt_examples(t) == [([2], 4), (["a"], "aa"), ([3], 6)]
    assert ([10], 20) in prompt_examples(t, ("Failed test:\nassert f(10) == 20\n  got None",))


def test_code_answers_continue_a_def_prefill_and_otherwise_come_in_a_last_block():
    from envs.code import extract_code

    spec = CodeSpec(tests="assert f(1) == 1\n", entry_point="f")
    pre = Task("t", "code", (Message("user", "x"),), prefill="```python\ndef f(x: int) -> int:", code=spec)
    text = code_answer(pre, "return _args[0]")
    assert text.startswith(pre.prefill)
    ns: dict = {}
    exec(extract_code(text, "", "f"), ns)  # noqa: S102 - our own generated code
    assert ns["f"](5) == 5
    other = Task("t", "code", (Message("user", "x"),), prefill="<think>", code=spec)
    ns = {}
    exec(extract_code(code_answer(other, "return len(_args)"), "", "f"), ns)  # noqa: S102
    assert ns["f"](1, 2) == 2


class _FeedbackEnv:
    """A two-turn env that quotes a failing assert after turn 1, and records what it was sent."""

    def __init__(self):
        self.actions: list[str] = []
        self.finalized = False

    def reset(self, task):
        return list(task.messages)

    def step(self, action):
        self.actions.append(action)
        if len(self.actions) == 1:
            return [Message("user", "Failed test:\nassert f(10) == 'ten'\n")], False, False, {"reward": 0.0}
        return [], False, False, {"reward": 0.5}

    def finalize(self):
        self.finalized = True
        return {"reward": 0.25}

    def close(self):
        pass


def test_feedback_lookup_builds_its_table_from_the_feedback_and_the_runner_finalizes_cut_episodes():
    spec = CodeSpec(tests="assert f(10) == 'ten'\n", entry_point="f")
    task = Task("t", "code", (Message("user", "Write `f(n)`."),), prefill="```python\ndef f(n):", code=spec)
    env = _FeedbackEnv()
    traj = run_episode(env, task, strategies.STRATEGIES["code"]["feedback_lookup"].act, max_turns=2)
    assert env.actions[0].startswith(task.prefill) and "NotImplementedError" in env.actions[0]
    assert "{'(10,)': 'ten'}" in env.actions[1]
    # The env had not ended the episode at the turn cap: truncated, finalize's reward is the env reward.
    assert env.finalized and traj.truncated and traj.env_reward == 0.25 and traj.num_turns == 2


def test_terminal_strategies_name_the_prompts_paths_and_end_with_the_done_marker():
    task = term_task("t", "Move `a/b.txt` to `out/` and write `count.txt`; run `ls -la`.", "true", "true", "")
    assert named_paths(task) == ["a/b.txt", "out", "count.txt"]
    act = strategies.STRATEGIES["terminal"]["named_files_0"].act
    first = act(Turn(task, (), 1, "FIN"))
    assert first.startswith("```bash\n") and "count.txt" in first
    assert act(Turn(task, (), 2, "FIN")) == "FIN" and act(Turn(task, (), 3, "FIN")) is None


def test_terminal_turns_continue_a_shell_prefill():
    from envs.terminal import parse_action

    def task(prefill: str) -> Task:
        return Task("t", "terminal", (Message("user", "x"),), prefill=prefill, terminal=TerminalSpec("true", "true"))

    at_line = strategies.terminal_turns(task("```bash\n"), ["ls", "pwd"], "DONE")
    assert at_line == ["```bash\nls\n```", "```bash\npwd\n```", "DONE"]
    assert strategies.terminal_turns(task("```bash\n"), [], "DONE") == ["```bash\nDONE\n```"]
    assert parse_action("```bash\nDONE\n```")[0] == "done"
    mid = strategies.terminal_turns(task("```bash\necho 7 >"), ["ls"], "DONE")
    assert mid == ["```bash\necho 7 >\n```", "```bash\nls\n```", "DONE"]
    assert strategies.terminal_turns(task(""), ["ls"], "FIN") == ["```bash\nls\n```", "FIN"]


# ---------------------------------------------------------------------------- bad input -> exit 2


def test_bad_input_exits_2_naming_the_problem(tmp_path, capsys):
    recipe = _recipe(tmp_path, [TOOL_ENV], [{"cls": "rewards.toolcall.ToolCallReward", "domains": ["tool_call"]}])
    tasks = _save(tmp_path, "t.jsonl", [_answer_task("a", "1")])
    cases = [
        ([tasks], "--recipe is required"),
        ([str(tmp_path / "missing.jsonl"), "--recipe", str(recipe)], "missing.jsonl"),
        ([tasks, "--recipe", str(tmp_path / "nope.yaml")], "nope.yaml"),
        ([tasks, "--recipe", str(recipe), "--format", "harbor-x"], "unknown task format 'harbor-x'"),
        ([tasks, "--recipe", str(recipe), "--strategies", "noop,teleport"], "--strategies: unknown teleport"),
        ([tasks, "--recipe", str(recipe), "--workers", "0"], "--workers must be >= 1"),
        ([str(tmp_path / "t.txt"), "--recipe", str(recipe)], "no task source reads this file"),
    ]
    (tmp_path / "t.txt").write_text("x")
    for argv, msg in cases:
        rc, _, err = run_audit(capsys, *argv)
        assert rc == 2 and msg in err, (argv, err)
    code = _save(tmp_path, "c.jsonl", [code_task("code-x", GOOD_INTERLEAVE)])
    rc, _, err = run_audit(capsys, code, "--recipe", str(recipe))
    assert rc == 2 and "task 'code-x' has domain 'code'" in err and "c.jsonl" in err
    broken = _recipe(
        tmp_path,
        [{**TOOL_ENV, "kwargs": {"max_turns": 0}}],
        [{"cls": "rewards.toolcall.ToolCallReward"}],
        name="broken",
    )
    rc, _, err = run_audit(capsys, tasks, "--recipe", str(broken))
    assert rc == 2 and "rollout.envs.0: cannot construct envs.toolcall.ToolCallEnv" in err
    for declared, field in [
        ({"teleport": "x"}, "meta.audit_does_the_work.teleport: not an attack strategy of domain 'tool_call'"),
        ({"noop": "x"}, "meta.audit_does_the_work.noop: not an attack strategy"),
        ({"const_0": " "}, "meta.audit_does_the_work.const_0: the reason must be a non-empty string"),
        (["const_0"], "meta.audit_does_the_work must map strategy names"),
    ]:
        t = dataclasses.replace(_answer_task("decl", "1"), meta={"audit_does_the_work": declared})
        rc, _, err = run_audit(capsys, _save(tmp_path, "d.jsonl", [t]), "--recipe", str(recipe))
        assert rc == 2 and "task 'decl'" in err and field in err and "d.jsonl" in err, err
    bad_line = tmp_path / "bad.jsonl"
    bad_line.write_text('{"id": "x", "domain": "tool_call"}\n')
    rc, _, err = run_audit(capsys, str(bad_line), "--recipe", str(recipe))
    assert rc == 2 and "bad.jsonl:1" in err


def test_list_shows_sources_and_every_domains_strategies(capsys):
    rc, out, _ = run_audit(capsys, "--list")
    assert rc == 0
    assert "native" in out and "humaneval" in out
    for domain in ("code", "terminal", "tool_call", "*"):
        for name in strategies.STRATEGIES[domain]:
            assert f"{domain:10} {name}" in out


def test_every_domain_has_a_noop_and_a_wrong_answer():
    for domain, table in strategies.STRATEGIES.items():
        roles = [s.role for s in table.values()]
        assert roles.count("noop") == 1 and roles.count("wrong") == 1, domain
    assert textwrap.dedent(strategies.__doc__ or "").strip()


@needs_sandbox
def test_humaneval_files_are_read_by_their_source_with_the_canonical_solution_as_reference(tmp_path, capsys):
    data = Path(__file__).resolve().parent / "data" / "HumanEval.jsonl.gz"
    recipe = _recipe(tmp_path, [CODE_ENV], [CODE_REWARD])
    argv = [str(data), "--recipe", str(recipe), "--format", "humaneval", "--limit", "2", "--strategies", "example_echo"]
    rc, out, _ = run_audit(capsys, *argv, "--json", f"{tmp_path}/r.json")
    rep = json.loads((tmp_path / "r.json").read_text())
    assert [t["task_id"] for t in rep["per_task"]] == ["HumanEval/0", "HumanEval/1"]
    assert all(t["reference_from"] == "solution" and t["reference_reward"] == 1.0 for t in rep["per_task"])
    # HumanEval/0's docstring shows `has_close_elements(...)` -> False, and the audit echoes it; its check(candidate)
    # is one test with mixed True/False asserts, all or nothing, so the echo earns 0.
    echo = next(r for r in rep["per_task"][0]["results"] if r["strategy"] == "example_echo")
    assert echo["reward"] == 0.0 and echo["turns"] == 1 and rc == 0, out
