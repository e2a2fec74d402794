"""File work on an image's root tree during a build: paths resolved inside the root, the build context (with
``.dockerignore``) listed and hashed, and ``COPY``/``ADD``/``WORKDIR`` applied.

Paths of the image are resolved the way the image sees them (:func:`in_root`): a symlink in the tree (absolute or
relative) is followed inside the root, never out to the host. ``python -m envs.harbor.rootfs STEP.json`` applies one
step; the builder runs it as root of the build's user namespace, so that the files get the image's owners also
when the harness is not root.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import sys
import tarfile
from pathlib import Path

__all__ = ["in_root", "context_files", "context_digest", "apply_step", "lookup_user", "share_unchanged", "ContextError"]


class ContextError(ValueError):
    """A COPY/ADD source or a user that cannot be found; the builder adds the task, file and line."""


def in_root(root: str, path: str, follow_last: bool = False) -> str:
    """The host path of the image path ``path`` under ``root``, symlinks resolved inside the root."""
    stack = [p for p in path.split("/") if p not in ("", ".")][::-1]
    cur, hops = root, 0
    while stack:
        part = stack.pop()
        if part == "..":
            cur = os.path.dirname(cur) if cur != root else root
            continue
        nxt = os.path.join(cur, part)
        if os.path.islink(nxt) and (stack or follow_last):
            hops += 1
            if hops > 40:
                raise ContextError(f"too many levels of symbolic links in {path}")
            target = os.readlink(nxt)
            if target.startswith("/"):
                cur = root
            stack.extend([p for p in target.split("/") if p not in ("", ".")][::-1])
            continue
        cur = nxt
    return cur


# --------------------------------------------------------------------------------------
# The build context
# --------------------------------------------------------------------------------------


def _pattern(p: str, subtree: bool = True) -> re.Pattern[str]:
    """A .dockerignore / COPY glob as a regex (``**`` any depth, ``*``/``?`` within one name); ``subtree``: a
    match of a directory covers what is under it."""
    out, i = "", 0
    while i < len(p):
        if p.startswith("**/", i):
            out += "(.*/)?"
            i += 3
        elif p.startswith("**", i):
            out += ".*"
            i += 2
        elif p[i] == "*":
            out += "[^/]*"
            i += 1
        elif p[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(p[i])
            i += 1
    return re.compile(out + ("(/.*)?$" if subtree else "$"))


def _ignore_rules(context: Path) -> list[tuple[bool, re.Pattern[str]]]:
    f = context / ".dockerignore"
    if not f.is_file():
        return []
    rules = []
    for line in f.read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        neg = line.startswith("!")
        pat = os.path.normpath(line.lstrip("!").strip().lstrip("/"))
        rules.append((neg, _pattern(pat)))
    return rules


def context_files(context: Path) -> list[str]:
    """The context's entries (files, directories, symlinks) as sorted relative paths, ``.dockerignore`` applied."""
    rules = _ignore_rules(context)
    out = []
    for dirpath, dirnames, filenames in os.walk(context):
        dirnames.sort()
        for name in sorted(dirnames) + sorted(filenames):
            rel = os.path.relpath(os.path.join(dirpath, name), context)
            excluded = False
            for neg, rx in rules:
                if rx.match(rel):
                    excluded = not neg
            if not excluded:
                out.append(rel)
    return sorted(out)


