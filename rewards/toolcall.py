"""Rewards for the ``tool_call`` domain.

* :class:`ToolCallReward` (``"toolcall"``): ``"calls"``-mode tasks; format, function names
  and arguments of the calls against the task's expected calls (BFCL-style allowed values;
  several expected calls, as in parallel tasks, are matched order-insensitively).
* :class:`ToolAnswerReward` (``"tool_answer"``): ``"answer"``-mode (multi-turn) tasks; the
  final plain-text answer against the task's acceptable answers (:func:`answer_matches`).
* :class:`ToolCallFormatReward` (``"toolcall_format"``): both modes; the fraction of
  well-formed assistant turns.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import unicodedata
from collections.abc import Iterable
from decimal import Decimal, InvalidOperation
from typing import Any

from envs.toolcall import OPEN_TAG, parse_tool_calls
from envs.types import ExpectedCall, ToolCall, ToolCallSpec, Trajectory

__all__ = [
    "ToolCallReward",
    "ToolAnswerReward",
    "ToolCallFormatReward",
    "values_match",
    "arguments_match",
    "argument_fraction",
    "answer_matches",
    "normalize_answer",
    "extract_numbers",
    "final_answer",
    "answer_span",
    "turn_expected",
]

_BRUTE_FORCE_MAX = 7  # optimal assignment by enumeration up to this many calls per side


def values_match(predicted: Any, allowed: Any) -> bool:
    """Whether a predicted argument value equals one allowed value.

    Numbers compare numerically (``20 == 20.0``; booleans are not numbers; two integers
    compare exactly, and an integer too large for a float is a mismatch, never an error), strings
    case-sensitively after ``strip()``, lists element-wise, objects key-wise, and other
    values (``true``, ``null``) by equality of type and value.
    """
    if isinstance(allowed, bool) or isinstance(predicted, bool):
        return type(allowed) is type(predicted) and allowed == predicted
    if isinstance(allowed, (int, float)):
        if not isinstance(predicted, (int, float)):
            return False
        if isinstance(allowed, int) and isinstance(predicted, int):
            return predicted == allowed
        try:
            return math.isclose(float(predicted), float(allowed), rel_tol=1e-9, abs_tol=0.0)
        except OverflowError:  # a 400-digit integer against a float: not that value
            return False
    if isinstance(allowed, str):
        return isinstance(predicted, str) and predicted.strip() == allowed.strip()
    if isinstance(allowed, list):
        return (
            isinstance(predicted, list)
            and len(predicted) == len(allowed)
            and all(values_match(p, a) for p, a in zip(predicted, allowed))
        )
    if isinstance(allowed, dict):
        return (
            isinstance(predicted, dict)
            and predicted.keys() == allowed.keys()
            and all(values_match(predicted[k], allowed[k]) for k in allowed)
        )
    return allowed is None and predicted is None


def arguments_match(call: ToolCall, expected: ExpectedCall) -> bool:
    """Whether ``call`` has ``expected``'s name and ALL its arguments allowed.

    Every expected parameter must be present with an allowed value, or absent when
    ``""`` is among its allowed values; a predicted parameter that ``expected`` does not
    list (not in the schema, or not wanted) makes the call not match.
    """
    if call.name != expected.name:
        return False
    args = call.arguments
    if any(k not in expected.allowed for k in args):
        return False
    for param, allowed in expected.allowed.items():
        if param in args:
            if not any(values_match(args[param], a) for a in allowed):
                return False
        elif "" not in allowed:
            return False
    return True


def _spelled_omission(param: str, value: Any, expected: ExpectedCall) -> bool:
    """Whether ``value`` for ``param`` is an empty string where ``expected`` lets ``param`` be omitted."""
    return isinstance(value, str) and not value.strip() and "" in expected.allowed.get(param, ())


def argument_fraction(call: ToolCall, expected: ExpectedCall) -> float:
    """The share of ``call``'s arguments that are right, in [0, 1]; 1.0 exactly when
    :func:`arguments_match` holds, 0.0 for another function.

    Counted: every required parameter of ``expected`` (one whose allowed values lack ``""``)
    and every parameter the call gives, except an optional one given as an empty string.
    Right: a counted parameter that is given with an allowed value. So a missing required
    parameter and a parameter ``expected`` does not list (hallucinated, or not wanted) each
    count as wrong, and an optional parameter left out counts for nothing either way: leaving
    everything out earns no credit, and padding a call with extra keys lowers its share.

    ``""`` in an allowed list is the "may be omitted" marker (BFCL's), so an optional
    parameter given as ``""`` (or blanks) is the omission spelled out and counts for nothing
    too. Were it counted as right, an answer of ``""`` for every argument would earn the
    share of every omit-only parameter (0.67 on a ladder task with one of three parameters
    omit-only, against 0.5 for a well-formed wrong call) without knowing any value. A
    function without parameters called without arguments scores 1.0.
    """
    if call.name != expected.name:
        return 0.0
    args = {p: v for p, v in call.arguments.items() if not _spelled_omission(p, v, expected)}
    counted = {p for p, allowed in expected.allowed.items() if "" not in allowed} | set(args)
    if not counted:
        return 1.0
    right = sum(
        1
        for p in counted
        if p in args and p in expected.allowed and any(values_match(args[p], a) for a in expected.allowed[p])
    )
    return right / len(counted)


def _best_assignment(gain: list[list[float]]) -> list[tuple[int, int]]:
    """Pairs (expected i, predicted j), each index used once, maximizing the total gain."""
    n = len(gain)
    m = len(gain[0]) if n else 0
    if n == 0 or m == 0:
        return []
    if min(n, m) <= _BRUTE_FORCE_MAX and max(n, m) <= _BRUTE_FORCE_MAX:
        best: list[tuple[int, int]] = []
        best_total = -1.0
        if n <= m:
            for perm in itertools.permutations(range(m), n):
                total = sum(gain[i][j] for i, j in enumerate(perm))
                if total > best_total:
                    best_total, best = total, list(enumerate(perm))
        else:
            for perm in itertools.permutations(range(n), m):
                total = sum(gain[i][j] for j, i in enumerate(perm))
                if total > best_total:
                    best_total, best = total, [(i, j) for j, i in enumerate(perm)]
        return best
    # Greedy by best pair score for large n (rare: quickstart tasks have one or two calls).
    pairs = sorted(((gain[i][j], i, j) for i in range(n) for j in range(m)), key=lambda t: (-t[0], t[1], t[2]))
    used_i: set[int] = set()
    used_j: set[int] = set()
    out = []
    for _, i, j in pairs:
        if i not in used_i and j not in used_j:
            used_i.add(i)
            used_j.add(j)
            out.append((i, j))
    return out


def _assistant_turns(traj: Trajectory) -> list[str]:
    """The episode's assistant turns (each with its pre-start), in order."""
    return [m.content for m in traj.messages[len(traj.task.messages) :] if m.role == "assistant"]


def turn_expected(spec: ToolCallSpec) -> list[tuple[ExpectedCall, ...]]:
    """A calls-mode task's right calls per turn: the first request's, then each follow-up's."""
    return [spec.expected, *(f.expected for f in spec.followups)]


class ToolCallReward:
    """Score a tool-call trajectory's ``completion`` (assistant text, prefill included) in [0, 1].

    With ``E`` the expected calls, ``P`` the parsed calls, and a one-to-one, order-insensitive
    assignment between them that maximizes the total pair score
    ``name_weight * [same name] + args_weight * args(pair)``::

        reward = format_weight * [P non-empty and no parse problems]
               + name_weight * (#pairs with the same name)             / max(|E|, |P|)
               + args_weight * (sum over pairs of args(pair))          / max(|E|, |P|)

    ``args_credit="all"`` (default): args(pair) = 1 when the pair's arguments all match, else
    0 (BFCL's exact match). ``"fraction"``: args(pair) = :func:`argument_fraction`, the share
    of the call's arguments that are right (missing required and unlisted ones count as
    wrong), so that a call with two of three arguments right scores between a call with none
    and a fully right one; a group of samples that differ only in how many arguments they get
    right then has reward variance to learn from. Both give the same reward to a fully right
    and to a fully wrong call.

    Argument matching (see :func:`arguments_match`): each expected parameter's value is in
    its allowed list (numbers compared numerically, strings case-sensitively after strip),
    a parameter whose allowed list holds ``""`` may be omitted, and any parameter the
    expected call does not list makes the pair not match. Spurious extra calls enlarge the
    denominator. With the default weights (0.2, 0.3, 0.5) the maximum is 1.0.

    When ``E`` is empty (the right answer is no call) the reward is the full
    ``format_weight + name_weight + args_weight`` if the text has no call and no problems,
    else 0. Parallel calls (several expected calls in one turn, BFCL's "parallel"
    categories) are order-insensitive through the assignment above. Returns ``None`` for a
    task without a ``tool_call`` spec and for ``"answer"``-mode tasks (see
    :class:`ToolAnswerReward`).

    A task with follow-up requests (``tool_call.followups``) scores turn ``i``'s text against request ``i``'s
    calls with the formula above and returns the mean over all its requests: a request whose turn never came
    (the episode was cut first) adds 0, and calls written in an earlier turn do not count for a later request.
    """

    name = "toolcall"
    domains = ("tool_call",)

    def __init__(
        self, format_weight: float = 0.2, name_weight: float = 0.3, args_weight: float = 0.5, args_credit: str = "all"
    ):
        for label, w in (("format_weight", format_weight), ("name_weight", name_weight), ("args_weight", args_weight)):
            if not isinstance(w, (int, float)) or isinstance(w, bool) or w < 0 or not math.isfinite(w):
                raise ValueError(f"{label} must be a finite number >= 0, got {w!r}")
        if args_credit not in ("all", "fraction"):
            raise ValueError(f"args_credit must be 'all' or 'fraction', got {args_credit!r}")
        self.args_score = arguments_match if args_credit == "all" else argument_fraction
        self.format_weight = float(format_weight)
        self.name_weight = float(name_weight)
        self.args_weight = float(args_weight)

    def __call__(self, traj: Trajectory) -> float | None:
        spec = traj.task.tool_call
        if spec is None or spec.mode != "calls":
            return None
        if not spec.followups:
            return self.score(traj.completion, list(spec.expected))
        # A session of requests: each assistant turn (a message record, which the policy's text cannot split or
        # merge) against its own request's calls; a request the episode never reached scores 0.
        turns = _assistant_turns(traj)
        per_request = turn_expected(spec)
        return sum(self.score(text, list(exp)) for text, exp in zip(turns, per_request)) / len(per_request)

    def score(self, text: str, expected: list[ExpectedCall]) -> float:
        """The reward of assistant ``text`` against ``expected`` (the formula above)."""
        calls, problems = parse_tool_calls(text)
        if not expected:
            ok = not calls and not problems
            return self.format_weight + self.name_weight + self.args_weight if ok else 0.0

        fmt = self.format_weight if calls and not problems else 0.0
        if not calls:
            return fmt
        name_ok = [[c.name == e.name for c in calls] for e in expected]
        args_ok = [[float(self.args_score(c, e)) for c in calls] for e in expected]
        # Tie-break toward name matches so a zero name_weight still pairs by name.
        gain = [
            [
                self.name_weight * name_ok[i][j] + self.args_weight * args_ok[i][j] + 1e-6 * name_ok[i][j]
                for j in range(len(calls))
            ]
            for i in range(len(expected))
        ]
        pairs = _best_assignment(gain)
        denom = max(len(expected), len(calls))
        n_name = sum(name_ok[i][j] for i, j in pairs)
        n_args = sum(args_ok[i][j] for i, j in pairs)
        return fmt + self.name_weight * n_name / denom + self.args_weight * n_args / denom


# ----------------------------------------------------------------------------- answer mode

_THINK = re.compile(r"<think>.*?</think>", re.S)
_NUMBER = r"[-+\u2212]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_NUMBER_IN_TEXT = re.compile(r"(?<![\w.])" + _NUMBER)
_WHOLE_NUMBER = re.compile(_NUMBER)
_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)


