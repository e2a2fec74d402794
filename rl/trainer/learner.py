"""The learner: one ``step(batch)`` of policy-gradient training of an HF causal LM (GRPO family, REINFORCE++,
PPO with a critic). ``Learner`` is a plain class (the Ray actor wraps it; tests run it in-process).

A step, as ``step`` reads::

    plan      the batch's counts over every rank, its minibatches and their loss denominators (``rl.trainer.plan``)
    prepare   when needed (several updates per batch, a critic, ``algo.kl.in_reward``, a loss that needs the
              proximal log-probs: ``decoupled_ppo``, ``learner.routing_replay: r2``): no-grad old log-probs (on
              an MoE, with each token's experts), reference log-probs, critic values, then the estimator's
              learner-side advantages (``rl.trainer.prepare``)
    update    for each of ``algo.update.epochs`` epochs, for each of ``algo.update.minibatches`` shuffled
              minibatches: zero the gradients, forward (with ``routing_replay``: the prepare pass's experts, r2,
              or the engine's, r3, forced) + objective + backward per micro-batch (bounded by
              ``learner.micro_batch_tokens``, exact accumulation with the minibatch's denominators), one
              optimizer step per optimizer (``rl.trainer.optim.apply``: reduce, clip, step)

Without a prepare pass the ratio's old log-probs are the policy's own, detached; the engine's log-probs
(of the same tempered distribution, ``rollout.temperature``) are compared with them as
``rollout/logprob_diff`` and ``async/mismatch_kl`` and weight the loss only with an off-policy correction
(``algo.loss.tis_cap``, ``mis_low``, ``mis_high``; ``decoupled_ppo``, docs/algorithms.md).

The jobs live in their own modules: model building (``rl.trainer.models``: policy, LoRA, FSDP, reference,
critic), the step plan and micro-batches (``rl.trainer.plan``), the prepare pass (``rl.trainer.prepare``), the
forward pass (``rl.trainer.forward``: full and packed layouts, response positions only through ``lm_head``, at
the sampling temperature, an MoE's router logits when an auxiliary loss needs them), the objective
(``rl.algos.objective`` with the policy losses of ``rl.algos.policy_losses``: a pure function of typed inputs),
the optimizer and update (``rl.trainer.optim``, one path for policy and critic), the metrics
(``rl.trainer.metrics``: the sums, the update log and one ``StepMetrics`` record per step), weight export
(``rl.trainer.weights``: file, CUDA IPC, LoRA adapter) and checkpoints (``rl.trainer.checkpoint``).
Several learners shard with FSDP2 and keep their collectives in step (``rl.trainer.fsdp``,
``rl.trainer.collectives``); the memory a step frees is held for the next (``learner.hold_memory``,
``rl.trainer.memory``). This module does not generate text or score rewards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import shutil
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rl.algos.batch import Batch, Sample
from rl.algos.estimators import get_estimator
from rl.algos.objective import ObjectiveInputs, Terms, objective
from rl.algos.policy_losses import LossInputs, get_policy_loss
from rl.algos.router import router_spec
from rl.config.recipe import AlgoConfig, LearnerConfig, ModelConfig
from rl.trainer import checkpoint, fsdp, memory, models, moe, optim, plan, precision, prepare
from rl.trainer.checkpoint import policy_from_checkpoint  # noqa: F401 - rl.cli.export's import
from rl.trainer.forward import Forward, Outputs
from rl.trainer.metrics import Present, StepMetrics, Sums, UpdateLog
from rl.trainer.shm import make_shm_dir
from rl.trainer.weights import WeightExport
from rollout.routing import routers
from rollout.weights import BlobWeights, CollectiveJoin, CollectiveWeights, DeltaWeights, IpcWeights
from rl.trainer.logits import Entropy
from rl.trainer.collectives import all_reduce_sum, broadcast_params, free_port, init_process_group
from rl.algos.schedules import kl_controller


def _domains(batch: Batch) -> tuple[str, ...]:
    """The domains of a batch built without ``Batch.domains`` (in code; one rank): its samples', sorted."""
    return tuple(sorted({s.domain for s in batch.samples}))


@dataclass
class _Grid:
    """One micro-batch's policy tokens on its [B, T] response grid (flat tensors index into it)."""

    index: torch.Tensor  # [N] positions of the flat (sample, masked position) order in the grid
    B: int
    T: int
    mask: torch.Tensor  # [B, T] True at policy tokens
    ntok: float
    denom: tuple[float, float]  # the loss denominators (tokens, sequences) of the minibatch
    norm_tokens: int | None = None  # the constant of seq-mean-token-sum-norm

    def __call__(self, flat: torch.Tensor) -> torch.Tensor:
        grid = torch.zeros(self.B * self.T, dtype=flat.dtype, device=flat.device)
        return grid.index_put((self.index,), flat).view(self.B, self.T)


