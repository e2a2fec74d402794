"""Attacks on the terminal reward: the policy leaves WRONG state plus traps for the check.

Each attack leaves the task undone (the answer file is wrong, the repo is dirty) and plants
something that would make a check run in the policy's context pass anyway: a ``.pth``
file in the user site-packages, a ``python3`` in ``~/.local/bin``, shell rc files, a
``json.py`` beside the check, git configuration that hides files or runs hooks, leftover
daemons. Scored through :class:`envs.terminal.TerminalEnv` + :class:`rewards.terminal.TerminalCheckReward`
(the recipe path); each must score 0, and the honest solution 1.0.

The same tasks, wrong answers and traps run in the ``harbor`` env too (slow: each task becomes a Harbor task
directory whose image, over the shipped tasks' shared base, runs the setup; its ``tests/test.sh`` runs the
check): :class:`envs.harbor.env.HarborEnv` + :class:`rewards.harbor.HarborVerifierReward`. The repository-local
git metadata attacks are not among them: a Harbor verifier reads the agent's repository as the agent left it
(docs/envs.md, what the verifier rule cannot protect).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from trajs import finished
from envs.sandbox import SandboxUnavailable, check_sandbox
from envs.terminal import TerminalEnv
from envs.types import Message, Task, TerminalSpec
from rewards.terminal import TerminalCheckReward

try:
    check_sandbox()
except SandboxUnavailable as exc:  # pragma: no cover - CI installs bubblewrap
    pytest.skip(f"bubblewrap sandbox unavailable here: {exc}", allow_module_level=True)

PYSITE = "$HOME/.local/lib/python3.$(python3 -c 'import sys; print(sys.version_info[1])')/site-packages"

# Task 1: count the lines of data.txt into count.txt; the check uses python3 (json, os).
COUNT = TerminalSpec(
    setup="printf 'a\\nb\\nc\\nd\\ne\\n' > data.txt",
    check="python3 -c \"import json, sys; sys.exit(0 if open('count.txt').read().strip() == '5' else 1)\" "
    "|| { echo FAIL; exit 1; }",
    solution="wc -l < data.txt > count.txt",
    time_limit_s=30,
)
# Task 2: commit the untracked notes.txt so that the repo's status is clean; the check asks git.
GIT = TerminalSpec(
    setup="git init -q repo && git -C repo config user.email a@b && git -C repo config user.name a && "
    "echo v1 > repo/a.txt && git -C repo add a.txt && git -C repo commit -qm v1 && echo hi > repo/notes.txt",
    check='[ -z "$(git -C repo status --porcelain)" ] || { echo FAIL; exit 1; }',
    solution="git -C repo add notes.txt && git -C repo commit -qm notes",
    time_limit_s=30,
)
# Task 3: restore the broken a.txt to its committed content; the check asks git diff and status.
RESTORE = TerminalSpec(
    setup="git init -q repo && git -C repo config user.email a@b && git -C repo config user.name a && "
    "echo v1 > repo/a.txt && git -C repo add a.txt && git -C repo commit -qm v1 && echo broken > repo/a.txt",
    check='git -C repo diff --quiet && [ -z "$(git -C repo status --porcelain)" ] || { echo FAIL; exit 1; }',
    solution="git -C repo checkout -- a.txt",
    time_limit_s=30,
)
# Task 4: change a.txt to v2 without committing; the check reads the diff.
DIFF = TerminalSpec(
    setup="git init -q repo && git -C repo config user.email a@b && git -C repo config user.name a && "
    "echo v1 > repo/a.txt && git -C repo add a.txt && git -C repo commit -qm v1",
    check="[ \"$(git -C repo diff a.txt | grep '^[-+]v')\" = \"$(printf -- '-v1\\n+v2')\" ] || { echo FAIL; exit 1; }",
    solution="echo v2 > repo/a.txt",
    time_limit_s=30,
)
# Task 5: commit everything in the work dir, itself a repository; the check asks git from the work dir.
ROOT = TerminalSpec(
    setup="git init -q . && git config user.email a@b && git config user.name a && echo data > a.txt",
    check='git rev-parse -q --verify HEAD >/dev/null && [ -z "$(git status --porcelain --untracked-files=all)" ] '
    "|| { echo FAIL; exit 1; }",
    solution="git add -A && git commit -qm data",
    time_limit_s=30,
)
TASKS = {"count": COUNT, "git": GIT, "restore": RESTORE, "diff": DIFF, "root": ROOT}

WRONG = {
    "count": "echo 4 > count.txt",
    "git": "true",
    "restore": "true",
    "diff": "echo v3 > repo/a.txt",
    "root": "true",
}
ATTACKS = {
    "pth_os_exit": ("count", f"mkdir -p {PYSITE} && echo 'import os; os._exit(0)' > {PYSITE}/zz.pth"),
    "usercustomize": ("count", f"mkdir -p {PYSITE} && printf 'import os\\nos._exit(0)\\n' > {PYSITE}/usercustomize.py"),
    "local_bin_python": (
        "count",
        "mkdir -p ~/.local/bin && printf '#!/bin/sh\\nexit 0\\n' > ~/.local/bin/python3 && "
        "chmod +x ~/.local/bin/python3 && echo 'export PATH=$HOME/.local/bin:$PATH' | "
        "tee -a ~/.bashrc ~/.profile ~/.bash_profile > /dev/null",
    ),
    "shadow_json_module": ("count", "printf 'import os\\nos._exit(0)\\n' > json.py && cp json.py sys.py"),
    "bash_env_and_rc": (
        "count",
        "printf 'python3() { return 0; }\\nexport -f python3\\n' > .bashrc && cp .bashrc .bash_env "
        "&& export BASH_ENV=$HOME/.bash_env && export -f cd 2>/dev/null; true",
    ),
    "exported_function": ("count", "python3() { return 0; }; export -f python3; alias python3=true"),
    "fake_tools_in_work_dir": (
        "count",
        "mkdir bin && printf '#!/bin/sh\\nexit 0\\n' > bin/python3 && chmod +x bin/python3"
        " && cp bin/python3 python3 && export PATH=$PWD:$PWD/bin:$PATH",
    ),
    "daemon_fixes_later": ("count", "(sleep 1.5; echo 5 > count.txt) > /dev/null 2>&1 & disown; true"),
    "tmp_leftover": ("count", "echo 5 > /tmp/count.txt && ln -sf /tmp/count.txt count2.txt"),
    "gitconfig_hides_untracked": (
        "git",
        "printf '[status]\\n\\tshowUntrackedFiles = no\\n' > ~/.gitconfig && "
        "git -C repo config status.showUntrackedFiles no",
    ),
    "git_fsmonitor_hook": (
        "git",
        'printf \'#!/bin/sh\\ngit -C "$PWD" add -A >/dev/null 2>&1\\n'
        'git -C "$PWD" -c core.fsmonitor=false commit -qm x >/dev/null 2>&1\\nexit 1\\n\' > hook.sh '
        '&& chmod +x hook.sh && git -C repo config core.fsmonitor "$PWD/hook.sh"',
    ),
    "git_excludes_file_hides_untracked": (
        "git",
        'echo notes.txt > ex && git -C repo config core.excludesFile "$PWD/ex"',
    ),
    "git_hooks_path": (
        "git",
        "mkdir -p hk && printf '#!/bin/sh\\nexit 0\\n' > hk/post-index-change && chmod +x "
        'hk/post-index-change && git -C repo config core.hooksPath "$PWD/hk"',
    ),
}
# Repository-local git metadata that, without the harness's vetting (envs.terminal_git), makes
# the check above score 1.0 on the wrong state (test_git_attacks_fool_an_unvetted_check).
GIT_METADATA_ATTACKS = {
    "git_info_exclude": ("git", "echo notes.txt >> repo/.git/info/exclude"),
    # The clean filter runs during the check's `git status` (a.txt's stat changed) and deletes
    # the untracked file before status lists untracked files.
    "git_filter_clean_driver": (
        "git",
        "printf '* filter=ev\\n' > repo/.gitattributes && git -C repo add .gitattributes && "
        "git -C repo commit -qm attrs && "
        "git -C repo config filter.ev.clean \"sh -c 'rm -f $PWD/repo/notes.txt; cat'\" && "
        "sleep 1.1 && touch repo/a.txt",
    ),
    "git_diff_textconv": (
        "diff",
        "printf 'a.txt diff=tc\\n' > repo/.git/info/attributes && git -C repo config diff.tc.textconv 'sed s/v3/v2/'",
    ),
    "git_diff_external": (
        "diff",
        "printf '#!/bin/sh\\necho -v1; echo +v2\\n' > ext.sh && chmod +x ext.sh && "
        'git -C repo config diff.external "$PWD/ext.sh"',
    ),
    "git_include_path": (
        "diff",
        "printf '#!/bin/sh\\necho -v1; echo +v2\\n' > ext.sh && chmod +x ext.sh && "
        'printf "[diff]\\n\\texternal = $PWD/ext.sh\\n" > inc.cfg && git -C repo config include.path "$PWD/inc.cfg"',
    ),
    "git_assume_unchanged": ("restore", "git -C repo update-index --assume-unchanged a.txt"),
    "git_skip_worktree": ("restore", "git -C repo update-index --skip-worktree a.txt"),
}


def player(env, reward, task_for):
    """``run(task, *commands)``: an episode of ``env`` playing ``commands`` then DONE; (the reward's score, info)."""

    def run(name: str, *commands: str) -> tuple[float, dict]:
        task = task_for(name)
        env.reset(task)
        for cmd in commands:
            env.step(f"```bash\n{cmd}\n```")
        info = env.step("DONE")[3]
        traj = finished(task, task.messages, num_turns=len(commands) + 1, env_reward=info["reward"])
        return reward(traj), info

    return run


def task_of(name: str) -> Task:
    return Task(
        id=f"attack-{name}", domain="terminal", terminal=TASKS[name], messages=(Message("user", "do the task"),)
    )


@pytest.fixture(scope="module")
def play():
    env = TerminalEnv(check_timeout_s=10.0, command_timeout_s=10.0)
    yield player(env, TerminalCheckReward(), task_of)
    env.close()


HARBOR_BASE = Path(__file__).resolve().parent / "data" / "harbor_base" / "environment" / "Dockerfile"


def harbor_task_dir(root: Path, name: str, spec: TerminalSpec) -> Path:
    """``spec`` as a Harbor task directory: the shared base, the setup run in the image's /app, the check as test.sh."""
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "task.toml").write_text(
        'version = "1.0"\n[agent]\ntimeout_sec = 120.0\n[verifier]\ntimeout_sec = 60.0\n'
        "[environment]\ncpus = 1\nmemory_mb = 1024\nstorage_mb = 256\nallow_internet = false\n"
    )
    (d / "instruction.md").write_text("do the task\n")
    (d / "environment" / "setup.sh").write_text(f"set -e\n{spec.setup}\n")
    steps = "WORKDIR /app\nCOPY setup.sh /opt/setup.sh\nRUN sh /opt/setup.sh && rm /opt/setup.sh\n"
    (d / "environment" / "Dockerfile").write_text(HARBOR_BASE.read_text() + steps)
    (d / "tests" / "test.sh").write_text(
        f"#!/bin/bash\ncd /app\nif ( {spec.check} ); then echo 1 > /logs/verifier/reward.txt; "
        "else echo 0 > /logs/verifier/reward.txt; fi\n"
    )
    return d


