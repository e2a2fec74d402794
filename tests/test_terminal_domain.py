"""Terminal domain: command extraction, the sandboxed env and its check, the reward, the task set."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import pytest

from envs.base import check_env
from envs.io import load_tasks
from envs.sandbox import SandboxUnavailable, check_sandbox
from envs.terminal import TerminalEnv, extract_command, parse_action, parse_check_result, truncate_output
from rl.data.tasks.terminal_tasks import DEFAULT_OUT, build_tasks
from envs.types import Message, Task, TerminalSpec, Trajectory
from rewards.service import RewardFnSpec, RewardScorer
from rewards.terminal import TerminalCheckReward

DATA = Path(__file__).resolve().parents[1] / "recipes" / "data" / "terminal_tasks.jsonl"

try:
    check_sandbox()
    _NO_SANDBOX = ""
except SandboxUnavailable as exc:  # pragma: no cover - CI installs bubblewrap
    _NO_SANDBOX = str(exc)
needs_sandbox = pytest.mark.skipif(bool(_NO_SANDBOX), reason=f"bubblewrap sandbox unavailable: {_NO_SANDBOX}")


def make_task(setup: str = "", check: str = "true", time_limit_s: float = 60.0, id: str = "t-term") -> Task:
    return Task(
        id=id,
        domain="terminal",
        messages=(Message("system", "sys"), Message("user", "do it")),
        terminal=TerminalSpec(setup=setup, check=check, time_limit_s=time_limit_s),
    )


# ------------------------------------------------------------------------------ parsing


@pytest.mark.parametrize(
    "text, want",
    [
        ("```bash\nls -la\n```", "ls -la"),
        ("I will list the files.\n```sh\nls\n```\nthen more", "ls"),
        ("```\npwd\n```", "pwd"),
        ("```bash\ncd d\necho hi > f.txt\n```", "cd d\necho hi > f.txt"),  # multi-line block kept whole
        ("```bash\nfirst\n```\n```bash\nsecond\n```", "first"),  # the first block wins
        ("```python\nprint(1)\n```\n```bash\necho sh\n```", "echo sh"),  # non-shell blocks are skipped
        ("```bash\n$ ls /tmp\n```", "ls /tmp"),
        ("```bash\nls -l", "ls -l"),  # unclosed fence: to the end
        ("ls -la", "ls -la"),
        ("  $ cat notes.txt  \n", "cat notes.txt"),
        ("`wc -l a.txt`", "wc -l a.txt"),
        ("```bash\necho 1\n```\nDONE", "echo 1"),  # a command block runs; DONE on the next turn
        ("DONE", None),
        ("All good.\nDONE", None),
        ("```bash\nDONE\n```", None),
        ("```bash\n\n```", None),
        ("", None),
        ("   \n ", None),
        ("$ ", None),
        ("Let me think.\nFirst I look around.", None),  # prose: no command
        ("```python\nprint(1)\n```", None),
        ("```python\nx = 1\n```\n```\nls\n```", "ls"),  # fences pair up in order
        ("```bash\r\nls\r\n```", "ls"),
    ],
)
def test_extract_command(text, want):
    assert extract_command(text) == want


def test_parse_action_kinds_and_marker():
    assert parse_action("DONE") == ("done", None)
    assert parse_action("") == ("done", None)
    assert parse_action("Let me think.\nNothing yet.") == ("invalid", None)
    assert parse_action("```python\nx = 1\n```") == ("invalid", None)
    assert parse_action("ls") == ("command", "ls")
    assert parse_action("FINISHED", done_marker="FINISHED") == ("done", None)
    assert parse_action("DONE", done_marker="FINISHED") == ("command", "DONE")
    with pytest.raises(TypeError):
        parse_action(None)  # type: ignore[arg-type]


def test_parse_check_result_and_truncate():
    assert parse_check_result(0, "") == 1.0
    assert parse_check_result(0, "0.2\n") == 1.0  # exit 0 is a pass whatever it prints
    assert parse_check_result(1, "FAIL: x\n0.25\n\n") == 0.25
    assert parse_check_result(1, "1.5") == 0.0
    assert parse_check_result(1, "nan") == 0.0
    assert parse_check_result(1, "FAIL: nope") == 0.0
    assert parse_check_result(None, "") == 0.0
    assert parse_check_result(0, "", timed_out=True) == 0.0
    assert truncate_output("abc", 10) == "abc"
    cut = truncate_output("a" * 50 + "b" * 50, 20)
    assert cut.startswith("a" * 10) and cut.endswith("b" * 10) and "80 characters omitted" in cut


def test_constructor_validates_and_never_falls_back(monkeypatch):
    with pytest.raises(ValueError, match="bwrap"):
        TerminalEnv(sandbox="none")
    with pytest.raises(ValueError):
        TerminalEnv(max_turns=0)

    def unavailable():
        raise SandboxUnavailable("no bwrap here")

    monkeypatch.setattr("envs.terminal.check_sandbox", unavailable)
    with pytest.raises(SandboxUnavailable, match="no bwrap"):
        TerminalEnv()


# ------------------------------------------------------------------------------ the env


@needs_sandbox
def test_check_env_contract_and_reset_validation():
    env = TerminalEnv()
    check_env(env, make_task(check="true"))  # default action "" means done
    with pytest.raises(ValueError, match="terminal spec"):
        env.reset(Task(id="x", domain="terminal", messages=(Message("user", "hi"),)))
    with pytest.raises(RuntimeError, match="before reset"):
        TerminalEnv().step("ls")
    env.close()


@needs_sandbox
def test_scripted_episode_state_persists_and_done_runs_the_check():
    task = make_task(
        setup="echo seed > seed.txt\ncd /tmp",  # setup's cd does not leak
        check='[ "$(cat d/f.txt)" = hi ] && [ -f seed.txt ]',
    )
    env = TerminalEnv(max_turns=8)
    try:
        assert env.reset(task) == list(task.messages)
        obs, term, trunc, info = env.step("```bash\npwd\n```")
        assert obs == [Message("user", "exit code 0\n/work\n")] and not term and not trunc
        assert info == {"exit_code": 0, "timed_out": False, "turns": 1}
        obs, *_ = env.step("```bash\nmkdir d && cd d\nX=42\n```")
        assert obs[0].content == "exit code 0"
        obs, *_ = env.step('echo hi > f.txt; echo "$X in $(pwd)"')  # cwd and variables persist
        assert obs[0].content == "exit code 0\n42 in /work/d\n"
        obs, term, trunc, info = env.step("```bash\ncat missing.txt\n```")
        assert obs[0].content.startswith("exit code 1\n") and "No such file" in obs[0].content
        obs, *_ = env.step("I am not sure what to do.\nMaybe look around.")  # no command: a reminder
        assert "No command found" in obs[0].content
        obs, term, trunc, info = env.step("Finished.\nDONE")
        assert obs == [] and term and not trunc
        assert info["reward"] == 1.0 and info["passed"] is True and info["end"] == "done" and info["turns"] == 6
        with pytest.raises(RuntimeError, match="ended"):
            env.step("ls")
    finally:
        env.close()


@needs_sandbox
def test_max_turns_truncates_and_still_checks():
    env = TerminalEnv(max_turns=2)
    try:
        env.reset(make_task(check="[ -f a ] && [ -f b ]"))
        assert env.step("touch a")[1:3] == (False, False)
        obs, term, trunc, info = env.step("touch b")
        assert obs[0].content == "exit code 0" and not term and trunc
        assert info["reward"] == 1.0 and info["end"] == "max_turns"
    finally:
        env.close()


@needs_sandbox
def test_finalize_scores_an_episode_the_rollout_ended():
    env = TerminalEnv(max_turns=5)
    try:
        env.reset(make_task(check="[ -f a ]"))
        env.step("touch a")
        info = env.finalize()
        assert info["reward"] == 1.0 and info["end"] == "cut_by_rollout"
        assert env.finalize() == {}, "an ended episode is not checked twice"
        with pytest.raises(RuntimeError, match="ended"):
            env.step("ls")
    finally:
        env.close()


@needs_sandbox
def test_timeout_is_an_observation_and_the_session_recovers():
    env = TerminalEnv(command_timeout_s=1.0)
    try:
        env.reset(make_task(check="[ -f after ]"))
        obs, term, trunc, info = env.step("```bash\nsleep 30\n```")
        assert "timed out after 1s" in obs[0].content and info["timed_out"] and not term and not trunc
        obs, *_ = env.step("touch after && echo alive")
        assert obs[0].content == "exit code 0\nalive\n"
        assert env.step("DONE")[3]["reward"] == 1.0
    finally:
        env.close()


@needs_sandbox
def test_commands_reading_input_get_end_of_file_not_a_hang():
    # `tee out.txt` and `grep word` with no file read standard input: on the session's tty they wait
    # for keyboard input until the timeout (and hold the whole rollout batch that long).
    env = TerminalEnv(command_timeout_s=5.0)
    try:
        env.reset(make_task(check='[ -f out.txt ] && [ ! -s out.txt ] && [ "$(cat where)" = /work/sub ]'))
        t0 = time.monotonic()
        obs, term, trunc, info = env.step("```bash\ntee out.txt\n```")
        assert not info["timed_out"] and obs[0].content == "exit code 0", obs
        obs, *_ = env.step("grep -w meadow")
        assert obs[0].content == "exit code 1" and not _[-1]["timed_out"]
        obs, *_ = env.step('read x; echo "got [$x]"')
        assert obs[0].content == "exit code 0\ngot []\n"
        # Everything else still works: cd and variables persist, heredocs feed their own command.
        obs, *_ = env.step("mkdir sub && cd sub && V=kept")
        obs, *_ = env.step("```bash\ncat <<EOF > ../where\n$PWD\nEOF\necho $V\n```")
        assert obs[0].content == "exit code 0\nkept\n"
        assert time.monotonic() - t0 < 4.0
        assert env.step("DONE")[3]["reward"] == 1.0
    finally:
        env.close()


@needs_sandbox
def test_terminal_stdin_waits_for_input_until_the_timeout():
    env = TerminalEnv(command_timeout_s=1.0, stdin="terminal")
    try:
        env.reset(make_task())
        obs, term, trunc, info = env.step("tee out.txt")
        assert info["timed_out"] and "timed out after 1s" in obs[0].content
    finally:
        env.close()
    with pytest.raises(ValueError, match="stdin must be 'null' or 'terminal'"):
        TerminalEnv(stdin="tty")


@needs_sandbox
def test_time_limit_truncates_and_checks():
    env = TerminalEnv(command_timeout_s=10.0)
    try:
        env.reset(make_task(check="exit 1", time_limit_s=0.5))
        obs, term, trunc, info = env.step("sleep 5")
        assert "timed out" in obs[0].content and trunc and not term
        assert info["end"] == "time_limit" and info["reward"] == 0.0 and info["passed"] is False
    finally:
        env.close()


@needs_sandbox
def test_check_cannot_be_faked_by_the_policy_shell():
    # The check uses grep and test; the policy shadows both (function, alias, exported function, PATH).
    env = TerminalEnv()
    try:
        env.reset(make_task(check="grep -q '^yes$' answer.txt && test -s answer.txt"))
        env.step(
            "```bash\ngrep() { return 0; }; test() { return 0; }; export -f grep test\n"
            "alias grep=true; mkdir -p bin; printf '#!/bin/sh\\nexit 0\\n' > bin/grep; chmod +x bin/grep\n"
            "export PATH=$PWD/bin:$PATH; echo no > answer.txt\n```"
        )
        obs, term, trunc, info = env.step("DONE")
        assert info["reward"] == 0.0 and not info["passed"]
    finally:
        env.close()


@needs_sandbox
def test_partial_credit_shell_exit_and_background_processes_killed_before_check():
    env = TerminalEnv()
    try:
        env.reset(make_task(check="echo 'FAIL: half'; echo 0.5; exit 1"))
        info = env.step("DONE")[3]
        assert info["reward"] == 0.5 and info["passed"] is False and "FAIL: half" in info["check_output"]

        # A background writer is dead by the time the check runs: the check sees a settled state.
        env.reset(make_task(check='n=$(wc -l < ticks); sleep 0.5; [ "$(wc -l < ticks)" = "$n" ]'))
        env.step("(while :; do echo t >> ticks; sleep 0.05; done) >/dev/null 2>&1 &")
        assert env.step("sleep 0.3")[3] == {"exit_code": 0, "timed_out": False, "turns": 2}
        obs, term, trunc, info = env.step("```bash\nexit 3\n```")  # the shell exits: the episode ends
        assert term and not trunc and info["end"] == "shell_exited" and info["reward"] == 1.0
    finally:
        env.close()


@needs_sandbox
def test_setup_failure_raises_and_close_removes_the_work_dir():
    env = TerminalEnv()
    try:
        with pytest.raises(RuntimeError, match=r"(?s)'broken-task'.*setup failed.*exit code 7.*setup said hi"):
            env.reset(make_task(setup="echo setup said hi\nexit 7\necho never", id="broken-task"))
        with pytest.raises(RuntimeError):  # a failed set -e line fails the setup too
            env.reset(make_task(setup="false\ntouch x"))
        env.reset(make_task(setup="touch ok"))  # the env is usable after a failed reset
        work = env._box.work_dir
        assert os.path.isfile(os.path.join(work, "ok"))
    finally:
        env.close()
    assert not os.path.exists(work)
    env.close()  # idempotent


# ------------------------------------------------------------------------------ reward


def _traj(env_reward, task=None):
    return Trajectory(
        task=task or make_task(),
        group_id=0,
        prompt_ids=[1],
        response_ids=[2],
        loss_mask=[1],
        logprobs=[0.0],
        messages=[],
        terminated=True,
        truncated=False,
        finish_reason="stop",
        env_reward=env_reward,
    )


def test_reward_passes_the_env_check_on_and_none_is_an_error():
    r = TerminalCheckReward()
    assert r.name == "terminal_check" and r.domains == ("terminal",)
    assert r(_traj(1.0)) == 1.0 and r(_traj(0.25)) == 0.25
    assert r(_traj(None)) is None
    assert r(_traj(1.0, Task(id="x", domain="terminal", messages=(Message("user", "u"),)))) is None
    scorer = RewardScorer([RewardFnSpec("rewards.terminal.TerminalCheckReward")])
    ok, unchecked = scorer.score([_traj(0.5), _traj(None)])
    assert ok.reward == 0.5 and ok.reward_error is None
    assert unchecked.reward is None and "no reward function scored" in unchecked.reward_error


# ------------------------------------------------------------------------------ the task set


SHIPPED = load_tasks(DATA)


def test_task_file_is_generated_and_well_formed():
    assert DEFAULT_OUT == DATA
    assert SHIPPED == build_tasks(), (
        "recipes/data/terminal_tasks.jsonl is stale: run python -m rl.data.tasks.terminal_tasks"
    )
    assert len(SHIPPED) >= 30 and len({t.id for t in SHIPPED}) == len(SHIPPED)
    cats = Counter(t.meta["category"] for t in SHIPPED)
    assert set(cats) == {"files", "text", "archive", "python", "permissions", "process", "git"}
    diffs = [t.meta["difficulty"] for t in SHIPPED]
    assert diffs == sorted(diffs, key=["easy", "medium", "hard"].index)  # graded easy -> hard
    for t in SHIPPED:
        assert t.domain == "terminal" and t.meta["source"] == "jointrl"
        assert [m.role for m in t.messages] == ["system", "user"] and "DONE" in t.messages[0].content
        spec = t.terminal
        assert spec is not None and spec.setup.strip() and spec.check.strip() and spec.solution.strip()
        assert spec.time_limit_s > 0
        assert "chown" not in spec.setup + spec.solution + spec.check


@pytest.fixture(scope="module")
def shared_env():
    env = TerminalEnv()  # one env for all shipped tasks: sessions are per episode, the rest is reused
    yield env
    env.close()


@needs_sandbox
@pytest.mark.parametrize("task", SHIPPED, ids=[t.id for t in SHIPPED])
def test_shipped_task_solution_passes_and_doing_nothing_fails(shared_env, task):
    env = shared_env
    env.reset(task)
    obs, term, trunc, _ = env.step(f"```bash\n{task.terminal.solution}\n```")
    assert not term and not trunc, obs
    obs, term, trunc, info = env.step("DONE")
    assert term and info["reward"] == 1.0, f"reference solution fails: {info['check_output']}"
    env.reset(task)
    info = env.step("DONE")[3]
    assert info["reward"] == 0.0, f"doing nothing scores {info['reward']}: {info['check_output']}"
