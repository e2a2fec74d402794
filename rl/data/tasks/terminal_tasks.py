"""The terminal domain's task set, written for jointrl, graded easy -> hard.

    python -m rl.data.tasks.terminal_tasks [--out recipes/data/terminal_tasks.jsonl]

writes the tasks (domain ``"terminal"``) with :func:`envs.io.save_tasks`; same code, same
bytes (data is generated from fixed seeds).

Categories: ``files`` (dirs, copies, find, symlinks), ``text`` (grep, sed, awk, sort,
uniq, wc, cut), ``archive`` (tar, gzip), ``python`` (scripts for the system ``python3``),
``permissions`` (chmod; the sandbox user is uid 65534, so there are no chown tasks),
``process`` (background processes started by the setup) and ``git`` (repositories with
a local identity and fixed dates; ``$HOME`` is the work dir).

Rules every task follows (the test suite verifies the first two on every task):

* the reference ``solution`` passes the check (reward 1.0);
* doing nothing fails it (reward < 1.0);
* setup and check use only tools of a Debian base system (coreutils, findutils, grep,
  sed, mawk, diffutils, tar, gzip, bash) plus ``python3`` and ``git``;
* checks compare against expected values computed here (embedded in the check) or held
  by the harness (a value only the setup can know, such as a random token's hash or a
  process's pid and start time: the setup writes it with :func:`hold` and the check reads
  ``$HELD_<name>``), never against a file in the work dir the policy could rewrite; they
  print ``FAIL: <why>`` when they fail;
* the check runs after every process of the episode was killed (see
  :mod:`envs.terminal`), so process tasks check what a process did on SIGTERM (a trap
  that writes a file holding a secret token only that process knows) and which of the
  setup's processes were alive at the end (``$HELD_PROCESSES``, the harness's record).
"""

from __future__ import annotations

import argparse
import json
import posixpath
import random
import re
import shlex
from collections import Counter
from decimal import Decimal
from pathlib import Path

from envs.io import save_tasks
from envs.terminal import SYSTEM_PROMPT
from envs.types import Message, Task, TerminalSpec

__all__ = ["DEFAULT_OUT", "SOURCE", "build_tasks", "write_tasks", "main"]

SOURCE = "jointrl"
DEFAULT_OUT = Path(__file__).resolve().parents[3] / "recipes" / "data" / "terminal_tasks.jsonl"
_TIME_LIMIT = {"easy": 60.0, "medium": 90.0, "hard": 120.0}
_DIFFICULTY_ORDER = {"easy": 0, "medium": 1, "hard": 2}

sq = shlex.quote


# ------------------------------------------------------------------------------ helpers


def put(path: str, content: str) -> str:
    """Bash that writes ``content`` (exactly) to ``path``, creating its directory."""
    if "\x00" in content:
        raise ValueError(f"{path}: bash strings cannot hold NUL bytes")
    d = posixpath.dirname(path)
    return (f"mkdir -p {sq(d)}\n" if d else "") + f"printf '%s' {sq(content)} > {sq(path)}"


def need(cond: str, why: str) -> str:
    """A check line: fail with ``FAIL: why`` unless ``cond`` (bash) succeeds."""
    return f"{cond} || {{ echo {sq('FAIL: ' + why)}; exit 1; }}"


def is_file(path: str) -> str:
    """Condition: ``path`` is a regular file reached without any symlink (neither it nor a
    directory on its way is a link: a link to the input is not the file asked for)."""
    return f'[ -f {sq(path)} ] && [ "$(readlink -f -- {sq(path)})" = "$PWD/"{sq(posixpath.normpath(path))} ]'


def text_is(path: str, expected: str) -> str:
    """Check line: ``path`` holds ``expected`` (trailing newlines ignored on both sides); a
    regular file, not a symlink (:func:`is_file`)."""
    return need(
        f'{is_file(path)} && [ "$(cat {sq(path)})" = {sq(expected.rstrip(chr(10)))} ]',
        f"{path} does not hold the expected text",
    )


def value_is(path: str, *values: str) -> str:
    """Check line: ``path`` (a regular file, :func:`is_file`) holds one of ``values`` once
    whitespace is removed."""
    conds = " || ".join(f'[ "$v" = {sq(v)} ]' for v in values)
    return need(
        f"{is_file(path)} && v=\"$(tr -d '[:space:]' < {sq(path)})\" && {{ {conds}; }}",
        f"{path} does not hold the expected value",
    )


def check(*lines: str) -> str:
    return "\n".join([*lines, "echo OK"])


def git_repo(path: str, branch: str = "main") -> str:
    """Bash that creates a git repo with a local identity and fixed commit dates (in the setup subshell)."""
    return "\n".join(
        [
            "export GIT_AUTHOR_DATE='2024-01-15T12:00:00+00:00' GIT_COMMITTER_DATE='2024-01-15T12:00:00+00:00'",
            f"git init -q -b {branch} {sq(path)}",
            f"git -C {sq(path)} config user.name 'Sam Dev'",
            f"git -C {sq(path)} config user.email 'sam@example.com'",
        ]
    )


def git_clean(path: str, ignored_ok: bool = False) -> str:
    """A check line: the repo at ``path`` has no staged, modified, untracked or (unless
    ``ignored_ok``) ignored file. Listing ignored files too means no ignore rule the policy
    wrote can hide a file from this check; the repository's own git metadata is vetted by
    the harness before any check runs (:mod:`envs.terminal_git`)."""
    flags = "--porcelain --untracked-files=all" + ("" if ignored_ok else " --ignored")
    return need(f'[ -z "$(git -C {sq(path)} status {flags})" ]', "the working tree is not clean")


def git_commit(path: str, message: str, day: int) -> str:
    date = f"2024-01-{day:02d}T12:00:00+00:00"
    return (
        f"git -C {sq(path)} add -A && GIT_AUTHOR_DATE={date} GIT_COMMITTER_DATE={date} "
        f"git -C {sq(path)} commit -q -m {sq(message)}"
    )


_WORKER = """#!/bin/bash
# A background worker. On SIGTERM it says goodbye and exits.
name="${1:-worker}"
read -r token
trap 'echo "$name $token" >> stopped.log; exit 0' TERM
echo $$ > "/tmp/.worker-$name.pid"  # ready: the trap is set
while :; do
    sleep 0.2 &
    wait $!
done
"""


def hold(name: str, value: str) -> str:
    """Setup line: hand the value of the bash expression ``value`` to the check as ``$HELD_<name>``,
    held by the harness where the policy cannot write it (see :mod:`envs.terminal`)."""
    return f'printf \'%s\' "{value}" > "$JOINTRL_HELD/{name}"'


# Setup lines that make a secret token for workers; only its hash is kept, by the harness.
_TOKEN = "\n".join(
    [
        "tok=$(od -An -N12 -tx1 /dev/urandom | tr -d ' \\n')",
        hold("token_sha256", "$(printf '%s' \"$tok\" | sha256sum | cut -c1-64)"),
    ]
)


def _start_worker(name: str) -> str:
    """Setup lines: start ``bash worker.sh <name>`` with the token, wait until its trap is set,
    and hold its pid and start time (``$HELD_worker_<name>``: one process, even if the pid is
    reused later)."""
    pidfile = f"/tmp/.worker-{name}.pid"
    return "\n".join(
        [
            f'echo "$tok" | bash worker.sh {name} >/dev/null 2>&1 &',
            _wait_for(pidfile, fail=True),
            hold(f"worker_{name}", f"$(cat {pidfile}) $(cut -d' ' -f22 /proc/$(cat {pidfile})/stat)"),
        ]
    )


def _alive(name: str) -> str:
    """A bash condition: worker ``name`` (held pid and start time) was alive when the episode ended."""
    return f'[ -n "$HELD_worker_{name}" ] && printf \'%s\\n\' "$HELD_PROCESSES" | grep -q "^$HELD_worker_{name} "'


def _dead(name: str) -> str:
    return f'[ -n "$HELD_worker_{name}" ] && ! printf \'%s\\n\' "$HELD_PROCESSES" | grep -q "^$HELD_worker_{name} "'


