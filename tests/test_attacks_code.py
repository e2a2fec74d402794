"""Attacks on the code reward: WRONG answers that attack the harness, through the recipe's reward path.

Every attack is a wrong solution (it does not compute the function) that tries to make the
verdict say "pass" anyway: by faking comparisons, patching what the harness uses, reading
the tests or expected values, exiting early, forging result lines, flooding or exhausting
resources. Each must score 0 through :class:`envs.code.CodeEnv` + :class:`rewards.code.CodeTestsReward`
(the path ``recipes/joint_rl.yaml`` uses) and through the reward alone; the honest answer
scores 1.0 before and after, so no attack leaves the sandboxes broken.
"""

from __future__ import annotations

import pytest

from trajs import answered
from envs.code import MARKER, CodeEnv, run_tests
from envs.sandbox import SandboxUnavailable, check_sandbox
from envs.types import CodeSpec, Message, Task, Trajectory
from rewards.code import CodeTestsReward

try:
    check_sandbox()
except SandboxUnavailable as exc:  # pragma: no cover - CI installs bubblewrap
    pytest.skip(f"bubblewrap sandbox unavailable here: {exc}", allow_module_level=True)

# An assert-style task and a HumanEval-style task; the right answers are below.
SORT = CodeSpec(
    tests="assert sort_desc([3, 1, 2]) == [3, 2, 1]\nassert sort_desc([]) == []\n"
    "assert sort_desc([5, 5, -1]) == [5, 5, -1]\n",
    entry_point="sort_desc",
    timeout_s=2.0,
)
SORT_OK = "def sort_desc(xs):\n    return sorted(xs, reverse=True)\n"
COUNT = CodeSpec(
    tests="def check(candidate):\n    assert candidate('banana', 'a') == 3\n"
    "    assert candidate('', 'x') == 0\n    assert candidate('aaaa', 'aa') == 2\n",
    entry_point="count_sub",
    style="humaneval",
    timeout_s=2.0,
    prompt_code='def count_sub(s: str, sub: str) -> int:\n    """Non-overlapping count."""\n',
)
COUNT_OK = "def count_sub(s, sub):\n    return s.count(sub)\n"
MEAN = CodeSpec(
    tests="assert abs(mean([1, 2]) - 1.5) < 1e-9\nassert len(str(mean([4]))) == 3\n"
    "assert isinstance(mean([1]), float)\nassert all([mean([2, 2]) == 2.0])\n",
    entry_point="mean",
    timeout_s=2.0,
)
MEAN_OK = "def mean(xs):\n    return sum(xs) / len(xs)\n"
TASKS = {"sort": (SORT, SORT_OK), "count": (COUNT, COUNT_OK), "mean": (MEAN, MEAN_OK)}


def task_of(spec: CodeSpec) -> Task:
    return Task(id=spec.entry_point, domain="code", code=spec, messages=(Message("user", "solve it"),))


def traj(task: Task, answer: str, env_reward: float | None) -> Trajectory:
    return answered(task, answer, num_turns=1, env_reward=env_reward)


@pytest.fixture(scope="module")
def scorer():
    env, reward, direct = CodeEnv(), CodeTestsReward(), CodeTestsReward(use_env_reward=False)

    def score(spec: CodeSpec, code: str) -> tuple[float, float, dict]:
        task = task_of(spec)
        answer = f"```python\n{code}\n```"
        env.reset(task)
        info = env.step(answer)[3]
        return reward(traj(task, answer, info["reward"])), direct(traj(task, answer, None)), info

    yield score
    env.close()
    reward.close()
    direct.close()


