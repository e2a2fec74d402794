"""bench/seeds.py end to end on the tiny model, in this process (``--local --in-process``): a three-seed sweep
whose seed 2 dies in the middle of its run, then seed 0 trained again. Checks what a seed must change
(data order and sampling: different rollouts) and what it must not (the base evaluation; the same seed
twice gives the same run), and that a failed seed is named with its recipe and cause while the finished
ones are reported. The learner's random initialization (LoRA) per seed is checked on the learner directly."""

from __future__ import annotations

import io
import json
import re
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.seeds import main, run_seed  # noqa: E402
from bench.seesaw import eval_steps  # noqa: E402
from runlog import comparable_steps  # noqa: E402
from conftest import recipe_copier  # noqa: E402
from test_loop_inprocess import PARITY, _cfg  # noqa: E402 - the tiny recipe, small and deterministic, parity reward


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The sweep (seeds 0, 1, 2; seed 2's learner raises at its first update) and seed 0 trained again."""
    from rl.driver.local_runtime import LocalRuntime

    tmp = tmp_path_factory.mktemp("seeds")
    (tmp / "parity_reward.py").write_text(PARITY)
    real_step = LocalRuntime.train_step

    def train_step(self, batch):
        if self.cfg.run.seed == 2:
            raise RuntimeError("injected: the learner of seed 2 died")
        return real_step(self, batch)

    err, out = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(tmp))  # the recipe's reward module
        recipe = Path(_cfg(recipe_copier(tmp), out="tiny_seeds", train={"steps": 2}).source)
        mp.setattr(LocalRuntime, "train_step", train_step)
        mp.setattr("bench._results.machine", lambda: "test host")  # torch and vllm versions: slow imports
        with redirect_stderr(err), redirect_stdout(out):
            argv = [str(recipe), "--seeds", "0,1,2", "--local", "--in-process", "--out", str(tmp / "sweep")]
            code = main(argv)
            again = run_seed(recipe, 0, tmp / "again", [], local=True, in_process=True)
            first_json = (tmp / "sweep" / "sweep.json").read_text()
            kept_code = main([*argv, "--keep-done"])  # seeds 0 and 1 kept, seed 2 trained (and failing) again
    return {
        "code": code,
        "err": err.getvalue(),
        "out": out.getvalue(),
        "dir": tmp / "sweep",
        "again": again,
        "first_json": first_json,
        "kept_code": kept_code,
        "recipe": recipe,
    }


