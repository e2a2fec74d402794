"""Code verdicts computed where the candidate cannot reach: a candidate process and a judge process.

:func:`envs.code.run_tests` runs every verdict as two programs in two sandboxes that share
nothing (two work dirs on two capped tmpfs, two PID, mount, IPC and network namespaces):

* the **candidate** (:data:`CANDIDATE_PROGRAM`, in the candidate's sandbox, whose work dir
  holds only that program and ``solution.py``) loads the model's code as module
  ``solution`` and then serves calls: it reads one request line (arguments), calls the
  entry point, and writes one reply line (the result, the exception it raised, or
  "unsendable"). It never sees the tests, their expected values or the judge's memory.
* the **judge** (:data:`JUDGE_PROGRAM`, in its own sandbox) holds the tests and the
  task's ``prompt_code`` (HumanEval helpers such as ``poly``), binds the entry point's
  name to a proxy that sends each call to the candidate, runs the tests statement by
  statement (``assert f(x) == y`` lines, or HumanEval's ``check(candidate)``) and
  reports each test to the host as soon as it finishes: a public test with its values, a
  hidden test with its exception type only. Before the tests it reports the trivial-answer
  baseline (:mod:`envs.code_baseline`, run on its own copies of the tests).

What crosses is plain data (:mod:`envs.code_wire`): the judge compares values that
``json.loads`` built in the judge's own interpreter, so a candidate cannot hand it an
object whose ``__eq__`` always succeeds, patch its builtins or ``ast``, read its files
or caches, or print a fake result (the candidate's stdout and stderr go to the host's
capture, never to the judge's report channel). Exceptions cross as a type name and a
message: a builtin exception type is re-raised as itself in the judge (tests that expect
``ValueError`` keep working), anything else, ``SystemExit`` and ``KeyboardInterrupt``
included, as :class:`CandidateError`. A candidate that exits, crashes or hangs fails the
calls it did not answer; a value that cannot cross fails its test with a message naming
its type. Mutated list, dict and set arguments are written back into the judge's
objects, so in-place tests behave as in one interpreter.

The wiring: host pipe ``judge fd N -> candidate stdin`` carries requests, ``candidate
stdout -> judge stdin`` carries replies, the judge's stdout (a private copy of it; fd 1
points at stderr once the judge starts) carries reports to the host. Both processes are
killed when the judge exits or the wall clock runs out.

What it does NOT do: it does not make the TESTS safe to run (they are task data, trusted;
they run sandboxed all the same), and it does not hide the arguments of a call from the
candidate (it receives them, as any function does).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["BASELINE_SOURCE", "CANDIDATE_PROGRAM", "JUDGE_PROGRAM", "WIRE_SOURCE"]

# The codec both programs use, copied from envs/code_wire.py (self-contained by design).
WIRE_SOURCE = (Path(__file__).with_name("code_wire.py")).read_text(encoding="utf-8")
# The trivial-answer baseline the judge computes, copied from envs/code_baseline.py.
BASELINE_SOURCE = (Path(__file__).with_name("code_baseline.py")).read_text(encoding="utf-8")

# Both programs are kept free of format braces: each is this text plus one call with literal
# arguments (repr), so nothing the task or the model wrote is ever spliced into code.
CANDIDATE_PROGRAM = (
    WIRE_SOURCE
    + r"""

import sys as _sys, os as _os


def _jointrl_serve(entry_point):
    import types
    req = _os.fdopen(_os.dup(0), "rb")      # requests from the judge
    rep = _os.dup(1)                         # replies to the judge
    nul = _os.open(_os.devnull, _os.O_RDONLY)
    _os.dup2(nul, 0)                         # input() in the candidate reads nothing
    _os.dup2(2, 1)                           # print() goes to stderr (captured by the host)
    try:
        _sys.stdout.reconfigure(line_buffering=True)
    except Exception:
        pass
    write = _os.write

    def send(obj):
        view = memoryview(dumps(obj))
        while view:
            view = view[write(rep, view):]

    with open("solution.py", encoding="utf-8") as f:
        code = f.read()
    module = types.ModuleType("solution")
    _sys.modules["solution"] = module
    ns = module.__dict__
    try:
        exec(compile(code, "solution.py", "exec"), ns)
    except BaseException as e:
        send({"load_error": error_text(e, ("solution.py",))})
        return
    if entry_point not in ns:
        send({"load_error": "NameError: the code does not define %r" % entry_point})
        return
    names = sorted(k for k, v in list(ns.items())[:10000]
                   if type(k) is str and not k.startswith("__") and callable(v) and not isinstance(v, types.ModuleType))
    callable_names = set(names[:500]) | {entry_point}
    send({"ready": True, "names": names[:500]})
    while True:
        line = req.readline(MAX_LINE + 1)
        if not line:
            return
        msg = loads(line)
        n = msg["id"]
        try:
            fn = msg.get("fn", entry_point)
            if fn not in callable_names:
                raise NameError("name %r is not defined" % fn)
            args, kwargs = decode(msg["args"]), decode(msg["kwargs"])
            result = ns[fn](*args, **kwargs)
        except BaseException as e:
            try:
                text = str(e)
            except BaseException:
                text = "<str() failed>"
            send({"id": n, "raise": [type(e).__name__, text[:2000], error_text(e, ("solution.py",))]})
            continue
        try:
            send({"id": n, "ok": encode(result), "args": encode(args)})
        except Unsendable as e:
            send({"id": n, "unsendable": str(e)})
        except BaseException as e:  # a custom __index__ / __iter__ that raises, a recursion error...
            send({"id": n, "unsendable": "a value that could not be converted (%s)" % type(e).__name__})
