"""bench/async_bench.py: its arms, overrides, per-arm statistics and goal line on synthetic run folders, and a
tiny end-to-end smoke (slow)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench import async_bench as ab
from rl.config.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[1]


def _run_dir(tmp: Path, name: str, step_s: list[float], rewards: dict[str, float], **extra) -> Path:
    d = tmp / name
    d.mkdir()
    lines = [{"step": 0, "eval/reward": 0.1}]  # an evaluation-only record: no step time, ignored
    for i, s in enumerate(step_s, 1):
        rec = {"step": i, "timing/step_s": s, "rollout/staleness": extra.get("staleness", 0.0)}
        rec["async/idle_s/engines"] = s / 4
        rec["async/idle_s/learner"] = s / 2
        rec["async/staleness_max"] = extra.get("staleness_max", 0.0) + (i == 2)
        rec["async/dropped_groups"] = extra.get("dropped", 0.0)
        lines.append(rec)
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    evs = [{"split": "train", "step": 1, "domain": "tool_call", "task_id": "x", "reward": 1.0}]
    evs += [{"split": "eval", "step": 0, "domain": "tool_call", "task_id": t, "reward": 0.0} for t in rewards]
    last = len(step_s)
    evs += [
        {"split": "eval", "step": last, "domain": "tool_call", "task_id": t, "reward": r} for t, r in rewards.items()
    ]
    (d / "rollouts.jsonl").write_text("\n".join(json.dumps(x) for x in evs) + "\n")
    return d


def test_arms_pair_each_staleness_with_and_without_partial():
    names = [(a.name, a.k, a.partial) for a in ab.arms([0, 1, 2, 4])]
    assert names == [
        ("sync", 0, False),
        ("k1", 1, False),
        ("k1-partial", 1, True),
        ("k2", 2, False),
        ("k2-partial", 2, True),
        ("k4", 4, False),
        ("k4-partial", 4, True),
    ]
    assert [a.name for a in ab.arms([0, 2], partial=False)] == ["sync", "k2"]
    assert ab.arm_overrides(ab.Arm("sync", 0, False), 2.0) == [
        "rollout.max_staleness=0",
        "rollout.partial_rollouts=false",
    ]
    assert "algo.loss.tis_cap=2.0" in ab.arm_overrides(ab.Arm("k2-partial", 2, True), 2.0)


def test_every_arm_loads_with_the_latency_workload():
    args = ab._args([])
    for arm in ab.arms(args.ks):
        r = load_recipe(ROOT / "recipes" / "quickstart.yaml", ab.workload(args) + ab.arm_overrides(arm, 2.0))
        assert r.rollout.max_staleness == arm.k and r.rollout.partial_rollouts == arm.partial
        assert r.rollout.envs[0].kwargs["tool_latency"] == {"median_s": 0.5, "sigma": 1.0, "cap_s": 20.0, "seed": 0}
        assert r.rollout.max_turns == 3 and r.rollout.envs[0].kwargs["max_turns"] == 3
        assert r.rollout.env_workers == 64 and r.train.steps == 10


@pytest.mark.parametrize("argv", [["--staleness", "1,2"], ["--staleness", "0,-1"], ["--steps", "0"]])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit):
        ab._args(argv)


def test_summary_over_all_steps_with_idle_fractions(tmp_path):
    d = _run_dir(tmp_path, "k2", [10.0, 4.0, 6.0], {"a": 1.0}, staleness=1.5, staleness_max=1, dropped=1)
    s = ab.summarize(d, samples_per_step=64)
    assert s["steps"] == 3 and s["step_s"] == pytest.approx(20 / 3) and s["samples_per_s"] == 64 * 3 / 20
    assert s["idle"] == {"engines": pytest.approx(0.25), "learner": pytest.approx(0.5)}
    assert s["staleness"] == 1.5 and s["staleness_max"] == 2 and s["dropped"] == 3
    assert ab.heldout(d) == {"tool_call/a": 1.0}


def test_the_synchronous_idle_fractions_come_from_its_step_timings(tmp_path):
    d = tmp_path / "sync"
    d.mkdir()
    recs = [{"step": i, "timing/step_s": 10.0, "timing/generate_s": 4.0, "timing/learner_s": 5.0} for i in (1, 2)]
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in recs) + "\n")
    s = ab.summarize(d, samples_per_step=8)
    assert s["idle"] == {"engines": pytest.approx(0.6), "learner": pytest.approx(0.5)}
    assert s["samples_per_s"] == pytest.approx(0.8) and s["staleness"] == 0.0 and s["dropped"] == 0


def _runs(tmp_path, k2_step_s: float, k2_rewards: dict[str, float]) -> dict:
    sync_rewards = {t: float(i % 2) for i, t in enumerate("abcdefgh")}
    out = {}
    for name, step_s, rw in (("sync", 8.0, sync_rewards), ("k2", k2_step_s, k2_rewards)):
        d = _run_dir(tmp_path, name, [step_s] * 3, rw)
        out[name] = {**ab.summarize(d, 64), "heldout": ab.heldout(d), "wall_s": 1.0}
    return out


def test_the_goal_is_met_when_fast_enough_and_within_two_se(tmp_path):
    rewards = {t: float(i % 2) for i, t in enumerate("abcdefgh")}
    rewards["a"] = 1.0  # one task better: +0.125 +- 0.125, within 2 SE
    runs = _runs(tmp_path, 8.0 / 1.5, rewards)
    cmp = ab.compare(runs)
    assert cmp["k2"]["speedup"] == pytest.approx(1.5)
    p = cmp["k2"]["heldout"]
    assert p["n"] == 8 and p["diff"] == pytest.approx(0.125) and p["se"] == pytest.approx(0.125)
    (line,) = ab.goal([ab.Arm("sync", 0, False), ab.Arm("k2", 2, False)], cmp)
    assert line.endswith("goal met") and "1.50x" in line


def test_the_goal_is_not_met_when_slow_or_worse(tmp_path):
    worse = {t: 0.0 for t in "abcdefgh"}  # -0.5 +- 0.189: beyond 2 SE
    runs = _runs(tmp_path, 8.0 / 1.2, worse)
    arm_list = [ab.Arm("sync", 0, False), ab.Arm("k2", 2, False)]
    (line,) = ab.goal(arm_list, ab.compare(runs))
    assert "not met" in line and "1.20x < 1.4x" in line and "not within 2 SE" in line
    se = math.sqrt(0.25 * 8 / 7 / 8)
    assert f"-0.500 +- {se:.3f}" in line
    assert ab.goal([ab.Arm("sync", 0, False)], ab.compare({"sync": runs["sync"]})) == [
        "no max_staleness 2 arm ran: goal not evaluated"
    ]


def test_render_has_a_row_per_arm_and_the_goal_line(tmp_path):
    runs = _runs(tmp_path, 4.0, {t: float(i % 2) for i, t in enumerate("abcdefgh")})
    meta = dict(recipe="r.yaml", latency="median 0.5 s", turns=3, steps=3, samples_per_step=64, seed=0)
    meta.update(tis_cap=2.0, eval_limit=8, host="cpu")
    body = ab.render([ab.Arm("sync", 0, False), ab.Arm("k2", 2, False)], runs, meta)
    rows = [x for x in body.splitlines() if x.startswith("| sync") or x.startswith("| k2")]
    assert len(rows) == 2 and "| 2.00 |" in rows[1] and "25% | 50% |" in rows[1]
    assert "**k2: 2.00x synchronous samples/s, held-out +0.000 +- 0.000 (n=8): goal met**" in body
    header, sep = body.split("\n\n")[1].splitlines()[:2]
    assert header.count("|") == sep.count("|")


@pytest.mark.slow
def test_the_bench_runs_two_tiny_arms_end_to_end(tmp_path):
    """sync and max_staleness 1 on the tiny recipe, 2 steps each, through Ray + vLLM; nothing written."""
    argv = ["--recipe", str(ROOT / "recipes" / "tiny.yaml"), "--staleness", "0,1", "--no-partial", "--steps", "2"]
    argv += ["--prompts", "2", "--group", "2", "--eval-limit", "2", "--median-s", "0.05", "--cap-s", "1"]
    argv += ["--work-dir", str(tmp_path), "--no-write"]
    assert ab.main(argv) == 0
    for name in ("sync", "k1"):
        s = ab.summarize(tmp_path / name, 4)
        assert s["steps"] == 2 and s["samples_per_s"] > 0
        assert ab.heldout(tmp_path / name)
    assert not (tmp_path / "k1-partial").exists()


def test_the_multi_turn_task_set_loads_and_validates(tmp_path):
    from rl.cli.main import main

    args = ab._args(["--tasks", "tools"])
    ov = ab.workload(args) + ab.arm_overrides(ab.Arm("k2-partial", 2, True), 2.0)
    r = load_recipe(ROOT / "recipes" / "quickstart.yaml", ov)
    assert [x.cls for x in r.rewards] == ["rewards.toolcall.ToolCallReward", "rewards.toolcall.ToolAnswerReward"]
    assert r.data.train_files == ["data/toolcall_tasks.train.jsonl"]
    out = f"run.output_dir={tmp_path / 'run'}"
    assert main(["validate", str(ROOT / "recipes" / "quickstart.yaml"), *ov, out]) == 0


def test_a_failed_arm_is_named_and_the_others_reported(tmp_path, monkeypatch, capsys):
    def fake_train(recipe, out, overrides):
        if "rollout.max_staleness=2" in overrides:
            raise ab.RunFailed("jointrl train ... failed (exit 3):\nOOM")
        _run_dir(out.parent, out.name, [8.0, 8.0], {"a": 1.0, "b": 0.0})
        return 10.0

    monkeypatch.setattr(ab, "train", fake_train)
    argv = ["--staleness", "0,1,2", "--no-partial", "--work-dir", str(tmp_path), "--no-write"]
    assert ab.main(argv) == 1
    out = capsys.readouterr().out
    assert "| k1 | 1 | no |" in out and "| k2 |" not in out
    assert "Arm k2 failed: jointrl train ... failed (exit 3):" in out
    assert "no max_staleness 2 arm ran: goal not evaluated" in out

    def sync_fails(recipe, out, overrides):
        raise ab.RunFailed("boom")

    monkeypatch.setattr(ab, "train", sync_fails)
    with pytest.raises(SystemExit, match="the synchronous arm failed"):
        ab.main(["--work-dir", str(tmp_path / "again"), "--no-write"])


def test_the_session_workload_writes_its_tasks_and_validates(tmp_path):
    """--tasks chain (the default): sessions of --turns ladder requests, written into the work folder, train and
    held-out, loading with the workload's env (max_turns = the session's length) and the recipe's reward."""
    from envs.io import load_tasks
    from rl.cli.main import main

    args = ab._args(["--turns", "3"])
    assert args.tasks == "chain"
    data = ab.chain_files(tmp_path / "tasks", args.turns, args.seed)
    ov = ab.workload(args) + data + ab.arm_overrides(ab.Arm("k2", 2, False), 2.0)
    r = load_recipe(ROOT / "recipes" / "quickstart.yaml", ov)
    train, held = (load_tasks(p) for p in (r.data.train_files[0], r.data.eval_files[0]))
    assert len(train) == 120 and len(held) == 100
    assert all(len(t.tool_call.followups) == 2 and t.meta["split"] == "train" for t in train)
    assert all(t.meta["split"] == "eval" for t in held)
    assert r.rollout.envs[0].kwargs["max_turns"] == 3
    out = f"run.output_dir={tmp_path / 'run'}"
    assert main(["validate", str(ROOT / "recipes" / "quickstart.yaml"), *ov, out]) == 0


