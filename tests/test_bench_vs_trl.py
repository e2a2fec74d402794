"""bench/vs_trl.py's jointrl-side pieces: arguments, recipe overrides, the shared task plan, the summary.

Fast (no model, no Ray, no TRL): the benchmark itself is run by hand (see bench/README.md).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import vs_trl  # noqa: E402


def test_defaults_are_the_issue_workload() -> None:
    a = vs_trl.parse([])
    assert (a.steps, a.prompts, a.group, a.max_new_tokens, a.beta, a.lr) == (12, 16, 4, 64, 0.04, 1e-5)
    assert a.device == "auto" and vs_trl.reward_k(a) == 6
    assert a.heldout == 50 and not a.async_run and vs_trl.parse(["--async"]).async_run
    assert vs_trl.reward_k(vs_trl.parse(["--steps", "2"])) == 1
    assert vs_trl.reward_k(vs_trl.parse(["--steps", "6", "--k", "3"])) == 3


@pytest.mark.parametrize(
    "bad", [["--steps", "0"], ["--group", "1"], ["--k", "13"], ["--device", "tpu"], ["--heldout", "-1"]]
)
def test_bad_arguments_exit(bad: list[str]) -> None:
    with pytest.raises(SystemExit):
        vs_trl.parse(bad)


def test_overrides_make_a_valid_recipe_and_plan(tmp_path: Path) -> None:
    from rl.config.recipe import load_recipe

    args = vs_trl.parse(["--steps", "3", "--jointrl-override", "algo.optim.max_grad_norm=0.5"])
    ov = vs_trl.jointrl_overrides(args, str(tmp_path / "out"), "cpu")
    assert not any(o.startswith("cluster.") for o in ov)
    cfg = load_recipe(args.recipe, ov)
    assert (cfg.rollout.prompts_per_step, cfg.rollout.group_size, cfg.rollout.max_new_tokens) == (16, 4, 64)
    assert (cfg.algo.kl.coef, cfg.algo.optim.lr, cfg.algo.optim.max_grad_norm, cfg.train.steps) == (0.04, 1e-5, 0.5, 3)
    assert cfg.model.path == "embedded:smollm2-135m-instruct" and cfg.model.autocast
    assert [r.cls for r in cfg.rewards] == ["rewards.toolcall.ToolCallReward"]
    # the measured workload, not whatever the quickstart is now: schema-prompt tasks, no stops, all-or-nothing args
    assert [Path(f).name for f in cfg.data.train_files] == ["toolcall_quickstart.train.jsonl"]
    assert cfg.rollout.stops() == {} and "args_credit" not in cfg.rewards[0].kwargs

    ids = vs_trl.plan_task_ids(cfg, 3)
    assert [len(s) for s in ids] == [16, 16, 16] and all(len(set(s)) == 16 for s in ids)
    assert ids == vs_trl.plan_task_ids(cfg, 3)  # deterministic: TRL gets what jointrl will draw
    plan = vs_trl.make_plan(args, cfg, "/model", ids, str(tmp_path), "cpu")
    json.dumps(plan)  # handed to the TRL venv as JSON
    assert plan["beta"] == 0.04 and plan["bf16"] and plan["learner_dtype"] == "float32" and plan["task_ids"] == ids
    assert all(Path(f).is_file() for f in plan["train_files"])
    train = {json.loads(line)["id"] for f in plan["train_files"] for line in Path(f).read_text().splitlines()}
    assert {t for s in ids for t in s} <= train


def test_gpu_overrides_share_one_gpu() -> None:
    args = vs_trl.parse(["--device", "cuda"])
    one = vs_trl.jointrl_overrides(args, "/o", "cuda", gpus=1)
    assert "cluster.device=gpu" in one and "cluster.engine_gpus=0.5" in one
    assert "cluster.engine_gpus=0.5" not in vs_trl.jointrl_overrides(args, "/o", "cuda", gpus=2)


def test_same_tasks_and_summary() -> None:
    plan = [["a", "b"], ["c", "d"]]
    assert vs_trl.same_tasks(plan, [["b", "a", "a", "b"], ["c", "c", "d", "d"]], 2)
    assert not vs_trl.same_tasks(plan, [["a", "a", "a", "b"], ["c", "c", "d", "d"]], 2)
    assert not vs_trl.same_tasks(plan, [["a", "a", "b", "b"]], 2)
    s = vs_trl.summarize([10.0, 30.0], [0.1, 0.4], [100.0, 300.0], 64, 1)
    assert s["mean_step_s"] == 20.0 and s["completions_s"] == 3.2 and s["tokens_s"] == 10.0
    assert s["reward_gain"] == pytest.approx(0.3)


def test_paired_difference_by_hand() -> None:
    a = {"t1": 0.5, "t2": 1.0, "t3": 0.2, "t4": None, "t5": 0.0}
    b = {"t1": 0.2, "t2": 1.0, "t3": 0.5, "t4": 1.0}  # t4 errored on a's side, t5 missing on b's
    d, se, n = vs_trl.paired_difference(a, b)
    # differences 0.3, 0.0, -0.3: mean 0, sample stdev 0.3, SE 0.3 / sqrt(3)
    assert n == 3 and d == pytest.approx(0.0) and se == pytest.approx(0.3 / 3**0.5)
    assert vs_trl.paired_difference({"x": 1.0}, {"y": 1.0})[2] == 0


def _jointrl_run(out: Path, ids: list[list[str]], group: int, wall: float | None) -> None:
    """A finished jointrl run folder as `jointrl train` leaves it (the parts vs_trl reads)."""
    out.mkdir(parents=True)
    metrics = [{"step": 0, "eval/mean": 0.1}]
    for i, _ in enumerate(ids, 1):
        metrics.append(
            {"step": i, "timing/step_s": 10.0 * i, "reward/mean": 0.1 * i, "rollout/tokens": 640.0}
            | {f"timing/{k}_s": 1.0 for k in ("rollout", "reward", "learner", "sync")}
        )
    (out / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    rows = [{"step": i, "split": "train", "task_id": t} for i, s in enumerate(ids, 1) for t in s for _ in range(group)]
    (out / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if wall is not None:
        (out / vs_trl.WALL).write_text(f"{wall}\n")


def test_from_runs_reports_an_earlier_invocations_runs_without_training(tmp_path: Path, monkeypatch, capsys) -> None:
    """--from-runs trains nothing: it reads the jointrl runs and TRL's result from --work-dir, evaluates, and
    reports; a wall time the bench did not record is said so; a side without its run is named."""
    from rl.config.recipe import load_recipe

    args = vs_trl.parse(["--steps", "2", "--heldout", "0", "--no-write", "--work-dir", str(tmp_path)])
    ids = vs_trl.plan_task_ids(load_recipe(args.recipe, vs_trl.jointrl_overrides(args, "/o", "cpu")), 2)

    def no_training(*a, **k):
        raise AssertionError("--from-runs must not train")

    monkeypatch.setattr(vs_trl, "run_jointrl", no_training)
    monkeypatch.setattr(vs_trl, "run_trl", no_training)
    monkeypatch.setattr("rl.trainer.hub.resolve_model", lambda *a, **k: "/model")
    _jointrl_run(tmp_path / "jointrl", ids, 4, wall=55.0)
    _jointrl_run(tmp_path / "jointrl_async", ids, 4, wall=None)
    trl = {
        "step_s": [40.0, 40.0],
        "reward_mean": [0.1, 0.2],
        "tokens": [640.0, 640.0],
        "task_ids": [sum(([t] * 4 for t in s), []) for s in ids],
    }
    trl |= {"versions": {"trl": "1.14.2", "transformers": "5", "torch": "2"}, "config": {}, "prompt_token_mismatch": 0}
    argv = ["--steps", "2", "--heldout", "0", "--no-write", "--async", "--work-dir", str(tmp_path), "--from-runs"]
    with pytest.raises(SystemExit, match=f"{tmp_path}: holds no TRL run|{tmp_path} holds no TRL run"):
        vs_trl.main(argv)
    (tmp_path / "trl_result.json").write_text(json.dumps(trl))
    assert vs_trl.main(argv) == 0
    out = capsys.readouterr().out
    assert "| jointrl | 4.27 | 43 | 15.00 |" in out  # 64 completions, 640 tokens / 15 s mean step
    assert "| 55 | yes |" in out and "| not recorded | yes |" in out
    assert "**jointrl / TRL** | **2.67x**" in out
    with pytest.raises(SystemExit):
        vs_trl.parse(["--from-runs"])  # no --work-dir


def test_an_eval_whose_stdout_is_not_its_summary_is_named_and_the_trained_runs_are_kept(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """A held-out evaluation that prints something else than its JSON summary on stdout fails with one line naming
    the model and what stdout started with; the runs trained before it stay in the (temporary) work folder."""
    import subprocess

    class Done:
        returncode, stdout = 0, "jointrl: precision auto: fp32\n{}"

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: Done())
    args = vs_trl.parse(["--heldout", "2"])
    with pytest.raises(
        SystemExit, match=r"jointrl eval of /m: stdout is not its JSON summary \(it starts: 'jointrl: prec"
    ):
        vs_trl.heldout_eval(args, [], "/m", "base", tmp_path, {})

    work = tmp_path / "tmpwork"
    monkeypatch.setattr(vs_trl.tempfile, "mkdtemp", lambda prefix: str(work))
    monkeypatch.setattr("rl.trainer.hub.resolve_model", lambda *a, **k: "/model")
    monkeypatch.setattr(vs_trl, "run_jointrl", lambda *a: {"step_s": [1.0]})
    monkeypatch.setattr(vs_trl, "run_trl", lambda *a: {"step_s": [1.0]})

    def eval_fails(*a):
        raise SystemExit("eval failed")

    monkeypatch.setattr(vs_trl, "heldout_eval", eval_fails)
    with pytest.raises(SystemExit, match="eval failed"):
        vs_trl.main(["--steps", "1", "--heldout", "2", "--no-write"])
    assert work.is_dir()
    assert (
        f"the finished runs are kept in {work}: report them with --from-runs --work-dir {work}"
        in capsys.readouterr().out
    )