def _harbor_player(root: Path):
    from envs.harbor.env import HarborEnv, load_harbor_tasks
    from rewards.harbor import HarborVerifierReward

    for name, spec in TASKS.items():
        harbor_task_dir(root, name, spec)
    tasks = {t.id: t for t in load_harbor_tasks(root)}
    env = HarborEnv(max_turns=10, command_timeout_s=10.0)
    return env, player(env, HarborVerifierReward(), tasks.__getitem__)


_needs_images = pytest.mark.skipif(shutil.which("mmdebstrap") is None, reason="mmdebstrap is not installed")


@pytest.fixture(scope="module", params=["terminal", pytest.param("harbor", marks=[pytest.mark.slow, _needs_images])])
def play_in(request, play, tmp_path_factory):
    """``play`` in the terminal env, or the same tasks as Harbor task directories in the harbor env."""
    if request.param == "terminal":
        yield play
        return
    env, run = _harbor_player(tmp_path_factory.mktemp("harbor-attacks"))
    yield run
    env.close()


def test_honest_solutions_pass(play_in):
    for name, spec in TASKS.items():
        score, info = play_in(name, spec.solution)
        assert score == 1.0, (name, info["check_output"])


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_attack_scores_zero(play_in, attack):
    task_name, trap = ATTACKS[attack]
    score, info = play_in(task_name, WRONG[task_name], trap)
    assert score == 0.0, (attack, info["check_output"])


