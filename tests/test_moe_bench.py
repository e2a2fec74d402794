"""``bench/moe_replay.py``: its statistics and table from synthetic run dirs, and its refusals of bad input."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from bench.moe_replay import ArmRun, analyse, arm_summary, main, render, run_stats, train_records
from bench.seeds import SeedRun

ROOT = Path(__file__).resolve().parents[1]


def _records(arm: str, seed: int, steps: int = 6) -> list[dict]:
    recs = [{"step": 0, "eval/reward/mean": 0.1, "timing/eval_s": 2.0}]  # the evaluation: not a train step
    for s in range(1, steps + 1):
        r = {
            "step": s,
            "reward/mean": 0.1 * s + 0.01 * seed,
            "async/mismatch_kl": 1e-4 * (0 if arm == "r3" else s),
            "rollout/logprob_diff": 0.01 * s,
            "timing/step_s": 10.0 + s,
        }
        if arm != "r3" or s > 1:
            r["moe/routing_disagreement"] = 0.0 if arm == "r3" else 0.02
        recs.append(r)
    return recs


def _run_dir(root: Path, arm: str, seed: int, steps: int = 6) -> Path:
    d = root / arm / f"seed_{seed}"
    d.mkdir(parents=True)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records(arm, seed, steps)))
    (d / "recipe.resolved.yaml").write_text(f"run:\n  seed: {seed}\n")
    (d / "DONE").write_text("{}\n")
    (d / "sweep_wall_s.txt").write_text("100.0\n")
    return d


def test_run_stats_means_over_train_steps(tmp_path: Path) -> None:
    recs = train_records(_run_dir(tmp_path, "none", 0))
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 5, 6]  # step 0 (evaluation only) left out
    st = run_stats(recs, last=2)
    assert st["mismatch_kl"] == pytest.approx(1e-4 * 3.5)
    assert st["logprob_diff"] == pytest.approx(0.035)
    assert st["disagreement"] == pytest.approx(0.02)
    assert st["reward"] == pytest.approx(0.35)
    assert st["reward_last"] == pytest.approx((0.5 + 0.6) / 2)
    assert st["reward_first"] == pytest.approx(0.1)
    assert st["step_s"] == pytest.approx(statistics.median([11, 12, 13, 14, 15, 16]))
    assert st["steps"] == 6
    r3 = run_stats(train_records(_run_dir(tmp_path, "r3", 0)), last=2)
    assert r3["disagreement"] == 0.0 and r3["mismatch_kl"] == 0.0  # a logged 0 is a value, not "missing"


def test_run_stats_missing_metric_is_none(tmp_path: Path) -> None:
    d = tmp_path / "run"
    d.mkdir()
    (d / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    st = run_stats(train_records(d), last=3)
    assert st["mismatch_kl"] is None and st["disagreement"] is None and st["step_s"] is None
    assert st["reward"] == st["reward_last"] == 0.5


def test_summary_over_seeds_and_a_failed_run(tmp_path: Path) -> None:
    runs = [
        ArmRun(arm, SeedRun(seed, str(_run_dir(tmp_path, arm, seed)), "done", 100.0 + seed))
        for seed in (0, 1)
        for arm in ("none", "r3")
    ]
    runs.append(ArmRun("r2", SeedRun(0, str(tmp_path / "r2" / "seed_0"), "done", 50.0)))  # no metrics.jsonl
    runs.append(ArmRun("r2", SeedRun(1, str(tmp_path / "x"), "failed", cause="boom (exit 1)")))
    analyse(runs, last=2)
    assert runs[4].run.status == "failed" and "no metrics.jsonl" in runs[4].run.cause
    s = arm_summary(runs)
    assert list(s) == ["none", "r3", "r2"]
    assert s["none"]["seeds"] == 2 and s["r2"]["seeds"] == 0
    assert s["none"]["reward"] == pytest.approx(0.355)  # seeds 0 and 1: 0.35 and 0.36
    assert s["none"]["reward_sd"] == pytest.approx(statistics.stdev([0.35, 0.36]))
    assert s["none"]["wall_s"] == pytest.approx(100.5)
    assert s["r2"]["wall_s"] is None
    body = render(s, runs, {"recipe": "r.yaml", "overrides": [], "steps": 6, "seeds": [0, 1], "last": 2, "host": "h"})
    rows = {line.split(" | ")[0].lstrip("| "): line for line in body.splitlines() if line.startswith("| ")}
    assert "0.355 ± 0.00707" in rows["none"] and rows["r3"].split(" | ")[4] == "0.000 ± 0"
    assert rows["r2"].split(" | ")[1] == "0" and "r2 seed 1: boom (exit 1)" in body and "r2 seed 0" in body
    # none: mismatch 3.5e-4, disagreement 0.02; r3: 0 and 0.
    assert "r3: async/mismatch_kl 0.00x none's, rollout/logprob_diff 1.00x none's" in body
    assert "moe/routing_disagreement 0.00x none's" in body and "training reward is 0" not in body


def test_conclusions_say_equal_arms_and_a_reward_at_zero() -> None:
    from bench.moe_replay import conclusions

    arm = {"seeds": 1, "mismatch_kl": 1e-6, "logprob_diff": 1e-3, "disagreement": 0.01, "reward": 0.0}
    arm["reward_first"] = 0.0
    text = conclusions({"none": arm, "r2": dict(arm), "r3": arm | {"mismatch_kl": 5e-7, "disagreement": 0.0}})
    assert "r2's mismatch, routing disagreement and reward equal none's exactly" in text
    assert (
        "r3: async/mismatch_kl 0.50x none's, rollout/logprob_diff 1.00x none's, moe/routing_disagreement 0.00x" in text
    )
    assert "the training reward is 0 in every arm" in text and "one seed" in text


def test_from_runs_writes_the_section(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import bench._results

    monkeypatch.setattr(bench._results, "machine", lambda: "a test host")  # no vllm import in the fast tier
    for arm in ("none", "r2", "r3"):
        _run_dir(tmp_path, arm, 0)
    code = main(["--from-runs", "--out", str(tmp_path), "--steps", "6", "--no-eval"])
    assert code == 0
    text = (tmp_path / "RESULTS-section.md").read_text()
    assert "<!-- moe_replay:start -->" in text and "| r3 | 1 |" in text
    data = json.loads((tmp_path / "replay.json").read_text())
    assert [r["arm"] for r in data["runs"]] == ["none", "r2", "r3"]
    assert data["summary"]["none"]["disagreement"] == pytest.approx(0.02)


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--arms", "none,r4"], "unknown arm 'r4'"),
        (["--arms", "none,none"], "an arm is given twice"),
        (["--seeds", "0,0"], "seed 0 is given twice"),
        (["--steps", "0"], "--steps must be >= 1"),
        (["learner.routing_replay=r2"], "the bench sets it"),
        (["--recipe", str(ROOT / "recipes" / "tiny.yaml"), "--arms", "none,r2"], "learner.routing_replay"),
    ],
)
def test_bad_input_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    assert main([*argv, "--out", str(tmp_path / "out"), "--from-runs"]) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing trained, nothing written


def test_learner_memory_floor_counts_moe_layers_by_hand() -> None:
    from bench.learner_memory import mlp_floats

    dense = {"hidden_size": 8, "intermediate_size": 32}
    assert mlp_floats(dense) == (4 * 32, 3 * 8 * 32)
    # 4 experts of width 6, top-2, hidden 8: per token, each of 2 experts saves 4 x 6 plus the token's input and
    # weighted output (2 x 8); the router its logits and probabilities (2 x 4). Parameters: 4 x 3 x 8 x 6 + 4 x 8.
    moe = dense | {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 6}
    assert mlp_floats(moe) == (2 * (24 + 16) + 8, 576 + 32)
    moe5 = {k if k != "num_experts" else "num_local_experts": v for k, v in moe.items()}  # transformers 5's to_dict
    assert mlp_floats(moe5) == mlp_floats(moe)


@pytest.mark.slow
def test_moe_replay_end_to_end_two_arms_one_step(tmp_path: Path) -> None:
    """The bench for real on the tiny MoE: none and r3, one step each in this process; r3's learner runs the
    engine's experts (disagreement 0), none's is measured; both arms sample the same first step."""
    argv = ["--steps", "1", "--arms", "none,r3", "--in-process", "--no-eval", "--out", str(tmp_path)]
    argv += ["rollout.prompts_per_step=1", "rollout.group_size=2", "rollout.max_new_tokens=4"]
    assert main(argv) == 0
    data = json.loads((tmp_path / "replay.json").read_text())
    s = data["summary"]
    assert s["r3"]["disagreement"] == 0.0 and s["none"]["disagreement"] is not None
    assert s["none"]["mismatch_kl"] is not None and s["r3"]["mismatch_kl"] is not None
    assert s["none"]["reward_first"] == s["r3"]["reward_first"]
    assert "| r3 | 1 |" in (tmp_path / "RESULTS-section.md").read_text()


def test_an_interrupted_run_starts_no_further_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.moe_replay as mr

    calls = []

    def fake_run_seed(recipe, seed, out, overrides, local, in_process):
        calls.append((out.name, seed, overrides[-1]))
        return SeedRun(seed, str(out / f"seed_{seed}"), "failed", 1.0, 130, "interrupted (exit 130)")

    monkeypatch.setattr(mr, "run_seed", fake_run_seed)
    runs = mr.run_all(ROOT / "recipes" / "tiny_moe.yaml", ["none", "r3"], [0, 1], tmp_path, ["x=1"], False, False)
    assert calls == [("none", 0, "learner.routing_replay=none")]
    assert [(r.arm, r.run.seed, r.run.cause) for r in runs[1:]] == [
        ("r3", 0, "not run"),
        ("none", 1, "not run"),
        ("r3", 1, "not run"),
    ]
