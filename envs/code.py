"""The code domain: extracting code from a chat answer, running tests in a sandbox, the env.

A code task (:class:`~envs.types.CodeSpec`) holds Python tests for an ``entry_point``.
:func:`extract_code` pulls the candidate program out of an assistant turn,
:func:`run_tests` runs it against the tests inside a :class:`~envs.sandbox.Sandbox`
(never on the host) and returns a :class:`TestOutcome` with the pass count,
:class:`CodeEnv` is the (optionally multi-turn) env, and :func:`load_humaneval` /
:func:`humaneval_to_native` read HumanEval-format files. Scoring lives in :mod:`rewards.code`.

How the tests run
-----------------
Two sandboxed programs per call, the candidate and the judge, wired to each other; see
:mod:`envs.code_verdict` for why the tests never share an interpreter, memory, files or
caches with the candidate, and :mod:`envs.code_wire` for the plain data that crosses. The
judge does, in order (what follows describes its reporting; the candidate only serves calls):

1. waits for the candidate's "loaded" message (or its load error), moves its own stdout
   to a private fd (what the tests print goes to stderr) and reports one line per event::

       __JOINTRL_RESULT__ {"i": 0, "ok": true, "msg": ""}

2. runs the task's ``prompt_code`` (its helpers) and binds the entry point to a proxy that
   calls the candidate;
3. runs the tests statement by statement, reporting each test as soon as it finishes (a
   later timeout or crash keeps the earlier results), then a ``{"done": ...}`` line.

With ``style == "assert"`` the tests are split into top-level statements (``ast``): every
statement is a *test* except imports, ``def``/``class``, assignments, ``pass`` and bare
constants (docstrings), which are *setup* (run in order; an error is reported but does not
count). With ``style == "humaneval"`` the tests (which define ``check``) are setup and the
one test is ``check(<entry_point>)``.

Public and hidden tests (:func:`test_plan`): a spec's ``public_tests`` (the example its
prompt shows) run first, then its ``tests``, the hidden ones. Only the hidden tests are
scored (every test, for a spec without hidden tests). A failing public ``assert a == b``
reports both sides (``got`` / ``expected``); failing hidden tests are reported as counts per
exception type (with one of the candidate's own tracebacks when the candidate raised it),
never which test failed, its source or a value it compares, so feedback never carries a
value that is scored (:func:`_hidden_failures` says why not even the index). Before
the tests the judge counts the hidden tests a trivial answer passes (a constant, an echo of
the input: :mod:`envs.code_baseline`); :func:`partial_credit` pays only above that.

A test counts only when the judge reported it, and the candidate has no way to write to
the judge's report channel: printing result lines, flooding the output or exiting early
(``sys.exit``, ``os._exit``) never fakes a pass, and neither do always-equal objects,
patched builtins or reading the tests (they are in another sandbox).

Both work dirs are the harness's: :func:`run_tests` empties them before each run (so files a
previous candidate left cannot accumulate or be seen by the next run), and ``-I`` keeps
it off ``sys.path`` (a planted ``json.py`` cannot shadow a module).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.io import TaskFormatError, read_json_objects, save_tasks
from envs.code_verdict import CANDIDATE_PROGRAM, JUDGE_PROGRAM
from envs.sandbox import Limits, RunResult, Sandbox, SandboxUnavailable
from envs.sandbox.base import retry_setup_race, setup_race
from envs.sandbox.files import remove_tree
from envs.sandbox.config import SandboxConfig
from envs.sandbox.pump import run_launches
from envs.types import CodeSpec, Message, Task

__all__ = [
    "CodeBlock",
    "CodeEnv",
    "MARKER",
    "STYLES",
    "TestOutcome",
    "extract_code",
    "find_code_blocks",
    "humaneval_to_native",
    "load_humaneval",
    "code_sandboxes",
    "run_tests",
    "split_tests",
    "SandboxUnavailable",
    "TestPlan",
    "hidden_tests_problem",
    "partial_credit",
    "test_plan",
]

MARKER = "__JOINTRL_RESULT__"
STYLES = ("assert", "humaneval")
PYTHON_TAGS = ("", "python", "py", "python3", "py3")
_MAIN = "main.py"
_JUDGE = "judge.py"
_SETUP_NODES = (
    ast.Import,
    ast.ImportFrom,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Assign,
    ast.AugAssign,
    ast.AnnAssign,
    ast.Pass,
)


# ---------------------------------------------------------------------------- extraction


@dataclass(frozen=True)
class CodeBlock:
    """One fenced block of a chat answer: its info-string language (lower case), body, and
    whether its closing fence was there (False: the text ended inside the block)."""

    lang: str
    code: str
    closed: bool

    @property
    def is_python(self) -> bool:
        return self.lang in PYTHON_TAGS


# Linear time on any line: one run of spaces is never split between overlapping quantifiers (the info
# string's surrounding blanks are stripped after the match; a three-quantifier pattern backtracks
# super-linearly on a fence line of a few thousand spaces ending in a backtick).
_FENCE_RE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`\n]*)$")


def find_code_blocks(text: str) -> list[CodeBlock]:
    """Every fenced block (```` ``` ```` or ``~~~``, 3+ characters) of ``text``, in order.

    A fence opens on a line of its own, optionally followed by an info string whose first
    word is the language (````` ```python `````). It closes on a line holding only a fence of
    the same character at least as long. An indented fence (a block inside a list item)
    has that indentation removed from its lines. A block still open at the end of the text (the
    model hit its token limit) is returned with ``closed=False``; a trailing line of 1-2
    backticks (a closing fence cut short) is dropped from it.
    """
    blocks: list[CodeBlock] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = _FENCE_RE.match(lines[i].rstrip("\r"))
        if m is None:
            i += 1
            continue
        fence, info, indent = m.group("fence"), m.group("info").strip(" \t"), len(m.group("indent"))
        lang = info.split()[0].lower() if info.split() else ""
        body: list[str] = []
        j = i + 1
        closed = False
        while j < len(lines):
            line = lines[j].rstrip("\r")
            stripped = line.strip()
            if stripped and set(stripped) == {fence[0]} and len(stripped) >= len(fence):
                closed = True
                break
            lead = len(line) - len(line.lstrip(" \t"))
            body.append(line[min(lead, indent) :])
            j += 1
        if not closed:
            while body and body[-1].strip() in ("`", "``", ""):
                body.pop()
        blocks.append(CodeBlock(lang=lang, code="\n".join(body) + ("\n" if body else ""), closed=closed))
        i = j + 1
    return blocks


# What ``ast.parse`` raises on policy text that is not a program it can hold: SyntaxError, ValueError (NUL
# bytes), and nesting or size past the parser's limits (RecursionError, MemoryError, OverflowError).
PARSE_ERRORS = (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError)


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except PARSE_ERRORS:
        return False
    return True


def _defines(code: str, name: str) -> bool:
    """Whether ``code`` defines ``name`` at top level (by ast, or by regex when it does not parse)."""
    try:
        tree = ast.parse(code)
    except PARSE_ERRORS:
        # [ \t], not \s: a run of blank lines is scanned once, not once per line (quadratic time).
        return re.search(rf"^[ \t]*(async[ \t]+)?def[ \t]+{re.escape(name)}[ \t]*\(", code, re.MULTILINE) is not None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
    return False


def _join(prompt_code: str, code: str) -> str:
    return prompt_code + ("" if prompt_code.endswith("\n") else "\n") + code


def extract_code(text: str, prompt_code: str = "", entry_point: str | None = None) -> str | None:
    """The candidate program in a chat answer ``text``, or None when it holds none.

    1. Fenced blocks tagged ``python``/``py``/``python3`` or untagged (blocks tagged with
       another language, e.g. ``bash``, are ignored): the LAST block that defines
       ``entry_point`` at top level, or the last block when none does (or no entry point
       is given). A final block left open by a token limit counts. When ``prompt_code`` is
       given and ``prompt_code + block`` parses, that is returned: it completes a
       body-only block and keeps the prompt's imports and helpers (HumanEval prompts
       define ``from typing import List`` and sometimes helper functions); the block's
       own definition of the entry point, coming later, wins.
    2. No fence at all, ``prompt_code`` given, and ``text`` looks like a raw continuation
       (its first non-blank line is indented, or ``prompt_code + text`` parses):
       ``prompt_code + text``.
    3. Otherwise None (prose only, only non-Python blocks, an empty block, unfenced
       text without ``prompt_code``, or text that is not Unicode: a lone surrogate, which no
       tokenizer decodes to but a completions file can hold, cannot be written as a program).
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return None
    blocks = [b for b in find_code_blocks(text) if b.is_python and b.code.strip()]
    if blocks:
        chosen = blocks[-1]
        if entry_point:
            defining = [b for b in blocks if _defines(b.code, entry_point)]
            if defining:
                chosen = defining[-1]
        if prompt_code:
            joined = _join(prompt_code, chosen.code)
            if _parses(joined):
                return joined
        return chosen.code
    if not find_code_blocks(text) and prompt_code and text.strip():
        first = next(line for line in text.split("\n") if line.strip())
        if first[:1] in (" ", "\t") or _parses(prompt_code + text):
            return prompt_code + text
    return None


