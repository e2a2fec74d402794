"""``jointrl eval``: pass@k (unbiased estimator), the failures file, model/checkpoint resolution, bad input,
and one real run on the tiny model with vLLM (slow)."""

from __future__ import annotations

import json
import math
import shutil
from itertools import combinations
from pathlib import Path

import pytest
import yaml

from envs.io import load_tasks
from envs.types import Message, Task, Trajectory
from rl.cli.main import main
from rl.cli.common import CommandError
from rl.cli.eval import eval_summary, pass_at_k, resolve_model_arg

REPO = Path(__file__).resolve().parents[1]


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    """The probability that a random k-subset of n samples (c passing) holds a passing one."""
    subsets = list(combinations([1] * c + [0] * (n - c), k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize(
    "n, c, k", [(1, 0, 1), (1, 1, 1), (5, 0, 2), (5, 1, 1), (5, 1, 2), (5, 2, 3), (6, 3, 6), (8, 5, 4), (10, 1, 10)]
)
def test_pass_at_k_is_the_unbiased_estimator(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k))
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)


def test_pass_at_k_bad_arguments():
    for n, c, k in ((2, 3, 1), (2, 1, 3), (2, 1, 0)):
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def _task(tid: str, domain: str) -> Task:
    return Task(id=tid, domain=domain, messages=(Message("user", "q"),), meta={"src": "x"})


def _traj(task: Task, reward: float | None) -> Trajectory:
    return Trajectory(
        task=task,
        group_id=0,
        prompt_ids=[],
        response_ids=[],
        loss_mask=[],
        logprobs=[],
        messages=list(task.messages),
        terminated=True,
        truncated=False,
        finish_reason="stop",
        reward=reward,
        reward_error=None if reward is not None else "boom",
    )


def test_eval_summary_per_domain_and_failures():
    a, b, c = _task("a", "code"), _task("b", "code"), _task("c", "tool_call")
    rewards = {"a": [1.0, 0.0, 0.5], "b": [0.0, None, 0.2], "c": [1.0, 1.0, None]}
    scored = [_traj(t, r) for t in (a, b, c) for r in rewards[t.id]]
    summary, failed = eval_summary([a, b, c], scored, n=3, k=2, threshold=1.0)
    code = summary["domains"]["code"]
    assert code["tasks"] == 2 and code["failed_tasks"] == 1 and code["errors"] == 1
    assert code["pass@1"] == pytest.approx((1 / 3 + 0) / 2)
    assert code["pass@2"] == pytest.approx((pass_at_k(3, 1, 2) + 0) / 2)
    assert code["mean_reward"] == pytest.approx((1.0 + 0.0 + 0.5 + 0.0 + 0.2) / 5)
    tc = summary["domains"]["tool_call"]
    assert tc["pass@1"] == pytest.approx(2 / 3) and tc["pass@2"] == 1.0 and tc["errors"] == 1  # errored = not passed
    assert summary["tasks"] == 3 and summary["pass@2"] == pytest.approx((pass_at_k(3, 1, 2) + 0 + 1) / 3)
    assert [t.id for t in failed] == ["b"]
    assert failed[0].meta == {
        "src": "x",
        "eval": {"samples": 3, "passed": 0, "errors": 1, "mean_reward": pytest.approx(0.1)},
    }
    # With k == 1 only pass@1 is reported.
    s1, _ = eval_summary([a], scored[:3], n=3, k=1, threshold=0.5)
    assert "pass@1" in s1 and not any(k.startswith("pass@") and k != "pass@1" for k in s1)
    assert s1["pass@1"] == pytest.approx(2 / 3)
    assert s1["tasks"] == 1 and s1["domains"]["code"]["tasks"] == 1  # each task counted once with k == 1