def context_digest(context: Path) -> str:
    """sha256 over the context's paths, kinds, modes and contents (what decides what COPY puts in the image)."""
    h = hashlib.sha256()
    for rel in context_files(context):
        p = context / rel
        st = os.lstat(p)
        h.update(f"{rel}\0{stat.S_IFMT(st.st_mode)}\0{stat.S_IMODE(st.st_mode):o}\0".encode())
        if stat.S_ISLNK(st.st_mode):
            h.update(os.readlink(p).encode())
        elif stat.S_ISREG(st.st_mode):
            with open(p, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


# --------------------------------------------------------------------------------------
# Users of the image
# --------------------------------------------------------------------------------------


def _table(root: str, name: str) -> list[list[str]]:
    path = in_root(root, f"/etc/{name}", follow_last=True)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return [line.split(":") for line in f.read().splitlines() if line and not line.startswith("#")]
    except OSError:
        return []


def lookup_user(root: str, spec: str) -> tuple[int, int, str, str | None]:
    """(uid, gid, home, name) of a USER/--chown spec (``name``, ``uid``, ``name:group``, ``uid:gid``) in the image."""
    user, _, group = spec.partition(":")
    passwd = _table(root, "passwd")
    entry = next((e for e in passwd if len(e) >= 7 and (e[0] == user or (user.isdigit() and e[2] == user))), None)
    if entry is None and not user.isdigit():
        raise ContextError(f"user {user!r} is not in the image's /etc/passwd")
    uid = int(user) if entry is None else int(entry[2])
    gid = int(entry[3]) if entry is not None else uid
    if group:
        if group.isdigit():
            gid = int(group)
        else:
            g = next((e for e in _table(root, "group") if len(e) >= 3 and e[0] == group), None)
            if g is None:
                raise ContextError(f"group {group!r} is not in the image's /etc/group")
            gid = int(g[2])
    home = entry[5] if entry is not None else "/"
    return uid, gid, home, entry[0] if entry is not None else None


# --------------------------------------------------------------------------------------
# Applying COPY / ADD / WORKDIR
# --------------------------------------------------------------------------------------


def _sources(context: Path, src: str, allowed: set[str]) -> list[Path]:
    rel = os.path.normpath(src.lstrip("/"))
    if rel == ".." or rel.startswith("../"):
        raise ContextError(f"source {src!r} is outside the build context")
    if any(c in rel for c in "*?["):
        rx = _pattern(rel, subtree=False)
        hits = [context / r for r in sorted(allowed) if rx.match(r)]
    else:
        hits = [context] if rel == "." else [context / rel] if rel in allowed else []
    if not hits:
        raise ContextError(f"source {src!r} is not in the build context (environment/, .dockerignore applied)")
    return hits


class _Copier:
    """Copies context entries into the image tree; every image path is resolved inside the root."""

    def __init__(self, root: str, context: Path, ids: tuple[int, int], chmod: int | None) -> None:
        self.root, self.context, self.ids, self.chmod = root, context, ids, chmod
        self.allowed = set(context_files(context))

    def place(self, src: Path, dst: str) -> None:
        """Copy one file, symlink or directory (contents merged, .dockerignore applied) to image path ``dst``."""
        st = os.lstat(src)
        host = in_root(self.root, dst)
        if stat.S_ISDIR(st.st_mode):
            if os.path.islink(host):
                host = in_root(self.root, dst, follow_last=True)  # a directory link of the image: followed inside it
            if os.path.lexists(host) and not os.path.isdir(host):
                os.unlink(host)
            if not os.path.lexists(host):
                os.mkdir(host)
                os.chmod(host, self.chmod if self.chmod is not None else stat.S_IMODE(st.st_mode))
                os.chown(host, *self.ids)
            for child in sorted(os.listdir(src)):
                if os.path.relpath(src / child, self.context) in self.allowed:
                    self.place(src / child, dst.rstrip("/") + "/" + child)
            return
        if os.path.isdir(host) and not os.path.islink(host):
            raise ContextError(f"cannot copy the file {src.name} over the directory {dst} of the image")
        if os.path.lexists(host):
            os.unlink(host)  # never write through a link the image holds
        if stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(src), host)
            os.lchown(host, *self.ids)
            return
        shutil.copyfile(src, host, follow_symlinks=False)
        shutil.copystat(src, host, follow_symlinks=False)
        if self.chmod is not None:
            os.chmod(host, self.chmod)
        os.chown(host, *self.ids)

    def copy(self, path: Path, dest: str, into_dir: bool, add: bool) -> None:
        if add and path.is_file() and not path.is_symlink() and tarfile.is_tarfile(path):
            _extract(path, _mkdirs(self.root, dest))
        elif path.is_dir() and not path.is_symlink():
            _mkdirs(self.root, dest)
            self.place(path, dest)
        elif into_dir or os.path.isdir(in_root(self.root, dest, follow_last=True)):
            _mkdirs(self.root, dest)
            self.place(path, dest.rstrip("/") + "/" + path.name)
        else:
            _mkdirs(self.root, os.path.dirname(dest) or "/")
            self.place(path, dest)


