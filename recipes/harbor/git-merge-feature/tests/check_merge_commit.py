"""Verifier of git-merge-feature: exit 0 only when main's tip is a merge commit whose parents are the
original tips of main and feature (recognised by their content and subjects, so a moved branch or a
rewritten parent does not pass), whose files are the expected resolution (/tests/expected_*), and
whose working files match it."""

import os
import subprocess
import sys

REPO = "/app/project"
BASE = ["git", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null", "-c", "safe.directory=*", "-C", REPO]
SAFE_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_NO_REPLACE_OBJECTS": "1",
    "GIT_OPTIONAL_LOCKS": "0",
}
# Each original tip: its subject and its files (the verifier's knowledge of how the image built them).
TIPS = [("Polite farewell", "VERSION", b"2.0.1\n"), ("Friendlier greeting", "VERSION", b"2.1.0\n")]


def out(*args: str) -> bytes | None:
    r = subprocess.run([*BASE, *args], env=SAFE_ENV, capture_output=True, timeout=30)
    return r.stdout if r.returncode == 0 else None


def subject_of(sha: str) -> str:
    """The commit's subject line, read from the raw object (``git log`` could run a configured program)."""
    raw = (out("cat-file", "commit", sha) or b"").decode(errors="replace")
    return raw.partition("\n\n")[2].split("\n", 1)[0]


def main() -> int:
    parents = (out("rev-list", "--parents", "-n", "1", "refs/heads/main") or b"").decode().split()[1:]
    if len(parents) != 2:
        return print("main's tip is not a merge of two commits") or 1
    for sha, (subject, path, data) in zip(parents, TIPS):
        if subject_of(sha) != subject or out("cat-file", "blob", f"{sha}:{path}") != data:
            return print("a parent is not the original tip:", subject) or 1
    want = {
        "VERSION": b"2.1.0\n",
        "CHANGELOG.md": open("/tests/expected_CHANGELOG.md", "rb").read(),
        "app.py": open("/tests/expected_app.py", "rb").read(),
    }
    for path, data in want.items():
        if out("cat-file", "blob", f"refs/heads/main:{path}") != data:
            return print("main has the wrong", path) or 1
        f = os.path.join(REPO, path)
        if os.path.islink(f) or not os.path.isfile(f) or open(f, "rb").read() != data:
            return print("the working copy of", path, "differs from main") or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
