"""The verifier's view of an episode: the agent's final state, the image's programs, the harness's tests.

After the agent's last turn (every process of its session killed), the task's ``tests/``
run in a fresh sandbox whose root is composed here, not the agent's merged view as is:

* **The image's programs, read-only.** ``/usr``, ``/bin``, ``/sbin`` and ``/lib*`` (:data:`IMAGE_TOP`)
  come from the image, not from the agent's layer, and so do the files of ``/etc`` that decide
  what a program loads or runs before the test does (:data:`IMAGE_ETC`: the dynamic loader's
  preload list, cache and paths, ``alternatives``, shell start-up files, Python's and Perl's
  site configuration, system git and pip config, NSS). Paths the task names as the verifier's
  (``[verifier] image_paths`` in task.toml, e.g. a verifier virtualenv) come from the image too;
  where the agent replaced one of their parent directories by something else, the verifier is
  not run and the episode scores 0.
* **The agent's state** for everything else: every other top-level directory of the merged
  view (``/app``, ``/root``, ``/home``, ``/tmp``, ``/var``, ``/opt``...) and the other entries of
  ``/etc``, read-write, as the agent left them. Top-level files and links the image does not
  have are left out (a ``/conftest.py`` or ``/pytest.ini`` beside ``/tests`` would configure
  pytest). The agent's ``/tests`` and ``/logs`` are replaced by the harness's.
* **The harness's tests and logs.** ``/tests`` is a copy of the task's ``tests/`` made for this
  run, read-only; ``/logs/verifier`` a fresh empty directory from the harness (anything the
  agent wrote there is gone). The reward is read from it by the harness (:func:`read_reward`).
* **A clean environment**: the image's ``ENV`` and the task's ``[verifier] env`` over a fixed
  base (no user site, no ``PYTHONPATH`` from the agent, no ``BASH_ENV``, ``PYTHONSAFEPATH``; git
  without the agent's global config and with hooks, fsmonitor, pagers and excludes files pinned
  off), and ``bash /tests/test.sh`` without start-up files.

What this cannot protect: a verifier that runs the agent's own program (its output is what
the program prints); programs the verifier reaches through a path the agent owns (``$HOME``,
the workdir, an image ``PATH`` entry outside ``/usr`` that the task does not name in
``image_paths``); configuration files deeper in ``/etc`` than its top level (``/etc/ssl``); the
agent's own repositories' metadata beyond the pinned keys (``.git/info/exclude``, assume-unchanged
bits, and filter, textconv and external diff drivers: programs the agent named in its repository's
config, which git runs during a test's ``git status`` or ``git diff``). The terminal env vets these
for its own checks (``envs.terminal_git``); a Harbor test reads the repository as the agent left
it, so a task whose test asks git about the agent's repository should check that metadata itself.
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass

from envs.terminal import CHECK_ENV

__all__ = [
    "IMAGE_ETC",
    "IMAGE_TOP",
    "VERIFIER_BASE_ENV",
    "VerifierResult",
    "compose_mounts",
    "read_reward",
]

IMAGE_TOP = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
IMAGE_ETC = (
    "ld.so.preload",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "bash.bashrc",
    "bash_completion",
    "bash_completion.d",
    "profile",
    "profile.d",
    "environment",
    "inputrc",
    "nsswitch.conf",
    "gitconfig",
    "pip.conf",
    "perl",
)
_IMAGE_ETC_PREFIXES = ("python",)  # /etc/python3, /etc/python3.11: sitecustomize
_HARNESS_TOP = ("proc", "dev", "sys", "tests", "logs")  # mounted by the harness, never the agent's
# git settings pinned for the verifier (command-line precedence, over any repository's config): the terminal
# check's pins (envs.terminal.CHECK_ENV), so that nothing the agent configured runs a program during a test's
# `git status` (hooks, fsmonitor, pagers, editors, ssh) or hides files from it (an excludes or attributes file,
# showUntrackedFiles, the untracked cache); all but safe.bareRepository, since a task may test a bare
# repository. With GIT_CONFIG_GLOBAL=/dev/null the agent's ~/.gitconfig (and $XDG_CONFIG_HOME/git/config) is
# not read; the image's /etc/gitconfig is (it is the image's, see IMAGE_ETC).
_GIT_PINS = tuple(
    (CHECK_ENV[f"GIT_CONFIG_KEY_{i}"], CHECK_ENV[f"GIT_CONFIG_VALUE_{i}"])
    for i in range(int(CHECK_ENV["GIT_CONFIG_COUNT"]))
    if CHECK_ENV[f"GIT_CONFIG_KEY_{i}"] != "safe.bareRepository"
)
VERIFIER_BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "TERM": "dumb",
    "PYTHONNOUSERSITE": "1",
    "PYTHONSAFEPATH": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "DEBIAN_FRONTEND": "noninteractive",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_PAGER": "cat",
    "GIT_OPTIONAL_LOCKS": "0",  # a test's `git status` does not rewrite the index
    "GIT_CONFIG_COUNT": str(len(_GIT_PINS)),
    **{f"GIT_CONFIG_KEY_{i}": k for i, (k, _) in enumerate(_GIT_PINS)},
    **{f"GIT_CONFIG_VALUE_{i}": v for i, (_, v) in enumerate(_GIT_PINS)},
}
_REWARD_MAX_BYTES = 65536


@dataclass(frozen=True)
class VerifierResult:
    """One verifier run: the reward (0.0 on any failure), why, and what it printed."""

    reward: float
    reason: str  # "ok", or why the reward is 0 (timed out, no reward file, not a number...)
    output: str
    exit_code: int | None
    timed_out: bool
    duration_s: float


def _image_etc(name: str) -> bool:
    return name in IMAGE_ETC or name.startswith(_IMAGE_ETC_PREFIXES)


def _entry(kind_src: str, inner_src: str, dest: str, rw: bool) -> list[str] | None:
    """bwrap options that put the entry at host path ``kind_src`` (seen by the launcher as
    ``inner_src``) at ``dest``: a directory or regular file bound, a symlink recreated (so it
    resolves inside the sandbox, never on the host), anything else left out."""
    try:
        st = os.lstat(kind_src)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return ["--symlink", os.readlink(kind_src), dest]
    if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
        return ["--bind" if rw else "--ro-bind", inner_src, dest]
    return None


def _names(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def compose_mounts(
    *, view: str, merged: str, image: str, image_inner: str, image_paths: tuple[str, ...] = ()
) -> tuple[list[str], str | None]:
    """The verifier's root as bwrap options (see the module docstring), and a refusal (or None).

    ``view``: the merged tree as the harness reaches it; ``merged``: the same as the launcher
    sees it; ``image`` / ``image_inner``: the image root, for the harness and for the launcher.
    Every agent-made path is examined with ``lstat`` here while none of its processes runs, and
    every bind source is a real directory or file reached through real directories only, so no
    symlink the agent left resolves on the host side.
    """
    args: list[str] = []
    image_names = set(_names(image))
    for name in _names(view):
        if name in _HARNESS_TOP or name in IMAGE_TOP or name == "etc":
            continue
        src = os.path.join(view, name)
        if not os.path.isdir(src) or os.path.islink(src):
            if name not in image_names:
                continue  # a top-level file or link the image does not have (/conftest.py, /pytest.ini)
        got = _entry(src, os.path.join(merged, name), "/" + name, rw=True)
        if got:
            args += got
    for name in IMAGE_TOP:
        got = _entry(os.path.join(image, name), os.path.join(image_inner, name), "/" + name, rw=False)
        if got:
            args += got
    args += _compose_etc(view, merged, image, image_inner)
    refusal = None
    for p in image_paths:
        got, why = _image_path(p, view, image, image_inner)
        args += got
        refusal = refusal or why
    return args, refusal


def _compose_etc(view: str, merged: str, image: str, image_inner: str) -> list[str]:
    """``/etc``: a fresh directory holding the agent's entries, and the image's for :data:`IMAGE_ETC`."""
    args = ["--dir", "/etc"]
    etc = os.path.join(view, "etc")
    if os.path.isdir(etc) and not os.path.islink(etc):  # else: the agent replaced /etc; only the image's part
        for name in _names(etc):
            if not _image_etc(name):
                got = _entry(os.path.join(etc, name), os.path.join(merged, "etc", name), f"/etc/{name}", rw=True)
                args += got or []
    for name in _names(os.path.join(image, "etc")):
        if _image_etc(name):
            got = _entry(
                os.path.join(image, "etc", name), os.path.join(image_inner, "etc", name), f"/etc/{name}", False
            )
            args += got or []
    return args


def _image_path(path: str, view: str, image: str, image_inner: str) -> tuple[list[str], str | None]:
    """A task-named verifier path bound read-only from the image over the agent's state, when its
    parents in the agent's state are still real directories; else a refusal."""
    rel = os.path.normpath(path).lstrip("/")
    if not path.startswith("/") or rel.startswith("..") or not rel or rel == ".":
        return [], f"[verifier] image_paths: {path!r} is not an absolute path inside the image"
    if not os.path.lexists(os.path.join(image, rel)):
        return [], None  # nothing of the image's to protect there
    parts = rel.split("/")
    for i in range(1, len(parts) + 1):
        p = os.path.join(view, *parts[:i])
        if os.path.islink(p) or (os.path.lexists(p) and i < len(parts) and not os.path.isdir(p)):
            return [], f"the agent replaced /{'/'.join(parts[:i])} (on the way to the verifier's {path})"
    got = _entry(os.path.join(image, rel), os.path.join(image_inner, rel), "/" + rel, rw=False)
    return got or [], None


