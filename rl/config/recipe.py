"""Recipes: typed, frozen config dataclasses, loaded from YAML plus ``key=value`` overrides.

One dataclass per recipe section, at most two levels deep. ``load_recipe`` merges the YAML
and the overrides onto the structured defaults (unknown keys and wrong types fail, naming
the key and the YAML line), then ``validate_recipe`` checks what types cannot: files and
model folders exist, dotted class paths import, the output dir is writable, values are in
range. Both raise ``RecipeError`` whose message is meant for the user as is.

This module does not start Ray, load models or touch the network.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException


class RecipeError(ValueError):
    """A recipe problem, with a message that names the file, key and line where known."""


@dataclass(frozen=True)
class RunConfig:
    output_dir: str = "runs/default"  # run outputs: metrics, rollouts, checkpoints, resolved recipe
    seed: int = 0  # seeds task order, sampling and torch
    ray_address: str = ""  # "" = $RAY_ADDRESS if set, else a local Ray started for this run
    threads: int = 0  # torch threads in the learner; 0 = all cores of the machine
    overwrite: bool = False  # allow writing into an output_dir that already holds a run
    save_every: int = 0  # checkpoint every N steps (0 = only at the end)
    keep_checkpoints: int = 2  # how many of the newest checkpoints to keep
    rollouts_every: int = 1  # dump rollouts every N steps (0 = never)
    resume: str = "never"  # never | auto: continue from the newest checkpoint in output_dir


@dataclass(frozen=True)
class ModelConfig:
    path: str = "embedded:smollm2-135m-instruct"  # local HF folder, or embedded:smollm2-135m-instruct | embedded:tiny
    engine_dtype: str = "bfloat16"  # vLLM weights: bfloat16 | float32 | float16
    learner_dtype: str = "float32"  # learner master weights: float32 | bfloat16
    autocast: bool = True  # bf16 autocast for learner forward/backward (2-2.7x faster on AVX-512 bf16 CPUs)
    reference_dtype: str = "bfloat16"  # frozen reference model for the KL term


@dataclass(frozen=True)
class DataConfig:
    train_files: list[str] = field(default_factory=list)  # task files (.jsonl, .jsonl.gz, .parquet); relative to the recipe
    eval_files: list[str] = field(default_factory=list)  # held-out task files, evaluated greedily
    eval_limit: int = 0  # evaluate at most N held-out tasks (0 = all)
    train_weights: list[float] = field(default_factory=list)  # weight of each train file within its domain ([] = 1 each)


@dataclass(frozen=True)
class MixerConfig:
    domain_weights: dict[str, float] = field(default_factory=dict)  # share of each step's prompts per domain ({} = by task counts)
    strata: int = 1  # length strata per dataset (by estimated trajectory length)
    strata_proportions: list[float] = field(default_factory=list)  # prompts per stratum ([] = proportional to stratum sizes)
    length_ema: float = 0.5  # weight of a task's newest observed length in its estimate
    normalization: str = "none"  # none | group | domain | domain_then_group (see rl/data/mixer.py)
    norm_stat: str = "welford"  # running per-domain reward statistics: welford | ema
    norm_ema: float = 0.1  # EMA weight when norm_stat is ema
    curriculum_window: int = 0  # tasks all solved or all failed over their last N visits are sampled less (0 = off)
    curriculum_weight: float = 1.0  # chance that such a task stays in a pass over its stratum
    solved_threshold: float = 1.0  # a visit counts as solved when the mean reward of its group reaches this
    seq_level_domains: list[str] = field(default_factory=list)  # domains whose samples weigh per sequence, not per token
    mode: str = "fixed"  # fixed | adaptive: domain weights follow each domain's learning signal (rl/data/mixer.py)
    adaptive: dict[str, Any] = field(default_factory=dict)  # adaptive mode: floor, ceiling, rate, signal_ema, trend_fast, trend_slow, trend_coef, initial_signal


@dataclass(frozen=True)
class EnvSpec:
    domain: str = "tool_call"  # the task domain this env serves
    cls: str = "envs.toolcall.ToolCallEnv"  # dotted path of the env class
    kwargs: dict[str, Any] = field(default_factory=dict)  # constructor keyword arguments


@dataclass(frozen=True)
class RolloutConfig:
    num_engines: int = 1  # vLLM engine actors
    prompts_per_step: int = 8  # tasks drawn per step
    group_size: int = 8  # samples per task (the GRPO group)
    max_new_tokens: int = 64  # per policy turn
    max_model_len: int = 2048  # prompt + response tokens per episode
    max_turns: int = 1  # policy turns per episode
    temperature: float = 1.0  # sampling temperature for training rollouts (held-out evaluation is greedy)
    top_p: float = 1.0  # nucleus sampling for training rollouts
    kv_cache_gib: float = 1.0  # VLLM_CPU_KVCACHE_SPACE on CPU
    gpu_memory_utilization: float = 0.5  # on GPU
    async_steps: int = 0  # 0 = synchronous; 1 = one-step-off: step t+1's episodes are generated while step t trains
    max_restarts: int = 2  # a dead engine is replaced and its prompts re-issued, at most this often per call
    envs: list[EnvSpec] = field(default_factory=lambda: [EnvSpec()])  # one env class per domain (domain, cls, kwargs)


@dataclass(frozen=True)
class RewardSpec:
    cls: str = "rewards.toolcall.ToolCallReward"  # dotted path of the reward class
    weight: float = 1.0  # weight in the final score
    domains: list[str] = field(default_factory=list)  # [] = the class's own `domains` attribute
    kwargs: dict[str, Any] = field(default_factory=dict)  # constructor keyword arguments


@dataclass(frozen=True)
class RewardServiceConfig:
    workers: int = 1  # reward actors
    timeout_s: float = 60.0  # per scoring call


@dataclass(frozen=True)
class AlgoConfig:
    name: str = "grpo"  # grpo | dr_grpo | rloo (group baselines) | reinforce_pp (batch baseline) | ppo (GAE critic)
    lr: float = 1e-5  # AdamW learning rate of the policy
    weight_decay: float = 0.0  # AdamW weight decay
    max_grad_norm: float = 1.0  # global-norm clipping (0 = off)
    lr_warmup_steps: int = 0  # optimizer steps of linear warmup
    lr_schedule: str = "constant"  # after warmup: constant | cosine (to lr * lr_min_ratio at the last step)
    lr_min_ratio: float = 0.0  # cosine floor, as a fraction of lr
    clip_low: float = 0.2  # ratio clip below 1
    clip_high: float = 0.2  # ratio clip above 1 (clip-higher when > clip_low)
    dual_clip: float = 0.0  # dual clip c > 1 bounds the loss of negative-advantage tokens at -A * c (0 = off)
    tis_cap: float = 0.0  # truncated importance sampling: each token's loss x min(pi_learner / pi_engine, tis_cap), correcting for stale (async) or numerically different engine samples (0 = off)
    loss_agg: str = "token-mean"  # token-mean | seq-mean-token-mean | seq-mean-token-sum
    entropy_coef: float = 0.0  # entropy bonus weight (0 = off)
    kl_coef: float = 0.0  # KL-to-reference coefficient, the initial one when adaptive (0 = no reference model is kept)
    kl_kind: str = "k3"  # k1 | k2 | k3
    kl_in_reward: bool = False  # false: coefficient x aggregated KL in the loss; true: -coefficient x KL per token in the reward
    kl_target: float = 0.0  # > 0: adaptive coefficient steering kl/mean toward this target (0 = fixed kl_coef)
    kl_horizon: int = 10000  # adaptive KL: samples over which the coefficient may change by +-20%
    epochs: int = 1  # passes over each batch
    minibatches: int = 1  # optimizer steps per epoch (shuffled minibatches of the batch)
    micro_batch_tokens: int = 4096  # forward/backward in micro-batches of at most this many tokens
    share_prompt: bool = True  # run a group's shared prompt once (its KV cache serves every member)
    zero_variance: str = "keep"  # groups whose rewards are all equal: keep (KL still acts) | drop (DAPO-style filter)
    critic: str = "value_head"  # ppo: value_head (linear head on the policy's last hidden states) | separate (own model copy)
    critic_lr: float = 0.0  # learning rate of the value head / separate critic (0 = lr)
    vf_coef: float = 0.5  # weight of the value loss
    value_clip: float = 0.2  # clip of the value update around the old values (0 = unclipped value loss)
    gamma: float = 1.0  # ppo / reinforce_pp: discount per policy token
    lam: float = 0.95  # ppo: GAE lambda
    learner_workers: int = 1  # data-parallel learner actors (torch.distributed: gloo on CPU, NCCL on GPU)


@dataclass(frozen=True)
class ClusterConfig:
    """Resources and placement of the actors (counts stay in rollout.num_engines, algo.learner_workers and
    reward_service.workers). Each role is reserved with a Ray placement group before any actor starts; see
    docs/cluster.md."""

    device: str = "auto"  # auto (GPUs when the Ray cluster has any) | cpu | gpu
    placement: str = "split"  # split: one bundle per engine and per learner worker | colocated: engine i and learner i share one GPU (GPU only; vLLM sleeps during the learner step)
    engine_gpus: float = 1.0  # GPUs per engine on GPU (a fraction packs engines onto one GPU; must equal engine_tp when engine_tp > 1)
    engine_tp: int = 1  # tensor-parallel size of each vLLM engine (GPU only)
    engine_cpus: float = 0.5  # Ray CPUs per engine
    engine_resources: dict[str, float] = field(default_factory=dict)  # custom Ray resources per engine, e.g. {node_b: 1} (nodes get them from `ray start --resources`)
    learner_gpus: float = 1.0  # GPUs per learner worker on GPU
    learner_cpus: float = 1.0  # Ray CPUs per learner worker
    learner_resources: dict[str, float] = field(default_factory=dict)  # custom Ray resources per learner worker
    reward_cpus: float = 0.1  # Ray CPUs per reward worker
    reward_resources: dict[str, float] = field(default_factory=dict)  # custom Ray resources per reward worker
    placement_timeout_s: float = 120.0  # fail, naming the resources asked for, when the cluster cannot place the actors within this


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 20  # optimizer steps (one batch each)
    eval_every: int = 0  # held-out evaluation every N steps; it always runs at start and end (0 = only then)
    max_bad_steps: int = 3  # stop after this many steps in a row whose update was skipped (non-finite loss or gradients)


@dataclass(frozen=True)
class WandbConfig:
    mode: str = ""  # online | offline | disabled; "" = $WANDB_MODE, else online with an API key, else offline
    project: str = "jointrl"  # W&B project
    entity: str = ""  # W&B entity (team or user; "" = your default)
    run_name: str = ""  # W&B run name ("" = the output dir's name)
    tags: list[str] = field(default_factory=list)  # W&B tags
    table_every: int = 0  # W&B table of rollouts (prompt, response, scores) every N steps and at the last step (0 = never)


@dataclass(frozen=True)
class Recipe:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    mixer: MixerConfig = field(default_factory=MixerConfig)
    rewards: list[RewardSpec] = field(default_factory=lambda: [RewardSpec()])
    reward_service: RewardServiceConfig = field(default_factory=RewardServiceConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    # Where the recipe came from; relative paths in it resolve against this folder.
    source: str = ""


ALGOS = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "ppo")
LR_SCHEDULES = ("constant", "cosine")
CRITICS = ("value_head", "separate")
LOSS_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
KL_KINDS = ("k1", "k2", "k3")
DTYPES = ("float32", "bfloat16", "float16")
WANDB_MODES = ("", "online", "offline", "disabled")
FREE_FORM_DICTS = ("kwargs", "domain_weights", "engine_resources", "learner_resources", "reward_resources")
EMBEDDED_MODELS = ("embedded:smollm2-135m-instruct", "embedded:tiny")
DEVICES = ("auto", "cpu", "gpu")
PLACEMENTS = ("split", "colocated")
RESERVED_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


def _yaml_line(text: str, dotted: str) -> int | None:
    """1-based line of ``dotted`` (``a.b`` or ``a.0.b``) in YAML ``text``, or of its deepest existing parent."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = None
    for part in dotted.split("."):
        if isinstance(node, yaml.MappingNode):
            nxt = None
            for k, v in node.value:
                if k.value == part:
                    line, nxt = k.start_mark.line + 1, v
                    break
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and part.isdigit() and int(part) < len(node.value):
            node = node.value[int(part)]
            line = node.start_mark.line + 1
        else:
            break
        if node is None:
            break
    return line