# ---------------------------------------------------------------------------- running tests


@dataclass(frozen=True)
class TestOutcome:
    """The result of :func:`run_tests`.

    ``passed`` of ``total`` SCORED tests passed (the hidden tests, or every test of a spec
    without hidden tests). ``error`` is ``""`` when all passed, else a one-line reason
    (load error, timeout, early exit, or "k of n tests failed"). ``output`` is a readable
    report for feedback: the failing public tests with their got / expected values, the
    failing hidden tests as counts per exception type (never which one), errors, then what
    the program printed (truncated). ``baseline`` is how many scored tests a trivial answer
    passes (:mod:`envs.code_baseline`); ``public_passed`` of ``public_total`` public tests
    passed (never scored).
    """

    __test__ = False  # not a pytest class

    passed: int
    total: int
    error: str
    timed_out: bool
    output: str
    events: tuple[str, ...] = ()  # sandbox events of the candidate's run (envs.sandbox.events), harness_error
    baseline: int = 0
    public_passed: int = 0
    public_total: int = 0

    @property
    def fraction(self) -> float:
        """The raw pass fraction of the scored tests (not the reward: see :attr:`score`)."""
        return self.passed / self.total if self.total else 0.0

    @property
    def score(self) -> float:
        """The reward: :func:`partial_credit` of the scored tests over the trivial-answer baseline."""
        return partial_credit(self.passed, self.total, self.baseline)

    @property
    def all_passed(self) -> bool:
        return self.total > 0 and self.passed == self.total