"""
)

JUDGE_PROGRAM = (
    WIRE_SOURCE
    + BASELINE_SOURCE
    + r'''

import sys as _sys, os as _os


class CandidateError(Exception):
    """The candidate raised a non-builtin exception, exited, or broke the protocol."""


def _jointrl_judge(tests, test_idx, entry_point, prompt_code, marker, req_fd, hidden_from, scored, budget_s):
    import ast, builtins, linecache, traceback, types
    replies = _os.fdopen(_os.dup(0), "rb")
    out_fd = _os.dup(1)          # reports to the host
    _os.dup2(2, 1)               # what the tests print goes to stderr
    prefix = (marker + " ").encode()

    def report(obj):
        view = memoryview(prefix + dumps(obj))
        while view:
            view = view[_os.write(out_fd, view):]

    def short(value, limit=300):
        try:
            s = repr(value)
        except BaseException as e:
            s = "<repr failed: %s>" % type(e).__name__
        return s if len(s) <= limit else s[:limit] + "..."

    def fmt(e):
        return error_text(e, ("tests.py",), getattr(e, "_jointrl_where", ""))

    def read_msg():
        line = replies.readline(MAX_LINE + 1)
        return loads(line) if line else None

    state = {"dead": None, "n": 0}
    try:
        first = read_msg()
    except ValueError as e:
        first = None
        state["dead"] = "the candidate broke the protocol (%s)" % e
    if first is None:
        state["dead"] = state["dead"] or "the candidate's process ended before its code loaded (it exited or crashed)"
        report({"load_error": state["dead"]})
    elif "load_error" in first:
        report({"load_error": str(first["load_error"])[:3000]})
        state["dead"] = "the code did not load"
    elif first.get("ready") is not True:
        state["dead"] = "the candidate broke the protocol"
        report({"load_error": state["dead"]})

    def writeback(args, new):
        if type(new) is not list or len(new) != len(args):
            return
        for old, val in zip(args, new):
            if type(old) is list and type(val) is list:
                old[:] = val
            elif type(old) is dict and type(val) is dict:
                old.clear()
                old.update(val)
            elif type(old) is set and type(val) is set:
                old.clear()
                old.update(val)

    def raised(name, text, where):
        cls = getattr(builtins, name, None) if type(name) is str else None
        exc = None
        if isinstance(cls, type) and issubclass(cls, Exception) and not issubclass(cls, CandidateError):
            try:
                exc = cls(text)
            except BaseException:
                exc = None
        if exc is None:
            exc = CandidateError("%s: %s" % (name, text))
        exc._jointrl_where = "in the candidate:\n" + str(where)[:1500] if where else ""
        return exc

    def call(fn, args, kwargs):
        if state["dead"]:
            raise CandidateError(state["dead"])
        state["n"] += 1
        n = state["n"]
        try:
            line = dumps({"id": n, "fn": fn, "args": encode(list(args)), "kwargs": encode(dict(kwargs))})
        except Unsendable as e:
            exc = TypeError("the test passes %s to the candidate, which cannot cross the sandbox boundary" % e)
            exc._jointrl_harness = True
            raise exc
        try:
            view = memoryview(line)
            while view:
                view = view[_os.write(req_fd, view):]
            msg = read_msg()
        except (OSError, ValueError) as e:
            state["dead"] = "the candidate broke the protocol (%s)" % type(e).__name__
            raise CandidateError(state["dead"])
        if msg is None:
            state["dead"] = "the candidate's process ended during a call (it exited or crashed)"
            raise CandidateError(state["dead"])
        if msg.get("id") != n:
            state["dead"] = "the candidate broke the protocol (reply out of order)"
            raise CandidateError(state["dead"])
        try:
            if "ok" in msg:
                value = decode(msg["ok"])
                writeback(list(args), decode(msg.get("args")))
                return value
        except (ValueError, TypeError) as e:
            state["dead"] = "the candidate broke the protocol (%s)" % e
            raise CandidateError(state["dead"])
        if "raise" in msg and type(msg["raise"]) is list and len(msg["raise"]) == 3:
            raise raised(*msg["raise"])
        if "unsendable" in msg:
            exc = TypeError("the candidate returned %s, which cannot cross the sandbox boundary (only None, bool, "
                            "int, float, complex, str, bytes, list, tuple, dict, set and frozenset can)"
                            % str(msg["unsendable"])[:200])
            exc._jointrl_harness = True  # a note on the candidate's value's type: safe to show for hidden tests
            raise exc
        state["dead"] = "the candidate broke the protocol (unknown reply)"
        raise CandidateError(state["dead"])

    def proxy(fn):
        def candidate(*args, **kwargs):
            return call(fn, args, kwargs)
        candidate.__name__ = candidate.__qualname__ = fn
        return candidate

    tree = ast.parse(tests)
    linecache.cache["tests.py"] = (len(tests), None, tests.splitlines(True), "tests.py")
    module = types.ModuleType("tests")
    _sys.modules["tests"] = module
    ns = module.__dict__
    if prompt_code:
        try:  # the task's own helpers (HumanEval's poly, encode_cyclic...): trusted task data
            exec(compile(prompt_code, "prompt.py", "exec"), ns)
        except BaseException as e:
            report({"setup_error": "the task's prompt code failed:\n" + fmt(e)})
    ns[entry_point] = proxy(entry_point)
    bound = [entry_point]
    # Other functions of the candidate that the tests call (helpers it was asked to write);
    # never a name the task's prompt code defines: the judge keeps the task's own version.
    # Never a builtin (a candidate's own `abs` or `len` must not answer the tests' calls) and
    # never a name the tests define, import, assign or take as a parameter themselves.
    offered = first.get("names") if isinstance(first, dict) else None
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    own = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            own.update((a.asname or a.name).split(".")[0] for a in n.names)
        elif isinstance(n, ast.arg):
            own.add(n.arg)
    for name in (offered if type(offered) is list else []):
        if (type(name) is str and name.isidentifier() and name in used and name not in ns and name not in own
                and not hasattr(builtins, name)):
            ns[name] = proxy(name)
            bound.append(name)

    # What a trivial answer (a constant, an echo of the input) passes: the host pays only above it.
    try:  # None (no partial credit) if the tests break it; the candidate's tests still run
        base = None if state["dead"] else trivial_passes(tests, scored, bound, prompt_code, budget_s)
    except Exception:
        base = None
    report({"baseline": 0 if state["dead"] else base})

    def hidden_msg(e):
        """A failed hidden test's note: the exception's type, and the candidate's own traceback
        when the candidate raised it; never the test's source or a value it compares."""
        where = getattr(e, "_jointrl_where", "")
        if isinstance(e, CandidateError) or where or getattr(e, "_jointrl_harness", False):
            try:
                text = str(e)[:300]
            except BaseException:
                text = ""
            return "%s: %s%s" % (type(e).__name__, text, ("\n" + where) if where else "")
        return type(e).__name__

    def mentions(node):
        return any(isinstance(n, ast.Name) and n.id == entry_point for n in ast.walk(node))

    def run_test(node):
        if (isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1
                and isinstance(node.test.ops[0], ast.Eq)):
            left, right = node.test.left, node.test.comparators[0]
            lv = eval(compile(ast.Expression(left), "tests.py", "eval"), ns)
            rv = eval(compile(ast.Expression(right), "tests.py", "eval"), ns)
            if lv == rv:
                return ""
            if mentions(right) and not mentions(left):
                lv, rv = rv, lv
            if mentions(left) or mentions(right):
                detail = "got:      %s\nexpected: %s" % (short(lv), short(rv))
            else:
                detail = "left:  %s\nright: %s" % (short(lv), short(rv))
            if node.msg is not None:
                try:
                    detail += "\nmessage:  %s" % short(eval(compile(ast.Expression(node.msg), "tests.py", "eval"), ns))
                except BaseException:
                    pass
            return detail
        exec(compile(ast.Module(body=[node], type_ignores=[]), "tests.py", "exec"), ns)
        return None

    wanted = set(test_idx)
    k = passed = 0
    for i, node in enumerate(tree.body):
        src = ast.get_source_segment(tests, node) or ""
        if len(src) > 400:
            src = src[:400] + "..."
        hidden = i >= hidden_from
        if i not in wanted:
            try:
                exec(compile(ast.Module(body=[node], type_ignores=[]), "tests.py", "exec"), ns)
            except BaseException as e:
                report({"setup_error": ("a hidden setup statement: " + type(e).__name__) if hidden
                        else src + "\n" + fmt(e)})
            continue
        try:
            detail = run_test(node)
            ok = not detail
            if hidden and not ok:
                detail = "AssertionError"
        except BaseException as e:
            ok, detail = False, hidden_msg(e) if hidden else fmt(e)
        passed += ok
        report({"i": k, "ok": ok, "msg": "" if ok else (detail if hidden else src + "\n" + detail)})
        k += 1
    report({"done": True, "passed": passed, "total": k})
    _os._exit(0)
'''
)
