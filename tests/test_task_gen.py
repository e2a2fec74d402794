"""The generated task ladders (code, terminal, tool call): reproducible, split by template,
graded, and every reference solution passes its check through the real env/reward while a
no-op scores nothing."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest

from trajs import finished
from envs.io import load_tasks
from envs.sandbox import check_sandbox
from envs.toolcall import ToolCallEnv, format_call
from envs.types import Message, ToolCall
from rewards.toolcall import ToolCallReward
from rl.data.tasks import code_gen, terminal_gen, toolcall_gen
from rl.data.tasks.ladder import Template, draw, strip_measured, write_ladder

DATA = Path(__file__).resolve().parents[1] / "recipes" / "data"
GENERATORS = {"code": code_gen.generate, "terminal": terminal_gen.generate, "tool_call": toolcall_gen.generate_ladder}
SOURCES = {"code": code_gen.SOURCE, "terminal": terminal_gen.SOURCE, "tool_call": toolcall_gen.LADDER_SOURCE}

try:
    check_sandbox()
    _NO_SANDBOX = ""
except Exception as e:  # noqa: BLE001 - any reason bwrap cannot run here
    _NO_SANDBOX = str(e)
needs_sandbox = pytest.mark.skipif(bool(_NO_SANDBOX), reason=f"bubblewrap sandbox unavailable: {_NO_SANDBOX}")


@pytest.fixture(scope="module")
def generated():
    return {d: gen() for d, gen in GENERATORS.items()}


def _sample(tasks, per_template=1):
    """The first ``per_template`` tasks of each template: the fast tier checks every template once, the slow test every task."""
    seen: Counter = Counter()
    out = []
    for t in tasks:
        if seen[t.meta["template"]] < per_template:
            seen[t.meta["template"]] += 1
            out.append(t)
    return out


@pytest.mark.parametrize("domain", sorted(GENERATORS))
def test_deterministic_for_a_seed_and_seed_changes_instances(domain, generated):
    again = GENERATORS[domain]()
    assert again == generated[domain]
    other = GENERATORS[domain](seed=1)
    assert [t.messages for t in other[0]] != [t.messages for t in generated[domain][0]]


@pytest.mark.parametrize("domain", sorted(GENERATORS))
def test_shipped_files_are_the_generated_ones(domain, generated):
    train, held = generated[domain]
    for split, tasks in (("train", train), ("eval", held)):
        shipped = load_tasks(DATA / f"{SOURCES[domain]}.{split}.jsonl")
        assert [strip_measured(t) for t in shipped] == tasks, (
            f"recipes/data/{SOURCES[domain]}.{split}.jsonl is stale: regenerate it (see the generator's docstring)"
        )


@pytest.mark.parametrize("domain", sorted(GENERATORS))
def test_held_out_by_template_with_every_rung_on_both_sides(domain, generated):
    train, held = generated[domain]
    assert len(held) >= 50 and len(train) >= 100
    assert all(t.domain == domain for t in train + held)
    assert len({t.id for t in train + held}) == len(train + held)
    assert {t.meta["split"] for t in train} == {"train"} and {t.meta["split"] for t in held} == {"eval"}
    for split, tasks in (("train", train), ("eval", held)):
        assert set(Counter(t.meta["rung"] for t in tasks)) == {0, 1, 2, 3}, split
        counts = Counter(t.meta["template"] for t in tasks)
        assert max(counts.values()) - min(counts.values()) <= 1, f"{split} is not balanced over templates: {counts}"
    if domain == "tool_call":
        # Train and eval templates share names per rung but draw from disjoint request phrasings.
        assert not {t.messages[-1].content for t in train} & {t.messages[-1].content for t in held}
    else:
        assert not {t.meta["template"] for t in train} & {t.meta["template"] for t in held}
        # Different templates, so different entry points / instructions, not only different values.
        assert not {t.messages[-1].content for t in train} & {t.messages[-1].content for t in held}


def test_toolcall_ladder_knobs(generated):
    train, held = generated["tool_call"]
    for t in train + held:
        n_tools = len(t.tool_call.tools)
        assert n_tools == {0: 1, 1: 1, 2: 2, 3: 3}[t.meta["rung"]]
        assert t.tool_call.expected[0].name in t.meta["functions"]
        assert t.meta["example_function"] not in t.meta["functions"]
        # Every listed function is in the prompt by name; no JSON schema or placeholder to copy.
        system = t.messages[0].content
        assert all(f"- {name}(" in system for name in t.meta["functions"])
        assert '"properties"' not in system and "<arguments" not in system
        if t.meta["rung"] == 0:
            assert len(t.tool_call.tools[0]["parameters"]["required"]) == 1
        # Lower rungs pre-start more of the call (rungs 0-2: up to the first argument's value;
        # 3: into the arguments); every rung gives the name (choosing it was past the 135M model).
        name = t.tool_call.expected[0].name
        head = f'<tool_call>{{"name": "{name}", "arguments": {{'
        if t.meta["rung"] <= 2:
            first_key = next(iter(t.tool_call.expected[0].allowed))
            assert t.prefill == f'{head}"{first_key}":'
        else:
            assert t.prefill == head + '"'


def test_toolcall_ladder_prefill_levels_end_at_a_token_boundary_and_reject_bad_levels():
    # The 'value' level ends after the key's colon (SmolLM2 writes `":` as one token and the
    # value's opening ` "` as the next), the 'args' level after ` {"`.
    assert toolcall_gen._ladder_prefill("value", "set_timer", "minutes").endswith('{"minutes":')
    assert toolcall_gen._ladder_prefill("args", "set_timer").endswith(' {"')
    with pytest.raises(ValueError, match="first argument"):
        toolcall_gen._ladder_prefill("value", "set_timer")
    with pytest.raises(ValueError, match="unknown prefill level"):
        toolcall_gen._ladder_prefill("all", "set_timer")


def test_code_and_terminal_prefill_by_rung(generated):
    # Code rungs 0-2 pre-start the fence and the def line, rung 3 the fence; terminal rungs 0-2
    # the fence, rung 3 nothing. The def line is the signature the prompt states.
    for t in generated["code"][0] + generated["code"][1]:
        if t.meta["rung"] <= 2:
            # up to the def line's colon: the body's first token is "\n" + indent (a token boundary)
            assert t.prefill == "```python\n" + t.code.solution.split("\n", 1)[0]
            assert t.prefill.endswith(":")
            assert t.prefill.startswith(f"```python\ndef {t.code.entry_point}(")
            assert t.code.solution.split("\n", 1)[0].removeprefix("def ").removesuffix(":") in t.messages[-1].content
        else:
            assert t.prefill == "```python\n"
    # Terminal rungs 0-1 pre-start the fence and the reference command up to its last word (the
    # file to create is left), rung 2 the command word with its flags (no trailing space: the
    # tokenizer writes the space with the next word), rung 3 the fence; the same rule on train
    # and eval templates.
    for t in generated["terminal"][0] + generated["terminal"][1]:
        solution, rung = t.terminal.solution, t.meta["rung"]
        assert t.prefill.startswith("```bash\n")
        lead = t.prefill.removeprefix("```bash\n")
        assert not lead.endswith(" ") and solution.startswith(lead)
        left = solution.removeprefix(lead)
        if rung <= 1:
            # Only the name of the file to create is left, and the request gives that name.
            assert left.startswith(" ") and len(left.split()) == 1
            assert left.strip().strip("'") in t.messages[-1].content
        elif rung == 2:
            assert lead.split(" ")[0] == solution.split(" ")[0] and solution.startswith(lead + " ")
            assert all(w.startswith("-") for w in lead.split(" ")[1:])
        else:
            assert lead == ""
    prefills = {t.meta["template"]: t.prefill for t in generated["terminal"][0]}
    assert prefills["touch_file"] == "```bash\ntouch"
    assert prefills["write_line"].startswith("```bash\necho ") and prefills["write_line"].endswith(" >")
    assert prefills["count_lines"].startswith("```bash\nwc -l < ") and prefills["count_lines"].endswith(".txt >")
    assert prefills["copy_file"].startswith("```bash\ncp ") and prefills["copy_file"].count(" ") == 1
    assert prefills["head_n"] == "```bash\nhead -n" and prefills["sort_lines"] == "```bash\nsort"


def test_terminal_ladder_system_prompt_shows_one_worked_episode(generated):
    prompt = terminal_gen.SYSTEM_PROMPT
    # The example: a request, the fenced one-line command, the env's answer, then the done marker.
    # Its command has the low rungs' shape: an input file the request names, `>` an output file.
    example = prompt[prompt.index("Example:") :]
    assert "User: " in example and "```bash\ntac colors.md > reversed.cfg\n```" in example
    assert "`colors.md`" in example and "`reversed.cfg`" in example
    assert example.rstrip().endswith("User: exit code 0\nAssistant: DONE")
    assert prompt.count("```bash") == 2  # the rule's mention and the example: one example only
    train, held = generated["terminal"]
    assert all(t.messages[0] == Message("system", prompt) for t in train + held)
    # The example's chore is no task of either split (copying it never pays).
    assert not any(
        "reversed.cfg" in t.messages[-1].content
        or "colors.md" in t.messages[-1].content
        or "tac" in t.terminal.solution
        for t in train + held
    )


def test_terminal_one_step_templates_on_the_low_rungs(generated):
    # Rungs 0-1 hold one-command answers, rungs 0-1 have more train templates than before.
    train, held = generated["terminal"]
    low = {t.meta["template"] for t in train if t.meta["rung"] <= 1}
    assert {"write_number", "count_chars", "join_files"} <= low and len(low) == 8
    for t in train + held:
        if t.meta["rung"] <= 1:
            assert "&&" not in t.terminal.solution and ";" not in t.terminal.solution and "|" not in t.terminal.solution


def test_quickstart_generator_unchanged_by_the_ladder(tmp_path):
    train, held = toolcall_gen.write_quickstart(tmp_path)
    assert train.read_bytes() == (DATA / toolcall_gen.TRAIN_FILE).read_bytes()
    assert held.read_bytes() == (DATA / toolcall_gen.EVAL_FILE).read_bytes()


def test_draw_rejects_bad_templates_and_reports_small_pools():
    with pytest.raises(ValueError, match="split"):
        Template("x", 0, "test", lambda rng: None)
    with pytest.raises(ValueError, match="rung"):
        Template("x", 4, "train", lambda rng: None)
    task = code_gen.generate(1, 1)[0][0]
    constant = Template("constant", 0, "train", lambda rng: task)
    with pytest.raises(RuntimeError, match="constant"):
        draw([constant], "train", 2, 0, "src")
    with pytest.raises(ValueError, match="no eval templates"):
        draw([constant], "eval", 1, 0, "src")


def test_write_ladder_keeps_a_measurement_only_for_unchanged_tasks(tmp_path):
    train, held = code_gen.generate(4, 2)
    write_ladder({"train": train, "eval": held}, tmp_path, "lad")
    measured = [dataclasses.replace(t, meta={**t.meta, "base_pass_rate": 0.5}) for t in train]
    write_ladder({"train": measured}, tmp_path, "lad")
    changed = [train[0]] + [
        dataclasses.replace(t, messages=t.messages[:1] + (Message("user", "new"),)) for t in train[1:]
    ]
    write_ladder({"train": changed}, tmp_path, "lad")
    back = load_tasks(tmp_path / "lad.train.jsonl")
    assert back[0].meta["base_pass_rate"] == 0.5
    assert all("base_pass_rate" not in t.meta for t in back[1:])


def test_write_ladder_drops_a_measurement_when_only_the_prefill_changed(tmp_path):
    # A new pre-start makes the task another task for the model: its old pass rate is stale.
    train = terminal_gen.generate(4, 2)[0]
    measured = [dataclasses.replace(t, meta={**t.meta, "base_pass_rate": 0.25, "base_pass": {"k": 8}}) for t in train]
    write_ladder({"train": measured}, tmp_path, "lad")
    new = [train[0], dataclasses.replace(train[1], prefill=train[1].prefill + " x")] + train[2:]
    write_ladder({"train": new}, tmp_path, "lad")
    back = load_tasks(tmp_path / "lad.train.jsonl")
    assert back[0].meta["base_pass_rate"] == 0.25 and back[0].meta["base_pass"] == {"k": 8}
    assert not any(k in back[1].meta for k in ("base_pass_rate", "base_pass"))
    assert [strip_measured(t) for t in back] == new


# ---------------------------------------------------------------- reference passes, no-op fails


def _code_check(tasks):
    from envs.code import CodeEnv

    env = CodeEnv()
    bad = []
    try:
        for t in tasks:
            env.reset(t)
            reference = f"```python\n{t.code.solution}```"
            # The env sees prefill + generated text: the prefill must be a prefix of a right answer.
            if not reference.startswith(t.prefill):
                bad.append(f"{t.id}: prefill {t.prefill!r} is not a prefix of the reference")
            info = env.step(reference)[3]
            if info["reward"] != 1.0:
                bad.append(f"{t.id}: reference solution scores {info['reward']}: {info.get('error')}")
            env.reset(t)
            info = env.step(f"```python\ndef {t.code.entry_point}(*a, **k):\n    return None\n```")[3]
            if info["reward"] != 0.0:
                bad.append(f"{t.id}: a function returning None scores {info['reward']}")
    finally:
        env.close()
    assert not bad, "\n".join(bad)


def _terminal_check(tasks):
    """Every task's reference, no-op and bare prefill, over 4 threads with a terminal each (most of the time
    is waiting: sandbox starts and the prefill's 2 s timeout)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        bad = [b for part in pool.map(_terminal_check_part, [tasks[i::4] for i in range(4)]) for b in part]
    assert not bad, "\n".join(bad)