@dataclass(frozen=True)
class TestPlan:
    """How :func:`run_tests` runs a spec's tests (see :func:`test_plan`).

    ``source`` is the public tests, then the hidden tests, as one module; ``test_idx`` the
    indices of its top-level statements that are tests, in order; statements from
    ``hidden_from`` on are the hidden tests' (their feedback carries no value); the first
    ``public`` tests are public; ``scored`` lists the statement indices of the scored tests:
    the hidden ones, or every test when the spec has no hidden test.
    """

    __test__ = False  # not a pytest class

    source: str
    test_idx: tuple[int, ...]
    hidden_from: int
    public: int
    scored: tuple[int, ...]

    @property
    def has_hidden(self) -> bool:
        return any(i >= self.hidden_from for i in self.test_idx)


def _is_test(node: ast.stmt) -> bool:
    return not isinstance(node, _SETUP_NODES) and not (
        isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    )


def _parse_part(source: str, what: str) -> ast.Module:
    try:
        return ast.parse(source)
    except SyntaxError as exc:
        raise ValueError(f"{what} do not parse: {exc.msg} (line {exc.lineno})") from None


def test_plan(spec: CodeSpec) -> TestPlan:
    """The :class:`TestPlan` of ``spec``: its public tests (``public_tests``), then its hidden ones.

    With ``style == "assert"`` every top-level statement of either part is a test except
    imports, ``def``/``class``, assignments, ``pass`` and bare constants (setup). With
    ``style == "humaneval"`` the hidden part (which defines ``check``) has one test,
    ``check(<entry_point>)``; public tests are plain asserts in both styles. Raises
    ``ValueError`` for an unknown style, an entry point that is not an identifier, a part
    that does not parse, or no test statement at all.
    """
    if spec.style not in STYLES:
        raise ValueError(f"CodeSpec.style must be one of {STYLES}, got {spec.style!r}")
    if not spec.entry_point.isidentifier():
        raise ValueError(f"CodeSpec.entry_point must be a Python identifier, got {spec.entry_point!r}")
    hidden = spec.tests
    if spec.style == "humaneval" and spec.tests.strip():
        hidden = spec.tests.rstrip() + f"\n\n\ncheck({spec.entry_point})\n"
    public = spec.public_tests
    if public and not public.endswith("\n"):
        public += "\n"
    pub_tree = _parse_part(public, "the public tests")
    hid_tree = _parse_part(hidden, "the tests")
    n_pub = len(pub_tree.body)
    idx = [i for i, node in enumerate(pub_tree.body) if _is_test(node)]
    n_public_tests = len(idx)
    if spec.style == "humaneval" and hid_tree.body:
        idx.append(n_pub + len(hid_tree.body) - 1)
    else:
        idx += [n_pub + i for i, node in enumerate(hid_tree.body) if _is_test(node)]
    if not idx:
        raise ValueError("the tests have no test statement (asserts or calls at top level)")
    scored = [i for i in idx if i >= n_pub] or idx
    return TestPlan(public + hidden, tuple(idx), n_pub, n_public_tests, tuple(scored))