# The check of a task whose tests call functions of a module the policy wrote. The tests run
# HERE, in a process that never imports the policy's code; the module under test is a proxy
# whose functions send each call (arguments as JSON) to a child process that imports the
# policy's module, and read back only data: the JSON return value or the name of the
# exception raised. So the policy's code cannot end the run with a fake status (os._exit,
# sys.exit), patch unittest or print a report: the per-test outcome is decided and kept here.
_RUNNER = r'''
import builtins, json, os, select, subprocess, sys, types, unittest

MODULE, WORK, TESTS = sys.argv[1], sys.argv[2], sys.argv[3]
CHILD = """
import json, os, sys
out = os.fdopen(int(sys.argv[2]), "w")
sys.path.insert(0, sys.argv[1])
try:
    import {module} as m
except BaseException as e:
    out.write(json.dumps({{"load_error": type(e).__name__}}) + "\\n"); out.flush(); raise SystemExit
out.write(json.dumps({{"ready": True}}) + "\\n"); out.flush()
for line in sys.stdin:
    req = json.loads(line)
    try:
        v = getattr(m, req["fn"])(*req["args"])
    except BaseException as e:
        r = json.dumps({{"id": req["id"], "raised": type(e).__name__}})
    else:
        try:
            r = json.dumps({{"id": req["id"], "value": v}}, allow_nan=False)
        except BaseException:
            r = json.dumps({{"id": req["id"], "not_data": True}})
    out.write(r + "\\n"); out.flush()
""".format(module=MODULE)


class NotData(Exception):
    """A call returned a value that does not cross as JSON (a NaN, an object)."""


class Remote:
    """The policy's module, in a child process; calls cross as JSON data."""

    def __init__(self):
        r, w = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", CHILD, WORK, str(w)], cwd=WORK, stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(w,), text=True,
        )
        os.close(w)
        self.out, self.buf, self.n = r, b"", 0
        hello = self.read()
        self.error = None if hello == {"ready": True} else f"the module does not load: {hello}"

    def read(self, timeout=5.0):
        while b"\n" not in self.buf:
            if not select.select([self.out], [], [], timeout)[0]:
                return {"dead": "timed out"}
            chunk = os.read(self.out, 65536)
            if not chunk or len(self.buf) > 1 << 20:
                return {"dead": "exited"}
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        try:
            return json.loads(line)
        except ValueError:
            return {"dead": "garbled reply"}

    def call(self, fn, args):
        if self.error:
            raise RuntimeError(self.error)
        self.n += 1
        try:
            self.proc.stdin.write(json.dumps({"id": self.n, "fn": fn, "args": list(args)}) + "\n")
            self.proc.stdin.flush()
        except OSError:
            self.error = "the program under test died"
            raise RuntimeError(self.error) from None
        rep = self.read()
        if not isinstance(rep, dict) or rep.get("id") != self.n:
            self.error = f"the program under test broke the protocol: {str(rep)[:80]}"
            raise RuntimeError(self.error)
        if "not_data" in rep:
            raise NotData(f"{fn} returned something that is not JSON data")
        if "raised" in rep:
            exc = getattr(builtins, str(rep["raised"]), None)
            raise exc() if isinstance(exc, type) and issubclass(exc, Exception) else RuntimeError(rep["raised"])
        return rep["value"]


remote = Remote()
proxy = types.ModuleType(MODULE)
proxy.__getattr__ = lambda name: (lambda *args: remote.call(name, args))
sys.modules[MODULE] = proxy
tests = types.ModuleType("harness_tests")
exec(compile(open(TESTS).read(), "harness_tests", "exec"), tests.__dict__)
suite = unittest.defaultTestLoader.loadTestsFromModule(tests)
result = unittest.TestResult()
suite.run(result)
remote.proc.kill()
failed = sorted({t.id().rsplit(".", 1)[-1] for t, _ in result.failures + result.errors})
for name in failed:
    print(f"FAIL: {name}")
print(f"{result.testsRun - len(failed)}/{result.testsRun} tests pass")
sys.exit(0 if result.testsRun and not failed and result.wasSuccessful() else 1)
'''


def _wait_gone(pid: str) -> str:
    """Bash that waits (up to 10 s) until process ``pid`` (a shell word) has exited (gone, or a zombie): a worker
    writes its log line in its trap before it exits, so the log alone does not say the process is gone."""
    return (
        "for i in $(seq 200); do s=$(cut -d' ' -f3 /proc/" + pid + "/stat 2>/dev/null); "
        '{ [ -z "$s" ] || [ "$s" = Z ]; } && break; sleep 0.05; done'
    )


def _wait_for(path: str, fail: bool = False) -> str:
    """Bash that waits (up to 10 s) until ``path`` is a non-empty file; with ``fail``, fails if it never is."""
    return f"for i in $(seq 200); do [ -s {sq(path)} ] && break; sleep 0.05; done" + (
        f"\n[ -s {sq(path)} ]" if fail else ""
    )


# ------------------------------------------------------------------------------ tasks


class _Builder:
    def __init__(self) -> None:
        self.tasks: list[Task] = []

    def add(
        self,
        id: str,
        category: str,
        difficulty: str,
        instruction: str,
        setup: str,
        check_: str,
        solution: str,
        *,
        runs_policy_files: bool = False,
    ) -> None:
        """One task. ``runs_policy_files``: the check runs a program the policy wrote (the point of
        the task); see ``check_runs_policy_files`` in :mod:`envs.terminal`."""
        meta = {"difficulty": difficulty, "category": category, "source": SOURCE}
        if runs_policy_files:
            meta["check_runs_policy_files"] = True
        self.tasks.append(
            Task(
                id=f"terminal-{category}-{id}",
                domain="terminal",
                messages=(Message("system", SYSTEM_PROMPT), Message("user", instruction)),
                terminal=TerminalSpec(
                    setup=setup, check=check_, solution=solution, time_limit_s=_TIME_LIMIT[difficulty]
                ),
                meta=meta,
            )
        )


