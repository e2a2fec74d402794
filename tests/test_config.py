"""Recipes: loading, overrides, validation, and every bad-input case of the CLI (exit 2, one message)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rl.cli.main import main
from rl.config.recipe import (
    FREE_FORM_DICTS,
    AlgoConfig,
    Recipe,
    RecipeError,
    load_recipe,
    recipe_to_dict,
    validate_recipe,
)

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted((REPO / "recipes").glob("*.yaml"))


@pytest.fixture
def recipe_file(recipe_copy) -> Path:
    """A copy of the tiny recipe with absolute data paths, in a temp dir."""
    return recipe_copy("tiny.yaml", filename="r.yaml")


def _flat_keys(d: dict, prefix: str = "") -> set[str]:
    out = set()
    for k, v in d.items():
        if isinstance(v, dict) and k not in FREE_FORM_DICTS:
            out |= _flat_keys(v, f"{prefix}{k}.")
        else:
            out.add(prefix + k)
    return out


def _get(d: dict, dotted: str):
    for part in dotted.split("."):
        d = d[part]
    return d


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_every_shipped_recipe_lists_only_what_it_changes_and_is_valid(path: Path) -> None:
    text = yaml.safe_load(path.read_text())
    # The defaults of the recipe's own algorithm (the keys of algo depend on algo.name); algo.name's is grpo.
    own = recipe_to_dict(Recipe(algo=AlgoConfig(name=text.get("algo", {}).get("name", "grpo"))))
    defaults = {**own, "algo": {**own["algo"], "name": recipe_to_dict(Recipe())["algo"]["name"]}}
    every = _flat_keys({k: v for k, v in defaults.items() if k != "source"})
    named = _flat_keys({k: v for k, v in text.items() if k not in ("rewards",)})
    assert named <= every, named - every
    same = sorted(k for k in named if k != "rollout.envs" and _get(text, k) == _get(defaults, k))
    assert not same, f"{path.name} restates defaults: {same}"
    cfg = load_recipe(path, ["run.output_dir=/tmp/jointrl-validate-unused"])
    validate_recipe(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path="embedded:tiny")))


def test_overrides_and_types(recipe_file: Path) -> None:
    cfg = load_recipe(
        recipe_file,
        [
            "train.steps=7",
            "algo.optim.lr=3e-4",
            "run.output_dir=/tmp/x",
            "wandb.tags=[a, b]",
            "rewards.0.kwargs.format_weight=0.1",
            "rollout.envs.0.domain=tool_call",
        ],
    )
    assert cfg.train.steps == 7 and cfg.algo.optim.lr == pytest.approx(3e-4) and cfg.run.output_dir == "/tmp/x"
    assert cfg.wandb.tags == ["a", "b"] and cfg.rewards[0].kwargs["format_weight"] == 0.1
    assert cfg.source == str(recipe_file.resolve())
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train.steps = 3  # type: ignore[misc]


def test_free_form_mappings_take_new_keys_sections_do_not(tmp_path: Path) -> None:
    p = tmp_path / "r.yaml"
    p.write_text("mixer:\n  domain_weights: {tool_call: 2, code: 1}\n")
    cfg = load_recipe(p, ["mixer.domain_weights.terminal=0.5"])
    assert cfg.mixer.domain_weights == {"tool_call": 2.0, "code": 1.0, "terminal": 0.5}
    with pytest.raises(RecipeError, match="unknown recipe key 'mixer.weights'"):
        load_recipe(p, ["mixer.weights=1"])
    with pytest.raises(RecipeError, match="mixer.domain_weights.code"):
        load_recipe(p, ["mixer.domain_weights.code=lots"])


def test_defaults_fill_missing_sections(tmp_path: Path) -> None:
    p = tmp_path / "r.yaml"
    p.write_text("train:\n  steps: 2\n")
    cfg = load_recipe(p)
    assert cfg.train.steps == 2 and cfg.algo.name == "grpo" and cfg.rollout.group_size == 8


@pytest.mark.parametrize(
    "text, overrides, expected",
    [
        ("algo:\n  lrr: 1\n", [], ["r.yaml:2", "unknown recipe key 'algo.lrr'", "valid keys here", "optim"]),
        (
            "algo:\n  optim:\n    lrr: 1\n",
            [],
            ["r.yaml:3", "unknown recipe key 'algo.optim.lrr'", "valid keys here", "warmup_steps"],
        ),
        ("nosuch:\n  a: 1\n", [], ["r.yaml:1", "unknown recipe key 'nosuch'"]),
        ("algo:\n  optim:\n    lr: abc\n", [], ["r.yaml:3", "algo.optim.lr", "abc"]),
        ("algo:\n  lr: 0.1\n", [], ["r.yaml:2", "recipe key 'algo.lr' moved to 'algo.optim.lr'"]),
        ("algo:\n  name: ppo\n  critic: separate\n", [], ["r.yaml:3", "algo.critic.model"]),
        (
            "mixer:\n  normalization: domain_then_group\n",
            [],
            ["r.yaml:2", "moved to 'algo.reward_norm.mode'", "algo.reward_norm.mode: domain with algo.name: dr_grpo"],
        ),
        ("train:\n  steps: 2\n", ["algo.kl_coef=0.1"], ["override 'algo.kl_coef=0.1'", "moved to 'algo.kl.coef'"]),
        ("train:\n  steps: 2\n", ["algo.learner_workers=2"], ["moved to 'learner.workers'"]),
        ("train:\n  steps: -1\n", [], ["r.yaml:2", "train.steps: must be >= 0, got -1"]),
        ("algo:\n  loss:\n    agg: mean\n", [], ["r.yaml:3", "algo.loss.agg: choose one of auto, token-mean"]),
        ("run:\n  overwrite: 1\n", [], ["r.yaml:2", "run.overwrite: expected true or false"]),
        (
            "rollout:\n  envs:\n    - domain: code\n      clss: x\n",
            [],
            ["r.yaml:4", "unknown recipe key 'rollout.envs.0.clss'"],
        ),
        ("train:\n  steps: [1\n", [], ["r.yaml", "YAML syntax error"]),
        ("- a\n- b\n", [], ["a recipe is a mapping"]),
        ("train:\n  steps: 2\n", ["train.stepz=3"], ["override 'train.stepz=3'", "unknown recipe key"]),
        ("train:\n  steps: 2\n", ["train.steps=many"], ["override 'train.steps=many'", "train.steps"]),
        ("train:\n  steps: 2\n", ["train.steps"], ["expected key=value"]),
        ("source: x\n", [], ["'source' is set by jointrl"]),
    ],
)
def test_load_errors_name_key_and_line(tmp_path: Path, text: str, overrides: list[str], expected: list[str]) -> None:
    p = tmp_path / "r.yaml"
    p.write_text(text)
    with pytest.raises(RecipeError) as e:
        load_recipe(p, overrides)
    for frag in expected:
        assert frag in str(e.value)


def test_missing_recipe() -> None:
    with pytest.raises(RecipeError, match="recipe not found: /nonexistent/r.yaml"):
        load_recipe("/nonexistent/r.yaml")


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["model.path=/nonexistent/model"], "model.path: model folder not found: /nonexistent/model"),
        (["model.path=embedded:nope"], "unknown embedded model"),
        (["data.train_files=[/nonexistent/t.jsonl]"], "data.train_files.0: task file not found"),
        (["data.train_files=[]"], "data.train_files: at least one task file"),
        (["run.output_dir=/proc/jointrl-x"], "run.output_dir: not writable"),
        (["run.output_dir=/etc/passwd/x"], "run.output_dir: not writable"),
        (["algo.name=ppo2"], "algo.name: unknown algorithm 'ppo2'"),
        (["algo.loss.agg=mean"], "algo.loss.agg: choose one of"),
        (["algo.kl.kind=k9"], "algo.kl.kind: choose one of k1, k2, k3"),
        (["rollout.group_size=0"], "rollout.group_size: must be >= 1"),
        (["rollout.max_model_len=10"], "rollout.max_model_len: must exceed"),
        (["rewards.0.cls=nosuchpkg.Reward"], "rewards.0.cls: cannot import 'nosuchpkg.Reward'"),
        (["rewards.0.kwargs.bogus=1"], "rewards.0.kwargs: do not match"),
        (["rollout.envs.0.cls=envs.toolcall.Nope"], "rollout.envs.0.cls: cannot import"),
        (["wandb.mode=sometimes"], "wandb.mode: choose one of"),
        (["mixer.domain_weights={math: 1.0}"], "mixer.domain_weights: domains ['math'] have no env"),
        (["algo.reward_norm.mode=batch"], "algo.reward_norm.mode: choose one of none, domain"),
        (["mixer.strata=2", "mixer.strata_proportions=[1]"], "mixer.strata_proportions: need 2"),
        (["data.train_weights=[1, 2]"], "data.train_weights: need one non-negative weight per train file"),
        (["run.resume=sometimes"], "run.resume: choose one of never, auto"),
        (["model.engine_dtype=int3"], "model.engine_dtype: choose one of float32, bfloat16, float16"),
        (["train.max_bad_steps=0"], "train.max_bad_steps: must be >= 1"),
        (["rollout.max_staleness=-1"], "rollout.max_staleness: must be >= 0"),
        (["rollout.async_steps=1"], "recipe key 'rollout.async_steps' moved to 'rollout.max_staleness'"),
        (["algo.loss.tis_cap=-1"], "algo.loss.tis_cap: must be >= 0"),
        (["rollout.max_restarts=-1"], "rollout.max_restarts: must be >= 0"),
    ],
)
def test_validate_errors(recipe_file: Path, overrides: list[str], expected: str) -> None:
    # Types, choices and bounds fail while loading; files, classes and cross-section rules in validate.
    with pytest.raises(RecipeError) as e:
        validate_recipe(load_recipe(recipe_file, overrides))
    assert expected in str(e.value)


def test_reward_without_call_or_domains(recipe_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "userrew.py").write_text(
        "class NoCall:\n    domains = ('tool_call',)\n\nclass NoDomains:\n    def __call__(self, t):\n        return 1.0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RecipeError, match=r"rewards\.0\.cls: userrew\.NoCall has no __call__"):
        validate_recipe(load_recipe(recipe_file, ["rewards.0.cls=userrew.NoCall", "rewards.0.kwargs={}"]))
    with pytest.raises(RecipeError, match=r"rewards\.0\.domains: userrew\.NoDomains has no `domains`"):
        validate_recipe(
            load_recipe(recipe_file, ["rewards.0.cls=userrew.NoDomains", "rewards.0.kwargs={}", "rewards.0.domains=[]"])
        )
    validate_recipe(
        load_recipe(
            recipe_file, ["rewards.0.cls=userrew.NoDomains", "rewards.0.kwargs={}", "rewards.0.domains=[tool_call]"]
        )
    )


def test_existing_run_is_refused_without_overwrite(recipe_file: Path) -> None:
    cfg = load_recipe(recipe_file)
    out = Path(cfg.run.output_dir)
    out.mkdir(parents=True)
    (out / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(RecipeError, match="already holds a run"):
        validate_recipe(cfg)
    validate_recipe(load_recipe(recipe_file, ["run.overwrite=true"]))


@pytest.mark.parametrize(
    "args, expected",
    [
        (["validate", "/nonexistent.yaml"], "recipe not found"),
        (["train", "/nonexistent.yaml"], "recipe not found"),
        (["train", "{recipe}", "algo.nope=1"], "unknown recipe key 'algo.nope'"),
        (["train", "{recipe}", "model.path=/nonexistent/m"], "model folder not found"),
        (["train", "{recipe}", "run.output_dir=/proc/x"], "not writable"),
    ],
)
def test_cli_exit_code_2_no_traceback(
    recipe_file: Path, capsys: pytest.CaptureFixture, args: list[str], expected: str
) -> None:
    rc = main([a.replace("{recipe}", str(recipe_file)) for a in args])
    err = capsys.readouterr().err
    assert rc == 2
    assert expected in err and err.startswith("jointrl: error: ") and "Traceback" not in err


def test_cli_validate_ok_and_flags_after_overrides(recipe_file: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["validate", str(recipe_file), "train.steps=1", "--debug"]) == 0
    assert "ok" in capsys.readouterr().out


def test_cli_subprocess_bad_yaml(tmp_path: Path) -> None:
    """The installed console script: exit 2, one line, no traceback, nothing started."""
    p = tmp_path / "bad.yaml"
    p.write_text("train:\n  steps: [\n")
    exe = Path(sys.executable).with_name("jointrl")
    r = subprocess.run(
        [str(exe), "train", str(p)], capture_output=True, text=True, timeout=120, env={**os.environ, "RAY_ADDRESS": ""}
    )
    assert r.returncode == 2
    assert "YAML syntax error" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["cluster.device=tpu"], "cluster.device: choose one of auto, cpu, gpu; got 'tpu'"),
        (["cluster.placement=spread"], "cluster.placement: choose one of split, colocated; got 'spread'"),
        (["cluster.device=cpu", "cluster.placement=colocated"], "cluster.placement: colocated shares GPUs"),
        (
            ["cluster.device=cpu", "cluster.engine_tp=2", "cluster.engine_gpus=2"],
            "cluster.engine_tp: tensor parallelism (2) needs GPUs",
        ),
        (["cluster.device=gpu", "cluster.engine_tp=2"], "cluster.engine_gpus: an engine with cluster.engine_tp=2"),
        (["cluster.engine_tp=0"], "cluster.engine_tp: must be >= 1"),
        (
            ["cluster.device=gpu", "cluster.placement=colocated"],
            "cluster.engine_gpus: colocated: an engine and a learner worker share one GPU",
        ),
        (
            [
                "cluster.device=gpu",
                "cluster.placement=colocated",
                "cluster.engine_gpus=0.5",
                "cluster.learner_gpus=0.5",
                "rollout.num_engines=2",
            ],
            "rollout.num_engines (2) must equal learner.workers (1)",
        ),
        (
            [
                "cluster.device=gpu",
                "cluster.placement=colocated",
                "cluster.engine_gpus=0.5",
                "cluster.learner_gpus=0.5",
                "cluster.engine_tp=2",
            ],
            "cluster.engine_tp: colocated",
        ),
        (
            [
                "cluster.device=gpu",
                "cluster.placement=colocated",
                "cluster.engine_gpus=0.5",
                "cluster.learner_gpus=0.5",
                "rollout.max_staleness=1",
            ],
            "rollout.max_staleness: a rollout stream overlaps generation",
        ),
        (["learner.weight_sync=ipc"], "learner.weight_sync: ipc maps each learner rank's GPU buffer"),
        (["learner.weight_sync=nccl"], "learner.weight_sync: choose one of auto, file, ipc, collective; got 'nccl'"),
        (
            ["learner.weight_sync=collective", "cluster.device=gpu", "cluster.engine_tp=2", "cluster.engine_gpus=2"],
            "learner.weight_sync: collective streams whole tensors into one worker per engine",
        ),
        (
            ["learner.weight_sync=collective", "learner.lora.rank=8", "learner.lora.transfer=adapter"],
            "learner.weight_sync: collective streams merged weights",
        ),
        (
            ["learner.weight_sync=collective", "learner.delta_sync_full_every=4"],
            "learner.delta_sync_full_every: delta sync sends the changed entries",
        ),
        (["learner.weight_bucket_mb=0"], "learner.weight_bucket_mb: must be in (0, 65536], got 0"),
        (
            [
                "cluster.device=gpu",
                "cluster.placement=colocated",
                "cluster.engine_gpus=0.5",
                "cluster.learner_gpus=0.5",
                "learner.weight_sync=ipc",
                "learner.lora.rank=8",
                "learner.lora.transfer=adapter",
            ],
            "learner.weight_sync: ipc sends merged weights",
        ),
        (["cluster.device=gpu", "cluster.learner_gpus=0"], "cluster.learner_gpus: must be > 0 on GPU"),
        (["cluster.engine_gpus=1.5"], "cluster.engine_gpus: must be a fraction in [0, 1] or a whole number"),
        (["cluster.engine_gpus=2"], "cluster.engine_tp: an engine with cluster.engine_gpus=2 would use one of them"),
        (["cluster.learner_gpus=2"], "cluster.learner_gpus: a learner worker uses one GPU"),
        (["cluster.engine_cpus=0"], "cluster.engine_cpus: must be > 0"),
        (["cluster.placement_timeout_s=0"], "cluster.placement_timeout_s: must be > 0"),
        (["cluster.engine_resources={CPU: 1}"], "cluster.engine_resources.CPU: 'CPU' is set by cluster.*_cpus"),
        (["cluster.reward_resources.node_a=0"], "cluster.reward_resources.node_a: must be > 0"),
    ],
)
def test_cluster_errors_name_the_key(recipe_file: Path, overrides: list[str], expected: str) -> None:
    with pytest.raises(RecipeError) as e:
        validate_recipe(load_recipe(recipe_file, overrides))
    assert expected in str(e.value)
    assert str(e.value).startswith(f"{recipe_file.resolve()}:")  # the YAML line of the cluster key


def test_cluster_section_loads_custom_resources(recipe_file: Path) -> None:
    cfg = load_recipe(
        recipe_file,
        [
            "cluster.engine_resources.node_b=0.5",
            "cluster.learner_resources={node_a: 1}",
            "cluster.device=gpu",
            "cluster.placement=colocated",
            "cluster.engine_gpus=0.5",
            "cluster.learner_gpus=0.5",
        ],
    )
    validate_recipe(cfg)  # colocated on GPU is valid before any GPU is seen
    c = cfg.cluster
    assert c.engine_resources == {"node_b": 0.5} and c.learner_resources == {"node_a": 1.0}
    assert (c.engine_cpus, c.learner_cpus, c.reward_cpus, c.engine_tp) == (0.5, 1.0, 0.1, 1)  # today's CPU shares
    with pytest.raises(RecipeError, match="cluster.engine_resources.node_b"):
        load_recipe(recipe_file, ["cluster.engine_resources.node_b=lots"])


@pytest.mark.parametrize(
    "overrides, expected",
    [
        # Passed validation before and failed at step 1 (build_batch refused the normalized advantages).
        (
            ["algo.reward_norm.mode=domain", "algo.kl.in_reward=true"],
            "algo.reward_norm.mode: per-domain normalization shapes outcome rewards before the estimator; "
            "algo.kl.in_reward puts a per-token KL penalty in the reward",
        ),
        (["algo.reward_norm.mode=domain", "algo.name=ppo"], "'ppo' computes its advantages in the learner"),
        # Passed validation before and was silently ignored (no rescaling of learner-side advantages).
        (
            ["mixer.seq_level_domains=[tool_call]", "algo.kl.in_reward=true"],
            "mixer.seq_level_domains: rescales outcome advantages per sequence; algo.kl.in_reward",
        ),
        (["mixer.seq_level_domains=[tool_call]", "algo.name=ppo"], "so it would be ignored"),
        (["mixer.seq_level_domains=[math]"], "mixer.seq_level_domains: domains ['math'] have no env"),
        (["algo.name=rloo", "rollout.group_size=1"], "rollout.group_size: rloo needs a group of at least 2"),
        # Passed validation before and failed when the learner started (LRSchedule needs the total).
        (["algo.optim.schedule=cosine", "train.steps=0"], "algo.optim.schedule: cosine decays over the run's"),
    ],
)
def test_cross_section_rules_fail_at_validate_time(recipe_file: Path, overrides: list[str], expected: str) -> None:
    with pytest.raises(RecipeError) as e:
        validate_recipe(load_recipe(recipe_file, overrides))
    assert expected in str(e.value), str(e.value)
    assert str(e.value).startswith(f"{recipe_file.resolve()}")


def test_dr_grpo_defaults_to_the_papers_aggregation(recipe_file: Path) -> None:
    # (recipe_file holds every key resolved for grpo: `auto` stands for what a recipe leaves out.)
    a = load_recipe(recipe_file, ["algo.name=dr_grpo", "algo.loss.agg=auto"]).algo
    # tiny: max_new_tokens 24, one turn -> the constant normalizer is the generation budget, 24 tokens
    assert (a.loss.agg, a.loss.norm_tokens) == ("seq-mean-token-sum-norm", 24)
    a = load_recipe(recipe_file, ["algo.name=dr_grpo", "algo.loss.agg=auto", "rollout.max_turns=3"]).algo
    assert a.loss.norm_tokens == 72
    a = load_recipe(recipe_file, ["algo.name=dr_grpo", "algo.loss.agg=token-mean"]).algo
    assert (a.loss.agg, a.loss.norm_tokens) == ("token-mean", 0)  # an explicit choice stays
    assert load_recipe(recipe_file, ["algo.name=grpo", "algo.loss.agg=auto"]).algo.loss.agg == "token-mean"


def test_engine_kwargs_owned_by_recipe_keys_are_refused(recipe_file: Path) -> None:
    for key, owner in (
        ("max_model_len", "rollout.max_model_len"),
        ("dtype", "model.engine_dtype"),
        ("tensor_parallel_size", "cluster.engine_tp"),
        ("seed", "run.seed"),
    ):
        with pytest.raises(RecipeError) as e:
            validate_recipe(load_recipe(recipe_file, [f"rollout.engine_kwargs.{key}=1"]))
        assert f"rollout.engine_kwargs.{key}: jointrl sets {key} itself from {owner}" in str(e.value)


def test_engine_kwargs_checked_against_vllm_engine_args(recipe_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rl.config import validate as validate_mod

    monkeypatch.setattr(validate_mod, "vllm_engine_arg_names", lambda: {"max_num_seqs", "enable_prefix_caching"})
    cfg = load_recipe(recipe_file, ["rollout.engine_kwargs={max_num_seqs: 64, enable_prefix_caching: false}"])
    validate_recipe(cfg)
    assert cfg.rollout.engine_kwargs == {"max_num_seqs": 64, "enable_prefix_caching": False}
    with pytest.raises(RecipeError) as e:
        validate_recipe(load_recipe(recipe_file, ["rollout.engine_kwargs.max_num_seq=64"]))
    assert (
        "rollout.engine_kwargs.max_num_seq: not an argument of the installed vLLM's EngineArgs; did you mean "
        "max_num_seqs?" in str(e.value)
    )


@pytest.mark.slow  # imports vLLM (~10 s here)
def test_engine_kwargs_against_the_installed_vllm(recipe_file: Path) -> None:
    from rl.config.recipe import vllm_engine_arg_names

    names = vllm_engine_arg_names()
    assert {"max_num_seqs", "enable_prefix_caching", "quantization", "speculative_config"} <= names
    validate_recipe(
        load_recipe(recipe_file, ["rollout.engine_kwargs={max_num_seqs: 32, enable_prefix_caching: false}"])
    )
    with pytest.raises(RecipeError, match="rollout.engine_kwargs.prefix_cache: not an argument"):
        validate_recipe(load_recipe(recipe_file, ["rollout.engine_kwargs.prefix_cache=true"]))


def test_cli_validate_print_shows_the_full_resolved_recipe(recipe_file: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["validate", str(recipe_file), "--print", "algo.name=dr_grpo", "algo.loss.agg=auto"]) == 0
    out = capsys.readouterr()
    printed = yaml.safe_load(out.out)
    every = _flat_keys({k: v for k, v in recipe_to_dict(Recipe()).items() if k != "source"})
    assert _flat_keys(printed) == every  # every key, defaults filled
    assert printed["algo"]["loss"]["agg"] == "seq-mean-token-sum-norm" and printed["algo"]["optim"]["lr"] == 1e-3
    assert "ok" in out.err


def test_cli_old_flat_key_exits_2_naming_its_new_place(recipe_file: Path, capsys: pytest.CaptureFixture) -> None:
    old = recipe_file.parent / "old.yaml"
    old.write_text("algo:\n  name: grpo\n  kl_coef: 0.1\n")
    assert main(["validate", str(old)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"jointrl: error: {old}:3: recipe key 'algo.kl_coef' moved to 'algo.kl.coef'")


def test_sections_check_themselves_when_built_in_code() -> None:
    from rl.config.fields import FieldError
    from rl.config.recipe import KLConfig, OptimConfig

    with pytest.raises(FieldError, match="lr: must be > 0, got 0"):
        OptimConfig(lr=0.0)
    with pytest.raises(FieldError, match="kind: choose one of k1, k2, k3; got 'k4'"):
        KLConfig(kind="k4")  # type: ignore[arg-type]
    with pytest.raises(FieldError, match="in_reward: needs algo.kl.coef > 0"):
        KLConfig(in_reward=True)


def test_engine_kwargs_reach_vllm_last(monkeypatch: pytest.MonkeyPatch) -> None:
    # rollout.engine_kwargs go to vLLM's LLM(...) after jointrl's own defaults (a fake vllm module: no engine starts).
    import types

    from rollout import engine

    seen: dict = {}
    fake = types.ModuleType("vllm")
    # An engine object with no engine core process (as with VLLM_ENABLE_V1_MULTIPROCESSING=0).
    fake.LLM = lambda **kw: seen.update(kw) or types.SimpleNamespace(llm_engine=types.SimpleNamespace())  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setattr(engine, "has_cuda", lambda: False)
    monkeypatch.setattr(engine, "configure_vllm_env", lambda gib: None)
    e = engine.VLLMEngine("/m", dtype="float32", engine_kwargs={"max_num_seqs": 7, "enable_prefix_caching": False})
    e._closed = True  # nothing to shut down
    assert seen["max_num_seqs"] == 7 and seen["enable_prefix_caching"] is False  # a jointrl default replaced
    assert seen["dtype"] == "float32" and seen["model"] == "/m" and seen["enforce_eager"] is True


def test_bad_sandbox_config_fails_at_validate_time_naming_its_key(recipe_copy, capsys: pytest.CaptureFixture) -> None:
    # An env's sandbox caps (#15) are refused by `jointrl validate`, not first on a rollout worker.
    def edit(d: dict) -> None:
        d["rollout"]["envs"][2]["kwargs"]["sandbox_config"] = {"storage_mb": 0}  # the terminal env

    path = recipe_copy("joint_rl.yaml", filename="r.yaml", edit=edit)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "rollout.envs.2.kwargs.sandbox_config" in err and "storage_mb must be an int in [1, 65536], got 0" in err

    def edit_unknown(d: dict) -> None:
        d["rewards"][1]["kwargs"]["sandbox_config"] = {"disk": 5}  # the code reward

    path = recipe_copy("joint_rl.yaml", filename="r2.yaml", edit=edit_unknown)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "rewards.1.kwargs.sandbox_config" in err and "unknown keys ['disk']" in err
