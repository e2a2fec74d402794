"""bench/seesaw.py's pure parts: paired differences, standard errors, verdicts, run reading."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.seesaw import (  # noqa: E402
    CONFIGS,
    analyse,
    conclusions,
    eval_rewards,
    overrides,
    paired,
    render,
    task_groups,
    verdict,
)


def test_paired_difference_and_standard_error_by_hand():
    a = {"t1": 0.0, "t2": 0.5, "t3": 1.0, "only_a": 1.0}
    b = {"t1": 1.0, "t2": 0.5, "t3": 1.0, "only_b": 0.0}
    p = paired(a, b)
    # diffs 1, 0, 0: mean 1/3, sample var ((2/3)^2 + 2 (1/3)^2) / 2 = 1/3, SE = sqrt(1/3 / 3) = 1/3.
    assert p["n"] == 3 and p["diff"] == pytest.approx(1 / 3) and p["se"] == pytest.approx(1 / 3)
    assert (p["a"], p["b"]) == (pytest.approx(0.5), pytest.approx(5 / 6))
    with pytest.raises(ValueError, match="share no task"):
        paired({"x": 1.0}, {"y": 1.0})


def test_standard_error_clustered_by_template_by_hand():
    # Two templates of two tasks; template A learned (diffs 1, 1), B not (0, 0). Mean 0.5; residuals per template
    # sum to +1 and -1; G = 2: sqrt(2 / 1 * (1 + 1)) / 4 = 0.5, against the per-task SE sqrt(1/3 / 4) = 0.289.
    a = {"t1": 0.0, "t2": 0.0, "t3": 0.0, "t4": 0.0}
    b = {"t1": 1.0, "t2": 1.0, "t3": 0.0, "t4": 0.0}
    p = paired(a, b, {"t1": "A", "t2": "A", "t3": "B", "t4": "B"})
    assert p["diff"] == pytest.approx(0.5) and p["se"] == pytest.approx(0.2887, abs=1e-4)
    assert p["se_group"] == pytest.approx(0.5) and p["groups"] == 2
    # One task a group (none named: each task its own) is the per-task SE exactly.
    alone = paired(a, b, {})
    assert alone["groups"] == 4 and alone["se_group"] == pytest.approx(alone["se"])
    # Learned within each template (one task of each): the clustered SE is smaller than the per-task one.
    mixed = paired(a, {"t1": 1.0, "t2": 0.0, "t3": 1.0, "t4": 0.0}, {"t1": "A", "t2": "A", "t3": "B", "t4": "B"})
    assert mixed["se_group"] == pytest.approx(0.0, abs=1e-12) and mixed["se"] > 0.28
    # One template for every task: no spread between groups to estimate from.
    one = paired(a, b, {t: "A" for t in a})
    assert one["groups"] == 1 and one["se_group"] == 0.0
    assert "se_group" not in paired(a, b), "without groups the result is the per-task one alone"


def test_task_groups_reads_templates_and_names_a_bad_line(tmp_path):
    f = tmp_path / "x.eval.jsonl"
    rows = [
        {"id": "x-1", "domain": "code", "meta": {"template": "add"}},
        {"id": "x-2", "domain": "code", "meta": {"template": "add"}},
        {"id": "x-3", "domain": "code", "meta": {}},
    ]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert task_groups([f]) == {"x-1": "x.eval.jsonl:add", "x-2": "x.eval.jsonl:add"}
    f.write_text(json.dumps(rows[0]) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"x.eval.jsonl:2: not JSON"):
        task_groups([f])


def test_pairing_removes_the_per_task_spread():
    # Hard and easy tasks, each improved by exactly 0.1: the paired SE is 0, an unpaired one would not be.
    a = {f"t{i}": (i % 2) * 0.8 for i in range(10)}
    b = {k: v + 0.1 for k, v in a.items()}
    p = paired(a, b)
    assert p["diff"] == pytest.approx(0.1) and p["se"] == pytest.approx(0.0, abs=1e-12)
    assert verdict(p) == "up"


def test_verdict_needs_two_standard_errors():
    assert verdict({"diff": 0.21, "se": 0.1, "n": 50}) == "up"
    assert verdict({"diff": 0.19, "se": 0.1, "n": 50}) == "noise"
    assert verdict({"diff": -0.3, "se": 0.1, "n": 50}) == "down"
    assert verdict({"diff": 0.0, "se": 0.0, "n": 50}) == "no change"
    assert verdict({"diff": 1.0, "se": 0.0, "n": 1}) == "n < 2"


def _write_run(path: Path, before: dict, after: dict) -> Path:
    rows = []
    for step, ev in ((0, before), (12, after)):
        for d, per in ev.items():
            rows += [{"step": step, "split": "eval", "domain": d, "task_id": t, "reward": r} for t, r in per.items()]
    rows.append({"step": 3, "split": "train", "domain": "code", "task_id": "c0", "reward": 1.0})
    path.mkdir(parents=True)
    (path / "rollouts.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path / "rollouts.jsonl"


def test_reads_first_and_last_eval_and_renders_every_comparison(tmp_path, monkeypatch):
    n = 20
    base = {d: {f"{d}{i}": float(i % 4 == 0) for i in range(n)} for d in ("code", "terminal", "tool_call")}
    up = {d: {t: 1.0 for t in per} for d, per in base.items()}
    runs = {}
    for name, after in (("joint_fixed", up), ("joint_adaptive", up), ("single_code", base)):
        runs[name] = eval_rewards(_write_run(tmp_path / name, base, after))
    first, last = runs["single_code"]
    assert first == base and last == base
    null = _write_run(tmp_path / "nulls", {"code": {"c0": None}}, {"code": {"c0": 1.0}})
    assert eval_rewards(null)[0] == {"code": {"c0": 0.0}}  # unscored counts as failed
    result = analyse(runs)
    assert verdict(result["change"]["joint_fixed"]["code"]) == "up"
    assert result["change"]["single_code"]["terminal"]["diff"] == 0.0
    assert result["joint_vs_single"]["single_code"]["tool_call"]["diff"] == pytest.approx(0.75)
    assert result["adaptive_vs_fixed"]["code"]["diff"] == 0.0
    text = render(result, {"steps": 12, "samples": 384, "wall_s": {"joint_fixed": 100.0}})
    assert "joint_fixed" in text and "+0.750 ± " in text and "What this supports" in text
    assert "joint vs single_code: code (up), terminal (up), tool_call (up)" in conclusions(result)


def test_held_out_values_leave_out_what_shaping_terms_added(tmp_path):
    # A recipe with a shaping term (rewards.format.CutTurnPenalty at 0.5): the held-out reading is the task's own
    # score, reward - reward_shaping, so the penalty neither lowers the base nor counts as a change.
    rows = [
        {"step": 0, "split": "eval", "domain": "code", "task_id": "a", "reward": -0.5, "reward_shaping": -0.5},
        {"step": 0, "split": "eval", "domain": "code", "task_id": "b", "reward": 0.5, "reward_shaping": -0.5},
        {"step": 0, "split": "eval", "domain": "code", "task_id": "c", "reward": 0.25},  # older record: no field
        {"step": 5, "split": "eval", "domain": "code", "task_id": "a", "reward": 0.0, "reward_shaping": 0.0},
        {"step": 5, "split": "eval", "domain": "code", "task_id": "b", "reward": None, "reward_shaping": 0.0},
        {"step": 5, "split": "eval", "domain": "code", "task_id": "c", "reward": 1.0, "reward_shaping": None},
    ]
    p = tmp_path / "rollouts.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    first, last = eval_rewards(p)
    assert first == {"code": {"a": 0.0, "b": 1.0, "c": 0.25}}
    assert last == {"code": {"a": 0.0, "b": 0.0, "c": 1.0}}


def test_eval_rewards_needs_two_evaluations(tmp_path):
    p = tmp_path / "rollouts.jsonl"
    p.write_text(json.dumps({"step": 0, "split": "eval", "domain": "code", "task_id": "a", "reward": 1.0}) + "\n")
    with pytest.raises(ValueError, match="two steps"):
        eval_rewards(p)


def test_configs_map_to_recipe_overrides():
    assert overrides("joint_fixed") == [] and overrides("joint_adaptive") == ["mixer.mode=adaptive"]
    assert overrides("single_terminal") == [
        "data.train_files=[data/terminal_ladder.train.jsonl]",
        "mixer.domain_weights={}",
    ]
    assert len(CONFIGS) == 5
    with pytest.raises(ValueError, match="unknown config"):
        overrides("single_math")


def test_single_domain_overrides_validate():
    """Each configuration is a valid recipe (the single-domain ones drop two train files)."""
    from rl.config.recipe import load_recipe, validate_recipe

    recipe = Path(__file__).resolve().parents[1] / "recipes" / "joint_rl.yaml"
    for c in CONFIGS:
        cfg = load_recipe(
            recipe, ["run.output_dir=/tmp/jointrl-seesaw-unused", "model.path=embedded:tiny", *overrides(c)]
        )
        validate_recipe(cfg)
        assert len(cfg.data.train_files) == (1 if c.startswith("single_") else 3)
        assert cfg.mixer.mode == ("adaptive" if c == "joint_adaptive" else "fixed")


def test_main_from_finished_runs_counts_the_recipes_samples(tmp_path, capsys):
    """``--from-runs`` re-reads run dirs; the samples per run come from the typed recipe (its
    default prompts_per_step too) and the overrides given, not only the keys the YAML lists."""
    from bench.seesaw import main

    base = {"code": {"c0": 0.0, "c1": 1.0}, "terminal": {"t0": 0.0, "t1": 0.0}}
    _write_run(tmp_path / "joint_fixed", base, base)
    argv = ["--from-runs", "--out", str(tmp_path), "--configs", "joint_fixed", "--no-write", "--steps", "3"]
    assert main(argv) == 0
    assert "3 steps per run, 96 samples per run" in capsys.readouterr().out  # 8 prompts x 4 x 3
    assert main([*argv, "rollout.prompts_per_step=6"]) == 0
    assert "72 samples per run" in capsys.readouterr().out


def test_a_variants_section_takes_its_own_key_and_title_and_a_bad_key_stops_before_training(
    tmp_path, capsys, monkeypatch
):
    """``--section-key``/``--section-title`` name the section a variant's result goes to (the default key would
    replace the default section); a key that cannot be a marker is refused before any run trains."""
    import bench.seesaw as seesaw

    monkeypatch.setattr("bench._results.machine", lambda: "test host")
    base = {"code": {"c0": 0.0, "c1": 1.0}}
    _write_run(tmp_path / "joint_fixed", base, base)
    argv = ["--from-runs", "--out", str(tmp_path), "--configs", "joint_fixed", "--steps", "3"]
    out = tmp_path / "section.md"
    assert seesaw.main([*argv, "--section-out", str(out), "--section-key", "seesaw_v2"]) == 0
    text = out.read_text()
    assert text.startswith("<!-- seesaw_v2:start -->")
    assert "<!-- seesaw_v2:end -->" in text and "## Joint vs. single-domain RL, fixed vs. adaptive mixing" in text
    assert seesaw.main([*argv, "--section-out", str(out), "--section-title", "The variant"]) == 0
    assert "<!-- seesaw:start -->\n## The variant\n" in out.read_text()

    def no_training(*a, **k):
        raise AssertionError("trained with a bad section key")

    monkeypatch.setattr(seesaw, "train", no_training)
    capsys.readouterr()
    assert seesaw.main(["--out", str(tmp_path / "new"), "--configs", "joint_fixed", "--section-key", "Bad Key"]) == 2
    assert "--section-key 'Bad Key': a section key is lower-case letters, digits and _ only" in capsys.readouterr().err


def test_runs_without_a_step0_evaluation_take_the_shared_base(tmp_path, capsys):
    """``train.eval_at_start=false`` runs hold only their final evaluation; the report pairs it
    with the base run's step-0 evaluation, and refuses a run that has neither."""
    from bench.seesaw import base_eval, main

    before = {"code": {f"c{i}": 0.0 for i in range(8)}}
    after = {"code": {f"c{i}": 1.0 for i in range(8)}}
    base_dir = tmp_path / "base"
    base_dir.mkdir()
    rows = [
        {"step": 0, "split": "eval", "domain": "code", "task_id": t, "reward": r} for t, r in before["code"].items()
    ]
    (base_dir / "rollouts.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    run = tmp_path / "joint_fixed"
    run.mkdir()
    rows = [{"step": 4, "split": "eval", "domain": "code", "task_id": t, "reward": r} for t, r in after["code"].items()]
    (run / "rollouts.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert base_eval(base_dir / "rollouts.jsonl") == before
    assert eval_rewards(run / "rollouts.jsonl", before) == (before, after)
    with pytest.raises(ValueError, match="shared base"):
        eval_rewards(run / "rollouts.jsonl")
    with pytest.raises(ValueError, match="no step-0"):
        base_eval(run / "rollouts.jsonl")
    argv = ["--from-runs", "--out", str(tmp_path), "--configs", "joint_fixed", "--no-write", "--steps", "4"]
    assert main(argv) == 0
    assert "0.000 -> 1.000, +1.000 ± 0.000 (up), n=8" in capsys.readouterr().out


def test_train_command_skips_the_step0_evaluation_except_for_base(tmp_path, monkeypatch):
    import bench.seesaw as seesaw

    seen = []

    class Done:
        returncode, stdout, stderr = 0, "", ""

    def fake_run(cmd, **kw):
        seen.append(cmd)
        Path(next(a for a in cmd if a.startswith("run.output_dir=")).split("=", 1)[1]).mkdir(parents=True)
        return Done()

    monkeypatch.setattr(seesaw.subprocess, "run", fake_run)
    seesaw.train("base", tmp_path / "base", 0, 0, [], at_start=True)
    seesaw.train("single_code", tmp_path / "sc", 6, 0, [])
    assert "train.eval_at_start=true" in seen[0] and "train.steps=0" in seen[0]
    assert "mixer.domain_weights={}" not in seen[0]
    assert "train.eval_at_start=false" in seen[1] and "mixer.domain_weights={}" in seen[1]


def test_archive_keeps_the_held_out_evaluations_and_reads_back_the_same(tmp_path, capsys):
    """``--archive`` keeps only the held-out records (plus wall time and host) of finished runs; the
    archive re-analyses to the same report as the full run directories."""
    from bench.seesaw import main

    out, dest = tmp_path / "runs", tmp_path / "kept"
    base = {"code": {f"c{i}": float(i % 3 == 0) for i in range(9)}}
    after = {"code": {f"c{i}": float(i % 2 == 0) for i in range(9)}}
    _write_run(out / "joint_fixed", base, after)
    (out / "joint_fixed" / "seesaw_wall_s.txt").write_text("123.0\n")
    _write_run(out / "single_code", base, base)  # unfinished: no wall time, so not archived
    argv = ["--from-runs", "--configs", "joint_fixed", "--no-write", "--steps", "12"]
    assert main([*argv, "--out", str(out), "--archive", str(dest)]) == 0
    first = capsys.readouterr().out
    assert sorted(p.name for p in dest.iterdir()) == ["joint_fixed"]
    kept = [json.loads(x) for x in (dest / "joint_fixed" / "eval.jsonl").read_text().splitlines()]
    assert kept and all(r["split"] == "eval" for r in kept) and len(kept) == 18
    assert (dest / "joint_fixed" / "host.txt").read_text().strip()
    assert main([*argv, "--out", str(dest)]) == 0
    assert capsys.readouterr().out == first and "| joint_fixed | 123 |" in first
