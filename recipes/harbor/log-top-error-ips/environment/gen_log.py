"""Writes a synthetic access log, the same one for the same seed (the verifier regenerates it)."""

import random
import sys

PATHS = ["/", "/login", "/api/items", "/api/items/42", "/status/500", "/status/503", "/static/app.js", "/search?q=502"]
AGENTS = ["curl/7.88.1", "Mozilla/5.0 (X11; Linux x86_64)", "python-requests/2.31"]


def log_lines(seed: int = 45) -> list[str]:
    rng = random.Random(seed)
    ips = [f"10.0.{rng.randint(0, 9)}.{rng.randint(1, 30)}" for _ in range(40)]
    out = []
    for i in range(1500):
        ip = rng.choice(ips[: 8 + i % 32])
        status = rng.choice([200] * 12 + [301, 304, 404, 404, 500, 502, 503, 504])
        path = rng.choice(PATHS)
        size = rng.randint(0, 90000) if status < 400 else 0
        t = f"05/Dec/2026:{10 + i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d} +0000"
        out.append(f'{ip} - - [{t}] "GET {path} HTTP/1.1" {status} {size} "-" "{rng.choice(AGENTS)}"')
    return out


if __name__ == "__main__":
    sys.stdout.write("\n".join(log_lines()) + "\n")