def _to_float(s: str) -> float:
    return float(s.replace(",", "").replace("\u2212", "-"))


def _to_decimal(s: str) -> Decimal:
    return Decimal(s.replace(",", "").replace("\u2212", "-"))


def _numbers(text: str) -> list[Decimal]:
    """The numbers of ``text`` as :func:`extract_numbers` reads them, exactly (no float rounding
    or overflow)."""
    out = []
    for m in _NUMBER_IN_TEXT.finditer(unicodedata.normalize("NFKC", text)):
        try:
            out.append(_to_decimal(m.group()))
        except InvalidOperation:  # pragma: no cover - the regex only matches numbers
            continue
    return out


def _same_number(x: Decimal, target: Decimal) -> bool:
    """An integer target is met exactly (``21.0`` is 21, ``21.000001`` is not); a decimal one
    within a relative 1e-6 (``92.50`` is 92.5)."""
    if target == target.to_integral_value():
        return x == target
    return math.isclose(float(x), float(target), rel_tol=1e-6, abs_tol=1e-9)


def normalize_answer(text: str) -> str:
    """NFKC, casefold, every run of non-alphanumeric characters (``_`` included) -> one space, stripped."""
    return re.sub(r"[\W_]+", " ", unicodedata.normalize("NFKC", text).casefold()).strip()