def test_a_sample_passes_on_its_tasks_own_score_not_on_shaping():
    # Solved, but a turn hit the token limit: rewards.format.CutTurnPenalty took 0.5 off the reward. It still
    # passes (a length penalty shapes training; it does not unsolve a task), and the mean reward is the whole one.
    import dataclasses

    a = _task("a", "code")
    solved_cut = dataclasses.replace(_traj(a, 0.5), reward_shaping=-0.5)
    failed_cut = dataclasses.replace(_traj(a, -0.5), reward_shaping=-0.5)
    summary, failed = eval_summary([a], [solved_cut, failed_cut], n=2, k=1, threshold=1.0)
    assert summary["pass@1"] == pytest.approx(0.5) and failed == []
    assert summary["mean_reward"] == pytest.approx(0.0)
    # Float rounding of (own + shaping) - shaping does not put a task a hair under the threshold: unrounded,
    # (0.9 - 0.2) + 0.2 is 0.8999999999999999 and (0.1 - 0.4) + 0.4 is 0.09999999999999998.
    for own, shaping in ((0.9, -0.2), (0.1, -0.4), (0.9, -1 / 3), (1.0, -0.3), (0.2 + 0.3 + 0.5, -0.7)):
        t = dataclasses.replace(_traj(a, own + shaping), reward_shaping=shaping)
        assert t.task_reward == own, (own, shaping)
    s9, _ = eval_summary([a], [dataclasses.replace(_traj(a, 0.9 - 0.2), reward_shaping=-0.2)], n=1, k=1, threshold=0.9)
    assert s9["pass@1"] == 1.0


