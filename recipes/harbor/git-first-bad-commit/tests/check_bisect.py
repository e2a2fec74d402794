"""Verifier of git-first-bad-commit: exit 0 only when /app/first_bad.txt names, by its full hash,
the commit of main's history whose price.py is version 13 (the first that rounds to one decimal)
and whose parent's is version 12 (the last good one).

The commit is judged by the content git stores for it, not by anything else the agent wrote, so a
guessed hash, a revision expression or a rewritten branch does not pass."""

import os
import re
import subprocess
import sys

REPO = "/app/repo"
ANSWER = "/app/first_bad.txt"
GIT = ["git", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null", "-c", "safe.directory=*", "-C", REPO]
GIT_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_NO_REPLACE_OBJECTS": "1",
    "GIT_OPTIONAL_LOCKS": "0",
}


def read(rev: str) -> str | None:
    """price.py at ``rev``, or None."""
    r = subprocess.run([*GIT, "cat-file", "blob", f"{rev}:price.py"], env=GIT_ENV, capture_output=True, timeout=30)
    return r.stdout.decode(errors="replace") if r.returncode == 0 else None


def version(text: str | None) -> str | None:
    m = re.search(r"^VERSION = (\d+)$", text or "", re.M)
    return m.group(1) if m else None


def main() -> int:
    if os.path.islink(ANSWER) or not os.path.isfile(ANSWER):
        return print("no answer file") or 1
    text = open(ANSWER, encoding="utf-8", errors="replace").read()
    if not re.fullmatch(r"[0-9a-f]{40}\n?", text):
        return print("the answer is not one full commit hash") or 1
    sha = text.strip()
    listed = subprocess.run([*GIT, "rev-list", "refs/heads/main"], env=GIT_ENV, capture_output=True, timeout=30)
    if sha not in listed.stdout.decode().split():
        return print("the commit is not in main's history") or 1
    bad, good = read(sha), read(sha + "^")
    if version(bad) != "13" or "round(s, 1)" not in (bad or ""):
        return print("that commit is not the first failing one") or 1
    if version(good) != "12" or "round(s, 2)" not in (good or ""):
        return print("that commit's parent is not the last passing one") or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