def _files(b: _Builder) -> None:
    b.add(
        "mkdir",
        "files",
        "easy",
        "Create the directory `project/src/utils` (with its parents) and, inside it, an empty file named "
        "`__init__.py`.",
        "mkdir -p project",
        check(
            need("[ -d project/src/utils ]", "project/src/utils is not a directory"),
            need(
                "[ -f project/src/utils/__init__.py ] && [ ! -s project/src/utils/__init__.py ]",
                "project/src/utils/__init__.py is missing or not empty",
            ),
        ),
        "mkdir -p project/src/utils && touch project/src/utils/__init__.py",
    )

    report = "Quarterly report, version 3.\nRevenue grew 4% over the previous quarter.\n"
    b.add(
        "rename",
        "files",
        "easy",
        "Rename the file `draft.txt` to `final.txt`.",
        put("draft.txt", report),
        check(need("[ ! -e draft.txt ]", "draft.txt still exists"), text_is("final.txt", report)),
        "mv draft.txt final.txt",
    )

    assets = {
        "assets/logo.svg": "<svg><circle r='4'/></svg>\n",
        "assets/css/site.css": "body { margin: 0; }\n",
        "assets/js/app.js": "console.log('ready');\n",
    }
    b.add(
        "copy-tree",
        "files",
        "easy",
        "Make a copy of the directory `assets` (with everything in it) at `backup/assets`. "
        "The original must stay where it is.",
        "\n".join(put(p, c) for p, c in assets.items()),
        check(
            *(text_is(p, c) for p, c in assets.items()),
            *(text_is("backup/" + p, c) for p, c in assets.items()),
            need('[ "$(find backup -type f | wc -l)" = 3 ]', "backup/ holds other files"),
        ),
        "mkdir -p backup && cp -r assets backup/",
    )

    logs = [
        "logs/app.log",
        "logs/db.log",
        "logs/2024/jan/app.log",
        "logs/2024/jan/worker.log",
        "logs/2024/feb/app.log",
        "logs/archive/old/app.log",
        "logs/archive/cron.log",
    ]
    decoys = ["logs/README.txt", "logs/2024/notes.log.txt", "logs/archive/app.log.gz", "logs/catalog"]
    b.add(
        "count-logs",
        "files",
        "easy",
        "Count the files whose names end in `.log` anywhere under the directory `logs/` and write that "
        "number to `count.txt`.",
        "\n".join(put(p, f"entry for {p}\n") for p in logs + decoys),
        check(value_is("count.txt", str(len(logs)))),
        "find logs -type f -name '*.log' | wc -l > count.txt",
    )

    sizes = {
        "data/a.bin": 1200,
        "data/raw/sample_with_a_long_name.bin": 800,
        "data/raw/x.bin": 3100,
        "data/archive/2023/dump.bin": 5000,
        "data/archive/2023/small1.bin": 2000,
        "data/archive/2023/small2.bin": 2000,
        "data/archive/2023/small3.bin": 2000,
        "data/tmp/cache.bin": 4999,
    }
    b.add(
        "largest",
        "files",
        "medium",
        "Find the largest file under `data/` and write its path, relative to your work directory "
        "(like `data/some/file.bin`), to `largest.txt`.",
        "\n".join(f"mkdir -p {sq(posixpath.dirname(p))} && head -c {n} /dev/zero > {sq(p)}" for p, n in sizes.items()),
        check(value_is("largest.txt", "data/archive/2023/dump.bin", "./data/archive/2023/dump.bin")),
        "find data -type f -printf '%s %p\\n' | sort -n | tail -1 | cut -d' ' -f2 > largest.txt",
    )

    full = {"tree/a.txt": "alpha\n", "tree/sub/b.txt": "beta\n", "tree/sub/deep/c.cfg": "x=1\n", "tree/d.md": "# d\n"}
    empty = ["tree/empty1.txt", "tree/sub/empty2.log", "tree/sub/deep/empty3", "tree/other/empty4.txt"]
    b.add(
        "delete-empty",
        "files",
        "medium",
        "Delete every empty file under `tree/`. Keep every non-empty file and keep all directories.",
        "\n".join(
            [
                *(put(p, c) for p, c in full.items()),
                *(f"mkdir -p {sq(posixpath.dirname(p))} && : > {sq(p)}" for p in empty),
            ]
        ),
        check(
            need('[ -z "$(find tree -type f -empty)" ]', "empty files remain"),
            *(text_is(p, c) for p, c in full.items()),
            need("[ -d tree/other ] && [ -d tree/sub/deep ]", "a directory was removed"),
        ),
        "find tree -type f -empty -delete",
    )

    b.add(
        "symlink",
        "files",
        "medium",
        "The symbolic link `current` points to `releases/v1`. Make it point to `releases/v2` instead "
        "(a relative link; `current` must still be a symlink, and the releases must stay intact).",
        "\n".join(
            [
                put("releases/v1/app.txt", "app v1\n"),
                put("releases/v2/app.txt", "app v2\n"),
                "ln -s releases/v1 current",
            ]
        ),
        check(
            need("[ -L current ]", "current is not a symlink"),
            need(
                't=$(readlink current) && { [ "$t" = releases/v2 ] || [ "$t" = releases/v2/ ] '
                '|| [ "$t" = ./releases/v2 ]; }',
                "current does not point to releases/v2 (relative)",
            ),
            # Through the link (the point of the task), so not text_is, which refuses links.
            need('[ "$(cat current/app.txt)" = "app v2" ]', "current/app.txt does not hold app v2"),
            text_is("releases/v1/app.txt", "app v1\n"),
            need("[ ! -L releases/v1/v2 ] && [ ! -L releases/v2/v2 ]", "a stray link was made inside a release"),
        ),
        "ln -sfn releases/v2 current",
    )

    photos = {
        "photos/2021/jan/a1.jpg": "JPEG a1",
        "photos/2021/feb/b2.jpg": "JPEG b2",
        "photos/2022/c3.jpg": "JPEG c3",
        "photos/2022/summer/beach/d4.jpg": "JPEG d4",
        "photos/e5.jpg": "JPEG e5",
    }
    others = {"photos/2021/notes.txt": "trip notes\n", "photos/2022/summer/list.csv": "a,b\n"}
    b.add(
        "flatten",
        "files",
        "hard",
        "Move every `.jpg` file found anywhere under `photos/` directly into a new directory `gallery/` "
        "(no subdirectories in `gallery/`; the file names are unique). Leave all other files where they are.",
        "\n".join(put(p, c) for p, c in {**photos, **others}.items()),
        check(
            *(text_is("gallery/" + posixpath.basename(p), c) for p, c in photos.items()),
            need('[ "$(find gallery -mindepth 1 | wc -l)" = 5 ]', "gallery/ must hold exactly the 5 photos"),
            need("[ -z \"$(find photos -name '*.jpg')\" ]", "jpg files remain under photos/"),
            *(text_is(p, c) for p, c in others.items()),
        ),
        "mkdir -p gallery && find photos -type f -name '*.jpg' -exec mv {} gallery/ \\;",
    )

    docs = {
        "docs/a.txt": "alpha\n",
        "docs/b.txt": "beta\n",
        "docs/c.txt": "alpha\n",
        "docs/sub/d.txt": "beta\n",
        "docs/sub/e.txt": "gamma\n",
        "docs/z.txt": "alpha\n",
        "docs/sub/f.txt": "alpha \n",
    }
    keep = ["docs/a.txt", "docs/b.txt", "docs/sub/e.txt", "docs/sub/f.txt"]
    b.add(
        "dedupe",
        "files",
        "hard",
        "Some files under `docs/` have identical contents. For each group of files with identical contents, "
        "keep only the file whose path sorts first in byte order (as `LC_ALL=C sort` orders the paths "
        "`find docs -type f` prints) and delete the others. Files with unique contents stay.",
        "\n".join(put(p, c) for p, c in docs.items()),
        check(
            need(
                f'[ "$(find docs -type f | LC_ALL=C sort)" = {sq(chr(10).join(keep))} ]',
                "docs/ does not hold exactly the files to keep",
            ),
            *(text_is(p, docs[p]) for p in keep),
        ),
        "declare -A seen\n"
        "while read -r f; do\n"
        '  h=$(md5sum < "$f")\n'
        '  if [ -n "${seen[$h]:-}" ]; then rm -- "$f"; else seen[$h]=1; fi\n'
        "done < <(find docs -type f | LC_ALL=C sort)",
    )


