"""bench/seeds.py's pure parts: the seed list, the recipe checks, failure causes and the across-seed statistics
(against hand-computed values); bench/seesaw.py's several-seed analysis on the same statistics."""

from __future__ import annotations

import functools
import json
import math
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.seeds import (  # noqa: E402
    SeedRun,
    SweepError,
    across,
    across_verdict,
    analyse,
    check_recipe,
    failure_cause,
    main,
    parse_seeds,
    render,
)

# Four held-out tasks, three seeds (base -> final per task):
#   seed 0: diffs 1, 1, 0, 0   mean 0.5,  sample var 1/3, SE sqrt(1/3 / 4) = 0.2887, +1.7 SE: not cleared
#   seed 1: diffs 1, 1, 1, 0   mean 0.75, sample var 1/4, SE 0.25,                 +3.0 SE: cleared
#   seed 2: diffs 0, 0, -1, 0  mean -0.25, sample var 1/4, SE 0.25,                -1.0 SE: below base
# Gains 0.5, 0.75, -0.25: mean 1/3; deviations 1/6, 5/12, -7/12; SD sqrt((4 + 25 + 49) / 144 / 2) = 0.5204.
BASE = {"t1": 0.0, "t2": 0.0, "t3": 1.0, "t4": 0.0}
FINAL = {
    0: {"t1": 1.0, "t2": 1.0, "t3": 1.0, "t4": 0.0},
    1: {"t1": 1.0, "t2": 1.0, "t3": 1.0, "t4": 1.0},
    2: {"t1": 0.0, "t2": 0.0, "t3": 0.0, "t4": 0.0},
}


# A sweep's report header, as render() needs it.
META = {"recipe": "recipes/x.yaml", "overrides": [], "runtime": "Ray + vLLM", "steps": 2, "samples": 32, "host": "cpu"}


def _evals() -> dict:
    # tool_call improves by exactly 0.25 on every task in every seed: SE 0, cleared, SD 0.
    tc_base = {f"q{i}": 0.5 for i in range(5)}
    tc_final = {k: 0.75 for k in tc_base}
    return {s: ({"code": BASE, "tool_call": tc_base}, {"code": FINAL[s], "tool_call": tc_final}) for s in FINAL}


def test_across_seed_statistics_by_hand():
    result = analyse(_evals())
    per = result["per_seed"]["code"]
    assert per[0]["diff"] == pytest.approx(0.5) and per[0]["se"] == pytest.approx(math.sqrt(1 / 12))
    assert per[1]["diff"] == pytest.approx(0.75) and per[1]["se"] == pytest.approx(0.25)
    assert per[2]["diff"] == pytest.approx(-0.25) and per[2]["se"] == pytest.approx(0.25)
    s = result["across"]["code"]
    assert s["k"] == 3 and s["mean"] == pytest.approx(1 / 3)
    assert s["sd"] == pytest.approx(math.sqrt(78 / 288)) and s["sd"] == pytest.approx(0.5204, abs=1e-4)
    assert (s["cleared"], s["below"]) == (1, 1), "only seed 1 is beyond 2 SE; seed 2 ended below its base"
    assert s["base"] == pytest.approx(0.25) and s["final"] == pytest.approx((0.75 + 1.0 + 0.0) / 3)
    assert s["min"] == pytest.approx(-0.25)
    tc = result["across"]["tool_call"]
    assert tc["mean"] == pytest.approx(0.25) and tc["sd"] == pytest.approx(0.0, abs=1e-12)
    assert (tc["cleared"], tc["below"]) == (3, 0), "a uniform gain (SE 0) counts as cleared"


def test_two_se_boundary_and_one_seed():
    just_under = {"diff": 0.19, "se": 0.1, "n": 50, "a": 0.2, "b": 0.39}
    just_over = {"diff": 0.21, "se": 0.1, "n": 50, "a": 0.2, "b": 0.41}
    s = across([just_under, just_over])
    assert s["cleared"] == 1 and s["sd"] == pytest.approx(math.sqrt(2 * 0.01**2))
    one = across([just_over])
    assert one["sd"] is None and one["cleared"] == 1 and across_verdict(one) == "one seed"
    with pytest.raises(ValueError, match="no seed"):
        across([])


def test_across_verdict_uses_the_across_seed_standard_error():
    # mean -0.1, SD 0.05 over 4 seeds: SE 0.025, -4 SE -> down; SD 0.2: SE 0.1, -1 SE -> noise.
    def stats(gains):
        return across([{"diff": g, "se": 0.01, "n": 10, "a": 0.5, "b": 0.5 + g} for g in gains])

    assert across_verdict(stats([-0.15, -0.05, -0.1, -0.1])) == "down"
    assert across_verdict(stats([-0.3, 0.1, -0.1, -0.1])) == "noise"
    assert across_verdict(stats([0.2, 0.2])) == "up"


