"""envs.terminal_git: which git metadata the harness refuses before a terminal check reads a repo.

Fast (no sandbox): real repositories made with the host's git in a temp dir, vetted in
process. The end-to-end path (TerminalEnv + TerminalCheckReward scoring such a repo 0) is in
tests/test_attacks_terminal.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from envs import terminal_git
from envs.terminal_git import key_problem, vet

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


@pytest.fixture(autouse=True)
def _no_host_config(monkeypatch):
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", "/dev/null")
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")


def git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def work(tmp_path):
    """A work dir holding `repo`, as a harness setup makes it: init, identity, one commit."""
    repo = tmp_path / "repo"
    git(tmp_path, "init", "-q", "-b", "main", "repo")
    git(repo, "config", "user.name", "a")
    git(repo, "config", "user.email", "a@b")
    (repo / "a.txt").write_text("v1\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-qm", "v1")
    return tmp_path


def test_a_repository_as_git_makes_it_passes(work):
    repo = work / "repo"
    git(repo, "remote", "add", "origin", "https://example.com/x.git")
    git(repo, "config", "branch.main.remote", "origin")
    git(repo, "config", "branch.main.merge", "refs/heads/main")
    git(repo, "checkout", "-qb", "Feature/X")
    (repo / ".gitignore").write_text("*.log\n")  # in-tree ignore rules are the policy's work
    git(work, "init", "-q", "--bare", "mirror.git")
    assert vet(str(work)) == []


@pytest.mark.parametrize(
    "key, value",
    [
        ("core.fsmonitor", "/work/hook.sh"),
        ("core.hooksPath", "/work/hooks"),
        ("core.sshCommand", "/work/ssh.sh"),
        ("core.pager", "/work/pager.sh"),
        ("core.worktree", "/work/elsewhere"),
        ("core.excludesFile", "/work/ex"),
        ("core.attributesFile", "/work/attrs"),
        ("core.ignoreStat", "true"),
        ("core.autocrlf", "true"),
        ("status.showUntrackedFiles", "no"),
        ("filter.ev.clean", "sh -c 'touch /work/pwned; cat'"),
        ("filter.ev.process", "/work/p.sh"),
        ("diff.tc.textconv", "sed s/a/b/"),
        ("diff.external", "/work/ext.sh"),
        ("merge.m.driver", "/work/m.sh"),
        ("alias.st", "!/work/x.sh"),
        ("include.path", "/work/inc.cfg"),
        ("includeIf.gitdir:/work/.path", "/work/inc.cfg"),
        ("color.ui", "always"),
        ("core.filemode", "false"),
        ("core.ignorecase", "true"),
        ("extensions.worktreeConfig", "true"),
    ],
)
def test_program_running_and_output_shaping_keys_are_refused_by_name(work, key, value):
    git(work / "repo", "config", key, value)
    problems = vet(str(work))
    assert len(problems) == 1 and f"{key.rsplit('.', 1)[0].split('.', 1)[0].lower()}." in problems[0], problems
    assert problems[0].startswith(str(work / "repo" / ".git" / "config")), problems


def test_key_problem_allowlist_matches_subsections_and_nothing_more():
    assert key_problem("branch.Feature/X.merge") is None and key_problem("remote.origin.url") is None
    assert key_problem("user.email") is None and key_problem("advice.detachedhead") is None
    assert "filter driver" in key_problem("filter.ev.clean")
    assert "another config file" in key_problem("include.path")
    assert key_problem("user.signingkey") is not None and key_problem("remote.origin.uploadpack") is not None
    assert key_problem("core.filemode", "true") is None and key_problem("core.filemode", None) is None
    assert key_problem("core.filemode", "Yes") is None and key_problem("core.bare", "true") is None
    assert "only true" in key_problem("core.filemode", "off") and key_problem("core.filemode", "2") is not None


def test_config_worktree_is_vetted_too(work):
    (work / "repo" / ".git" / "config.worktree").write_text("[core]\n\tfsmonitor = /work/h.sh\n")
    assert any("config.worktree" in p and "core.fsmonitor" in p for p in vet(str(work)))


@pytest.mark.parametrize(
    "rel, content, why",
    [
        ("repo/.git/info/exclude", "notes.txt\n", "ignore patterns"),
        ("repo/.git/info/attributes", "* filter=ev\n", "attributes here"),
        ("repo/.gitattributes", "* diff=tc\n", "attributes assign"),
        ("repo/sub/.gitattributes", "*.txt text eol=crlf\n", "attributes assign"),
        ("repo/.git/info/grafts", "0000000000000000000000000000000000000000\n", "grafts"),
        ("repo/.git/shallow", "0000000000000000000000000000000000000000\n", "shallow"),
        ("repo/.git/commondir", "../../other\n", "another git dir"),
    ],
)
def test_metadata_files_that_change_what_git_reports_are_refused(work, rel, content, why):
    path = work / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    problems = vet(str(work))
    assert any(why in p for p in problems), problems


def test_comment_only_exclude_and_attributes_pass(work):
    (work / "repo" / ".git" / "info").mkdir(exist_ok=True)
    (work / "repo" / ".git" / "info" / "exclude").write_text("# git ls-files --others --exclude-from=...\n\n")
    (work / "repo" / ".gitattributes").write_text("# nothing\n")
    assert vet(str(work)) == []


def test_a_gitfile_or_symlinked_git_dir_is_refused(work):
    shutil.move(str(work / "repo" / ".git"), str(work / "decoy.git"))
    (work / "repo" / ".git").write_text(f"gitdir: {work / 'decoy.git'}\n")
    assert any(".git is not a directory" in p for p in vet(str(work)))
    os.remove(work / "repo" / ".git")
    os.symlink(work / "decoy.git", work / "repo" / ".git")
    assert any(".git is not a directory" in p for p in vet(str(work)))


def test_a_bare_repository_is_vetted_like_a_git_dir(work):
    git(work, "init", "-q", "--bare", "hub.git")
    git(work / "hub.git", "config", "core.fsmonitor", "/work/h.sh")
    assert any("hub.git/config" in p and "core.fsmonitor" in p for p in vet(str(work)))


@pytest.mark.parametrize("flag", ["--assume-unchanged", "--skip-worktree"])
def test_index_entries_git_is_told_not_to_look_at_are_refused(work, flag):
    git(work / "repo", "update-index", flag, "a.txt")
    problems = vet(str(work))
    assert len(problems) == 1 and "'a.txt'" in problems[0] and "assume-unchanged or skip-worktree" in problems[0]


def test_vetting_runs_no_program_the_policy_wrote(work):
    """A refused config is never used by a git command: the fsmonitor hook does not run."""
    hook = work / "hook.sh"
    hook.write_text(f"#!/bin/sh\ntouch {work}/pwned\nexit 1\n")
    hook.chmod(0o755)
    git(work / "repo", "update-index", "--assume-unchanged", "a.txt")  # before the hook is set
    git(work / "repo", "config", "core.fsmonitor", str(hook))
    assert any("core.fsmonitor" in p for p in vet(str(work)))
    assert not (work / "pwned").exists()


def test_main_prints_one_refusal_per_problem_and_exits_1(work, capsys):
    (work / "repo" / ".gitattributes").write_text("* filter=ev\n")
    git(work / "repo", "config", "filter.ev.clean", "cat")
    assert terminal_git.main(["terminal_git.py", str(work)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and all(ln.startswith("refused: ") for ln in out)
    assert terminal_git.main(["terminal_git.py", str(work / "empty-does-not-exist")]) == 0
    assert terminal_git.main(["terminal_git.py"]) == 2


def test_the_work_dir_itself_as_a_bare_repository_is_vetted(tmp_path):
    """The walk starts at the work dir: a work dir made into a repository is vetted like any."""
    git(tmp_path, "init", "-q", "--bare", ".")
    git(tmp_path, "config", "core.worktree", str(tmp_path))
    (tmp_path / "info" / "exclude").write_text("/*\n!/a.txt\n")
    problems = vet(str(tmp_path))
    assert any(p.startswith(f"{tmp_path}/config:") and "core.worktree" in p for p in problems), problems
    assert any("info/exclude" in p for p in problems), problems


def test_a_repository_hidden_inside_a_bare_looking_directory_is_vetted(work):
    git(work, "init", "-q", "--bare", "hub.git")
    git(work / "hub.git", "init", "-q", "inner")  # a repo inside the bare one's directory
    git(work / "hub.git" / "inner", "config", "diff.external", "/work/x.sh")
    assert any("hub.git/inner/.git/config" in p and "diff.external" in p for p in vet(str(work)))


def test_a_chain_deeper_than_the_bound_is_refused_not_a_recursion_error(tmp_path):
    deep = str(tmp_path)
    for _ in range(terminal_git.MAX_DEPTH + 100):  # a loop: pathlib's mkdir(parents=True) recurses
        deep += "/d"
        os.mkdir(deep)
    with open(deep + "/.gitattributes", "w") as f:  # below the bound: never reached
        f.write("* filter=ev\n")
    try:
        gitdirs, problems = terminal_git.find_git_dirs(str(tmp_path))
    finally:  # rm -rf: pytest's own clean-up of old temp dirs recurses, and would raise on this chain later
        subprocess.run(["rm", "-rf", "--", str(tmp_path / "d")], check=False)
    assert gitdirs == [] and len(problems) == 1 and f"deeper than {terminal_git.MAX_DEPTH} levels" in problems[0]
    shallow = tmp_path / "ok"
    shallow.joinpath(*(["d"] * 50)).mkdir(parents=True)  # within the bound: walked, nothing found
    assert terminal_git.find_git_dirs(str(shallow)) == ([], [])


def test_the_entry_bound_stops_the_walk_with_a_problem(tmp_path, monkeypatch):
    monkeypatch.setattr(terminal_git, "MAX_ENTRIES", 10)
    for i in range(20):
        (tmp_path / f"f{i}").write_text("x")
    gitdirs, problems = terminal_git.find_git_dirs(str(tmp_path))
    assert gitdirs == [] and len(problems) == 1 and "more than 10 entries" in problems[0]