def test_from_runs_reports_the_finished_arms_and_names_the_others(tmp_path, monkeypatch, capsys):
    """--from-runs trains nothing: arms whose runs finished (bench_wall_s.txt) are read as fresh ones would be, an
    arm without a finished run is named as not run, and the precision comes from the sync run's resolved recipe."""
    import yaml

    from rl.config.loading import recipe_to_dict

    def no_training(*a, **k):
        raise AssertionError("--from-runs must not train")

    monkeypatch.setattr(ab, "train", no_training)
    for name, steps in (("sync", [10.0, 10.0]), ("k1", [8.0, 8.0]), ("k2", [5.0, 5.0])):
        _run_dir(tmp_path, name, steps, {"a": 1.0, "b": 0.0})
        (tmp_path / name / "bench_wall_s.txt").write_text("30.0\n")
    (tmp_path / "k2" / "bench_wall_s.txt").unlink()  # k2 was stopped before it finished
    r = load_recipe(ROOT / "recipes" / "quickstart.yaml", ["model.engine_dtype=bfloat16"])
    (tmp_path / "sync" / "recipe.resolved.yaml").write_text(yaml.safe_dump(recipe_to_dict(r)))
    argv = ["--staleness", "0,1,2", "--no-partial", "--work-dir", str(tmp_path), "--from-runs", "--no-write"]
    assert ab.main(argv) == 0
    out = capsys.readouterr().out
    assert "| sync | 0 | no | 6.40 | 1.00 |" in out and "| k1 | 1 | no | 8.00 | 1.25 |" in out  # 64 samples a step
    assert f"Arm k2 not run: no finished run in {tmp_path / 'k2'}" in out and "| k2 |" not in out
    assert "Precision pinned for every arm: engine bfloat16" in out
    with pytest.raises(SystemExit):
        ab._args(["--from-runs"])  # no --work-dir
    (tmp_path / "sync" / "bench_wall_s.txt").unlink()
    with pytest.raises(SystemExit, match="no finished synchronous run"):
        ab.main(argv)