def test_render_shows_each_seed_the_spread_and_the_failures():
    runs = [SeedRun(0, "r0", "done", 12.0), SeedRun(1, "r1", "done", 13.0), SeedRun(2, "r2", "done", 11.0)]
    runs.append(SeedRun(3, "r3", "failed", 2.0, 3, "step 1: RuntimeError: boom (exit 3)"))
    text = render(analyse(_evals()), runs, META)
    assert "0.250 -> 0.750, +0.500 ± 0.289 (+1.7 SE), n=4" in text
    assert "0.250 -> 0.000, -0.250 ± 0.250 (-1.0 SE), n=4" in text
    assert "| code | 0.250 | 0.583 | +0.333 ± 0.520 | 1 of 3 | 1 of 3 |" in text
    assert "| tool_call | 0.500 | 0.750 | +0.250 ± 0.000 | 3 of 3 | 0 of 3 |" in text
    assert "seed 3: step 1: RuntimeError: boom (exit 3)" in text
    assert "tool_call cleared two paired SE in every one of the 3 finished seeds" in text
    assert "code cleared in 1 of 3" in text and "ended below base: code (1 of 3)" in text


def test_render_adds_the_se_by_template_where_tasks_share_templates():
    # code's t1, t2 one template, t3, t4 another: seed 1's diffs 1, 1 | 1, 0 -> residual sums +0.5, -0.5, G 2:
    # SE sqrt(2 * 0.5) / 4 = 0.25 (+3.0 SE, cleared); seed 0's 1, 1 | 0, 0 -> SE 0.5 (+1.0 SE, not cleared).
    groups = {"t1": "A", "t2": "A", "t3": "B", "t4": "B"}
    result = analyse(_evals(), groups)
    assert result["per_seed"]["code"][1]["se_group"] == pytest.approx(0.25)
    assert result["per_seed"]["code"][0]["se_group"] == pytest.approx(0.5)
    assert result["across"]["code"]["cleared_group"] == 1
    runs = [SeedRun(s, f"r{s}", "done", 10.0) for s in FINAL]
    text = render(result, runs, META)
    assert "| 1 | +0.750 ± 0.250 (+3.0 SE), G=2 | +0.250 ± 0.000 (SE 0), G=5 |" in text
    assert "| code | 0.250 | 0.583 | +0.333 ± 0.520 | 1 of 3 | 1 of 3 | 1 of 3 |" in text
    assert "with the SE clustered by template, seeds beyond two SE: code 1 of 3." in text
    # Where the gains sit: A (t1, t2) moved +1 in seeds 0 and 1; B (t3, t4) +0.5 in seed 1, -0.5 in seed 2.
    assert "| code | A (2) | +1.00 | +1.00 | +0.00 |" in text and "| code | B (2) | +0.00 | +0.50 | -0.50 |" in text
    assert result["templates"] == {
        "code": {"A": {"n": 2, "diffs": {0: 1.0, 1: 1.0, 2: 0.0}}, "B": {"n": 2, "diffs": {0: 0.0, 1: 0.5, 2: -0.5}}}
    }
    assert "| tool_call | 0.500 | 0.750 | +0.250 ± 0.000 | 3 of 3 | - | 0 of 3 |" in text, "no shared template"
    # Every task its own template (or none named): nothing the per-task SE does not say, so no extra table.
    plain = render(analyse(_evals(), {}), runs, META)
    assert "by template" not in plain and plain == render(analyse(_evals()), runs, META)
    assert "Where the gains sit" not in plain


