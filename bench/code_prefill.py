"""Where the code ladder's pre-start ends, measured: greedy first turns under three endings.

The code ladder pre-starts rungs 0-2 with the fence and the function's ``def`` line
(``rl.data.tasks.code_gen``). SmolLM2's tokenizer writes a body's first newline and its
indentation as ONE token (``"\\n   "``), so where the pre-start ends decides what the model
sees coming: this bench runs the base model greedily (``transformers`` generate, no vLLM)
on the held-out rung 0-2 tasks with the pre-start ending

* ``colon``: at the ``def`` line's colon (as shipped: the body's first token is the model's);
* ``newline``: after the line's ``"\\n"`` (as shipped until 2026-12-02);
* ``indent``: after ``"\\n   "`` (the newline-and-indent token given too),

one turn, cut at the recipe's stop string (``"\\n```\\n"``), and reports per ending: empty
bodies (the fence closed before any body line), the mean test pass fraction and the fully
right answers, each answer one turn of ``envs.code.CodeEnv`` (tests in its bubblewrap
sandbox). Same model, tasks and decoding for all three, one after the other in one run.

    .venv/bin/python bench/code_prefill.py                 # every held-out rung 0-2 task (76 of 100)
    .venv/bin/python bench/code_prefill.py --limit 45      # the 45 of the 60-task file, measured 2026-12-02
    .venv/bin/python bench/code_prefill.py --limit 8 --model embedded:tiny

It trains nothing and writes nothing but its printout.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import cpu_model  # noqa: E402
from envs.code import CodeEnv  # noqa: E402
from envs.io import load_tasks  # noqa: E402
from envs.types import Task  # noqa: E402

STOP = "\n```\n"
ENDINGS = {
    "colon": lambda head: head,
    "newline": lambda head: head + "\n",
    "indent": lambda head: head + "\n   ",
}


def def_head(task: Task) -> str:
    """The shipped pre-start up to the ``def`` line's colon (rungs 0-2 end there)."""
    head = task.prefill
    if not head.rstrip().endswith(":"):
        raise ValueError(f"{task.id}: pre-start {head!r} does not end at a def line's colon")
    return head.rstrip()


def empty_body(action: str) -> bool:
    """True when nothing but blank lines stands between the def line and the closing fence."""
    lines = action.split("\n")
    start = next((i + 1 for i, line in enumerate(lines) if line.startswith("def ")), len(lines))
    body = []
    for line in lines[start:]:
        if line.startswith("```"):
            break
        body.append(line)
    return not "".join(body).strip()


def first_turns(model, tok, tasks: list[Task], ending: str, max_new_tokens: int) -> list[str]:
    """Greedy first turns (pre-start + generated text up to the stop string) for ``tasks``."""
    import torch

    from rollout.episode import render

    heads = [ENDINGS[ending](def_head(t)) for t in tasks]
    texts = [render(tok, list(t.messages), add_generation_prompt=True) + h for t, h in zip(tasks, heads)]
    enc = tok(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
    width = enc["input_ids"].shape[1]
    gens = [tok.decode(o[width:], skip_special_tokens=True) for o in out]
    return [h + (g.split(STOP, 1)[0] + STOP if STOP in g else g) for h, g in zip(heads, gens)]


def score(tasks: list[Task], actions: list[str]) -> dict[str, float]:
    """Empty bodies, mean test pass fraction and fully right answers: each action is one turn of
    the env the recipe runs (``envs.code.CodeEnv``, tests in its bubblewrap sandbox)."""
    env = CodeEnv(max_turns=1)
    try:
        fractions, full = [], 0
        for t, action in zip(tasks, actions):
            env.reset(t)
            info = env.step(action)[3]
            fractions.append(info["passed"] / info["total"] if info["total"] else 0.0)  # not the reward
            full += info["total"] > 0 and info["passed"] == info["total"]
    finally:
        env.close()
    return {
        "empty": sum(empty_body(a) for a in actions),
        "pass_fraction": sum(fractions) / len(fractions),
        "fully": full,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default=str(ROOT / "recipes" / "data" / "code_ladder.eval.jsonl"))
    ap.add_argument("--limit", type=int, default=0, help="the first N rung 0-2 tasks (0 = all)")
    ap.add_argument("--model", default="embedded:smollm2-135m-instruct")
    ap.add_argument("--max-new-tokens", type=int, default=80)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl.trainer.hub import resolve_model

    if args.threads:
        torch.set_num_threads(args.threads)
    tasks = [t for t in load_tasks(args.tasks) if t.meta.get("rung", 0) <= 2 and t.code is not None]
    tasks = tasks[: args.limit] if args.limit else tasks
    if not tasks:
        print(f"code_prefill: no rung 0-2 code tasks in {args.tasks}", file=sys.stderr)
        return 2
    path = resolve_model(args.model)
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    print(f"code_prefill: {args.model}, {len(tasks)} tasks of {Path(args.tasks).name}, greedy, host {cpu_model()}")
    print("\n| pre-start ends | empty bodies | mean test pass fraction | fully right | s |\n|---|---|---|---|---|")
    for ending in ENDINGS:
        t0 = time.perf_counter()
        s = score(tasks, first_turns(model, tok, tasks, ending, args.max_new_tokens))
        print(
            f"| {ending} | {s['empty']} / {len(tasks)} | {s['pass_fraction']:.3f} | {s['fully']} / {len(tasks)} "
            f"| {time.perf_counter() - t0:.0f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
