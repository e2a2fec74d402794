"""A whole training run whose engine emits crashing samples every step (issue #38, item 1).

``jointrl train --local`` on the tiny recipe (the in-process runtime: the driver, rollout, rewards and learner
as on Ray), its engine wrapped so that in every step six of the eight samples are attacks: three tool-call
texts that used to raise out of the parser or the reward (nesting past the cap, an integer no float holds, a
lone surrogate escape) and three actions on which the env raises a real ``RecursionError``, ``MemoryError``
and ``OSError`` (an env with a bug the policy can trigger). The run completes all its steps; the parser
attacks score as the policy failures they are; the env failures are logged as harness errors, excluded, and
counted in ``sandbox/tool_call/harness_error`` and ``faults/reward_errors``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from envs.toolcall import MAX_JSON_DEPTH, ToolCallEnv
from envs.types import Generation
from runlog import comparable_steps

CALL = '<tool_call>{{"name": "get_weather", "arguments": {{"city": {}}}}}</tool_call>'
ATTACKS = [
    CALL.format("[" * (MAX_JSON_DEPTH + 2) + "]" * (MAX_JSON_DEPTH + 2)),
    CALL.format("9" * 400),
    CALL.format('"\\ud800"'),
    "CRASH:RecursionError",
    "CRASH:MemoryError",
    "CRASH:OSError",
]
ENV_KINDS = ("RecursionError", "MemoryError", "OSError")


def _recurse(n: int = 0) -> int:
    return _recurse(n + 1) + 1


class CrashingEnv(ToolCallEnv):
    """The real ToolCallEnv, whose step raises a real error of the kind an action ``CRASH:<kind>`` names."""

    def step(self, action):
        if "CRASH:RecursionError" in action:
            _recurse()
        if "CRASH:MemoryError" in action:
            bytearray(1 << 62)
        if "CRASH:OSError" in action:
            os.close(-1)
        return super().step(action)


class AttackingEngine:
    """Wraps the run's engine: in a call for a whole train step (``batch`` prompts, groups of ``group``), samples
    0-2 of group 0 and of group 1 become ``ATTACKS`` (tokenized, EOS-ended). Everything else is the engine's."""

    def __init__(self, engine, tokenizer, batch: int, group: int) -> None:
        self.engine, self.batch, self.group, self.injected = engine, batch, group, 0
        eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.gens = []
        for text in ATTACKS:
            ids = list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [eos]
            self.gens.append(Generation(token_ids=ids, logprobs=[-1.0] * len(ids), finish_reason="stop"))

    def generate(self, prompts, sampling, seeds=None, stops=None):
        out = list(self.engine.generate(prompts, sampling, seeds, stops))
        if len(prompts) == self.batch:
            slots = [0, 1, 2, self.group, self.group + 1, self.group + 2]
            for slot, gen in zip(slots, self.gens):
                out[slot] = gen
            self.injected += 1
        return out

    def __getattr__(self, name):
        return getattr(self.engine, name)


@pytest.fixture
def attacking(monkeypatch, tiny_tokenizer):
    import rl.driver.local_runtime as lr

    made: list[AttackingEngine] = []
    real = lr.make_engine

    def make(kind, model_path, **kwargs):
        made.append(AttackingEngine(real(kind, model_path, **kwargs), tiny_tokenizer, batch=8, group=4))
        return made[-1]

    monkeypatch.setattr(lr, "make_engine", make)
    return made