def _loss_aggregation(algo: AlgoConfig) -> tuple[str, int | None]:
    """``algo.loss.agg`` (``auto`` was resolved when the algo section was built: rl/config/algo.py) and
    ``norm_tokens`` (needed by seq-mean-token-sum-norm)."""
    agg, norm_tokens = algo.loss.agg, algo.loss.norm_tokens or None
    if agg == "seq-mean-token-sum-norm" and not norm_tokens:
        raise ValueError(
            "algo.loss.norm_tokens must be > 0 for seq-mean-token-sum-norm (load_recipe sets it to "
            "rollout.max_new_tokens x rollout.max_turns)"
        )
    return agg, norm_tokens


def _objective_parts(algo: AlgoConfig) -> tuple[Any, Terms]:
    """The policy loss object (``algo.loss.policy``: what it needs, engine log-probs or entropy) and the weights of
    the objective's other terms (``rl.algos.objective``; the KL coefficient is set per step by the controller)."""
    c = getattr(algo, "critic", None)  # only the algorithms with a critic have algo.critic (rl/config/algo.py)
    terms = Terms(
        kl_kind=algo.kl.kind,
        kl_in_reward=algo.kl.in_reward,
        entropy_coef=algo.loss.entropy_coef,
        vf_coef=c.vf_coef if c is not None else 0.0,
        value_clip=(c.value_clip or None) if c is not None else None,
        aux_coef=algo.loss.aux_coef,
    )
    return get_policy_loss(algo.loss), terms