test_plan.__test__ = False  # type: ignore[attr-defined]  # not a pytest test where it is imported


def split_tests(spec: CodeSpec) -> tuple[str, list[int]]:
    """``(tests source, indices of its top-level statements that are tests)`` for ``spec``:
    the public tests', then the hidden tests' (:func:`test_plan`).

    Raises ``ValueError`` for an unknown style, an entry point that is not an identifier,
    tests that do not parse, or tests with no test statement.
    """
    plan = test_plan(spec)
    return plan.source, list(plan.test_idx)


def hidden_tests_problem(spec: CodeSpec) -> str | None:
    """Why ``spec`` cannot be trained on (``None`` when it can): its tests are malformed
    (:func:`test_plan`), or it has no hidden test (``tests`` empty, only ``public_tests``),
    so it would be scored on tests its prompt and feedback show."""
    try:
        plan = test_plan(spec)
    except ValueError as exc:
        return str(exc)
    if not plan.has_hidden:
        return (
            "no hidden tests: the task would be scored on its public tests, which its prompt and feedback "
            "show (move the scored tests to code.tests; code.public_tests holds only the prompt's example)"
        )
    return None


def partial_credit(passed: int, total: int, baseline: int) -> float:
    """The reward of passing ``passed`` of ``total`` scored tests when a trivial answer (a
    constant, an echo of the input) passes ``baseline`` of them (:mod:`envs.code_baseline`).

    1.0 when every test passes; otherwise only the passes above the baseline count:
    ``max(0, (passed - baseline) / (total - baseline))``, so every trivial answer scores 0
    and a boolean task's tests pay for work above chance. A task that a trivial answer
    passes entirely (``baseline >= total``) cannot tell work from no work: 0.0 for every
    answer (the reference included; the generators redraw such instances and the shipped-task
    tests flag them).
    """
    if total <= 0 or baseline >= total:
        return 0.0
    if passed >= total:
        return 1.0
    return max(0.0, (passed - baseline) / (total - baseline))


def _clear_dir(path: str) -> None:
    """Remove everything inside ``path`` (files the sandboxed code left), keeping ``path``; at any
    depth, never through a symlink (:func:`~envs.sandbox.files.remove_tree`)."""
    remove_tree(path, keep_root=True)


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters ...]"


def code_sandboxes(mode: str = "bwrap", config: SandboxConfig | dict | None = None) -> tuple[Sandbox, Sandbox]:
    """``(candidate sandbox, judge sandbox)`` as :class:`CodeEnv` and the code reward use them."""
    cfg = SandboxConfig.coerce(config)
    limits = Limits(output_bytes=min(cfg.output_bytes, 200_000))
    cand = Sandbox(limits=limits, mode=mode, config=cfg)
    try:
        return cand, Sandbox(limits=limits, mode=mode, config=cfg)
    except BaseException:
        cand.close()
        raise


def run_tests(
    spec: CodeSpec, code: str, sandbox: Sandbox, timeout_s: float | None = None, *, judge: Sandbox | None = None
) -> TestOutcome:
    """Run ``code`` against ``spec.tests`` and count the passing tests.

    The candidate runs in ``sandbox``; the tests run in ``judge``, a second sandbox (made
    for this call and removed after it when None) that the candidate cannot reach; see
    :mod:`envs.code_verdict`. ``style == "humaneval"``: one test, ``check(<entry_point>)``.
    ``style == "assert"``: one test per top-level test statement (see :func:`split_tests`),
    so the pass fraction is known. Both programs get ``timeout_s`` (default
    ``spec.timeout_s``) of wall clock and as many CPU seconds; tests reported before a
    timeout or crash still count. Both work dirs are emptied first. A candidate that fills
    its storage fails every test (recorded as a ``storage`` event). Raises ``ValueError``
    for a malformed spec (:func:`split_tests`).
    """
    plan = test_plan(spec)
    timeout = float(spec.timeout_s if timeout_s is None else timeout_s)
    if not (timeout > 0 and math.isfinite(timeout)):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    own_judge = judge is None
    if judge is None:
        judge = Sandbox(limits=sandbox.limits, mode=sandbox.mode, config=sandbox.config)
    try:
        # The pair starts over (work dirs rewritten) when either side lost a mount race.
        res_j, res_c = retry_setup_race(
            lambda: _run_pair(spec, code, plan, sandbox, judge, timeout),
            lambda pair: setup_race(pair[0]) or setup_race(pair[1]),
        )
    finally:
        if own_judge:
            judge.close()
    return _outcome(res_j, res_c, plan, timeout, sandbox)


