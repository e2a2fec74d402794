"""Generated terminal tasks: a seeded ladder of shell chores, near-trivial to multi-part.

    python -m rl.data.tasks.terminal_gen [--out-dir recipes/data] [--seed 0]

writes ``terminal_ladder.train.jsonl`` and ``terminal_ladder.eval.jsonl`` (held out BY
TEMPLATE, see :mod:`rl.data.tasks.ladder`). Same seed, same bytes.

Rungs: 0 = one file-system action named in the prompt (create a file, write a given line or
number); 1 = one command over a given file (count its lines or characters, copy it, join two,
take its first line); 2 = a filter into a new file (the lines holding a word, sorted lines, the
first k lines); 3 = several parts (make a directory, move files into it, write how many), scored
with partial credit. The first turn is pre-started by rung (``Task.prefill``, the same rule for
train and eval templates, :func:`prefill_for`): rungs 0-1 with the opening ```` ```bash ````
fence AND the reference command up to its last word (``touch``, ``echo 'a line' >``,
``wc -l < notes_4.txt >``, ``cp notes_4.txt``: the name of the file to create, which the
request gives, is left), rung 2 the command word and its leading flags
(``grep -w``, ``head -n``), rung 3 the fence only. Every pre-start is a prefix of the reference
solution's first turn and alone scores 0.0. The system prompt is the ladder's own
(:data:`SYSTEM_PROMPT`): the reply format shown by one worked example of a chore that is no
template of either split, with the shape of the low rungs' answers (an input file, a command,
``>`` an output file).

Checks use the existing schema (:class:`envs.types.TerminalSpec`): a check is a list of
sub-checks of equal weight; it exits 0 when all pass, else prints ``FAIL: <why>`` per
failed sub-check and the passed fraction on its last line and exits 1, which
:class:`envs.terminal.TerminalEnv` turns into that fraction as the reward. Expected
values are computed here and embedded in the check (not read from files the policy may
edit). Every sub-check needs a change the task asks for, so doing nothing scores 0.0 (the
test suite runs every reference solution and a no-op through the real env). Setups and
checks use coreutils, grep, sed, awk, tar and gzip only; texts are lowercase ASCII words
so that ``sort`` agrees with Python's order in any locale the sandbox has.
"""

from __future__ import annotations

import dataclasses
import random
import shlex
from collections.abc import Callable
from pathlib import Path

from envs.terminal import DONE_MARKER
from envs.types import Message, Task, TerminalSpec
from rl.data.tasks.ladder import N_EVAL, N_TRAIN, Template, generate_split, ladder_main, write_ladder
from rl.data.tasks.terminal_tasks import is_file

__all__ = ["SOURCE", "SYSTEM_PROMPT", "TEMPLATES", "generate", "write", "main", "partial_check", "prefill_for"]

SOURCE = "terminal_ladder"
FENCE = "```bash\n"
# The ladder's system prompt. envs.terminal.SYSTEM_PROMPT states the protocol as rules; sampled on
# it, SmolLM2-135M wrote comments, prose and empty fences after the pre-started fence and never a
# command (bench/RESULTS.md, "Task ladders: measured difficulty"). A 135M model imitates an
# example far better than it follows rules, so here the format is shown by ONE worked episode: a fixed chore that is
# no template of either split (copying it never pays), its one-line command in a fence, the
# observation the env answers (envs.terminal: "exit code N" then the output) and the done marker.
# The example has the shape of the low rungs' answers: an input file the request names, a
# command, and `>` into the output file the request names, with names whose extensions are not
# .txt. The earlier example (`pwd > where.txt`, no input file) left the model writing `.txt` for a
# `.cfg` name, leaving out the `> file` redirect and swapping input and output (its samples are
# read back in the same section).
SYSTEM_PROMPT = "\n".join(
    [
        "You are in a Linux terminal (bash), in your work directory. Reply with ONE shell command in a "
        f"```bash block; you then see its exit code and output. When the task is done, reply {DONE_MARKER}.",
        "",
        "Example:",
        "User: Write the lines of the file `colors.md` in reverse order into a new file named `reversed.cfg`.",
        "Assistant:",
        "```bash",
        "tac colors.md > reversed.cfg",
        "```",
        "User: exit code 0",
        f"Assistant: {DONE_MARKER}",
    ]
)
sq = shlex.quote
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
    "garden",
    "rocket",
    "violet",
    "copper",
    "meadow",
    "harbor",
    "pepper",
    "falcon",
]
STEMS = ["notes", "report", "todo", "data", "draft", "summary", "log", "ideas", "plan", "list", "config", "readme"]
EXTS = ["txt", "md", "csv", "cfg"]