def _fake_model(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    return folder


def test_resolve_model_arg(tmp_path):
    assert resolve_model_arg("embedded:tiny") == ("embedded:tiny", None)
    hf = _fake_model(tmp_path / "hf")
    assert resolve_model_arg(str(hf)) == (str(hf), None)
    run = tmp_path / "run"
    for step in (2, 10):
        _fake_model(run / "checkpoints" / f"step_{step:06d}" / "model")
    newest = run / "checkpoints" / "step_000010"
    assert resolve_model_arg(str(run)) == (str(newest / "model"), run)
    assert resolve_model_arg(str(newest)) == (str(newest / "model"), run)
    assert resolve_model_arg(str(newest / "model")) == (str(newest / "model"), run)
    with pytest.raises(CommandError, match="not found"):
        resolve_model_arg(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CommandError, match="not a Hugging Face model folder"):
        resolve_model_arg(str(tmp_path / "empty"))


def tiny_recipe(tmp_path: Path, **data) -> Path:
    d = yaml.safe_load((REPO / "recipes" / "tiny.yaml").read_text())
    d["data"]["train_files"] = [str(REPO / "recipes" / f) for f in d["data"]["train_files"]]
    d["data"]["eval_files"] = [str(REPO / "recipes" / f) for f in d["data"]["eval_files"]]
    d["data"].update(data)
    d["run"]["output_dir"] = str(tmp_path / "out")
    p = tmp_path / "recipe.yaml"
    p.write_text(yaml.safe_dump(d, sort_keys=False))
    return p


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--k", "0"], "--k must be >= 1"),
        (["--k", "3", "--n", "2"], "--n (2) must be >= --k (3)"),
        (["--temperature", "-1"], "--temperature must be >= 0"),
        (["--model", "/nonexistent/model"], "--model /nonexistent/model: not found"),
        (["--tasks", "/nonexistent.jsonl"], "task file not found"),
        (["--format", "bfcl"], "--format/--answers go with --tasks"),
        (["--out", "failures.txt"], "must end in .jsonl"),
        (["rollout.bogus=1"], "unknown recipe key 'rollout.bogus'"),
    ],
)
def test_bad_input_exits_2_before_any_engine(tmp_path, capsys, argv, message):
    rc = main(["eval", str(tiny_recipe(tmp_path)), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and message in err, err


def test_no_eval_files_and_foreign_domains(tmp_path, capsys):
    rc = main(["eval", str(tiny_recipe(tmp_path, eval_files=[]))])
    assert rc == 2 and "data.eval_files is empty; pass --tasks FILE" in capsys.readouterr().err
    code = REPO / "recipes" / "data" / "code_tasks.jsonl"
    rc = main(["eval", str(tiny_recipe(tmp_path)), "--tasks", str(code)])
    err = capsys.readouterr().err
    assert rc == 2 and "has domain 'code'" in err and "serves only ['tool_call']" in err
    rc = main(["eval", str(tmp_path / "missing.yaml")])
    assert rc == 2 and "recipe not found" in capsys.readouterr().err


@pytest.mark.slow
def test_eval_tiny_model_pass_at_k_and_failures_file(tmp_path, capsys, tiny_model_path):
    """4 tasks x 2 samples on the tiny model from a run dir's checkpoint; the failures land in the run dir."""
    run = tmp_path / "run"
    shutil.copytree(tiny_model_path, run / "checkpoints" / "step_000001" / "model")
    recipe = tiny_recipe(tmp_path)
    samples = tmp_path / "samples.jsonl"
    rc = main(["eval", str(recipe), "--model", str(run), "--k", "2", "--limit", "4", "--samples-out", str(samples)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    s = json.loads(out)  # stdout is only the JSON summary (vLLM logs go to stderr)
    assert s["model"] == str(run / "checkpoints" / "step_000001" / "model")
    assert (s["tasks"], s["samples_per_task"], s["k"], s["temperature"]) == (4, 2, 2, 1.0)
    tc = s["domains"]["tool_call"]
    assert tc["tasks"] == 4 and tc["errors"] == 0
    for key in ("pass@1", "pass@2", "mean_reward"):
        assert 0.0 <= s[key] <= 1.0 and math.isfinite(tc[key])
    assert tc["pass@2"] >= tc["pass@1"]
    assert tc["functions"]["toolcall"]["count"] == 8
    rows = [json.loads(x) for x in samples.read_text().splitlines()]
    assert len(rows) == 8 and [r["sample"] for r in rows] == [0, 1] * 4
    assert all(r["completion"].startswith("<tool_call>") for r in rows)  # the prefill is part of the answer
    failures = Path(s["failures_file"])
    assert failures == run / "eval_failures.jsonl"  # default: the run dir of --model
    failed = load_tasks(failures)  # native task format: a recipe's data.train_files can use it as is
    assert len(failed) == tc["failed_tasks"]
    evaluated = load_tasks(REPO / "recipes" / "data" / "toolcall_quickstart.eval.jsonl")[:4]
    by_id = {t.id: t for t in evaluated}
    for t in failed:
        assert t.meta["eval"]["passed"] == 0 and t.meta["eval"]["samples"] == 2
        assert t.messages == by_id[t.id].messages and t.tool_call == by_id[t.id].tool_call
    # The failures file feeds a recipe as training data.
    from rl.config.recipe import load_recipe, validate_recipe

    if failed:
        validate_recipe(load_recipe(recipe, [f"data.train_files=[{failures}]", f"run.output_dir={tmp_path / 'o2'}"]))


def test_eval_in_process_engine_samples_what_a_training_step_would(tmp_path, capsys, tiny_model_path):
    """``--engine hf`` (no vLLM, seconds): the eval's samples are the training loop's for the same tasks,
    seeds from ``rl.driver.loop.expand`` at step 0 (one seed formula), and a second eval repeats them."""
    from envs.types import Sampling
    from rl.config.recipe import load_recipe
    from rl.driver.local_runtime import LocalRuntime
    from rl.driver.loop import expand

    recipe = tiny_recipe(tmp_path)
    samples = tmp_path / "samples.jsonl"
    argv = [
        "eval",
        str(recipe),
        "--engine",
        "hf",
        "--k",
        "2",
        "--limit",
        "3",
        "--samples-out",
        str(samples),
        "--out",
        str(tmp_path / "failed.jsonl"),
    ]
    assert main(argv) == 0, capsys.readouterr().err
    s = json.loads(capsys.readouterr().out)
    assert (s["tasks"], s["samples_per_task"], s["temperature"]) == (3, 2, 1.0)
    rows = [json.loads(x) for x in samples.read_text().splitlines()]
    assert [r["sample"] for r in rows] == [0, 1] * 3

    cfg = load_recipe(recipe)
    tasks = load_tasks(REPO / "recipes" / "data" / "toolcall_quickstart.eval.jsonl")[:3]
    r = cfg.rollout
    rt = LocalRuntime(cfg, tiny_model_path, learner=False)
    rt.start()
    try:
        want = rt.generate(
            *expand(tasks, 2, cfg.run.seed, 0), Sampling(r.max_new_tokens, 1.0, r.top_p, r.max_turns, r.max_model_len)
        )
    finally:
        rt.stop()
    assert [x["completion"] for x in rows] == [t.completion for t in want]
    assert len({x["completion"] for x in rows}) > 1, "temperature 1: the samples differ"
    assert main(argv) == 0
    capsys.readouterr()
    assert [json.loads(x)["completion"] for x in samples.read_text().splitlines()] == [x["completion"] for x in rows]