def _text(b: _Builder) -> None:
    rng = random.Random(101)
    levels = ["INFO"] * 6 + ["WARN"] * 2 + ["ERROR"] * 2
    msgs = [
        "request served",
        "cache miss",
        "user logged in",
        "disk usage at 71%",
        "retrying connection",
        "payment declined",
        "timeout talking to db",
        "config reloaded",
        "queue length 12",
        "job finished",
    ]
    log = [
        f"2024-03-0{1 + i // 10} 0{i % 10}:{rng.randrange(60):02d}:{rng.randrange(60):02d} "
        f"{rng.choice(levels)} {rng.choice(msgs)}"
        for i in range(30)
    ]
    log[3] = log[3].split(" ")[0] + " 03:14:15 INFO no ERRORS so far"  # contains ERROR as a substring
    errors = [ln for ln in log if "ERROR" in ln]
    b.add(
        "grep-errors",
        "text",
        "easy",
        "Write every line of `app.log` that contains `ERROR` to `errors.txt`, keeping their original order.",
        put("app.log", "\n".join(log) + "\n"),
        check(text_is("errors.txt", "\n".join(errors))),
        "grep ERROR app.log > errors.txt",
    )

    poem = (
        "The fog comes\non little cat feet.\n\nIt sits looking\nover harbor and city\non silent haunches\n"
        "and then   moves on.\n"
    )
    b.add(
        "wc-words",
        "text",
        "easy",
        "Write the number of words in `poem.txt` (as `wc -w` counts them) to `words.txt`.",
        put("poem.txt", poem),
        check(value_is("words.txt", str(len(poem.split())))),
        "wc -w < poem.txt > words.txt",
    )

    users = [
        ("1", "Ada Lovelace", "ada@example.com", "London"),
        ("2", "Alan Turing", "alan@example.org", "Wilmslow"),
        ("3", "Grace Hopper", "grace@navy.example", "Arlington"),
        ("4", "Linus T", "linus@kernel.example", "Portland"),
        ("5", "Margaret Hamilton", "mh@apollo.example", "Boston"),
        ("6", "Ken Thompson", "ken@bell.example", "Murray Hill"),
    ]
    b.add(
        "csv-column",
        "text",
        "easy",
        "`users.csv` has the columns id,name,email,city and a header line. Write the email addresses "
        "(third column, without the header) to `emails.txt`, one per line, in file order.",
        put("users.csv", "id,name,email,city\n" + "".join(",".join(u) + "\n" for u in users)),
        check(text_is("emails.txt", "\n".join(u[2] for u in users))),
        "tail -n +2 users.csv | cut -d, -f3 > emails.txt",
    )

    essay = (
        "The colour of the sky changes with the seasons.\nPainters mix colours to match the colour they see.\n"
        "Nothing else here changes: collar, cooler, color.\nA colourful ending.\n"
    )
    b.add(
        "sed-replace",
        "text",
        "easy",
        "Replace every occurrence of `colour` with `color` in `essay.txt`, editing the file in place.",
        put("essay.txt", essay),
        check(text_is("essay.txt", essay.replace("colour", "color"))),
        "sed -i 's/colour/color/g' essay.txt",
    )

    rng = random.Random(202)
    pool = ["Mia", "Noah", "Olivia", "Liam", "Emma", "Ava", "Lucas", "Zoe", "Ethan", "Isla", "Leo", "Chloe"]
    names = [rng.choice(pool) for _ in range(40)]
    b.add(
        "sort-uniq",
        "text",
        "medium",
        "Write the distinct names of `names.txt` to `unique.txt`, one per line, sorted alphabetically "
        "(each name once).",
        put("names.txt", "\n".join(names) + "\n"),
        check(text_is("unique.txt", "\n".join(sorted(set(names))))),
        "sort -u names.txt > unique.txt",
    )

    rng = random.Random(303)
    counts = {
        "10.0.0.5": 12,
        "192.168.1.20": 9,
        "172.16.0.3": 7,
        "10.0.0.77": 4,
        "192.168.1.3": 3,
        "8.8.4.4": 2,
        "10.0.0.50": 1,
    }
    hits = [ip for ip, n in counts.items() for _ in range(n)]
    rng.shuffle(hits)
    paths = ["/", "/login", "/api/items", "/static/app.js", "/favicon.ico"]
    access = [
        f'{ip} - - [12/Mar/2024:10:{i // 60:02d}:{i % 60:02d} +0000] "GET {rng.choice(paths)} HTTP/1.1" '
        f"{rng.choice([200, 200, 304, 404])} {rng.randrange(100, 5000)}"
        for i, ip in enumerate(hits)
    ]
    b.add(
        "top-ips",
        "text",
        "medium",
        "Write the three IP addresses that appear most often in `access.log` (the first field of each line), "
        "most frequent first, one per line, to `top3.txt`.",
        put("access.log", "\n".join(access) + "\n"),
        check(text_is("top3.txt", "10.0.0.5\n192.168.1.20\n172.16.0.3")),
        "cut -d' ' -f1 access.log | sort | uniq -c | sort -rn | head -3 | awk '{print $2}' > top3.txt",
    )

    rng = random.Random(404)
    regions = ["north", "south", "east", "west", "central"]
    rows = [(rng.choice(regions), rng.choice(["widget", "gadget", "gizmo"]), rng.randrange(5, 500)) for _ in range(25)]
    totals: dict[str, int] = {}
    for r, _, a in rows:
        totals[r] = totals.get(r, 0) + a
    b.add(
        "awk-sum",
        "text",
        "medium",
        "`sales.csv` has a header line and the columns region,product,amount. For each region write a line "
        "`<region> <total amount>` to `totals.txt`, one line per region, sorted by region name.",
        put("sales.csv", "region,product,amount\n" + "".join(f"{r},{p},{a}\n" for r, p, a in rows)),
        check(text_is("totals.txt", "\n".join(f"{r} {totals[r]}" for r in sorted(totals)))),
        "tail -n +2 sales.csv | awk -F, '{s[$1]+=$3} END {for (r in s) print r, s[r]}' | sort > totals.txt",
    )

    conf = (
        "# App configuration\nhost=0.0.0.0\nport=80\n#debug=true\nworkers=4\n# port=80 is the default\nlog_level=info\n"
    )
    want = conf.replace("\nport=80\n", "\nport=8080\n").replace("\n#debug=true\n", "\ndebug=true\n")
    b.add(
        "config-edit",
        "text",
        "medium",
        "Edit `app.conf` in place: set the port to 8080 (the `port=80` setting line) and enable debug by "
        "uncommenting the line `#debug=true`. Leave every other line exactly as it is.",
        put("app.conf", conf),
        check(text_is("app.conf", want)),
        "sed -i -e 's/^port=80$/port=8080/' -e 's/^#debug=true$/debug=true/' app.conf",
    )

    rng = random.Random(505)
    logins = {"alice": 5, "bob": 3, "carol": 5, "dave": 1, "erin": 3, "frank": 0}
    events = [(u, "login") for u, n in logins.items() for _ in range(n)]
    events += [(rng.choice(list(logins)), rng.choice(["logout", "upload", "login_failed"])) for _ in range(14)]
    rng.shuffle(events)
    ev_lines = [f"2024-05-01T{8 + i // 60:02d}:{i % 60:02d}:00 user={u} action={a}" for i, (u, a) in enumerate(events)]
    ranked = sorted(((u, n) for u, n in logins.items() if n), key=lambda t: (-t[1], t[0]))
    b.add(
        "login-counts",
        "text",
        "hard",
        "Count the `login` events per user in `events.log` (lines look like "
        "`2024-05-01T08:00:00 user=alice action=login`; other actions do not count) and write "
        "`<user> <count>` lines to `logins.txt`, highest count first, ties in alphabetical order of the user. "
        "Users without logins are left out.",
        put("events.log", "\n".join(ev_lines) + "\n"),
        check(text_is("logins.txt", "\n".join(f"{u} {n}" for u, n in ranked))),
        "grep ' action=login$' events.log | sed 's/.* user=\\([^ ]*\\) .*/\\1/' | sort | uniq -c "
        "| awk '{print $2, $1}' | sort -k2,2nr -k1,1 > logins.txt",
    )

    rng = random.Random(606)
    srv, warn_msgs = [], []
    t = 10 * 3600
    for i in range(40):
        t += rng.randrange(20, 140)
        stamp = f"{t // 3600:02d}:{t % 3600 // 60:02d}:{t % 60:02d}"
        if i == 8:
            stamp = "10:15:00"
        if i == 30:
            stamp = "10:45:00"
        level = "WARN" if i in (8, 30) else rng.choice(["INFO", "INFO", "WARN", "DEBUG"])
        msg = f"{rng.choice(['slow query', 'high memory', 'retry scheduled', 'cert expires soon'])} #{i}"
        srv.append(f"{stamp} {level} {msg}")
    srv.sort(key=lambda ln: ln[:8])
    warn_msgs = [ln.split(" ", 2)[2] for ln in srv if ln.split(" ")[1] == "WARN" and "10:15:00" <= ln[:8] <= "10:45:00"]
    assert len(warn_msgs) >= 3
    b.add(
        "log-window",
        "text",
        "hard",
        "`server.log` has lines `HH:MM:SS LEVEL message`. Write the messages (the text after the level) of all "
        "`WARN` lines whose time is from 10:15:00 to 10:45:00, both included, to `warnings.txt`, in file order.",
        put("server.log", "\n".join(srv) + "\n"),
        check(text_is("warnings.txt", "\n".join(warn_msgs))),
        'awk \'$2=="WARN" && $1>="10:15:00" && $1<="10:45:00" {sub(/^[^ ]+ [^ ]+ /, ""); print}\' '
        "server.log > warnings.txt",
    )