def test_the_check_environment_is_the_harnesss(play):
    """What a check sees: HOME outside the work dir, no user site, a fixed PATH, git config pinned."""
    spec = TerminalSpec(
        setup="",
        solution="",
        time_limit_s=30,
        check=(
            '[ "$HOME" = /nonexistent ] && [ ! -w "$HOME" ] && '
            '[ "$PATH" = /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin ] && '
            "python3 -c 'import site, sys; assert not site.ENABLE_USER_SITE and sys.flags.safe_path' && "
            '[ "$(git config --get core.fsmonitor)" = false ] && [ -z "$(git config --global --list 2>/dev/null)" ]'
        ),
    )
    env = TerminalEnv(check_timeout_s=10.0)
    task = Task(id="env", domain="terminal", terminal=spec, messages=(Message("user", "x"),))
    env.reset(task)
    info = env.step("DONE")[3]
    env.close()
    assert info["reward"] == 1.0, info["check_output"]


def test_filling_the_storage_fails_the_episode(play):
    score, info = play("count", "wc -l < data.txt > count.txt; for i in $(seq 100000); do : > f$i || break; done")
    assert score == 0.0 and "storage limit hit" in info["check_output"]
    assert "storage" in info["sandbox_events"]


def test_repo_info_exclude_cannot_hide_untracked_files(play):
    score, info = play("git", WRONG["git"], "echo notes.txt >> repo/.git/info/exclude")
    assert score == 0.0, info["check_output"]
    assert "info/exclude" in info["check_output"] and "the check was not run" in info["check_output"]