def _terminal_check_part(tasks) -> list[str]:
    from envs.terminal import TerminalEnv

    # A short command timeout: a bare `wc -l` (a prefill alone) waits on the terminal until it.
    env = TerminalEnv(command_timeout_s=2.0)
    bad: list[str] = []
    try:
        for t in tasks:
            env.reset(t)
            reference = f"```bash\n{t.terminal.solution}\n```"
            if not reference.startswith(t.prefill):
                bad.append(f"{t.id}: prefill {t.prefill!r} is not a prefix of the reference")
            obs, term, trunc, _ = env.step(reference)
            info = env.step("DONE")[3]
            if info["reward"] != 1.0:
                bad.append(f"{t.id}: reference solution scores {info['reward']}: {info['check_output'][:300]}")
            env.reset(t)
            info = env.step("DONE")[3]
            if info["reward"] != 0.0:
                bad.append(f"{t.id}: doing nothing scores {info['reward']}: {info['check_output'][:300]}")
            # The pre-start alone (the model stops right after it) runs its bare command word.
            env.reset(t)
            _, term, trunc, info = env.step(t.prefill)
            if not (term or trunc):
                info = env.step("DONE")[3]
            if info["reward"] != 0.0:
                bad.append(f"{t.id}: the prefill alone scores {info['reward']}: {info['check_output'][:300]}")
    finally:
        env.close()
    return bad