def read_reward(logs_dir: str) -> tuple[float, str]:
    """The reward the verifier wrote: ``reward.txt`` (one number) or else ``reward.json`` (an
    object: its ``"reward"``, or its only value), a finite number in [0, 1]; ``(0.0, why)``
    otherwise. Files are opened without following symlinks and read up to 64 KiB."""
    for name in ("reward.txt", "reward.json"):
        raw, why = _read_regular(os.path.join(logs_dir, name))
        if raw is None and why == "absent":
            continue
        if raw is None:
            return 0.0, f"{name}: {why}"
        value = _parse_txt(raw) if name == "reward.txt" else _parse_json(raw)
        if isinstance(value, str):
            return 0.0, f"{name}: {value}"
        return value, "ok"
    return 0.0, "the verifier wrote no reward (/logs/verifier/reward.txt or reward.json)"


def _read_regular(path: str) -> tuple[str | None, str]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, "absent"
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror}; a symlink is refused)"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, "is not a regular file"
        data = os.read(fd, _REWARD_MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > _REWARD_MAX_BYTES:
        return None, f"is larger than {_REWARD_MAX_BYTES} bytes"
    return data.decode("utf-8", "replace"), ""


def _number(value: object) -> float | str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"not a number: {str(value)[:80]!r}"
    v = float(value)
    if not math.isfinite(v) or not 0.0 <= v <= 1.0:
        return f"{v!r} is not a finite number in [0, 1]"
    return v


def _parse_txt(raw: str) -> float | str:
    text = raw.strip()
    try:
        return _number(float(text))
    except ValueError:
        return f"not a number: {text[:80]!r}"


def _parse_json(raw: str) -> float | str:
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        return f"invalid JSON ({exc})"
    if isinstance(obj, dict):
        if "reward" in obj:
            return _number(obj["reward"])
        if len(obj) == 1:
            return _number(next(iter(obj.values())))
        return f"an object with several rewards {sorted(obj)[:5]} and no 'reward' key"
    return _number(obj)