def extract_numbers(text: str) -> list[float]:
    """The numbers written in ``text``: optional sign, digits (``1,234`` thousands commas allowed),
    optional decimals; a number glued to a preceding letter, digit or ``.`` is read from its first
    digit (``A-1001`` gives ``1001``, ``2024-05-03`` gives ``2024, 5, 3``)."""
    text = unicodedata.normalize("NFKC", text)
    return [_to_float(m.group()) for m in _NUMBER_IN_TEXT.finditer(text)]


def _part_matches(text: str, part: str) -> bool:
    part = part.strip()
    if not part:
        return True
    if _WHOLE_NUMBER.fullmatch(part):
        target = _to_decimal(part)
        return any(_same_number(x, target) for x in _numbers(text))
    return f" {normalize_answer(part)} " in f" {normalize_answer(text)} "


def answer_span(text: str) -> str | None:
    """The one span of a final answer that is scored: with ``<think>...</think>`` removed, the
    content of its ``<answer>...</answer>`` block when it has exactly one, else (no block) the
    whole text; ``None`` (nothing scores) for several blocks or an unclosed one."""
    text = _THINK.sub(" ", text)
    blocks = _ANSWER_BLOCK.findall(text)
    if len(blocks) > 1 or (not blocks and "<answer>" in text.lower()):
        return None
    return blocks[0] if blocks else text