def _archive(b: _Builder) -> None:
    site = {
        "site/index.html": "<h1>Hello</h1>\n",
        "site/css/style.css": "h1 { color: teal; }\n",
        "site/img/README": "images go here\n",
    }
    b.add(
        "tar-create",
        "archive",
        "easy",
        "Create a gzip-compressed tar archive `site.tar.gz` of the directory `site` "
        "(paths inside the archive must start with `site/`).",
        "\n".join(put(p, c) for p, c in site.items()),
        check(
            need("[ -f site.tar.gz ] && gzip -t site.tar.gz 2>/dev/null", "site.tar.gz is not a gzip file"),
            't=$(mktemp -d) && tar -xzf site.tar.gz -C "$t" || { echo "FAIL: cannot extract"; exit 1; }',
            *(
                need(f'[ "$(cat "$t"/{sq(p)})" = {sq(c.rstrip(chr(10)))} ]', f"{p} missing or wrong in the archive")
                for p, c in site.items()
            ),
        ),
        "tar -czf site.tar.gz site",
    )

    bundle = {
        "docs/readme.md": "# Bundle\nUse bin/tool.sh.\n",
        "bin/tool.sh": "#!/bin/sh\necho tool\n",
        "VERSION": "1.4.2\n",
    }
    b.add(
        "tar-extract",
        "archive",
        "easy",
        "Extract `bundle.tar.gz` into a new directory `out/` (so that, for example, `out/docs/readme.md` exists).",
        "\n".join(
            [
                "mkdir stage",
                *(put("stage/" + p, c) for p, c in bundle.items()),
                "tar -czf bundle.tar.gz -C stage .",
                "rm -r stage",
            ]
        ),
        check(*(text_is("out/" + p, c) for p, c in bundle.items())),
        "mkdir -p out && tar -xzf bundle.tar.gz -C out",
    )

    csv = "day,temp\n" + "".join(f"2024-06-{d:02d},{15 + (d * 7) % 11}\n" for d in range(1, 21))
    b.add(
        "gunzip",
        "archive",
        "easy",
        "Decompress `data.csv.gz` so that `data.csv` holds its contents.",
        put("data.csv", csv) + "\ngzip -n data.csv",
        check(text_is("data.csv", csv)),
        "gunzip -k data.csv.gz",
    )

    backup = {
        "config/settings.ini": "[main]\ntheme=dark\nlang=en\n",
        "config/secrets.ini": "token=abc123\n",
        "data/users.db": "users...\n",
    }
    b.add(
        "extract-one",
        "archive",
        "medium",
        "From `backup.tar`, extract only the file `config/settings.ini` (it must end up at `config/settings.ini` "
        "in your work directory). Do not extract anything else.",
        "\n".join(
            [
                "mkdir stage",
                *(put("stage/" + p, c) for p, c in backup.items()),
                "tar -cf backup.tar -C stage config data",
                "rm -r stage",
            ]
        ),
        check(
            text_is("config/settings.ini", backup["config/settings.ini"]),
            need("[ ! -e config/secrets.ini ] && [ ! -e data ]", "other files were extracted too"),
            need("[ -f backup.tar ]", "backup.tar is gone"),
        ),
        "tar -xf backup.tar config/settings.ini",
    )

    src = {
        "src/app.py": "print('app')\n",
        "src/util.py": "X = 1\n",
        "src/pkg/__init__.py": "",
        "src/pkg/core.py": "def f():\n    return 2\n",
    }
    junk = ["src/__pycache__/app.cpython-311.pyc", "src/pkg/__pycache__/core.cpython-311.pyc", "src/old.pyc"]
    b.add(
        "tar-exclude",
        "archive",
        "medium",
        "Create `src.tar.gz`, a gzip-compressed tar archive of the directory `src` (paths starting with `src/`), "
        "that leaves out every `.pyc` file and every `__pycache__` directory.",
        "\n".join([*(put(p, c) for p, c in src.items()), *(put(p, "\x7fpyc bytecode\n") for p in junk)]),
        check(
            need("[ -f src.tar.gz ] && tar -tzf src.tar.gz > /tmp/list", "src.tar.gz is not a tar.gz archive"),
            need("! grep -q -e '\\.pyc$' -e __pycache__ /tmp/list", "the archive holds .pyc or __pycache__"),
            need(
                f"[ \"$(sed 's#^\\./##' /tmp/list | grep -v '/$' | LC_ALL=C sort)\" = "
                f"{sq(chr(10).join(sorted(src)))} ]",
                "the archive does not hold exactly the .py files",
            ),
        ),
        "tar -czf src.tar.gz --exclude='*.pyc' --exclude=__pycache__ src",
    )

    b.add(
        "nested",
        "archive",
        "hard",
        "The archive `outer.tar` contains another archive, which contains a file `code.txt`. Write the contents "
        "of that file to `code.txt` in your work directory.",
        "\n".join(
            [
                "mkdir -p stage/in/secret stage/out/layer1",
                put("stage/in/secret/code.txt", "K7-PLUM-93\n"),
                put("stage/out/layer1/README", "nothing to see\n"),
                "tar -czf stage/out/layer1/inner.tar.gz -C stage/in secret",
                "tar -cf outer.tar -C stage/out layer1",
                "rm -r stage",
            ]
        ),
        check(value_is("code.txt", "K7-PLUM-93")),
        "mkdir -p /tmp/x && tar -xf outer.tar -C /tmp/x && tar -xzf /tmp/x/layer1/inner.tar.gz -O secret/code.txt"
        " > code.txt",
    )

    contents = {
        "logs-jan.tar.gz": ["jan/app.log", "jan/db.log"],
        "photos.tar.gz": ["img/1.jpg", "img/needle.txt.bak"],
        "misc.tar.gz": ["misc/a/b/needle.txt", "misc/readme"],
        "empty-ish.tar.gz": ["keep/.keep"],
        "src.tar.gz": ["src/needles.txt", "src/main.c"],
    }
    setup = ["mkdir -p archives"]
    for name, files in contents.items():
        setup += [
            "rm -rf stage && mkdir stage",
            *(put("stage/" + f, f"{f}\n") for f in files),
            f"tar -czf archives/{name} -C stage .",
            "rm -rf stage",
        ]
    b.add(
        "find-needle",
        "archive",
        "hard",
        "Exactly one of the `.tar.gz` archives in `archives/` contains a file named exactly `needle.txt`. "
        "Write the file name of that archive (like `name.tar.gz`) to `answer.txt`.",
        "\n".join(setup),
        check(value_is("answer.txt", "misc.tar.gz", "archives/misc.tar.gz")),
        'for a in archives/*.tar.gz; do tar -tzf "$a" | grep -q \'\\(^\\|/\\)needle\\.txt$\' && basename "$a"; '
        "done > answer.txt",
    )