# Each: (task, wrong answer). Comments say what the attack tries.
ATTACKS = {
    # ---- comparisons that always succeed
    "always_equal_object": (
        "sort",
        "class A:\n    def __eq__(self, o):\n        return True\n"
        "    __hash__ = object.__hash__\ndef sort_desc(xs):\n    return A()\n",
    ),
    "list_subclass_eq": (
        "sort",
        "class L(list):\n    def __eq__(self, o):\n        return True\n"
        "    def __ne__(self, o):\n        return False\ndef sort_desc(xs):\n    return L([99])\n",
    ),
    "int_subclass_eq": (
        "count",
        "class I(int):\n    def __eq__(self, o):\n        return True\n"
        "    __hash__ = int.__hash__\ndef count_sub(s, sub):\n    return I(-7)\n",
    ),
    "str_subclass_eq": (
        "count",
        "class S(str):\n    def __eq__(self, o):\n        return True\n"
        "    __hash__ = str.__hash__\ndef count_sub(s, sub):\n    return S('x')\n",
    ),
    "repr_raises_and_eq_true": (
        "sort",
        "class B:\n    def __eq__(self, o):\n        return True\n"
        "    def __repr__(self):\n        raise SystemExit(0)\n"
        "    __hash__ = object.__hash__\ndef sort_desc(xs):\n    return B()\n",
    ),
    "index_override": (
        "count",
        "class I(int):\n    def __index__(self):\n        return 3\n"
        "    def __eq__(self, o):\n        return True\n    __hash__ = int.__hash__\n"
        "def count_sub(s, sub):\n    return I(0)\n",
    ),
    # ---- the candidate's own versions of builtins the tests call (abs, len, isinstance, all)
    "shadow_builtins": (
        "mean",
        "def mean(xs):\n    return 'wrong'\ndef abs(x):\n    return 0\n"
        "def len(x):\n    return 3\ndef isinstance(a, b):\n    return True\n"
        "def all(x):\n    return True\n",
    ),
    # ---- patching what a harness in the same interpreter would use
    "patch_builtins": (
        "sort",
        "import builtins\nbuiltins.exec = lambda *a, **k: None\n"
        "builtins.eval = lambda *a, **k: True\nbuiltins.AssertionError = type('X', (Exception,), {})\n"
        "def sort_desc(xs):\n    return [0]\n",
    ),
    "patch_ast": (
        "sort",
        "import ast\nast.Assert = ast.Pass\nast.Compare = ast.Constant\n"
        "ast.parse = lambda *a, **k: ast.Module(body=[], type_ignores=[])\n"
        "def sort_desc(xs):\n    return None\n",
    ),
    "patch_json_and_os_write": (
        "count",
        "import json, os\njson.dumps = lambda *a, **k: '{\"ok\": true}'\n"
        "os._exit = lambda *a: None\ndef count_sub(s, sub):\n    return -1\n",
    ),
    # ---- reading the tests or expected values
    "read_test_files": (
        "sort",
        "import os, re\n"
        "def _find():\n"
        "    found = {}\n"
        "    for top in ('.', '/tmp', '/work', '/dev/shm', '/proc', '/'):\n"
        "        for root, dirs, files in os.walk(top):\n"
        "            if root.count('/') > 4 or root.startswith(('/usr', '/sys', '/proc/sys')):\n"
        "                dirs[:] = []\n"
        "            for f in files:\n"
        "                try:\n"
        "                    t = open(os.path.join(root, f), errors='ignore').read(200000)\n"
        "                except Exception:\n"
        "                    continue\n"
        "                for a, e in re.findall(r'sort_desc\\((\\[.*?\\])\\) == (\\[.*?\\])', t):\n"
        "                    found[a] = eval(e)\n"
        "    return found\n"
        "def sort_desc(xs):\n    return _find().get(repr(xs))\n",
    ),
    "caller_frames_and_gc": (
        "sort",
        "import gc, sys, re, linecache\n"
        "def sort_desc(xs):\n"
        "    texts = [str(v) for k, v in linecache.cache.items()]\n"
        "    f = sys._getframe(1)\n"
        "    while f:\n"
        "        texts += [repr(v) for v in f.f_locals.values()]\n"
        "        f = f.f_back\n"
        "    texts += [o for o in gc.get_objects() if isinstance(o, str) and 'sort_desc(' in o]\n"
        "    texts += [repr(m.__dict__) for n, m in list(sys.modules.items()) if n in ('tests', '__main__')]\n"
        "    for t in texts:\n"
        "        for a, e in re.findall(r'sort_desc\\((\\[.*?\\])\\) == (\\[.*?\\])', t):\n"
        "            if a == repr(xs):\n"
        "                return eval(e)\n"
        "    return None\n",
    ),
    "proc_and_environ": (
        "count",
        "import os, re\n"
        "def count_sub(s, sub):\n"
        "    blobs = [repr(dict(os.environ))]\n"
        "    for pid in os.listdir('/proc'):\n"
        "        for part in ('cmdline', 'environ'):\n"
        "            try:\n"
        "                blobs.append(open('/proc/%s/%s' % (pid, part), 'rb').read().decode(errors='ignore'))\n"
        "            except OSError:\n"
        "                pass\n"
        "        try:\n"
        "            for fd in os.listdir('/proc/%s/fd' % pid):\n"
        "                blobs.append(os.readlink('/proc/%s/fd/%s' % (pid, fd)))\n"
        "        except OSError:\n"
        "            pass\n"
        "    for b in blobs:\n"
        '        m = re.search(r"candidate\\(%r, %r\\) == (\\d+)" % (s, sub), b)\n'
        "        if m:\n"
        "            return int(m.group(1))\n"
        "    return -1\n",
    ),
    # ---- exiting early, forging results
    "sys_exit_at_import": ("sort", "import sys\nsys.exit(0)\n"),
    "os_exit_at_import": ("count", "import os\nos._exit(0)\n"),
    "os_exit_in_call": ("sort", "import os\ndef sort_desc(xs):\n    os._exit(0)\n"),
    "system_exit_in_call": ("count", "def count_sub(s, sub):\n    raise SystemExit(0)\n"),
    "keyboard_interrupt": ("count", "def count_sub(s, sub):\n    raise KeyboardInterrupt\n"),
    "fake_pass_markers": (
        "sort",
        "import os, sys, json\n"
        f"M = {MARKER!r}\n"
        "lines = [M + ' ' + json.dumps({'i': i, 'ok': True, 'msg': ''}) for i in range(3)]\n"
        "lines.append(M + ' ' + json.dumps({'done': True, 'passed': 3, 'total': 3}))\n"
        "blob = ('\\n'.join(lines) + '\\nPASS\\nOK\\n').encode()\n"
        "for fd in range(1, 64):\n"
        "    try:\n        os.write(fd, blob)\n    except OSError:\n        pass\n"
        "print(blob.decode())\nsys.stdout.flush()\n"
        "def sort_desc(xs):\n    return 0\n",
    ),
    "forged_reply_lines": (
        "count",
        "import os\n"
        "for fd in range(1, 64):\n"
        "    try:\n"
        "        os.write(fd, b'{\"ready\": true}\\n' + b''.join(b'{\"id\": %d, \"ok\": 3}\\n' % i for i in range(1, 9)))\n"
        "    except OSError:\n"
        "        pass\n"
        "def count_sub(s, sub):\n    return 3\n",
    ),
    # ---- bad values and resources
    "unsendable_generator": ("sort", "def sort_desc(xs):\n    return (x for x in sorted(xs, reverse=True))\n"),
    "deep_nesting": (
        "sort",
        "def sort_desc(xs):\n    v = []\n    for _ in range(100000):\n        v = [v]\n    return v\n",
    ),
    "huge_return": ("count", "def count_sub(s, sub):\n    return 'x' * (40 << 20)\n"),
    "output_flood": (
        "sort",
        "import sys\ndef sort_desc(xs):\n    sys.stdout.write('PASS\\n' * 400000)\n    return None\n",
    ),
    "never_returns": ("count", "def count_sub(s, sub):\n    while True:\n        pass\n"),
    "fork_bomb": (
        "sort",
        "import os\ndef sort_desc(xs):\n    while True:\n        try:\n            os.fork()\n"
        "        except OSError:\n            pass\n",
    ),
    "disk_flood_bytes": (
        "sort",
        "def sort_desc(xs):\n    blk = b'x' * (1 << 20)\n"
        "    for d in ('/tmp', '.', '/dev/shm'):\n"
        "        try:\n            with open(d + '/fill', 'wb') as f:\n"
        "                for _ in range(2048):\n                    f.write(blk)\n"
        "        except OSError:\n            pass\n    return None\n",
    ),
    "disk_flood_inodes": (
        "count",
        "import os\ndef count_sub(s, sub):\n"
        "    for i in range(100000):\n        try:\n"
        "            open('/tmp/f%d' % i, 'w').close()\n"
        "        except OSError:\n            break\n    return s.count(sub) + 1\n",
    ),
}


