"""Verifier of cron-backup-entry: exit 0 only when /etc/cron.d/backup (a regular file, mode 0644)
holds exactly one job, daily at 02:30 as root running /opt/backup/bin/backup.sh, and the script is a
regular file of mode 0755 with its original content (the verifier's copy, /tests/backup.sh)."""

import os
import re
import stat
import sys

CRON = "/etc/cron.d/backup"
SCRIPT = "/opt/backup/bin/backup.sh"
VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\s*=.*")


def mode_of(path: str) -> int | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else None


def is_number(field: str, value: int) -> bool:
    return field.isdigit() and int(field) == value


def main() -> int:
    if mode_of(CRON) != 0o644:
        return print("no regular", CRON, "of mode 0644") or 1
    jobs = []
    for line in open(CRON, "rb").read(1 << 16).decode(errors="replace").split("\n"):
        s = line.strip()
        if s and not s.startswith("#") and not VARIABLE.fullmatch(s):
            jobs.append(s.split())
    if len(jobs) != 1:
        return print(f"{len(jobs)} jobs, want 1") or 1
    f = jobs[0]
    if len(f) != 7 or not (is_number(f[0], 30) and is_number(f[1], 2) and f[2:5] == ["*", "*", "*"]):
        return print("not daily at 02:30 with a user and one command:", f) or 1
    if f[5] != "root" or f[6] != SCRIPT:
        return print("wrong user or command:", f[5:]) or 1
    if mode_of(SCRIPT) != 0o755 or open(SCRIPT, "rb").read() != open("/tests/backup.sh", "rb").read():
        return print("the script is not mode 0755 with its original content") or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