def _mkdirs(root: str, path: str, ids: tuple[int, int] = (0, 0)) -> str:
    """Create the image directory ``path`` (and parents, 0755, owned by ``ids``); its host path."""
    cur = "/"
    for part in [p for p in path.split("/") if p]:
        cur = cur.rstrip("/") + "/" + part
        host = in_root(root, cur, follow_last=True)
        if not os.path.isdir(host):
            if os.path.lexists(host):
                raise ContextError(f"{cur} exists in the image and is not a directory")
            os.makedirs(host, 0o755)  # a link of the image may lead to a path whose parents are missing too
            os.chown(host, *ids)
    return in_root(root, path, follow_last=True)


def _extract(archive: Path, dst_dir: str) -> None:
    """ADD of a local tar archive: extracted under ``dst_dir`` with tarfile's ``data`` filter (no absolute paths,
    no ``..``, no links out of the directory, no devices); files owned by root of the image."""
    with tarfile.open(archive) as tf:
        tf.extractall(dst_dir, filter="data")


def apply_step(root: str, step: dict, context: str) -> None:
    """Apply one ``copy`` or ``workdir`` step (a :class:`~envs.harbor.dockerfile.Step` as a dict) to the tree."""
    if step["kind"] == "workdir":
        _mkdirs(root, step["dest"])
        return
    ids = (0, 0)
    if step["chown"]:
        uid, gid, _, _ = lookup_user(root, step["chown"])
        ids = (uid, gid)
    copier = _Copier(root, Path(context), ids, int(step["chmod"], 8) if step["chmod"] else None)
    dest, inline = step["dest"], dict(step["inline"])
    into_dir = dest.endswith("/")
    for src in step["argv"]:
        heredoc = re.fullmatch(r"<<-?(['\"]?)(\w+)\1", src)
        if heredoc is None:
            for path in _sources(copier.context, src, copier.allowed):
                copier.copy(path, dest, into_dir, step["add"])
            continue
        target = dest + heredoc.group(2) if into_dir else dest
        parent = _mkdirs(root, os.path.dirname(target.rstrip("/")) or "/")
        tmp = Path(parent) / f".jointrl-heredoc-{os.getpid()}"
        tmp.write_text(inline.get(heredoc.group(2), ""))
        os.chmod(tmp, 0o644)
        copier.place(tmp, target)
        tmp.unlink()


def share_unchanged(tree: str, base: str, mark_ns: int) -> int:
    """Hard-link the regular files of ``tree`` that are unchanged copies of ``base`` to ``base``'s; the number linked.

    ``tree`` was copied from ``base`` (``cp -a``) before ``mark_ns`` (a wall-clock time in ns taken after the copy
    and followed by a pause longer than the kernel's timestamp tick): a file whose status change time is before
    the mark, with the same size, mode, owner and mtime as ``base``'s, has not been written since. Both trees are
    never written after publishing (episodes write to their own copy-on-write layer), so sharing inodes only saves
    the disk space of one copy per image.
    """
    linked = 0
    for dirpath, _, filenames in os.walk(tree):
        rel_dir = os.path.relpath(dirpath, tree)
        for name in filenames:
            path = os.path.join(dirpath, name)
            other = os.path.normpath(os.path.join(base, rel_dir, name))
            try:
                a, b = os.lstat(path), os.lstat(other)
            except OSError:
                continue
            if not (stat.S_ISREG(a.st_mode) and stat.S_ISREG(b.st_mode)) or a.st_ino == b.st_ino:
                continue
            same = (a.st_size, a.st_mode, a.st_uid, a.st_gid, a.st_mtime_ns) == (
                b.st_size, b.st_mode, b.st_uid, b.st_gid, b.st_mtime_ns
            )  # fmt: skip
            if same and a.st_ctime_ns < mark_ns:
                tmp = os.path.join(dirpath, f".jointrl-link-{os.getpid()}")
                os.link(other, tmp)
                os.rename(tmp, path)
                linked += 1
    return linked


def main(argv: list[str]) -> int:
    """``python -m envs.harbor.rootfs JOB.json``: apply the step the file describes (root, step, context), or with
    ``"op": "share"`` hard-link a tree's unchanged files to its base (:func:`share_unchanged`)."""
    with open(argv[0]) as f:
        job = json.load(f)
    try:
        if job.get("op") == "share":
            print(f"linked {share_unchanged(job['tree'], job['base'], job['mark_ns'])}")
        else:
            apply_step(job["root"], job["step"], job["context"])
    except (ContextError, OSError, tarfile.TarError) as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