def _python(b: _Builder) -> None:
    b.add(
        "greet",
        "python",
        "easy",
        "Write a Python script `greet.py` that prints `Hello, <name>!`, where <name> is its first command-line "
        "argument: `python3 greet.py Ada` prints `Hello, Ada!`.",
        ":",
        check(
            need('[ "$(python3 greet.py Ada)" = "Hello, Ada!" ]', "python3 greet.py Ada is wrong"),
            need(
                '[ "$(python3 greet.py "Grace Hopper")" = "Hello, Grace Hopper!" ]',
                "python3 greet.py 'Grace Hopper' is wrong",
            ),
        ),
        "printf '%s\\n' 'import sys' 'print(f\"Hello, {sys.argv[1]}!\")' > greet.py",
        runs_policy_files=True,
    )

    stats = (
        "import sys\n\n\ndef mean(values):\n    total = 0\n    for v in values[1:]:\n        total += v\n"
        '    return total / len(values)\n\n\nif __name__ == "__main__":\n'
        "    print(mean([float(x) for x in sys.argv[1:]]))\n"
    )
    b.add(
        "fix-mean",
        "python",
        "medium",
        "`stats.py` should print the mean of the numbers given as its arguments (`python3 stats.py 1 2 3 4` must "
        "print `2.5`), but it prints wrong results. Find and fix the bug.",
        put("stats.py", stats),
        check(
            need('[ "$(python3 stats.py 1 2 3 4)" = 2.5 ]', "python3 stats.py 1 2 3 4 is not 2.5"),
            need('[ "$(python3 stats.py 10)" = 10.0 ]', "python3 stats.py 10 is not 10.0"),
            need('[ "$(python3 stats.py 2 4 9)" = 5.0 ]', "python3 stats.py 2 4 9 is not 5.0"),
            need("python3 -c 'import stats; assert stats.mean([1, 2]) == 1.5'", "stats.mean is wrong"),
        ),
        "sed -i 's/values\\[1:\\]/values/' stats.py",
        runs_policy_files=True,
    )

    rng = random.Random(707)
    items = [
        {"name": n, "qty": rng.randrange(1, 40), "price": float(Decimal(rng.randrange(99, 9999)) / 100)}
        for n in ["bolt", "nut", "washer", "gear", "spring", "hinge", "bracket", "valve"]
    ]
    total = sum(Decimal(str(i["price"])) * i["qty"] for i in items)
    b.add(
        "inventory",
        "python",
        "medium",
        "`inventory.json` is a list of items with `name`, `qty` and `price`. Write the total value of the stock "
        "(the sum of qty times price) with exactly two decimals (like `1234.50`) to `total.txt`.",
        put("inventory.json", json.dumps(items, indent=2) + "\n"),
        check(value_is("total.txt", f"{total:.2f}")),
        "python3 -c \"import json; d = json.load(open('inventory.json')); "
        'print(f\'{sum(i[\\"qty\\"] * i[\\"price\\"] for i in d):.2f}\')" > total.txt',
    )

    def top(text: str, n: int) -> str:
        c = Counter(w.lower() for w in re.findall(r"[A-Za-z]+", text))
        return "\n".join(f"{w} {k}" for w, k in sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[:n])

    sample = "the cat and the hat\nThe end.\n"
    t1 = "Apple banana apple; CHERRY banana apple.\ncherry-pie: date date Date, egg!\n"
    t2 = "It was the best of times, it was the worst of times; it was the age of wisdom.\n"
    wordfreq_check = [
        need("[ -f wordfreq.py ]", "wordfreq.py is missing"),
        "t=$(mktemp -d)",
        f"printf '%s' {sq(t1)} > \"$t/t1.txt\"",
        f"printf '%s' {sq(t2)} > \"$t/t2.txt\"",
        need(f'[ "$(python3 wordfreq.py "$t/t1.txt" 4)" = {sq(top(t1, 4))} ]', "wrong output for a test text"),
        need(f'[ "$(python3 wordfreq.py "$t/t2.txt" 3)" = {sq(top(t2, 3))} ]', "wrong output for a test text"),
    ]
    script = (
        "import re\nimport sys\nfrom collections import Counter\n\n"
        'words = re.findall(r"[A-Za-z]+", open(sys.argv[1]).read())\n'
        "counts = Counter(w.lower() for w in words)\n"
        "for w, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: int(sys.argv[2])]:\n"
        "    print(w, n)\n"
    )
    b.add(
        "wordfreq",
        "python",
        "hard",
        "Write a script `wordfreq.py`: `python3 wordfreq.py FILE N` prints the N most frequent words of FILE, one "
        "per line as `<word> <count>`, most frequent first, ties in alphabetical order. Words are maximal runs of "
        "ASCII letters, compared case-insensitively and printed in lower case. (`sample.txt` is there to try it "
        "on; it will be tested on other files.)",
        put("sample.txt", sample),
        check(*wordfreq_check),
        f"cat > wordfreq.py <<'EOF'\n{script}EOF",
        runs_policy_files=True,
    )

    calc = (
        '"""A tiny calculator library."""\n\n\ndef add(a, b):\n    return a + b\n\n\n'
        "def divide(a, b):\n    raise NotImplementedError\n\n\n"
        "def clamp(x, lo, hi):\n    raise NotImplementedError\n"
    )
    tests = (
        "import unittest\n\nfrom calc import add, clamp, divide\n\n\nclass CalcTest(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
        "    def test_divide(self):\n        self.assertEqual(divide(7, 2), 3.5)\n"
        "        with self.assertRaises(ValueError):\n            divide(1, 0)\n\n"
        "    def test_clamp(self):\n        self.assertEqual(clamp(5, 0, 3), 3)\n"
        "        self.assertEqual(clamp(-2, 0, 3), 0)\n        self.assertEqual(clamp(2, 0, 3), 2)\n\n\n"
        'if __name__ == "__main__":\n    unittest.main()\n'
    )
    # Run with the shown tests, and not shown to the policy: a calc.py that is a lookup table of
    # the shown cases fails these.
    hidden_tests = (
        "\n\nclass HiddenTest(unittest.TestCase):\n"
        "    def test_more_cases(self):\n"
        "        self.assertEqual(add(-4, 10), 6)\n        self.assertEqual(divide(9, 4), 2.25)\n"
        "        self.assertEqual(divide(-3, 2), -1.5)\n        with self.assertRaises(ValueError):\n"
        "            divide(0, 0)\n        self.assertEqual(clamp(10, -5, 5), 5)\n"
        "        self.assertEqual(clamp(-10, -5, 5), -5)\n        self.assertEqual(clamp(1, -5, 5), 1)\n"
    )
    fixed = (
        '"""A tiny calculator library."""\n\n\ndef add(a, b):\n    return a + b\n\n\n'
        'def divide(a, b):\n    if b == 0:\n        raise ValueError("division by zero")\n    return a / b\n\n\n'
        "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n"
    )
    b.add(
        "make-tests-pass",
        "python",
        "hard",
        "Complete `calc.py` so that the unit tests in `test_calc.py` pass (`python3 -m unittest test_calc`). "
        "Do not change the tests.",
        "\n".join([put("calc.py", calc), put("test_calc.py", tests)]),
        check(
            need(is_file("calc.py"), "calc.py is missing"),
            't=$(mktemp -d) && cp calc.py "$t"/',
            f"printf '%s' {sq(tests + hidden_tests)} > \"$t/harness_tests.py\"",
            f"python3 -I - calc \"$t\" \"$t/harness_tests.py\" <<'EOF' || {{ echo 'FAIL: the tests do not pass'; exit 1; }}"
            f"\n{_RUNNER.strip()}\nEOF",
        ),
        f"cat > calc.py <<'EOF'\n{fixed}EOF",
    )