def _toolcall_traj(task, text):
    env = ToolCallEnv()
    messages = env.reset(task)
    _, term, _, info = env.step(text)
    env.close()
    assert term
    return finished(task, [*messages, Message("assistant", text)], env_reward=info.get("reward"))


def _toolcall_check(tasks):
    reward = ToolCallReward(format_weight=0.2, name_weight=0.3, args_weight=0.5)
    bad = []
    for t in tasks:
        e = t.tool_call.expected[0]
        args = {k: v[0] for k, v in e.allowed.items() if v[0] != ""}
        reference = format_call(ToolCall(e.name, args))
        # The env sees prefill + generated text: a prefill that is not a prefix of the right call
        # would make the task unsolvable.
        if not reference.startswith(t.prefill):
            bad.append(f"{t.id}: prefill {t.prefill!r} is not a prefix of the reference {reference!r}")
        ok = reward(_toolcall_traj(t, reference))
        noop = reward(_toolcall_traj(t, t.prefill))
        if ok != 1.0 or noop != 0.0:
            bad.append(f"{t.id}: reference scores {ok}, a no-op {noop}")
    assert not bad, "\n".join(bad)


CHECKS = {"code": _code_check, "terminal": _terminal_check, "tool_call": _toolcall_check}


@pytest.mark.parametrize("domain", sorted(GENERATORS))
def test_reference_passes_and_noop_fails_on_a_subset(domain, generated):
    if domain != "tool_call" and _NO_SANDBOX:
        pytest.skip(f"bubblewrap sandbox unavailable: {_NO_SANDBOX}")
    train, held = generated[domain]
    CHECKS[domain](_sample(train) + _sample(held))


