"""Verifier of csv-to-sqlite: exit 0 only when /app/sales.db has the table of the verifier's copy of
the CSV (/tests/sales.csv) and a view of per-region totals that is computed from the table: the view
is queried on a copy, then again after rows with fresh random regions are added to that copy, so a
view that lists constant totals does not pass.

The copy is opened with trusted_schema off; the view is the agent's SQL, run by SQLite on the copy."""

import csv
import math
import os
import random
import shutil
import sqlite3
import sys
import tempfile

DB = "/app/sales.db"


def rows() -> list[tuple[str, str, float]]:
    with open("/tests/sales.csv", newline="") as f:
        return [(r["region"], r["product"], float(r["amount"])) for r in csv.DictReader(f)]


def totals(data: list[tuple[str, str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for region, _, amount in data:
        out[region] = out.get(region, 0.0) + amount
    return out


def same(got: list[tuple], want: dict[str, float]) -> bool:
    if len(got) != len(want) or any(len(r) != 2 for r in got):
        return False
    have = {r[0]: r[1] for r in got}
    return set(have) == set(want) and all(
        isinstance(have[k], (int, float)) and math.isclose(have[k], v, abs_tol=1e-6) for k, v in want.items()
    )


def main() -> int:
    if os.path.islink(DB) or not os.path.isfile(DB):
        return print("no", DB) or 1
    copy = os.path.join(tempfile.mkdtemp(), "sales.db")
    shutil.copyfile(DB, copy)
    try:
        db = sqlite3.connect(copy)
        db.execute("PRAGMA trusted_schema = OFF")
        kinds = dict(db.execute("SELECT name, type FROM sqlite_master WHERE name IN ('sales', 'region_totals')"))
        got_rows = db.execute("SELECT region, product, amount FROM sales").fetchall()
        data = rows()
        if kinds != {"sales": "table", "region_totals": "view"} or sorted(got_rows) != sorted(data):
            return print("the sales table or the view is missing or wrong") or 1
        if not same(db.execute("SELECT region, total FROM region_totals").fetchall(), totals(data)):
            return print("region_totals is wrong") or 1
        rng = random.SystemRandom()
        extra = [(f"R{rng.randrange(10**9)}", "probe", float(rng.randint(1, 10**6)) / 100) for _ in range(3)]
        extra.append((data[0][0], "probe", 7.25))
        db.executemany("INSERT INTO sales (region, product, amount) VALUES (?, ?, ?)", extra)
        if not same(db.execute("SELECT region, total FROM region_totals").fetchall(), totals(data + extra)):
            return print("region_totals does not follow the table") or 1
    except sqlite3.Error as e:
        return print("cannot read the database:", e) or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