def _stray_numbers(span: str, parts: list[str], targets: list[Decimal], known: list[Decimal]) -> list[Decimal]:
    """The numbers of ``span`` that are not the value asked for: not a numeric target of any
    acceptable answer, not part of a matched text part (``B-2001``, ``2024-05-28``), not in
    the request (``known``). Each such number is another candidate for the value."""
    rest = _numbers(span)
    for p in parts:
        if not _WHOLE_NUMBER.fullmatch(p):
            for x in _numbers(p):  # the part's own digits, once each
                i = next((k for k, y in enumerate(rest) if y == x), None)
                if i is not None:
                    del rest[i]
    return [x for x in rest if not any(_same_number(x, t) for t in targets) and x not in known]


def _string_leaves(value: Any) -> Iterable[str]:
    """The string values (not keys) in a JSON-like value, depth-first."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            yield v
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def _other_values(competitors: Iterable[str], parts: list[str], context: str) -> list[str]:
    """The normalized competitors that name another value: not the answer's parts, not inside
    them or holding them, not in the request, not a bare number (numbers have their own rule)."""
    norm_parts = [f" {normalize_answer(p)} " for p in parts]
    norm_context = f" {normalize_answer(context)} "
    out = []
    for c in dict.fromkeys(normalize_answer(c) for c in competitors):
        padded = f" {c} "
        if not c or c.replace(" ", "").isdigit() or padded in norm_context:
            continue
        if any(padded in p or p in padded for p in norm_parts):
            continue
        out.append(padded)
    return out


def answer_matches(text: str, acceptable: Iterable[str], context: str = "", competitors: Iterable[str] = ()) -> bool:
    """Whether the final answer ``text`` matches one of the ``acceptable`` answers.

    The rule, applied to :func:`answer_span` of ``text`` (one ``<answer>...</answer>`` block,
    or without one the whole text; ``<think>`` sections removed):

    * an acceptable answer matches when every one of its parts (split on ``&&``; a plain
      answer is one part) matches, and the span names no other candidate (below);
    * a part that is a number (optional sign, digits with optional ``,`` thousands
      separators, optional decimals: ``42``, ``-3.5``, ``1,234.56``) matches when a number
      in the span (:func:`extract_numbers`) equals it: exactly for an integer (``21.0`` is
      21), within a relative 1e-6 for a decimal (``92.5`` matches ``"about 92.50 EUR"`` but
      not ``92.46``: list rounded variants as further acceptable answers);
    * any other part matches when its normalized form (:func:`normalize_answer`) is a
      whole-word substring of the normalized span (``"new york"`` matches ``"New-York!"``;
      ``"shipped"`` does not match ``"unshipped"``);
    * one value, one candidate: every number in the span must be a numeric part of some
      acceptable answer (rounded variants included), a digit of a matched text part
      (``B-2001``), or a number of ``context`` (the request: "user 42"). A span listing
      several candidates (``"18, 19, 20 or 21"``, ``"B-2001 or B-2002"``) matches nothing;
    * for an answer with a text part, nor may the span name one of the ``competitors`` (the
      string values of the task's state and of the episode's tool results, see
      :class:`ToolAnswerReward`) that is another value: ``"shipped or delivered"`` where an
      order in the data is delivered matches nothing (a numeric answer's span may name a
      city or a status: that is no candidate for a number).

    Lenient otherwise: the answer may sit in a sentence, and negations are not understood
    (``"not shipped"`` contains ``"shipped"``); a candidate word that appears nowhere in the
    data (``"shipped or returned"`` with no returned order) is not detected. No acceptable
    answers -> False.
    """
    span = answer_span(text)
    answers = [a for a in acceptable if a.strip()]
    if span is None or not answers:
        return False
    split = [[p.strip() for p in a.split("&&") if p.strip()] for a in answers]
    targets = [_to_decimal(p) for parts in split for p in parts if _WHOLE_NUMBER.fullmatch(p)]
    known = _numbers(context)
    norm_span = f" {normalize_answer(span)} "
    competitors = list(competitors)
    return any(
        all(_part_matches(span, p) for p in parts)
        and not _stray_numbers(span, parts, targets, known)
        and not (
            any(not _WHOLE_NUMBER.fullmatch(p) for p in parts)  # a text value: are others named?
            and any(c in norm_span for c in _other_values(competitors, [p for a in split for p in a], context))
        )
        for parts in split
    )


def final_answer(traj: Trajectory) -> str | None:
    """The episode's final answer: its last assistant turn, if that turn has no ``<tool_call>``."""
    turns = _assistant_turns(traj)
    if not turns or OPEN_TAG in turns[-1]:
        return None
    return turns[-1]


