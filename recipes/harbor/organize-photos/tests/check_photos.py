"""Verifier of organize-photos: exit 0 only when every camera file of the original inbox sits, as a
regular file with its original content, at its dated path under /app/photos and is gone from the
inbox, and every other file is still in place, unchanged.

The list of files is the verifier's copy (/tests/files.txt); each file's content is derived from its
original path the way the image built it."""

import os
import re
import sys

PATTERN = re.compile(r"IMG_(\d{4})(\d{2})(\d{2})_(\d{4})\.jpg")


def content(rel: str) -> bytes:
    return "".join(f"photo-bytes {rel} {i}\n" for i in range(40)).encode()


def regular_with(path: str, data: bytes) -> bool:
    return os.path.isfile(path) and not os.path.islink(path) and open(path, "rb").read() == data


def main() -> int:
    moved = 0
    for rel in open("/tests/files.txt").read().split():
        src = os.path.join("/app/inbox", rel)
        m = PATTERN.fullmatch(os.path.basename(rel))
        if m is None:
            if not regular_with(src, content(rel)):
                return print("a file that must stay moved or changed:", rel) or 1
            continue
        y, mo, d, hm = m.groups()
        dest = f"/app/photos/{y}/{mo}/{d}_{hm}.jpg"
        if os.path.lexists(src):
            return print("still in the inbox:", rel) or 1
        if not regular_with(dest, content(rel)):
            return print("missing or wrong:", dest) or 1
        moved += 1
    return 0 if moved else 1


if __name__ == "__main__":
    sys.exit(main())
