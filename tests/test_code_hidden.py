"""Code rewards a policy cannot game: hidden tests, value-free feedback, honest partial credit.

Every attack is a WRONG answer (it does not compute the function) sent through the real reward
path: :class:`envs.code.CodeEnv` (multi-turn, as both joint recipes run it) and
:class:`rewards.code.CodeTestsReward` on its own. The baseline is the score of a plainly wrong
answer (``return None``): 0. Each attack must score no more; each reference solution 1.0.
The shipped task files are checked in-process (they are our own, trusted): the best constant
answer scores 0 on every shipped code task, and no scored test is the prompt's example.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from envs.code import (
    CodeEnv,
    TestOutcome,
    code_sandboxes,
    hidden_tests_problem,
    partial_credit,
    run_tests,
    test_plan,
)
from envs.code_baseline import trivial_passes
from envs.io import load_tasks, save_tasks, task_from_dict, task_to_dict
from envs.sandbox import SandboxUnavailable, check_sandbox
from envs.types import CodeSpec, Message, Task
from rewards.code import CodeTestsReward
from trajs import answered

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "recipes" / "data"
SHIPPED = sorted(DATA.glob("code_*.jsonl"))

try:
    check_sandbox()
    _NO_SANDBOX = ""
except SandboxUnavailable as exc:  # pragma: no cover - CI installs bubblewrap
    _NO_SANDBOX = str(exc)
needs_sandbox = pytest.mark.skipif(bool(_NO_SANDBOX), reason=f"bubblewrap sandbox unavailable: {_NO_SANDBOX}")


def _shipped() -> list[Task]:
    return [t for f in SHIPPED for t in load_tasks(f) if t.code is not None]


def _pick(path: str, ids: tuple[str, ...]) -> list[Task]:
    by_template: dict[str, Task] = {}
    for t in load_tasks(DATA / path):
        by_template.setdefault(t.meta.get("template", t.id), t)
    return [by_template[i] for i in ids]


# Ladder tasks (train and held out) of several value types, and hand-written boolean ones.
LADDER = _pick("code_ladder.train.jsonl", ("times_const", "count_char", "rle")) + _pick(
    "code_ladder.eval.jsonl", ("count_below", "square_plus", "word_lengths_sorted")
)
BOOLEAN = [t for t in load_tasks(DATA / "code_tasks.jsonl") if t.id.split("-", 2)[2] in ("is_palindrome", "is_anagram")]


def fenced(code: str) -> str:
    return f"```python\n{code}```"


def _calls_with_values(text: str, name: str) -> dict[str, str]:
    """``{args source: value source}`` of every ``name(ARGS) == VALUE`` the text quotes: the
    prompt's example (between backticks), each test line the feedback quotes, and the
    got / expected pairs under them (the expected value wins)."""
    table = {}
    call = rf"{re.escape(name)}\(([^`\n]*)\) == "
    for m in re.finditer(rf"`{call}([^`\n]*)`", text):
        table[m.group(1)] = m.group(2)
    for m in re.finditer(rf"^assert {call}(.*)$", text, re.MULTILINE):
        table[m.group(1)] = m.group(2)
    for m in re.finditer(rf"^assert {call}.*\ngot: .*\nexpected: (.*)$", text, re.MULTILINE):
        table[m.group(1)] = m.group(2)
    return table


def _lookup_answer(name: str, table: dict[str, str], fallback: str = "None") -> str:
    """A wrong answer: a lookup table of the (args -> value) pairs it was shown, else ``fallback``."""
    rows = "".join(f"    repr(({args},)): {value},\n" for args, value in table.items())
    return f"TABLE = {{\n{rows}}}\n\ndef {name}(*args):\n    return TABLE.get(repr(args), {fallback})\n"


# ---------------------------------------------------------------------------- the split itself


def test_plan_puts_public_tests_first_and_scores_only_the_hidden_ones():
    spec = CodeSpec(
        public_tests="assert f(1) == 2\n", tests="x = 3\nassert f(x) == 6\nassert f(0) == 0\n", entry_point="f"
    )
    plan = test_plan(spec)
    assert plan.source.startswith("assert f(1) == 2\n") and plan.public == 1 and plan.hidden_from == 1
    assert plan.test_idx == (0, 2, 3) and plan.scored == (2, 3) and plan.has_hidden
    # Files written before the split: every test hidden and scored.
    old = test_plan(CodeSpec(tests="assert f(1) == 2\nassert f(2) == 4\n", entry_point="f"))
    assert (old.public, old.scored, old.has_hidden) == (0, (0, 1), True)
    # Only public tests: scored on them (no hidden tests), which recipes refuse.
    only = CodeSpec(public_tests="assert f(1) == 2\n", tests="", entry_point="f")
    assert test_plan(only).scored == (0,) and not test_plan(only).has_hidden
    assert "no hidden tests" in hidden_tests_problem(only) and hidden_tests_problem(spec) is None
    with pytest.raises(ValueError, match="public tests do not parse"):
        test_plan(CodeSpec(public_tests="assert f(1 ==\n", tests="assert f(1) == 2\n", entry_point="f"))


def test_old_task_files_load_with_every_test_hidden(tmp_path):
    """A record without ``public_tests`` (written before the split) loads as all-hidden, and
    a task without public tests writes no ``public_tests`` key (old files round-trip byte for byte)."""
    rec = {
        "id": "old",
        "domain": "code",
        "messages": [{"role": "user", "content": "Write f."}],
        "code": {
            "tests": "assert f(1) == 2\n",
            "entry_point": "f",
            "prompt_code": "",
            "style": "assert",
            "solution": "",
            "timeout_s": 10.0,
        },
    }
    task = task_from_dict(rec)
    assert task.code.public_tests == "" and test_plan(task.code).public == 0
    assert task_to_dict(task) == rec
    split = Task(
        id="new",
        domain="code",
        messages=task.messages,
        code=CodeSpec(tests="assert f(2) == 4\n", public_tests="assert f(1) == 2\n", entry_point="f"),
    )
    save_tasks([split], tmp_path / "t.jsonl")
    assert load_tasks(tmp_path / "t.jsonl") == [split]
    assert json.loads((tmp_path / "t.jsonl").read_text())["code"]["public_tests"] == "assert f(1) == 2\n"


@pytest.mark.parametrize(
    ("passed", "total", "baseline", "score"),
    [
        (4, 4, 1, 1.0),
        (1, 4, 1, 0.0),
        (0, 4, 1, 0.0),
        (3, 4, 1, 2 / 3),
        (3, 5, 2, 1 / 3),
        (2, 2, 2, 0.0),
        (0, 0, 0, 0.0),
    ],
)
def test_partial_credit_pays_only_above_the_trivial_baseline(passed, total, baseline, score):
    assert partial_credit(passed, total, baseline) == pytest.approx(score)
    assert TestOutcome(passed, total, "", False, "", baseline=baseline).score == pytest.approx(score)


def test_trivial_passes_counts_constants_echoes_and_targets():
    booleans = "assert f(1) == True\nassert f(2) == False\nassert f(3) == True\nassert f(4) == True\n"
    assert trivial_passes(booleans, [0, 1, 2, 3], ["f"]) == 3  # return True
    echo = "assert f([]) == []\nassert f([1, 2]) == [1, 2]\nassert f([3]) == [9]\n"
    assert trivial_passes(echo, [0, 1, 2], ["f"]) == 2  # return its argument
    target = "assert f(5) == 'x7'\nassert f(6) == 'x7'\nassert f(7) == 'y'\n"
    assert trivial_passes(target, [0, 1, 2], ["f"]) == 2  # the constant 'x7', a value the tests compare to
    assert trivial_passes("assert f(1) in ('a', 'b')\nassert f(2) == 'c'\n", [0, 1], ["f"]) == 1
    # A test that loops forever on a trivial answer: the budget runs out (None: no partial credit).
    assert trivial_passes("while f(1) is None:\n    pass\nassert f(2) == 3\n", [0, 1], ["f"], budget_s=0.2) is None


# ---------------------------------------------------------------------------- shipped task files


def test_shipped_code_tasks_best_constant_scores_zero_and_references_pass():
    """For every shipped code task: the reference passes every test (in-process: our own files),
    a trivial answer never passes every hidden test, and no constant (a catalogue of each type,
    every value any test of the task compares against, the example's value) scores above 0."""
    bad = []
    tasks = _shipped()
    assert len(tasks) >= 300
    for t in tasks:
        plan = test_plan(t.code)
        name = t.code.entry_point
        ns: dict = {}
        exec(t.code.solution, ns)  # noqa: S102 - the shipped reference, our own code
        exec(plan.source, ns)  # noqa: S102 - every test passes (an AssertionError fails this test)
        base = trivial_passes(plan.source, plan.scored, [name], budget_s=5.0)
        if base is None or base >= len(plan.scored):
            bad.append(f"{t.id}: a trivial answer passes {base} of {len(plan.scored)} hidden tests")
            continue
        values = [None, True, False, 0, 1, -1, 0.5, "", "a", [], [0], {}, (), set(), frozenset()]
        for node in ast.walk(ast.parse(plan.source)):
            if isinstance(node, ast.Compare):
                for side in [node.left, *node.comparators]:
                    try:
                        values.append(eval(compile(ast.Expression(side), "t", "eval"), {}))  # noqa: S307
                    except Exception:
                        pass
        for value in values:
            env: dict = {name: lambda *a, _v=value, **k: _v}
            passes = 0
            for i, node in enumerate(ast.parse(plan.source).body):
                try:
                    exec(compile(ast.Module(body=[node], type_ignores=[]), "t", "exec"), env)  # noqa: S102
                except Exception:
                    continue
                passes += i in plan.scored
            if partial_credit(passes, len(plan.scored), base) > 0:
                bad.append(
                    f"{t.id}: the constant {value!r:.60} scores {partial_credit(passes, len(plan.scored), base)}"
                )
    assert not bad, "\n".join(bad[:20])


def test_shipped_code_tasks_never_score_the_prompts_example():
    """The example a prompt shows is a public test: no scored test checks a call the prompt quotes,
    and every ladder task (whose prompt always shows one) has exactly that one public test."""
    bad = []
    for t in _shipped():
        prompt = "\n".join(m.content for m in t.messages)
        hidden = ast.parse(t.code.tests)
        for node in hidden.body:
            if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare):
                call = ast.get_source_segment(t.code.tests, node.test.left)
                if call and call in prompt:
                    bad.append(f"{t.id}: hidden test {call} is the prompt's example")
        if t.meta.get("source") == "code_ladder" and test_plan(t.code).public != 1:
            bad.append(f"{t.id}: {test_plan(t.code).public} public tests")
        if hidden_tests_problem(t.code):
            bad.append(f"{t.id}: {hidden_tests_problem(t.code)}")
    assert not bad, "\n".join(bad[:20])


