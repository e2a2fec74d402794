"""The recipe's schema: its sections as typed, frozen dataclasses, and ``Recipe``, the whole of them.

Sections are at most two levels deep (``algo.optim.lr``). Every field is declared with its
type (``Literal`` for choices), its bounds and a one-line doc (``rl.config.fields.knob``) and
is checked when its section is built; rules between the fields of one section sit in that
section's ``check()``. The ``algo`` section is a tagged union on ``algo.name``
(``rl/config/algo.py``); ``mixer.adaptive`` lives in ``rl/config/adaptive.py``.
``docs/recipe-reference.md`` is generated from these declarations (``rl/config/docgen.py``).

What this module does not do: read files (``rl/config/loading.py``), check rules that span
sections (``rl/config/rules.py``) or the world (``rl/config/validate.py``).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Literal

from rl.config.adaptive import AdaptiveConfig, MixerMode
from rl.config.algo import AlgoConfig
from rl.config.fields import FieldError, Section, knob

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


EMBEDDED_MODELS = ("embedded:smollm2-135m-instruct", "embedded:tiny", "embedded:tiny-moe")
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
        "local HF folder, Hub id (org/name), or embedded:smollm2-135m-instruct | embedded:tiny | embedded:tiny-moe",
        check=_model_path,
    )
    revision: str = knob(
        "", 'Hub branch, tag or commit of a Hub id ("" = main); HF_HOME, HF_HUB_OFFLINE, HF_TOKEN apply'
    )
    engine_dtype: Literal["float32", "bfloat16", "float16", "auto"] = knob(
        "bfloat16",
        "vLLM weights; auto: bfloat16 on GPU, on CPU with learner.precision auto the faster of bf16/fp32 by the "
        "learner's start-up timing (else bfloat16)",
    )
    learner_dtype: Literal["float32", "bfloat16"] = knob("float32", "learner master weights")
    autocast: bool = knob(
        True, "bf16 autocast for learner forward/backward (faster where the CPU or GPU computes bf16 natively)"
    )
    reference_dtype: Literal["float32", "bfloat16", "float16", "auto"] = knob(
        "auto",
        "frozen reference model for the KL term; auto: bfloat16 on GPU or when the learner runs bf16 autocast, "
        "else float32 (a CPU without native bf16 runs a bf16 forward slower than fp32)",
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
    train_files: list[str] = knob(
        doc="task files (.jsonl, .jsonl.gz, .parquet), or Harbor task sources (a directory of task dirs, one task "
        "dir, or a glob: the harbor domain); relative to the recipe",
        factory=list,
    )
    eval_files: list[str] = knob(
        doc="held-out task files (or Harbor task sources, like data.train_files), evaluated greedily", factory=list
    )
    harbor_skip_bad: bool = knob(
        False,
        "leave out (and count) the Harbor tasks whose directory does not load or whose image does not build, "
        "instead of refusing the run before its actors start",
    )
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
    min_groups_per_domain: int = knob(
        0,
        "prompts every domain of positive weight gets each step before the rest is split by the "
        "weights (0 = none): a floor on each domain's groups per step",
        ge=0,
    )
    strata: int = knob(1, "length strata per dataset (by estimated trajectory length)", ge=1)
    strata_proportions: list[float] = knob(doc="prompts per stratum ([] = proportional to stratum sizes)", factory=list)
    length_ema: float = knob(0.5, "weight of a task's newest observed length in its estimate", gt=0, le=1)
    curriculum_window: int = knob(
        0, "tasks all solved or all failed over their last N visits are sampled less (0 = off)", ge=0
    )
    curriculum_weight: float = knob(1.0, "chance that such a task stays in a pass over its stratum", ge=0, le=1)
    spread_by: str = knob(
        "",
        "a task meta key (e.g. template): each draw takes the queued task whose value the dataset has drawn "
        "least, so every value is drawn once before any twice ('' = off)",
    )
    solved_threshold: float = knob(1.0, "a visit counts as solved when the mean reward of its group reaches this")
    seq_level_domains: list[str] = knob(
        doc="domains whose samples weigh per sequence, not per token (outcome-advantage "
        "estimators, no algo.kl.in_reward)",
        factory=list,
    )
    mode: MixerMode = knob(
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
    max_staleness: int = knob(
        0,
        "0 = synchronous; k >= 1 = a rollout stream: episodes generated ahead while the learner trains, no "
        "trained token more than k learner updates older than the policy trained (1 = one-step-off)",
        ge=0,
    )
    partial_rollouts: bool = knob(
        False,
        "at a weight update made while episodes generate, stop their unfinished turns, keep the tokens and "
        "continue them on the new weights with the remaining budget; needs async rollouts; off by default, as it "
        "pays only when turns are long next to an update (docs/partial-rollouts.md)",
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
        "adapters, served by vLLM's LoRA over the unchanged base; attention/MLP projections only; smaller "
        "syncs, slower generation: docs/cluster.md)",
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
    meta_init: bool = knob(
        True,
        "sharded learners build the policy and reference on the meta device and each rank reads only its shard's "
        "rows from the safetensors files | false: every rank loads the whole model, then keeps its shard",
    )
    cpu_offload: bool = knob(
        False,
        "FSDP2 CPU offload: sharded parameters, gradients and optimizer state kept in host memory, copied to the "
        "GPU around each layer's compute (needs sharding: workers 2+ or fsdp always; on CPU it runs, saving nothing)",
    )
    micro_batch_tokens: int = knob(4096, "forward/backward in micro-batches of at most this many tokens", ge=1)
    share_prompt: bool = knob(
        True, "run a group's shared prompt once, its members' responses packed after it in one sequence"
    )
    lora: LoraConfig = knob(doc="adapters instead of full fine-tuning", factory=LoraConfig)
    activation_checkpointing: bool = knob(False, "recompute each decoder layer's activations in the backward")
    routing_replay: Literal["none", "r2", "r3"] = knob(
        "none",
        "MoE routing replay (docs/moe.md) | r2: the update forces the experts the learner's own old-log-prob pass "
        "selected (an extra no-grad forward with one update per batch) | r3: the learner forces the experts the "
        "engine selected for every token of the episode (engines that report routing: the in-process HF engine)",
    )
    precision: Literal["manual", "auto"] = knob(
        "manual", "manual: model.autocast decides | auto: time bf16 autocast vs fp32 at start, use the faster (logged)"
    )
    huge_pages: bool = knob(
        True,
        "learner processes back large tensors with transparent huge pages (torch's THP_MEM_ALLOC_ENABLE): fewer "
        "page faults and less system time per CPU step",
    )
    allocator: Literal["auto", "jemalloc", "system"] = knob(
        "auto",
        "the learner processes' malloc: jemalloc (preloaded) reuses a step's freed pages where glibc mmaps and "
        "faults in every large tensor afresh | system: glibc | auto: jemalloc where libjemalloc.so.2 is "
        "installed and the learner runs bf16 autocast; glibc for an fp32 learner",
    )
    hold_memory: bool = knob(
        True,
        "learner processes keep the memory a step frees for the next step (glibc: no per-tensor mappings, no "
        "trim; resident memory stays at the step's peak, and a step ending above 1.25x the level it settled at "
        "trims: memory.HoldBudget) | false: hand it back after each step, which the next step faults in again",
    )
    weight_sync: Literal["auto", "file", "ipc", "collective"] = knob(
        "auto",
        "how merged weights reach the engines after a step: auto = collective where an engine sits on another "
        "node than learner rank 0 and the run is on CPU (gloo), file otherwise (on GPU until the NCCL path has "
        "run on one; resolved when the actors are placed, written to recipe.resolved.yaml) | "
        "file = one safetensors file in the learner node's "
        "/dev/shm (Ray's object store to other nodes) | ipc = CUDA IPC, engine i maps learner rank i's packed "
        "bf16 buffer on their shared GPU (cluster.placement colocated; each rank holds one bf16 copy) | "
        "collective = learner rank 0 broadcasts in buckets to every engine's worker through a process group of "
        "their own (gloo on CPU, NCCL on GPU; any node; vLLM engines with engine_tp 1)",
    )
    weight_bucket_mb: float = knob(
        256.0,
        "weight_sync collective: bytes per broadcast bucket, in MiB (extra memory: one bucket on the learner, one "
        "bucket plus the tensor being assembled on an engine; a larger tensor is split over buckets)",
        gt=0,
        le=65536,
    )
    delta_sync_full_every: int = knob(
        0,
        "engines on other nodes than the learner get only the bf16 entries changed since the last sync "
        "(checksummed; a drifted engine gets a full sync), a full sync every N syncs; 0 = always full (file sync)",
        ge=0,
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

    def __post_init__(self) -> None:
        super().__post_init__()
        loss = self.algo.loss
        if loss.agg == "seq-mean-token-sum-norm" and loss.norm_tokens == 0:
            # The one place algo.loss.norm_tokens: 0 is resolved: the generation budget of an episode.
            budget = self.rollout.max_new_tokens * self.rollout.max_turns
            algo = dataclasses.replace(self.algo, loss=dataclasses.replace(loss, norm_tokens=budget))
            object.__setattr__(self, "algo", algo)