def _rollouts(run: Path, split: str, step: int) -> list[dict]:
    rows = [json.loads(x) for x in (run / "rollouts.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in rows if r["split"] == split and r["step"] == step]


def test_a_failed_seed_is_named_and_the_finished_ones_are_reported(sweep):
    assert sweep["code"] == 3, sweep["err"]
    lines = [x for x in sweep["err"].splitlines() if "failed:" in x]
    assert re.search(
        r"tiny_seeds\.yaml, seed 2: failed: .*RuntimeError: injected: the learner of seed 2 died.*\(exit 3\)", lines[0]
    )
    d = sweep["dir"]
    doc = json.loads((d / "sweep.json").read_text())
    assert [(r["seed"], r["status"]) for r in json.loads(sweep["first_json"])["runs"]] == [
        (0, "done"),
        (1, "done"),
        (2, "failed"),
    ]
    # --keep-done kept the two finished seeds (same numbers) and trained seed 2 again
    assert sweep["kept_code"] == 3 and len([x for x in sweep["err"].splitlines() if "failed:" in x]) == 2
    assert [(r["seed"], r["status"]) for r in doc["runs"]] == [(0, "kept"), (1, "kept"), (2, "failed")]
    assert doc["per_seed"] == json.loads(sweep["first_json"])["per_seed"]
    assert sorted(doc["per_seed"]["tool_call"]) == ["0", "1"], "the failed seed is in no statistic"
    assert doc["across"]["tool_call"]["k"] == 2
    section = (d / "RESULTS-section.md").read_text()
    assert section.startswith("<!-- seeds_tiny_seeds:start -->\n## Seed sweep: ") and "test host" in section
    assert "Failed (not in the tables): seed 2: " in section and "injected: the learner of seed 2 died" in section
    assert re.search(r"^\| 0 \| \d+ \| \d\.\d{3} -> \d\.\d{3}, [+-]\d\.\d{3} ± \d\.\d{3} .*n=4 \|$", section, re.M)
    assert re.search(
        r"^\| tool_call \| \d\.\d{3} \| \d\.\d{3} \| [+-]\d\.\d{3} ± \d\.\d{3} \| \d of 2 \| \d of 2 \|$", section, re.M
    )


def test_the_statistics_are_those_of_the_runs_records(sweep):
    """Each seed's base/final/gain in sweep.json, recomputed by hand from its rollouts.jsonl."""
    doc = json.loads((sweep["dir"] / "sweep.json").read_text())
    gains = []
    for seed in (0, 1):
        rows = [json.loads(x) for x in (sweep["dir"] / f"seed_{seed}" / "rollouts.jsonl").read_text().splitlines()]
        ev = {
            s: {r["task_id"]: r["reward"] or 0.0 for r in rows if r["split"] == "eval" and r["step"] == s}
            for s in (0, 2)
        }
        assert len(ev[0]) == 4 and ev[0].keys() == ev[2].keys()
        diffs = [ev[2][t] - ev[0][t] for t in ev[0]]
        mean = sum(diffs) / 4
        se = (sum((x - mean) ** 2 for x in diffs) / 3 / 4) ** 0.5
        p = doc["per_seed"]["tool_call"][str(seed)]
        assert p["a"] == pytest.approx(sum(ev[0].values()) / 4) and p["b"] == pytest.approx(sum(ev[2].values()) / 4)
        assert (p["diff"], p["se"], p["n"]) == (pytest.approx(mean), pytest.approx(se), 4)
        gains.append(mean)
    s = doc["across"]["tool_call"]
    assert s["mean"] == pytest.approx(sum(gains) / 2) and s["sd"] == pytest.approx(abs(gains[0] - gains[1]) / 2**0.5)


def test_two_seeds_sample_different_rollouts_from_the_same_base(sweep):
    a, b = sweep["dir"] / "seed_0", sweep["dir"] / "seed_1"
    ra, rb = _rollouts(a, "train", 1), _rollouts(b, "train", 1)
    assert len(ra) == len(rb) == 8
    assert [(r["task_id"], r["response"]) for r in ra] != [(r["task_id"], r["response"]) for r in rb]
    assert [r["response"] for r in ra] != [r["response"] for r in rb], "sampling differs, not only the draw"
    # The base model's greedy held-out evaluation does not depend on the seed.
    assert eval_steps(a / "rollouts.jsonl")[0] == eval_steps(b / "rollouts.jsonl")[0]
    assert [r["response"] for r in _rollouts(a, "eval", 0)] == [r["response"] for r in _rollouts(b, "eval", 0)]


def test_the_same_seed_twice_gives_the_same_run(sweep):
    """Seed 0 trained again: the same first step's samples token for token, and the same metrics at every step
    (wall-clock and memory aside) within float rounding."""
    again = sweep["again"]
    assert again.status == "done", again.cause
    first, second = sweep["dir"] / "seed_0", Path(again.run_dir)
    keys = ("task_id", "group", "response", "reward", "response_tokens")
    assert [[r[k] for k in keys] for r in _rollouts(first, "train", 1)] == [
        [r[k] for k in keys] for r in _rollouts(second, "train", 1)
    ]
    want, got = comparable_steps(first / "metrics.jsonl"), comparable_steps(second / "metrics.jsonl")
    assert sorted(got) == sorted(want) == [0, 1, 2]
    for s in (1, 2):
        assert got[s] == pytest.approx(want[s], rel=1e-5, abs=1e-7), f"step {s} differs"


def test_the_html_report_draws_a_held_out_curve_per_seed(sweep):
    html = (sweep["dir"] / "report.html").read_text()
    assert "Held-out reward, tool_call (eval/reward/tool_call/mean)" in html
    names = re.findall(r'<path class="series" data-name="([^"]+)"', html)
    assert names[:2] == ["seed 0", "seed 1"] and "seed 2 (failed)" in names, names


def test_the_learners_random_initialization_follows_the_seed(tiny_model_path, tmp_path):
    """The LoRA adapters start from the seed: seeds 0 and 1 differ, seed 0 twice does not. The value head has
    nothing random to seed: it starts at zero (V = 0) whatever the seed."""
    from rl.config.recipe import AlgoConfig, LearnerConfig, LoraConfig
    from rl.trainer.learner import Learner
    from test_learner import MODEL_CFG

    def init(seed: int) -> tuple:
        lrn = Learner(
            tiny_model_path,
            MODEL_CFG,
            AlgoConfig(name="ppo"),
            seed=seed,
            threads=1,
            shm_dir=str(tmp_path / f"shm{seed}_{len(list(tmp_path.iterdir()))}"),
            learner=LearnerConfig(lora=LoraConfig(rank=4)),
        )
        try:
            head = lrn.value_head.weight.detach().clone()
            lora_a = {k: v.detach().clone() for k, v in lrn.model.named_parameters() if "lora_A" in k}
            return head, lora_a
        finally:
            lrn.shutdown()

    (h0, a0), (h1, a1), (h0b, a0b) = init(0), init(1), init(0)
    assert a0 and a0.keys() == a1.keys() == a0b.keys()
    assert all(not a0[k].equal(a1[k]) for k in a0), "another seed, other adapters"
    assert all(a0[k].equal(a0b[k]) for k in a0), "the same seed, the same adapters"
    assert not h0.any() and not h1.any() and not h0b.any()


@pytest.mark.slow
def test_the_command_runs_seeds_in_child_processes_and_a_seed_repeats_across_processes(tmp_path, recipe_copy):
    """``bench/seeds.py`` as a command, its default mode (each seed its own ``jointrl train`` process), two seeds at
    once (``--parallel 2``); then seed 0 again in a process with another ``PYTHONHASHSEED``: the same samples and
    the same metrics (hash order of sets and dicts does not leak into a run)."""
    import os
    import subprocess

    (tmp_path / "parity_reward.py").write_text(PARITY)
    sys.path.insert(0, str(tmp_path))
    try:
        recipe = Path(_cfg(recipe_copy, out="tiny_seeds", train={"steps": 2}).source)
    finally:
        sys.path.remove(str(tmp_path))
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(tmp_path)])}

    def sweep(seeds: str, out: str, hashseed: str, *extra: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, str(root / "bench" / "seeds.py"), str(recipe), "--seeds", seeds, "--local"]
        return subprocess.run(
            [*cmd, "--out", str(tmp_path / out), *extra],
            env={**env, "PYTHONHASHSEED": hashseed},
            capture_output=True,
            text=True,
            timeout=600,
        )

    p = sweep("0,1", "a", "1", "--parallel", "2")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "| tool_call |" in p.stdout and (tmp_path / "a" / "report.html").is_file()
    q = sweep("0", "b", "2")
    assert q.returncode == 0, q.stderr[-3000:]
    first, second = tmp_path / "a" / "seed_0", tmp_path / "b" / "seed_0"
    keys = ("step", "split", "task_id", "group", "response", "reward", "response_tokens")
    rows = [[[r[k] for k in keys] for r in _rollouts(d, "train", 1)] for d in (first, second)]
    assert rows[0] == rows[1] and rows[0]
    want, got = comparable_steps(first / "metrics.jsonl"), comparable_steps(second / "metrics.jsonl")
    for s in (1, 2):
        assert got[s] == pytest.approx(want[s], rel=1e-5, abs=1e-7), f"step {s} differs"
    other = [[r[k] for k in keys] for r in _rollouts(tmp_path / "a" / "seed_1", "train", 1)]
    assert other != rows[0]


