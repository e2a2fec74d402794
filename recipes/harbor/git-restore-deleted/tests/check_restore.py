"""Verifier of git-restore-deleted: exit 0 only when main restores settings.ini at v1.0's content
in a new commit on top of the history that deleted it.

Every value compared comes from /tests (the expected file) or from git objects read with plumbing
commands under a pinned configuration; nothing the agent wrote outside the repository is read."""

import os
import subprocess
import sys

REPO = "/app/repo"
PINS = ["-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null", "-c", "safe.directory=*"]
ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_NO_REPLACE_OBJECTS": "1",
    "GIT_OPTIONAL_LOCKS": "0",
    "GIT_TERMINAL_PROMPT": "0",
}


def git(*args: str) -> bytes | None:
    r = subprocess.run(["git", *PINS, "-C", REPO, *args], env=ENV, capture_output=True, timeout=30)
    return r.stdout if r.returncode == 0 else None


def blob(rev: str, path: str) -> bytes | None:
    return git("cat-file", "blob", f"{rev}:{path}")


def main() -> int:
    want = open("/tests/settings_v1.ini", "rb").read()
    head = git("rev-parse", "--verify", "refs/heads/main^{commit}")
    if head is None:
        return print("no main branch") or 1
    if blob("refs/heads/main", "config/settings.ini") != want:
        return print("main's config/settings.ini is not v1.0's content") or 1
    if blob("refs/heads/main", "notes.txt") != b"Configuration now comes from the deployment tool.\n":
        return print("notes.txt changed or missing on main") or 1
    # The deletion commit must still be in main's history (a reset to v1.0 drops it).
    revs = (git("rev-list", "refs/heads/main") or b"").decode().split()
    deleted = [r for r in revs if blob(r, "notes.txt") is not None and blob(r, "config/settings.ini") is None]
    if not deleted:
        return print("the commit that deleted the file is no longer in main's history") or 1
    path = os.path.join(REPO, "config", "settings.ini")
    if os.path.islink(path) or not os.path.isfile(path) or open(path, "rb").read() != want:
        return print("the working copy of config/settings.ini differs from the restored file") or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