def test_a_run_of_some_arms_writes_its_own_section_beside_the_task_sets(tmp_path, monkeypatch):
    """--section KEY writes a new RESULTS.md section (the task set's title plus the max_staleness values run) and
    leaves the task set's own section as it was; without it, the task set's section is replaced."""
    from bench import _results

    results = tmp_path / "RESULTS.md"
    monkeypatch.setattr(_results, "RESULTS", results)
    _results.write_section("async_sessions", "Earlier arms", "| k1 | kept |\n")

    def fake_train(recipe, out, overrides):
        _run_dir(out.parent, out.name, [8.0, 8.0], {"a": 1.0, "b": 0.0})
        return 10.0

    monkeypatch.setattr(ab, "train", fake_train)
    monkeypatch.setattr(ab, "pinned_precision", lambda recipe, local: ([], "pinned"))
    monkeypatch.setattr(ab, "chain_files", lambda *a: [])
    (tmp_path / "w").mkdir(), (tmp_path / "v").mkdir()
    assert ab.main(["--staleness", "0,4", "--no-partial", "--work-dir", str(tmp_path / "w"), "--section", "k4"]) == 0
    text = results.read_text()
    assert "| k1 | kept |" in text and "<!-- k4:start -->" in text
    assert "3-request tool-call sessions, max_staleness 0, 4" in text
    assert text.index("<!-- async_sessions:end -->") < text.index("<!-- k4:start -->")
    assert ab.main(["--staleness", "0,4", "--no-partial", "--work-dir", str(tmp_path / "v")]) == 0
    assert "| k1 | kept |" not in results.read_text() and "<!-- k4:start -->" in results.read_text()
