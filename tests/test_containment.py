"""Contained episodes and no cross-talk (issue #38, items 1 and 2): attacks as tests.

Each crash vector goes through the real path: the tokens an engine emits -> ``rollout.episode.run_episodes``
-> the domain's env -> the reward scorer. What the policy wrote wrong (deep nesting, huge integers, lone
surrogates, NUL bytes, a directory chain thousands of levels deep) scores as the task says; an env call that
raises anyway (a harness failure) ends that sample only, recorded as its ``reward_error`` and a
``harness_error`` event, never an exception out of the rollout; a sample that poisoned its sandbox never
fails the next one.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from envs.code import extract_code, find_code_blocks
from envs.io import save_tasks
from envs.sandbox import SandboxUnavailable, check_sandbox
from envs.sandbox.files import remove_tree
from envs.toolcall import MAX_JSON_DEPTH, ToolCallEnv, parse_tool_calls
from envs.types import CodeSpec, ExpectedCall, Generation, Message, Sampling, Task, ToolCallSpec
from rewards.code import CodeFormatReward, CodeTestsReward
from rewards.service import RewardFnSpec, RewardScorer
from rollout.episode import run_episodes

try:
    check_sandbox()
    _NO_SANDBOX = ""
except SandboxUnavailable as exc:  # pragma: no cover - CI installs bubblewrap
    _NO_SANDBOX = str(exc)
needs_sandbox = pytest.mark.skipif(bool(_NO_SANDBOX), reason=f"bubblewrap sandbox unavailable: {_NO_SANDBOX}")

# ---------------------------------------------------------------------------------- helpers

TOOLS = ({"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},)
GOOD_CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# Tool-call texts that used to raise out of the parser (or out of the reward, later): each is malformed.
TOOLCALL_ATTACKS = {
    "unclosed brackets": "<tool_call>" + "[" * 100_000,
    "unclosed object": '<tool_call>{"name": "get_weather", "arguments": ' + '{"a": ' * 50_000,
    "integer over the digit limit": '<tool_call>{"name": "get_weather", "arguments": {"city": ' + "9" * 5000 + "}}",
    # Valid JSON: the call stands and its argument is a mismatch (never an OverflowError).
    "integer too large for a float": '<tool_call>{"name": "get_weather", "arguments": {"city": '
    + "9" * 400
    + "}}</tool_call>",
    "nesting past the depth cap": '<tool_call>{"name": "get_weather", "arguments": {"city": '
    + nested(MAX_JSON_DEPTH + 5)
    + "}}</tool_call>",
    "lone surrogate escape": '<tool_call>{"name": "get_weather", "arguments": {"city": "\\ud800"}}</tool_call>',
    "string arguments nested deeply": '<tool_call>{"name": "get_weather", "arguments": "'
    + "[" * 100_000
    + '"}</tool_call>',
}


class Scripted:
    """An engine whose completion for prompt ``i`` of its one call is ``texts[i]`` (tokenized, then EOS; with
    fewer prompts, the first texts)."""

    def __init__(self, tok, texts: list[str]):
        self.gens = []
        for text in texts:
            ids = list(tok(text, add_special_tokens=False)["input_ids"]) + [tok.convert_tokens_to_ids("<|im_end|>")]
            self.gens.append(Generation(token_ids=ids, logprobs=[-1.0] * len(ids), finish_reason="stop"))
        self.calls = 0

    def generate(self, prompts, sampling, seeds=None, stops=None):
        self.calls += 1
        assert self.calls == 1 and len(prompts) <= len(self.gens)  # fewer: an episode failed its reset
        return self.gens[: len(prompts)]


def tool_task(tid: str = "w") -> Task:
    return Task(
        id=tid,
        domain="tool_call",
        messages=(Message("user", "weather in Paris?"),),
        tool_call=ToolCallSpec(tools=TOOLS, expected=(ExpectedCall("get_weather", {"city": ["Paris"]}),)),
    )


def rollout(tok, make_env, tasks: list[Task], texts: list[str], workers: int = 1, max_turns: int = 1):
    return run_episodes(
        Scripted(tok, texts),
        tok,
        make_env,
        tasks,
        list(range(len(tasks))),
        list(range(len(tasks))),
        Sampling(max_turns=max_turns, max_model_len=1 << 20),
        env_workers=workers,
    )


# ------------------------------------------------------------------- tool-call parser attacks


@pytest.mark.parametrize("kind", sorted(TOOLCALL_ATTACKS))
def test_toolcall_parser_treats_each_attack_as_malformed(kind: str) -> None:
    calls, problems = parse_tool_calls(TOOLCALL_ATTACKS[kind])
    if kind == "string arguments nested deeply":  # the call stands, its unusable arguments do not
        assert [c.arguments for c in calls] == [{}] and any("'arguments' is a string" in p for p in problems)
    elif kind == "integer too large for a float":  # valid JSON: a call whose argument does not match
        assert [c.arguments for c in calls] == [{"city": int("9" * 400)}] and problems == []
    else:
        assert calls == [] and any("invalid JSON" in p for p in problems), problems


def test_toolcall_attacks_through_env_and_reward_score_as_policy_failures(tiny_tokenizer) -> None:
    """Every attack text as the policy's turn: the real ToolCallEnv steps it, the real reward scores it 0 (a
    malformed call); the well-formed sample of the same batch scores 1. Nothing raises, nothing is excluded."""
    texts = [*TOOLCALL_ATTACKS.values(), GOOD_CALL]
    tasks = [tool_task(f"w{i}") for i in range(len(texts))]
    trajs = rollout(tiny_tokenizer, lambda d: ToolCallEnv(), tasks, texts, workers=2)
    assert all(t.reward_error is None and t.sandbox_events is None for t in trajs), [t.reward_error for t in trajs]
    scorer = RewardScorer([RewardFnSpec("rewards.toolcall.ToolCallReward")], timeout_s=30)
    scored = scorer.score(trajs)
    # Only the name counts for the call with unusable string arguments (ToolCallReward's name weight, 0.3); the
    # well-formed call whose integer argument does not match earns format and name (0.5), never an error.
    partial = {"string arguments nested deeply": 0.3, "integer too large for a float": 0.5}
    want = [partial.get(k, 0.0) for k in TOOLCALL_ATTACKS] + [1.0]
    assert [t.reward for t in scored] == pytest.approx(want)
    assert all(t.reward_error is None for t in scored)


# ------------------------------------------------------------------------ code parser attacks

CODE_ATTACKS = {
    "deep binary expression": "x = 1" + "+1" * 100_000,
    "deep unary expression": "x = " + "-" * 100_000 + "1",
    "deep call chain": "x = f" + "()" * 100_000,
    "deep attribute chain": "x = a" + ".b" * 100_000,
    "integer over the digit limit": "x = " + "9" * 5000,
    "NUL byte": "def add(a, b):\n    return a + b\0\n",
    "lone surrogate": "def add(a, b):\n    return a + b  # \ud800\n",
}


@pytest.mark.parametrize("kind", sorted(CODE_ATTACKS))
def test_code_extraction_and_format_reward_survive_each_attack(kind: str) -> None:
    text = f"```python\n{CODE_ATTACKS[kind]}\n```"
    assert (extract_code(text, "def add(a, b):\n", "add") is None) == (kind == "lone surrogate"), "not a program"
    assert CodeFormatReward.score(text) == 0.0, "does not parse: not a well-formed answer"


def test_fence_and_definition_search_take_linear_time_on_blank_runs() -> None:
    """A fence line of many spaces ending in a backtick took seconds (cubic backtracking); blank lines
    before a parse error took quadratic time in the definition search."""
    t0 = time.process_time()
    assert find_code_blocks("```" + " " * 20_000 + "x`") == [], "a backtick in the info string: not a fence"
    assert extract_code("```python\n(" + "\n" * 50_000 + "```", "", "add") is not None
    assert time.process_time() - t0 < 2.0


ADD_SPEC = CodeSpec(
    tests="assert add(1, 2) == 3\nassert add(2, 2) == 4\n",
    entry_point="add",
    solution="def add(a, b):\n    return a + b\n",
    timeout_s=10.0,
)
GOOD_ADD = "def add(a, b):\n    return a + b\n"
# A right answer that also leaves a directory chain 1,500 levels deep in its work dir and in /tmp.
DEEP_CHAIN = (
    "import os\n"
    "def add(a, b):\n"
    "    return a + b\n"
    "for base in ('.', '/tmp'):\n"
    "    os.chdir(base)\n"
    "    for _ in range(1500):\n"
    "        os.mkdir('d')\n"
    "        os.chdir('d')\n"
)


def code_task(tid: str = "add") -> Task:
    return Task(id=tid, domain="code", code=ADD_SPEC, messages=(Message("user", "Write add(a, b)."),))


def fenced(code: str) -> str:
    return f"```python\n{code}```"


@needs_sandbox
def test_code_attacks_through_env_and_reward_score_as_policy_failures(tiny_tokenizer) -> None:
    from envs.code import CodeEnv

    from trajs import answered

    # No tokenizer encodes (or decodes to) a lone surrogate: that one reaches the reward from a completions file.
    tokenizable = [c for k, c in CODE_ATTACKS.items() if k != "lone surrogate"]
    texts = [fenced(c + "\n") for c in tokenizable] + [fenced(GOOD_ADD)]
    tasks = [code_task(f"a{i}") for i in range(len(texts))]
    trajs = rollout(tiny_tokenizer, lambda d: CodeEnv(), tasks, texts, workers=2)
    assert all(t.reward_error is None for t in trajs), [t.reward_error for t in trajs]
    trajs.append(answered(code_task(), fenced(CODE_ATTACKS["lone surrogate"])))
    scorer = RewardScorer([RewardFnSpec("rewards.code.CodeTestsReward")], timeout_s=60)
    scored = scorer.score(trajs)
    assert [t.reward for t in scored] == [0.0] * len(tokenizable) + [1.0, 0.0]
    assert all(t.reward_error is None for t in scored)


# ------------------------------------------------------------- policy-written trees, any depth


def _chain(root: Path, depth: int, name: str = "d") -> None:
    """A directory chain ``depth`` levels deep under ``root`` (built relative: paths past PATH_MAX)."""
    cwd = os.getcwd()
    try:
        os.chdir(root)
        for _ in range(depth):
            os.mkdir(name)
            os.chdir(name)
        Path("leaf").write_text("x")
    finally:
        os.chdir(cwd)


@pytest.fixture
def deep_tree(tmp_path: Path):
    """``tmp_path/tree``, removed with ``rm -rf`` whatever the test did: a chain left behind would make
    pytest's own (recursive) clean-up of old temp dirs raise RecursionError in later sessions."""
    import subprocess

    tree = tmp_path / "tree"
    tree.mkdir()
    yield tree
    subprocess.run(["rm", "-rf", "--", str(tree)], check=False)


