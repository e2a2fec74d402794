"""Verifier of sqlite-add-column: exit 0 only when /app/app.db's table users holds exactly the
original rows (from the verifier's copy, /tests/users.sql) plus a TEXT column domain with each
email's lower-cased domain.

The database is copied and opened read-only with trusted_schema off, and the rows are read from
the table itself (sqlite_master must list users as a table, not a view)."""

import os
import shutil
import sqlite3
import sys
import tempfile

DB = "/app/app.db"


def original() -> list[tuple]:
    db = sqlite3.connect(":memory:")
    db.executescript(open("/tests/users.sql").read())
    return db.execute("SELECT id, name, email FROM users ORDER BY id").fetchall()


def main() -> int:
    if os.path.islink(DB) or not os.path.isfile(DB):
        return print("no", DB) or 1
    tmp = tempfile.mkdtemp()
    copy = os.path.join(tmp, "app.db")
    shutil.copyfile(DB, copy)
    for suffix in ("-wal", "-journal"):  # an uncheckpointed WAL holds committed rows
        if os.path.isfile(DB + suffix) and not os.path.islink(DB + suffix):
            shutil.copyfile(DB + suffix, copy + suffix)
    try:
        db = sqlite3.connect(f"file:{copy}?mode=ro", uri=True)
        db.execute("PRAGMA trusted_schema = OFF")
        kind = db.execute("SELECT type FROM sqlite_master WHERE name = 'users'").fetchall()
        cols = {r[1]: (r[2] or "").upper() for r in db.execute("PRAGMA table_info(users)")}
        rows = db.execute("SELECT id, name, email, domain FROM users ORDER BY id").fetchall()
    except sqlite3.Error as e:
        return print("cannot read users:", e) or 1
    if kind != [("table",)] or cols.get("domain") != "TEXT":
        return print("users is not a table with a TEXT column domain") or 1
    want = [(i, n, e, e.rsplit("@", 1)[1].lower()) for i, n, e in original()]
    if rows != want:
        return print(f"rows differ: {rows!r:.300}") or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
