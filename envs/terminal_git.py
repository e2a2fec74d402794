"""Vetting the git repositories a terminal check is about to read (stdlib only; also a script).

Why: a terminal check that asks git (``git status``, ``git diff``, ``git ls-files``) reads
the repository's own metadata, and that metadata is the policy's state. Repository-local
config can make git run a program during the check (``filter.<x>.clean`` with a
``.gitattributes`` line, ``diff.<x>.textconv``, ``diff.external``, ``core.fsmonitor``,
hooks, aliases, ``include.path`` pulling in another file) or change what git reports
(``.git/info/exclude``, ``core.excludesFile``, ``status.showUntrackedFiles``,
``core.ignoreStat``, ``core.worktree``, a ``.git`` file pointing at another git dir,
grafts, a ``shallow`` file, assume-unchanged and skip-worktree bits in the index). git
2.39 has no switch that ignores a repository's config or attributes, so the harness
checks the repositories first and refuses to score a work dir whose git metadata holds
anything beyond what ``git init``, ``commit``, ``branch``, ``remote`` and an identity write.

What is vetted (:func:`vet`, run inside the check's sandbox by :class:`envs.terminal.TerminalEnv`
before the check, with the check's environment):

* every directory git could use from a working directory in the work dir: each ``.git``
  entry (which must be a directory: no gitfile, no symlink, no ``commondir`` file) and each
  directory holding ``HEAD``, ``objects`` and ``refs`` (a bare repository, or a copy of a git
  dir), the work dir itself and the insides of ``.git`` directories included. The walk
  (:func:`find_git_dirs`) is iterative and bounded (:data:`MAX_DEPTH`, :data:`MAX_ENTRIES`):
  a tree past the bounds is refused, never half-vetted. The check's environment adds
  ``safe.bareRepository=explicit`` (git discovers no bare repository) and
  ``GIT_CEILING_DIRECTORIES`` (git discovers nothing above the work dir);
* its ``config`` (and ``config.worktree``) may set only the keys of :data:`ALLOWED_KEYS`
  (read with ``git config --file ... --list``, which parses and never follows includes
  or runs anything); every other key is refused by name;
* ``info/exclude`` and ``info/attributes`` hold only comments; ``info/grafts`` and
  ``shallow`` do not exist; no ``.gitattributes`` with content anywhere in the work dir
  (attributes assign drivers and line-ending conversions, and git 2.39 cannot be told to
  ignore them);
* the index has no assume-unchanged or skip-worktree entries (``git ls-files -v``, run
  only once the config passed).

What is not vetted, and why that is safe: in-tree ``.gitignore`` files are the policy's
legitimate work (a check that means "clean" lists ignored files too:
``git status --porcelain --ignored --untracked-files=all``); replace refs are switched
off by ``GIT_NO_REPLACE_OBJECTS`` in the check's environment; hooks and fsmonitor are
pinned off there too. Object alternates can add objects but not change what a ref or
path names (objects are addressed by hash).

Output: one ``refused: <path>: <why>`` line per problem on stdout and exit status 1, or
nothing and exit status 0. Run as ``python3 -I envs/terminal_git.py WORK_DIR [GIT]``.
"""

from __future__ import annotations

import fnmatch
import os
import stat
import subprocess
import sys

__all__ = ["ALLOWED_KEYS", "MAX_DEPTH", "MAX_ENTRIES", "key_problem", "find_git_dirs", "vet", "main"]

# Repository-local config keys a checked repository may hold: what git itself writes for
# init/clone/branch/remote/worktree-less use, an identity, and settings that only matter to
# commands a check does not run (push, pull, fetch). Patterns are fnmatch on the key as
# `git config --list` prints it (section and name lowercased; `*` matches a subsection).
ALLOWED_KEYS = (
    "core.repositoryformatversion",
    "core.filemode",
    "core.bare",
    "core.logallrefupdates",
    "extensions.objectformat",
    "init.defaultbranch",
    "user.name",
    "user.email",
    "author.name",
    "author.email",
    "committer.name",
    "committer.email",
    "branch.*.remote",
    "branch.*.merge",
    "branch.*.rebase",
    "branch.*.description",
    "remote.*.url",
    "remote.*.pushurl",
    "remote.*.fetch",
    "remote.*.push",
    "pull.rebase",
    "pull.ff",
    "push.default",
    "push.autosetupremote",
    "advice.*",
)
# Allowed keys whose other values change what git reports: filemode=false hides mode changes.
# (core.bare=true on a work tree's .git makes status and diff fail, which fails the check.)
_REQUIRED_VALUES = {"core.filemode": True}
_BOOLS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}
# Files in a git dir that change what git reports; harness setups never create them.
_REFUSED_FILES = {
    "commondir": "redirects the repository to another git dir",
    "info/grafts": "grafts rewrite the history git reports",
    "shallow": "a shallow file cuts the history git reports",
}
# Files that must hold only comments: `git init` writes a commented info/exclude.
_COMMENT_ONLY = {
    "info/exclude": "ignore patterns here hide files from git status",
    "info/attributes": "attributes here assign drivers (programs) and conversions",
}


