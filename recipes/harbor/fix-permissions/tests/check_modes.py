"""Verifier of fix-permissions: exit 0 only when every path of /srv/app has the mode the task asks
for, each file is still a regular file (not a symlink) with its original content (the verifier's
copies under /tests/app), and each directory is still a directory."""

import os
import stat
import sys

ROOT = "/srv/app"
MODES = {
    "bin/start.sh": 0o755,
    "bin/stop.sh": 0o755,
    "bin/rotate.sh": 0o755,
    "conf/app.conf": 0o640,
    "secrets": 0o700,
    "secrets/api.key": 0o600,
    "data": 0o755,
    "logs": 0o1777,
}


def main() -> int:
    for rel, mode in MODES.items():
        path = os.path.join(ROOT, rel)
        try:
            st = os.lstat(path)
        except OSError:
            return print("missing:", rel) or 1
        copy = os.path.join("/tests/app", rel)
        if os.path.isdir(copy) or rel in ("data", "logs"):
            if not stat.S_ISDIR(st.st_mode):
                return print("not a directory:", rel) or 1
        elif not stat.S_ISREG(st.st_mode) or open(path, "rb").read() != open(copy, "rb").read():
            return print("replaced or changed:", rel) or 1
        if stat.S_IMODE(st.st_mode) != mode:
            return print(f"{rel}: mode {stat.S_IMODE(st.st_mode):04o}, want {mode:04o}") or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
