"""Verifier of python-fix-inventory: exit 0 only when the agent's module answers random cases made
here as the specification says.

The module is the agent's program, so it runs, in a child process (/tests/run_module.py) that prints
its answers; the expected answers are computed in this process and never leave it."""

import json
import random
import subprocess
import sys

ENV = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LC_ALL": "C.UTF-8"}


def case(rng: random.Random) -> tuple[dict, list, int]:
    skus = [f"{rng.choice('ABCDEFGH')}-{rng.randint(1, 99)}" for _ in range(rng.randint(3, 12))]
    stock = {s: rng.randint(0, 20) for s in skus}
    orders = [[rng.choice(skus + ["Q-0", "Z-100"]), rng.randint(1, 15)] for _ in range(rng.randint(1, 15))]
    return stock, orders, rng.randint(0, 10)


def expected(stock: dict, orders: list, threshold: int) -> dict:
    after = dict(stock)
    for sku, qty in orders:
        if sku in after:
            after[sku] = max(0, after[sku] - qty)
    return {"after": after, "untouched": True, "restock": sorted(s for s, q in after.items() if q <= threshold)}


def main() -> int:
    rng = random.SystemRandom()
    cases = [case(rng) for _ in range(40)]
    try:
        r = subprocess.run(
            [sys.executable, "-I", "/tests/run_module.py"],
            input=json.dumps(cases).encode(),
            env=ENV,
            cwd="/tmp",
            capture_output=True,
            timeout=30,
        )
        got = json.loads(r.stdout.decode(errors="replace").strip().split("\n")[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError) as e:
        return print("the module did not answer:", type(e).__name__) or 1
    want = [expected(*c) for c in cases]
    if got != want:
        return print("wrong answers:", r.stderr.decode(errors="replace")[-300:]) or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
