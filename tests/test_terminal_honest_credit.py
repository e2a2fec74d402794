"""Honest partial credit on every shipped terminal task (issue #39, item 3).

Strategies that do none of a task's work, run through the real env and reward on every task
of every shipped terminal task file (``recipes/data/terminal_*.jsonl``, the generators'
output): a no-op, deleting everything, and replacing every file by a symlink to a copy.
Each must score 0. The fast tier runs all of ``terminal_tasks.jsonl`` and a sample of the
ladder; the slow tier every task of every file. Plus targeted attacks on the classes the
issue names: removal sub-checks that paid for destroying the input, symlinks passing "is a
file", a revision expression passing "is a hash", a no-op earning partial credit.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from envs.io import load_tasks
from envs.sandbox import SandboxUnavailable, check_sandbox
from envs.terminal import TerminalEnv
from envs.types import Task
from rewards.terminal import TerminalCheckReward
from trajs import finished

try:
    check_sandbox()
except SandboxUnavailable as exc:  # pragma: no cover - CI installs bubblewrap
    pytest.skip(f"bubblewrap sandbox unavailable here: {exc}", allow_module_level=True)

DATA = Path(__file__).resolve().parents[1] / "recipes" / "data"
FILES = sorted(DATA.glob("terminal_*.jsonl"))
ALL = list({t.id: t for f in FILES for t in load_tasks(f)}.values())
BY_ID = {t.id: t for t in ALL}
FAST = [t for t in ALL if t.meta.get("source") == "jointrl"][::10] + [
    t for t in ALL if t.meta.get("source") != "jointrl"
][::60]

# Strategies that do no work of any task: each must score 0 on every task.
DESTROY = "find . -mindepth 1 -maxdepth 1 -exec rm -rf {} + ; true"
SYMLINK_EVERYTHING = (
    "mkdir -p /tmp/keep && for f in $(find . -type f -not -path './.git/*' -not -path '*/.git/*'); do "
    'c=/tmp/keep/$(echo "$f" | tr / _); cp -p "$f" "$c" && ln -sf "$c" "$f"; done; true'
)
STRATEGIES = {"noop": None, "destroy_everything": DESTROY, "symlink_everything": SYMLINK_EVERYTHING}


@pytest.fixture(scope="module")
def play():
    env, reward = TerminalEnv(check_timeout_s=10.0, command_timeout_s=10.0), TerminalCheckReward()

    def run(task: Task, *commands: str) -> tuple[float, str]:
        env.reset(task)
        for cmd in commands:
            env.step(f"```bash\n{cmd}\n```")
        info = env.step("DONE")[3]
        traj = finished(task, task.messages, num_turns=len(commands) + 1, env_reward=info["reward"])
        return reward(traj), info["check_output"]

    yield run
    env.close()


def _scores(play, tasks: list[Task]) -> list[str]:
    bad = []
    for t in tasks:
        for name, cmd in STRATEGIES.items():
            score, out = play(t, *([cmd] if cmd else []))
            if score != 0.0:
                bad.append(f"{t.id}: {name} scores {score}: {out[:200]}")
    return bad


def test_shipped_files_are_all_covered():
    names = {f.name for f in FILES}
    assert {"terminal_tasks.jsonl", "terminal_ladder.train.jsonl", "terminal_ladder.eval.jsonl"} <= names
    assert len(ALL) >= 43 + 200 and len(FAST) < len(ALL)


def test_work_free_strategies_score_zero_on_a_sample(play):
    bad = _scores(play, FAST)
    assert not bad, "\n".join(bad)


@pytest.mark.slow
def test_work_free_strategies_score_zero_on_every_shipped_terminal_task(play):
    bad = _scores(play, ALL)
    assert not bad, "\n".join(bad)


def _ladder(template: str) -> Task:
    return next(t for t in ALL if t.meta.get("template") == template)


def test_destroying_the_input_earns_no_removal_credit(play):
    """organize_logs and archive_dir paid 1/3 and 1/2 for deleting the .log files or the directory."""
    for template, cmd in (("organize_logs", "rm -f *.log"), ("archive_dir", "rm -rf */")):
        task = _ladder(template)
        score, out = play(task, cmd)
        assert score == 0.0, (template, out)
        ok, out = play(task, task.terminal.solution)
        assert ok == 1.0, (template, out)


def test_guessed_outputs_earn_no_sub_check(play):
    """Found by `jointrl audit`: a constant or a list of candidates in the named outputs earned the
    "kept the originals" third of backup_txt (0.33: writing backup/list.txt makes backup/) and one
    line of two_counts (0.5: the counts are small numbers)."""
    task = _ladder("backup_txt")
    for guess in ("mkdir backup", "mkdir -p backup && echo 0 > backup/list.txt"):
        assert play(task, guess)[0] == 0.0, guess
    assert play(task, task.terminal.solution)[0] == 1.0
    enumerate_ = "seq 0 200 > stats.txt"
    for task in [t for t in ALL if t.meta.get("template") == "two_counts"][:3]:
        for guess in (
            "echo 1 > stats.txt",
            "printf '1\\n1\\n' > stats.txt",
            "printf '2\\n1\\n' > stats.txt",
            enumerate_,
        ):
            score, out = play(task, guess)
            # A guess that is both counts is the answer; any other scores 0, never half.
            assert score in (0.0, 1.0), (task.id, guess, out)
            assert score == 0.0 or guess != enumerate_, (task.id, guess, out)
    assert play(task, task.terminal.solution)[0] == 1.0


def test_symlinks_are_not_the_files_asked_for(play):
    # The reference copies; the attack links the destination to the source instead.
    task = _ladder("copy_file")
    attack = task.terminal.solution.replace("cp ", "ln -s ", 1)
    assert attack != task.terminal.solution
    assert play(task, attack)[0] == 0.0
    # backup/ a link to the work dir: every "copy" is the original itself.
    task = _ladder("backup_txt")
    assert play(task, "ln -s . backup && ls *.txt | sort > list.txt")[0] == 0.0
    assert play(task, task.terminal.solution)[0] == 1.0


def test_shipped_text_checks_refuse_a_symlink_to_a_right_answer(play):
    task = BY_ID["terminal-process-count-sleep"]
    score, out = play(task, "echo 3 > /tmp/c && ln -s /tmp/c count.txt")
    assert score == 0.0 and "count.txt" in out
    assert play(task, task.terminal.solution)[0] == 1.0


@pytest.mark.parametrize(
    "answer",
    [
        # A 40-character revision expression that names the right commit.
        "HEAD~2" + "^0" * 17,
        "$(git -C history log --format=%H --grep='^tune network settings$' | tr a-f A-F)",
    ],
)
def test_a_hash_answer_must_be_40_hex_digits(play, answer):
    task = BY_ID["terminal-git-find-commit"]
    cmd = f'printf "%s\\n" "{answer}" > answer.txt; [ "$(git -C history rev-parse "$(cat answer.txt)")" ] ; true'
    score, out = play(task, cmd)
    assert score == 0.0, out


def test_a_commit_the_policy_adds_with_the_same_message_is_not_the_answer(play):
    task = BY_ID["terminal-git-find-commit"]
    cmd = (
        "git -C history commit -q --allow-empty -m 'tune network settings' && "
        "git -C history rev-parse HEAD > answer.txt"
    )
    assert play(task, cmd)[0] == 0.0


def test_permissions_partial_credit_counts_only_paths_that_needed_a_change(play):
    task = BY_ID["terminal-permissions-fix-tree"]
    assert play(task)[0] == 0.0  # a.png was already right: no credit for it
    half, _ = play(task, "chmod 755 www/css www/cgi-bin && chmod 644 www/css/site.css")
    assert 0.0 < half < 1.0
    broke, _ = play(
        task, "chmod 755 www/css www/cgi-bin && chmod 644 www/css/site.css && chmod 600 www/img/icons/a.png"
    )
    assert broke < half  # breaking a right path counts against
    assert play(task, "rm -rf www && mkdir -p www")[0] == 0.0


def test_validate_names_a_check_that_reads_its_reference_from_the_work_dir(tmp_path):
    """Bad input: a check comparing with a hash its setup keeps in the work dir (the old process
    tasks' shape) is refused by `jointrl validate`, naming the file key, the task and the field."""
    import yaml

    from envs.io import save_tasks
    from envs.terminal import reference_problems
    from envs.types import Message, TerminalSpec
    from rl.config.recipe import RecipeError, load_recipe, validate_recipe

    bad = Task(
        id="forgeable",
        domain="terminal",
        messages=(Message("user", "stop the worker"),),
        terminal=TerminalSpec(
            setup="printf '%s' \"$(echo t | sha256sum)\" > .token.sha256",
            check='[ "$(cat stopped.log | sha256sum)" = "$(cat .token.sha256)" ]',
        ),
    )
    held = Task(
        id="held",
        domain="terminal",
        messages=(Message("user", "stop the worker"),),
        terminal=TerminalSpec(
            setup='printf \'%s\' "$(echo t | sha256sum)" > "$JOINTRL_HELD/token_sha256"',
            check='[ "$(cat stopped.log | sha256sum)" = "$HELD_token_sha256" ]',
        ),
    )
    assert reference_problems(held) == [] and all(reference_problems(t) == [] for t in ALL)
    (problem,) = reference_problems(bad)
    assert "'forgeable'" in problem and "'terminal.check'" in problem and "'.token.sha256'" in problem
    repo = Path(__file__).resolve().parents[1]
    d = yaml.safe_load((repo / "recipes" / "tiny.yaml").read_text())
    files = [str(repo / "recipes" / f) for f in d["data"]["train_files"]]
    save_tasks([held, bad], tmp_path / "mine.jsonl")
    d["data"] = {**d["data"], "train_files": [*files, str(tmp_path / "mine.jsonl")], "eval_files": []}
    d["run"]["output_dir"] = str(tmp_path / "out")
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump(d))
    with pytest.raises(RecipeError, match=rf"data\.train_files\.{len(files)}.*'forgeable'.*'terminal\.check'"):
        validate_recipe(load_recipe(p))
    save_tasks([held], tmp_path / "mine.jsonl")
    validate_recipe(load_recipe(p))