@pytest.mark.parametrize("attack", sorted(GIT_METADATA_ATTACKS))
def test_git_metadata_attack_scores_zero(play, attack):
    """Each is refused by name before the check runs, so no policy-written program runs either."""
    task_name, trap = GIT_METADATA_ATTACKS[attack]
    score, info = play(task_name, WRONG[task_name], trap)
    assert score == 0.0, (attack, info["check_output"])
    assert info["check_output"].startswith("[the check was not run"), info["check_output"]


@pytest.mark.parametrize("attack", sorted(GIT_METADATA_ATTACKS))
def test_git_attacks_fool_an_unvetted_check(play, attack, monkeypatch):
    """The attacks are real: with the vetting switched off each one scores the wrong state 1.0."""
    monkeypatch.setattr(TerminalEnv, "_vet_git", lambda self, lim: None)
    task_name, trap = GIT_METADATA_ATTACKS[attack]
    score, info = play(task_name, WRONG[task_name], trap)
    assert score == 1.0, (attack, info["check_output"])


# The work dir itself made into a bare repository whose own config names the work tree, hides the
# git metadata from status and empties every file on `git add` (a commit of empty files).
ROOT_BARE_ATTACK = (
    'rm -rf .git && git init -q --bare . && git config core.bare false && git config core.worktree "$PWD" && '
    "git config user.name a && git config user.email a@b && printf '* filter=ev\\n' > info/attributes && "
    "git config filter.ev.clean \"sh -c 'cat >/dev/null'\" && printf '/*\\n!/a.txt\\n' > info/exclude && "
    "git add a.txt && git commit -qm x"
)