def put(path: str, content: str) -> str:
    """Bash that writes ``content`` exactly to ``path``."""
    return f"printf '%s' {sq(content)} > {sq(path)}"


def partial_check(subchecks: list[tuple[str, str]]) -> str:
    """A check of equal-weight sub-checks ``(bash condition, why it failed)``: exit 0 when all
    hold, else one ``FAIL:`` line per failed one and the passed fraction as the last line."""
    lines = ["s=0"]
    for cond, why in subchecks:
        lines.append(f"if {cond}; then s=$((s+1)); else echo {sq('FAIL: ' + why)}; fi")
    n = len(subchecks)
    lines += [
        f'if [ "$s" -eq {n} ]; then echo OK; exit 0; fi',
        f'awk -v s="$s" \'BEGIN {{ printf "%.4f\\n", s / {n} }}\'',
        "exit 1",
    ]
    return "\n".join(lines)


def holds(path: str, text: str) -> str:
    """Condition: ``path`` is a regular file (:func:`is_file`) whose content is ``text``
    (trailing newlines ignored on both sides)."""
    return f'{{ {is_file(path)} && [ "$(cat {sq(path)})" = {sq(text.rstrip(chr(10)))} ]; }}'


def value(path: str, v: str) -> str:
    """Condition: ``path`` (a regular file, :func:`is_file`) holds ``v`` once whitespace is removed."""
    return f"{{ {is_file(path)} && [ \"$(tr -d '[:space:]' < {sq(path)})\" = {sq(v)} ]; }}"


def _task(instruction: str, setup: str, subchecks: list[tuple[str, str]], solution: str) -> Task:
    return Task(
        id="",
        domain="terminal",
        messages=(Message("system", SYSTEM_PROMPT), Message("user", instruction)),
        terminal=TerminalSpec(
            setup=setup or "true", check=partial_check(subchecks), solution=solution, time_limit_s=60.0
        ),
    )


def _fname(rng: random.Random, ext: str | None = None) -> str:
    return f"{rng.choice(STEMS)}_{rng.randint(1, 99)}.{ext or rng.choice(EXTS)}"


def _lines(rng: random.Random, n: int, per_line: tuple[int, int] = (1, 4)) -> list[str]:
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(*per_line))) for _ in range(n)]


def _text(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)


# ------------------------------------------------------------------------ rung 0


def _touch_file(rng: random.Random) -> Task:
    name = _fname(rng)
    task = _task(
        f"Create an empty file named `{name}`.",
        "",
        [(f"{{ {is_file(name)} && [ ! -s {sq(name)} ]; }}", f"{name} is missing or not empty")],
        f"touch {sq(name)}",
    )
    # `jointrl audit`'s named_files_empty writes an empty file into every path the prompt names, and
    # forge_hash_refs empties (so creates) every named file: here that is the task itself, so the task
    # declares both (docs/audit.md, "A task's declared work").
    why = "the task is to create an empty file at the one path the prompt names; {} is that work"
    declared = {name: why.format(f"creating it empty ({name})") for name in ("named_files_empty", "forge_hash_refs")}
    return dataclasses.replace(task, meta={"audit_does_the_work": declared})


def _write_line(rng: random.Random) -> Task:
    name, line = _fname(rng, "txt"), " ".join(rng.sample(WORDS, rng.randint(1, 3)))
    return _task(
        f"Create a file named `{name}` that contains exactly this line: {line}",
        "",
        [(holds(name, line), f"{name} does not hold the line")],
        f"echo {sq(line)} > {sq(name)}",
    )


def _write_number(rng: random.Random) -> Task:
    name, n = _fname(rng), rng.randint(2, 999)
    return _task(
        f"Write the number {n} into a new file named `{name}`.",
        "",
        [(value(name, str(n)), f"{name} does not hold the number")],
        f"echo {n} > {sq(name)}",
    )