# ---------------------------------------------------------------------------- attacks, real reward path


@pytest.fixture(scope="module")
def boxes():
    if _NO_SANDBOX:
        pytest.skip(_NO_SANDBOX)
    cand, judge = code_sandboxes()
    yield cand, judge
    cand.close()
    judge.close()


@pytest.fixture(scope="module")
def reward():
    r = CodeTestsReward(use_env_reward=False)
    yield r
    r.close()


@needs_sandbox
@pytest.mark.parametrize("task", LADDER + BOOLEAN, ids=lambda t: t.id)
def test_turn_two_lookup_table_from_feedback_earns_nothing(task, reward, boxes):
    """The multi-turn attack of a recipe that gives code two turns (joint_rl_gpu.yaml): answer wrong, read the feedback,
    answer with a lookup table of every (args, value) pair the prompt and feedback quoted. It
    scores no more than the wrong answer (0), through the env and through the reward; the
    feedback quotes no value a hidden test compares against; the reference still scores 1.0."""
    name = task.code.entry_point
    env = CodeEnv(max_turns=2)
    try:
        env.reset(task)
        obs, _, _, info = env.step(fenced(f"def {name}(*args):\n    return None\n"))
        assert info["reward"] == 0.0 and obs, info
        feedback = obs[0].content
        for node in ast.parse(task.code.tests).body:  # no hidden test's source or expected value
            assert ast.get_source_segment(task.code.tests, node) not in feedback
            if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare):
                value = ast.get_source_segment(task.code.tests, node.test.comparators[0])
                public = task.code.public_tests + "".join(m.content for m in task.messages)
                assert len(value) < 3 or value in public or value not in feedback, (value, feedback)
        shown = "\n".join(m.content for m in task.messages) + "\n" + feedback
        table = _calls_with_values(shown, name)
        assert table, shown  # the attack has something to copy: the public example
        answer = fenced(_lookup_answer(name, table))
        _, term, trunc, info = env.step(answer)
        assert info["reward"] == 0.0 and (term, trunc) == (False, True), info
        assert reward(answered(task, answer, num_turns=2, env_reward=None)) == 0.0
        # The attack is sound: it loads and passes every test whose values it was shown.
        out = run_tests(task.code, _lookup_answer(name, table), boxes[0], judge=boxes[1])
        assert out.public_total >= 1 and out.public_passed == out.public_total and out.score == 0.0, out
        env.reset(task)
        assert env.step(fenced(task.code.solution))[3]["reward"] == 1.0
    finally:
        env.close()


