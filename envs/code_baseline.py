"""What an answer that does none of a code task's work passes: the baseline the code reward subtracts.

A boolean- or small-range-valued task pays a constant answer for every test whose expected
value it happens to equal (``return False`` passes the "is not a palindrome" tests,
``return []`` the empty-input test), and an echo of the argument passes every test whose
expected value is its input. :func:`trivial_passes` runs the task's scored tests against
each such *trivial answer* and returns the most tests one of them passes; the code reward
(:func:`envs.code.partial_credit`) pays only for passes above that many, so every trivial
answer scores 0 and a real partial solution keeps credit in proportion to the work above
chance.

The trivial answers are: the constants of :data:`CONSTANTS` (one per common type), every
value the scored tests compare a result against (``assert f(x) == V``: ``V``; ``in``: the
container's elements), and the echo of the first or second argument. They run in the
judge (tests are trusted task data, and the candidate never sees them), each in a fresh
namespace (the task's ``prompt_code``, then the tests in order, with the entry point and
the candidate helpers the tests call bound to the trivial answer), within ``budget_s``
seconds of wall clock for all of them.

This file is also the source of the baseline inside the sandboxed judge program: its
text is copied there (it stays self-contained: standard library only, no jointrl import).
"""

import ast as _ast
import copy as _copy
import signal as _signal
import threading as _threading
import time as _time

# One constant of each common type (and the usual small values); targets are added per task.
CONSTANTS = (None, True, False, 0, 1, -1, 2, 0.0, 1.0, "", " ", "0", [], [0], {}, (), set(), b"")
MAX_TARGETS = 300


class _OutOfBudget(BaseException):
    """Raised by the wall-clock timer inside a test run by :func:`trivial_passes`."""


def _mentions(node, names):
    return any(isinstance(n, _ast.Name) and n.id in names for n in _ast.walk(node))


def _add(out, value):
    try:  # a value whose == raises or is not a bool (an array) is still a target
        seen = any(type(v) is type(value) and bool(v == value) for v in out)
    except Exception:
        seen = False
    if len(out) < MAX_TARGETS and not seen:
        out.append(value)


def _targets(nodes, names, ns):
    """The values the tests ``nodes`` compare results against (what a constant would have to equal)."""
    out = []
    for node in nodes:
        for n in _ast.walk(node):
            if not isinstance(n, _ast.Compare):
                continue
            sides = [n.left] + list(n.comparators)
            for k, side in enumerate(sides):
                if _mentions(side, names):
                    continue
                try:
                    value = eval(compile(_ast.Expression(side), "tests.py", "eval"), dict(ns))
                except BaseException:
                    continue
                _add(out, value)
                if (
                    k > 0
                    and isinstance(n.ops[k - 1], (_ast.In, _ast.NotIn))
                    and isinstance(value, (list, tuple, set, frozenset, dict))
                ):
                    for item in list(value)[:MAX_TARGETS]:
                        _add(out, item)
    return out


def _constant(value):
    def answer(*args, **kwargs):
        return _copy.deepcopy(value)

    return answer


def _echo(i):
    def answer(*args, **kwargs):
        return args[i] if len(args) > i else None  # the caller's own object, as a real echo returns

    return answer


def _fresh_ns(prompt_code, names, fn):
    ns = {"__name__": "tests"}
    if prompt_code:
        try:
            exec(compile(prompt_code, "prompt.py", "exec"), ns)
        except BaseException:
            pass
    for name in names:
        ns[name] = fn
    return ns


def _passes(tree, scored, ns):
    n = 0
    for i, node in enumerate(tree.body):
        try:
            exec(compile(_ast.Module(body=[node], type_ignores=[]), "tests.py", "exec"), ns)
        except _OutOfBudget:
            raise
        except BaseException:
            continue
        n += i in scored
    return n


def trivial_passes(source, scored, names, prompt_code="", budget_s=1.0):
    """The most scored tests any trivial answer passes, or None when ``budget_s`` ran out first.

    ``source`` is the tests' source, ``scored`` the indices of its top-level statements that
    are scored tests, ``names`` the entry point and the candidate helpers the tests call
    (each bound to the trivial answer). Stops early once a trivial answer passes them all.
    """
    tree = _ast.parse(source)
    scored = set(scored)
    if not scored:
        return 0
    deadline = _time.monotonic() + budget_s
    timer = _threading.current_thread() is _threading.main_thread() and hasattr(_signal, "setitimer")
    old = None
    if timer:

        def ring(signum, frame):
            raise _OutOfBudget()

        old = _signal.signal(_signal.SIGALRM, ring)
        # Repeats every 50 ms: a test that catches the first ring does not keep the run going.
        _signal.setitimer(_signal.ITIMER_REAL, max(budget_s, 0.001), 0.05)
    try:
        base = _fresh_ns(prompt_code, names, _constant(None))
        _passes(tree, scored, base)  # the setup statements' names, for the targets that use them
        nodes = [node for i, node in enumerate(tree.body) if i in scored]
        answers = [_constant(v) for v in CONSTANTS] + [_echo(0), _echo(1)]
        answers += [_constant(v) for v in _targets(nodes, set(names), base)]
        best = 0
        for fn in answers:
            if _time.monotonic() > deadline:
                return None
            best = max(best, _passes(tree, scored, _fresh_ns(prompt_code, names, fn)))
            if best == len(scored):
                break
        return best
    except _OutOfBudget:
        return None
    finally:
        if timer:
            _signal.setitimer(_signal.ITIMER_REAL, 0)
            _signal.signal(_signal.SIGALRM, old)
