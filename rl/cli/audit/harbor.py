"""Harbor task directories in ``jointrl audit``: the ``harbor`` task source and the ``harbor`` strategies.

The source (:class:`HarborSource`) reads a Harbor task directory, a directory of them, or a glob
with the loader training uses (:func:`envs.harbor.task.load_tasks`), builds each task's image
before any episode (:func:`envs.harbor.image.build_image`: the table's ``image`` column says how
long it took, or that it was cached), and hands each task to the audit as the ``Task`` record the
``harbor`` env takes, with ``solution/solve.sh`` as the reference: one shell turn that unpacks
the task's ``solution/`` directory at ``/solution`` (a temporary directory where the task's user
cannot write there) and runs ``bash solve.sh`` from the work directory, as Harbor's oracle agent
does, then the done marker. A task whose directory or image is unusable is reported as an error
finding naming the task and the problem, and the other tasks are audited.

The strategies (domain ``harbor``) attack what a Harbor verifier reads: the no-op and a harmless
command (the baseline), everything in the work dir deleted, every path the instruction names
deleted or overwritten with plausible forgeries (``1``, ``OK``, empty, ``[]``), every file
truncated, the instruction echoed, forged reward files in ``/logs/verifier``, a planted
``/tests/test.sh``, and the verifier's own tools subverted: ``python3`` and ``bash`` replaced by
scripts that write a reward of 1, a ``.pth`` file and shell startup files that do the same. Each
is flagged when it scores above the baseline (docs/audit.md).
"""

from __future__ import annotations

import base64
import glob
import io
import re
import shlex
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.types import Message, Task
from rl.cli.audit.sources import AuditTask, SourceError, register_source
from rl.cli.audit.strategies import STRATEGIES, Act, Turn, register_strategy, terminal_turns

__all__ = ["HarborSource", "harbor_reference", "instruction_paths", "DOMAIN"]

DOMAIN = "harbor"
SOLUTION_DIR = "/solution"


# ---------------------------------------------------------------------------- the source


def harbor_reference(task: Any, done_marker: str = "DONE") -> tuple[str, ...]:
    """The turns that play ``task``'s ``solution/solve.sh``: unpack the solution directory, run it, done.

    ``task`` is an :class:`envs.harbor.task.HarborTask` whose ``solution`` is not None. The
    directory travels inside the command as a base64 tar (the agent's shell has no other channel
    for files); ``[solution] env`` of task.toml is exported first.
    """
    sol_dir = Path(task.solution).parent
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(sol_dir, arcname=".")
    blob = base64.b64encode(buf.getvalue()).decode()
    exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in sorted(getattr(task, "solution_env", {}).items()))
    cmd = (
        f"d={SOLUTION_DIR}; {{ mkdir -p $d && [ -w $d ]; }} 2>/dev/null || d=$(mktemp -d); "
        f"printf '%s' {blob} | base64 -d | tar --no-same-owner -xzf - -C $d && {exports}bash $d/solve.sh"
    )
    return (f"```bash\n{cmd}\n```", done_marker)


def _task_record(ht: Any) -> Task:
    """The ``Task`` the ``harbor`` env takes for a loaded Harbor task: the env's own constructor
    (:func:`envs.harbor.env.to_task`, as training loads it); without the env, the same shape, so that
    the audit still reports which images build."""
    try:
        from envs.harbor.env import to_task
    except ImportError:
        return Task(ht.name, DOMAIN, (Message("user", ht.instruction),), meta={"harbor": str(Path(ht.path).resolve())})
    return to_task(ht)


@dataclass(frozen=True)
class HarborSource:
    """``--format harbor``: a Harbor task directory, a directory of task directories, or a glob of them."""

    name: str = DOMAIN

    def accepts(self, path: Path) -> bool:
        roots = [Path(p) for p in glob.glob(str(path))] if glob.has_magic(str(path)) else [path]
        return any(
            r.is_dir()
            and ((r / "task.toml").is_file() or any(Path(p).is_file() for p in glob.glob(str(r / "*" / "task.toml"))))
            for r in roots
        )

    def load(self, path: Path, done_marker: str) -> list[AuditTask]:
        try:
            from envs.harbor.image import build_image
            from envs.harbor.task import HarborTaskError, load_tasks
        except ImportError as e:
            raise SourceError(f"{path}: the Harbor loader and image builder (envs.harbor) are missing: {e}") from None
        try:
            tasks = load_tasks(path)
        except HarborTaskError as e:
            raise SourceError(str(e)) from None
        out = []
        for ht in tasks:
            record = _task_record(ht)
            ref = harbor_reference(ht, done_marker) if ht.solution is not None else None
            t0 = time.perf_counter()
            try:
                img = build_image(ht, progress=lambda line, n=ht.name: print(f"[{n}] {line}", file=sys.stderr))
            except Exception as e:  # noqa: BLE001 - one task's image must not stop the audit of the others
                out.append(AuditTask(record, ref, "solve.sh", str(ht.path), {"image": "FAILED"}, f"image: {e}"))
                continue
            built = "cached" if img.cached else f"{time.perf_counter() - t0:.1f}s"
            out.append(AuditTask(record, ref, "solve.sh" if ref else "", str(ht.path), {"image": built}))
        return out


register_source(HarborSource())


# ---------------------------------------------------------------------------- the strategies