def _run_pair(
    spec: CodeSpec, code: str, plan: TestPlan, sandbox: Sandbox, judge: Sandbox, timeout: float
) -> tuple[RunResult, RunResult]:
    """Start the judge and the candidate wired to each other; both results once the judge ends."""
    limits = dataclasses.replace(sandbox.limits, wall_seconds=timeout, cpu_seconds=max(1, math.ceil(timeout)))
    for box in (sandbox, judge):
        _clear_dir(box.work_dir)
    sandbox.write_files({_MAIN: CANDIDATE_PROGRAM + f"\n_jointrl_serve({spec.entry_point!r})\n", "solution.py": code})
    req_r, req_w = os.pipe()  # judge -> candidate: requests
    rep_r, rep_w = os.pipe()  # candidate -> judge: replies
    fds = [req_r, req_w, rep_r, rep_w]
    try:
        judge.write_files(
            {
                _JUDGE: JUDGE_PROGRAM
                + "\n_jointrl_judge("
                + ", ".join(repr(v) for v in _judge_args(spec, plan, req_w, timeout))
                + ")\n"
            }
        )
        j = judge.prepare([judge.python, "-I", "-B", _JUDGE], stdin=rep_r, limits=limits)
        fds.remove(rep_r)
        j.pass_fds = (*j.pass_fds, req_w)
        fds.remove(req_w)
        c = sandbox.prepare([sandbox.python, "-I", "-B", _MAIN], stdin=req_r, stdout=rep_w, limits=limits)
        fds.remove(req_r)
        fds.remove(rep_w)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    res_j, res_c = run_launches([j, c], timeout)  # owns every fd of both launches
    return judge.finish(res_j), sandbox.finish(res_c)


def _judge_args(spec: CodeSpec, plan: TestPlan, req_fd: int, timeout: float) -> tuple:
    """The arguments of the judge program's ``_jointrl_judge`` call (plain literals)."""
    budget = min(1.0, 0.2 * timeout)  # the trivial-answer baseline's share of the judge's time
    return (
        plan.source,
        list(plan.test_idx),
        spec.entry_point,
        spec.prompt_code,
        MARKER,
        req_fd,
        plan.hidden_from,
        list(plan.scored),
        budget,
    )


def _parse_reports(stdout: str, total: int):
    prefix = f"{MARKER} "
    results: dict[int, tuple[bool, str]] = {}
    load_errors: list[str] = []
    setup_errors: list[str] = []
    done = False
    baseline: int | None = None
    for line in stdout.splitlines():
        if not line.startswith(prefix):
            continue
        try:
            event = json.loads(line[len(prefix) :])
        except (ValueError, RecursionError):  # not a report line the judge wrote
            continue
        if not isinstance(event, dict):
            continue
        if "i" in event and isinstance(event["i"], int) and 0 <= event["i"] < total:
            results[event["i"]] = (event.get("ok") is True, str(event.get("msg", "")))
        elif "load_error" in event:
            load_errors.append(str(event["load_error"]))
        elif "setup_error" in event:
            setup_errors.append(str(event["setup_error"]))
        elif event.get("done") is True:
            done = True
        elif "baseline" in event and type(event["baseline"]) is int:
            baseline = event["baseline"]
    return results, load_errors, setup_errors, done, baseline


