"""Source of ``recipes/data/code_tasks.jsonl``: small Python function tasks written for jointrl.

    python -m rl.data.tasks.code_tasks            # rewrites recipes/data/code_tasks{,.train,.eval}.jsonl

Each entry of :data:`TASKS` is one function to write: its signature, what it does, a
reference solution, and 3-6 assert tests (style ``"assert"``), graded easy -> medium ->
hard. A test of the example the description shows is public (never scored); the rest are
the hidden tests the reward is computed on. Every fourth task is held out
(``code_tasks.eval.jsonl``; the others are ``code_tasks.train.jsonl``). The output is deterministic (same source, same bytes); the test suite checks that
the shipped file is up to date, that every reference solution passes all its tests, and
that a trivial wrong solution does not.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

from envs.io import save_tasks
from envs.types import CodeSpec, Message, Task

__all__ = ["TASKS", "SYSTEM_PROMPT", "OUT_FILE", "build_tasks", "split_files", "main"]

OUT_FILE = Path(__file__).resolve().parents[3] / "recipes" / "data" / "code_tasks.jsonl"
SOURCE = "jointrl"
SYSTEM_PROMPT = (
    "You are a careful Python programmer. Write correct, self-contained Python 3 code using only the "
    "standard library. Reply with the complete function in one ```python code block."
)
USER_TEMPLATE = (
    "Write a Python function `{signature}` that {description}\n\n"
    "Reply with the complete function in one ```python code block."
)

# (id, difficulty, signature, description, solution, tests)
TASKS: list[tuple[str, str, str, str, str, list[str]]] = [
    # ------------------------------------------------------------------ easy
    (
        "reverse_words",
        "easy",
        "reverse_words(s: str) -> str",
        "returns the words of `s` in reverse order, joined by single spaces (runs of whitespace separate words; "
        "leading and trailing whitespace is ignored). Example: reverse_words('  hello   world ') == 'world hello'.",
        "def reverse_words(s: str) -> str:\n    return ' '.join(reversed(s.split()))\n",
        [
            "assert reverse_words('hello world') == 'world hello'",
            "assert reverse_words('  a  b   c ') == 'c b a'",
            "assert reverse_words('single') == 'single'",
            "assert reverse_words('') == ''",
        ],
    ),
    (
        "count_vowels",
        "easy",
        "count_vowels(s: str) -> int",
        "returns how many vowels (a, e, i, o, u, in either case) `s` contains. Example: count_vowels('Hello') == 2.",
        "def count_vowels(s: str) -> int:\n    return sum(1 for c in s.lower() if c in 'aeiou')\n",
        [
            "assert count_vowels('Hello') == 2",
            "assert count_vowels('AEIOU aeiou') == 10",
            "assert count_vowels('rhythm') == 0",
            "assert count_vowels('Programming in Python') == 5",
        ],
    ),
    (
        "is_palindrome",
        "easy",
        "is_palindrome(s: str) -> bool",
        "returns True if `s` reads the same forwards and backwards when only its letters and digits are kept and "
        "case is ignored, else False. Example: is_palindrome('A man, a plan, a canal: Panama') is True.",
        "def is_palindrome(s: str) -> bool:\n    t = [c.lower() for c in s if c.isalnum()]\n    return t == t[::-1]\n",
        [
            "assert is_palindrome('A man, a plan, a canal: Panama') == True",
            "assert is_palindrome('racecar') == True",
            "assert is_palindrome('hello') == False",
            "assert is_palindrome('No lemon, no melon!') == True",
            "assert is_palindrome('ab') == False",
        ],
    ),
    (
        "fizzbuzz",
        "easy",
        "fizzbuzz(n: int) -> list[str]",
        "returns the FizzBuzz sequence for 1..n as strings: 'Fizz' for multiples of 3, 'Buzz' for multiples of 5, "
        "'FizzBuzz' for multiples of both, otherwise the number itself. fizzbuzz(0) == [].",
        "def fizzbuzz(n: int) -> list[str]:\n    out = []\n    for i in range(1, n + 1):\n"
        "        if i % 15 == 0:\n            out.append('FizzBuzz')\n        elif i % 3 == 0:\n"
        "            out.append('Fizz')\n        elif i % 5 == 0:\n            out.append('Buzz')\n"
        "        else:\n            out.append(str(i))\n    return out\n",
        [
            "assert fizzbuzz(5) == ['1', '2', 'Fizz', '4', 'Buzz']",
            "assert fizzbuzz(15)[-1] == 'FizzBuzz'",
            "assert fizzbuzz(0) == []",
            "assert len(fizzbuzz(100)) == 100",
        ],
    ),
    (
        "sum_of_evens",
        "easy",
        "sum_of_evens(nums: list[int]) -> int",
        "returns the sum of the even numbers in `nums` (0 for an empty list). Negative even numbers count too.",
        "def sum_of_evens(nums: list[int]) -> int:\n    return sum(x for x in nums if x % 2 == 0)\n",
        [
            "assert sum_of_evens([1, 2, 3, 4]) == 6",
            "assert sum_of_evens([]) == 0",
            "assert sum_of_evens([1, 3, 5]) == 0",
            "assert sum_of_evens([-2, -3, 10]) == 8",
        ],
    ),
    (
        "digit_sum",
        "easy",
        "digit_sum(n: int) -> int",
        "returns the sum of the decimal digits of `n`; the sign of a negative number is ignored. "
        "Example: digit_sum(-123) == 6.",
        "def digit_sum(n: int) -> int:\n    return sum(int(d) for d in str(abs(n)))\n",
        [
            "assert digit_sum(123) == 6",
            "assert digit_sum(-123) == 6",
            "assert digit_sum(0) == 0",
            "assert digit_sum(9999) == 36",
        ],
    ),
    (
        "second_largest",
        "easy",
        "second_largest(nums: list[int]) -> int | None",
        "returns the second largest DISTINCT value in `nums`, or None when there are fewer than two distinct "
        "values. Example: second_largest([3, 1, 3, 2]) == 2.",
        "def second_largest(nums: list[int]) -> int | None:\n    values = sorted(set(nums))\n"
        "    return values[-2] if len(values) >= 2 else None\n",
        [
            "assert second_largest([3, 1, 3, 2]) == 2",
            "assert second_largest([5, 5, 5]) is None",
            "assert second_largest([]) is None",
            "assert second_largest([-1, -7, -3]) == -3",
            "assert second_largest([10, 20]) == 10",
        ],
    ),
    (
        "capitalize_words",
        "easy",
        "capitalize_words(s: str) -> str",
        "returns `s` with the first character of every space-separated word upper-cased and the rest of the word "
        "lower-cased; the spaces are kept exactly as they are. Example: capitalize_words('hELLO  wORLD') == "
        "'Hello  World'.",
        "def capitalize_words(s: str) -> str:\n"
        "    return ' '.join(w[:1].upper() + w[1:].lower() for w in s.split(' '))\n",
        [
            "assert capitalize_words('hello world') == 'Hello World'",
            "assert capitalize_words('hELLO  wORLD') == 'Hello  World'",
            "assert capitalize_words('') == ''",
            "assert capitalize_words('a b c') == 'A B C'",
        ],
    ),
    (
        "word_frequencies",
        "easy",
        "word_frequencies(text: str) -> dict[str, int]",
        "returns how often each word occurs in `text`: words are separated by whitespace, compared in lower case, "
        "and the punctuation characters . , ! ? ; : are stripped from both ends of each word (a word that is "
        "empty after stripping is skipped). Example: word_frequencies('Hi, hi!') == {'hi': 2}.",
        "def word_frequencies(text: str) -> dict[str, int]:\n    counts: dict[str, int] = {}\n"
        "    for raw in text.split():\n        w = raw.strip('.,!?;:').lower()\n        if w:\n"
        "            counts[w] = counts.get(w, 0) + 1\n    return counts\n",
        [
            "assert word_frequencies('Hi, hi!') == {'hi': 2}",
            "assert word_frequencies('') == {}",
            "assert word_frequencies('The cat. The dog!') == {'the': 2, 'cat': 1, 'dog': 1}",
            "assert word_frequencies('a ... b') == {'a': 1, 'b': 1}",
        ],
    ),
    (
        "chunk",
        "easy",
        "chunk(items: list, size: int) -> list[list]",
        "splits `items` into consecutive chunks of length `size` (the last chunk may be shorter) and returns the "
        "list of chunks; it raises ValueError when `size` < 1. Example: chunk([1, 2, 3], 2) == [[1, 2], [3]].",
        "def chunk(items: list, size: int) -> list[list]:\n    if size < 1:\n"
        "        raise ValueError('size must be >= 1')\n"
        "    return [items[i:i + size] for i in range(0, len(items), size)]\n",
        [
            "assert chunk([1, 2, 3], 2) == [[1, 2], [3]]",
            "assert chunk([], 3) == []",
            "assert chunk([1, 2, 3, 4], 4) == [[1, 2, 3, 4]]",
            "try:\n    chunk([1], 0)\nexcept ValueError:\n    pass\nelse:\n    raise AssertionError('chunk(..., 0) must raise ValueError')",
        ],
    ),
    (
        "dedupe",
        "easy",
        "dedupe(items: list) -> list",
        "returns the items of `items` without duplicates, keeping the first occurrence of each and the original "
        "order. Example: dedupe([3, 1, 3, 2, 1]) == [3, 1, 2].",
        "def dedupe(items: list) -> list:\n    seen = set()\n    out = []\n    for x in items:\n"
        "        if x not in seen:\n            seen.add(x)\n            out.append(x)\n    return out\n",
        [
            "assert dedupe([3, 1, 3, 2, 1]) == [3, 1, 2]",
            "assert dedupe([]) == []",
            "assert dedupe(['a', 'b', 'a']) == ['a', 'b']",
            "assert dedupe([1, 1, 1]) == [1]",
        ],
    ),
    (
        "is_anagram",
        "easy",
        "is_anagram(a: str, b: str) -> bool",
        "returns True if `a` and `b` are anagrams of each other when case and spaces are ignored, else False. "
        "Example: is_anagram('Dormitory', 'dirty room') is True.",
        "def is_anagram(a: str, b: str) -> bool:\n    def norm(s):\n"
        "        return sorted(s.replace(' ', '').lower())\n    return norm(a) == norm(b)\n",
        [
            "assert is_anagram('Dormitory', 'dirty room') == True",
            "assert is_anagram('listen', 'silent') == True",
            "assert is_anagram('abc', 'abd') == False",
            "assert is_anagram('aab', 'abb') == False",
            "assert is_anagram('The eyes', 'They see') == True",
            "assert is_anagram('abc', 'abcc') == False",
        ],
    ),
    # ------------------------------------------------------------------ medium
    (
        "run_length_encode",
        "medium",
        "run_length_encode(s: str) -> str",
        "encodes `s` by replacing each run of the same character with the character followed by the run's "
        "length. Example: run_length_encode('aaabcc') == 'a3b1c2'; run_length_encode('') == ''.",
        "def run_length_encode(s: str) -> str:\n    out = []\n    i = 0\n    while i < len(s):\n"
        "        j = i\n        while j < len(s) and s[j] == s[i]:\n            j += 1\n"
        "        out.append(f'{s[i]}{j - i}')\n        i = j\n    return ''.join(out)\n",
        [
            "assert run_length_encode('aaabcc') == 'a3b1c2'",
            "assert run_length_encode('') == ''",
            "assert run_length_encode('abc') == 'a1b1c1'",
            "assert run_length_encode('zzzzzzzzzzzz') == 'z12'",
            "assert run_length_encode('abba') == 'a1b2a1'",
        ],
    ),
    (
        "run_length_decode",
        "medium",
        "run_length_decode(s: str) -> str",
        "decodes a run-length encoding made of a letter followed by its (possibly multi-digit) count, e.g. "
        "run_length_decode('a3b1c2') == 'aaabcc' and run_length_decode('x12') == 'x' * 12.",
        "def run_length_decode(s: str) -> str:\n    out = []\n    i = 0\n    while i < len(s):\n"
        "        ch = s[i]\n        j = i + 1\n        while j < len(s) and s[j].isdigit():\n            j += 1\n"
        "        out.append(ch * int(s[i + 1:j]))\n        i = j\n    return ''.join(out)\n",
        [
            "assert run_length_decode('a3b1c2') == 'aaabcc'",
            "assert run_length_decode('x12') == 'x' * 12",
            "assert run_length_decode('') == ''",
            "assert run_length_decode('a1b10a1') == 'a' + 'b' * 10 + 'a'",
            "assert run_length_decode('z2y3') == 'zzyyy'",
        ],
    ),
    (
        "roman_to_int",
        "medium",
        "roman_to_int(s: str) -> int",
        "converts a valid Roman numeral (I, V, X, L, C, D, M, with subtractive pairs such as IV and CM) to an "
        "integer. Example: roman_to_int('MCMXCIV') == 1994.",
        "def roman_to_int(s: str) -> int:\n"
        "    values = {'I': 1, 'V': 5, 'X': 10, 'L': 50, 'C': 100, 'D': 500, 'M': 1000}\n    total = 0\n"
        "    for i, c in enumerate(s):\n        v = values[c]\n"
        "        if i + 1 < len(s) and values[s[i + 1]] > v:\n            total -= v\n        else:\n"
        "            total += v\n    return total\n",
        [
            "assert roman_to_int('III') == 3",
            "assert roman_to_int('IV') == 4",
            "assert roman_to_int('MCMXCIV') == 1994",
            "assert roman_to_int('LVIII') == 58",
            "assert roman_to_int('MMXXIV') == 2024",
        ],
    ),
    (
        "int_to_roman",
        "medium",
        "int_to_roman(n: int) -> str",
        "converts an integer 1 <= n <= 3999 to its Roman numeral, using subtractive pairs (IV, IX, XL, XC, CD, "
        "CM). Example: int_to_roman(1994) == 'MCMXCIV'.",
        "def int_to_roman(n: int) -> str:\n"
        "    pairs = [(1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'),\n"
        "             (50, 'L'), (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')]\n"
        "    out = []\n    for value, sym in pairs:\n        while n >= value:\n            out.append(sym)\n"
        "            n -= value\n    return ''.join(out)\n",
        [
            "assert int_to_roman(3) == 'III'",
            "assert int_to_roman(4) == 'IV'",
            "assert int_to_roman(1994) == 'MCMXCIV'",
            "assert int_to_roman(3999) == 'MMMCMXCIX'",
            "assert int_to_roman(40) == 'XL'",
        ],
    ),
    (
        "merge_intervals",
        "medium",
        "merge_intervals(intervals: list[list[int]]) -> list[list[int]]",
        "merges overlapping closed intervals [start, end] (intervals that touch, like [1, 2] and [2, 3], overlap) "
        "and returns the merged intervals sorted by start. The input may be unsorted. Example: "
        "merge_intervals([[8, 10], [1, 3], [2, 6]]) == [[1, 6], [8, 10]].",
        "def merge_intervals(intervals: list[list[int]]) -> list[list[int]]:\n    out: list[list[int]] = []\n"
        "    for start, end in sorted(intervals):\n        if out and start <= out[-1][1]:\n"
        "            out[-1][1] = max(out[-1][1], end)\n        else:\n            out.append([start, end])\n"
        "    return out\n",
        [
            "assert merge_intervals([[8, 10], [1, 3], [2, 6]]) == [[1, 6], [8, 10]]",
            "assert merge_intervals([]) == []",
            "assert merge_intervals([[1, 2], [2, 3]]) == [[1, 3]]",
            "assert merge_intervals([[1, 10], [2, 3], [4, 5]]) == [[1, 10]]",
            "assert merge_intervals([[5, 6], [1, 2]]) == [[1, 2], [5, 6]]",
        ],
    ),
    (
        "group_anagrams",
        "medium",
        "group_anagrams(words: list[str]) -> list[list[str]]",
        "groups the words that are anagrams of each other (same letters, case-sensitive). Groups are ordered by "
        "the first appearance of their first word, and the words inside a group keep their input order. Example: "
        "group_anagrams(['eat', 'tea', 'tan', 'ate', 'nat']) == [['eat', 'tea', 'ate'], ['tan', 'nat']].",
        "def group_anagrams(words: list[str]) -> list[list[str]]:\n    groups: dict[str, list[str]] = {}\n"
        "    for w in words:\n        groups.setdefault(''.join(sorted(w)), []).append(w)\n"
        "    return list(groups.values())\n",
        [
            "assert group_anagrams(['eat', 'tea', 'tan', 'ate', 'nat']) == [['eat', 'tea', 'ate'], ['tan', 'nat']]",
            "assert group_anagrams([]) == []",
            "assert group_anagrams(['a']) == [['a']]",
            "assert group_anagrams(['ab', 'ba', 'abc', 'cab', 'b']) == [['ab', 'ba'], ['abc', 'cab'], ['b']]",
        ],
    ),
    (
        "two_sum",
        "medium",
        "two_sum(nums: list[int], target: int) -> tuple[int, int] | None",
        "returns indices (i, j) with i < j and nums[i] + nums[j] == target, choosing the pair with the smallest "
        "j and, for that j, the smallest i; it returns None when no pair exists. Example: "
        "two_sum([2, 7, 11, 15], 9) == (0, 1).",
        "def two_sum(nums: list[int], target: int) -> tuple[int, int] | None:\n    first: dict[int, int] = {}\n"
        "    for j, x in enumerate(nums):\n        if target - x in first:\n"
        "            return (first[target - x], j)\n        first.setdefault(x, j)\n    return None\n",
        [
            "assert two_sum([2, 7, 11, 15], 9) == (0, 1)",
            "assert two_sum([3, 2, 4], 6) == (1, 2)",
            "assert two_sum([1, 2, 3], 100) is None",
            "assert two_sum([3, 3, 3], 6) == (0, 1)",
            "assert two_sum([1, 5, 1, 5], 10) == (1, 3)",
        ],
    ),
    (
        "balanced_brackets",
        "medium",
        "balanced_brackets(s: str) -> bool",
        "returns True if the brackets (), [] and {} in `s` are balanced and properly nested, else False; all "
        "other characters are ignored. Example: balanced_brackets('f(a[1]) {}') is True.",
        "def balanced_brackets(s: str) -> bool:\n    pairs = {')': '(', ']': '[', '}': '{'}\n    stack = []\n"
        "    for c in s:\n        if c in '([{':\n            stack.append(c)\n        elif c in pairs:\n"
        "            if not stack or stack.pop() != pairs[c]:\n                return False\n"
        "    return not stack\n",
        [
            "assert balanced_brackets('f(a[1]) {}') == True",
            "assert balanced_brackets('([)]') == False",
            "assert balanced_brackets('') == True",
            "assert balanced_brackets('((') == False",
            "assert balanced_brackets('}{') == False",
            "assert balanced_brackets('[{()}]') == True",
            "assert balanced_brackets('a(b)c') == True",
        ],
    ),
    (
        "caesar_cipher",
        "medium",
        "caesar_cipher(text: str, shift: int) -> str",
        "shifts every ASCII letter of `text` by `shift` positions in the alphabet, wrapping around and keeping its "
        "case; other characters are unchanged. `shift` may be negative or larger than 26. Example: "
        "caesar_cipher('Hello, World!', 3) == 'Khoor, Zruog!'.",
        "def caesar_cipher(text: str, shift: int) -> str:\n    out = []\n    for c in text:\n"
        "        if 'a' <= c <= 'z':\n            out.append(chr((ord(c) - 97 + shift) % 26 + 97))\n"
        "        elif 'A' <= c <= 'Z':\n            out.append(chr((ord(c) - 65 + shift) % 26 + 65))\n"
        "        else:\n            out.append(c)\n    return ''.join(out)\n",
        [
            "assert caesar_cipher('Hello, World!', 3) == 'Khoor, Zruog!'",
            "assert caesar_cipher('abc', -1) == 'zab'",
            "assert caesar_cipher('xyz', 29) == 'abc'",
            "assert caesar_cipher('Khoor', -3) == 'Hello'",
            "assert caesar_cipher('', 5) == ''",
        ],
    ),
    (
        "parse_key_values",
        "medium",
        "parse_key_values(s: str) -> dict[str, str]",
        "parses a string of `key=value` pairs separated by ';' into a dict of strings. Whitespace around keys and "
        "values is removed, empty segments are skipped, a later key overrides an earlier one, and only the first "
        "'=' of a segment separates key from value. Example: parse_key_values(' a=1; b = two ;') == "
        "{'a': '1', 'b': 'two'}.",
        "def parse_key_values(s: str) -> dict[str, str]:\n    out: dict[str, str] = {}\n"
        "    for seg in s.split(';'):\n        if not seg.strip():\n            continue\n"
        "        key, _, value = seg.partition('=')\n        out[key.strip()] = value.strip()\n    return out\n",
        [
            "assert parse_key_values(' a=1; b = two ;') == {'a': '1', 'b': 'two'}",
            "assert parse_key_values('') == {}",
            "assert parse_key_values('x=1;x=2') == {'x': '2'}",
            "assert parse_key_values('url=a=b; k = v') == {'url': 'a=b', 'k': 'v'}",
        ],
    ),
    (
        "transpose",
        "medium",
        "transpose(matrix: list[list[int]]) -> list[list[int]]",
        "returns the transpose of a rectangular matrix given as a list of rows (an empty matrix gives []). "
        "Example: transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]].",
        "def transpose(matrix: list[list[int]]) -> list[list[int]]:\n    return [list(col) for col in zip(*matrix)]\n",
        [
            "assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]",
            "assert transpose([]) == []",
            "assert transpose([[7]]) == [[7]]",
            "assert transpose([[1], [2], [3]]) == [[1, 2, 3]]",
            "assert transpose([[1, 2], [3, 4]]) == [[1, 3], [2, 4]]",
        ],
    ),
    (
        "rotate_right",
        "medium",
        "rotate_right(items: list, k: int) -> list",
        "returns a new list with `items` rotated right by `k` positions; `k` may be larger than the length or "
        "negative (a left rotation), and an empty list stays empty. Example: rotate_right([1, 2, 3, 4, 5], 2) == "
        "[4, 5, 1, 2, 3].",
        "def rotate_right(items: list, k: int) -> list:\n    if not items:\n        return []\n"
        "    k %= len(items)\n    return items[-k:] + items[:-k] if k else list(items)\n",
        [
            "assert rotate_right([1, 2, 3, 4, 5], 2) == [4, 5, 1, 2, 3]",
            "assert rotate_right([1, 2, 3], 4) == [3, 1, 2]",
            "assert rotate_right([1, 2, 3], -1) == [2, 3, 1]",
            "assert rotate_right([], 3) == []",
            "assert rotate_right([1, 2], 0) == [1, 2]",
        ],
    ),
    (
        "primes_up_to",
        "medium",
        "primes_up_to(n: int) -> list[int]",
        "returns all prime numbers p with 2 <= p <= n in increasing order (an empty list when n < 2). "
        "Example: primes_up_to(10) == [2, 3, 5, 7].",
        "def primes_up_to(n: int) -> list[int]:\n    if n < 2:\n        return []\n    sieve = [True] * (n + 1)\n"
        "    sieve[0] = sieve[1] = False\n    for i in range(2, int(n ** 0.5) + 1):\n        if sieve[i]:\n"
        "            sieve[i * i::i] = [False] * len(range(i * i, n + 1, i))\n"
        "    return [i for i, p in enumerate(sieve) if p]\n",
        [
            "assert primes_up_to(10) == [2, 3, 5, 7]",
            "assert primes_up_to(1) == []",
            "assert primes_up_to(2) == [2]",
            "assert len(primes_up_to(1000)) == 168",
            "assert primes_up_to(30)[-1] == 29",
        ],
    ),
    (
        "lcm_of_list",
        "medium",
        "lcm_of_list(nums: list[int]) -> int",
        "returns the least common multiple of the positive integers in `nums` (1 for an empty list). "
        "Example: lcm_of_list([4, 6]) == 12.",
        "import math\n\n\ndef lcm_of_list(nums: list[int]) -> int:\n    result = 1\n    for x in nums:\n"
        "        result = result * x // math.gcd(result, x)\n    return result\n",
        [
            "assert lcm_of_list([4, 6]) == 12",
            "assert lcm_of_list([]) == 1",
            "assert lcm_of_list([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]) == 2520",
            "assert lcm_of_list([7]) == 7",
        ],
    ),
    (
        "first_index",
        "medium",
        "first_index(sorted_items: list[int], target: int) -> int",
        "returns the index of the FIRST occurrence of `target` in the ascending list `sorted_items`, or -1 if it "
        "is absent; it must use binary search (O(log n)). Example: first_index([1, 2, 2, 2, 3], 2) == 1.",
        "def first_index(sorted_items: list[int], target: int) -> int:\n    lo, hi = 0, len(sorted_items)\n"
        "    while lo < hi:\n        mid = (lo + hi) // 2\n        if sorted_items[mid] < target:\n"
        "            lo = mid + 1\n        else:\n            hi = mid\n"
        "    return lo if lo < len(sorted_items) and sorted_items[lo] == target else -1\n",
        [
            "assert first_index([1, 2, 2, 2, 3], 2) == 1",
            "assert first_index([1, 3, 5], 4) == -1",
            "assert first_index([], 1) == -1",
            "assert first_index(list(range(0, 20000, 2)), 19998) == 9999",
            "assert first_index([5, 5, 5], 5) == 0",
        ],
    ),
    (
        "flatten",
        "medium",
        "flatten(nested: list) -> list",
        "returns the elements of an arbitrarily nested list in order, with all list nesting removed (only `list` "
        "counts as nesting; strings and tuples are elements). Example: flatten([1, [2, [3, []]], 4]) == "
        "[1, 2, 3, 4].",
        "def flatten(nested: list) -> list:\n    out = []\n    for x in nested:\n        if isinstance(x, list):\n"
        "            out.extend(flatten(x))\n        else:\n            out.append(x)\n    return out\n",
        [
            "assert flatten([1, [2, [3, []]], 4]) == [1, 2, 3, 4]",
            "assert flatten([]) == []",
            "assert flatten([[[[]]]]) == []",
            "assert flatten(['ab', ('c', 'd'), ['e']]) == ['ab', ('c', 'd'), 'e']",
            "assert flatten([1, [2, 3], [[4]], 5]) == [1, 2, 3, 4, 5]",
        ],
    ),
    (
        "word_wrap",
        "medium",
        "word_wrap(text: str, width: int) -> list[str]",
        "wraps the whitespace-separated words of `text` into lines of at most `width` characters, greedily: each "
        "line takes as many words as fit, joined by single spaces. A word longer than `width` goes on a line of "
        "its own. Example: word_wrap('the quick brown fox', 10) == ['the quick', 'brown fox'].",
        "def word_wrap(text: str, width: int) -> list[str]:\n    lines: list[str] = []\n    current = ''\n"
        "    for word in text.split():\n        if not current:\n            current = word\n"
        "        elif len(current) + 1 + len(word) <= width:\n            current += ' ' + word\n        else:\n"
        "            lines.append(current)\n            current = word\n    if current:\n"
        "        lines.append(current)\n    return lines\n",
        [
            "assert word_wrap('the quick brown fox', 10) == ['the quick', 'brown fox']",
            "assert word_wrap('', 5) == []",
            "assert word_wrap('a b c d', 3) == ['a b', 'c d']",
            "assert word_wrap('extraordinary is long', 5) == ['extraordinary', 'is', 'long']",
        ],
    ),
    (
        "compress_ranges",
        "medium",
        "compress_ranges(nums: list[int]) -> str",
        "describes a sorted list of distinct integers as comma-separated ranges: a run of 2 or more consecutive "
        "numbers becomes 'start-end', a lone number stays as is. Example: compress_ranges([1, 2, 3, 5, 7, 8]) == "
        "'1-3,5,7-8'; compress_ranges([]) == ''.",
        "def compress_ranges(nums: list[int]) -> str:\n    parts = []\n    i = 0\n    while i < len(nums):\n"
        "        j = i\n        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:\n            j += 1\n"
        "        parts.append(str(nums[i]) if i == j else f'{nums[i]}-{nums[j]}')\n        i = j + 1\n"
        "    return ','.join(parts)\n",
        [
            "assert compress_ranges([1, 2, 3, 5, 7, 8]) == '1-3,5,7-8'",
            "assert compress_ranges([]) == ''",
            "assert compress_ranges([4]) == '4'",
            "assert compress_ranges([1, 3, 5]) == '1,3,5'",
            "assert compress_ranges([0, 1]) == '0-1'",
        ],
    ),
    (
        "deep_get",
        "medium",
        "deep_get(data: dict, path: str, default=None)",
        "looks up a dot-separated key path in nested dicts, e.g. deep_get({'a': {'b': 1}}, 'a.b') == 1, and "
        "returns `default` when a key is missing or an intermediate value is not a dict.",
        "def deep_get(data: dict, path: str, default=None):\n    cur = data\n    for key in path.split('.'):\n"
        "        if not isinstance(cur, dict) or key not in cur:\n            return default\n        cur = cur[key]\n"
        "    return cur\n",
        [
            "assert deep_get({'a': {'b': 1}}, 'a.b') == 1",
            "assert deep_get({'a': {'b': 1}}, 'a.c', 'missing') == 'missing'",
            "assert deep_get({'a': 5}, 'a.b', 0) == 0",
            "assert deep_get({'x': {'y': {'z': [1, 2]}}}, 'x.y.z') == [1, 2]",
            "assert deep_get({'a': {'b': 1}}, 'a') == {'b': 1}",
        ],
    ),
    (
        "count_islands",
        "medium",
        "count_islands(grid: list[str]) -> int",
        "counts the islands in a grid given as equal-length strings of '1' (land) and '0' (water); an island is "
        "a group of land cells connected horizontally or vertically. Example: count_islands(['110', '010', "
        "'001']) == 2.",
        "def count_islands(grid: list[str]) -> int:\n    seen = set()\n    count = 0\n"
        "    for r in range(len(grid)):\n        for c in range(len(grid[r])):\n"
        "            if grid[r][c] != '1' or (r, c) in seen:\n                continue\n            count += 1\n"
        "            stack = [(r, c)]\n            seen.add((r, c))\n            while stack:\n"
        "                y, x = stack.pop()\n                for dy, dx in ((1, 0), (-1, 0), (0, 1), (0, -1)):\n"
        "                    ny, nx = y + dy, x + dx\n"
        "                    if 0 <= ny < len(grid) and 0 <= nx < len(grid[ny]) and grid[ny][nx] == '1' \\\n"
        "                            and (ny, nx) not in seen:\n"
        "                        seen.add((ny, nx))\n                        stack.append((ny, nx))\n"
        "    return count\n",
        [
            "assert count_islands(['110', '010', '001']) == 2",
            "assert count_islands([]) == 0",
            "assert count_islands(['000']) == 0",
            "assert count_islands(['101', '010', '101']) == 5",
            "assert count_islands(['1' * 60] * 60) == 1",
        ],
    ),
    # ------------------------------------------------------------------ hard
    (
        "eval_rpn",
        "hard",
        "eval_rpn(tokens: list[str]) -> int",
        "evaluates an expression in reverse Polish notation with integer operands and the operators + - * /, "
        "where / divides integers truncating toward zero. Example: eval_rpn(['2', '1', '+', '3', '*']) == 9; "
        "eval_rpn(['7', '-2', '/']) == -3.",
        "def eval_rpn(tokens: list[str]) -> int:\n    stack: list[int] = []\n    for t in tokens:\n"
        "        if t in ('+', '-', '*', '/'):\n            b = stack.pop()\n            a = stack.pop()\n"
        "            if t == '+':\n                stack.append(a + b)\n            elif t == '-':\n"
        "                stack.append(a - b)\n            elif t == '*':\n                stack.append(a * b)\n"
        "            else:\n                q = abs(a) // abs(b)\n"
        "                stack.append(q if (a >= 0) == (b >= 0) else -q)\n        else:\n"
        "            stack.append(int(t))\n    return stack[-1]\n",
        [
            "assert eval_rpn(['2', '1', '+', '3', '*']) == 9",
            "assert eval_rpn(['4', '13', '5', '/', '+']) == 6",
            "assert eval_rpn(['7', '-2', '/']) == -3",
            "assert eval_rpn(['10', '6', '9', '3', '+', '-11', '*', '/', '*', '17', '+', '5', '+']) == 22",
            "assert eval_rpn(['42']) == 42",
        ],
    ),
    (
        "evaluate",
        "hard",
        "evaluate(expr: str) -> int",
        "evaluates an arithmetic expression over non-negative integer literals with +, -, *, parentheses and "
        "spaces, using the usual precedence (* before + and -, left to right otherwise). Do not use eval(). "
        "Example: evaluate('2 + 3 * (4 - 1)') == 11.",
        "def evaluate(expr: str) -> int:\n    s = expr.replace(' ', '')\n    pos = 0\n\n"
        "    def parse_sum() -> int:\n        nonlocal pos\n        value = parse_product()\n"
        "        while pos < len(s) and s[pos] in '+-':\n            op = s[pos]\n            pos += 1\n"
        "            rhs = parse_product()\n            value = value + rhs if op == '+' else value - rhs\n"
        "        return value\n\n    def parse_product() -> int:\n        nonlocal pos\n"
        "        value = parse_atom()\n        while pos < len(s) and s[pos] == '*':\n            pos += 1\n"
        "            value *= parse_atom()\n        return value\n\n    def parse_atom() -> int:\n"
        "        nonlocal pos\n        if s[pos] == '(':\n            pos += 1\n            value = parse_sum()\n"
        "            pos += 1  # ')'\n            return value\n        start = pos\n"
        "        while pos < len(s) and s[pos].isdigit():\n            pos += 1\n        return int(s[start:pos])\n\n"
        "    return parse_sum()\n",
        [
            "assert evaluate('2 + 3 * (4 - 1)') == 11",
            "assert evaluate('10 - 4 - 3') == 3",
            "assert evaluate('2*3*4') == 24",
            "assert evaluate('((7))') == 7",
            "assert evaluate('100 - (2 + 3) * 4 + 1') == 81",
        ],
    ),
    (
        "lcs_length",
        "hard",
        "lcs_length(a: str, b: str) -> int",
        "returns the length of the longest common subsequence of `a` and `b` (characters in order, not "
        "necessarily contiguous). Example: lcs_length('abcde', 'ace') == 3.",
        "def lcs_length(a: str, b: str) -> int:\n    prev = [0] * (len(b) + 1)\n    for x in a:\n"
        "        cur = [0]\n        for j, y in enumerate(b):\n"
        "            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))\n        prev = cur\n"
        "    return prev[-1]\n",
        [
            "assert lcs_length('abcde', 'ace') == 3",
            "assert lcs_length('abc', 'def') == 0",
            "assert lcs_length('', 'abc') == 0",
            "assert lcs_length('AGGTAB', 'GXTXAYB') == 4",
            "assert lcs_length('ab' * 300, 'ba' * 300) == 599",
        ],
    ),
    (
        "edit_distance",
        "hard",
        "edit_distance(a: str, b: str) -> int",
        "returns the Levenshtein distance between `a` and `b`: the minimum number of single-character "
        "insertions, deletions and substitutions that turn `a` into `b`. Example: edit_distance('kitten', "
        "'sitting') == 3.",
        "def edit_distance(a: str, b: str) -> int:\n    prev = list(range(len(b) + 1))\n"
        "    for i, x in enumerate(a, 1):\n        cur = [i]\n        for j, y in enumerate(b, 1):\n"
        "            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))\n        prev = cur\n"
        "    return prev[-1]\n",
        [
            "assert edit_distance('kitten', 'sitting') == 3",
            "assert edit_distance('', 'abc') == 3",
            "assert edit_distance('same', 'same') == 0",
            "assert edit_distance('flaw', 'lawn') == 2",
            "assert edit_distance('intention', 'execution') == 5",
        ],
    ),
    (
        "unique_permutations",
        "hard",
        "unique_permutations(s: str) -> list[str]",
        "returns all distinct permutations of the characters of `s`, sorted lexicographically, without "
        "duplicates even when `s` has repeated characters. Example: unique_permutations('aab') == "
        "['aab', 'aba', 'baa'].",
        "def unique_permutations(s: str) -> list[str]:\n    counts: dict[str, int] = {}\n    for c in s:\n"
        "        counts[c] = counts.get(c, 0) + 1\n    out: list[str] = []\n\n    def build(prefix: str) -> None:\n"
        "        if len(prefix) == len(s):\n            out.append(prefix)\n            return\n"
        "        for c in sorted(counts):\n            if counts[c]:\n                counts[c] -= 1\n"
        "                build(prefix + c)\n                counts[c] += 1\n\n    build('')\n    return out\n",
        [
            "assert unique_permutations('aab') == ['aab', 'aba', 'baa']",
            "assert unique_permutations('abc') == ['abc', 'acb', 'bac', 'bca', 'cab', 'cba']",
            "assert unique_permutations('') == ['']",
            "assert len(unique_permutations('aabbcc')) == 90",
            "assert unique_permutations('zz') == ['zz']",
        ],
    ),
    (
        "n_queens",
        "hard",
        "n_queens(n: int) -> int",
        "returns the number of ways to place `n` queens on an n x n chessboard so that no two attack each other. "
        "Example: n_queens(4) == 2, n_queens(8) == 92.",
        "def n_queens(n: int) -> int:\n    def place(row: int, cols: int, d1: int, d2: int) -> int:\n"
        "        if row == n:\n            return 1\n        total = 0\n        for c in range(n):\n"
        "            if cols >> c & 1 or d1 >> (row + c) & 1 or d2 >> (row - c + n) & 1:\n                continue\n"
        "            total += place(row + 1, cols | 1 << c, d1 | 1 << (row + c), d2 | 1 << (row - c + n))\n"
        "        return total\n\n    return place(0, 0, 0, 0)\n",
        [
            "assert n_queens(1) == 1",
            "assert n_queens(2) == 0",
            "assert n_queens(4) == 2",
            "assert n_queens(6) == 4",
            "assert n_queens(8) == 92",
        ],
    ),
    (
        "coin_change",
        "hard",
        "coin_change(coins: list[int], amount: int) -> int",
        "returns the fewest coins (each denomination in `coins` may be used any number of times) that add up to "
        "`amount`, or -1 if it cannot be made; coin_change(coins, 0) == 0. Example: coin_change([1, 2, 5], 11) "
        "== 3.",
        "def coin_change(coins: list[int], amount: int) -> int:\n    inf = amount + 1\n"
        "    best = [0] + [inf] * amount\n    for a in range(1, amount + 1):\n        for c in coins:\n"
        "            if c <= a and best[a - c] + 1 < best[a]:\n                best[a] = best[a - c] + 1\n"
        "    return best[amount] if best[amount] <= amount else -1\n",
        [
            "assert coin_change([1, 2, 5], 11) == 3",
            "assert coin_change([2], 3) == -1",
            "assert coin_change([7], 0) == 0",
            "assert coin_change([1, 3, 4], 6) == 2",
            "assert coin_change([186, 419, 83, 408], 6249) == 20",
        ],
    ),
    (
        "lis_length",
        "hard",
        "lis_length(nums: list[int]) -> int",
        "returns the length of the longest strictly increasing subsequence of `nums` in O(n log n) time. "
        "Example: lis_length([10, 9, 2, 5, 3, 7, 101, 18]) == 4.",
        "import bisect\n\n\ndef lis_length(nums: list[int]) -> int:\n    tails: list[int] = []\n"
        "    for x in nums:\n        i = bisect.bisect_left(tails, x)\n        if i == len(tails):\n"
        "            tails.append(x)\n        else:\n            tails[i] = x\n    return len(tails)\n",
        [
            "assert lis_length([10, 9, 2, 5, 3, 7, 101, 18]) == 4",
            "assert lis_length([]) == 0",
            "assert lis_length([7, 7, 7]) == 1",
            "assert lis_length([0, 1, 0, 3, 2, 3]) == 4",
            "assert lis_length(list(range(200000))) == 200000",
        ],
    ),
    (
        "topo_order",
        "hard",
        "topo_order(deps: dict[str, list[str]]) -> list[str]",
        "returns an order of all tasks such that every task comes after all of its prerequisites: `deps` maps a "
        "task to the list of tasks it depends on, and tasks that only appear as prerequisites are included too. "
        "Among the tasks that are ready at any point, the alphabetically smallest comes first. It raises "
        "ValueError if the dependencies contain a cycle. Example: topo_order({'b': ['a'], 'c': ['a']}) == "
        "['a', 'b', 'c'].",
        "import heapq\n\n\ndef topo_order(deps: dict[str, list[str]]) -> list[str]:\n"
        "    nodes = set(deps)\n    for pre in deps.values():\n        nodes.update(pre)\n"
        "    indeg = {n: 0 for n in nodes}\n    users: dict[str, list[str]] = {n: [] for n in nodes}\n"
        "    for task, pre in deps.items():\n        for p in set(pre):\n            indeg[task] += 1\n"
        "            users[p].append(task)\n    ready = [n for n in nodes if indeg[n] == 0]\n"
        "    heapq.heapify(ready)\n    out = []\n    while ready:\n        n = heapq.heappop(ready)\n"
        "        out.append(n)\n        for u in users[n]:\n            indeg[u] -= 1\n"
        "            if indeg[u] == 0:\n                heapq.heappush(ready, u)\n"
        "    if len(out) != len(nodes):\n        raise ValueError('cycle')\n    return out\n",
        [
            "assert topo_order({'b': ['a'], 'c': ['a']}) == ['a', 'b', 'c']",
            "assert topo_order({'deploy': ['test', 'build'], 'test': ['build'], 'build': []}) == "
            "['build', 'test', 'deploy']",
            "assert topo_order({}) == []",
            "assert topo_order({'z': [], 'a': ['z'], 'm': []}) == ['m', 'z', 'a']",
            "try:\n    topo_order({'a': ['b'], 'b': ['a']})\nexcept ValueError:\n    pass\nelse:\n"
            "    raise AssertionError('a cycle must raise ValueError')",
        ],
    ),
    (
        "parse_csv_line",
        "hard",
        "parse_csv_line(line: str) -> list[str]",
        "splits one CSV line into its fields: fields are separated by commas; a field may be enclosed in double "
        'quotes, and then may contain commas, and a doubled quote "" inside it stands for one quote character. '
        "Do not use the csv module. Example: parse_csv_line('a,\"b,c\",d') == ['a', 'b,c', 'd'].",
        "def parse_csv_line(line: str) -> list[str]:\n    fields: list[str] = []\n    cur: list[str] = []\n"
        "    i = 0\n    quoted = False\n    while i < len(line):\n        c = line[i]\n        if quoted:\n"
        "            if c == '\"':\n                if i + 1 < len(line) and line[i + 1] == '\"':\n"
        "                    cur.append('\"')\n                    i += 1\n                else:\n"
        "                    quoted = False\n            else:\n                cur.append(c)\n"
        "        elif c == '\"':\n            quoted = True\n        elif c == ',':\n"
        "            fields.append(''.join(cur))\n            cur = []\n        else:\n            cur.append(c)\n"
        "        i += 1\n    fields.append(''.join(cur))\n    return fields\n",
        [
            "assert parse_csv_line('a,\"b,c\",d') == ['a', 'b,c', 'd']",
            "assert parse_csv_line('') == ['']",
            "assert parse_csv_line('x,,y') == ['x', '', 'y']",
            'assert parse_csv_line(\'"say ""hi""",2\') == [\'say "hi"\', \'2\']',
            "assert parse_csv_line('1,2,') == ['1', '2', '']",
        ],
    ),
    (
        "decode_repeats",
        "hard",
        "decode_repeats(s: str) -> str",
        "decodes strings where `k[...]` means the bracketed part repeated k times (k is a positive integer, "
        "brackets may nest, and letters outside brackets are copied). Example: decode_repeats('3[a2[c]]') == "
        "'accaccacc'; decode_repeats('2[ab]c') == 'ababc'.",
        "def decode_repeats(s: str) -> str:\n    stack: list[tuple[str, int]] = []\n    cur = ''\n    num = 0\n"
        "    for c in s:\n        if c.isdigit():\n            num = num * 10 + int(c)\n        elif c == '[':\n"
        "            stack.append((cur, num))\n            cur, num = '', 0\n        elif c == ']':\n"
        "            prev, k = stack.pop()\n            cur = prev + cur * k\n        else:\n            cur += c\n"
        "    return cur\n",
        [
            "assert decode_repeats('3[a2[c]]') == 'accaccacc'",
            "assert decode_repeats('2[ab]c') == 'ababc'",
            "assert decode_repeats('abc') == 'abc'",
            "assert decode_repeats('10[x]') == 'x' * 10",
            "assert decode_repeats('2[a]2[b3[c]]') == 'aabcccbccc'",
        ],
    ),
    (
        "spiral_order",
        "hard",
        "spiral_order(matrix: list[list[int]]) -> list[int]",
        "returns the elements of a rectangular matrix in clockwise spiral order, starting at the top-left "
        "corner. Example: spiral_order([[1, 2, 3], [4, 5, 6], [7, 8, 9]]) == [1, 2, 3, 6, 9, 8, 7, 4, 5].",
        "def spiral_order(matrix: list[list[int]]) -> list[int]:\n    out: list[int] = []\n"
        "    m = [list(row) for row in matrix]\n    while m:\n        out.extend(m.pop(0))\n"
        "        m = [list(r) for r in zip(*m)][::-1]\n    return out\n",
        [
            "assert spiral_order([[1, 2, 3], [4, 5, 6], [7, 8, 9]]) == [1, 2, 3, 6, 9, 8, 7, 4, 5]",
            "assert spiral_order([]) == []",
            "assert spiral_order([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]) == "
            "[1, 2, 3, 4, 8, 12, 11, 10, 9, 5, 6, 7]",
            "assert spiral_order([[1], [2], [3]]) == [1, 2, 3]",
        ],
    ),
    (
        "longest_palindrome",
        "hard",
        "longest_palindrome(s: str) -> str",
        "returns the longest contiguous substring of `s` that is a palindrome (case-sensitive); when several "
        "have the maximum length, the one that starts first. Example: longest_palindrome('babad') == 'bab'.",
        "def longest_palindrome(s: str) -> str:\n    best = s[:1]\n    for center in range(len(s)):\n"
        "        for lo, hi in ((center, center), (center, center + 1)):\n"
        "            while lo >= 0 and hi < len(s) and s[lo] == s[hi]:\n                lo -= 1\n"
        "                hi += 1\n            lo += 1\n"
        "            if hi - lo > len(best) or (hi - lo == len(best) and lo < s.find(best)):\n"
        "                best = s[lo:hi]\n    return best\n",
        [
            "assert longest_palindrome('babad') == 'bab'",
            "assert longest_palindrome('cbbd') == 'bb'",
            "assert longest_palindrome('') == ''",
            "assert longest_palindrome('abc') == 'a'",
            "assert longest_palindrome('forgeeksskeegfor') == 'geeksskeeg'",
        ],
    ),
    (
        "simplify_path",
        "hard",
        "simplify_path(path: str) -> str",
        "simplifies an absolute Unix path: repeated slashes count as one, '.' segments are dropped, '..' goes up "
        "one directory (never above '/'), and the result has no trailing slash except for the root '/'. "
        "Example: simplify_path('/a/./b/../../c/') == '/c'.",
        "def simplify_path(path: str) -> str:\n    parts: list[str] = []\n    for seg in path.split('/'):\n"
        "        if seg in ('', '.'):\n            continue\n        if seg == '..':\n            if parts:\n"
        "                parts.pop()\n        else:\n            parts.append(seg)\n    return '/' + '/'.join(parts)\n",
        [
            "assert simplify_path('/a/./b/../../c/') == '/c'",
            "assert simplify_path('/../') == '/'",
            "assert simplify_path('/home//foo/') == '/home/foo'",
            "assert simplify_path('/a/b/c/../..') == '/a'",
            "assert simplify_path('/...') == '/...'",
        ],
    ),
    (
        "shortest_path",
        "hard",
        "shortest_path(graph: dict[str, dict[str, int]], start: str, goal: str) -> int",
        "returns the length of the shortest path from `start` to `goal` in a directed graph with non-negative "
        "edge weights, where graph[u][v] is the weight of edge u -> v; it returns -1 if `goal` cannot be reached "
        "(and 0 when start == goal). Example: shortest_path({'a': {'b': 1, 'c': 4}, 'b': {'c': 2}}, 'a', 'c') "
        "== 3.",
        "import heapq\n\n\ndef shortest_path(graph: dict[str, dict[str, int]], start: str, goal: str) -> int:\n"
        "    dist = {start: 0}\n    heap = [(0, start)]\n    while heap:\n        d, u = heapq.heappop(heap)\n"
        "        if u == goal:\n            return d\n        if d > dist.get(u, d):\n            continue\n"
        "        for v, w in graph.get(u, {}).items():\n            nd = d + w\n"
        "            if nd < dist.get(v, nd + 1):\n                dist[v] = nd\n"
        "                heapq.heappush(heap, (nd, v))\n    return -1\n",
        [
            "assert shortest_path({'a': {'b': 1, 'c': 4}, 'b': {'c': 2}}, 'a', 'c') == 3",
            "assert shortest_path({'a': {'b': 1}}, 'b', 'a') == -1",
            "assert shortest_path({}, 'x', 'x') == 0",
            "assert shortest_path({'s': {'a': 7, 'b': 2}, 'b': {'a': 3, 'c': 9}, 'a': {'c': 1}}, 's', 'c') == 6",
        ],
    ),
]