def _make_dir(rng: random.Random) -> Task:
    name = f"{rng.choice(WORDS)}_{rng.randint(1, 99)}"
    return _task(
        f"Create a directory named `{name}`.",
        "",
        [(f"{{ [ -d {sq(name)} ] && [ ! -L {sq(name)} ]; }}", f"{name} is not a directory")],
        f"mkdir {sq(name)}",
    )


def _delete_file(rng: random.Random) -> Task:
    name, keep = _fname(rng), f"keep_{rng.randint(1, 99)}.txt"
    setup = "\n".join([put(name, _text(_lines(rng, 3))), put(keep, "keep me\n")])
    return _task(
        f"Delete the file `{name}` (leave every other file alone).",
        setup,
        [(f"{{ [ ! -e {sq(name)} ] && [ -f {sq(keep)} ]; }}", f"{name} still exists or {keep} was removed")],
        f"rm {sq(name)}",
    )


# ------------------------------------------------------------------------ rung 1


def _count_lines(rng: random.Random) -> Task:
    src, n = _fname(rng, "txt"), rng.randint(3, 25)
    return _task(
        f"Write the number of lines of the file `{src}` into a new file named `count.txt`.",
        put(src, _text(_lines(rng, n))),
        [(value("count.txt", str(n)), "count.txt does not hold the count")],
        f"wc -l < {sq(src)} > count.txt",
    )


def _copy_file(rng: random.Random) -> Task:
    src = _fname(rng)
    dst = f"{src.split('.')[0]}_copy.{src.split('.')[1]}"
    body = _text(_lines(rng, rng.randint(2, 6)))
    return _task(
        f"Copy the file `{src}` to `{dst}`.",
        put(src, body),
        [(f"{{ {holds(dst, body)} && {holds(src, body)}; }}", f"{dst} is not a copy of {src}")],
        f"cp {sq(src)} {sq(dst)}",
    )


def _first_line(rng: random.Random) -> Task:
    src, lines = _fname(rng, "txt"), _lines(rng, rng.randint(3, 8))
    return _task(
        f"Write the first line of the file `{src}` into a new file named `first.txt`.",
        put(src, _text(lines)),
        [(holds("first.txt", lines[0]), "first.txt does not hold the first line")],
        f"head -n 1 {sq(src)} > first.txt",
    )


def _count_chars(rng: random.Random) -> Task:
    src, body = _fname(rng, "txt"), _text(_lines(rng, rng.randint(2, 6)))
    return _task(
        f"Write the number of characters of the file `{src}` into a new file named `size.txt`.",
        put(src, body),
        [(value("size.txt", str(len(body))), "size.txt does not hold the character count")],
        f"wc -c < {sq(src)} > size.txt",
    )


def _join_files(rng: random.Random) -> Task:
    a = _fname(rng, "txt")
    b = _fname(rng, "txt")
    while b == a:
        b = _fname(rng, "txt")
    body_a, body_b = _text(_lines(rng, rng.randint(1, 3))), _text(_lines(rng, rng.randint(1, 3)))
    return _task(
        f"Write the contents of `{a}` followed by the contents of `{b}` into a new file named `both.txt`.",
        "\n".join([put(a, body_a), put(b, body_b)]),
        [(holds("both.txt", body_a + body_b), f"both.txt is not {a} followed by {b}")],
        f"cat {sq(a)} {sq(b)} > both.txt",
    )


def _count_words(rng: random.Random) -> Task:
    src, lines = _fname(rng, "txt"), _lines(rng, rng.randint(2, 6))
    n = sum(len(line.split()) for line in lines)
    return _task(
        f"Write the number of words in the file `{src}` into a new file named `words.txt`.",
        put(src, _text(lines)),
        [(value("words.txt", str(n)), "words.txt does not hold the word count")],
        f"wc -w < {sq(src)} > words.txt",
    )


def _rename_file(rng: random.Random) -> Task:
    src = _fname(rng)
    dst = f"{rng.choice(WORDS)}.{src.split('.')[1]}"
    body = _text(_lines(rng, rng.randint(2, 5)))
    return _task(
        f"Rename the file `{src}` to `{dst}`.",
        put(src, body),
        [(f"{{ [ ! -e {sq(src)} ] && {holds(dst, body)}; }}", f"{src} was not renamed to {dst}")],
        f"mv {sq(src)} {sq(dst)}",
    )