def _outcome(res_j: RunResult, res_c: RunResult, plan: TestPlan, timeout: float, sandbox: Sandbox) -> TestOutcome:
    """The :class:`TestOutcome` of one verdict, from the judge's reports and both runs."""
    n_tests = len(plan.test_idx)
    results, load_errors, setup_errors, done, baseline = _parse_reports(res_j.stdout, n_tests)
    events = list(res_c.events)
    storage = "storage" in events
    first_scored = plan.public if plan.has_hidden else 0
    scored = {k: r for k, r in results.items() if k >= first_scored}
    total = n_tests - first_scored
    passed = 0 if storage else sum(ok for ok, _ in scored.values())
    public_passed = 0 if storage else sum(ok for k, (ok, _) in results.items() if k < plan.public)
    failures = ["Failed public test:\n" + msg for k, (ok, msg) in sorted(results.items()) if k < plan.public and not ok]
    failures += _hidden_failures([msg for k, (ok, msg) in results.items() if k >= plan.public and not ok])
    harness_failed = not done and not res_j.timed_out
    if harness_failed:
        events.append("harness_error")
    stop, error = _stop_and_error(res_j, len(scored), total, passed, done, timeout, load_errors)
    if storage:
        cfg = sandbox.config
        error = f"the code filled its storage (cap {cfg.storage_mb} MiB, {cfg.storage_inodes} inodes)"
        stop = (stop + "\n" if stop else "") + f"Storage limit hit: {error}; no test counts."
    parts = _feedback(load_errors, setup_errors, failures, stop)
    printed = res_c.stderr.strip()
    if printed:
        parts.append("Output of the program:\n" + _cut(printed, 2000))
    if harness_failed and res_j.stderr.strip():
        parts.append("Test harness error output:\n" + _cut(res_j.stderr.strip(), 1000))
    return TestOutcome(
        passed=passed,
        total=total,
        error=error,
        timed_out=res_j.timed_out,
        output="\n\n".join(parts),
        events=tuple(events),
        # Not reported (the baseline ran out of time, or the judge died first): no partial credit.
        baseline=max(total - 1, 0) if baseline is None else baseline,
        public_passed=public_passed,
        public_total=plan.public,
    )


def _hidden_failures(msgs: list[str]) -> list[str]:
    """The feedback on failed hidden tests: per exception type, how many tests failed with it, and
    one of the candidate's own tracebacks for it (the least in text order, so nothing depends on
    which test failed).

    Never which test failed: on a boolean task, a turn-1 constant ``True`` and the list of the
    hidden tests it failed would give every expected value, and a turn-2 lookup keyed by call
    order (or by the inputs the candidate printed) would score 1.0. Left is the count (about
    log2(n + 1) bits per turn) and the types.
    """
    groups: dict[str, list[str]] = {}
    for msg in msgs:
        groups.setdefault(re.split(r"[:\s(]", msg.strip(), maxsplit=1)[0] or "Error", []).append(msg)
    out = []
    for kind in sorted(groups):
        shown = min(groups[kind])
        n = len(groups[kind])
        head = f"{n} hidden test{'s' if n > 1 else ''} failed with {kind}"
        out.append(head + (":\n" + shown if shown.strip() != kind else "."))
    return out


def _stop_and_error(
    res_j: RunResult, ran: int, total: int, passed: int, done: bool, timeout: float, load_errors: list[str]
) -> tuple[str, str]:
    """(why the tests stopped early, or ""; the one-line error, or "" when every test passed)."""
    how = f"killed by signal {res_j.signal}" if res_j.signal is not None else f"exit code {res_j.exit_code}"
    if res_j.timed_out:
        stop = f"Timed out after {timeout:g}s (an infinite loop, or too slow?); {ran} of {total} tests ran."
    elif not done:
        stop = f"The test harness stopped ({how}) before all tests ran; {ran} of {total} tests ran."
    else:
        stop = ""
    if passed == total and done:
        error = ""
    elif res_j.timed_out:
        error = f"timed out after {timeout:g}s"
    elif not done:
        error = f"the test harness stopped ({how}) before all tests ran"
    elif load_errors:
        error = load_errors[0].strip().splitlines()[-1]
    else:
        error = f"{total - passed} of {total} tests failed"
    return stop, error


def _feedback(load_errors: list[str], setup_errors: list[str], failures: list[str], stop: str) -> list[str]:
    """The feedback paragraphs: load errors, a few setup errors and failed tests, the stop note."""
    parts = ["Error while loading the code:\n" + e for e in load_errors]
    # After a load error most failures are its echo: show fewer.
    parts += ["Error in a test setup statement:\n" + e for e in setup_errors[: 0 if load_errors else 3]]
    shown = failures[: 1 if load_errors else 5]
    parts += shown
    if len(failures) > len(shown):
        parts.append(f"... and {len(failures) - len(shown)} more failed tests.")
    if stop:
        parts.append(stop)
    return parts


# ---------------------------------------------------------------------------- env


