"""Routing replay R3 end to end in the in-process runtime (``LocalRuntime``: the HF engine, in-process learner)
on ``recipes/tiny_moe.yaml``: the engine's routing of every token travels with the trajectory to the learner's
samples, the learner's forwards run exactly those experts, ``moe/routing_disagreement`` is 0 under R3, and a
resumed run keeps working (samples are not checkpointed: a step's routing lives only within that step).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rl.config.recipe import RecipeError, load_recipe, validate_recipe
from rl.driver.local_runtime import LocalRuntime
from rl.driver.loop import train
from rl.trainer import moe
from rl.trainer.hub import resolve_model
from runlog import comparable_steps
from test_moe_replay import spy_forward


def _cfg(recipe_copy, replay: str, out: str, steps: int):
    def edit(d: dict) -> None:
        d["wandb"] = {**d.get("wandb", {}), "mode": "disabled"}
        d["model"].update(engine_dtype="float32", autocast=False)
        d["run"].update(threads=1, save_every=1, keep_checkpoints=3, resume="auto")
        d["rollout"].update(prompts_per_step=2, group_size=2, max_new_tokens=8)
        d["data"]["eval_limit"] = 2
        d["train"].update(steps=steps, eval_at_start=False)
        d["learner"]["routing_replay"] = replay

    cfg = load_recipe(recipe_copy("tiny_moe.yaml", out=out, filename=f"{out}.yaml", edit=edit))
    validate_recipe(cfg)
    return cfg


class _Spy:
    """A ``LocalRuntime`` factory recording the trajectories, and per learner policy forward its samples, forced
    routing and the experts its experts blocks ran (``test_moe_replay.spy_forward``)."""

    def __init__(self) -> None:
        self.trajs: list = []
        self.forwards: list = []

    def __call__(self, cfg, model_path, out, verbose):
        rt = LocalRuntime(cfg, model_path, out, verbose)
        start, generate = rt.start, rt.generate

        def started(*a, **k):
            start(*a, **k)
            self._wrap(rt.learner)

        def generated(*a, **k):
            trajs = generate(*a, **k)
            self.trajs += trajs
            return trajs

        rt.start, rt.generate = started, generated
        return rt

    def _wrap(self, lrn) -> None:
        self.lrn, self.forwards = lrn, spy_forward(lrn)


def test_r3_in_process_learner_runs_the_engines_experts_and_resumes(tmp_path: Path, recipe_copy) -> None:
    spy = _Spy()
    out = train(_cfg(recipe_copy, "r3", "r3", steps=2), progress=False, runtime=spy)
    train_trajs = [t for t in spy.trajs if t.routing is not None]
    assert train_trajs, "the HF engine reports routing on the MoE model"
    for t in spy.trajs:  # every token the engine ran: prompt, then each generated token but the last
        assert t.routing is not None and t.routing.dtype.name == "uint8"
        assert t.routing.shape == (len(t.prompt_ids) + len(t.response_ids) - 1, 2, 2)
    assert spy.forwards
    for samples, forced, ran in spy.forwards:
        assert forced is not None and all(f is s.routing for s, f in zip(samples, forced))
        assert torch.equal(ran, moe.gather(forced, spy.lrn.fwd.rows(samples), (2, 2)).long())
    by_ids = {tuple(t.prompt_ids + t.response_ids): t.routing for t in spy.trajs}
    for samples, *_ in spy.forwards:
        for s in samples:  # the sample's routing is the engine's, token for token
            eng = torch.from_numpy(by_ids[tuple(s.input_ids)])
            assert torch.equal(s.routing[: eng.shape[0]], eng)
    steps = comparable_steps(out / "metrics.jsonl")
    for s in (1, 2):
        assert steps[s]["moe/routing_disagreement"] == 0.0
        assert steps[s]["moe/routing_disagreement/tool_call"] == 0.0
        assert steps[s]["moe/layer_0/entropy"] > 0.0 and steps[s]["moe/layer_1/max_mean"] >= 1.0

    resumed = _Spy()  # the same run to 3 steps: resumes from step 2's checkpoint, R3 still in force
    train(_cfg(recipe_copy, "r3", "r3", steps=3), progress=False, runtime=resumed)
    steps = comparable_steps(out / "metrics.jsonl")
    assert steps[3]["moe/routing_disagreement"] == 0.0
    assert resumed.forwards and all(f is not None for _, f, _ in resumed.forwards)


def test_without_replay_the_disagreement_is_measured(tmp_path: Path, recipe_copy) -> None:
    out = train(_cfg(recipe_copy, "none", "none", steps=1), progress=False, runtime=_Spy())
    m = comparable_steps(out / "metrics.jsonl")[1]
    assert 0.0 <= m["moe/routing_disagreement"] <= 1.0 and "moe/routing_disagreement/tool_call" in m


def test_replay_bad_input_is_refused_naming_the_key(tmp_path: Path, recipe_copy, tiny_model_path) -> None:
    cfg = _cfg(recipe_copy, "r3", "bad", steps=1)
    with pytest.raises(RecipeError, match=r"learner.routing_replay: r3 needs an engine that reports"):
        moe.check_replay_engine(cfg.learner, "vllm")
    moe.check_replay_engine(cfg.learner, "hf")
    with pytest.raises(RecipeError, match=r"learner.routing_replay: r3 needs a mixture-of-experts model"):
        moe.check_replay(tiny_model_path, cfg.learner)
    with pytest.raises(RecipeError, match=r"learner.routing_replay: r3 with learner.activation_checkpointing"):
        moe.check_replay(resolve_model("embedded:tiny-moe"), _with(cfg.learner, activation_checkpointing=True))


def _with(section, **kw):
    import dataclasses

    return dataclasses.replace(section, **kw)
