"""The ``harbor`` domain: task directories as a task source of the recipe, the env's protocol, the mix with
other domains, and (slow) whole episodes and a tiny training run.

Tasks are read with the Harbor loader; episodes run over the quick images of ``tests/harbor_fixtures.py``
(the env module's ``_build_image`` seam), not the real builder's.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import envs.harbor.env as harbor_env
from envs.base import check_env
from envs.harbor.env import SYSTEM_PROMPT, HarborEnv, is_harbor_source
from envs.io import TaskFormatError, load_tasks
from envs.types import Message, Task, Trajectory
from harbor_fixtures import DATA, build_image
from rewards.harbor import HarborVerifierReward

needs_mmdebstrap = pytest.mark.skipif(shutil.which("mmdebstrap") is None, reason="mmdebstrap is not installed")


@pytest.fixture(autouse=True)
def quick_images(monkeypatch: pytest.MonkeyPatch) -> None:
    """Episodes over the tests' quick images (``tests/harbor_fixtures.py``), a fresh per-process memo each test."""
    monkeypatch.setattr(harbor_env, "_build_image", lambda task, cache_dir: build_image(task))
    monkeypatch.setattr(harbor_env, "_images", {})


def test_a_directory_of_task_dirs_one_task_dir_and_a_glob_are_task_sources() -> None:
    both = load_tasks(DATA)
    assert [t.id for t in both] == ["hello-file", "json-count"]
    t = both[0]
    assert t.domain == "harbor" and t.meta["harbor"] == str((DATA / "hello-file").resolve())
    assert t.messages == (
        Message("system", SYSTEM_PROMPT),
        Message("user", (DATA / "hello-file" / "instruction.md").read_text()),
    )
    assert t.meta["harbor_metadata"]["category"] == "file-operations"
    assert [t.id for t in load_tasks(DATA / "json-count")] == ["json-count"]
    assert [t.id for t in load_tasks(str(DATA / "*-file"))] == ["hello-file"]
    assert (
        is_harbor_source(DATA)
        and is_harbor_source(f"{DATA}/*")
        and not is_harbor_source(DATA / "hello-file" / "task.toml")
    )


def test_every_bad_task_dir_is_named_at_once(tmp_path: Path) -> None:
    for name in ("a-good", "b-no-instruction", "c-no-tests"):
        shutil.copytree(DATA / "hello-file", tmp_path / name)
    (tmp_path / "b-no-instruction" / "instruction.md").unlink()
    (tmp_path / "c-no-tests" / "tests" / "test.sh").unlink()
    with pytest.raises(TaskFormatError) as e:
        load_tasks(tmp_path)
    msg = str(e.value)
    assert "2 Harbor task(s) do not load" in msg and "b-no-instruction" in msg and "instruction.md" in msg
    assert "c-no-tests" in msg and "tests/test.sh" in msg and "a-good" not in msg


def test_a_source_without_task_dirs_or_with_repeated_names_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no task directory"):
        load_tasks(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="matches nothing"):
        load_tasks(str(tmp_path / "nothing-*"))
    for parent in ("x", "y"):
        shutil.copytree(DATA / "hello-file", tmp_path / parent / "hello-file")
    with pytest.raises(TaskFormatError, match="repeats the task"):
        load_tasks(str(tmp_path / "[xy]" / "hello-file"))


def _with_harbor(d: dict, train_files: list[str]) -> None:
    """A tiny recipe dict edited to train on ``train_files`` too, with the harbor env and reward beside tool calls."""
    d["data"]["train_files"] += train_files
    harbor = {"max_turns": 2, "command_timeout_s": 5.0}
    d["rollout"]["envs"] = [
        {"domain": "tool_call", "cls": "envs.toolcall.ToolCallEnv", "kwargs": {"max_turns": 1}},
        {"domain": "harbor", "cls": "envs.harbor.env.HarborEnv", "kwargs": harbor},
    ]
    reward = {"cls": "rewards.harbor.HarborVerifierReward", "weight": 1.0, "domains": ["harbor"], "kwargs": {}}
    d["rewards"].append(reward)


def _recipe(recipe_copy, train_files: list[str]) -> Path:
    return recipe_copy("tiny.yaml", edit=lambda d: _with_harbor(d, train_files))


def test_validate_loads_every_harbor_task_dir_and_names_the_key(tmp_path: Path, recipe_copy) -> None:
    from rl.config.recipe import RecipeError, check_task_files, load_recipe, validate_recipe

    cfg = load_recipe(_recipe(recipe_copy, [str(DATA)]))
    validate_recipe(cfg)
    n_toolcall = len(load_tasks(cfg.data.train_files[0])) + len(load_tasks(cfg.data.eval_files[0]))
    assert check_task_files(cfg) == n_toolcall + 2
    bad = tmp_path / "bad"
    shutil.copytree(DATA / "hello-file", bad / "broken")
    (bad / "broken" / "instruction.md").unlink()
    cfg = load_recipe(_recipe(recipe_copy, [str(bad)]))
    with pytest.raises(
        RecipeError, match=r"data\.train_files\.1: .*1 Harbor task.*\n.*broken: instruction\.md: missing"
    ):
        validate_recipe(cfg)
    with pytest.raises(RecipeError, match=r"(?s)data\.train_files\.1: .*broken: instruction\.md: missing"):
        check_task_files(cfg)