class CodeEnv:
    """The code env: run the tests on every answer; optionally let the policy fix its code.

    ``step(action)`` extracts the code (:func:`extract_code`, with the task's
    ``prompt_code`` and ``entry_point``), runs the tests in the env's sandbox
    (:func:`run_tests`) and returns ``info = {"reward": TestOutcome.score, "passed", "total",
    "error", "extracted", "timed_out", "turn"}`` on every turn, so the episode's
    ``env_reward`` is always the score of its LAST answer. Episode ends:

    * all tests pass -> ``terminated=True`` (natural end);
    * ``max_turns == 1`` (single-turn, the default) -> ``terminated=True`` whatever the
      score: a single-turn env has no retry to offer, so its one turn is the natural end
      (as for :class:`envs.toolcall.ToolCallEnv`), and ``truncated`` keeps meaning "cut
      by a limit";
    * failing, and fewer than ``max_turns`` turns taken -> the observation is one user
      message with the failing public tests (got / expected), the failing hidden tests
      (counts per exception type only: not which one, no source, no value), errors and output
      (truncated to ``feedback_chars``) asking for the complete fixed code; the episode
      goes on. The reward is computed on the hidden tests alone, so nothing the feedback
      shows is a value that is scored: a lookup table built from it earns nothing;
    * failing on turn ``max_turns`` (> 1) -> ``truncated=True``: the env would have given
      feedback for another try, the turn limit cut the episode.

    ``sandbox`` is the :class:`~envs.sandbox.Sandbox` mode: ``"bwrap"`` (default) or
    ``"none"``, which runs model code on the host unisolated and must be chosen
    explicitly (the Sandbox logs a warning). When bubblewrap cannot run here, the first
    ``step`` raises :class:`~envs.sandbox.SandboxUnavailable` with the reason; the env
    never falls back to running unsandboxed. The sandbox is created on first use, reused
    for every episode of this env instance, and removed by :meth:`close`.
    """

    def __init__(
        self,
        max_turns: int = 1,
        sandbox: str = "bwrap",
        feedback_chars: int = 2000,
        sandbox_config: SandboxConfig | dict | None = None,
    ):
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns must be an int >= 1, got {max_turns!r}")
        if sandbox not in ("bwrap", "none"):
            raise ValueError(f"sandbox must be 'bwrap' or 'none' (trusted code only), got {sandbox!r}")
        if isinstance(feedback_chars, bool) or not isinstance(feedback_chars, int) or feedback_chars < 1:
            raise ValueError(f"feedback_chars must be an int >= 1, got {feedback_chars!r}")
        self.max_turns = max_turns
        self.sandbox_mode = sandbox
        self.feedback_chars = feedback_chars
        self.sandbox_config = SandboxConfig.coerce(sandbox_config)
        self._sandbox: Sandbox | None = None
        self._judge: Sandbox | None = None
        self._task: Task | None = None
        self._turns = 0
        self._done = True
        self._closed = False

    def _get_sandboxes(self) -> tuple[Sandbox, Sandbox]:
        if self._sandbox is None:
            self._sandbox, self._judge = code_sandboxes(self.sandbox_mode, self.sandbox_config)
        assert self._judge is not None
        return self._sandbox, self._judge

    def reset(self, task: Task) -> list[Message]:
        if self._closed:
            raise RuntimeError("CodeEnv.reset() after close()")
        if task.code is None:
            raise ValueError(
                f"CodeEnv needs a task with a code spec (Task.code); task {task.id!r} (domain {task.domain!r}) has none"
            )
        if not task.messages:
            raise ValueError(f"task {task.id!r} has no messages")
        split_tests(task.code)  # a malformed spec fails here, not mid-episode
        self._task = task
        self._turns = 0
        self._done = False
        return list(task.messages)

    def step(self, action: str) -> tuple[list[Message], bool, bool, dict[str, Any]]:
        if self._closed:
            raise RuntimeError("CodeEnv.step() after close()")
        if self._task is None:
            raise RuntimeError("CodeEnv.step() before reset()")
        if self._done:
            raise RuntimeError("CodeEnv.step() after the episode ended; call reset() first")
        if not isinstance(action, str):
            raise TypeError(f"action must be a str, got {type(action).__name__}")
        spec = self._task.code
        assert spec is not None
        self._turns += 1
        code = extract_code(action, spec.prompt_code, spec.entry_point)
        if code is None:
            plan = test_plan(spec)
            outcome = TestOutcome(
                passed=0,
                total=len(plan.scored),
                public_total=plan.public,
                error="no code found in the answer",
                timed_out=False,
                output="",
            )
        else:
            cand, judge = self._get_sandboxes()
            outcome = run_tests(spec, code, cand, judge=judge)
        info: dict[str, Any] = {
            "reward": float(outcome.score),
            "passed": outcome.passed,
            "total": outcome.total,
            "error": outcome.error,
            "extracted": code is not None,
            "timed_out": outcome.timed_out,
            "turn": self._turns,
            "sandbox_events": list(outcome.events),
        }
        if outcome.all_passed or self.max_turns == 1:
            self._done = True
            return [], True, False, info
        if self._turns >= self.max_turns:
            self._done = True
            return [], False, True, info
        return [Message("user", self._feedback(outcome, code is not None))], False, False, info

    def _feedback(self, outcome: TestOutcome, extracted: bool) -> str:
        if not extracted:
            return (
                "I could not find any Python code in your answer. Reply with the complete solution in one "
                "```python code block."
            )
        details = _cut(outcome.output.strip() or outcome.error, self.feedback_chars)
        public = f"{outcome.public_passed} of {outcome.public_total} public tests and " if outcome.public_total else ""
        kind = "hidden " if outcome.public_total else ""
        return (
            f"Your code passed {public}{outcome.passed} of {outcome.total} {kind}tests.\n\n{details}\n\n"
            "Fix the code and reply with the complete corrected solution in one ```python code block."
        )

    def close(self) -> None:
        self._closed = True
        self._task = None
        self._done = True
        for sb in (self._sandbox, self._judge):
            if sb is not None:
                sb.close()
        self._sandbox = self._judge = None