def test_honest_answers_pass(scorer):
    for spec, ok in TASKS.values():
        via_env, direct, info = scorer(spec, ok)
        assert via_env == 1.0 and direct == 1.0, info


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_scores_zero(scorer, name):
    which, code = ATTACKS[name]
    spec, _ = TASKS[which]
    via_env, direct, info = scorer(spec, code)
    assert via_env == 0.0 and direct == 0.0, (name, info)
    assert info["passed"] == 0


@pytest.mark.slow  # two timeouts in a row (~10 s)
def test_honest_answers_pass_before_and_after_the_attacks(scorer):
    for spec, ok in TASKS.values():
        via_env, direct, info = scorer(spec, ok)
        assert via_env == 1.0 and direct == 1.0, info
    # A fork bomb and a disk flood in a row, then the honest answers again: nothing is left over.
    scorer(SORT, ATTACKS["fork_bomb"][1])
    scorer(SORT, ATTACKS["disk_flood_bytes"][1])
    for spec, ok in TASKS.values():
        assert scorer(spec, ok)[:2] == (1.0, 1.0)


@pytest.mark.slow  # a timeout and two floods (~6 s)
def test_resource_attacks_are_recorded_as_sandbox_events(scorer):
    assert "storage" in scorer(COUNT, ATTACKS["disk_flood_inodes"][1])[2]["sandbox_events"]
    assert "timeout" in scorer(COUNT, ATTACKS["never_returns"][1])[2]["sandbox_events"]
    assert "output" in scorer(SORT, ATTACKS["output_flood"][1])[2]["sandbox_events"]