@pytest.mark.slow
@pytest.mark.parametrize("domain", sorted(GENERATORS))
def test_reference_passes_and_noop_fails_on_every_shipped_task(domain):
    if domain != "tool_call" and _NO_SANDBOX:
        pytest.skip(f"bubblewrap sandbox unavailable: {_NO_SANDBOX}")
    tasks = [t for split in ("train", "eval") for t in load_tasks(DATA / f"{SOURCES[domain]}.{split}.jsonl")]
    CHECKS[domain](tasks)


def test_terminal_partial_credit_counts_sub_checks():
    check = terminal_gen.partial_check([("true", "a"), ("false", "b"), ("true", "c")])
    from envs.terminal import parse_check_result  # the env's own reading of a check's output

    import subprocess

    p = subprocess.run(["bash", "-c", check], capture_output=True, text=True)
    assert p.returncode == 1 and "FAIL: b" in p.stdout
    assert parse_check_result(p.returncode, p.stdout) == pytest.approx(2 / 3, abs=1e-4)


def test_count_matching_never_asks_for_a_count_a_constant_guesses():
    """A matching-line count of 1 is what a work-free reply writing "1" into the named file earns (the audit's
    named_files_1 flagged 6 of 27 such held-out tasks); the template adds the word to one more line instead,
    without a draw from the RNG, so every other task of a file stays byte for byte."""
    import random
    import re

    answers = []
    for seed in range(400):
        task = terminal_gen._count_matching(random.Random(seed))
        answers.append(int(re.search(r"n\.txt\)\" = (\d+) \]", task.terminal.check).group(1)))
    assert min(answers) >= 2 and len(set(answers)) > 3
    # the RNG ends where the template's own draws leave it: the next task of a file is the one it always was
    a, b = random.Random(7), random.Random(7)
    terminal_gen._count_matching(a)
    terminal_gen._fname(b, "txt")
    terminal_gen._lines_with(b, b.randint(4, 12))
    assert a.random() == b.random()
