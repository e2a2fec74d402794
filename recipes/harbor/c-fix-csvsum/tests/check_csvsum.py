"""Verifier of c-fix-csvsum: exit 0 only when /app/csvsum/csvsum.c, compiled here with the image's
gcc, prints the right sums for inputs generated at verification time.

The task is about the program, so the program runs: its only channel to the verdict is its standard
output on inputs it cannot know in advance, compared with the sums computed in this process. Every
generated input has what the original's bugs fail on (long names, negative amounts, more than 64
names, no final newline), so an unfixed program cannot pass."""

import os
import random
import shutil
import string
import subprocess
import sys
import tempfile
from decimal import Decimal

SRC = "/app/csvsum/csvsum.c"
ENV = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LC_ALL": "C"}
CHARS = string.ascii_letters + string.digits + "_"


def sample(rng: random.Random) -> tuple[bytes, bytes]:
    """One input and the expected output (sums in exact decimal arithmetic)."""
    names = list(
        {
            "".join(rng.choice(CHARS) for _ in range(rng.choice([1, 5, 15, 16, 40, 100])))
            for _ in range(rng.randint(70, 200))
        }
    )
    lines, sums = [], {}
    for _ in range(rng.randint(300, 2000)):
        name = rng.choice(names)
        cents = rng.randint(-500000, 500000)
        text = rng.choice(["{:.2f}", "{:.1f}", "{:.0f}"]).format(Decimal(cents) / 100)
        sums[name] = sums.get(name, Decimal(0)) + Decimal(text)
        lines.append(f"{name},{text}")
        if rng.random() < 0.05:
            lines.append("")
    data = "\n".join(lines).encode()  # no final newline
    want = "".join(f"{n} {s:.2f}\n" for n, s in sorted(sums.items(), key=lambda kv: kv[0].encode()))
    return data, want.replace(" -0.00\n", " 0.00\n").encode()


def normalized(out: bytes) -> bytes:
    return out.replace(b" -0.00\n", b" 0.00\n")


def main() -> int:
    if os.path.islink(SRC) or not os.path.isfile(SRC):
        return print("no", SRC) or 1
    work = tempfile.mkdtemp()
    shutil.copyfile(SRC, os.path.join(work, "csvsum.c"))
    r = subprocess.run(["gcc", "-O1", "-o", "csvsum", "csvsum.c"], cwd=work, env=ENV, capture_output=True, timeout=120)
    if r.returncode != 0:
        return print("does not compile:", r.stderr.decode(errors="replace")[-500:]) or 1
    rng = random.SystemRandom()
    for _ in range(4):
        data, want = sample(rng)
        try:
            r = subprocess.run(["./csvsum"], cwd=work, env=ENV, input=data, capture_output=True, timeout=20)
        except subprocess.TimeoutExpired:
            return print("timed out") or 1
        if r.returncode != 0 or normalized(r.stdout) != want:
            return print(f"wrong output (exit {r.returncode}): {r.stdout[:200]!r}") or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