def test_remove_tree_takes_any_depth_and_never_follows_symlinks(tmp_path: Path, deep_tree: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep")
    tree = deep_tree
    _chain(tree, 1400, name="ddd")  # 5,600 characters of path: past PATH_MAX, and past the recursion limit
    (tree / "locked").mkdir()
    (tree / "locked" / "f").write_text("x")
    (tree / "link").symlink_to(outside)
    (tree / "ddd" / "link").symlink_to(outside)
    os.chmod(tree / "locked", 0)
    (tree / "file").write_text("x")
    assert remove_tree(str(tree), keep_root=True)
    assert tree.is_dir() and list(tree.iterdir()) == []
    assert (outside / "keep").read_text() == "keep", "no symlink was followed"
    _chain(tree, 1100)
    assert remove_tree(str(tree)) and not tree.exists()
    assert remove_tree(str(tree)), "a missing tree is removed already"


@needs_sandbox
def test_scratch_and_work_dir_clean_up_survive_a_deep_chain_and_the_next_run_is_clean() -> None:
    from envs.sandbox import Sandbox

    with Sandbox() as sb:
        res = sb.run_python(DEEP_CHAIN)
        assert res.exit_code == 0, res.stderr
        res = sb.run(["sh", "-c", "ls -A /tmp | wc -l"])
        assert res.exit_code == 0 and res.stdout.strip() == "0", "the next run's /tmp starts empty"
        work = sb.work_dir
    assert not os.path.exists(work)


@needs_sandbox
def test_code_env_turn_after_a_deep_chain_runs_clean(tiny_tokenizer) -> None:
    """Turn 1 leaves a 1,500-level chain in the work dir and /tmp (and fails a test); turn 2's clean-up of
    both must not break: the fixed answer passes."""
    from envs.code import CodeEnv

    bad = DEEP_CHAIN.replace("return a + b", "return a - b")
    env = CodeEnv(max_turns=2)
    try:
        env.reset(code_task())
        _, done, _, info = env.step(fenced(bad))
        assert not done and info["reward"] == 0.0
        _, done, _, info = env.step(fenced(GOOD_ADD))
        assert done and info["reward"] == 1.0
    finally:
        env.close()


@needs_sandbox
def test_code_reward_after_a_poisoned_sample_scores_the_next_ones() -> None:
    """The issue's cross-talk: after the deep chain, the next correct completions failed with RecursionError."""
    from trajs import answered

    task = code_task()
    reward = CodeTestsReward(use_env_reward=False)
    try:
        texts = [fenced(DEEP_CHAIN.replace("return a + b", "return a - b")), *[fenced(GOOD_ADD)] * 3]
        assert [reward(answered(task, t)) for t in texts] == [0.0, 1.0, 1.0, 1.0]
    finally:
        reward.close()


@needs_sandbox
def test_code_reward_takes_fresh_sandboxes_after_a_failed_run(monkeypatch) -> None:
    """Any failure (an exception, any sandbox event) drops the pair; the next sample runs on new ones."""
    import rewards.code as rc
    from trajs import answered

    task = code_task()
    reward = CodeTestsReward(use_env_reward=False, timeout_s=2)
    real = rc.run_tests
    seen: list[str] = []

    def spy(spec, code, cand, timeout_s=None, *, judge):
        seen.append(cand.work_dir)
        if "raise_here" in code:
            raise OSError("the harness broke")
        return real(spec, code, cand, timeout_s=timeout_s, judge=judge)

    monkeypatch.setattr(rc, "run_tests", spy)
    try:
        assert reward(answered(task, fenced(GOOD_ADD))) == 1.0
        assert reward(answered(task, fenced(GOOD_ADD))) == 1.0
        assert seen[0] == seen[1], "clean runs reuse the pair"
        with pytest.raises(OSError):
            reward(answered(task, fenced(GOOD_ADD + "# raise_here\n")))
        assert not os.path.exists(seen[2]), "the failed pair is closed"
        assert reward(answered(task, fenced("def add(a, b):\n    while True: pass\n"))) == 0.0  # a timeout event
        assert reward(answered(task, fenced(GOOD_ADD))) == 1.0
        assert len(set(seen[2:])) == 3, "a fresh pair after the exception, and again after the timeout"
    finally:
        reward.close()


# ------------------------------------------------------------------- env calls that raise


def _recurse(n: int = 0) -> int:
    return _recurse(n + 1) + 1


def _raise(kind: str) -> None:
    if kind == "RecursionError":
        _recurse()
    elif kind == "MemoryError":
        bytearray(1 << 62)
    elif kind == "OverflowError":
        float(10**400)
    elif kind == "ValueError":
        int("9" * 5000)
    elif kind == "OSError":
        os.close(-1)  # EBADF: a plain OSError
    elif kind == "UnicodeEncodeError":
        "\ud800".encode()
    elif kind == "KeyError":
        {}["missing"]
    raise AssertionError(f"no {kind} raised")


class Breaking(ToolCallEnv):
    """The real ToolCallEnv, except that env call ``where`` raises a real ``kind`` on tasks whose id starts
    with ``bad``."""

    def __init__(self, where: str, kind: str) -> None:
        super().__init__()
        self.where, self.kind, self.bad = where, kind, False

    def reset(self, task):
        self.bad = task.id.startswith("bad")
        self._maybe("reset")
        return super().reset(task)

    def step(self, action):
        self._maybe("step")
        return super().step(action)

    def finalize(self):
        self._maybe("finalize")
        return {}

    def close(self):
        super().close()
        self._maybe("close")

    def _maybe(self, where: str) -> None:
        if self.bad and where == self.where:
            _raise(self.kind)


KINDS = ("RecursionError", "MemoryError", "OverflowError", "ValueError", "OSError", "UnicodeEncodeError", "KeyError")


@pytest.mark.parametrize("where", ["reset", "step", "close"])
@pytest.mark.parametrize("kind", KINDS)
def test_an_env_call_that_raises_is_that_samples_harness_failure(tiny_tokenizer, where: str, kind: str) -> None:
    tasks = [tool_task("ok0"), tool_task("bad1"), tool_task("ok2")]
    trajs = rollout(tiny_tokenizer, lambda d: Breaking(where, kind), tasks, [GOOD_CALL] * 3, workers=2)
    ok0, bad, ok2 = trajs
    assert bad.reward_error is not None and bad.reward_error.startswith(f"harness: tool_call env {where} raised {kind}")
    assert bad.sandbox_events == ["harness_error"]
    if where != "close":
        assert not bad.terminated and not bad.truncated and bad.finish_reason == "harness_error"
        assert bad.num_policy_tokens == 0 if where == "reset" else bad.num_policy_tokens > 0
    scored = RewardScorer([RewardFnSpec("rewards.toolcall.ToolCallReward")], timeout_s=30).score(trajs)
    assert [t.reward for t in scored] == [1.0, None, 1.0], "the failed sample is left unscored, the others score"
    assert scored[1].reward_error == bad.reward_error and scored[1].scores == {}


def test_a_finalize_that_raises_is_that_samples_harness_failure(tiny_tokenizer) -> None:
    """An episode the rollout ends (max_turns) has its finalize called: a RecursionError there (as from a
    host-side walk of a deep tree before a terminal check) is the sample's harness failure."""

    class Answering(Breaking):
        def step(self, action):
            self._maybe("step")
            return [Message("tool", "more")], False, False, {}

    tasks = [tool_task("bad0"), tool_task("ok1")]
    trajs = rollout(tiny_tokenizer, lambda d: Answering("finalize", "RecursionError"), tasks, [GOOD_CALL] * 2)
    assert trajs[0].reward_error.startswith("harness: tool_call env finalize raised RecursionError")
    assert trajs[1].reward_error is None and trajs[1].finish_reason == "max_turns"


def test_interrupts_and_a_host_that_cannot_sandbox_still_stop_the_rollout(tiny_tokenizer) -> None:
    class Interrupted(ToolCallEnv):
        def step(self, action):
            raise KeyboardInterrupt

    class NoSandbox(ToolCallEnv):
        def step(self, action):
            raise SandboxUnavailable("bwrap is missing")

    for env, exc in ((Interrupted, KeyboardInterrupt), (NoSandbox, SandboxUnavailable)):
        with pytest.raises(exc):
            rollout(
                tiny_tokenizer, lambda d, env=env: env(), [tool_task("a"), tool_task("b")], [GOOD_CALL] * 2, workers=2
            )


@needs_sandbox
def test_terminal_deep_chain_never_raises_out_of_the_rollout(tiny_tokenizer) -> None:
    """The issue's 36-token command: a directory chain over 1,000 levels deep before the check's host-side
    walk. Whatever the walk does with it, the rollout returns: a score, or this sample's harness failure."""
    from envs.terminal import TerminalEnv
    from envs.types import TerminalSpec

    task = Task(
        id="deep",
        domain="terminal",
        messages=(Message("user", "make a file named out"),),
        terminal=TerminalSpec(setup="", check="test -f out"),
    )
    cmd = "```bash\nmkdir -p $(printf 'd/%.0s' $(seq 1500)) && touch out\n```"
    (t,) = rollout(tiny_tokenizer, lambda d: TerminalEnv(max_turns=1), [task], [cmd])
    assert t.reward_error is None or t.reward_error.startswith("harness: terminal env ")
    if t.reward_error is not None:
        assert "harness_error" in t.sandbox_events


# ------------------------------------------------------------------- `jointrl score`, no cross-talk


def _score_files(tmp_path: Path) -> tuple[Path, Path]:
    tasks, completions = tmp_path / "tasks.jsonl", tmp_path / "completions.jsonl"
    save_tasks([code_task()], tasks)
    poisoned = fenced(DEEP_CHAIN.replace("return a + b", "return a - b"))
    rows = [{"task_id": "add", "sample": i, "completion": c} for i, c in enumerate([poisoned, *[fenced(GOOD_ADD)] * 3])]
    completions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tasks, completions


def _run_score(tmp_path: Path, *extra: str) -> list[dict]:
    from rl.cli.main import main

    tasks, completions = _score_files(tmp_path)
    out = tmp_path / "scores.jsonl"
    assert main(["score", "--tasks", str(tasks), "--completions", str(completions), "--out", str(out), *extra]) == 0
    return [json.loads(x) for x in out.read_text().splitlines()]


@needs_sandbox
def test_jointrl_score_poisoned_sample_then_correct_ones(tmp_path: Path, capsys) -> None:
    rows = _run_score(tmp_path)
    assert [r["reward"] for r in rows][1:] == [1.0, 1.0, 1.0], rows
    assert all(r["reward_error"] is None for r in rows)


@needs_sandbox
@pytest.mark.slow
def test_jointrl_score_on_a_ray_reward_worker_poisoned_sample_then_correct_ones(tmp_path: Path, capsys) -> None:
    """The same through one Ray reward worker (``RewardService``): its sandboxes outlive the sample."""
    rows = _run_score(tmp_path, "--workers", "1")
    assert [r["reward"] for r in rows][1:] == [1.0, 1.0, 1.0], rows
    summary = json.loads(capsys.readouterr().out)
    assert summary["service"]["restarts"] == 0 and summary["service"]["worker_errors"] == 0
