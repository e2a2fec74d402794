"""bench/ablate.py: the dev split of a recipe's training files and the arms-against-control table."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.ablate import AblationError, compare, main, split_tasks  # noqa: E402


def _task(i: int, template: str | None) -> str:
    meta = {"template": template} if template is not None else {}
    return json.dumps(
        {"id": f"t{i}", "domain": "code", "messages": [{"role": "user", "content": str(i)}], "meta": meta}
    )


def test_every_kth_task_of_each_template_goes_to_dev_in_file_order() -> None:
    lines = [_task(i, "ab"[i % 2]) for i in range(12)]  # a: 0,2,4,...,10; b: 1,3,...,11
    train, dev = split_tasks(lines, 3, "f.jsonl")
    ids = [json.loads(x)["id"] for x in dev]
    assert ids == ["t4", "t5", "t10", "t11"]  # the 3rd and 6th of a (4, 10) and of b (5, 11)
    assert len(train) == 8 and not set(train) & set(dev) and sorted(train + dev) == sorted(lines)


def test_a_file_without_templates_is_one_group() -> None:
    train, dev = split_tasks([_task(i, None) for i in range(7)], 2, "f.jsonl")
    assert [json.loads(x)["id"] for x in dev] == ["t1", "t3", "t5"] and len(train) == 4


@pytest.mark.parametrize(
    ("lines", "every", "message"),
    [
        ([_task(0, "a"), _task(1, "a"), _task(2, "b")], 2, "f.jsonl: template 'b' has 1 tasks, fewer than --every 2"),
        ([_task(0, "a"), "{not json"], 2, "f.jsonl:2: not JSON"),
        ([_task(0, "a")], 1, "--every must be at least 2"),
    ],
)
def test_bad_input_names_the_file_and_line(lines, every, message) -> None:
    with pytest.raises(AblationError, match=message.replace("(", r"\(")):
        split_tasks(lines, every, "f.jsonl")


def test_by_template_every_kth_template_goes_to_dev_whole() -> None:
    lines = [_task(i, "abcde"[i % 5]) for i in range(15)]  # templates in order of first appearance: a b c d e
    train, dev = split_tasks(lines, 2, "f.jsonl", by="template")
    assert {json.loads(x)["meta"]["template"] for x in dev} == {"b", "d"}  # the 2nd and 4th
    assert [json.loads(x)["id"] for x in dev] == ["t1", "t3", "t6", "t8", "t11", "t13"]  # file order kept
    assert {json.loads(x)["meta"]["template"] for x in train} == {"a", "c", "e"}
    assert sorted(train + dev) == sorted(lines)


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([_task(i, None) for i in range(6)], "f.jsonl: no task has a meta.template: --by template has nothing"),
        ([_task(i, "ab"[i % 2]) for i in range(6)], "f.jsonl: 2 templates, fewer than --every 3: no dev template"),
    ],
)
def test_by_template_bad_input_names_the_file(lines, message) -> None:
    with pytest.raises(AblationError, match=message):
        split_tasks(lines, 3, "f.jsonl", by="template")


def test_split_by_template_from_the_command_line(tmp_path: Path, capsys) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "x.train.jsonl").write_text("\n".join(_task(i, "abc"[i % 3]) for i in range(9)) + "\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("data: {train_files: [data/x.train.jsonl], eval_files: [data/x.train.jsonl]}\n")
    assert main(["split", str(recipe), "--by", "template", "--out", str(tmp_path / "split")]) == 0
    dev = [json.loads(x) for x in (tmp_path / "split" / "x.dev.jsonl").read_text().splitlines()]
    assert {t["meta"]["template"] for t in dev} == {"c"} and len(dev) == 3
    assert "3 dev tasks" in capsys.readouterr().err


def test_split_writes_both_files_and_prints_overrides_that_load(tmp_path: Path, capsys) -> None:
    from rl.config.loading import load_recipe

    data = tmp_path / "data"
    data.mkdir()
    (data / "x.train.jsonl").write_text("\n".join(_task(i, "ab"[i % 3 == 0]) for i in range(12)) + "\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("data: {train_files: [data/x.train.jsonl], eval_files: [data/x.train.jsonl]}\n")
    assert main(["split", str(recipe), "--out", str(tmp_path / "split")]) == 0
    overrides = capsys.readouterr().out.split()
    cfg = load_recipe(recipe, overrides)
    (train,), (dev,) = cfg.data.train_files, cfg.data.eval_files
    assert Path(train).name == "x.train.jsonl" and Path(dev).name == "x.dev.jsonl"
    assert len(Path(train).read_text().splitlines()) + len(Path(dev).read_text().splitlines()) == 12
    assert len(Path(dev).read_text().splitlines()) == 3  # every 3rd: a (8 tasks) gives 2, b (4 tasks) 1
    (tmp_path / "h").mkdir()
    recipe.write_text("data: {train_files: [h], eval_files: [data/x.train.jsonl]}\n")
    assert main(["split", str(recipe), "--out", str(tmp_path / "s2")]) == 2
    assert "data.train_files h: not a .jsonl task file" in capsys.readouterr().err


def _sweep(finals: dict[str, dict[int, float]], evals: str = "data.eval_files=[d.jsonl]") -> dict:
    per = {
        d: {str(s): {"b": b, "a": 0.1, "diff": b - 0.1, "se": 0.01, "n": 40} for s, b in v.items()}
        for d, v in finals.items()
    }
    across = {d: {"k": len(v), "mean": 0.0, "sd": 0.0, "cleared": 0, "below": 0} for d, v in finals.items()}
    return {"meta": {"overrides": [evals]}, "per_seed": per, "across": across}


def test_compare_pairs_each_seed_with_the_controls_same_seed() -> None:
    control = _sweep({"code": {0: 0.2, 1: 0.3, 2: 0.1}})
    arm = _sweep({"code": {0: 0.3, 1: 0.3, 2: 0.4}})
    r = compare(control, {"prior": arm})["arms"]["prior"]["code"]
    diffs = [0.1, 0.0, 0.3]
    mean = sum(diffs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in diffs) / 2)
    assert r["diffs"] == pytest.approx({"0": 0.1, "1": 0.0, "2": 0.3})
    assert (
        r["mean"] == pytest.approx(mean)
        and r["sd"] == pytest.approx(sd)
        and r["se"] == pytest.approx(sd / math.sqrt(3))
    )


def test_compare_refuses_arms_on_other_seeds_or_other_dev_files() -> None:
    control = _sweep({"code": {0: 0.2, 1: 0.3}})
    with pytest.raises(AblationError, match=r"arm a, code: seeds \['0'\], the control's \['0', '1'\]"):
        compare(control, {"a": _sweep({"code": {0: 0.2}})})
    with pytest.raises(AblationError, match="arm b: evaluated on other files"):
        compare(control, {"b": _sweep({"code": {0: 0.2, 1: 0.3}}, "data.eval_files=[other.jsonl]")})


def test_compare_without_a_sweep_names_the_folder(tmp_path: Path, capsys) -> None:
    assert main(["compare", "--name", "x", "--control", str(tmp_path), "--arm", f"a:{tmp_path}"]) == 2
    assert f"{tmp_path}: no sweep.json" in capsys.readouterr().err


def _run_with_evals(run_dir: Path, evals: dict[int, list[float]]) -> None:
    """A run folder whose rollouts.jsonl holds code dev evaluations: step -> rewards of tasks d0, d1, ..."""
    run_dir.mkdir(parents=True)
    rows = [
        {"step": step, "split": "eval", "domain": "code", "task_id": f"d{i}", "reward": r}
        for step, rewards in evals.items()
        for i, r in enumerate(rewards)
    ]
    rows.append({"step": 1, "split": "train", "domain": "code", "task_id": "t0", "reward": 1.0})
    (run_dir / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _write_sweep(folder: Path, evals: dict[int, dict[int, list[float]]], meta: dict, failed: list[int] = ()) -> None:
    """A bench/seeds.py sweep folder: a run per seed (``_run_with_evals``) and its sweep.json; ``failed`` seeds are
    listed as failed runs, with no folder."""
    runs = []
    for seed, by_step in evals.items():
        _run_with_evals(folder / f"seed_{seed}", by_step)
        runs.append({"seed": seed, "run_dir": str(folder / f"seed_{seed}"), "status": "done"})
    runs += [{"seed": s, "run_dir": str(folder / f"seed_{s}"), "status": "failed"} for s in failed]
    (folder / "sweep.json").write_text(json.dumps({"meta": meta, "runs": runs, "per_seed": {}, "across": {}}))


def test_a_sweep_read_at_a_step_compares_training_on_against_stopping_there(tmp_path: Path, capsys) -> None:
    """FOLDER@STEP reads each seed at that step's dev evaluation: the control at step 2 and the arm at its last
    (step 4) of the same runs, paired by seed; a step a run did not evaluate at is named."""
    evals = {
        0: {0: [0.0, 0.0, 0.0, 0.0], 2: [1.0, 0.0, 0.0, 0.0], 4: [1.0, 1.0, 1.0, 0.0]},
        1: {0: [0.0, 0.0, 0.0, 0.0], 2: [1.0, 1.0, 0.0, 0.0], 4: [1.0, 1.0, 0.0, 0.0]},
    }
    _write_sweep(tmp_path, evals, {"overrides": ["data.eval_files=[d.jsonl]"]}, failed=[2])
    argv = ["compare", "--name", "steps", "--control", f"{tmp_path}@2", "--arm", f"4:{tmp_path}@4"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    # step 2 -> 4, per seed: +0.50 (0.25 -> 0.75) and 0.00 (0.50 -> 0.50): mean +0.250, SE = SD / sqrt(2) = 0.250
    assert "| 4 | +0.250 ± 0.250 (noise) |" in out
    # the control's gains at step 2: 0.25 and 0.50, mean 0.375, SD 0.177; the arm's at 4: 0.75 and 0.50
    assert "| control | +0.375 ± 0.177" in out and "| 4 | +0.625 ± 0.177" in out
    assert main(["compare", "--name", "steps", "--control", f"{tmp_path}@3", "--arm", f"4:{tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path}@3: seed 0's run {tmp_path / 'seed_0'} has no dev evaluation at step 3" in err
    assert "(it evaluated at steps [0, 2, 4])" in err
    with pytest.raises(SystemExit):
        main(["compare", "--name", "x", "--control", f"{tmp_path}@two", "--arm", f"a:{tmp_path}"])


def test_a_sweep_read_at_a_step_counts_the_seeds_beyond_two_se_by_template(tmp_path: Path, capsys) -> None:
    """Dev tasks d0, d1 of template A and d2, d3 of B: both seeds learn A alone at step 2 (+0.5, +1.7 SE per task),
    so neither clears two SE clustered by template; at step 4 seed 0 has learned a task of each template."""
    dev = tmp_path / "dev.jsonl"
    dev.write_text("".join(_task(i, "AABB"[i]).replace(f'"t{i}"', f'"d{i}"') + "\n" for i in range(4)))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"data: {{train_files: [{dev}], eval_files: [{dev}]}}\n")
    evals = {
        0: {0: [0.0, 0.0, 0.0, 0.0], 2: [1.0, 1.0, 0.0, 0.0], 4: [1.0, 1.0, 1.0, 1.0]},
        1: {0: [0.0, 0.0, 0.0, 0.0], 2: [1.0, 1.0, 0.0, 0.0], 4: [1.0, 1.0, 0.0, 0.0]},
    }
    _write_sweep(tmp_path, evals, {"recipe": str(recipe), "overrides": [f"data.eval_files=[{dev}]"]})
    assert main(["compare", "--name", "t", "--control", f"{tmp_path}@2", "--arm", f"4:{tmp_path}@4"]) == 0
    out = capsys.readouterr().out
    assert "| control | +0.500 ± 0.000 (0 of 2 > 2 SE; 0 by template) |" in out
    assert "| 4 | +0.750 ± 0.354 (1 of 2 > 2 SE; 1 by template) |" in out


def test_a_shared_base_sweep_read_at_a_step_is_read_against_its_base(tmp_path: Path, capsys) -> None:
    """A ``bench/seeds.py --shared-base`` sweep: its seeds evaluated at steps 2 and 4 only, the base (step 0) in
    ``meta.base_dir``. FOLDER@2 is step 2 against that base, not against the seeds' own first evaluation."""
    _run_with_evals(tmp_path / "base", {0: [0.0, 0.0, 0.0, 0.0]})
    evals = {
        0: {2: [1.0, 0.0, 0.0, 0.0], 4: [1.0, 1.0, 1.0, 0.0]},
        1: {2: [1.0, 1.0, 0.0, 0.0], 4: [1.0, 1.0, 0.0, 0.0]},
    }
    meta = {"overrides": ["data.eval_files=[d.jsonl]"], "base_dir": str(tmp_path / "base")}
    _write_sweep(tmp_path, evals, meta)
    assert main(["compare", "--name", "steps", "--control", f"{tmp_path}@2", "--arm", f"4:{tmp_path}@4"]) == 0
    out = capsys.readouterr().out
    # against the base (all 0): gains at step 2 are 0.25 and 0.50 (mean 0.375, SD 0.177), at step 4 0.75 and 0.50
    assert "| control | +0.375 ± 0.177" in out and "| 4 | +0.625 ± 0.177" in out
    (tmp_path / "base" / "rollouts.jsonl").unlink()
    assert main(["compare", "--name", "steps", "--control", f"{tmp_path}@2", "--arm", f"4:{tmp_path}@4"]) == 2
    assert "the sweep's shared base evaluation does not read" in capsys.readouterr().err