def _wrong_answers(task: Task) -> dict[str, str]:
    name = task.code.entry_point
    shown = "\n".join(m.content for m in task.messages)
    example = _calls_with_values(shown, name)
    attacks = {
        f"constant {v}": f"def {name}(*a, **k):\n    return {v}\n"
        for v in ("None", "True", "False", "0", "1", "-1", "''", "[]", "{}", "()", "0.0", "set()")
    }
    attacks["echo of the first argument"] = f"def {name}(*a, **k):\n    return a[0]\n"
    if example:
        attacks["echo of the example's output"] = f"def {name}(*a, **k):\n    return {next(iter(example.values()))}\n"
        attacks["lookup of the example"] = _lookup_answer(name, example)
    attacks["always-equal object"] = (
        f"class Eq:\n    def __eq__(self, o):\n        return True\n    __hash__ = object.__hash__\n"
        f"def {name}(*a, **k):\n    return Eq()\n"
    )
    attacks["always-equal int subclass"] = (
        f"class I(int):\n    def __eq__(self, o):\n        return True\n    __hash__ = int.__hash__\n"
        f"def {name}(*a, **k):\n    return I(0)\n"
    )
    attacks["patched builtins"] = (
        f"import builtins\nbuiltins.AssertionError = type('X', (Exception,), {{}})\n"
        f"def {name}(*a, **k):\n    return None\n"
    )
    return attacks


