"""Verifier of jq-active-admins: exit 0 only when /app/active_admins.json is the JSON array of the
admins' emails recomputed here from the verifier's copy of the input (/tests/users.json)."""

import json
import os
import sys

OUT = "/app/active_admins.json"


def expected() -> list[str]:
    users = json.load(open("/tests/users.json", encoding="utf-8"))
    emails = {u["email"] for u in users if u.get("role") == "admin" and u.get("active") is True}
    return sorted(emails, key=lambda e: e.encode())


def main() -> int:
    if os.path.islink(OUT) or not os.path.isfile(OUT):
        return print("no", OUT) or 1
    try:
        got = json.loads(open(OUT, "rb").read(1 << 20))
    except ValueError as e:
        return print("not JSON:", e) or 1
    want = expected()
    if got != want:
        return print(f"got {got!r:.300}, want {len(want)} emails") or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