class Learner:
    def __init__(
        self,
        model_path: str,
        model_cfg: ModelConfig,
        algo: AlgoConfig,
        *,
        seed: int = 0,
        threads: int = 0,
        shm_dir: str | None = None,
        total_steps: int = 0,
        rank: int = 0,
        world_size: int = 1,
        dist_port: int = 0,
        learner: LearnerConfig | None = None,
        temperature: float = 1.0,
    ) -> None:
        """``temperature``: the rollouts' sampling temperature (``rollout.temperature``); the policy's,
        the old and the reference log-probs are of ``softmax(logits / temperature)``, the distribution the
        engines sampled from (0, greedy, counts as 1: a greedy engine reports raw log-probs).
        ``total_steps``: learner steps of the run (the cosine schedule decays over
        ``total_steps x epochs x minibatches`` optimizer steps). ``rank``/``world_size``/
        ``dist_port``: data-parallel position and rendezvous (``rl.trainer.collectives``).
        ``learner``: micro-batching, prompt sharing, LoRA, activation checkpointing and precision
        (the recipe's ``learner`` section)."""
        from transformers import AutoTokenizer

        torch.set_num_threads(threads or os.cpu_count() or 1)
        torch.manual_seed(seed)
        random.seed(seed)
        self.algo, self.model_cfg = algo, model_cfg
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0 (rollout.temperature), got {temperature}")
        self.temperature = float(temperature) if temperature > 0 else 1.0
        self.lcfg = learner if learner is not None else LearnerConfig()
        self.est = get_estimator(algo)  # what the algorithm needs: critic, learner-side advantages
        self.agg, self.norm_tokens = _loss_aggregation(algo)
        self.loss_fn, self.terms = _objective_parts(algo)
        # the model's auxiliary loss (an MoE's router load balancing): asked of the trunk only when used
        self.aux = algo.loss.aux_coef > 0 or "aux_loss" in self.loss_fn.needs
        self.rank, self.world_size = rank, world_size
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        # FSDP2 with 2+ workers, or with learner.fsdp: always at one (its own process group of one, on a port of
        # its own; 2+ ranks must be given their shared rendezvous port, else init_process_group says so)
        self.sharded = world_size > 1 or self.lcfg.fsdp == "always"
        if self.sharded:
            port = dist_port or (free_port() if world_size == 1 else 0)
            init_process_group(rank, world_size, port, self.device)
        self._reduce = all_reduce_sum if world_size > 1 else None
        self.gen = torch.Generator().manual_seed(seed)  # minibatch shuffles
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.use_autocast, self.precision_note = self._pick_precision()
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        # Every forward of a sharded model is a collective: the ranks' calls are kept in step (rl.trainer.fsdp).
        self.lock = fsdp.Lockstep(self.pad_id)
        self.fwd = Forward(self.lcfg, self.lock, self.device, self.pad_id, self.temperature)  # rl.trainer.forward
        self._check_aux(model_path)
        self._build_models(model_path)
        # Loading (and sharding: each rank loads the whole model, then keeps its shard) frees what glibc keeps
        # resident otherwise; hand it back before the first step (rl.trainer.memory).
        memory.trim()
        self._build_optimizers(total_steps)
        self.kl_ctl = kl_controller(algo.kl.coef, algo.kl.target, algo.kl.horizon)
        if world_size > 1:  # replicated modules (value head, separate critic) start identical; shards are disjoint
            broadcast_params([p for p in self._trainable() if not fsdp.is_dtensor(p)])
            if self.critic is not None:
                broadcast_params(self.critic.parameters())
        self.shm_dir = self._weights_dir(shm_dir)
        self.weights = WeightExport(self.model, self.peft, rank, self.device, self.shm_dir)  # rl.trainer.weights
        self.steps_done = 0  # learner steps (batches) that updated the weights
        self.updates_done = 0  # optimizer steps
        # learner.hold_memory: the next step reuses the pages this one freed (rl.trainer.memory.hold) instead of
        # faulting them in afresh after a trim (fp32 step 76.7-87.0 s -> 56.8-60.2 s; under jemalloc a purge
        # after each step cost bf16 steps 26-29 s against 22-25 s: bench/RESULTS.md). Off, the learner holds
        # only its live tensors between steps, while the engines generate.
        hold = self.lcfg.hold_memory
        self.trim_after_step = not hold
        # glibc can fragment what it holds into unbounded growth (memory.HoldBudget): trim past 1.25x the level
        self.hold_budget = memory.HoldBudget() if hold and memory.hold() else None
        if self.rank == 0 and self.device.type == "cpu":
            print(f"jointrl learner: allocator {memory.allocator()}", flush=True)

    def reference_dtype(self) -> str:
        """``model.reference_dtype`` at this learner's device and precision (``precision.reference_dtype``)."""
        return precision.reference_dtype(
            self.model_cfg.reference_dtype, cuda=self.device.type == "cuda", autocast=self.use_autocast
        )

    def _pick_precision(self) -> tuple[bool, str]:
        """(autocast on?, note): ``model.autocast``, or with ``learner.precision: auto`` what was faster
        when timed on this host (``rl.trainer.precision``)."""
        if self.lcfg.precision != "auto":
            return self.model_cfg.autocast, ""
        choice = precision.pick(self.device)
        note = choice.describe()
        if self.rank == 0:
            print(f"jointrl learner: {note}", flush=True)
        return choice.autocast, note

    def _weights_dir(self, shm_dir: str | None) -> Path:
        """Where exported weights go: ``shm_dir`` (owned and removed by the caller), else a temporary folder
        in /dev/shm removed with the learner."""
        if shm_dir:
            d = Path(shm_dir)
            d.mkdir(parents=True, exist_ok=True)
            return d
        d = Path(make_shm_dir("jointrl-learner-"))
        weakref.finalize(self, shutil.rmtree, str(d), True)
        return d

    def _build_models(self, model_path: str) -> None:
        """The policy, reference and critic (``rl.trainer.models.build``), as this learner's attributes; then the
        policy's MoE routing state (``_init_routing``)."""
        m = models.build(
            model_path,
            self.model_cfg,
            self.lcfg,
            self.device,
            sharded=self.sharded,
            bf16_compute=self.use_autocast and self.device.type == "cuda",  # GPU: FSDP's policy, not autocast
            autocast=self.use_autocast,
            # a reference for a KL term, or for a policy loss that reads the reference's log-probs
            reference_dtype=self.reference_dtype() if self._needs_reference() else None,
            critic=self.algo.critic.model if self.est.needs_critic else None,
        )
        self.model, self.peft, self.ref, self.value_head, self.critic = m.model, m.peft, m.ref, m.value_head, m.critic
        self.has_ref = m.has_ref  # no KL term: no reference model, and no reference forward
        self._init_routing()

    def _check_aux(self, model_path: str) -> None:
        """An auxiliary loss needs a model with routers (``rl.algos.router.router_spec``): a dense one is refused
        from its config, before it is loaded, naming the key."""
        from transformers import AutoConfig

        if not self.aux or router_spec(AutoConfig.from_pretrained(model_path)) is not None:
            return
        loss = self.algo.loss
        if loss.aux_coef > 0:
            key, fix = "algo.loss.aux_coef", "set algo.loss.aux_coef: 0"
        else:
            key, fix = "algo.loss.policy", f"{loss.policy} reads aux_loss: choose a loss that does not"
        raise ValueError(
            f"{key}: the auxiliary loss is an MoE router's load-balancing loss, but {model_path} has no routers "
            f"(no num_experts / num_experts_per_tok in its config); {fix} for a dense model"
        )

    def _needs_reference(self) -> bool:
        return self.est.needs_reference(self.algo) or "ref_logprobs" in self.loss_fn.needs

    def _build_optimizers(self, total_steps: int) -> None:
        """AdamW over the trainable parameters (the adapters only, with LoRA) and the value head; the separate
        critic's own AdamW; their LR schedules (``rl.trainer.optim``: one construction for both)."""
        algo = self.algo
        critic_lr = (algo.critic.lr or algo.optim.lr) if self.est.needs_critic else algo.optim.lr
        groups = [{"params": [p for p in self.model.parameters() if p.requires_grad], "lr": algo.optim.lr}]
        if self.value_head is not None:
            groups.append({"params": list(self.value_head.parameters()), "lr": critic_lr})
        updates = total_steps * algo.update.epochs * algo.update.minibatches
        self.opt, self.sched = optim.adamw(groups, algo.optim.lr, algo.optim, updates)
        self.critic_opt = self.critic_sched = None
        if self.critic is not None:
            self.critic_opt, self.critic_sched = optim.adamw(
                list(self.critic.parameters()), critic_lr, algo.optim, updates
            )

    def _trainable(self) -> list[torch.nn.Parameter]:
        """Parameters of the main optimizer: the policy's trainable ones (adapters with LoRA), and the value head."""
        ps = [p for p in self.model.parameters() if p.requires_grad]
        if self.value_head is not None:
            ps += list(self.value_head.parameters())
        return ps

    @contextlib.contextmanager
    def _reference(self):
        """The reference model for a forward: the frozen copy, or with LoRA the policy with its adapters disabled."""
        if self.peft is None:
            yield self.ref
        else:
            with self.peft.disable_adapter():
                yield self.model

    @property
    def needs_prepare(self) -> bool:
        """Whether a no-grad pass runs before the first update (see the module docstring); under
        ``learner.routing_replay: r2`` always (it records the routing the updates force)."""
        a = self.algo
        several = a.update.epochs * a.update.minibatches > 1
        r2 = self.replay == "r2"
        return several or r2 or self.est.learner_advantages(a) or "proximal_logprobs" in self.loss_fn.needs

    # ---- MoE routing (rl.trainer.moe, rollout.routing) --------------------------------------------------------
    def _init_routing(self) -> None:
        """``learner.routing_replay`` against the model (replay needs an MoE; activation checkpointing would
        recompute the layers outside the replay, with the router's own experts), and the step's routing sums."""
        self.replay = self.lcfg.routing_replay
        rs = routers(self.model)
        self.moe = bool(rs)
        if self.replay != "none" and not self.moe:
            raise ValueError(
                f"learner.routing_replay: {self.replay} needs a mixture-of-experts model; {self.model_cfg.path} has "
                "no MoE router (set it to none)"
            )
        if self.replay != "none" and self.lcfg.activation_checkpointing:
            raise ValueError(
                "learner.routing_replay with learner.activation_checkpointing: the backward's recomputation would "
                "not replay the routing; turn one of them off"
            )
        self.routing_stats = moe.RoutingStats(len(rs), rs[0].num_experts) if rs else None

    def forced_routing(self, mb: list[Sample], prep: prepare.Prepared | None) -> list[torch.Tensor] | None:
        """The experts a forward on ``mb`` forces (per sample): r3 the engine's (``Sample.routing``), r2 the prepare
        pass's (``prep``; None in that pass itself, which records them), else None. Under r3 ``build_batch``
        (``routing_required``) has dropped the samples without routing; one reaching here is a caller's bug."""
        if self.replay == "r3":
            missing = [s.domain for s in mb if s.routing is None]
            if missing:
                raise ValueError(
                    f"learner.routing_replay: r3, but {len(missing)} samples (domain {missing[0]}) carry no engine "
                    "routing (build_batch(..., routing_required=True) drops such samples before the estimator)"
                )
            return [s.routing for s in mb]
        if self.replay == "r2" and prep is not None:
            return [prep.routing[id(s)] for s in mb]
        return None

    def _routing_metrics(self, domains: tuple[str, ...]) -> dict[str, float]:
        """The step's ``moe/...`` metrics (``rl.trainer.moe.RoutingStats``), summed over ranks; {} for a dense model."""
        st = self.routing_stats
        if st is None:
            return {}
        return st.metrics(self._global(st.values(domains)), domains)

    # ---- forward (rl.trainer.forward) and micro-batches (rl.trainer.plan) ----------------------------------
    def _forward(
        self,
        model: Any,
        samples: list[Sample],
        entropy: Entropy = "none",
        aux: bool = False,
        routing: list[torch.Tensor] | None = None,
        record: bool = False,
    ) -> Outputs:
        """``Forward.__call__`` at the sampling temperature (a method of its own: bench/learner_memory.py wraps it)."""
        return self.fwd(model, samples, entropy, aux=aux, routing=routing, record=record)

    def _autocast(self):
        enabled = self.use_autocast and self.device.type in ("cpu", "cuda")
        if self.device.type == "cuda" and fsdp.is_sharded(self.model):
            enabled = False  # FSDP's MixedPrecisionPolicy computes in bf16 (rl.trainer.fsdp.shard)
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=enabled)

    def micro_batches(self, samples: list[Sample]) -> list[list[Sample]]:
        """``samples`` in micro-batches of at most ``learner.micro_batch_tokens`` computed tokens, as the forward's
        layout computes them (``rl.trainer.plan.micro_batches``)."""
        return plan.micro_batches(samples, self.lcfg.micro_batch_tokens, self.fwd.unit_cost, self.lcfg.share_prompt)

    # ---- training -------------------------------------------------------------------------
    def step(self, batch: Batch) -> dict[str, float]:
        """One learner step over ``batch``: ``epochs x minibatches`` optimizer steps; returns metrics.

        Metrics: ``loss/policy`` (and ``loss/kl``, ``loss/value``, ``loss/entropy``, ``loss/aux``): each
        minibatch's aggregated loss term, averaged over the step's optimizer steps
        (``loss/kl`` is the aggregated KL before the coefficient, also when the KL is in the
        reward; ``loss/aux`` the auxiliary term before ``algo.loss.aux_coef``); ``kl/mean``, ``entropy/mean``,
        ``value/*``: token means over every update pass; ``grad/norm``: mean pre-clip global norm; ``lr``: learning
        rate of the step's last optimizer step; ``kl/coef``: the coefficient used in this step;
        ``learner/tokens``: policy tokens computed per epoch; ``learner/updates``;
        ``learner/skipped_update``: fraction of optimizer steps skipped for a non-finite
        gradient; ``rollout/logprob_diff``: mean |learner - engine| log-prob before the update;
        ``async/mismatch_kl`` and ``async/mismatch_kl/<domain>``: the token mean of k3 KL(engine || learner)
        over the computed samples' policy tokens before the update (``rl.trainer.prepare.logprob_diff``);
        the policy loss's own stats (its ``stat_names``; ``ppo_clip``: ``clip/fraction``, with
        ``algo.loss.dual_clip`` ``clip/dual_fraction``, with ``algo.loss.tis_cap`` ``is/weight_mean`` and
        ``is/truncated_fraction``, with ``mis_low``/``mis_high`` ``is/masked_fraction``);
        MoE models: ``moe/layer_<i>/entropy``, ``moe/layer_<i>/max_mean`` and their summary over layers from the
        learner's routing of the batch in its old-log-prob pass, and ``moe/routing_disagreement`` (and per domain)
        where samples carry the engine's routing (``rl.trainer.moe.RoutingStats``);
        ``memory/learner_rss_gb``: this
        process's resident memory after the step (``learner.hold_memory``: flat over a run once it holds a
        step's peak); ``memory/trimmed``: 1 where that step went over the hold budget and was trimmed.
        Over data-parallel ranks every sum is all-reduced: each rank returns the whole batch's.
        An empty batch (nothing to compute on any rank) leaves the weights alone.
        """
        t0 = time.perf_counter()
        a, coef = self.algo, self.kl_ctl.value
        steps = plan.Plan.of(batch, a.update.epochs, a.update.minibatches, self._global)  # counts over the ranks
        sums, log, updates = Sums(), UpdateLog(lr=self.opt.param_groups[0]["lr"]), 0
        if self.routing_stats is not None:  # this step's routing sums (rl.trainer.moe.RoutingStats)
            self.routing_stats = moe.RoutingStats(self.routing_stats.layers, self.routing_stats.experts)
        if steps.computed:
            # no-grad old/reference log-probs, values, learner-side advantages (rl.trainer.prepare)
            prep = prepare.run(self, batch, sums, coef) if self.needs_prepare else None
            for epoch in range(steps.epochs):
                for mb in steps.epoch(self.gen):  # shuffled minibatches (skipped samples count, never run)
                    self._zero_grad()
                    denom, micros = steps.denominators(mb), self.micro_batches(steps.computed_of(mb))
                    n_micro = self.lock.count(len(micros))  # sharded: every rank runs as many (dummies pad)
                    for micro in micros:  # forward, objective, backward: gradients accumulate exactly
                        self._accumulate(micro, prep, denom, sums, coef, first_epoch=epoch == 0)
                    self._pad_micros(n_micro, len(micros), bool(mb), prep)
                    updates += self._update(log)  # reduce, clip, step: policy (and value head), critic
            self.steps_done += int(updates > 0)
        domains = batch.domains or _domains(batch)
        m = self._metrics(steps, sums, log, updates, coef, domains)
        if self.has_ref and steps.computed:
            self.kl_ctl.update(m.kl_mean, batch.num_seqs)
        self._after_step(m)
        m.compute_s = time.perf_counter() - t0
        # weights.metrics: the sync before this step's episodes (its changed share)
        return m.to_dict() | self._routing_metrics(domains) | self.weights.metrics()

    def _metrics(
        self, steps: plan.Plan, sums: Sums, log: UpdateLog, updates: int, coef: float, domains: tuple[str, ...]
    ) -> StepMetrics:
        """The step's metrics from this rank's sums, all-reduced over the ranks (``rl.trainer.metrics``);
        ``domains``: the whole batch's, in the same order on every rank."""
        names = self.loss_fn.stat_names
        tot = Sums.of(self._global(sums.values(names, domains)), names, domains)
        a = self.algo
        present = Present(
            entropy=a.loss.entropy_coef > 0,
            kl=self.has_ref,
            value=self.critic_module() is not None,
            critic=self.critic is not None,
            aux=a.loss.aux_coef > 0,
        )
        m = StepMetrics.of(tot, log, steps.updates, updates, bool(steps.computed), present)
        if self.has_ref:
            m.kl_coef = coef
        return m

    def _after_step(self, m: StepMetrics) -> None:
        """The memory hold policy after a step (``learner.hold_memory``, ``rl.trainer.memory``), into ``m``."""
        if self.trim_after_step:
            memory.trim()
        rss = memory.rss_bytes()
        if self.hold_budget is not None:
            trimmed = self.hold_budget.after_step(rss)
            m.memory_trimmed = float(trimmed)
            if trimmed:
                rss = memory.rss_bytes()
        m.memory_rss_gb = rss / 1e9

    def prepare(self, batch: Batch) -> dict[str, list[list[float]]]:
        """``step``'s prepare pass on ``batch``, without any update (for inspection and tests).

        Per sample of ``batch.samples``, lists over its masked tokens: ``old`` (policy
        log-probs), and where they apply ``ref`` (reference log-probs), ``values`` (critic),
        ``adv`` and ``returns`` (learner-side advantages and value targets).
        """
        return prepare.run(self, batch, Sums(), self.kl_ctl.value).lists(batch.samples)

    def _global(self, values: list[float]) -> list[float]:
        """``values`` summed over the data-parallel ranks (as is with one learner)."""
        if self._reduce is None:
            return [float(v) for v in values]
        return self._reduce(torch.tensor(values, dtype=torch.float64, device=self.device)).tolist()

    def _accumulate(
        self,
        mb: list[Sample],
        prep: prepare.Prepared | None,
        denom: tuple[float, float],
        sums: Sums,
        coef: float,
        first_epoch: bool,
    ) -> None:
        """Forward + backward of one micro-batch; gradients accumulate (the loss is its part of the minibatch's)."""
        a = self.algo
        with self._autocast():
            ent_mode: Entropy = "grad" if a.loss.entropy_coef > 0 or "entropy" in self.loss_fn.needs else "value"
            record = self.moe and prep is None and first_epoch  # the routing stats, where no prepare pass ran
            out = self._forward(self.model, mb, ent_mode, self.aux, self.forced_routing(mb, prep), record)
        if out.routing is not None:
            self.routing_stats.add(mb, out.routing)
        logp_flat, ent_flat = out.logp, out.entropy
        values_flat = self.fwd.values(self.value_head, out.hidden) if self.value_head is not None else None
        out.hidden = None
        B, T = len(mb), max(len(s.loss_mask) for s in mb)
        g = _Grid(out.index, B, T, torch.zeros(0), float(logp_flat.numel()), denom, self.norm_tokens)
        g.mask = g(torch.ones_like(logp_flat)).bool()
        x = self._objective_inputs(mb, prep, g, g(logp_flat), ent_flat, values_flat, coef, out.aux_loss)
        total, st = objective(x, self.loss_fn)
        (total if out.pad is None else total + out.pad).backward()
        if prep is None and first_epoch:
            prepare.logprob_diff(logp_flat, mb, sums)
        sums.add(st, g.ntok, float(ent_flat.detach().sum()), first_epoch)

    def _objective_inputs(
        self,
        mb: list[Sample],
        prep: prepare.Prepared | None,
        g: _Grid,
        logp: torch.Tensor,
        ent_flat: torch.Tensor,
        values_flat: torch.Tensor | None,
        coef: float,
        aux_loss: torch.Tensor | None,
    ) -> ObjectiveInputs:
        """The objective's typed inputs (``rl.algos.objective``) on the micro-batch's grid: only what its terms
        and the policy loss need (the engine's log-probs, the reference's, the critic's values, the aux loss)."""
        a, need = self.algo, self.loss_fn.needs
        old = g(prep.cat("old", mb)) if prep is not None else logp.detach()
        if prep is not None and self.est.learner_advantages(a):
            adv = g(prep.cat("adv", mb))
        else:
            adv = torch.tensor([s.advantage for s in mb], dtype=torch.float32, device=self.device)
            adv = adv[:, None].expand_as(logp)
        nt, ns = g.denom
        ref = g(self._reference_logprobs(mb, prep)) if self.has_ref else None  # the reference, then the critic
        policy = LossInputs(
            logp=logp,
            old_logp=old,
            advantages=adv,
            mask=g.mask,
            agg=self.agg,
            num_tokens=nt,
            num_seqs=ns,
            norm_tokens=self.norm_tokens,
            engine_logp=g(prepare.engine_logprobs(mb, self.device)) if "engine_logprobs" in need else None,
            entropy=g(ent_flat) if "entropy" in need else None,
            ref_logp=ref if "ref_logprobs" in need else None,
            aux_loss=aux_loss if "aux_loss" in need else None,
        )
        values = self._critic_values(mb, values_flat)
        return ObjectiveInputs(
            policy=policy,
            terms=dataclasses.replace(self.terms, kl_coef=coef),
            ref_logp=ref,
            entropy=g(ent_flat) if a.loss.entropy_coef > 0 else None,
            values=g(values) if values is not None else None,
            old_values=g(prep.cat("values", mb)) if values is not None and prep is not None else None,
            returns=g(prep.cat("returns", mb)) if values is not None and prep is not None else None,
            aux_loss=aux_loss if a.loss.aux_coef > 0 else None,
        )

    def _reference_logprobs(self, mb: list[Sample], prep: prepare.Prepared | None) -> torch.Tensor:
        """The reference's log-probs of the micro-batch's policy tokens (flat): cached by the prepare pass, or now."""
        if prep is not None:
            return prep.cat("ref", mb)
        with torch.no_grad(), self._autocast(), self._reference() as ref:
            return self.fwd.logprobs(ref, mb)[0]

    def _critic_values(self, mb: list[Sample], values_flat: torch.Tensor | None) -> torch.Tensor | None:
        """The critic's values (flat, with grad): the value head's (from the policy's hidden states), the separate
        critic's (its own forward now), or None without a critic."""
        if self.critic is None:
            return values_flat
        with self._autocast():
            ch, _, _ = self.fwd.hidden(self.critic.trunk, mb)
        return self.fwd.values(self.critic.head, ch)

    def _pad_micros(self, n_micro: int, mine: int, has_members: bool, prep: prepare.Prepared | None) -> None:
        """A sharded rank with fewer micro-batches (``mine``) than the most of any rank (``n_micro``) runs the
        missing ones as dummies (the same module calls as ``_accumulate``); a minibatch whose every sample was
        skipped (zero advantage) gets its exact gradient, 0, as if computed."""
        for _ in range(n_micro - mine):
            with self._autocast():
                pad = self._forward(self.model, []).pad
                if self.has_ref and prep is None:
                    with torch.no_grad(), self._reference() as ref:
                        self._forward(ref, [])
            if pad is not None:
                pad.backward()
        if not n_micro and self.lock.count(int(has_members)):
            for p in self._trainable():
                p.grad = torch.zeros_like(p)

    def _optimizers(self) -> list[tuple[list[torch.nn.Parameter], Any, Any]]:
        """(parameters, optimizer, schedule) of each optimizer: the policy's (with the value head), then a separate
        critic's. Read at each use: a test may swap in its own optimizer."""
        out = [(self._trainable(), self.opt, self.sched)]
        if self.critic is not None:
            out.append((list(self.critic.parameters()), self.critic_opt, self.critic_sched))
        return out

    def _zero_grad(self) -> None:
        for _, opt, _ in self._optimizers():
            opt.zero_grad(set_to_none=True)

    def _update(self, log: UpdateLog) -> int:
        """Apply the accumulated gradients, one path for every optimizer (``rl.trainer.optim.apply``: reduce, clip
        on its own norm, step): the policy's (and value head's), then a separate critic's; 1 if the policy stepped."""
        max_norm = self.algo.optim.max_grad_norm
        log.lr = self.opt.param_groups[0]["lr"]
        (norm, stepped), *critic = [optim.apply(ps, opt, sched, max_norm) for ps, opt, sched in self._optimizers()]
        log.norms.append(norm)
        log.critic_norms += [cnorm for cnorm, _ in critic]
        self.updates_done += int(stepped)
        log.skipped += int(not stepped)
        return int(stepped)

    # ---- weights out (rl.trainer.weights) and checkpoints (rl.trainer.checkpoint): the actor's API ----------
    def export_weights(self, dtype: str = "bfloat16") -> str:
        """``WeightExport.file``: the policy as one safetensors file in shared memory (every rank calls it)."""
        return self.weights.file(dtype)

    def export_ipc(self, dtype: str = "bfloat16") -> IpcWeights:
        """``WeightExport.ipc``: the policy in one CUDA IPC buffer on this GPU."""
        return self.weights.ipc(dtype)

    def join_weight_group(self, spec: CollectiveJoin) -> Any:
        """``WeightExport.join_group``: rank 0 joins the ``collective`` transport's weight group (``JoinFailed``
        where the formation did not complete)."""
        return self.weights.join_group(spec)

    def export_collective(self, dtype: str, version: int, bucket_bytes: int) -> CollectiveWeights | None:
        """``WeightExport.collective``: stream ``version`` of the policy to the engines (every rank calls it)."""
        return self.weights.collective(dtype, version, bucket_bytes)

    def export_adapter(self) -> str:
        """``WeightExport.adapter``: with LoRA, the adapters as a ``peft`` folder."""
        return self.weights.adapter()

    def read_weights(self, path: str, delta: bool = False) -> BlobWeights | DeltaWeights:
        """``WeightExport.read_update``: what an export wrote (``delta``: only its changes), for engines on other nodes."""
        return self.weights.read_update(path, delta)

    def save_checkpoint(self, path: str, wait: bool = True, export_dtype: str | None = None) -> None:
        """``rl.trainer.checkpoint.save``: weights, optimizers, schedules, RNG states into folder ``path``
        (``wait=False``: the sharded state is written while training goes on; ``learner.done`` marks the end;
        ``export_dtype``: also ``model/``, the policy as an HF folder in that dtype)."""
        checkpoint.save(self, path, wait, export_dtype)

    def load_checkpoint(self, path: str) -> None:
        """``rl.trainer.checkpoint.load``: restore what ``save_checkpoint`` wrote."""
        checkpoint.load(self, path)

    def logprobs(self, prompt: list[int], continuation: list[int]) -> list[float]:
        """The policy's logprobs of ``continuation`` after ``prompt`` (no grad, same precision as training), at
        temperature 1: the raw log-probs an engine's ``score`` gives (the weight-sync check compares them)."""
        if not continuation:
            return []
        s = Sample(
            list(prompt) + list(continuation), len(prompt), [1] * len(continuation), [0.0] * len(continuation), 0.0, ""
        )
        with torch.no_grad(), self._autocast():
            logp, _ = self.fwd.logprobs(self.model, [s], temperature=1.0)
            return logp.tolist()

    def critic_module(self) -> torch.nn.Module | None:
        """The value head or the separate critic (what a checkpoint saves as critic.safetensors), or None."""
        return self.critic if self.critic is not None else self.value_head

    def shutdown(self) -> None:
        checkpoint.finish(self)  # a checkpoint still being written completes
        shutil.rmtree(self.shm_dir, ignore_errors=True)
        if self.sharded:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