def _permissions(b: _Builder) -> None:
    script = "#!/bin/sh\necho ready\n"
    b.add(
        "make-executable",
        "permissions",
        "easy",
        "Make the script `run.sh` executable (do not change its contents).",
        put("run.sh", script) + "\nchmod 644 run.sh",
        check(
            need("[ -x run.sh ]", "run.sh is not executable"),
            text_is("run.sh", script),
            need('[ "$(./run.sh)" = ready ]', "./run.sh does not run"),
        ),
        "chmod +x run.sh",
        runs_policy_files=True,
    )

    b.add(
        "private-key",
        "permissions",
        "medium",
        "Restrict access: the file `secrets/key.pem` must be readable and writable by its owner only (mode 600), "
        "and the directory `secrets` must be accessible by its owner only (mode 700).",
        put("secrets/key.pem", "-----BEGIN KEY-----\nnot-a-real-key\n-----END KEY-----\n")
        + "\nchmod 644 secrets/key.pem && chmod 755 secrets",
        check(
            need('[ "$(stat -c %a secrets/key.pem)" = 600 ]', "secrets/key.pem is not mode 600"),
            need('[ "$(stat -c %a secrets)" = 700 ]', "secrets is not mode 700"),
        ),
        "chmod 600 secrets/key.pem && chmod 700 secrets",
    )

    modes = {
        "shared/a.txt": ("666", "664"),
        "shared/b.sh": ("777", "775"),
        "shared/c.txt": ("644", "644"),
        "shared/d.txt": ("602", "600"),
        "shared/sub/e.txt": ("646", "644"),
        "shared/sub/f.sh": ("750", "750"),
    }
    b.add(
        "world-writable",
        "permissions",
        "medium",
        "Some files under `shared/` are writable by everyone. Remove the write permission for others from every "
        "file under `shared/` and change nothing else.",
        "\n".join(
            [
                *(put(p, f"{p}\n") + f" && chmod {m0} {sq(p)}" for p, (m0, _) in modes.items()),
                "chmod 755 shared shared/sub",
            ]
        ),
        check(
            *(need(f'[ "$(stat -c %a {sq(p)})" = {m1} ]', f"{p} should have mode {m1}") for p, (_, m1) in modes.items())
        ),
        "chmod -R o-w shared",
    )

    dirs = {"www": "700", "www/css": "777", "www/cgi-bin": "750", "www/img/icons": "711", "www/img": "700"}
    files = {
        "www/index.html": "600",
        "www/css/site.css": "666",
        "www/img/icons/a.png": "644",
        "www/cgi-bin/form.cgi": "700",
        "www/cgi-bin/stats.cgi": "644",
        "www/robots.txt": "777",
    }
    want = {**{d: "755" for d in dirs}, **{f: ("755" if f.startswith("www/cgi-bin/") else "644") for f in files}}
    before = {**dirs, **files}
    # Partial credit for the paths that needed a change only (a no-op scores 0), less one for each
    # path that was right and no longer is; a path must keep its type (a link is no file).
    checker = (
        "import os, stat\n"
        f"want = {json.dumps(want, sort_keys=True)}\n"
        f"wrong_before = {json.dumps(sorted(p for p in want if before[p] != want[p]))}\n"
        f"dirs = {json.dumps(sorted(dirs))}\n"
        "fixed = broken = 0\n"
        "for path, mode in want.items():\n"
        "    try:\n"
        "        st = os.lstat(path)\n"
        "        kind_ok = stat.S_ISDIR(st.st_mode) if path in dirs else stat.S_ISREG(st.st_mode)\n"
        "        real = format(st.st_mode & 0o7777, 'o') if kind_ok else 'not a ' + ('directory' if path in dirs "
        "else 'regular file')\n"
        "    except OSError:\n"
        "        real = 'missing'\n"
        "    if real != mode:\n"
        "        print(f'FAIL: {path} has mode {real}, want {mode}')\n"
        "        broken += path not in wrong_before\n"
        "    elif path in wrong_before:\n"
        "        fixed += 1\n"
        "print(f'{max(0, fixed - broken) / len(wrong_before):.4f}')\n"
        "raise SystemExit(0 if fixed == len(wrong_before) and not broken else 1)\n"
    )
    setup = [
        *(put(f, f"{f}\n") for f in files),
        *(f"mkdir -p {sq(d)}" for d in dirs),
        *(f"chmod {m} {sq(f)}" for f, m in files.items()),
        *(f"chmod {m} {sq(d)}" for d, m in sorted(dirs.items(), key=lambda t: -t[0].count("/"))),
    ]
    b.add(
        "fix-tree",
        "permissions",
        "hard",
        "Fix the permissions under `www/`: every directory (including `www` itself) must have mode 755 and every "
        "file mode 644, except the files in `www/cgi-bin/`, which must have mode 755. (Partial credit: the "
        "check scores the fraction of the paths that needed a change that now have the right mode, less one for "
        "each path that had it and lost it.)",
        "\n".join(setup),
        f"python3 - <<'EOF'\n{checker}EOF",
        "find www -type d -exec chmod 755 {} + && find www -type f -exec chmod 644 {} + && chmod 755 www/cgi-bin/*",
    )


def _process(b: _Builder) -> None:
    b.add(
        "count-sleep",
        "process",
        "medium",
        "Some `sleep` processes are running in the background. How many of them were started as exactly "
        "`sleep 1000`? Write the number to `count.txt`.",
        "pids=''\n"
        'for i in 1 2 3; do sleep 1000 >/dev/null 2>&1 & pids="$pids $!"; done\n'
        'for i in 1 2; do sleep 2000 >/dev/null 2>&1 & pids="$pids $!"; done\n'
        'sleep 10000 >/dev/null 2>&1 & pids="$pids $!"\n'
        "# ready when every child has exec'd sleep (before that, its cmdline is still bash's)\n"
        "for p in $pids; do\n"
        '  for i in $(seq 200); do [ "$(head -c 5 /proc/$p/cmdline)" = sleep ] && break; sleep 0.05; done\n'
        '  [ "$(head -c 5 /proc/$p/cmdline)" = sleep ]\n'
        "done",
        check(value_is("count.txt", "3")),
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < \"$p/cmdline\" 2>/dev/null; echo; done "
        "| grep -cx 'sleep 1000 ' > count.txt",
    )

    token_ok = (
        '[ -n "$HELD_token_sha256" ] && [ "$(printf \'%s\' "$tok" | sha256sum | cut -c1-64)" = "$HELD_token_sha256" ]'
    )
    b.add(
        "stop-worker",
        "process",
        "medium",
        "A background worker process is running; its PID is in `worker.pid`. Stop it with SIGTERM (the default "
        "signal of `kill`) so that it can shut down cleanly. A `monitor` process (another copy of `worker.sh`) "
        "runs beside it and must keep running.",
        # The monitor tells stopping the worker from signalling every process (`kill -TERM -1`), which
        # stopped the worker cleanly too and scored 1.0 (jointrl audit's kill_all, #39 item 2).
        "\n".join(
            [
                put("worker.sh", _WORKER),
                _TOKEN,
                _start_worker("worker"),
                _start_worker("monitor"),
                "cp /tmp/.worker-worker.pid worker.pid",
            ]
        ),
        check(
            need(_dead("worker"), "the worker is still running"),
            need(_alive("monitor"), "the monitor did not keep running"),
            need('[ -f stopped.log ] && [ "$(wc -l < stopped.log)" = 1 ]', "the worker did not stop cleanly"),
            "read -r name tok < stopped.log",
            need(f'[ "$name" = worker ] && {token_ok}', "stopped.log was not written by the worker"),
        ),
        'pid=$(cat worker.pid)\nkill "$pid"\n' + _wait_for("stopped.log") + "\n" + _wait_gone('"$pid"'),
    )

    b.add(
        "kill-named",
        "process",
        "hard",
        "Three copies of `worker.sh` are running in the background, started as `bash worker.sh alpha`, "
        "`bash worker.sh beta` and `bash worker.sh gamma`. Terminate only the `beta` one, with SIGTERM; the other "
        "two must keep running.",
        "\n".join(
            [
                put("worker.sh", _WORKER),
                _TOKEN,
                *(_start_worker(n) for n in ("alpha", "beta", "gamma")),
            ]
        ),
        check(
            need(_dead("beta"), "the beta worker is still running"),
            need(_alive("alpha") + " && " + _alive("gamma"), "the alpha and gamma workers did not keep running"),
            need('[ -f stopped.log ] && [ "$(wc -l < stopped.log)" = 1 ]', "not exactly one worker stopped cleanly"),
            "read -r name tok < stopped.log",
            need(f'[ "$name" = beta ] && {token_ok}', "the worker that stopped is not beta"),
        ),
        "for p in /proc/[0-9]*; do\n"
        "  [ \"$(tr '\\0' ' ' < \"$p/cmdline\" 2>/dev/null)\" = 'bash worker.sh beta ' ] && kill \"${p#/proc/}\" "
        "&& pid=${p#/proc/}\n"
        "done\n" + _wait_for("stopped.log") + "\n" + _wait_gone('"$pid"'),
    )


