"""Generated code tasks: a seeded ladder of small Python functions, near-trivial to hard.

    python -m rl.data.tasks.code_gen [--out-dir recipes/data] [--seed 0]

writes ``code_ladder.train.jsonl`` and ``code_ladder.eval.jsonl`` (held out BY TEMPLATE:
no eval task's shape appears in training; see :mod:`rl.data.tasks.ladder`). Same seed,
same bytes.

Rungs: 0 = one arithmetic or string operation on the input (``x * 7``, ``s[:3]``); 1 = one
built-in or comprehension with a parameter (count a character, sum the elements above
k); 2 = a filter and a map, or slicing with a step (squares of the even elements, every k-th element);
3 = a loop with state (run-length encoding, a recurrence). Every template's parameters
(constants, characters, thresholds) are drawn per instance, so two instances of one
template differ in what the function must do, not only in its name.

Each task has 5 assert tests (style ``"assert"``): the first is the prompt's example, a
PUBLIC test (``CodeSpec.public_tests``: quoted with its values in feedback, never scored);
the other 4 are HIDDEN (``CodeSpec.tests``: scored, feedback names them by index only; a
repeat of the example's input is left out), so a
second turn built from the feedback, or an echo of the example, earns nothing. The code
reward's partial credit (``CodeTestsReward(mode="fraction")``) counts only the hidden
passes above what a trivial answer (a constant, an echo of the input) passes; an instance
whose hidden tests a trivial answer passes entirely is drawn again. Expected values are
computed here by running the reference solution (our own code, in this process) on the
test inputs; the test suite then runs every reference solution through the sandboxed
harness and checks that it passes and that a function returning ``None`` passes nothing.
No expected value is ``None``.

The answer is pre-started (``Task.prefill``): rungs 0-2 with the opening fence and the
function's ``def`` line up to its colon (the signature the prompt states), so only the body
is the model's; rung 3 with the fence only. The pre-start ends at the colon, not after the
line's newline: SmolLM2's tokenizer writes a body's first newline and indentation as one
token (``\n   ``), so after a pre-started bare ``\n`` the model saw no indented body ahead
and closed the block at once (every one of 45 held-out rung 0-2 tasks, greedy).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envs.code import test_plan
from envs.code_baseline import trivial_passes
from envs.types import CodeSpec, Message, Task
from rl.data.tasks.code_tasks import SYSTEM_PROMPT
from rl.data.tasks.ladder import N_EVAL, N_TRAIN, Template, generate_split, ladder_main, write_ladder

__all__ = ["SOURCE", "TEMPLATES", "generate", "write", "main"]

SOURCE = "code_ladder"
USER_TEMPLATE = (
    "Write a Python function `{signature}` that {description} Example: `{example}`.\n\n"
    "Reply with the complete function in one ```python code block."
)
WORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "tiger",
    "lemon",
    "piano",
    "ocean",
    "maple",
    "robot",
    "sugar",
    "candle",
    "forest",
    "planet",
    "silver",
    "window",
]
N_TESTS = 5


def _task(name: str, signature: str, description: str, solution: str, inputs: list[tuple[Any, ...]]) -> Task:
    """A code task whose tests are ``assert name(*args) == <reference output>`` per input."""
    namespace: dict[str, Any] = {}
    exec(compile(solution, f"<reference {name}>", "exec"), namespace)  # noqa: S102 - our own reference code
    fn = namespace[name]
    tests, example = [], ""
    for args in inputs:
        expected = fn(*args)
        if expected is None:
            raise ValueError(f"{name}{args!r}: the reference returns None; a no-op would pass")
        call = f"{name}({', '.join(repr(a) for a in args)})"
        tests.append(f"assert {call} == {expected!r}")
        example = example or f"{call} == {expected!r}"
    user = USER_TEMPLATE.format(signature=signature, description=description, example=example)
    # A hidden test repeating the example (a repeated input) would score what the prompt shows.
    hidden = list(dict.fromkeys(t for t in tests[1:] if t != tests[0]))
    spec = CodeSpec(
        public_tests=tests[0] + "\n",  # the prompt's example: shown, quoted in feedback, never scored
        tests="\n".join(hidden) + "\n",
        entry_point=name,
        style="assert",
        solution=solution,
    )
    return Task(id="", domain="code", messages=(Message("system", SYSTEM_PROMPT), Message("user", user)), code=spec)


def _degenerate(spec: CodeSpec) -> bool:
    """Whether a trivial answer (a constant, an echo) passes every hidden test of ``spec``: such a
    task cannot tell the reference from no work (:func:`envs.code.partial_credit`)."""
    plan = test_plan(spec)
    n = trivial_passes(plan.source, plan.scored, [spec.entry_point], budget_s=5.0)
    return n is None or n >= len(plan.scored)


def _ints(rng: random.Random, n: int, lo: int = -9, hi: int = 20) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


def _lists(
    rng: random.Random, lo: int = -9, hi: int = 20, sizes: tuple[int, int] = (3, 7), empty: bool = True
) -> list[tuple[Any, ...]]:
    """N_TESTS one-argument inputs: int lists of ``sizes`` lengths with elements in ``lo..hi``, the last one
    the empty list when ``empty`` (for functions defined on empty lists)."""
    n = N_TESTS - 1 if empty else N_TESTS
    return [(_ints(rng, rng.randint(*sizes), lo, hi),) for _ in range(n)] + ([([],)] if empty else [])


def _word_args(rng: random.Random) -> list[tuple[Any, ...]]:
    return [(w,) for w in rng.sample(WORDS, N_TESTS)]


# ------------------------------------------------------------------------ rung 0: one operation


def _take_first(rng: random.Random) -> Task:
    c = rng.randint(2, 4)
    name = f"first_{c}_chars"
    return _task(
        name,
        f"{name}(s: str) -> str",
        f"returns the first {c} characters of `s`.",
        f"def {name}(s: str) -> str:\n    return s[:{c}]\n",
        _word_args(rng),
    )


def _times_const(rng: random.Random) -> Task:
    c = rng.randint(2, 12)
    return _task(
        f"times_{c}",
        f"times_{c}(x: int) -> int",
        f"returns `x` multiplied by {c}.",
        f"def times_{c}(x: int) -> int:\n    return x * {c}\n",
        [(x,) for x in _ints(rng, N_TESTS, -30, 30)],
    )


def _minus_const(rng: random.Random) -> Task:
    c = rng.randint(2, 19)
    return _task(
        f"minus_{c}",
        f"minus_{c}(x: int) -> int",
        f"returns `x` minus {c}.",
        f"def minus_{c}(x: int) -> int:\n    return x - {c}\n",
        [(x,) for x in _ints(rng, N_TESTS, -50, 50)],
    )


def _add_suffix(rng: random.Random) -> Task:
    suffix = rng.choice(["!", "?", "...", "_x", "-ok", "42", "!!", "_v2"])
    name = f"add_suffix_{rng.randint(1, 99)}"
    return _task(
        name,
        f"{name}(s: str) -> str",
        f"returns `s` followed by the text {suffix!r}.",
        f"def {name}(s: str) -> str:\n    return s + {suffix!r}\n",
        _word_args(rng),
    )


def _add_prefix(rng: random.Random) -> Task:
    prefix = rng.choice(["#", "re", "un", "my_", "> ", "pre-", "@", "x"])
    name = f"add_prefix_{rng.randint(1, 99)}"
    return _task(
        name,
        f"{name}(s: str) -> str",
        f"returns the text {prefix!r} followed by `s`.",
        f"def {name}(s: str) -> str:\n    return {prefix!r} + s\n",
        _word_args(rng),
    )


def _square_plus(rng: random.Random) -> Task:
    c = rng.randint(1, 9)
    return _task(
        f"square_plus_{c}",
        f"square_plus_{c}(x: int) -> int",
        f"returns `x` squared plus {c}.",
        f"def square_plus_{c}(x: int) -> int:\n    return x * x + {c}\n",
        [(x,) for x in _ints(rng, N_TESTS, -12, 12)],
    )


# ------------------------------------------------------------------------ rung 1: one built-in


def _count_char(rng: random.Random) -> Task:
    ch = rng.choice("aeiorstln")
    name = f"count_{ch}"
    words = [
        "banana",
        "letter",
        "sister",
        "tomato",
        "orange",
        "lantern",
        "rotation",
        "pineapple",
        "illusion",
        "salsa",
        "rattle",
        "nonstop",
        "a",
        "",
    ]
    return _task(
        name,
        f"{name}(s: str) -> int",
        f"returns how many times the letter {ch!r} occurs in `s`.",
        f"def {name}(s: str) -> int:\n    return s.count({ch!r})\n",
        [(w,) for w in rng.sample(words, N_TESTS)],
    )


def _sum_above(rng: random.Random) -> Task:
    k = rng.randint(0, 10)
    name = f"sum_above_{k}"
    return _task(
        name,
        f"{name}(nums: list[int]) -> int",
        f"returns the sum of the elements of `nums` greater than {k}.",
        f"def {name}(nums: list[int]) -> int:\n    return sum(x for x in nums if x > {k})\n",
        _lists(rng),
    )


def _keep_multiples(rng: random.Random) -> Task:
    k = rng.randint(2, 6)
    name = f"multiples_of_{k}"
    return _task(
        name,
        f"{name}(nums: list[int]) -> list[int]",
        f"returns the elements of `nums` that are divisible by {k}, in their original order.",
        f"def {name}(nums: list[int]) -> list[int]:\n    return [x for x in nums if x % {k} == 0]\n",
        _lists(rng),
    )


def _count_below(rng: random.Random) -> Task:
    k = rng.randint(0, 10)
    name = f"count_below_{k}"
    return _task(
        name,
        f"{name}(nums: list[int]) -> int",
        f"returns how many elements of `nums` are smaller than {k}.",
        f"def {name}(nums: list[int]) -> int:\n    return sum(1 for x in nums if x < {k})\n",
        _lists(rng),
    )


def _drop_value(rng: random.Random) -> Task:
    v = rng.randint(0, 9)
    name = f"drop_{v}"
    inputs = [([rng.choice([v, v, rng.randint(0, 9)]) for _ in range(rng.randint(3, 7))],) for _ in range(N_TESTS - 1)]
    return _task(
        name,
        f"{name}(nums: list[int]) -> list[int]",
        f"returns `nums` with every occurrence of {v} removed (the other elements keep their order).",
        f"def {name}(nums: list[int]) -> list[int]:\n    return [x for x in nums if x != {v}]\n",
        inputs + [([],)],
    )


def _repeat_word(rng: random.Random) -> Task:
    n = rng.randint(2, 5)
    sep = rng.choice([" ", "-", ",", ""])
    name = f"repeat_{n}_times"
    return _task(
        name,
        f"{name}(s: str) -> str",
        f"returns `s` repeated {n} times, separated by {sep!r}.",
        f"def {name}(s: str) -> str:\n    return {sep!r}.join([s] * {n})\n",
        _word_args(rng),
    )


# ------------------------------------------------------------------------ rung 2: filter + map, small loop


def _scale_above(rng: random.Random) -> Task:
    k, c = rng.randint(0, 8), rng.randint(2, 5)
    name = f"scale_above_{k}_by_{c}"
    return _task(
        name,
        f"{name}(nums: list[int]) -> list[int]",
        f"returns, in order, each element of `nums` greater than {k} multiplied by {c} "
        f"(the other elements are left out).",
        f"def {name}(nums: list[int]) -> list[int]:\n    return [x * {c} for x in nums if x > {k}]\n",
        _lists(rng),
    )


def _every_kth(rng: random.Random) -> Task:
    k = rng.randint(2, 4)
    start = rng.randint(0, k - 1)
    name = f"every_{k}th_from_{start}"
    return _task(
        name,
        f"{name}(items: list[int]) -> list[int]",
        f"returns the elements of `items` at positions {start}, {start + k}, {start + 2 * k}, ... "
        f"(every {k}th element starting at index {start}).",
        f"def {name}(items: list[int]) -> list[int]:\n    return items[{start}::{k}]\n",
        _lists(rng, sizes=(4, 10)),
    )


def _squares_of_parity(rng: random.Random) -> Task:
    parity, rest = rng.choice([("even", 0), ("odd", 1)])
    name = f"squares_of_{parity}"
    return _task(
        name,
        f"{name}(nums: list[int]) -> list[int]",
        f"returns, in order, the square of each {parity} element of `nums` (the other elements are left out).",
        f"def {name}(nums: list[int]) -> list[int]:\n    return [x * x for x in nums if x % 2 == {rest}]\n",
        _lists(rng),
    )


def _sum_multiples_scaled(rng: random.Random) -> Task:
    m, c = rng.randint(2, 5), rng.randint(2, 4)
    name = f"scaled_sum_of_multiples_of_{m}"
    return _task(
        name,
        f"{name}(nums: list[int]) -> int",
        f"returns {c} times the sum of the elements of `nums` that are divisible by {m}.",
        f"def {name}(nums: list[int]) -> int:\n    return {c} * sum(x for x in nums if x % {m} == 0)\n",
        _lists(rng),
    )


def _replace_vowels(rng: random.Random) -> Task:
    ch, label = rng.choice([("*", "star"), ("#", "hash"), ("_", "under"), ("-", "dash"), ("+", "plus")])
    name = f"mask_vowels_{label}"
    return _task(
        name,
        f"{name}(s: str) -> str",
        f"returns `s` with every vowel (a, e, i, o, u, either case) replaced by {ch!r}.",
        f"def {name}(s: str) -> str:\n    return ''.join({ch!r} if c.lower() in 'aeiou' else c for c in s)\n",
        [(w,) for w in rng.sample(WORDS + ["AEIOU", "Sky", "Queue"], N_TESTS)],
    )


def _chunk_sums(rng: random.Random) -> Task:
    k = rng.randint(2, 4)
    name = f"sums_of_{k}_chunks"
    return _task(
        name,
        f"{name}(nums: list[int]) -> list[int]",
        f"splits `nums` into consecutive chunks of {k} elements (the last chunk may be shorter) and "
        f"returns the sum of each chunk.",
        f"def {name}(nums: list[int]) -> list[int]:\n"
        f"    return [sum(nums[i:i + {k}]) for i in range(0, len(nums), {k})]\n",
        _lists(rng, sizes=(3, 9)),
    )


# ------------------------------------------------------------------------ rung 3: loops with state


def _rle(rng: random.Random) -> Task:
    sep, label = rng.choice([("", ""), (":", "_colon"), ("x", "_x"), ("-", "_dash")])
    name = f"run_lengths{label}"
    sol = (
        f"def {name}(s: str) -> str:\n    out = []\n    i = 0\n    while i < len(s):\n        j = i\n"
        f"        while j < len(s) and s[j] == s[i]:\n            j += 1\n"
        f"        out.append(s[i] + {sep!r} + str(j - i))\n        i = j\n    return ''.join(out)\n"
    )
    samples = ["aaabcc", "abcd", "zzzzzz", "aabbaa", "x", "mississippi", "ppqqqr", ""]
    return _task(
        name,
        f"{name}(s: str) -> str",
        f"returns the run-length encoding of `s`: for each run of equal consecutive characters, the "
        f"character, then {sep!r}, then the run's length, all concatenated.",
        sol,
        [(w,) for w in rng.sample(samples, N_TESTS)],
    )


def _recurrence(rng: random.Random) -> Task:
    a, b = rng.randint(0, 3), rng.randint(1, 4)
    name = f"seq_{a}_{b}"
    sol = (
        f"def {name}(n: int) -> int:\n    x, y = {a}, {b}\n    for _ in range(n):\n"
        f"        x, y = y, x + y\n    return x\n"
    )
    return _task(
        name,
        f"{name}(n: int) -> int",
        f"returns term `n` (counting from 0) of the sequence whose terms 0 and 1 are {a} and {b} and "
        f"where every later term is the sum of the two before it.",
        sol,
        [(n,) for n in rng.sample(range(0, 15), N_TESTS)],
    )


def _long_word_counts(rng: random.Random) -> Task:
    k = rng.randint(3, 5)
    name = f"count_words_longer_than_{k}"
    sol = (
        f"def {name}(text: str) -> dict[str, int]:\n    out: dict[str, int] = {{}}\n"
        f"    for w in text.split():\n        if len(w) > {k}:\n            out[w] = out.get(w, 0) + 1\n"
        f"    return out\n"
    )
    texts = [
        " ".join(rng.choice(WORDS + ["a", "to", "cat", "dog", "the"]) for _ in range(rng.randint(3, 8)))
        for _ in range(N_TESTS)
    ]
    return _task(
        name,
        f"{name}(text: str) -> dict[str, int]",
        f"returns a dict mapping each word of `text` (words are separated by whitespace) that is longer "
        f"than {k} characters to how many times it occurs.",
        sol,
        [(t,) for t in texts],
    )


def _digit_power_sum(rng: random.Random) -> Task:
    p = rng.randint(2, 4)
    name = f"digit_power_sum_{p}"
    return _task(
        name,
        f"{name}(n: int) -> int",
        f"returns the sum of the decimal digits of the non-negative integer `n`, each raised to the power {p}.",
        f"def {name}(n: int) -> int:\n    return sum(int(d) ** {p} for d in str(n))\n",
        [(n,) for n in rng.sample(range(0, 10000), N_TESTS)],
    )


def _running_max(rng: random.Random) -> Task:
    k = rng.choice([0, 1, 2])
    name = f"running_max_plus_{k}"
    sol = (
        f"def {name}(nums: list[int]) -> list[int]:\n    out = []\n    best = None\n    for x in nums:\n"
        f"        best = x if best is None or x > best else best\n        out.append(best + {k})\n    return out\n"
    )
    return _task(
        name,
        f"{name}(nums: list[int]) -> list[int]",
        f"returns a list whose element i is the largest of nums[0], ..., nums[i], plus {k}.",
        sol,
        _lists(rng),
    )


def _word_lengths_sorted(rng: random.Random) -> Task:
    rev = rng.choice([False, True])
    name = f"words_by_length_{'desc' if rev else 'asc'}"
    sol = (
        f"def {name}(text: str) -> list[str]:\n"
        f"    return sorted(text.split(), key=lambda w: ({'-' if rev else ''}len(w), w))\n"
    )
    texts = [" ".join(rng.sample(WORDS + ["a", "to", "cat", "dog"], rng.randint(3, 6))) for _ in range(N_TESTS)]
    order = "longest first" if rev else "shortest first"
    return _task(
        name,
        f"{name}(text: str) -> list[str]",
        f"returns the whitespace-separated words of `text` sorted by length, {order}, words of equal length "
        f"in alphabetical order.",
        sol,
        [(t,) for t in texts],
    )


# ------------------------------------------------------------------------ training-only templates, wider ladder
# Twenty more training shapes, none a held-out template's shape or its key step (no "x minus c", no
# prefix, no count below a threshold, no removal of a value, no joining with a separator, no vowels,
# no chunks, no digit sums, no sorting or filtering of a text's words), so that training covers more
# task shapes than the twelve it had: what a seed learned from a dozen shapes was a few shapes' tricks
# (bench/RESULTS.md, "Seed sweep: recipes/joint_rl.yaml at 46 steps"), not a skill that reached new
# templates.


def _last_chars(rng: random.Random) -> Task:
    c = rng.randint(2, 4)
    name = f"last_{c}_chars"
    return _task(
        name,
        f"{name}(s: str) -> str",
        f"returns the last {c} characters of `s`.",
        f"def {name}(s: str) -> str:\n    return s[-{c}:]\n",
        _word_args(rng),
    )


def _floor_div(rng: random.Random) -> Task:
    c = rng.randint(2, 9)
    name = f"floor_div_{c}"
    return _task(
        name,
        f"{name}(x: int) -> int",
        f"returns `x` divided by {c}, rounded down to an integer (floor division).",
        f"def {name}(x: int) -> int:\n    return x // {c}\n",
        [(x,) for x in _ints(rng, N_TESTS, -40, 40)],
    )


def _mod_const(rng: random.Random) -> Task:
    c = rng.randint(3, 9)
    name = f"mod_{c}"
    return _task(
        name,
        f"{name}(x: int) -> int",
        f"returns the remainder of `x` divided by {c}, as Python's % operator gives it.",
        f"def {name}(x: int) -> int:\n    return x % {c}\n",
        [(x,) for x in _ints(rng, N_TESTS, -40, 40)],
    )


def _reverse_tagged(rng: random.Random) -> Task:
    tag = rng.choice(["!", "<", "_r", "~", "0", ".."])
    name = f"reverse_tag_{rng.randint(1, 99)}"
    return _task(
        name,
        f"{name}(s: str) -> str",
        f"returns `s` written backwards, followed by the text {tag!r}.",
        f"def {name}(s: str) -> str:\n    return s[::-1] + {tag!r}\n",
        _word_args(rng),
    )


def _upper_head(rng: random.Random) -> Task:
    c = rng.randint(1, 3)
    name = f"upper_first_{c}"
    return _task(
        name,
        f"{name}(s: str) -> str",
        f"returns `s` with its first {c} characters in upper case and the rest unchanged.",
        f"def {name}(s: str) -> str:\n    return s[:{c}].upper() + s[{c}:]\n",
        _word_args(rng),
    )


def _max_plus(rng: random.Random) -> Task:
    c = rng.randint(1, 9)
    name = f"max_plus_{c}"
    return _task(
        name,
        f"{name}(nums: list[int]) -> int",
        f"returns the largest element of the non-empty list `nums`, plus {c}.",
        f"def {name}(nums: list[int]) -> int:\n    return max(nums) + {c}\n",
        _lists(rng, empty=False),
    )


def _pad_left(rng: random.Random) -> Task:
    width, ch = rng.randint(7, 9), rng.choice(["*", ".", "0", "#", "-"])
    name = f"pad_to_{width}"
    return _task(
        name,
        f"{name}(s: str) -> str",
        f"returns `s` with copies of {ch!r} added in front of it until it is {width} characters long "
        f"(`s` unchanged if it is already that long).",
        f"def {name}(s: str) -> str:\n    return s.rjust({width}, {ch!r})\n",
        [(w,) for w in rng.sample(WORDS + ["a", "to", "cat", "crocodile", "strawberry"], N_TESTS)],
    )


def _index_of_extreme(rng: random.Random) -> Task:
    which = rng.choice(["smallest", "largest"])
    fn = "min" if which == "smallest" else "max"
    name = f"index_of_{which}"
    return _task(
        name,
        f"{name}(nums: list[int]) -> int",
        f"returns the index of the first occurrence of the {which} element of the non-empty list `nums`.",
        f"def {name}(nums: list[int]) -> int:\n    return nums.index({fn}(nums))\n",
        _lists(rng, empty=False),
    )


def _count_starting(rng: random.Random) -> Task:
    ch = rng.choice("sprctlmow")
    name = f"count_starting_with_{ch}"
    pool = WORDS + ["sun", "pear", "rain", "cat", "tree", "lamp", "moon", "owl", "wolf"]
    return _task(
        name,
        f"{name}(words: list[str]) -> int",
        f"returns how many strings in `words` start with the letter {ch!r}.",
        f"def {name}(words: list[str]) -> int:\n    return sum(1 for w in words if w.startswith({ch!r}))\n",
        [(rng.sample(pool, rng.randint(3, 7)),) for _ in range(N_TESTS - 1)] + [([],)],
    )


def _product_plus(rng: random.Random) -> Task:
    c = rng.randint(0, 5)
    name = f"product_plus_{c}"
    return _task(
        name,
        f"{name}(nums: list[int]) -> int",
        f"returns the product of the elements of `nums` (1 for an empty list), plus {c}.",
        f"def {name}(nums: list[int]) -> int:\n    p = 1\n    for x in nums:\n        p *= x\n    return p + {c}\n",
        _lists(rng, -5, 6, sizes=(2, 5)),
    )


def _pair_diffs(rng: random.Random) -> Task:
    c = rng.randint(2, 4)
    name = f"gaps_times_{c}"
    return _task(
        name,
        f"{name}(nums: list[int]) -> list[int]",
        f"returns, for each pair of neighbouring elements of `nums`, the later minus the earlier, "
        f"multiplied by {c} (one fewer element than `nums`; empty if `nums` has fewer than two).",
        f"def {name}(nums: list[int]) -> list[int]:\n    return [(b - a) * {c} for a, b in zip(nums, nums[1:])]\n",
        _lists(rng),
    )


def _indices_above(rng: random.Random) -> Task:
    k = rng.randint(0, 10)
    name = f"positions_above_{k}"
    return _task(
        name,
        f"{name}(nums: list[int]) -> list[int]",
        f"returns the indices, in increasing order, of the elements of `nums` greater than {k}.",
        f"def {name}(nums: list[int]) -> list[int]:\n    return [i for i, x in enumerate(nums) if x > {k}]\n",
        _lists(rng),
    )


def _clamp(rng: random.Random) -> Task:
    lo = rng.randint(-3, 3)
    hi = lo + rng.randint(3, 8)
    name = f"clamp_{lo}_{hi}".replace("-", "m")
    return _task(
        name,
        f"{name}(nums: list[int]) -> list[int]",
        f"returns `nums` with every element below {lo} replaced by {lo} and every element above {hi} "
        f"replaced by {hi} (order kept).",
        f"def {name}(nums: list[int]) -> list[int]:\n    return [min(max(x, {lo}), {hi}) for x in nums]\n",
        _lists(rng),
    )


def _find_char(rng: random.Random) -> Task:
    ch = rng.choice("rlntsmpc")
    name = f"position_of_{ch}"
    pool = WORDS + ["pear", "rain", "tree", "lamp", "moon", "wolf", "castle", "mist", "prism", "tulip"]
    has, lacks = [w for w in pool if ch in w], [w for w in pool if ch not in w]
    return _task(
        name,
        f"{name}(s: str) -> int",
        f"returns the index of the first {ch!r} in `s` (indices count from 0), or -1 if `s` has none.",
        f"def {name}(s: str) -> int:\n    return s.find({ch!r})\n",
        [(w,) for w in rng.sample(has, 3) + rng.sample(lacks, 2)],
    )


def _flip_odd_positions(rng: random.Random) -> Task:
    start = rng.choice([0, 1])
    which = "even" if start == 0 else "odd"
    name = f"negate_{which}_positions"
    return _task(
        name,
        f"{name}(nums: list[int]) -> list[int]",
        f"returns `nums` with the sign of every element at an {which} index (indices count from 0) "
        f"flipped and the other elements unchanged.",
        f"def {name}(nums: list[int]) -> list[int]:\n    return [-x if i % 2 == {start} else x for i, x in enumerate(nums)]\n",
        _lists(rng),
    )


def _running_total(rng: random.Random) -> Task:
    c = rng.randint(0, 9)
    name = f"running_total_from_{c}"
    sol = (
        f"def {name}(nums: list[int]) -> list[int]:\n    out = []\n    total = {c}\n    for x in nums:\n"
        f"        total += x\n        out.append(total)\n    return out\n"
    )
    return _task(
        name,
        f"{name}(nums: list[int]) -> list[int]",
        f"returns a list whose element i is {c} plus the sum of nums[0], ..., nums[i].",
        sol,
        _lists(rng),
    )


def _longest_run_above(rng: random.Random) -> Task:
    k = rng.randint(0, 8)
    name = f"longest_run_above_{k}"
    sol = (
        f"def {name}(nums: list[int]) -> int:\n    best = run = 0\n    for x in nums:\n"
        f"        run = run + 1 if x > {k} else 0\n        best = max(best, run)\n    return best\n"
    )
    return _task(
        name,
        f"{name}(nums: list[int]) -> int",
        f"returns the length of the longest stretch of consecutive elements of `nums` that are all "
        f"greater than {k} (0 if there is none).",
        sol,
        _lists(rng, -5, 15, sizes=(5, 10)),
    )


def _first_unique(rng: random.Random) -> Task:
    k = rng.randint(2, 4)
    name = f"first_{k}_distinct"
    sol = (
        f"def {name}(nums: list[int]) -> list[int]:\n    out = []\n    for x in nums:\n"
        f"        if x not in out:\n            out.append(x)\n    return out[:{k}]\n"
    )
    inputs = _lists(rng, 0, 5, sizes=(4, 9))
    return _task(
        name,
        f"{name}(nums: list[int]) -> list[int]",
        f"returns the first {k} different values of `nums` in the order they first occur (fewer if "
        f"`nums` has fewer different values).",
        sol,
        inputs,
    )


def _second_largest(rng: random.Random) -> Task:
    d = rng.randint(-1, 9)
    name = f"second_largest_or_{d}".replace("-", "m")
    sol = (
        f"def {name}(nums: list[int]) -> int:\n    values = sorted(set(nums), reverse=True)\n"
        f"    return values[1] if len(values) > 1 else {d}\n"
    )
    inputs = [(_ints(rng, rng.randint(3, 7), 0, 12),) for _ in range(N_TESTS - 2)] + [([5, 5, 5],), ([],)]
    return _task(
        name,
        f"{name}(nums: list[int]) -> int",
        f"returns the second largest different value in `nums`, or {d} if `nums` has fewer than two different values.",
        sol,
        inputs,
    )


def _count_rises(rng: random.Random) -> Task:
    k = rng.randint(0, 4)
    name = f"count_rises_over_{k}"
    sol = (
        f"def {name}(nums: list[int]) -> int:\n    count = 0\n    for a, b in zip(nums, nums[1:]):\n"
        f"        if b - a > {k}:\n            count += 1\n    return count\n"
    )
    return _task(
        name,
        f"{name}(nums: list[int]) -> int",
        f"returns how many neighbouring pairs of `nums` rise by more than {k} (the later element minus "
        f"the earlier is greater than {k}).",
        sol,
        _lists(rng, -5, 15, sizes=(5, 9)),
    )


_T = Callable[[random.Random], Task]
_SPEC: list[tuple[str, int, str, _T]] = [
    # take_first, not add_const: every sample solved add_const, so it taught nothing; so did every
    # sample x * a + b, tried in its place (bench/RESULTS.md, "Task ladders: measured difficulty").
    ("take_first", 0, "train", _take_first),
    ("times_const", 0, "train", _times_const),
    ("add_suffix", 0, "train", _add_suffix),
    ("minus_const", 0, "eval", _minus_const),
    ("add_prefix", 0, "eval", _add_prefix),
    ("square_plus", 0, "eval", _square_plus),
    ("count_char", 1, "train", _count_char),
    ("sum_above", 1, "train", _sum_above),
    ("keep_multiples", 1, "train", _keep_multiples),
    ("count_below", 1, "eval", _count_below),
    ("drop_value", 1, "eval", _drop_value),
    ("repeat_word", 1, "eval", _repeat_word),
    ("scale_above", 2, "train", _scale_above),
    ("every_kth", 2, "train", _every_kth),
    # squares_of_parity, not a shift cipher: no sample passed the cipher, so it taught nothing
    # either (same section); rung 3 keeps the loops with state.
    ("squares_of_parity", 2, "train", _squares_of_parity),
    ("sum_multiples_scaled", 2, "eval", _sum_multiples_scaled),
    ("replace_vowels", 2, "eval", _replace_vowels),
    ("chunk_sums", 2, "eval", _chunk_sums),
    ("rle", 3, "train", _rle),
    ("recurrence", 3, "train", _recurrence),
    ("running_max", 3, "train", _running_max),
    ("long_word_counts", 3, "eval", _long_word_counts),
    ("digit_power_sum", 3, "eval", _digit_power_sum),
    ("word_lengths_sorted", 3, "eval", _word_lengths_sorted),
    # The wider ladder's training-only shapes (see above).
    ("last_chars", 0, "train", _last_chars),
    ("floor_div", 0, "train", _floor_div),
    ("mod_const", 0, "train", _mod_const),
    ("reverse_tagged", 0, "train", _reverse_tagged),
    ("upper_head", 0, "train", _upper_head),
    ("max_plus", 1, "train", _max_plus),
    ("pad_left", 1, "train", _pad_left),
    ("index_of_extreme", 1, "train", _index_of_extreme),
    ("count_starting", 1, "train", _count_starting),
    ("product_plus", 1, "train", _product_plus),
    ("pair_diffs", 2, "train", _pair_diffs),
    ("indices_above", 2, "train", _indices_above),
    ("clamp", 2, "train", _clamp),
    ("find_char", 1, "train", _find_char),
    ("flip_positions", 2, "train", _flip_odd_positions),
    ("running_total", 3, "train", _running_total),
    ("longest_run_above", 3, "train", _longest_run_above),
    ("first_distinct", 3, "train", _first_unique),
    ("second_largest", 3, "train", _second_largest),
    ("count_rises", 3, "train", _count_rises),
]


def _prefilled(make: _T, rung: int) -> _T:
    """``make`` with the answer pre-started: rungs 0-2 up to the ``def`` line's colon (only the
    body is left to write, starting with its newline-and-indent token), rung 3 with the opening
    fence only."""

    def wrapped(rng: random.Random) -> Task:
        task = make(rng)
        for _ in range(100):  # redrawn while a trivial answer passes every hidden test
            if not _degenerate(task.code):
                break
            task = make(rng)
        else:
            raise ValueError(f"{task.code.entry_point}: 100 draws in a row that a trivial answer passes")
        head = "```python\n"
        if rung <= 2:
            head += task.code.solution.split("\n", 1)[0]
        return dataclasses.replace(task, prefill=head)

    return wrapped


# The lever that the tool-call ladder needed (SmolLM2-135M solved no tool-call task with only
# <tool_call> pre-started), applied here: the low rungs leave the model only the body to write.
# The def line restates the signature the prompt gives; nothing of the body is given away.
# It ends at the colon, not after the line's "\n": ended after it, the model closed the fence right
# after that "\n" (an empty body, the whole first turn lost), because the tokenizer writes "\n" +
# indent as one token, so a bare "\n" tells the model that no indented line follows. Ended at the
# colon it writes bodies (greedy, the held-out rung 0-2 tasks: bench/code_prefill.py, and
# bench/RESULTS.md, "Where the code pre-start ends").
TEMPLATES: tuple[Template, ...] = tuple(Template(n, r, s, _prefilled(f, r)) for n, r, s, f in _SPEC)


def generate(n_train: int = N_TRAIN, n_eval: int = N_EVAL, seed: int = 0) -> tuple[list[Task], list[Task]]:
    """(train, eval) code tasks; deterministic in ``seed``; eval uses only eval templates."""
    return generate_split(TEMPLATES, SOURCE, n_train, n_eval, seed)


def write(out_dir: str | Path, n_train: int = N_TRAIN, n_eval: int = N_EVAL, seed: int = 0) -> list[Path]:
    train, held = generate(n_train, n_eval, seed)
    return write_ladder({"train": train, "eval": held}, out_dir, SOURCE)


def main(argv: list[str] | None = None) -> None:
    ladder_main("python -m rl.data.tasks.code_gen", __doc__.split("\n\n")[0], write, argv)


if __name__ == "__main__":
    main()
