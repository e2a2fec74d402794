"""Verifier of make-fix-build: exit 0 only when the agent's Makefile builds, installs and cleans the
unchanged sources (their sha256 in /tests) into a program that answers inputs generated here, at verification time.

The task is about the Makefile, so it runs (in a copy of the project, under a timeout, with a clean
environment): that is the one agent program this check runs, and its only channel to the verdict is
the output of the program it builds on inputs it cannot know in advance, compared here with the
answer computed in this process."""

import hashlib
import os
import random
import shutil
import string
import subprocess
import sys
import tempfile

SRC = "/app/wordstat"
ENV = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LC_ALL": "C"}


def run(args: list[str], cwd: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=ENV, input=stdin, capture_output=True, timeout=60)


def sample(rng: random.Random) -> str:
    words = [
        "".join(rng.choice(string.ascii_letters) for _ in range(rng.randint(1, 40))) for _ in range(rng.randint(5, 60))
    ]
    return "".join(w + rng.choice([" ", "  ", "\t", "\n"]) for w in words)


def expected(text: str) -> bytes:
    words = text.split()
    longest = max(words, key=len) if words else ""
    return f"words {len(words)}\nlongest {longest}\n".encode()


def unchanged(root: str) -> bool:
    """Whether every source file is still the one the image shipped (its sha256 in /tests/src.sha256)."""
    for line in open("/tests/src.sha256").read().splitlines():
        digest, name = line.split()
        p = os.path.join(root, "src", name)
        if os.path.islink(p) or not os.path.isfile(p) or hashlib.sha256(open(p, "rb").read()).hexdigest() != digest:
            return print("src/ changed:", name) or False
    return True


def main() -> int:
    work = tempfile.mkdtemp()
    proj = os.path.join(work, "wordstat")
    try:
        shutil.copytree(SRC, proj, symlinks=True)
    except (OSError, shutil.Error) as e:
        return print("cannot copy the project:", e) or 1
    if not unchanged(proj) or os.path.islink(os.path.join(proj, "Makefile")):
        return 1
    for dirpath, _, files in os.walk(proj):  # no prebuilt objects or program: make must build them
        for f in files:
            if f.endswith(".o") or f == "wordstat":
                os.remove(os.path.join(dirpath, f))
    prefix = os.path.join(work, "dist")
    for step in (["make"], ["make", "install", f"PREFIX={prefix}"]):
        r = run(step, proj)
        if r.returncode != 0:
            return print(" ".join(step), "failed:", r.stderr.decode(errors="replace")[-500:]) or 1
    binary = os.path.join(prefix, "bin", "wordstat")
    if not os.path.isfile(binary) or os.path.islink(binary):
        return print("make install did not copy the program to PREFIX/bin") or 1
    rng = random.SystemRandom()
    for _ in range(5):
        text = sample(rng)
        r = run([binary], work, text.encode())
        if r.stdout != expected(text):
            return print("wrong output:", r.stdout[:200]) or 1
    r = run(["make", "clean"], proj)
    left = [f for _, _, fs in os.walk(proj) for f in fs if f.endswith(".o") or f == "wordstat"]
    if r.returncode != 0 or left:
        return print("make clean left", left) or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