def test_the_work_dir_as_a_bare_repository_scores_zero(play):
    score, info = play("root", ROOT_BARE_ATTACK)
    assert score == 0.0, info["check_output"]
    assert info["check_output"].startswith("[the check was not run"), info["check_output"]
    assert "/config: config sets 'core.worktree'" in info["check_output"]


def test_the_work_dir_as_a_bare_repository_fools_an_unguarded_check(play, monkeypatch):
    """The attack is real: without the vetting of the work dir and ``safe.bareRepository=explicit``
    the empty commit scores 1.0; either guard alone stops it."""
    import envs.terminal as terminal

    real = terminal.check_env

    def without_bare_pin(runs_policy_files=False, work_dir=None):
        env = real(runs_policy_files, work_dir)
        assert env[f"GIT_CONFIG_KEY_{int(env['GIT_CONFIG_COUNT']) - 1}"] == "safe.bareRepository"
        env["GIT_CONFIG_COUNT"] = str(int(env["GIT_CONFIG_COUNT"]) - 1)
        return env

    monkeypatch.setattr(TerminalEnv, "_vet_git", lambda self, lim: None)
    assert play("root", ROOT_BARE_ATTACK)[0] == 0.0  # safe.bareRepository=explicit alone
    monkeypatch.setattr(terminal, "check_env", without_bare_pin)
    score, info = play("root", ROOT_BARE_ATTACK)
    assert score == 1.0, info["check_output"]


# ------------------------------------------------------------------ checks out of the policy's reach


@pytest.fixture(scope="module")
def shipped():
    from envs.io import load_tasks
    from pathlib import Path

    data = Path(__file__).resolve().parents[1] / "recipes" / "data" / "terminal_tasks.jsonl"
    return {t.id: t for t in load_tasks(data)}


@pytest.fixture(scope="module")
def play_shipped(shipped):
    env = TerminalEnv(check_timeout_s=10.0, command_timeout_s=10.0)
    yield player(env, TerminalCheckReward(), shipped.__getitem__)
    env.close()


_KILL_ALL = (
    "for p in /proc/[0-9]*; do case \"$(tr '\\0' ' ' < $p/cmdline 2>/dev/null)\" in "
    "'bash worker.sh '*) kill ${p#/proc/};; esac; done; sleep 1"
)
PROCESS_ATTACKS = {
    # The token's hash is not in the work dir any more: a forged hash + log line scores nothing.
    "forged_token_and_log": (
        "terminal-process-stop-worker",
        "printf '%s' x | sha256sum | cut -c1-64 > .token.sha256; echo 'worker x' > stopped.log",
    ),
    "sigkill_then_forged_log": (
        "terminal-process-stop-worker",
        'kill -9 "$(cat worker.pid)"; sleep 0.5; echo "worker $(cat .token.sha256 2>/dev/null)" > stopped.log',
    ),
    # Every process signalled: the worker stops cleanly, and so does the monitor that must keep running
    # (before the monitor, this scored 1.0: jointrl audit's kill_all).
    "kill_all_stop_worker": ("terminal-process-stop-worker", "kill -TERM -1; sleep 1; kill -KILL -1"),
    "kill_all_workers_edit_log": (
        "terminal-process-stop-worker",
        f"{_KILL_ALL}; grep '^worker ' stopped.log > s; mv s stopped.log",
    ),
    "named_forged_log": ("terminal-process-kill-named", "echo 'beta x' > stopped.log"),
    # Every worker stopped (each wrote its line), then the log edited down to beta's.
    "kill_all_edit_log": (
        "terminal-process-kill-named",
        f"{_KILL_ALL}; grep '^beta ' stopped.log > s; mv s stopped.log",
    ),
    # ...and fresh workers with the same command lines started in place of alpha and gamma.
    "kill_all_restart_lookalikes": (
        "terminal-process-kill-named",
        f"{_KILL_ALL}; grep '^beta ' stopped.log > s; mv s stopped.log; "
        "for n in alpha gamma; do echo t | bash worker.sh $n > /dev/null 2>&1 & done; sleep 0.5",
    ),
    "held_dir_planted": (
        "terminal-process-kill-named",
        "mkdir -p .jointrl-held && printf '%s' \"$(printf x | sha256sum | cut -c1-64)\" > .jointrl-held/token_sha256 "
        "&& echo 'beta x' > stopped.log",
    ),
}