def _last_line(rng: random.Random) -> Task:
    src, lines = _fname(rng, "txt"), _lines(rng, rng.randint(3, 8))
    return _task(
        f"Write the last line of the file `{src}` into a new file named `last.txt`.",
        put(src, _text(lines)),
        [(holds("last.txt", lines[-1]), "last.txt does not hold the last line")],
        f"tail -n 1 {sq(src)} > last.txt",
    )


# ------------------------------------------------------------------------ rung 2


def _lines_with(rng: random.Random, n: int) -> tuple[str, list[str]]:
    """A word and ``n`` lines, some (at least one, not all) of which contain it."""
    word = rng.choice(WORDS)
    others = [w for w in WORDS if w != word]
    lines = [" ".join(rng.choice(others) for _ in range(rng.randint(1, 3))) for _ in range(n)]
    for i in rng.sample(range(n), rng.randint(1, n - 1)):
        parts = lines[i].split()
        parts.insert(rng.randint(0, len(parts)), word)
        lines[i] = " ".join(parts)
    return word, lines


def _grep_word(rng: random.Random) -> Task:
    src = _fname(rng, "txt")
    word, lines = _lines_with(rng, rng.randint(4, 10))
    want = [line for line in lines if word in line.split()]
    return _task(
        f"Write every line of `{src}` that contains the word `{word}` into a new file named `matches.txt`, "
        f"in their original order.",
        put(src, _text(lines)),
        [(holds("matches.txt", _text(want)), "matches.txt does not hold exactly the matching lines")],
        f"grep -w {sq(word)} {sq(src)} > matches.txt",
    )


def _sort_lines(rng: random.Random) -> Task:
    src, words = _fname(rng, "txt"), rng.sample(WORDS, rng.randint(4, 9))
    return _task(
        f"Sort the lines of `{src}` alphabetically and write the result into a new file named `sorted.txt`.",
        put(src, _text(words)),
        [(holds("sorted.txt", _text(sorted(words))), "sorted.txt is not the sorted lines")],
        f"sort {sq(src)} > sorted.txt",
    )


def _head_n(rng: random.Random) -> Task:
    src, lines = _fname(rng, "txt"), _lines(rng, rng.randint(6, 12))
    k = rng.randint(2, 5)
    return _task(
        f"Write the first {k} lines of `{src}` into a new file named `top.txt`.",
        put(src, _text(lines)),
        [(holds("top.txt", _text(lines[:k])), f"top.txt does not hold the first {k} lines")],
        f"head -n {k} {sq(src)} > top.txt",
    )


def _count_matching(rng: random.Random) -> Task:
    src = _fname(rng, "txt")
    word, lines = _lines_with(rng, rng.randint(4, 12))
    n = sum(word in line.split() for line in lines)
    if n == 1:
        # An answer of 1 is a constant a work-free reply guesses (`jointrl audit`'s named_files_1): the word goes
        # into the first line without it too. No draw from rng, so every other task of the file stays as it was.
        i = next(i for i, line in enumerate(lines) if word not in line.split())
        lines[i], n = f"{lines[i]} {word}", 2
    return _task(
        f"Write the number of lines of `{src}` that contain the word `{word}` into a new file named `n.txt`.",
        put(src, _text(lines)),
        [(value("n.txt", str(n)), "n.txt does not hold the number of matching lines")],
        f"grep -cw {sq(word)} {sq(src)} > n.txt",
    )


def _unique_sorted(rng: random.Random) -> Task:
    src, words = _fname(rng, "txt"), rng.sample(WORDS, rng.randint(3, 6))
    lines = words + rng.choices(words, k=rng.randint(2, 5))
    rng.shuffle(lines)
    return _task(
        f"Write the distinct lines of `{src}`, sorted alphabetically, into a new file named `unique.txt`.",
        put(src, _text(lines)),
        [(holds("unique.txt", _text(sorted(set(lines)))), "unique.txt is not the sorted distinct lines")],
        f"sort -u {sq(src)} > unique.txt",
    )


def _tail_n(rng: random.Random) -> Task:
    src, lines = _fname(rng, "txt"), _lines(rng, rng.randint(6, 12))
    k = rng.randint(2, 5)
    return _task(
        f"Write the last {k} lines of `{src}` into a new file named `bottom.txt`.",
        put(src, _text(lines)),
        [(holds("bottom.txt", _text(lines[-k:])), f"bottom.txt does not hold the last {k} lines")],
        f"tail -n {k} {sq(src)} > bottom.txt",
    )