# ---------------------------------------------------------------------------- HumanEval files

HUMANEVAL_SYSTEM = "You are an expert Python programmer. You write correct, efficient and readable code."
HUMANEVAL_USER = (
    "Complete the following Python function:\n\n```python\n{prompt}```\n\n"
    "Answer with the complete function (signature included, with any imports it needs) in one ```python code "
    "block."
)
_HUMANEVAL_FIELDS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")


def load_humaneval(path: str | os.PathLike[str]) -> list[Task]:
    """Tasks from a HumanEval-format ``.jsonl`` or ``.jsonl.gz`` file.

    Each line is ``{"task_id", "prompt", "canonical_solution", "test", "entry_point"}``
    (extra fields are ignored). A task gets domain ``"code"``, style ``"humaneval"``,
    ``prompt_code = prompt``, ``solution = prompt + canonical_solution``, and messages: a
    system prompt and a user message holding the prompt code, asking for the complete
    function in one ```` ```python ```` block. Raises ``FileNotFoundError`` or
    :class:`~envs.io.TaskFormatError` naming ``file:line`` and the field.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"HumanEval file not found: {p}")
    tasks: list[Task] = []
    seen: dict[str, str] = {}
    for where, d in read_json_objects(p, "a HumanEval record"):
        for key in _HUMANEVAL_FIELDS:
            if key not in d or d[key] is None:
                raise TaskFormatError(f"{where}: field {key!r}: missing")
            if not isinstance(d[key], str):
                raise TaskFormatError(f"{where}: field {key!r}: must be a string, got {type(d[key]).__name__}")
        task_id = d["task_id"]
        if not task_id.strip():
            raise TaskFormatError(f"{where}: field 'task_id': must be a non-empty string")
        if task_id in seen:
            raise TaskFormatError(f"{where}: field 'task_id': duplicate id {task_id!r} (first at {seen[task_id]})")
        seen[task_id] = where
        spec = CodeSpec(
            tests=d["test"],
            entry_point=d["entry_point"],
            prompt_code=d["prompt"],
            style="humaneval",
            solution=d["prompt"] + d["canonical_solution"],
        )
        try:
            split_tests(spec)
        except ValueError as exc:
            field = "entry_point" if "entry_point" in str(exc) else "test"
            raise TaskFormatError(f"{where}: field {field!r}: {exc}") from None
        prompt = d["prompt"] if d["prompt"].endswith("\n") else d["prompt"] + "\n"
        tasks.append(
            Task(
                id=task_id,
                domain="code",
                messages=(Message("system", HUMANEVAL_SYSTEM), Message("user", HUMANEVAL_USER.format(prompt=prompt))),
                code=spec,
                meta={"source": "humaneval"},
            )
        )
    return tasks


def humaneval_to_native(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> int:
    """Convert a HumanEval-format file to jointrl's native ``.jsonl``/``.jsonl.gz`` (for
    :func:`envs.io.load_tasks` and recipes); returns the number of tasks written."""
    tasks = load_humaneval(src)
    save_tasks(tasks, dst)
    return len(tasks)