def test_harbor_tasks_mix_with_another_domain() -> None:
    from rl.data.mixer import TaskMixer, sources_by_domain

    other = [Task(id=f"t{i}", domain="tool_call", messages=(Message("user", "q"),)) for i in range(6)]
    sources = sources_by_domain(load_tasks(DATA), "harbor") + sources_by_domain(other, "toolcall")
    mixer = TaskMixer(sources, per_step=4, seed=0, domain_weights={"harbor": 0.5, "tool_call": 0.5}, strata=2)
    drawn = [t.domain for step in range(4) for t in mixer.sample(step)]
    assert drawn.count("harbor") == drawn.count("tool_call") == 8


def test_the_reward_passes_the_verifiers_value_on_harbor_tasks_only() -> None:
    task = load_tasks(DATA)[0]
    traj = Trajectory(task, 0, [1], [2], [1], [0.0], list(task.messages), True, False, "stop", env_reward=0.5)
    r = HarborVerifierReward()
    assert r(traj) == 0.5
    assert r(Trajectory(task, 0, [1], [2], [1], [0.0], [], True, False, "stop")) is None
    other = Task(id="x", domain="harbor", messages=(Message("user", "q"),))
    assert r(Trajectory(other, 0, [1], [2], [1], [0.0], [], True, False, "stop", env_reward=1.0)) is None