# ------------------------------------------------------------------------ rung 3: several parts


def _organize_logs(rng: random.Random) -> Task:
    d = rng.choice(["logs", "archive", "old_logs", "log_files"])
    logs = sorted({f"{rng.choice(STEMS)}{i}.log" for i in range(rng.randint(2, 4))})
    others = sorted({_fname(rng, "txt") for _ in range(2)})
    setup = "\n".join(put(f, f"{f} line\n") for f in logs + others)
    in_dir = " && ".join(holds(f"{d}/{f}", f"{f} line") for f in logs)
    gone = " && ".join(f"[ ! -e {sq(f)} ]" for f in logs)
    kept = " && ".join(f"[ -f {sq(f)} ]" for f in others)
    return _task(
        f"Create a directory named `{d}`, move every `.log` file of the current directory into it, and "
        f"write the number of files you moved into `{d}/count.txt`.",
        setup,
        [
            (f"{{ {in_dir}; }}", f"not every .log file is in {d}/"),
            # Removal counts only with the move: deleting the .log files earns nothing.
            (
                f"{{ {in_dir} && {gone} && {kept}; }}",
                ".log files are left in the current directory (or were not moved) or other files moved",
            ),
            (value(f"{d}/count.txt", str(len(logs))), f"{d}/count.txt does not hold the number moved"),
        ],
        f'n=$(ls *.log | wc -l) && mkdir {sq(d)} && mv *.log {sq(d)}/ && echo "$n" > {sq(d)}/count.txt',
    )


def _edit_config(rng: random.Random) -> Task:
    keys = rng.sample(["port", "host", "user", "mode", "level", "timeout", "retries", "color"], 4)
    vals = {k: str(rng.randint(1, 999)) for k in keys}
    target, new_key = keys[1], rng.choice(["debug", "cache", "workers", "limit"])
    new_val, add_val = str(rng.randint(1000, 9999)), rng.choice(["on", "off", "yes", "no"])
    lines = [f"{k}={vals[k]}" for k in keys]
    rest = _text([x for x in lines if not x.startswith(target + "=")])
    setup = put("settings.conf", _text(lines))
    changed = f"grep -qx {sq(f'{target}={new_val}')} settings.conf"
    added = f'[ "$(tail -n 1 settings.conf)" = {sq(f"{new_key}={add_val}")} ]'
    others = (
        f'[ "$(grep -v -e {sq("^" + target + "=")} -e {sq("^" + new_key + "=")} settings.conf)" = '
        f"{sq(rest.rstrip(chr(10)))} ]"
    )
    return _task(
        f"In `settings.conf`, change the value of `{target}` to `{new_val}`, and add the line "
        f"`{new_key}={add_val}` at the end of the file. Leave the other lines as they are.",
        setup,
        [
            (changed, f"{target} is not {new_val}"),
            (added, f"the last line is not {new_key}={add_val}"),
            (f"{{ {changed} || {added}; }} && {others}", "the other lines changed (or nothing was edited)"),
        ],
        f"sed -i 's/^{target}=.*/{target}={new_val}/' settings.conf && echo {sq(f'{new_key}={add_val}')} "
        f">> settings.conf",
    )


def _csv_report(rng: random.Random) -> Task:
    rows = [(w, rng.randint(1, 50)) for w in rng.sample(WORDS, rng.randint(3, 7))]
    body = "name,qty\n" + _text([f"{w},{q}" for w, q in rows])
    n, total = len(rows), sum(q for _, q in rows)
    return _task(
        "Write a file named `report.txt` with two lines: on the first, the number of data rows of "
        "`data.csv` (not counting its header line); on the second, the sum of its `qty` column.",
        put("data.csv", body),
        [
            (f"[ \"$(sed -n 1p report.txt 2>/dev/null | tr -d '[:space:]')\" = {n} ]", "line 1 is not the row count"),
            (f"[ \"$(sed -n 2p report.txt 2>/dev/null | tr -d '[:space:]')\" = {total} ]", "line 2 is not the qty sum"),
        ],
        "{ tail -n +2 data.csv | wc -l; tail -n +2 data.csv | awk -F, '{s += $2} END {print s}'; } > report.txt",
    )