def _data_values(traj: Trajectory) -> list[str]:
    """The string values of the task's tool state and of the episode's tool results: the
    values an answer could name besides the right one."""
    spec = traj.task.tool_call
    values = list(_string_leaves(spec.state if spec is not None else None))
    for m in traj.messages[len(traj.task.messages) :]:
        if m.role == "tool":
            try:
                values += _string_leaves(json.loads(m.content))
            except ValueError:
                continue
    return values


class ToolAnswerReward:
    """1.0 when an ``"answer"``-mode episode ends with a plain-text answer that matches one of
    the task's acceptable answers (``tool_call.answer``, see :func:`answer_matches`, with the
    task's user messages as the context whose numbers are not candidates, and the string
    values of the task's state and tool results as competitors), else 0.0. The
    answer read is one span: the final turn's ``<answer>...</answer>`` block (the system
    prompt asks for it), or the whole final turn when it has none.

    The final answer is the last assistant turn; if it still has a ``<tool_call>`` (the
    episode ran out of turns while calling) or there is no assistant turn, the reward is 0.0.
    Returns ``None`` for tasks without a ``tool_call`` spec and for ``"calls"``-mode tasks.
    """

    name = "tool_answer"
    domains = ("tool_call",)

    def __call__(self, traj: Trajectory) -> float | None:
        spec = traj.task.tool_call
        if spec is None or spec.mode != "answer":
            return None
        text = final_answer(traj)
        if text is None:
            return 0.0
        request = " ".join(m.content for m in traj.task.messages if m.role == "user")
        return 1.0 if answer_matches(text, spec.answer, request, _data_values(traj)) else 0.0


class ToolCallFormatReward:
    """The fraction of the episode's assistant turns that are well-formed, in [0, 1].

    A turn is well-formed when it has at least one ``<tool_call>`` block and all its blocks
    parse with no problems (:func:`~envs.toolcall.parse_tool_calls`). A turn without any
    block (and without problems) is well-formed only as the final turn of an
    ``"answer"``-mode episode, and then only if it has non-blank text; in ``"calls"`` mode
    such a turn counts only when its request expects no call, and the fraction is over every request
    (follow-ups included), not only the turns the episode reached. No assistant turn -> 0.0.
    Returns ``None`` for tasks without a ``tool_call`` spec.
    """

    name = "toolcall_format"
    domains = ("tool_call",)

    def __call__(self, traj: Trajectory) -> float | None:
        spec = traj.task.tool_call
        if spec is None:
            return None
        turns = _assistant_turns(traj)
        if not turns:
            return 0.0
        per_request = turn_expected(spec)
        good = 0
        for i, text in enumerate(turns):
            calls, problems = parse_tool_calls(text)
            if problems:
                continue
            if calls:
                good += 1
            elif spec.mode == "answer":
                good += int(i == len(turns) - 1 and bool(text.strip()))
            else:
                good += int(i < len(per_request) and not per_request[i])
        # calls mode: over every request, so that an episode cut before its later requests gains nothing
        return good / (len(turns) if spec.mode == "answer" else max(len(turns), len(per_request)))