@needs_sandbox
@pytest.mark.parametrize("task", LADDER[:2] + BOOLEAN + LADDER[3:5], ids=lambda t: t.id)
def test_wrong_answers_of_each_class_score_no_more_than_the_baseline(task, boxes):
    """Constants of each type, echoes of the input and of the prompt's example, a lookup of the
    example, always-equal objects, patched builtins: each scores 0 (the wrong answer's score)
    through the real harness; the reference scores 1.0 before and after."""
    cand, judge = boxes
    ref = task.code.solution
    assert run_tests(task.code, ref, cand, judge=judge).score == 1.0
    high = {
        label: out.score
        for label, code in _wrong_answers(task).items()
        if (out := run_tests(task.code, code, cand, judge=judge)).score > 0.0
    }
    assert not high, high
    assert run_tests(task.code, ref, cand, judge=judge).score == 1.0


@needs_sandbox
def test_real_partial_work_keeps_credit(boxes):
    """Honest partial credit stays: an is_palindrome that forgets to drop punctuation and case
    passes some hidden tests above the constant baseline and scores between 0 and 1."""
    cand, judge = boxes
    task = next(t for t in BOOLEAN if "palindrome" in t.id)
    out = run_tests(task.code, "def is_palindrome(s):\n    return s == s[::-1]\n", cand, judge=judge)
    assert 0 < out.passed < out.total and out.baseline < out.passed and 0.0 < out.score < 1.0, out


@needs_sandbox
def test_humaneval_style_feedback_is_value_free(boxes):
    """No public tests (HumanEval-style): feedback names the failed test and the exception type
    and carries none of check()'s values; a load error is still shown in full."""
    cand, judge = boxes
    spec = CodeSpec(
        tests="def check(candidate):\n    assert candidate(3) == 123456\n    assert candidate(4) == 654321\n",
        entry_point="g",
        style="humaneval",
        prompt_code='def g(x):\n    """The answer for x."""\n',
    )
    out = run_tests(spec, "def g(x):\n    return 0\n", cand, judge=judge)
    assert out.output == "1 hidden test failed with AssertionError." and out.score == 0.0
    out = run_tests(spec, "def g(x):\n    return [1, 2][x]\n", cand, judge=judge)
    assert "1 hidden test failed with IndexError:" in out.output and "123456" not in out.output
    out = run_tests(spec, "def g(x) return\n", cand, judge=judge)
    assert "Error while loading the code" in out.output and "SyntaxError" in out.output


# ---------------------------------------------------------------------------- bad input: validate


def test_validate_names_a_code_task_without_hidden_tests(recipe_copy, tmp_path, capsys):
    from rl.cli.main import main

    good = Task(
        id="ok",
        domain="code",
        messages=(Message("user", "Write f."),),
        code=CodeSpec(tests="assert f(2) == 4\n", public_tests="assert f(1) == 2\n", entry_point="f"),
    )
    bad = Task(
        id="only-public",
        domain="code",
        messages=(Message("user", "Write f."),),
        code=CodeSpec(tests="", public_tests="assert f(1) == 2\n", entry_point="f"),
    )
    path = tmp_path / "code.jsonl"
    save_tasks([good, bad], path)
    recipe = recipe_copy("joint_rl.yaml", filename="r.yaml")  # a recipe that serves the code domain
    assert main(["validate", str(recipe), f"data.train_files=[{path}]"]) != 0
    err = capsys.readouterr().err
    assert "data.train_files.0" in err and "'only-public'" in err and "code.tests" in err and "no hidden tests" in err
    save_tasks([good], path)
    assert main(["validate", str(recipe), f"data.train_files=[{path}]"]) == 0