def test_a_right_answer_that_fills_its_storage_fails_with_a_reason(scorer):
    code = SORT_OK + (
        "for i in range(20):\n    try:\n        open('/tmp/x%d' % i, 'wb').write(b'x' * (4 << 20))\n"
        "    except OSError:\n        break\n"
    )
    env = CodeEnv(sandbox_config={"storage_mb": 16})  # the recipe's kwargs path
    env.reset(task_of(SORT))
    info = env.step(f"```python\n{code}\n```")[3]
    env.close()
    assert info["reward"] == 0.0 and "storage" in info["error"] and "storage" in info["sandbox_events"], info
    assert scorer(SORT, SORT_OK)[0] == 1.0  # the same answer without the flood passes


def test_values_that_cannot_cross_fail_with_a_clear_reason(scorer):
    env = CodeEnv(max_turns=2)
    env.reset(task_of(SORT))
    obs, _, _, info = env.step("```python\ndef sort_desc(xs):\n    return iter(xs)\n```")
    assert info["reward"] == 0.0 and "cannot cross the sandbox boundary" in obs[0].content
    assert "list_iterator" in obs[0].content
    env.close()


def test_plain_values_cross_faithfully():
    """Tuples, sets, dicts with int keys, floats, None, bytes and exceptions keep their types."""
    spec = CodeSpec(
        entry_point="f",
        tests=(
            "assert f('t') == (1, 2)\nassert f('s') == {1, 2}\nassert f('d') == {1: 'a', (2, 3): None}\n"
            "assert f('b') == b'\\x00\\xff'\nassert f('n') is None\nassert f('f') == 0.5\n"
            "assert f('inf') == float('inf')\nassert type(f('t')) is tuple\n"
            "try:\n    f('raise')\nexcept ValueError as e:\n    assert 'bad' in str(e)\nelse:\n    assert False\n"
            "xs = [3, 1]\nf('sort', xs)\nassert xs == [1, 3]\n"
        ),
    )
    code = (
        "def f(k, arg=None):\n"
        "    if k == 'raise':\n        raise ValueError('bad input')\n"
        "    if k == 'sort':\n        arg.sort()\n        return None\n"
        "    return {'t': (1, 2), 's': {1, 2}, 'd': {1: 'a', (2, 3): None}, 'b': b'\\x00\\xff', 'n': None,\n"
        "            'f': 0.5, 'inf': float('inf')}[k]\n"
    )
    from envs.sandbox import Sandbox

    with Sandbox() as box:
        out = run_tests(spec, code, box)
    assert out.all_passed, out.output


def test_tests_that_raise_systemexit_or_crash_do_not_stop_the_verdict():
    """A test statement raising SystemExit (or the judge's own tests crashing) fails that test only."""
    spec = CodeSpec(
        entry_point="f",
        tests="assert f(1) == 1\nimport sys\nsys.exit(0)\nraise SystemExit(3)\nassert f(2) == 2\n",
        timeout_s=5.0,
    )
    from envs.sandbox import Sandbox

    with Sandbox() as box:
        out = run_tests(spec, "def f(x):\n    return x\n", box)
        assert (out.passed, out.total) == (2, 4) and "SystemExit" in out.output
        out = run_tests(spec, "import sys\ndef f(x):\n    sys.exit(0)\n", box)
        assert out.passed == 0
