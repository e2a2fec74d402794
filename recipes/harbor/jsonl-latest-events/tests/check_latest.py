"""Verifier of jsonl-latest-events: exit 0 only when /app/latest.jsonl holds, one per line and by
id, the latest object of each id computed here from the verifier's copy (/tests/events.jsonl)."""

import json
import os
import sys

OUT = "/app/latest.jsonl"


def expected() -> list[dict]:
    latest: dict[int, dict] = {}
    for line in open("/tests/events.jsonl", encoding="utf-8"):
        if line.strip():
            ev = json.loads(line)
            if ev["id"] not in latest or ev["ts"] >= latest[ev["id"]]["ts"]:
                latest[ev["id"]] = ev
    return [latest[k] for k in sorted(latest)]


def main() -> int:
    if os.path.islink(OUT) or not os.path.isfile(OUT):
        return print("no", OUT) or 1
    try:
        lines = open(OUT, "rb").read(1 << 20).decode().rstrip("\n").split("\n")
        got = [json.loads(x) for x in lines]
    except ValueError as e:
        return print("not one JSON object per line:", e) or 1
    want = expected()
    if got != want or [json.dumps(g, sort_keys=True) for g in got] != [json.dumps(w, sort_keys=True) for w in want]:
        return print(f"got {got!r:.300}") or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