def _finished_sweep(tmp_path: Path, rows: list[dict], seeds: tuple[int, ...]) -> tuple[Path, Path]:
    """A recipe whose held-out file holds ``rows``, and a sweep folder with a finished run per seed whose
    held-out records are BASE at step 0 and FINAL[seed] at step 2 (code)."""
    (tmp_path / "held.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("data: {train_files: [held.jsonl], eval_files: [held.jsonl]}\n")
    out = tmp_path / "sweep"
    for s in seeds:
        d = out / f"seed_{s}"
        d.mkdir(parents=True)
        lines = [
            {"step": st, "split": "eval", "domain": "code", "task_id": t, "reward": r}
            for st, per in ((0, BASE), (2, FINAL[s]))
            for t, r in per.items()
        ]
        (d / "rollouts.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
        (d / "recipe.resolved.yaml").write_text(f"run: {{seed: {s}}}\n")
        (d / "DONE").write_text("")
    return recipe, out


def test_from_runs_reads_the_templates_of_the_recipes_held_out_files(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("bench._results.machine", lambda: "test host")
    rows = [
        {"id": t, "domain": "code", "messages": [{"role": "user", "content": "q"}], "meta": {"template": g}}
        for t, g in (("t1", "A"), ("t2", "A"), ("t3", "B"), ("t4", "B"))
    ]
    recipe, out = _finished_sweep(tmp_path, rows, (0, 1))
    assert main([str(recipe), "--seeds", "0,1", "--out", str(out), "--from-runs"]) == 0
    text = capsys.readouterr().out
    assert "| 0 | +0.500 ± 0.500 (+1.0 SE), G=2 |" in text and "| 1 | +0.750 ± 0.250 (+3.0 SE), G=2 |" in text
    saved = json.loads((out / "sweep.json").read_text())
    assert saved["per_seed"]["code"]["1"]["groups"] == 2 and saved["across"]["code"]["cleared_group"] == 1


def test_from_runs_against_a_shared_base_reads_the_seesaws_runs_as_a_sweep(tmp_path, capsys, monkeypatch):
    """bench/seesaw.py's OUT/<config>/seed_<S> runs skip their step-0 evaluation (one shared base in OUT/base):
    ``--from-runs --base OUT/base`` pairs each seed's last evaluation with that base, and reads the seesaw's walls."""
    monkeypatch.setattr("bench._results.machine", lambda: "test host")
    recipe = tmp_path / "r.yaml"
    (tmp_path / "held.jsonl").write_text("")
    recipe.write_text("data: {train_files: [held.jsonl], eval_files: [held.jsonl]}\n")
    _write_run(tmp_path / "base", 0, {"code": BASE})
    out = tmp_path / "joint_fixed"
    for s in (0, 1):
        _write_run(out / f"seed_{s}", 2, {"code": FINAL[s]})
        (out / f"seed_{s}" / "recipe.resolved.yaml").write_text(f"run: {{seed: {s}}}\n")
        (out / f"seed_{s}" / "DONE").write_text("")
    argv = [str(recipe), "--seeds", "0,1", "--out", str(out), "--from-runs"]
    assert main([*argv, "--base", str(tmp_path / "base")]) == 0
    text = capsys.readouterr().out
    assert "| 0 | 5 | 0.250 -> 0.750, +0.500 ± 0.289 (+1.7 SE), n=4 |" in text
    assert "| 1 | 5 | 0.250 -> 1.000, +0.750 ± 0.250 (+3.0 SE), n=4 |" in text
    assert f"base = one shared step-0 evaluation of the base model (`{tmp_path / 'base'}`)" in text
    # Without the base each run holds one evaluation: named, left out, exit 3.
    assert main(argv) == 3
    assert "needs held-out evaluations at two steps" in capsys.readouterr().err
    assert main([*argv[:-1], "--base", str(tmp_path / "base")]) == 2
    assert "--base reads finished runs against a shared base evaluation: add --from-runs" in capsys.readouterr().err
    assert main([*argv, "--base", str(out / "seed_0")]) == 2
    err = capsys.readouterr().err
    assert f"--base {out / 'seed_0'}: " in err and "holds no step-0 held-out evaluation" in err


@pytest.mark.parametrize(
    "text, msg",
    [
        ("0,x,2", "'x' is not an integer"),
        ("1.5", "'1.5' is not an integer"),
        ("", "no seed given"),
        (" , ", "no seed given"),
        ("3,1,3", "seed 3 is given twice"),
    ],
)
def test_seed_list_must_be_distinct_integers(text, msg):
    with pytest.raises(SweepError, match=msg):
        parse_seeds(text)


def test_seed_list_parses():
    assert parse_seeds("0, 1,2") == [0, 1, 2] and parse_seeds("7") == [7] and parse_seeds("-1,5") == [-1, 5]


def test_bad_seeds_exit_2_with_one_message(capsys):
    assert main(["recipes/tiny.yaml", "--seeds", "0,one"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "seeds: error: --seeds: 'one' is not an integer (e.g. --seeds 0,1,2)"


def _no_eval(d: dict) -> None:
    d["data"]["eval_files"] = []


def _no_start(d: dict) -> None:
    d["train"]["eval_at_start"] = False


def test_recipe_checks_name_the_recipe_and_the_cause(recipe_copy, tmp_path):
    out = tmp_path / "sweep"
    ok = check_recipe(recipe_copy("tiny.yaml"), [], [4, 5], out)
    assert ok.run.seed == 4 and Path(ok.run.output_dir) == out / "seed_4"
    r = recipe_copy("tiny.yaml", filename="noeval.yaml", edit=_no_eval)
    with pytest.raises(SweepError, match=r"noeval\.yaml: no data\.eval_files"):
        check_recipe(r, [], [0], out)
    r = recipe_copy("tiny.yaml", filename="nostart.yaml", edit=_no_start)
    with pytest.raises(SweepError, match=r"nostart\.yaml: train\.eval_at_start is false"):
        check_recipe(r, [], [0], out)
    r = recipe_copy("tiny.yaml")
    with pytest.raises(SweepError, match=r"tiny\.yaml: run\.seed is given as an override"):
        check_recipe(r, ["run.seed=3"], [0], out)
    with pytest.raises(SweepError, match=r"tiny\.yaml, seed 2: .*train\.stepz"):
        check_recipe(r, ["train.stepz=3"], [2], out)


def test_recipe_without_eval_files_exits_2_before_training(recipe_copy, tmp_path, capsys):
    r = recipe_copy("tiny.yaml", filename="noeval.yaml", edit=_no_eval)
    assert main([str(r), "--seeds", "0,1", "--out", str(tmp_path / "sweep"), "--local"]) == 2
    assert "noeval.yaml: no data.eval_files" in capsys.readouterr().err
    assert not (tmp_path / "sweep").exists(), "nothing trained, nothing written"


def test_flag_combinations_are_checked(capsys):
    assert main(["recipes/tiny.yaml", "--seeds", "0", "--in-process"]) == 2
    assert "add --local" in capsys.readouterr().err
    assert main(["recipes/tiny.yaml", "--seeds", "0", "--local", "--in-process", "--parallel", "2"]) == 2
    assert "one seed at a time" in capsys.readouterr().err
    assert main(["recipes/tiny.yaml", "--seeds", "0", "--parallel", "0"]) == 2
    assert "--parallel must be >= 1" in capsys.readouterr().err


def test_failure_cause_takes_the_runs_own_message():
    log = "jointrl: model embedded:tiny\nstep 1 ...\njointrl: run stopped: step 2: RuntimeError: x\n(outputs so far kept)\n"
    assert failure_cause(log, 3) == "step 2: RuntimeError: x (exit 3)"
    assert failure_cause("jointrl: error: recipe not found: r.yaml\n", 2) == "recipe not found: r.yaml (exit 2)"
    tb = "Traceback (most recent call last):\n  File x\nValueError: no training tasks\n"
    assert failure_cause(tb, 1) == "ValueError: no training tasks (exit 1)"
    assert failure_cause("", -9) == "no output (exit -9)"


# ---------------------------------------------------------------------------- bench/seesaw.py --seeds


def four_task_eval(other: str, code_ones: int, other_ones: int) -> dict:
    """A held-out evaluation of two domains, four tasks each (code c0-c3, ``other`` t0-t3): the first
    ``code_ones`` / ``other_ones`` tasks solved (1.0), the rest not."""
    return {
        "code": {f"c{i}": float(i < code_ones) for i in range(4)},
        other: {f"t{i}": float(i < other_ones) for i in range(4)},
    }


def test_seesaw_over_seeds_reports_mean_and_sd_of_gains_and_of_joint_minus_single():
    from bench.seesaw import analyse_seeds, render_seeds

    # Two domains, four tasks each, two seeds. joint gains on both; single_code gains more on code in seed 0 only.
    ev = functools.partial(four_task_eval, "terminal")  # ev(code tasks solved, terminal tasks solved)
    z = ev(0, 0)

    runs = {
        "joint_fixed": {0: (z, ev(2, 2)), 1: (z, ev(2, 2))},
        "single_code": {0: (z, ev(4, 0)), 1: (z, ev(2, 0))},
    }
    result = analyse_seeds(runs)
    g = result["gains"]["joint_fixed"]["code"]
    assert g["mean"] == pytest.approx(0.5) and g["sd"] == pytest.approx(0.0) and g["k"] == 2
    sc = result["gains"]["single_code"]["code"]
    # gains 1.0 (SE 0: cleared) and 0.5 (diffs 1,1,0,0: SE 0.2887, +1.7: not): mean 0.75, SD sqrt(0.125)
    assert sc["mean"] == pytest.approx(0.75) and sc["sd"] == pytest.approx(math.sqrt(0.125)) and sc["cleared"] == 1
    vs = result["joint_vs_single"]["single_code"]
    # joint - single on code: seed 0 -0.5, seed 1 0.0: mean -0.25, SD sqrt(0.125) -> SE 0.25: -1 SE, noise
    assert vs["code"]["mean"] == pytest.approx(-0.25) and across_verdict(vs["code"]) == "noise"
    assert vs["terminal"]["mean"] == pytest.approx(0.5) and across_verdict(vs["terminal"]) == "up"
    meta = {"seeds": [0, 1], "steps": 4, "samples": 128, "wall_s": {"base": 10.0}, "host": "cpu"}
    text = render_seeds(result, meta)
    assert "| single_code | +0.750 ± 0.354 (1 of 2 > 2 SE) |" in text
    assert "-0.250 ± 0.354 (noise)" in text and "on code, joint vs single_code: within the seeds' noise" in text
    assert "by template" not in text, "no templates given: the per-task count alone"
    # c0, c1 one template, c2, c3 another: single_code's seed 1 (diffs 1, 1, 0, 0) is one template learned, +1.0 SE
    # clustered; its seed 0 (every task) clears; joint's code gains (1, 1, 0, 0) clear in neither seed.
    groups = {"c0": "A", "c1": "A", "c2": "B", "c3": "B"}
    text = render_seeds(analyse_seeds(runs, groups), meta)
    assert "| single_code | +0.750 ± 0.354 (1 of 2 > 2 SE; 1 by template) |" in text
    assert "| joint_fixed | +0.500 ± 0.000 (0 of 2 > 2 SE; 0 by template) |" in text
    assert "'by template': the seeds whose gain cleared two SE clustered" in text


def test_seesaw_over_seeds_compares_adaptive_mixing_with_each_single_domain_run_and_with_fixed_mixing():
    from bench.seesaw import analyse_seeds, render_seeds

    ev = functools.partial(four_task_eval, "tool_call")  # ev(code tasks solved, tool_call tasks solved)
    z = ev(0, 0)

    runs = {
        "joint_fixed": {0: (z, ev(2, 1)), 1: (z, ev(2, 1))},
        "joint_adaptive": {0: (z, ev(1, 3)), 1: (z, ev(2, 3)), 2: (z, ev(4, 4))},
        "single_tool_call": {0: (z, ev(0, 3)), 1: (z, ev(0, 4))},
    }
    result = analyse_seeds(runs)
    # adaptive - tool-only on tool calls, seeds 0 and 1 (the ones both hold): 0.0, -0.25 -> mean -0.125, SD 0.1768
    a = result["adaptive_vs_single"]["single_tool_call"]["tool_call"]
    assert a["k"] == 2 and a["mean"] == pytest.approx(-0.125) and a["sd"] == pytest.approx(math.sqrt(0.03125))
    # adaptive - fixed, seeds 0 and 1: code -0.25, 0.0; tool calls +0.5, +0.5 (SD 0: beyond any SE, up)
    f = result["adaptive_vs_fixed"]
    assert f["code"]["mean"] == pytest.approx(-0.125) and f["tool_call"]["mean"] == pytest.approx(0.5)
    # the fixed comparison is unchanged by the adaptive runs: fixed - tool-only on tool calls -0.5, -0.75
    assert result["joint_vs_single"]["single_tool_call"]["tool_call"]["mean"] == pytest.approx(-0.625)
    meta = {"seeds": [0, 1, 2], "steps": 4, "samples": 128, "wall_s": {"base": 10.0}, "host": "cpu"}
    text = render_seeds(result, meta)
    assert "Joint (adaptive) minus single-domain" in text
    assert "| single_tool_call | +0.375 ± 0.177 (up) | - | -0.125 ± 0.177 (noise) |" in text
    assert "| adaptive - fixed | -0.125 ± 0.177 (noise) | - | +0.500 ± 0.000 (up) |" in text
    assert "on tool_call, joint (adaptive) vs single_tool_call: within the seeds' noise" in text
    assert "on tool_call, joint vs single_tool_call: joint loses beyond the seeds' noise" in text
    assert "adaptive vs fixed: tool_call (up)" in text
    # without adaptive runs none of it is there
    plain = analyse_seeds({k: v for k, v in runs.items() if k != "joint_adaptive"})
    assert plain["adaptive_vs_single"] == {} and plain["adaptive_vs_fixed"] == {}
    assert "adaptive" not in render_seeds(plain, meta)


def _write_run(path: Path, step: int, ev: dict) -> None:
    path.mkdir(parents=True)
    rows = [
        {"step": step, "split": "eval", "domain": d, "task_id": t, "reward": r}
        for d, per in ev.items()
        for t, r in per.items()
    ]
    (path / "rollouts.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (path / "seesaw_wall_s.txt").write_text("5.0\n")


def test_seesaw_seeds_mode_reads_seed_folders_against_the_shared_base(tmp_path, capsys, monkeypatch):
    from bench.seesaw import main as seesaw

    monkeypatch.setattr("bench._results.machine", lambda: "test host")  # torch and vllm versions: slow imports

    base = {"code": {f"c{i}": 0.0 for i in range(4)}}
    _write_run(tmp_path / "base", 0, base)
    for s, ones in ((0, 4), (1, 2)):
        _write_run(tmp_path / "joint_fixed" / f"seed_{s}", 3, {"code": {f"c{i}": float(i < ones) for i in range(4)}})
    section = tmp_path / "section.md"
    argv = ["--from-runs", "--out", str(tmp_path), "--configs", "joint_fixed", "--seeds", "0,1", "--steps", "3"]
    assert seesaw([*argv, "--section-out", str(section)]) == 0
    out = capsys.readouterr().out
    assert "| joint_fixed | +0.750 ± 0.354 (1 of 2 > 2 SE) | - | - |" in out
    text = section.read_text()
    assert text.startswith("<!-- seesaw_seeds:start -->") and "+0.750 ± 0.354" in text
    assert seesaw([*argv[:-4], "--seeds", "0,zero", "--no-write"]) == 2
    assert "'zero' is not an integer" in capsys.readouterr().err


def test_seed_report_draws_one_held_out_line_per_seed_and_domain(tmp_path):
    from rl.cli.report import render_seed_report

    runs = {}
    for seed, (c0, c2) in enumerate(((0.1, 0.4), (0.2, 0.1))):
        d = tmp_path / f"seed_{seed}"
        d.mkdir()
        recs = [
            {"step": 0, "eval/reward/code/mean": c0, "eval/reward/tool_call/mean": 0.5},
            {"step": 1, "reward/code/mean": 0.3},
            {"step": 2, "eval/reward/code/mean": c2, "eval/reward/tool_call/mean": 0.6},
        ]
        (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
        runs[f"seed {seed}"] = d
    runs["seed 9 <failed>"] = tmp_path / "absent"
    html = render_seed_report(runs, "seed sweep: x.yaml", summary="| a | <b> |")
    assert html.count('<svg class="chart" data-series="2"') == 2, "code and tool_call, two seeds each"
    assert "Held-out reward, code (eval/reward/code/mean)" in html and "Held-out reward, tool_call" in html
    assert re.findall(r'<path class="series" data-name="([^"]+)"', html) == ["seed 0", "seed 1"] * 2
    assert "no metrics.jsonl: seed 9 &lt;failed&gt;" in html and "| a | &lt;b&gt; |" in html
    assert "<title>seed 1 step 2: 0.1</title>" in html


def test_precision_auto_is_timed_once_and_pinned_for_every_seed(recipe_copy, monkeypatch):
    """``learner.precision: auto`` picks by timing (a loaded host could pick differently per seed): the sweep
    resolves it once and passes the result to every run; a recipe without ``auto`` or on a Ray cluster
    elsewhere gets nothing."""
    from rl.config.recipe import load_recipe
    from rl.trainer import precision

    from bench.seeds import pinned_precision

    monkeypatch.setattr(precision, "pick", lambda device, seconds=0.4: precision.Choice(False, 100.0, 20.0))
    auto = load_recipe(recipe_copy("tiny.yaml"), ["learner.precision=auto", "model.engine_dtype=auto"])
    keys, note = pinned_precision(auto, local=True)
    assert keys == [
        "learner.precision=manual",
        "model.autocast=false",
        "model.engine_dtype=float32",
        "model.reference_dtype=float32",
    ]
    assert "fp32" in note and "engine_dtype auto: float32" in note
    load_recipe(recipe_copy("tiny.yaml"), keys)  # every pinned key is a valid override
    assert pinned_precision(load_recipe(recipe_copy("tiny.yaml")), local=True) == ([], "")
    cluster = load_recipe(recipe_copy("tiny.yaml"), ["learner.precision=auto", "run.ray_address=ray://h:10001"])
    assert pinned_precision(cluster, local=False) == ([], "")


def test_every_seed_runs_with_the_users_and_the_pinned_overrides(recipe_copy, tmp_path, monkeypatch, capsys):
    import bench.seeds as seeds

    seen = []

    def fake_run_seed(recipe, seed, out, overrides, local, in_process):
        seen.append((seed, list(overrides), local, in_process))
        return SeedRun(seed, str(out / f"seed_{seed}"), "failed", 0.1, 2, "stand-in (exit 2)")

    monkeypatch.setattr(seeds, "pinned_precision", lambda cfg, local: (["learner.precision=manual"], "pinned"))
    monkeypatch.setattr(seeds, "run_seed", fake_run_seed)
    monkeypatch.setattr("bench._results.machine", lambda: "test host")
    out = tmp_path / "sweep"
    argv = [str(recipe_copy("tiny.yaml")), "train.steps=2", "--seeds", "3,1", "--local", "--out", str(out)]
    assert main(argv) == 3, "every seed failed"
    assert seen == [(s, ["train.steps=2", "learner.precision=manual"], True, False) for s in (3, 1)]
    doc = json.loads((out / "sweep.json").read_text())
    assert [(r["seed"], r["status"], r["cause"]) for r in doc["runs"]] == [
        (3, "failed", "stand-in (exit 2)"),
        (1, "failed", "stand-in (exit 2)"),
    ]
    assert "no finished seed holds a held-out evaluation" in capsys.readouterr().out
    assert (out / "report.html").is_file() and (out / "RESULTS-section.md").is_file()


def test_seesaw_seeds_mode_trains_each_configuration_once_per_seed(tmp_path, monkeypatch, capsys):
    """``--seeds``: one shared base run, then every configuration once per seed into ``<config>/seed_<S>`` with
    ``run.seed`` and the pinned precision; the report reads them back."""
    import bench.seesaw as seesaw

    calls = []

    def fake_train(config, out, steps, eval_limit, extra, at_start=False, seed=None):
        calls.append((config, out.relative_to(tmp_path).as_posix(), seed, list(extra)))
        rewards = {f"c{i}": float(config != "base" and i < 2 + (seed or 0)) for i in range(4)}
        _write_run(out, 0 if config == "base" else steps, {"code": rewards})
        return 1.0

    monkeypatch.setattr(seesaw, "train", fake_train)
    monkeypatch.setattr("bench.seeds.pinned_precision", lambda cfg, local: (["learner.precision=manual"], "fp32"))
    argv = ["--out", str(tmp_path), "--configs", "joint_fixed,single_code", "--seeds", "0,1", "--steps", "2"]
    assert seesaw.main([*argv, "--no-write"]) == 0
    pinned = ["learner.precision=manual"]
    assert calls == [
        ("base", "base", None, pinned),
        ("joint_fixed", "joint_fixed/seed_0", 0, pinned),
        ("single_code", "single_code/seed_0", 0, pinned),  # seed by seed: an interruption leaves whole seeds
        ("joint_fixed", "joint_fixed/seed_1", 1, pinned),
        ("single_code", "single_code/seed_1", 1, pinned),
    ]
    out = capsys.readouterr().out
    # gains 0.5 (diffs 1,1,0,0) and 0.75 (1,1,1,0): mean 0.625, SD 0.177; joint - single 0 in both seeds
    assert "| joint_fixed | +0.625 ± 0.177 (1 of 2 > 2 SE) | - | - |" in out
    assert "on code, joint vs single_code: no change" in out
    seeded = [c for c in calls if c[2] is not None]
    assert all(seesaw.run_name(c, s) == d for c, d, s, _ in seeded)


def test_an_interrupted_run_starts_no_further_seed_and_the_sweep_exits_130(recipe_copy, tmp_path, monkeypatch):
    import bench.seeds as seeds

    started = []

    def fake_run_seed(recipe, seed, out, overrides, local, in_process):
        started.append(seed)
        return SeedRun(seed, str(out / f"seed_{seed}"), "failed", 1.0, 130, "jointrl: interrupted (exit 130)")

    monkeypatch.setattr(seeds, "run_seed", fake_run_seed)
    monkeypatch.setattr("bench._results.machine", lambda: "test host")
    out = tmp_path / "sweep"
    assert main([str(recipe_copy("tiny.yaml")), "--seeds", "0,1,2", "--local", "--out", str(out)]) == 130
    assert started == [0], "no seed starts after Ctrl-C"
    doc = json.loads((out / "sweep.json").read_text())
    assert [r["cause"] for r in doc["runs"]] == ["jointrl: interrupted (exit 130)"] + [
        "not run: the sweep was interrupted"
    ] * 2


def test_seesaw_names_a_failed_run_and_reports_the_others(tmp_path, monkeypatch, capsys):
    import bench.seesaw as seesaw

    def fake_train(config, out, steps, eval_limit, extra, at_start=False, seed=None):
        if (config, seed) == ("single_code", 1):
            raise seesaw.RunFailed(config, 3, "step 2 ...\njointrl: run stopped: step 2: engine died\n(outputs kept)\n")
        _write_run(
            out, 0 if config == "base" else steps, {"code": {f"c{i}": float(config != "base") for i in range(4)}}
        )
        return 1.0

    monkeypatch.setattr(seesaw, "train", fake_train)
    monkeypatch.setattr("bench.seeds.pinned_precision", lambda cfg, local: ([], ""))
    argv = ["--out", str(tmp_path), "--configs", "joint_fixed,single_code", "--seeds", "0,1", "--no-write"]
    assert seesaw.main(argv) == 3
    captured = capsys.readouterr()
    assert "joint_rl.yaml, single_code/seed_1: failed: step 2: engine died (exit 3)" in captured.err
    assert "| single_code | +1.000 (one seed) (1 of 1 > 2 SE) |" in captured.out
    assert "| joint_fixed | +1.000 ± 0.000 (2 of 2 > 2 SE) |" in captured.out
    assert "Failed (not in the tables): single_code/seed_1: step 2: engine died (exit 3)." in captured.out


def test_from_runs_first_n_reads_only_each_held_out_files_first_tasks(tmp_path, capsys, monkeypatch):
    """``--first N`` pairs only the first N tasks of each held-out file (here t1, t2 of code's four), writes its
    own section and files (``_first<N>``), and leaves the whole-file report alone."""
    monkeypatch.setattr("bench._results.machine", lambda: "test host")
    rows = [
        {"id": t, "domain": "code", "messages": [{"role": "user", "content": "q"}]} for t in ("t1", "t2", "t3", "t4")
    ]
    recipe, out = _finished_sweep(tmp_path, rows, (0, 2))
    assert main([str(recipe), "--seeds", "0,2", "--out", str(out), "--from-runs", "--first", "2"]) == 0
    saved = json.loads((out / "sweep_first2.json").read_text())["per_seed"]["code"]
    # seed 0 on t1, t2: diffs 1, 1 (SE 0); seed 2: diffs 0, 0
    assert saved["0"]["n"] == 2 and saved["0"]["diff"] == 1.0 and saved["2"]["diff"] == 0.0
    assert "<!-- seeds_r_first2:start -->" in (out / "RESULTS-section_first2.md").read_text()
    assert "their first 2 tasks each" in capsys.readouterr().out
    assert not (out / "sweep.json").exists()
    assert main([str(recipe), "--seeds", "0,2", "--out", str(out), "--from-runs"]) == 0
    assert json.loads((out / "sweep.json").read_text())["per_seed"]["code"]["0"]["n"] == 4


def test_a_variants_section_takes_its_own_key_and_title(tmp_path, capsys, monkeypatch):
    """``--section-key``/``--section-title`` name the sweep's section (``--first`` still adds its tail); a bad key
    is refused before any seed trains."""
    monkeypatch.setattr("bench._results.machine", lambda: "test host")
    rows = [{"id": t, "domain": "code", "messages": [{"role": "user", "content": "q"}]} for t in ("t1", "t2")]
    recipe, out = _finished_sweep(tmp_path, rows, (0, 1))
    argv = [str(recipe), "--seeds", "0,1", "--out", str(out), "--from-runs", "--section-key", "seeds_r_arm"]
    assert main([*argv, "--section-title", "Seed sweep: an arm"]) == 0
    text = (out / "RESULTS-section.md").read_text()
    assert text.startswith("<!-- seeds_r_arm:start -->\n## Seed sweep: an arm\n") and "<!-- seeds_r_arm:end -->" in text
    assert json.loads((out / "sweep.json").read_text())["meta"]["section_key"] == "seeds_r_arm"
    assert main([*argv, "--first", "1"]) == 0
    text = (out / "RESULTS-section_first1.md").read_text()
    assert text.startswith("<!-- seeds_r_arm_first1:start -->\n## Seed sweep: `")
    capsys.readouterr()
    assert main(["recipes/tiny.yaml", "--seeds", "0", "--section-key", "a-b"]) == 2
    assert "--section-key 'a-b': a section key is lower-case letters, digits and _ only" in capsys.readouterr().err


def test_first_needs_from_runs_and_a_count(capsys):
    assert main(["recipes/tiny.yaml", "--seeds", "0", "--first", "2"]) == 2
    assert "--first reads part of finished runs' evaluations" in capsys.readouterr().err
    assert main(["recipes/tiny.yaml", "--seeds", "0", "--from-runs", "--first", "-1"]) == 2
    assert "--first must be >= 0" in capsys.readouterr().err


def test_shared_base_a_failed_base_run_trains_no_seed(recipe_copy, tmp_path, monkeypatch, capsys):
    import bench.seeds as seeds

    calls = []

    def fake_run_seed(recipe, seed, out, overrides, local, in_process, base=False):
        calls.append(("base" if base else seed, list(overrides)))
        return SeedRun(seed, str(out / "base"), "failed", 1.0, 2, "stand-in: the base model does not load (exit 2)")

    monkeypatch.setattr(seeds, "pinned_precision", lambda cfg, local: (["learner.precision=manual"], "pinned"))
    monkeypatch.setattr(seeds, "run_seed", fake_run_seed)
    argv = [str(recipe_copy("tiny.yaml")), "--seeds", "0,1", "--local", "--shared-base", "--out", str(tmp_path)]
    assert main(argv) == 3
    assert calls == [("base", ["learner.precision=manual"])], "the base first, and nothing after it failed"
    assert "the base run: stand-in: the base model does not load (exit 2)" in capsys.readouterr().err


def test_shared_base_seeds_skip_their_own_step0_evaluation(recipe_copy, tmp_path, monkeypatch):
    import bench.seeds as seeds

    calls = []

    def fake_run_seed(recipe, seed, out, overrides, local, in_process, base=False):
        calls.append(("base" if base else seed, list(overrides)))
        if base:
            return SeedRun(seed, str(out / "base"), "done", 1.0, 0)
        return SeedRun(seed, str(out / f"seed_{seed}"), "failed", 1.0, 2, "stand-in (exit 2)")

    monkeypatch.setattr(seeds, "pinned_precision", lambda cfg, local: ([], ""))
    monkeypatch.setattr(seeds, "run_seed", fake_run_seed)
    monkeypatch.setattr(seeds, "shared_base", lambda run_dir: {"code": {"c0": 0.0}})
    monkeypatch.setattr("bench._results.machine", lambda: "test host")
    argv = [str(recipe_copy("tiny.yaml")), "--seeds", "0,1", "--local", "--shared-base", "--out", str(tmp_path)]
    assert main(argv) == 3  # every seed "failed"
    assert calls == [("base", []), (0, ["train.eval_at_start=false"]), (1, ["train.eval_at_start=false"])]


def test_shared_base_and_base_are_one_or_the_other(capsys):
    assert main(["recipes/tiny.yaml", "--seeds", "0", "--from-runs", "--base", "x", "--shared-base"]) == 2
    assert "--base RUN and --shared-base (OUT/base) both name the base evaluation" in capsys.readouterr().err