def _backup_txt(rng: random.Random) -> Task:
    txts = sorted({f"{rng.choice([s for s in STEMS if s != 'list'])}.txt" for _ in range(rng.randint(2, 4))})
    other = _fname(rng, "md")
    setup = "\n".join(put(f, f"{f} body\n") for f in txts + [other])
    copies = " && ".join(holds(f"backup/{f}", f"{f} body") for f in txts)
    originals = " && ".join(holds(f, f"{f} body") for f in txts)
    return _task(
        "Create a directory named `backup`, copy every `.txt` file of the current directory into it (keep "
        "the originals), and write the names of the copied files, one per line in alphabetical order, "
        "into `backup/list.txt`.",
        setup,
        [
            (f"{{ {copies}; }}", "not every .txt file is copied into backup/"),
            # Kept originals count only with the copies: making `backup/` (or writing any file into
            # it) and leaving the rest alone earns nothing.
            (
                f"{{ {copies} && [ -d backup ] && [ ! -L backup ] && {originals}; }}",
                "no backup/ directory with the copies, or an original was changed",
            ),
            (holds("backup/list.txt", _text(txts)), "backup/list.txt does not list the copied files"),
        ],
        "mkdir backup && cp *.txt backup/ && ls *.txt | sort > backup/list.txt",
    )


def _archive_dir(rng: random.Random) -> Task:
    d = rng.choice(["photos", "project", "old", "drafts", "assets"])
    files = sorted({_fname(rng) for _ in range(rng.randint(2, 3))})
    setup = "\n".join([f"mkdir {sq(d)}"] + [put(f"{d}/{f}", f"{f}\n") for f in files])
    listed = " && ".join(f"tar -tzf {sq(d)}.tar.gz 2>/dev/null | grep -qx {sq(f'{d}/{f}')}" for f in files)
    return _task(
        f"Create a gzip-compressed tar archive named `{d}.tar.gz` of the directory `{d}`, then delete the "
        f"directory `{d}`.",
        setup,
        [
            (f"{{ {listed}; }}", f"{d}.tar.gz is missing or does not hold the files of {d}/"),
            # Removal counts only with the archive: deleting the directory earns nothing.
            (f"{{ {listed}; }} && [ ! -e {sq(d)} ]", f"the directory {d} still exists (or was not archived)"),
        ],
        f"tar -czf {sq(d)}.tar.gz {sq(d)} && rm -r {sq(d)}",
    )


def _two_counts(rng: random.Random) -> Task:
    src = _fname(rng, "txt")
    w1, lines = _lines_with(rng, rng.randint(5, 10))
    w2 = rng.choice([w for w in WORDS if w != w1])
    n1, n2 = (sum(w in line.split() for line in lines) for w in (w1, w2))
    return _task(
        f"Write a file named `stats.txt` with two lines: on the first, the number of lines of `{src}` "
        f"that contain the word `{w1}`; on the second, the number that contain the word `{w2}`.",
        put(src, _text(lines)),
        # One sub-check, all or nothing, and exactly two lines: the counts are small numbers, so with
        # a sub-check per line a guessed constant or a list of 0, 1, 2, ... would earn half.
        [
            (
                f"{{ {is_file('stats.txt')} && [ \"$(grep -c '[^[:space:]]' stats.txt)\" = 2 ] && "
                f"[ \"$(sed -n 1p stats.txt | tr -d '[:space:]')\" = {n1} ] && "
                f"[ \"$(sed -n 2p stats.txt | tr -d '[:space:]')\" = {n2} ]; }}",
                f"stats.txt does not hold exactly the two lines: the {w1} count, then the {w2} count",
            ),
        ],
        f"{{ grep -cw {sq(w1)} {sq(src)}; grep -cw {sq(w2)} {sq(src)}; }} > stats.txt",
    )


