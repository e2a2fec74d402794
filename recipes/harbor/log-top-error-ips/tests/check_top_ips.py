"""Verifier of log-top-error-ips: exit 0 only when /app/top_error_ips.txt is the top five computed
here from the log regenerated from its seed (/tests/gen_log.py)."""

import collections
import os
import sys

sys.path.insert(0, "/tests")  # python3 -I leaves the script's directory off sys.path
from gen_log import log_lines  # noqa: E402

OUT = "/app/top_error_ips.txt"


def expected() -> list[str]:
    counts: collections.Counter[str] = collections.Counter()
    for line in log_lines():
        fields = line.split('"')[2].split()  # after the request: STATUS BYTES
        if 500 <= int(fields[0]) <= 599:
            counts[line.split()[0]] += 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0].encode()))
    return [f"{n} {ip}" for ip, n in ranked[:5]]


def main() -> int:
    if os.path.islink(OUT) or not os.path.isfile(OUT):
        return print("no", OUT) or 1
    got = open(OUT, "rb").read(1 << 16).decode(errors="replace").rstrip("\n").split("\n")
    if [g.strip() for g in got] != expected():
        return print(f"got {got!r:.300}") or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