def _shown(test: str, prompt: str) -> bool:
    """Whether ``test`` checks a call the prompt shows (its example): ``assert CALL == ...``,
    ``assert CALL is ...`` or ``assert CALL`` where the text of ``CALL`` is in the prompt."""
    node = ast.parse(test).body[0]
    if not isinstance(node, ast.Assert):
        return False
    call = node.test.left if isinstance(node.test, ast.Compare) else node.test
    return isinstance(call, ast.Call) and ast.get_source_segment(test, call) in prompt


def build_tasks() -> list[Task]:
    """The tasks of :data:`TASKS` as :class:`Task` objects (ids ``code-000-<name>``...).

    A test of a call the description shows (its example) is PUBLIC (``CodeSpec.public_tests``:
    quoted in feedback, never scored); the others are the hidden, scored tests.
    """
    tasks = []
    for k, (name, difficulty, signature, description, solution, tests) in enumerate(TASKS):
        user = USER_TEMPLATE.format(signature=signature, description=description)
        public = [t for t in tests if _shown(t, user)]
        hidden = [t for t in tests if t not in public]
        spec = CodeSpec(
            tests="\n".join(hidden) + "\n",
            entry_point=name,
            style="assert",
            solution=solution,
            public_tests="\n".join(public) + "\n" if public else "",
        )
        tasks.append(
            Task(
                id=f"code-{k:03d}-{name}",
                domain="code",
                messages=(Message("system", SYSTEM_PROMPT), Message("user", user)),
                code=spec,
                meta={"difficulty": difficulty, "source": SOURCE},
            )
        )
    return tasks


def split_files(tasks: list[Task], out: Path) -> tuple[Path, Path]:
    """Write ``<out stem>.train.jsonl`` and ``<out stem>.eval.jsonl`` beside ``out``: every
    fourth task (positions 3, 7, 11...) is held out."""
    stem = out.name.removesuffix(".jsonl")
    train, held = out.with_name(f"{stem}.train.jsonl"), out.with_name(f"{stem}.eval.jsonl")
    save_tasks([t for k, t in enumerate(tasks) if k % 4 != 3], train)
    save_tasks([t for k, t in enumerate(tasks) if k % 4 == 3], held)
    return train, held


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(OUT_FILE), help="output .jsonl (default: %(default)s)")
    args = parser.parse_args(argv)
    tasks = build_tasks()
    save_tasks(tasks, args.out)
    train, held = split_files(tasks, Path(args.out))
    print(f"wrote {len(tasks)} tasks to {args.out} (split: {train}, {held})")


if __name__ == "__main__":
    main()