def _git(b: _Builder) -> None:
    b.add(
        "init-commit",
        "git",
        "easy",
        "Turn the directory `notes` into a git repository and commit both files in it with the commit message "
        "`initial notes`. (A git identity is already configured.)",
        "\n".join(
            [
                put("notes/todo.md", "- buy milk\n- fix bike\n"),
                put("notes/ideas.md", "# Ideas\n- a game\n"),
                "git config --global user.name 'Sam Dev'",
                "git config --global user.email sam@example.com",
            ]
        ),
        check(
            need("git -C notes rev-parse -q --verify HEAD >/dev/null", "notes has no commit"),
            need('[ "$(git -C notes log -1 --format=%s)" = "initial notes" ]', "wrong commit message"),
            need(
                '[ "$(git -C notes ls-files | LC_ALL=C sort)" = "$(printf \'ideas.md\\ntodo.md\')" ]',
                "the commit does not hold exactly todo.md and ideas.md",
            ),
            git_clean("notes"),
        ),
        "git -C notes init -q && git -C notes add todo.md ideas.md && git -C notes commit -q -m 'initial notes'",
    )

    b.add(
        "branch",
        "git",
        "medium",
        "In the git repository `app`, create a branch `feature/login` from `main`, commit on it a new file "
        "`login.txt` containing the line `login page` (any commit message), then switch back to `main`.",
        "\n".join(
            [
                git_repo("app"),
                put("app/README.md", "# App\n"),
                git_commit("app", "initial commit", 10),
                put("app/main.py", "print('app')\n"),
                git_commit("app", "add main", 11),
            ]
        ),
        check(
            need('[ "$(git -C app rev-parse --abbrev-ref HEAD)" = main ]', "main is not checked out"),
            need(
                '[ "$(git -C app show feature/login:login.txt 2>/dev/null)" = "login page" ]',
                "feature/login has no login.txt with 'login page'",
            ),
            need("git -C app merge-base --is-ancestor main feature/login", "feature/login does not start at main"),
            need('[ "$(git -C app rev-list --count main)" = 2 ]', "main has changed"),
            need("! git -C app cat-file -e main:login.txt 2>/dev/null", "login.txt is on main"),
        ),
        "git -C app checkout -q -b feature/login main && echo 'login page' > app/login.txt && "
        "git -C app add login.txt && git -C app commit -q -m 'add login page' && git -C app checkout -q main",
    )

    b.add(
        "gitignore",
        "git",
        "medium",
        "In the git repository `proj`, make git ignore all `*.log` files and the `build/` directory, commit the "
        "`.gitignore` with the message `add gitignore`, and leave the working tree clean (`git status` shows "
        "nothing to commit).",
        "\n".join(
            [
                git_repo("proj"),
                put("proj/src/main.c", "int main(void) { return 0; }\n"),
                git_commit("proj", "initial", 10),
                put("proj/build/out.bin", "ELF\n"),
                put("proj/debug.log", "debug\n"),
                put("proj/src/trace.log", "trace\n"),
            ]
        ),
        check(
            git_clean("proj", ignored_ok=True),
            need('[ "$(git -C proj log -1 --format=%s)" = "add gitignore" ]', "wrong last commit message"),
            need("git -C proj cat-file -e HEAD:.gitignore", ".gitignore is not committed"),
            need(
                # -v names the rule's source: the committed .gitignore, not a rule from elsewhere.
                '[ "$(git -C proj check-ignore -v debug.log src/trace.log build/out.bin | cut -f1 | '
                'cut -d: -f1 | LC_ALL=C sort -u)" = .gitignore ]',
                "the log files or build/ are not ignored by proj/.gitignore",
            ),
            need("! git -C proj check-ignore -q src/util.c notes.txt", "files other than logs and build/ are ignored"),
            need(
                '[ "$(git -C proj ls-files | LC_ALL=C sort)" = "$(printf \'.gitignore\\nsrc/main.c\')" ]',
                "other files were committed",
            ),
            need("[ -f proj/debug.log ] && [ -f proj/build/out.bin ]", "the ignored files were deleted"),
        ),
        "printf '*.log\\nbuild/\\n' > proj/.gitignore && git -C proj add .gitignore && "
        "git -C proj commit -q -m 'add gitignore'",
    )

    steps = [
        ("settings.py", "HOST = 'localhost'\n", "initial settings"),
        ("net.py", "def connect():\n    pass\n", "add networking stub"),
        ("README.md", "# Service\nTimeouts are configured in settings.py.\n", "document timeouts"),
        ("settings.py", "HOST = 'localhost'\nPORT = 8000\n", "add port"),
        ("settings.py", "HOST = 'localhost'\nPORT = 8000\nMAGIC_TIMEOUT = 30\n", "tune network settings"),
        ("net.py", "def connect(timeout):\n    pass\n", "pass timeout to connect"),
        ("settings.py", "HOST = 'localhost'\nPORT = 8000\nMAGIC_TIMEOUT = 45\n", "raise timeout"),
        ("CHANGES", "v1.1: timeouts\n", "changelog"),
    ]
    setup = [git_repo("history")]
    for day, (path, content, msg) in enumerate(steps, start=1):
        setup += [put("history/" + path, content), git_commit("history", msg, day)]
    # The answer is compared with the hash the setup made, held by the harness: a commit the
    # policy adds with the same message is another commit.
    setup.append(hold("commit", "$(git -C history log --format=%H --grep='^tune network settings$')"))
    b.add(
        "find-commit",
        "git",
        "hard",
        "In the git repository `history`, find the commit that first added the text `MAGIC_TIMEOUT` to a file, "
        "and write its full 40-character commit hash to `answer.txt`.",
        "\n".join(setup),
        check(
            need(is_file("answer.txt"), "answer.txt is missing"),
            "h=$(tr -d '[:space:]' < answer.txt)",
            need(
                "printf '%s' \"$h\" | grep -qxE '[0-9a-f]{40}'",
                "answer.txt does not hold a full 40-hex-digit commit hash (a revision expression is not a hash)",
            ),
            need(
                '[ ${#HELD_commit} = 40 ] && [ "$h" = "$HELD_commit" ]',
                "that is not the commit that added MAGIC_TIMEOUT",
            ),
        ),
        "git -C history log --reverse --format=%H -S MAGIC_TIMEOUT | head -1 > answer.txt",
    )

    good = "retries=3\ntimeout=10\n"
    b.add(
        "revert",
        "git",
        "hard",
        "The last commit in the git repository `svc` broke `config.txt`. Undo it by adding a new commit that "
        "reverses it; do not rewrite or drop any existing commit.",
        "\n".join(
            [
                git_repo("svc"),
                put("svc/config.txt", good),
                put("svc/app.sh", "echo svc\n"),
                git_commit("svc", "initial", 1),
                put("svc/app.sh", "echo svc v2\n"),
                git_commit("svc", "v2", 2),
                put("svc/config.txt", "retries=0\ntimeout=1\n"),
                git_commit("svc", "update config", 3),
            ]
        ),
        check(
            need('[ "$(git -C svc rev-list --count HEAD)" = 4 ]', "svc should have exactly one new commit"),
            need(
                '[ "$(git -C svc log --skip=1 --format=%s)" = "$(printf \'update config\\nv2\\ninitial\')" ]',
                "the existing commits were changed",
            ),
            need(
                f'[ "$(git -C svc show HEAD:config.txt)" = {sq(good.rstrip())} ]',
                "config.txt is not restored in the new commit",
            ),
            need('[ "$(git -C svc show HEAD:app.sh)" = "echo svc v2" ]', "app.sh changed"),
            git_clean("svc"),
        ),
        "git -C svc revert --no-edit HEAD",
    )


def build_tasks() -> list[Task]:
    """Every terminal task, ordered by difficulty (easy -> hard), then category."""
    b = _Builder()
    for part in (_files, _text, _archive, _python, _permissions, _process, _git):
        part(b)
    return sorted(b.tasks, key=lambda t: _DIFFICULTY_ORDER[t.meta["difficulty"]])  # stable: category order kept


def write_tasks(out: str | Path = DEFAULT_OUT) -> Path:
    """Write :func:`build_tasks` to ``out`` (JSON lines); return the path."""
    out = Path(out)
    save_tasks(build_tasks(), out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m rl.data.tasks.terminal_tasks", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="the .jsonl file to write")
    args = parser.parse_args(argv)
    print(write_tasks(args.out))


if __name__ == "__main__":
    main()