def _where(path: str, text: str, key: str) -> str:
    line = _yaml_line(text, key) if text else None
    return f"{path}:{line}" if line else path


def load_recipe(path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """Read a recipe YAML, apply ``key=value`` overrides, and return a frozen ``Recipe``.

    Raises ``RecipeError`` for a missing file, invalid YAML, unknown keys, wrong types
    or a malformed override. Does not check files or models (see ``validate_recipe``).
    """
    p = Path(path)
    if not p.is_file():
        raise RecipeError(f"recipe not found: {p}")
    text = p.read_text()
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{p}:{mark.line + 1}" if mark else str(p)
        raise RecipeError(f"{where}: YAML syntax error: {getattr(e, 'problem', e)}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise RecipeError(f"{p}: a recipe is a mapping of sections (run, model, data, ...), got {type(raw).__name__}")
    if "source" in raw:
        raise RecipeError(f"{_where(str(p), text, 'source')}: 'source' is set by jointrl, not by the recipe")
    base = OmegaConf.structured(Recipe)
    OmegaConf.set_struct(base, True)
    _open_free_form_dicts(base)
    try:
        merged = OmegaConf.merge(base, OmegaConf.create(raw))
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or ""
        raise RecipeError(f"{_where(str(p), text, key)}: {_explain(e, key)}") from None
    # Overrides edit the full plain tree, then everything is re-validated in one merge;
    # a type error on an overridden key is reported against the override.
    tree = OmegaConf.to_container(merged)
    overridden: dict[str, str] = {}
    for ov in overrides:
        key, value = _parse_override(ov)
        _set_path(tree, key, value, ov)
        overridden[key] = ov
    tree["source"] = str(p.resolve())
    try:
        final = OmegaConf.merge(base, OmegaConf.create(tree))
        return OmegaConf.to_object(final)
    except OmegaConfBaseException as e:
        key = _dotted(getattr(e, "full_key", "") or "")
        for k, ov in overridden.items():
            if key == k or key.startswith(k + "."):
                raise RecipeError(f"override {ov!r}: {_explain(e, key)}") from None
        raise RecipeError(f"{_where(str(p), text, key)}: {_explain(e, key)}") from None


def _open_free_form_dicts(node: Any) -> None:
    """Dict-typed fields (``mixer.domain_weights``, ``kwargs``) take any keys; sections stay strict."""
    if OmegaConf.is_dict(node):
        if OmegaConf.get_type(node) is dict:
            OmegaConf.set_struct(node, False)
        for k in node.keys():
            _open_free_form_dicts(node._get_node(k))
    elif OmegaConf.is_list(node):
        for i in range(len(node)):
            _open_free_form_dicts(node._get_node(i))


def _dotted(full_key: str) -> str:
    """OmegaConf's ``rewards[0].cls`` as ``rewards.0.cls``."""
    return full_key.replace("[", ".").replace("]", "")


def _parse_override(ov: str) -> tuple[str, Any]:
    if "=" not in ov:
        raise RecipeError(f"override {ov!r}: expected key=value (e.g. train.steps=5)")
    key, _, value = ov.partition("=")
    try:
        # Parsed like the YAML file: 5 -> int, 1e-5 -> float, [a, b] -> list, {k: v} -> mapping.
        parsed = yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError:
        parsed = value
    return key.strip(), parsed


def _set_path(tree: Any, key: str, value: Any, ov: str) -> None:
    parts = key.split(".")
    node = tree
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, dict) and part in node and part != "source":
            if last:
                node[part] = value
            else:
                node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            if last:
                node[int(part)] = value
            else:
                node = node[int(part)]
        elif isinstance(node, dict) and i == len(parts) - 1 and i > 0 and parts[i - 1] in FREE_FORM_DICTS:
            node[part] = value  # free-form mappings (kwargs, domain weights): new keys are allowed
        else:
            raise RecipeError(f"override {ov!r}: unknown recipe key '{key}'{_suggest(key)}")


def _explain(e: OmegaConfBaseException, key: str) -> str:
    msg = str(e).splitlines()[0]
    if "not in struct" in msg or "Key '" in msg and "not" in msg:
        return f"unknown recipe key '{key}'{_suggest(key)}"
    return f"recipe key '{key}': {msg}" if key else msg


def _suggest(key: str) -> str:
    """'; valid keys here: ...' for the section of an unknown key."""
    parts = key.split(".")
    cls: Any = Recipe
    for part in parts[:-1]:
        f = {x.name: x for x in fields(cls)}.get(part)
        if f is None or not is_dataclass(_field_type(cls, part)):
            return ""
        cls = _field_type(cls, part)
    return f"; valid keys here: {', '.join(x.name for x in fields(cls) if x.name != 'source')}"


def _field_type(cls: Any, name: str) -> Any:
    import typing

    return typing.get_type_hints(cls)[name]


def resolve_path(recipe: Recipe, p: str) -> Path:
    """A path from the recipe: absolute as is, relative to the recipe file's folder."""
    q = Path(os.path.expanduser(p))
    if q.is_absolute() or not recipe.source:
        return q
    return Path(recipe.source).parent / q


def validate_recipe(recipe: Recipe, check_imports: bool = True) -> None:
    """Check everything about ``recipe`` that can be checked without starting anything.

    Raises ``RecipeError`` naming the first problem's key. ``check_imports`` resolves the
    env and reward classes named by dotted path (importing user code).
    """
    src = recipe.source or "recipe"
    text = Path(recipe.source).read_text() if recipe.source and Path(recipe.source).is_file() else ""

    def fail(key: str, msg: str) -> None:
        raise RecipeError(f"{_where(src, text, key)}: {key}: {msg}")

    r, a, t = recipe.rollout, recipe.algo, recipe.train
    if t.steps < 0:
        fail("train.steps", f"must be >= 0, got {t.steps}")
    if t.eval_every < 0:
        fail("train.eval_every", "must be >= 0")
    if t.max_bad_steps < 1:
        fail("train.max_bad_steps", f"must be >= 1, got {t.max_bad_steps}")
    if r.max_restarts < 0:
        fail("rollout.max_restarts", f"must be >= 0, got {r.max_restarts}")
    if r.async_steps not in (0, 1):
        fail("rollout.async_steps", f"choose 0 (synchronous) or 1 (one-step-off), got {r.async_steps}")
    if a.tis_cap < 0:
        fail("algo.tis_cap", f"must be >= 0 (0 = off), got {a.tis_cap}")
    for key, val in (("rollout.num_engines", r.num_engines), ("rollout.prompts_per_step", r.prompts_per_step),
                     ("rollout.group_size", r.group_size), ("rollout.max_new_tokens", r.max_new_tokens),
                     ("rollout.max_turns", r.max_turns), ("reward_service.workers", recipe.reward_service.workers),
                     ("algo.micro_batch_tokens", a.micro_batch_tokens)):
        if val < 1:
            fail(key, f"must be >= 1, got {val}")
    if r.max_model_len <= r.max_new_tokens:
        fail("rollout.max_model_len", f"must exceed rollout.max_new_tokens ({r.max_new_tokens})")
    if a.name not in ALGOS:
        fail("algo.name", f"unknown algorithm {a.name!r}; choose one of {', '.join(ALGOS)}")
    if a.name == "rloo" and r.group_size < 2:
        fail("rollout.group_size", "rloo needs a group of at least 2 samples")
    if a.loss_agg not in LOSS_AGGS:
        fail("algo.loss_agg", f"unknown aggregation {a.loss_agg!r}; choose one of {', '.join(LOSS_AGGS)}")
    if a.zero_variance not in ("keep", "drop"):
        fail("algo.zero_variance", f"choose keep or drop, got {a.zero_variance!r}")
    if a.kl_kind not in KL_KINDS:
        fail("algo.kl_kind", f"unknown KL estimator {a.kl_kind!r}; choose one of {', '.join(KL_KINDS)}")
    if a.lr <= 0:
        fail("algo.lr", f"must be > 0, got {a.lr}")
    if a.kl_coef < 0:
        fail("algo.kl_coef", "must be >= 0")
    if not (0 <= a.clip_low < 1) or a.clip_high < 0:
        fail("algo.clip_low", "need 0 <= clip_low < 1 and clip_high >= 0")
    if a.dual_clip != 0 and not a.dual_clip > 1:
        fail("algo.dual_clip", f"must be 0 (off) or > 1, got {a.dual_clip}")
    if a.lr_schedule not in LR_SCHEDULES:
        fail("algo.lr_schedule", f"unknown schedule {a.lr_schedule!r}; choose one of {', '.join(LR_SCHEDULES)}")
    if not 0 <= a.lr_min_ratio <= 1:
        fail("algo.lr_min_ratio", f"must be in [0, 1], got {a.lr_min_ratio}")
    if a.kl_in_reward and a.kl_coef == 0:
        fail("algo.kl_in_reward", "needs algo.kl_coef > 0 (the coefficient of the per-token KL penalty)")
    if a.kl_target < 0:
        fail("algo.kl_target", f"must be >= 0, got {a.kl_target}")
    if a.kl_target > 0 and a.kl_coef == 0:
        fail("algo.kl_target", "an adaptive KL coefficient needs algo.kl_coef > 0 as its initial value")
    if a.critic not in CRITICS:
        fail("algo.critic", f"unknown critic {a.critic!r}; choose one of {', '.join(CRITICS)}")
    if not (0 <= a.gamma <= 1):
        fail("algo.gamma", f"must be in [0, 1], got {a.gamma}")
    if not (0 <= a.lam <= 1):
        fail("algo.lam", f"must be in [0, 1], got {a.lam}")
    for key, val in (("algo.lr_warmup_steps", a.lr_warmup_steps), ("algo.entropy_coef", a.entropy_coef),
                     ("algo.critic_lr", a.critic_lr), ("algo.vf_coef", a.vf_coef), ("algo.value_clip", a.value_clip)):
        if val < 0:
            fail(key, f"must be >= 0, got {val}")
    for key, val in (("algo.epochs", a.epochs), ("algo.minibatches", a.minibatches), ("algo.kl_horizon", a.kl_horizon),
                     ("algo.learner_workers", a.learner_workers)):
        if val < 1:
            fail(key, f"must be >= 1, got {val}")
    if a.minibatches > r.prompts_per_step * r.group_size:
        fail("algo.minibatches", f"{a.minibatches} minibatches from batches of {r.prompts_per_step * r.group_size} "
                                 "samples (rollout.prompts_per_step x rollout.group_size) would leave some empty")
    if r.temperature < 0:
        fail("rollout.temperature", "must be >= 0")
    for key, val in (("model.engine_dtype", recipe.model.engine_dtype), ("model.learner_dtype", recipe.model.learner_dtype),
                     ("model.reference_dtype", recipe.model.reference_dtype)):
        if val not in DTYPES:
            fail(key, f"unknown dtype {val!r}; choose one of {', '.join(DTYPES)}")
    if recipe.run.resume not in ("never", "auto"):
        fail("run.resume", f"choose never or auto, got {recipe.run.resume!r}")
    if recipe.wandb.table_every < 0:
        fail("wandb.table_every", "must be >= 0")
    mx = recipe.mixer
    from rl.data.mixer import NORMALIZATIONS

    if mx.normalization not in NORMALIZATIONS:
        fail("mixer.normalization", f"unknown normalization {mx.normalization!r}; choose one of {', '.join(NORMALIZATIONS)}")
    if mx.normalization != "none" and a.name not in ("grpo", "dr_grpo", "rloo", "reinforce_pp"):
        fail("mixer.normalization", f"per-domain normalization gives outcome advantages; {a.name!r} computes its own")
    if mx.norm_stat not in ("welford", "ema"):
        fail("mixer.norm_stat", f"choose welford or ema, got {mx.norm_stat!r}")
    if mx.strata < 1:
        fail("mixer.strata", "must be >= 1")
    if mx.strata_proportions and (len(mx.strata_proportions) != mx.strata or min(mx.strata_proportions) < 0):
        fail("mixer.strata_proportions", f"need {mx.strata} non-negative numbers, got {mx.strata_proportions}")
    if any(w < 0 for w in mx.domain_weights.values()) or (mx.domain_weights and not sum(mx.domain_weights.values()) > 0):
        fail("mixer.domain_weights", "weights must be >= 0 with a positive sum")
    unknown_domains = sorted(set(mx.domain_weights) - {e.domain for e in r.envs})
    if unknown_domains:
        fail("mixer.domain_weights", f"domains {unknown_domains} have no env in rollout.envs")
    if not 0 < mx.length_ema <= 1 or not 0 < mx.norm_ema <= 1 or not 0 <= mx.curriculum_weight <= 1:
        fail("mixer.length_ema", "length_ema and norm_ema must be in (0, 1], curriculum_weight in [0, 1]")
    bad = sorted(set(mx.seq_level_domains) - {e.domain for e in r.envs})
    if bad:
        fail("mixer.seq_level_domains", f"domains {bad} have no env in rollout.envs")
    if mx.seq_level_domains and a.name not in ("grpo", "dr_grpo", "rloo", "reinforce_pp"):
        fail("mixer.seq_level_domains", f"needs outcome advantages; {a.name!r} computes its own")
    if mx.curriculum_window < 0:
        fail("mixer.curriculum_window", "must be >= 0")
    from rl.data.mixer import MIXER_MODES, AdaptiveConfig

    if mx.mode not in MIXER_MODES:
        fail("mixer.mode", f"choose one of {', '.join(MIXER_MODES)}, got {mx.mode!r}")
    if mx.adaptive and mx.mode != "adaptive":
        fail("mixer.adaptive", "is set but mixer.mode is not adaptive")
    try:
        AdaptiveConfig.from_dict(dict(mx.adaptive)).bounds(sorted({e.domain for e in r.envs}))
    except ValueError as e:  # its message starts with the offending key (mixer.adaptive.<key>)
        key, _, msg = str(e).partition(": ")
        fail(key if key.startswith("mixer.adaptive") else "mixer.adaptive", msg if key.startswith("mixer.") else str(e))
    if recipe.data.train_weights and (len(recipe.data.train_weights) != len(recipe.data.train_files)
                                      or min(recipe.data.train_weights) < 0):
        fail("data.train_weights", f"need one non-negative weight per train file ({len(recipe.data.train_files)})")
    if recipe.wandb.mode not in WANDB_MODES:
        fail("wandb.mode", f"unknown mode {recipe.wandb.mode!r}; choose online, offline or disabled")
    check_cluster(recipe)

    mp = recipe.model.path
    if mp.startswith("embedded:"):
        if mp not in EMBEDDED_MODELS:
            fail("model.path", f"unknown embedded model {mp!r}; choose one of {', '.join(EMBEDDED_MODELS)}")
    else:
        folder = resolve_path(recipe, mp)
        if not folder.is_dir():
            fail("model.path", f"model folder not found: {folder}")
        if not (folder / "config.json").is_file():
            fail("model.path", f"{folder} is not a Hugging Face model folder (no config.json)")

    if not recipe.data.train_files:
        fail("data.train_files", "at least one task file is needed")
    for key, files in (("data.train_files", recipe.data.train_files), ("data.eval_files", recipe.data.eval_files)):
        for i, f in enumerate(files):
            if not resolve_path(recipe, f).is_file():
                fail(f"{key}.{i}", f"task file not found: {resolve_path(recipe, f)}")

    if not recipe.rewards:
        fail("rewards", "at least one reward class is needed")
    domains = [e.domain for e in r.envs]
    if len(set(domains)) != len(domains):
        fail("rollout.envs", f"one env per domain, got domains {domains}")
    if check_imports:
        from envs.base import resolve

        for i, e in enumerate(r.envs):
            _check_class(fail, f"rollout.envs.{i}.cls", e.cls, e.kwargs, resolve)
        for i, spec in enumerate(recipe.rewards):
            obj = _check_class(fail, f"rewards.{i}.cls", spec.cls, spec.kwargs, resolve)
            if isinstance(obj, type) and not any("__call__" in vars(k) for k in obj.__mro__):
                fail(f"rewards.{i}.cls", f"{spec.cls} has no __call__(trajectory) method")
            if not spec.domains and not getattr(obj, "domains", None):
                fail(f"rewards.{i}.domains", f"{spec.cls} has no `domains` attribute: list the domains it scores")
    _check_output_dir(recipe, fail)


def check_cluster(recipe: Recipe, device: str | None = None) -> None:
    """Check the ``cluster`` section against the actor counts; raise ``RecipeError`` naming the key.

    ``device`` is the resolved device (``cpu`` | ``gpu``) at start-up; ``None`` checks what
    can be checked before knowing it (``cluster.device: auto`` is resolved against the Ray
    cluster when the run starts, and this runs again then).
    """
    src = recipe.source or "recipe"
    text = Path(recipe.source).read_text() if recipe.source and Path(recipe.source).is_file() else ""

    def fail(key: str, msg: str) -> None:
        raise RecipeError(f"{_where(src, text, key)}: {key}: {msg}")

    c, r, a = recipe.cluster, recipe.rollout, recipe.algo
    if c.device not in DEVICES:
        fail("cluster.device", f"unknown device {c.device!r}; choose one of {', '.join(DEVICES)}")
    if c.placement not in PLACEMENTS:
        fail("cluster.placement", f"unknown placement {c.placement!r}; choose one of {', '.join(PLACEMENTS)}")
    if c.engine_tp < 1:
        fail("cluster.engine_tp", f"must be >= 1, got {c.engine_tp}")
    for key, val in (("cluster.engine_cpus", c.engine_cpus), ("cluster.learner_cpus", c.learner_cpus),
                     ("cluster.reward_cpus", c.reward_cpus), ("cluster.placement_timeout_s", c.placement_timeout_s)):
        if not val > 0:
            fail(key, f"must be > 0, got {val}")
    for key, val in (("cluster.engine_gpus", c.engine_gpus), ("cluster.learner_gpus", c.learner_gpus)):
        if val < 0 or (val > 1 and val != int(val)):
            fail(key, f"must be a fraction in [0, 1] or a whole number of GPUs (Ray's rule), got {val}")
    for key, res in (("cluster.engine_resources", c.engine_resources), ("cluster.learner_resources", c.learner_resources),
                     ("cluster.reward_resources", c.reward_resources)):
        for name, amount in res.items():
            if name in RESERVED_RESOURCES:
                fail(f"{key}.{name}", f"{name!r} is set by cluster.*_cpus / cluster.*_gpus, not as a custom resource")
            if not amount > 0:
                fail(f"{key}.{name}", f"must be > 0, got {amount}")
    dev = device or (c.device if c.device != "auto" else None)
    if dev == "gpu":
        for key, val in (("cluster.engine_gpus", c.engine_gpus), ("cluster.learner_gpus", c.learner_gpus)):
            if not val > 0:
                fail(key, "must be > 0 on GPU (CUDA vLLM and the GPU learner each need a share of a GPU)")
    if c.placement == "colocated":
        if dev == "cpu":
            fail("cluster.placement", f"colocated shares GPUs between engines and learners; the run is on CPU "
                                      f"(cluster.device: {c.device}{', no GPU in the Ray cluster' if c.device == 'auto' else ''}): "
                                      "use placement split")
        if r.async_steps:
            fail("rollout.async_steps", "async rollouts overlap generation with the learner step; colocated engines "
                                        "sleep during that step: use cluster.placement split, or async_steps 0")
        if c.engine_tp != 1:
            fail("cluster.engine_tp", "colocated placement puts one engine and one learner worker on each GPU: "
                                      f"engine_tp must be 1, got {c.engine_tp}")
        if r.num_engines != a.learner_workers:
            fail("cluster.placement", f"colocated placement pairs engine i with learner worker i on one GPU: "
                                      f"rollout.num_engines ({r.num_engines}) must equal algo.learner_workers "
                                      f"({a.learner_workers})")
        if not (c.engine_gpus > 0 and c.learner_gpus > 0 and c.engine_gpus + c.learner_gpus <= 1):
            fail("cluster.engine_gpus", f"colocated: an engine and a learner worker share one GPU, so "
                                        f"cluster.engine_gpus + cluster.learner_gpus must be <= 1 and each > 0 "
                                        f"(e.g. 0.5 and 0.5), got {c.engine_gpus} + {c.learner_gpus}")
    if c.learner_gpus > 1:
        fail("cluster.learner_gpus", f"a learner worker uses one GPU (no model parallelism); for more GPUs raise "
                                     f"algo.learner_workers (data parallel), got {c.learner_gpus}")
    if c.engine_gpus > 1 and c.engine_tp == 1 and dev != "cpu":
        fail("cluster.engine_tp", f"an engine with cluster.engine_gpus={c.engine_gpus:g} would use one of them: set "
                                  f"cluster.engine_tp to {c.engine_gpus:g} (tensor parallel) or engine_gpus to 1")
    if c.engine_tp > 1:
        if dev == "cpu":
            fail("cluster.engine_tp", f"tensor parallelism ({c.engine_tp}) needs GPUs; the run is on CPU "
                                      f"(cluster.device: {c.device}{', no GPU in the Ray cluster' if c.device == 'auto' else ''}), "
                                      "where each engine is one vLLM-cpu process: use 1")
        if c.engine_gpus != c.engine_tp:
            fail("cluster.engine_gpus", f"an engine with cluster.engine_tp={c.engine_tp} needs one GPU per "
                                        f"tensor-parallel rank: set cluster.engine_gpus to {c.engine_tp}, got {c.engine_gpus}")


def _check_class(fail, key: str, dotted: str, kwargs: dict, resolve) -> Any:
    """Import ``dotted`` and check ``kwargs`` bind to its constructor; returns the class."""
    import inspect

    try:
        obj = resolve(dotted)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's to see
        fail(key, f"cannot import {dotted!r}: {e}")
    try:
        inspect.signature(obj).bind(**kwargs)
    except TypeError as e:
        fail(key.rsplit(".", 1)[0] + ".kwargs", f"do not match {dotted}'s constructor: {e}")
    except ValueError:
        pass  # no signature available (builtins); checked when constructed
    return obj


def _check_output_dir(recipe: Recipe, fail) -> None:
    out = resolve_output_dir(recipe)
    probe = out
    while not probe.exists():
        probe = probe.parent
    try:
        if not probe.is_dir():
            raise NotADirectoryError(str(probe))
        # A real write, not os.access: root passes access checks on read-only or virtual file systems.
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError:
        fail("run.output_dir", f"not writable: {out} ({probe} is not a writable folder)")
    need = checkpoint_bytes_estimate(recipe) * (max(recipe.run.keep_checkpoints, 1) + 1) + 64 * 2**20
    free = shutil.disk_usage(probe).free
    if free < need:
        fail("run.output_dir", f"only {free / 2**20:.0f} MiB free under {probe}; checkpoints (model + optimizer, "
                              f"run.keep_checkpoints={recipe.run.keep_checkpoints} kept, one being written) and logs "
                              f"need about {need / 2**20:.0f} MiB")
    if (out / "metrics.jsonl").exists() and not recipe.run.overwrite and recipe.run.resume != "auto":
        fail("run.output_dir", f"{out} already holds a run; set run.resume=auto to continue it, run.overwrite=true "
                              "to replace it, or choose another run.output_dir")


# Weights file bytes per parameter -> checkpoint bytes per parameter (fp32 master weights + AdamW's
# two fp32 moments = 12 bytes/param) is at most 6x the file (bf16 files: 2 bytes/param).
_CKPT_PER_FILE_BYTE = 6
_EMBEDDED_WEIGHT_BYTES = {"embedded:smollm2-135m-instruct": 270 * 2**20, "embedded:tiny": 4 * 2**20}


def checkpoint_bytes_estimate(recipe: Recipe) -> int:
    """An upper estimate of one checkpoint's size, from the model's weight files (0 if unknown)."""
    mp = recipe.model.path
    if mp in _EMBEDDED_WEIGHT_BYTES:
        return _CKPT_PER_FILE_BYTE * _EMBEDDED_WEIGHT_BYTES[mp]
    folder = resolve_path(recipe, mp)
    size = sum(f.stat().st_size for pat in ("*.safetensors", "*.bin") for f in folder.glob(pat)) if folder.is_dir() else 0
    return _CKPT_PER_FILE_BYTE * size


def resolve_output_dir(recipe: Recipe) -> Path:
    """The output dir: relative paths are relative to the current directory (where the user runs jointrl)."""
    return Path(os.path.expanduser(recipe.run.output_dir)).resolve()


def recipe_to_dict(recipe: Recipe) -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.structured(recipe), resolve=False)  # type: ignore[return-value]
