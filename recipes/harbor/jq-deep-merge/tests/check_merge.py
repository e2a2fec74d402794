"""Verifier of jq-deep-merge: exit 0 only when /app/config/merged.json equals the recursive merge
of the verifier's copies of base.json and prod.json (null removes a key, arrays are replaced)."""

import json
import os
import sys

OUT = "/app/config/merged.json"


def merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def main() -> int:
    want = merge(json.load(open("/tests/base.json")), json.load(open("/tests/prod.json")))
    if os.path.islink(OUT) or not os.path.isfile(OUT):
        return print("no", OUT) or 1
    try:
        got = json.loads(open(OUT, "rb").read(1 << 20))
    except ValueError as e:
        return print("merged.json is not JSON:", e) or 1
    # json equality: 80 == 80.0 would pass in Python, so compare the canonical texts too.
    if got != want or json.dumps(got, sort_keys=True) != json.dumps(want, sort_keys=True):
        return print("merged.json is not the merge") or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