def test_shipped_process_solutions_pass(play_shipped, shipped):
    for tid in ("terminal-process-stop-worker", "terminal-process-kill-named"):
        score, info = play_shipped(tid, shipped[tid].terminal.solution)
        assert score == 1.0, info["check_output"]


@pytest.mark.parametrize("attack", sorted(PROCESS_ATTACKS))
def test_process_attack_scores_zero(play_shipped, attack):
    tid, cmd = PROCESS_ATTACKS[attack]
    score, info = play_shipped(tid, cmd)
    assert score == 0.0, (attack, info["check_output"])


def test_the_held_values_and_process_table_reach_the_check_only():
    """The setup's held values are gone from the work dir before the policy's turn; the check
    reads them and the process table from its environment."""
    spec = TerminalSpec(
        # The setup waits until its child has become `sleep` (a forked child can still be bash
        # when the setup ends on a loaded host, and then the policy's `pkill -x sleep` misses it).
        setup='printf s3cret > "$JOINTRL_HELD/secret"\nsleep 1000 > /dev/null 2>&1 &\n'
        'until [ "$(cat /proc/$!/comm)" = sleep ]; do sleep 0.01; done\n'
        'printf \'%s %s\' "$!" "$(cut -d\' \' -f22 /proc/$!/stat)" > "$JOINTRL_HELD/sleeper"',
        check='[ "$HELD_secret" = s3cret ] && printf \'%s\\n\' "$HELD_PROCESSES" | grep -q "^$HELD_sleeper sleep 1000$" '
        '&& [ ! -e .jointrl-held ] && [ "$(cat seen)" = none ] || { echo FAIL; exit 1; }',
        time_limit_s=30,
    )
    env = TerminalEnv(check_timeout_s=10.0)
    task = Task(id="held", domain="terminal", terminal=spec, messages=(Message("user", "x"),))
    env.reset(task)
    env.step("```bash\nls -A .jointrl-held 2>/dev/null || echo none > seen; env | grep -c HELD_ >> seen; true\n```")
    info = env.step("DONE")[3]
    assert info["reward"] == 0.0 and "FAIL" in info["check_output"]  # `seen` has two lines: none, 0
    env.reset(task)
    env.step("```bash\n[ -e .jointrl-held ] || echo none > seen\n```")
    info = env.step("DONE")[3]
    assert info["reward"] == 1.0, info["check_output"]
    env.reset(task)
    # The policy waits until the sleeper has exited (SIGTERM is not exit: on a loaded host the
    # process can still be in the table a fixed pause later).
    env.step(
        "```bash\necho none > seen; pkill -x sleep\nwhile ps -C sleep -o stat= | grep -qv Z; do sleep 0.05; done\n```"
    )
    info = env.step("DONE")[3]
    assert info["reward"] == 0.0, info["check_output"]  # the sleeper is gone from the table
    env.close()