def test_dataset_rows_map_public_and_hidden_tests_and_refuse_rows_without_hidden_tests():
    from envs.io import TaskFormatError
    from rl.config.recipe import DatasetConfig
    from rl.data.hub_data import rows_to_tasks

    entry = DatasetConfig(
        path="local/code",
        domain="code",
        columns={"prompt": "q", "code.tests": "hidden", "code.public_tests": "shown", "code.entry_point": "fn"},
    )
    cols = ["q", "hidden", "shown", "fn"]
    row = {"q": "Write f.", "hidden": "assert f(2) == 4\n", "shown": "assert f(1) == 2\n", "fn": "f"}
    (task,) = rows_to_tasks([row], cols, entry, "data.train_datasets.0")
    assert (task.code.tests, task.code.public_tests) == ("assert f(2) == 4\n", "assert f(1) == 2\n")
    with pytest.raises(TaskFormatError, match=r"row 0\): field 'code.tests': no hidden tests"):
        rows_to_tasks([{**row, "hidden": ""}], cols, entry, "data.train_datasets.0")


@needs_sandbox
def test_feedback_does_not_say_which_hidden_test_failed(boxes):
    """On a boolean task, the list of hidden tests a constant failed IS the expected values (a
    turn-2 lookup keyed by call order would score 1.0). Two answers that fail different hidden
    tests, as many and with the same exception, get the same feedback, word for word."""
    cand, judge = boxes
    spec = CodeSpec(
        public_tests="assert is_even(10) == True\n",
        tests="assert is_even(1) == False\nassert is_even(2) == True\nassert is_even(3) == False\n"
        "assert is_even(4) == True\nassert is_even(7) == False\nassert is_even(8) == True\n",
        entry_point="is_even",
    )
    head = "def is_even(n):\n    print('called with', n)\n    if n == 10:\n        return True\n"
    first, last = head + "    return (n % 2 == 0) == (n < 4)\n", head + "    return (n % 2 == 0) == (n >= 4)\n"
    a, b = (run_tests(spec, code, cand, judge=judge) for code in (first, last))
    assert (a.passed, b.passed, a.total, a.baseline) == (3, 3, 6, 3) and a.score == b.score == 0.0
    assert a.output == b.output and "3 hidden tests failed with AssertionError." in a.output
    # Through the env with max_turns 2: turn 1 a constant that prints its inputs, turn 2 a lookup
    # keyed by call order from whatever verdicts the feedback gave: nothing above the baseline.
    task = Task(id="even", domain="code", messages=(Message("user", "Write is_even(n)."),), code=spec)
    env = CodeEnv(max_turns=2)
    try:
        env.reset(task)
        obs, _, _, info = env.step(fenced("def is_even(n):\n    print('called with', n)\n    return True\n"))
        assert info["reward"] == 0.0 and "called with 1" in obs[0].content
        failed = {int(k) for k in re.findall(r"[Hh]idden test #?(\d+)", obs[0].content)}
        table = [k not in failed for k in range(1, 7)]  # what per-test verdicts would have given
        answer = f"CALLS = [0]\nTABLE = {table!r}\ndef is_even(n):\n    CALLS[0] += 1\n    return TABLE[(CALLS[0] - 2) % 6]\n"
        assert env.step(fenced(answer))[3]["reward"] == 0.0
    finally:
        env.close()


@needs_sandbox
def test_a_baseline_out_of_time_pays_only_a_full_pass(boxes):
    """A hidden test that loops forever on every trivial answer: the baseline's budget runs out in
    the judge, the host takes the safe side (no partial credit), the right answer still scores 1.0."""
    cand, judge = boxes
    spec = CodeSpec(
        tests="while inc(1) != 2:\n    pass\nassert inc(2) == 3\nassert inc(5) == 6\n", entry_point="inc", timeout_s=3.0
    )
    right = run_tests(spec, "def inc(x):\n    return x + 1\n", cand, judge=judge)
    assert (right.passed, right.total, right.baseline, right.score) == (3, 3, 2, 1.0)
    two = run_tests(spec, "def inc(x):\n    return x + 1 if x < 5 else 0\n", cand, judge=judge)
    assert (two.passed, two.baseline, two.score) == (2, 2, 0.0)