_T = Callable[[random.Random], Task]
_SPEC: list[tuple[str, int, str, _T]] = [
    ("touch_file", 0, "train", _touch_file),
    ("write_line", 0, "train", _write_line),
    ("write_number", 0, "train", _write_number),
    ("make_dir", 0, "eval", _make_dir),
    ("delete_file", 0, "eval", _delete_file),
    ("count_lines", 1, "train", _count_lines),
    ("copy_file", 1, "train", _copy_file),
    ("first_line", 1, "train", _first_line),
    ("count_chars", 1, "train", _count_chars),
    ("join_files", 1, "train", _join_files),
    ("count_words", 1, "eval", _count_words),
    ("rename_file", 1, "eval", _rename_file),
    ("last_line", 1, "eval", _last_line),
    ("grep_word", 2, "train", _grep_word),
    ("sort_lines", 2, "train", _sort_lines),
    ("head_n", 2, "train", _head_n),
    ("count_matching", 2, "eval", _count_matching),
    ("unique_sorted", 2, "eval", _unique_sorted),
    ("tail_n", 2, "eval", _tail_n),
    ("organize_logs", 3, "train", _organize_logs),
    ("edit_config", 3, "train", _edit_config),
    ("csv_report", 3, "train", _csv_report),
    ("backup_txt", 3, "eval", _backup_txt),
    ("archive_dir", 3, "eval", _archive_dir),
    ("two_counts", 3, "eval", _two_counts),
]


def _lead(solution: str) -> str:
    """The solution's command word and the flags right after it (``wc -l``, ``head -n``, ``touch``).

    No trailing space: SmolLM2's tokenizer writes the space with the next word (``touch``,
    `` notes``), so the model continues at a split it has seen.
    """
    words = solution.split(" ")
    n = 1
    while n < len(words) and words[n].startswith("-"):
        n += 1
    return " ".join(words[:n])


def _without_last_word(solution: str) -> str:
    """The solution up to its last word, no trailing space (``echo 'a line' >``, ``touch``)."""
    return solution[: solution.rindex(" ")]


def prefill_for(rung: int, solution: str) -> str:
    """The first turn's pre-start on ``rung`` for a task whose reference command is ``solution``:
    rungs 0-1 the fence and the command up to its last word (the file to create or write into
    is left: ``echo 'a line' >``, ``wc -l < a.txt >``, ``cp a.txt``), rung 2 the fence and
    :func:`_lead`, rung 3 the fence. Always a prefix of the reference's first turn
    (``FENCE + solution``); every rung-0/1 reference is one command whose last word is the file
    the request names, so the pre-start alone never creates it."""
    if rung <= 1:
        return FENCE + _without_last_word(solution)
    return FENCE + _lead(solution) if rung == 2 else FENCE


def _prefilled(make: _T, rung: int) -> _T:
    """``make`` with the first turn pre-started as :func:`prefill_for` says."""

    def wrapped(rng: random.Random) -> Task:
        task = make(rng)
        if task.terminal is None or not task.terminal.solution.strip():
            raise ValueError(f"terminal template {make.__name__}: its task has no reference solution to pre-start")
        return dataclasses.replace(task, prefill=prefill_for(rung, task.terminal.solution))

    return wrapped


# The lever that the tool-call ladder needed (SmolLM2-135M solved no tool-call task with only
# <tool_call> pre-started), applied here. With rungs 0-1 pre-started up to the command word and
# its flags almost no train task had 0 < pass@k < 1: the model wrote real commands with wrong
# arguments. So each rung pre-starts more: rungs 0-1 leave only the name of the file to create,
# rung 2 the arguments, rung 3 the command. Rung 1 pre-started only up to its input file
# (`wc -l < a.txt`, the ` > count.txt` left) had signal on `cp` alone: no sample of the tasks
# needing a `>` redirect passed (bench/RESULTS.md, "Task ladders: measured difficulty").
TEMPLATES: tuple[Template, ...] = tuple(Template(n, r, s, _prefilled(f, r)) for n, r, s, f in _SPEC)


def generate(n_train: int = N_TRAIN, n_eval: int = N_EVAL, seed: int = 0) -> tuple[list[Task], list[Task]]:
    """(train, eval) terminal tasks; deterministic in ``seed``; eval uses only eval templates."""
    return generate_split(TEMPLATES, SOURCE, n_train, n_eval, seed)


def write(out_dir: str | Path, n_train: int = N_TRAIN, n_eval: int = N_EVAL, seed: int = 0) -> list[Path]:
    train, held = generate(n_train, n_eval, seed)
    return write_ladder({"train": train, "eval": held}, out_dir, SOURCE)


def main(argv: list[str] | None = None) -> None:
    ladder_main("python -m rl.data.tasks.terminal_gen", __doc__.split("\n\n")[0], write, argv)


if __name__ == "__main__":
    main()