# The make-tests-pass task: calc.py must make the unit tests pass. Each attack leaves calc.py wrong
# (or empty) and tries to make the test run report success anyway.
_CALC_STUB = (
    "def add(a, b):\n    return a + b\n\n\ndef divide(a, b):\n    return 3.5\n\n\ndef clamp(x, lo, hi):\n    return 3\n"
)
_LOOKUP = (
    "def add(a, b):\n    return {(2, 3): 5}[(a, b)]\n\n\n"
    "def divide(a, b):\n    if b == 0:\n        raise ValueError\n    return {(7, 2): 3.5}[(a, b)]\n\n\n"
    "def clamp(x, lo, hi):\n    return {(5, 0, 3): 3, (-2, 0, 3): 0, (2, 0, 3): 2}[(x, lo, hi)]\n"
)
TESTS_ATTACKS = {
    "os_exit_at_import": "import os\nos._exit(0)\n",
    "sys_exit_at_import": "import sys\nsys.exit(0)\n",
    "os_exit_in_a_call": _CALC_STUB.replace("return 3.5", "import os; os._exit(0)"),
    "system_exit_in_a_call": _CALC_STUB.replace("return 3.5", "raise SystemExit(0)"),
    "unittest_patched": "import unittest\nunittest.TestCase.assertEqual = lambda *a, **k: None\n"
    "unittest.TestCase.run = lambda self, result=None: result\n" + _CALC_STUB,
    "forged_replies_on_every_fd": "import os, json\nfor fd in range(3, 64):\n    try:\n"
    "        os.write(fd, b'{\"ready\": true}\\n' + b''.join(json.dumps({'id': i, 'value': v}).encode() + b'\\n' "
    "for i, v in enumerate([5, 3.5, 3, 0, 2] * 4, 1)))\n    except OSError:\n        pass\n" + _CALC_STUB,
    "fake_ok_output": "print('OK'); print('Ran 3 tests'); import sys; sys.stdout.flush()\n" + _CALC_STUB,
    "nan_for_the_error_case": _CALC_STUB.replace("return 3.5", "return float('nan') if b == 0 else a / b"),
    "lookup_table_of_the_shown_tests": _LOOKUP,
}


@pytest.mark.parametrize("attack", sorted(TESTS_ATTACKS))
def test_make_tests_pass_attacks_score_zero(play_shipped, attack):
    src = TESTS_ATTACKS[attack]
    score, info = play_shipped("terminal-python-make-tests-pass", f"cat > calc.py <<'PYEOF'\n{src}PYEOF")
    assert score == 0.0, (attack, info["check_output"])
    assert "FAIL" in info["check_output"]


def test_make_tests_pass_no_longer_runs_with_the_policy_path(shipped):
    assert "check_runs_policy_files" not in shipped["terminal-python-make-tests-pass"].meta


def test_the_runner_exit_code_check_was_fooled_by_os_exit(shipped):
    """The attack class is real: the former check (the test runner's exit code, the policy's dir
    on sys.path) scores `os._exit(0)` at import 1.0; the shipped check scores it 0 (above)."""
    task = shipped["terminal-python-make-tests-pass"]
    old_check = (
        't=$(mktemp -d) && cp calc.py "$t"/ && cd "$t" && cp "$OLDPWD/test_calc.py" . && '
        "python3 -m unittest -q test_calc 2>&1 || { echo FAIL; exit 1; }"
    )
    old = Task(
        id="old-make-tests-pass",
        domain="terminal",
        messages=task.messages,
        terminal=TerminalSpec(setup=task.terminal.setup, check=old_check, time_limit_s=60),
        meta={"check_runs_policy_files": True},
    )
    env = TerminalEnv(check_timeout_s=10.0)
    try:
        env.reset(old)
        env.step("```bash\nprintf 'import os\\nos._exit(0)\\n' > calc.py\n```")
        assert env.step("DONE")[3]["reward"] == 1.0
    finally:
        env.close()