def test_eval_reports_per_task_pass_rates_on_a_harbor_set() -> None:
    from rl.cli.eval import eval_summary

    tasks = load_tasks(DATA)
    rewards = [1.0, 0.0, None, 0.5]  # two samples per task: hello-file passes once, json-count errs once
    scored = [
        Trajectory(tasks[i // 2], i, [1], [2], [1], [0.0], [], True, False, "stop", reward=r)
        for i, r in enumerate(rewards)
    ]
    summary, _ = eval_summary(tasks, scored, 2, 1, 1.0)
    per_task = summary["domains"]["harbor"]["per_task"]
    assert per_task["hello-file"] == {"pass_rate": 0.5, "passed": 1, "samples": 2, "errors": 0, "mean_reward": 0.5}
    assert per_task["json-count"] == {"pass_rate": 0.0, "passed": 0, "samples": 2, "errors": 1, "mean_reward": 0.5}


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_turns": 0}, "max_turns"),
        ({"storage_mb": 0}, "storage_mb"),
        ({"cpus": 0}, "cpus"),
        ({"image_paths": ["relative/dir"]}, "image_paths"),
        ({"stdin": "tty"}, "stdin"),
    ],
)
def test_bad_env_kwargs_are_named(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        HarborEnv(**kwargs)


def test_a_task_without_a_harbor_dir_is_refused() -> None:
    with pytest.raises(ValueError, match="meta\\['harbor'\\]"):
        HarborEnv().reset(Task(id="x", domain="harbor", messages=(Message("user", "q"),)))


def test_an_image_that_does_not_build_fails_every_reset_at_once_as_a_harness_failure(monkeypatch) -> None:
    calls = []

    def broken(task, cache_dir):
        calls.append(task.name)
        raise ValueError("environment/Dockerfile:2: RUN failed (exit 100)")

    monkeypatch.setattr(harbor_env, "_build_image", broken)
    task = load_tasks(DATA / "hello-file")[0]
    env = HarborEnv()
    for _ in range(2):
        with pytest.raises(RuntimeError, match=r"hello-file: no image: .*Dockerfile:2: RUN failed"):
            env.reset(task)
    assert calls == ["hello-file"]  # built (and failed) once, not once per episode
    with pytest.raises(RuntimeError, match="before reset"):
        env.step("DONE")


def test_a_host_that_cannot_mount_the_view_is_refused_when_the_env_is_made(monkeypatch) -> None:
    import envs.harbor.overlay as overlay
    from envs.sandbox import SandboxUnavailable

    monkeypatch.setattr(overlay, "_probed", None)
    monkeypatch.setattr(
        overlay, "_HOLDER", "import sys; sys.stderr.write('mount -t overlay: Operation not permitted'); sys.exit(1)"
    )
    with pytest.raises(SandboxUnavailable, match="Harbor episodes cannot run here: .*Operation not permitted"):
        HarborEnv()
    monkeypatch.setattr(overlay, "_probed", None)


# -- whole episodes (slow) ---------------------------------------------------------------------------


@pytest.mark.slow
@needs_mmdebstrap
def test_an_episode_through_the_terminal_protocol_scores_the_verifiers_reward() -> None:
    task = load_tasks(DATA / "hello-file")[0]
    with HarborEnv(max_turns=4) as env:
        assert env.reset(task) == list(task.messages)
        obs, term, trunc, info = env.step("```bash\npwd && echo hello harbor > greeting.txt\n```")
        assert obs[0].content == "exit code 0\n/app\n" and not term and not trunc
        obs, term, trunc, info = env.step("I wrote it.\nDONE")
        assert (obs, term, trunc) == ([], True, False)
        assert info["reward"] == 1.0 and info["passed"] and info["verifier"] == "ok" and info["end"] == "done"
        env.reset(task)  # a new episode starts clean
        _, _, _, info = env.step("DONE")
        assert info["reward"] == 0.0
        check_env(env, task, action="DONE")


@pytest.mark.slow
@needs_mmdebstrap
def test_an_episode_cut_by_the_rollout_is_still_verified_and_turn_limits_end_it() -> None:
    task = load_tasks(DATA / "json-count")[0]
    with HarborEnv(max_turns=2) as env:
        env.reset(task)
        env.step("```bash\nwc -l *.txt | tail -1 | awk '{print $1}' > count\n```")
        assert env.finalize()["reward"] == 1.0
        env.reset(task)
        env.step("no command here\nreally")
        _, _, trunc, info = env.step("```bash\ntrue\n```")
        assert trunc and info["end"] == "max_turns" and info["reward"] == 0.0


@pytest.mark.slow
@needs_mmdebstrap
def test_tiny_training_run_mixes_harbor_tasks_with_another_domain(tmp_path: Path, recipe_copy) -> None:
    """The in-process runtime (``--local``: no Ray, the HF engine) trains two steps on the tool-call tasks and
    the two test Harbor tasks; the random model's harbor episodes run in their images and are verified."""
    import json

    from rl.config.recipe import load_recipe, validate_recipe
    from rl.driver.local_runtime import LocalRuntime
    from rl.driver.loop import train

    def edit(d: dict) -> None:
        _with_harbor(d, [str(DATA)])
        d["data"]["eval_limit"] = 2
        d["rollout"].update(prompts_per_step=4, group_size=2, max_new_tokens=16, max_turns=2)
        d["mixer"] = {**d.get("mixer", {}), "domain_weights": {"tool_call": 0.5, "harbor": 0.5}}
        d["train"]["steps"] = 2
        d.setdefault("wandb", {})["mode"] = "disabled"
        d["run"]["threads"] = 1

    cfg = load_recipe(recipe_copy("tiny.yaml", edit=edit))
    validate_recipe(cfg)
    out = train(cfg, progress=False, runtime=lambda c, m, o, v: LocalRuntime(c, m, o, v))
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [s for s in steps if s.get("step", 0) >= 1 and "reward/harbor/mean" in s]
    assert len(trained) == 2, steps
    assert all(s["reward/harbor/mean"] == 0.0 for s in trained)  # the random model does not solve them
    rollouts = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert {r.get("domain") for r in rollouts} >= {"harbor", "tool_call"}


@pytest.mark.slow
@needs_mmdebstrap
def test_jointrl_train_over_shipped_harbor_tasks_and_tool_calls_through_ray_and_vllm(
    tmp_path: Path, recipe_copy
) -> None:
    """One step of ``jointrl train`` (Ray, vLLM, the tiny model) over three shipped Harbor tasks mixed with
    the tool-call domain: their images built (or found) at start-up before the actors, episodes in them."""
    import json
    import os
    import re
    import subprocess
    import sys

    shipped = Path(__file__).resolve().parents[1] / "recipes" / "harbor"

    def edit(d: dict) -> None:
        _with_harbor(d, [f"{shipped}/c*"])
        d["data"]["eval_files"] = []
        d["rollout"].update(prompts_per_step=4, group_size=2, max_new_tokens=16, max_turns=2)
        d["mixer"] = {**d.get("mixer", {}), "domain_weights": {"tool_call": 0.5, "harbor": 0.5}}
        d["train"]["steps"] = 1

    recipe = recipe_copy("tiny.yaml", edit=edit)
    exe = Path(sys.executable).with_name("jointrl")
    env = {**os.environ, "WANDB_MODE": "disabled", "RAY_ADDRESS": ""}
    r = subprocess.run([str(exe), "train", str(recipe)], capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    starts = [ln for ln in r.stderr.splitlines() if re.search(r"\] Harbor image \d", ln)]
    assert [ln.split("] ")[1].split(":")[0] for ln in starts] == [
        "Harbor image 1/3 c-fix-csvsum", "Harbor image 2/3 cron-backup-entry", "Harbor image 3/3 csv-to-sqlite"
    ], r.stderr[-4000:]  # fmt: skip
    assert r.stderr.index("Harbor images: 3 task(s)") < r.stderr.index("Ray:"), r.stderr[-4000:]
    out = tmp_path / "out"
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert any(s.get("step") == 1 and "reward/harbor/mean" in s for s in steps), steps
    rollouts = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert {r.get("domain") for r in rollouts} >= {"harbor", "tool_call"}
    harbor = [r for r in rollouts if r["domain"] == "harbor"]
    assert all(r["reward_error"] is None and r["reward"] == 0.0 for r in harbor), harbor  # verified, not failed