def key_problem(key: str, value: str | None = None) -> str | None:
    """Why a repository-local config key (set to ``value``) is refused, or None when it is allowed."""
    # `git config --list` prints section and name lowercased, a subsection as written.
    if any(fnmatch.fnmatchcase(key, pat) for pat in ALLOWED_KEYS):
        want = _REQUIRED_VALUES.get(key)
        if want is not None and (True if value is None else _BOOLS.get(value.strip().lower())) is not want:
            return f"config sets {key!r} to {value!r} (only {str(want).lower()} keeps git reporting every change)"
        return None
    section = key.split(".", 1)[0]
    why = {
        "include": "pulls in another config file",
        "includeif": "pulls in another config file",
        "filter": "a filter driver runs a program when git reads files",
        "diff": "diff settings run programs (textconv, external) or change diff output",
        "merge": "a merge driver runs a program",
        "alias": "an alias can run a program",
        "status": "changes what git status reports",
        "core": "core settings change what git reports or run programs",
    }.get(section, "not a setting a checked repository may carry")
    return f"config sets {key!r} ({why})"


# Bounds of the walk: a policy can build a tree deeper or larger than any task needs; past these
# the tree is not walked further and the walk reports a problem (the check is then refused).
MAX_DEPTH = 1000
MAX_ENTRIES = 1_000_000
_GIT_DIR_NAMES = frozenset({"HEAD", "objects", "refs"})


def find_git_dirs(root: str) -> tuple[list[str], list[str]]:
    """(git dirs to vet, problems found while walking ``root``), symlinks never followed.

    Every directory under ``root``, ``root`` itself and the insides of ``.git`` directories
    included, is one git could use: a ``.git`` directory in it, or the directory itself when
    it holds ``HEAD``, ``objects`` and ``refs`` (a bare repository, which git discovers from
    a working directory inside it). A ``.git`` that is not a real directory is a problem (a
    gitfile or symlink redirects git elsewhere); so is a ``.gitattributes`` with content, a
    directory that cannot be listed, and a tree past :data:`MAX_DEPTH` levels or
    :data:`MAX_ENTRIES` entries (what lies beyond was not vetted). The walk is iterative
    (no recursion limit) and lists each directory once. A missing ``root`` has nothing to vet.
    """
    gitdirs: list[str] = []
    problems: list[str] = []
    if not os.path.isdir(root) or os.path.islink(root):
        return gitdirs, problems
    stack = [(root, 0)]
    seen = 0
    while stack:
        top, depth = stack.pop()
        try:
            with os.scandir(top) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            problems.append(f"{top}: cannot be listed ({exc.strerror}); git metadata below it was not vetted")
            continue
        seen += len(entries)
        if seen > MAX_ENTRIES:
            problems.append(f"{root}: more than {MAX_ENTRIES} entries; the rest of the tree was not vetted")
            break
        names = {e.name for e in entries}
        problems += _entry_problems(top, entries, gitdirs)
        if _GIT_DIR_NAMES <= names:
            gitdirs.append(top)  # a bare repository (or a .git dir, or a copy of one)
        subdirs = [e.path for e in entries if e.is_dir(follow_symlinks=False)]
        if subdirs and depth >= MAX_DEPTH:
            problems.append(f"{top}: deeper than {MAX_DEPTH} levels; the tree below was not vetted")
            continue
        stack.extend((p, depth + 1) for p in reversed(subdirs))
    return list(dict.fromkeys(gitdirs)), problems