def test_train_completes_every_step_with_crashing_samples_and_logs_the_harness_errors(
    tmp_path: Path, recipe_copy, attacking, capsys
) -> None:
    from rl.cli.main import main

    def edit(d: dict) -> None:
        d.setdefault("wandb", {})["mode"] = "disabled"
        d.setdefault("model", {}).update(engine_dtype="float32", autocast=False)
        d.setdefault("run", {})["threads"] = 1
        d.setdefault("rollout", {}).update(prompts_per_step=2, group_size=4, max_new_tokens=16)
        d["rollout"]["envs"] = [{"domain": "tool_call", "cls": "test_containment_train.CrashingEnv"}]
        d.setdefault("data", {})["eval_files"] = []
        d["train"] = {"steps": 2}

    recipe = recipe_copy("tiny.yaml", out="out", filename="crash.yaml", edit=edit)
    assert main(["train", str(recipe), "--local"]) == 0, capsys.readouterr().err
    out = tmp_path / "out"
    assert (out / "DONE").is_file()
    assert attacking and attacking[0].injected == 2, "every train step got its attacks"
    steps = comparable_steps(out / "metrics.jsonl")
    assert {1, 2} <= set(steps)
    rows = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    for s in (1, 2):
        assert steps[s]["sandbox/tool_call/harness_error"] == 3.0
        assert steps[s]["faults/reward_errors"] == 3.0, "only the harness failures are excluded"
        train = [r for r in rows if r["step"] == s and r["split"] == "train"]
        errors = sorted(r["reward_error"] for r in train if r["reward_error"])
        assert [e.split(":")[1].strip() for e in errors] == [
            f"tool_call env step raised {k}" for k in sorted(ENV_KINDS)
        ]
        assert all(e.startswith("harness: ") for e in errors)
        parser_attacks = [r for r in train if '"name": "get_weather", "arguments": {"city": ' in r["response"]]
        assert len(parser_attacks) == 3 and not any(r["reward_error"] for r in parser_attacks)
        # Malformed JSON scores 0; the 400-digit integer is valid JSON: a call whose argument is wrong (< 1).
        assert all(r["reward"] == 0.0 for r in parser_attacks if "9" * 400 not in r["response"])
        assert all(r["reward"] < 1.0 for r in parser_attacks)


SELF_CRASHING = '''
import os, threading
from envs.toolcall import ToolCallEnv

_lock = threading.Lock()
_episodes = [0]


def _recurse(n=0):
    return _recurse(n + 1) + 1


class SelfCrashingEnv(ToolCallEnv):
    """The real ToolCallEnv; of every 8 episodes this process runs, the step of the 1st raises a real
    RecursionError, of the 2nd a MemoryError, of the 3rd an OSError."""

    def reset(self, task):
        with _lock:
            self.kind = _episodes[0] % 8
            _episodes[0] += 1
        return super().reset(task)

    def step(self, action):
        if self.kind == 0:
            _recurse()
        if self.kind == 1:
            bytearray(1 << 62)
        if self.kind == 2:
            os.close(-1)
        return super().step(action)
'''


@pytest.mark.slow
def test_jointrl_train_on_ray_completes_with_crashing_env_calls(tmp_path: Path, recipe_copy) -> None:
    """The real Ray path (``jointrl train``: a vLLM rollout worker actor, the reward service, the learner actor):
    six of each step's 16 samples end in an env call that raises; every step completes and logs them. (A vLLM
    engine inside a Ray actor cannot be wrapped from here, so the env raises on its own schedule.)"""
    import subprocess
    import sys

    (tmp_path / "self_crashing_env.py").write_text(SELF_CRASHING)

    def edit(d: dict) -> None:
        d["wandb"]["mode"] = "disabled"
        d["rollout"]["envs"] = [{"domain": "tool_call", "cls": "self_crashing_env.SelfCrashingEnv"}]
        d["train"] = {"steps": 2, "eval_every": 0}
        d["data"]["eval_files"] = []

    recipe = recipe_copy("tiny.yaml", out="out", filename="crash.yaml", edit=edit)
    env = {**os.environ, "WANDB_MODE": "disabled"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    exe = Path(sys.executable).with_name("jointrl")
    proc = subprocess.run([str(exe), "train", str(recipe)], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "out"
    steps = comparable_steps(out / "metrics.jsonl")
    assert {1, 2} <= set(steps) and (out / "DONE").is_file()
    rows = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    for s in (1, 2):
        assert steps[s]["sandbox/tool_call/harness_error"] == 6.0
        errors = [r["reward_error"] for r in rows if r["step"] == s and r["split"] == "train" and r["reward_error"]]
        kinds = sorted(e.split(" raised ")[1].split(":")[0] for e in errors)
        assert kinds == sorted(ENV_KINDS * 2), errors