def test_shared_base_evaluates_the_base_once_and_reads_every_seed_against_it(tmp_path):
    """``--shared-base``: one ``train.steps=0`` run in ``OUT/base`` (its step-0 evaluation), then each seed without
    its own; every seed's gain is read against that evaluation, and the report says so."""
    (tmp_path / "parity_reward.py").write_text(PARITY)
    err, out = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(tmp_path))
        recipe = Path(_cfg(recipe_copier(tmp_path), out="tiny_shared", train={"steps": 1}).source)
        mp.setattr("bench._results.machine", lambda: "test host")
        sweep_dir = tmp_path / "sweep"
        argv = [str(recipe), "--seeds", "0,1", "--local", "--in-process", "--shared-base", "--out", str(sweep_dir)]
        with redirect_stderr(err), redirect_stdout(out):
            code = main(argv)
            again = main([*argv, "--from-runs"])
    assert code == 0 and again == 0, err.getvalue()
    base_steps = sorted(eval_steps(sweep_dir / "base" / "rollouts.jsonl"))
    assert base_steps == [0] and (sweep_dir / "base" / "DONE").is_file()
    for s in (0, 1):
        assert sorted(eval_steps(sweep_dir / f"seed_{s}" / "rollouts.jsonl")) == [1], "no step-0 evaluation of its own"
    doc = json.loads((sweep_dir / "sweep.json").read_text())
    assert [r["status"] for r in doc["runs"]] == ["kept", "kept"]  # the --from-runs read, same numbers
    assert doc["meta"]["base_dir"] == str(sweep_dir / "base")  # bench/ablate.py's FOLDER@STEP reads it
    base = eval_steps(sweep_dir / "base" / "rollouts.jsonl")[0]
    base_mean = {d: sum(v.values()) / len(v) for d, v in base.items()}
    for s in (0, 1):
        final = eval_steps(sweep_dir / f"seed_{s}" / "rollouts.jsonl")[1]
        for d in final:
            per = doc["per_seed"][d][str(s)]
            assert per["diff"] == pytest.approx(sum(final[d].values()) / len(final[d]) - base_mean[d])
    assert "one shared step-0 evaluation of the base model" in out.getvalue()