def _entry_problems(top: str, entries: list, gitdirs: list[str]) -> list[str]:
    """The problems of one directory's ``.git`` and ``.gitattributes`` entries; a real ``.git``
    directory is added to ``gitdirs``."""
    problems = []
    for e in entries:
        if e.name == ".git":
            if e.is_dir(follow_symlinks=False):
                gitdirs.append(e.path)
            else:
                problems.append(f"{e.path}: .git is not a directory (a gitfile or symlink points git elsewhere)")
        elif e.name == ".gitattributes" and _has_content(e.path):
            problems.append(f"{e.path}: attributes assign drivers and conversions that change what git reports")
    return problems


def _has_content(path: str) -> bool:
    """Whether a file has a line that is not blank or a comment (a symlink or non-file counts)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode):
        return True
    with open(path, "rb") as f:
        return any(ln.strip() and not ln.lstrip().startswith(b"#") for ln in f)


def _config_entries(git: str, path: str) -> list[tuple[str, str | None]]:
    """(key, value) set in one config file; parsing only (no includes are followed, nothing runs)."""
    out = subprocess.run(
        [git, "config", "--file", path, "--null", "--list"], capture_output=True, check=False, timeout=30
    )
    if out.returncode != 0:
        raise ValueError(out.stderr.decode("utf-8", "replace").strip() or f"exit {out.returncode}")
    entries = []
    for entry in out.stdout.split(b"\0"):
        if entry:
            key, sep, value = entry.decode("utf-8", "replace").partition("\n")
            entries.append((key, value if sep else None))  # no value: a boolean set to true
    return entries


def _vet_config(git: str, gitdir: str) -> list[str]:
    problems = []
    for name in ("config", "config.worktree"):
        path = os.path.join(gitdir, name)
        if not os.path.lexists(path):
            continue
        if not stat.S_ISREG(os.lstat(path).st_mode):
            problems.append(f"{path}: not a regular file")
            continue
        try:
            entries = _config_entries(git, path)
        except (ValueError, subprocess.TimeoutExpired) as exc:
            problems.append(f"{path}: unreadable config ({exc})")
            continue
        problems += [f"{path}: {why}" for why in (key_problem(k, v) for k, v in entries) if why]
    return problems


def _vet_files(gitdir: str) -> list[str]:
    problems = [
        f"{os.path.join(gitdir, rel)}: {why}"
        for rel, why in _REFUSED_FILES.items()
        if os.path.lexists(os.path.join(gitdir, rel))
    ]
    problems += [
        f"{os.path.join(gitdir, rel)}: {why}"
        for rel, why in _COMMENT_ONLY.items()
        if _has_content(os.path.join(gitdir, rel))
    ]
    return problems


def _vet_index(git: str, gitdir: str) -> list[str]:
    """Entries git is told not to look at: assume-unchanged (lowercase tag), skip-worktree (S)."""
    if os.path.basename(gitdir) != ".git" or not os.path.exists(os.path.join(gitdir, "index")):
        return []
    out = subprocess.run(
        [git, "--git-dir", gitdir, "--work-tree", os.path.dirname(gitdir), "ls-files", "-v", "-z"],
        capture_output=True,
        check=False,
        timeout=30,
    )
    if out.returncode != 0:
        return [f"{gitdir}: git ls-files failed: {out.stderr.decode('utf-8', 'replace').strip()}"]
    hidden = [
        e[2:].decode("utf-8", "replace") for e in out.stdout.split(b"\0") if e and (e[:1].islower() or e[:1] == b"S")
    ]
    if hidden:
        return [
            f"{gitdir}: the index marks {hidden[:3]} assume-unchanged or skip-worktree (git would not look at them)"
        ]
    return []


def vet(root: str, git: str = "git") -> list[str]:
    """Every problem with the git metadata under ``root`` (empty: the checks may read it)."""
    gitdirs, problems = find_git_dirs(root)
    for gitdir in gitdirs:
        found = _vet_config(git, gitdir) + _vet_files(gitdir)
        if not found:  # only a vetted config may be used by a git command
            found = _vet_index(git, gitdir)
        problems += found
    return problems


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: terminal_git.py WORK_DIR [GIT]", file=sys.stderr)
        return 2
    problems = vet(argv[1], argv[2] if len(argv) == 3 else "git")
    for p in problems:
        print(f"refused: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