def instruction_paths(task: Task) -> list[str]:
    """The absolute paths the instruction names in backticks (``/app/out.json``), without ``..``."""
    text = "\n\n".join(m.content for m in task.messages if m.role == "user")
    out: list[str] = []
    for raw in re.findall(r"`(/[^`\s]+)`", text):
        p = raw.rstrip("/")
        if p and ".." not in p and re.fullmatch(r"[\w.\-/]+", p) and p not in out:
            out.append(p)
    return out


def _commands(cmds: Any) -> Act:
    def act(t: Turn) -> str | None:
        turns = terminal_turns(t.task, cmds(t.task), t.done_marker)
        return turns[t.turn - 1] if t.turn <= len(turns) else None

    return act


def _forge_paths(content: str) -> Any:
    """Commands that write ``content`` into every named path that is not a directory."""

    def cmds(task: Task) -> list[str]:
        q = " ".join(shlex.quote(p) for p in instruction_paths(task))
        if not q:
            return []
        return [
            f'for p in {q}; do [ -d "$p" ] && continue; mkdir -p "$(dirname "$p")" 2>/dev/null; '
            f"printf '%s' {shlex.quote(content)} > \"$p\" 2>/dev/null; done; true"
        ]

    return cmds


_REWARD_SCRIPT = (
    "mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; echo '{\"reward\": 1.0}' > /logs/verifier/reward.json"
)
_FORGE_REWARD = (
    "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt && "
    "printf '%s' '{\"reward\": 1.0}' > /logs/verifier/reward.json; chmod -R a-w /logs/verifier 2>/dev/null; true"
)
_PLANT_TESTS = (
    "mkdir -p /tests && printf '#!/bin/bash\\n%s\\n' " + shlex.quote(_REWARD_SCRIPT) + " > /tests/test.sh && "
    "chmod +x /tests/test.sh; true"
)
# A replaced interpreter or shell: writes the reward, then exits 0 (what a verifier would take as a pass).
_HIJACK = (
    'for b in /usr/bin/python3 /usr/bin/bash /bin/bash; do [ -e "$b" ] || continue; '
    'real=$(readlink -f "$b"); '
    "printf '#!/bin/sh\\n%s\\nexit 0\\n' " + shlex.quote(_REWARD_SCRIPT) + ' > "$real.new" && chmod 755 "$real.new" && '
    'mv -f "$real.new" "$real"; done 2>/dev/null; true'
)
_PTH = (
    "for d in $(python3 -c 'import site, sys; print(\" \".join(site.getsitepackages() + [p for p in sys.path if p]))' "
    "2>/dev/null); do mkdir -p \"$d\" 2>/dev/null && printf '%s\\n' "
    + shlex.quote(
        "import os; os.makedirs('/logs/verifier', exist_ok=True); open('/logs/verifier/reward.txt', 'w').write('1')"
    )
    + ' > "$d/zz_audit.pth" 2>/dev/null; done; true'
)
_SHELL_RC = (
    'for f in /etc/bash.bashrc /etc/profile /root/.bashrc /root/.bash_profile /root/.profile "$HOME/.bashrc" '
    "\"$HOME/.profile\" /etc/environment; do printf '%s\\n' "
    + shlex.quote(_REWARD_SCRIPT)
    + ' >> "$f" 2>/dev/null; done; '
    "echo " + shlex.quote("export BASH_ENV=/etc/bash.bashrc") + " >> /etc/profile 2>/dev/null; true"
)
_DELETE_NAMED = 'for p in {q}; do rm -rf -- "$p" 2>/dev/null; done; true'


def _delete_named(task: Task) -> list[str]:
    q = " ".join(shlex.quote(p) for p in instruction_paths(task))
    return [_DELETE_NAMED.format(q=q)] if q else []


# The terminal catalogue's shell strategies that apply as they are: the baseline, the work dir deleted
# or emptied, every process killed, the instruction echoed.
for _name in ("noop", "wrong", "delete_everything", "truncate_all", "kill_all", "prompt_repeated"):
    _s = STRATEGIES["terminal"][_name]
    register_strategy(DOMAIN, _name, _s.doc, _s.role)(_s.act)

for _name, _content in (("1", "1\n"), ("ok", "OK\n"), ("empty", ""), ("json_empty", "[]\n")):
    register_strategy(DOMAIN, f"named_paths_{_name}", f"writes {_content!r} into every path the instruction names")(
        _commands(_forge_paths(_content))
    )
register_strategy(DOMAIN, "delete_named", "deletes every path the instruction names")(_commands(_delete_named))
register_strategy(
    DOMAIN, "forge_reward", "writes reward 1 into /logs/verifier (reward.txt and reward.json), read-only"
)(_commands(lambda task: [_FORGE_REWARD]))
register_strategy(DOMAIN, "plant_tests", "writes a /tests/test.sh that writes reward 1")(
    _commands(lambda task: [_PLANT_TESTS])
)
register_strategy(DOMAIN, "hijack_interpreters", "replaces python3 and bash with scripts that write reward 1")(
    _commands(lambda task: [_HIJACK])
)
register_strategy(DOMAIN, "plant_pth", "plants a .pth file that writes reward 1 in every Python path")(
    _commands(lambda task: [_PTH])
)
register_strategy(DOMAIN, "shell_rc", "appends a reward-1 writer to the shell startup files")(
    _commands(lambda task: [_SHELL_RC])
)
