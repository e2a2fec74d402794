"""The learner: one ``step(batch)`` of policy-gradient training of an HF causal LM (GRPO family, REINFORCE++,
PPO with a critic). ``Learner`` is a plain class (the Ray actor wraps it; tests run it in-process).

A step, as ``step`` and ``_run_updates`` read::

    plan      the batch's counts over every rank (``_plan``)
    prepare   when needed (several updates per batch, a critic, ``algo.kl.in_reward``): no-grad old log-probs,
              reference log-probs, critic values, then the estimator's learner-side advantages (``_prepare``)
    update    for each of ``algo.update.epochs`` epochs, for each of ``algo.update.minibatches`` shuffled
              minibatches: zero the gradients, forward + objective + backward per micro-batch (bounded by
              ``learner.micro_batch_tokens``, exact accumulation with the minibatch's denominators), one
              optimizer step (``rl.trainer.optim.apply``: reduce, clip, step)

Without a prepare pass the ratio's old log-probs are the policy's own, detached; the engine's log-probs
(of the same tempered distribution, ``rollout.temperature``) are compared with them as
``rollout/logprob_diff`` and weight the loss only with ``algo.loss.tis_cap``.

The jobs live in their own modules: model building (``rl.trainer.models``: policy, LoRA, FSDP, reference,
critic), the forward pass (``rl.trainer.forward``: full and packed layouts, response positions only through
``lm_head``, at the sampling temperature), the objective (``rl.algos.objective`` with the policy losses of
``rl.algos.policy_losses``: a pure function of typed inputs), the optimizer and update (``rl.trainer.optim``,
one path for policy and critic), the metrics (``rl.trainer.metrics``: typed records), weight export
(``rl.trainer.weights``: file, CUDA IPC, LoRA adapter) and checkpoints (``rl.trainer.checkpoint``).
Several learners shard with FSDP2 and keep their collectives in step (``rl.trainer.fsdp``,
``rl.trainer.distributed``); the memory a step frees is held for the next (``learner.hold_memory``,
``rl.trainer.memory``). This module does not generate text or score rewards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import shutil
import tempfile
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
from rl.config.recipe import AlgoConfig, LearnerConfig, ModelConfig
from rl.trainer import checkpoint, fsdp, models, optim, memory, packing, precision
from rl.trainer.checkpoint import policy_from_checkpoint  # noqa: F401 - rl.cli.export's import
from rl.trainer.forward import Forward
from rl.trainer.metrics import StepMetrics, Sums, UpdateLog
from rl.trainer.weights import WeightExport
from rl.trainer.logits import Entropy
from rl.trainer.distributed import all_reduce_sum, broadcast_params, free_port, init_process_group
from rl.algos.losses import (
    kl,
)
from rl.algos.schedules import kl_controller


@dataclass
class _Grid:
    """One micro-batch's policy tokens on its [B, T] response grid (flat tensors index into it)."""

    index: torch.Tensor  # [N] positions of the flat (sample, masked position) order in the grid
    B: int
    T: int
    mask: torch.Tensor  # [B, T] True at policy tokens (of samples not excluded)
    ntok: float
    denom: tuple[float, float]  # the loss denominators (tokens, sequences) of the minibatch
    norm_tokens: int | None = None  # the constant of seq-mean-token-sum-norm
    sample_mask: torch.Tensor | None = None  # [B] False for a sample excluded from the loss

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
    value = (c.vf_coef, c.value_clip or None) if c is not None else (0.0, None)
    terms = Terms(0.0, algo.kl.kind, algo.kl.in_reward, algo.loss.entropy_coef, *value)
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
        ``dist_port``: data-parallel position and rendezvous (``rl.trainer.distributed``).
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
        d = Path(tempfile.mkdtemp(prefix="jointrl-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
        weakref.finalize(self, shutil.rmtree, str(d), True)
        return d

    def _build_models(self, model_path: str) -> None:
        """The policy, reference and critic (``rl.trainer.models.build``), as this learner's attributes."""
        m = models.build(
            model_path,
            self.model_cfg,
            self.lcfg,
            self.device,
            sharded=self.sharded,
            bf16_compute=self.use_autocast and self.device.type == "cuda",  # GPU: FSDP's policy, not autocast
            # a reference for a KL term, or for a policy loss that reads the reference's log-probs
            reference_dtype=self.reference_dtype() if self._needs_reference() else None,
            critic=self.algo.critic.model if self.est.needs_critic else None,
        )
        self.model, self.peft, self.ref, self.value_head, self.critic = m.model, m.peft, m.ref, m.value_head, m.critic
        self.has_ref = m.has_ref  # no KL term: no reference model, and no reference forward

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
        """Whether a no-grad pass runs before the first update (see the module docstring)."""
        a = self.algo
        return a.update.epochs * a.update.minibatches > 1 or self.est.learner_advantages(a)

    # ---- forward (rl.trainer.forward) ------------------------------------------------------
    def _forward(
        self, model: Any, samples: list[Sample], entropy: Entropy = "none"
    ) -> tuple[tuple[Any, ...], torch.Tensor | None]:
        """``Forward.__call__`` at the sampling temperature (a method of its own: bench/learner_memory.py wraps it)."""
        return self.fwd(model, samples, entropy)

    def _autocast(self):
        enabled = self.use_autocast and self.device.type in ("cpu", "cuda")
        if self.device.type == "cuda" and fsdp.is_sharded(self.model):
            enabled = False  # FSDP's MixedPrecisionPolicy computes in bf16 (rl.trainer.fsdp.shard)
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=enabled)

    def _micro_batches(self, samples: list[Sample]) -> list[list[Sample]]:
        """Split into micro-batches of at most ``learner.micro_batch_tokens`` computed tokens.

        Samples sharing a prompt stay together (their prompt is computed once and costs
        its length once; packed, their responses cost their own lengths; a bench's padded layout costs each
        the group's longest); a group too large for the budget is split.
        """
        budget = self.lcfg.micro_batch_tokens
        groups: dict[tuple[int, ...], list[Sample]] = {}
        for s in sorted(samples, key=lambda s: len(s.input_ids)):
            groups.setdefault(tuple(s.input_ids[: s.prompt_len]) if self.lcfg.share_prompt else (id(s),), []).append(s)
        units: list[list[Sample]] = []
        for group in groups.values():
            chunk: list[Sample] = []
            for s in group:  # an oversized group is split (each part runs the prompt once)
                if chunk and self._unit_cost(chunk + [s]) > budget:
                    units.append(chunk)
                    chunk = []
                chunk.append(s)
            units.append(chunk)
        out: list[list[Sample]] = []
        cur: list[Sample] = []
        cur_cost = 0
        for unit in units:
            c = self._unit_cost(unit)
            if cur and cur_cost + c > budget:
                out.append(cur)
                cur, cur_cost = [], 0
            cur.extend(unit)
            cur_cost += c
        if cur:
            out.append(cur)
        return out

    def _unit_cost(self, group: list[Sample]) -> int:
        """Tokens one group (or part of one) computes: its full sequences padded, or packed (or a bench's layout's)."""
        longest = max(len(s.input_ids) for s in group)
        if not self.lcfg.share_prompt:
            return len(group) * longest
        if self.fwd.layout is not None:  # a bench's layout (bench/padded_layout.py)
            return self.fwd.layout.unit_cost(group)
        return packing.packed_length(group)

    # ---- training -------------------------------------------------------------------------
    def step(self, batch: Batch) -> dict[str, float]:
        """One learner step over ``batch``: ``epochs x minibatches`` optimizer steps; returns metrics.

        Metrics: ``loss/policy`` (and ``loss/kl``, ``loss/value``, ``loss/entropy``): each
        minibatch's aggregated loss term, averaged over the step's optimizer steps
        (``loss/kl`` is the aggregated KL before the coefficient, also when the KL is in the
        reward); ``kl/mean``, ``entropy/mean``, ``value/*``: token means
        over every update pass; ``grad/norm``: mean pre-clip global norm; ``lr``: learning
        rate of the step's last optimizer step; ``kl/coef``: the coefficient used in this step;
        ``learner/tokens``: policy tokens computed per epoch; ``learner/updates``;
        ``learner/skipped_update``: fraction of optimizer steps skipped for a non-finite
        gradient; ``rollout/logprob_diff``: mean |learner - engine| log-prob before the update;
        the policy loss's own stats (its ``stat_names``; ``ppo_clip``: ``clip/fraction``, with
        ``algo.loss.dual_clip`` ``clip/dual_fraction``, with ``algo.loss.tis_cap`` ``is/weight_mean`` and
        ``is/truncated_fraction``); ``memory/learner_rss_gb``: this
        process's resident memory after the step (``learner.hold_memory``: flat over a run once it holds a
        step's peak); ``memory/trimmed``: 1 where that step went over the hold budget and was trimmed.
        Over data-parallel ranks every sum is all-reduced: each rank returns the whole batch's.
        An empty batch (nothing to compute on any rank) leaves the weights alone.
        """
        t0 = time.perf_counter()
        sums = Sums()
        members = sorted(batch.samples + batch.skipped, key=lambda s: s.uid)
        n_computed = self._plan(batch, members)
        coef = self.kl_ctl.value
        log = UpdateLog(lr=self.opt.param_groups[0]["lr"])
        updates = self._run_updates(batch, members, sums, coef, log) if n_computed else 0
        if updates:
            self.steps_done += 1
        names = self.loss_fn.stat_names
        tot = Sums.of(self._global(sums.values(names)), names)
        a = self.algo
        n_up = a.update.epochs * a.update.minibatches if n_computed else 1
        terms = (a.loss.entropy_coef > 0, self.has_ref, self.critic_module() is not None, self.critic is not None)
        m = StepMetrics.of(tot, log, n_up, updates, bool(n_computed), terms)
        if self.has_ref:
            m.kl_coef = coef
            if n_computed:
                self.kl_ctl.update(m.kl_mean, batch.num_seqs)
        self._after_step(m)
        m.compute_s = time.perf_counter() - t0
        return m.to_dict()

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

    def _plan(self, batch: Batch, members: list[Sample]) -> int:
        """The number of computed samples over every rank; checks the counts minibatches rely on."""
        a = self.algo
        n_computed, m_tokens, m_seqs = self._global(
            [len(batch.samples), sum(s.num_tokens for s in members), sum(1 for s in members if s.num_tokens > 0)]
        )
        if a.update.minibatches > 1 and n_computed and (m_tokens, m_seqs) != (batch.num_tokens, batch.num_seqs):
            raise ValueError(
                f"batch.num_tokens/num_seqs ({batch.num_tokens}, {batch.num_seqs}) do not count exactly its "
                f"samples and skipped samples ({m_tokens:g}, {m_seqs:g}); algo.minibatches > 1 needs them "
                "to (build_batch's batches do)"
            )
        return int(n_computed)

    def _run_updates(self, batch: Batch, members: list[Sample], sums: Sums, coef: float, log: UpdateLog) -> int:
        """The prepare pass (when needed), then ``epochs x minibatches`` optimizer steps; returns the steps taken."""
        prep = self._prepare(batch, sums, coef) if self.needs_prepare else None
        computed = {id(s) for s in batch.samples}
        updates = 0
        for epoch in range(self.algo.update.epochs):
            for mb in self._minibatches(members):
                self.opt.zero_grad(set_to_none=True)
                if self.critic_opt is not None:
                    self.critic_opt.zero_grad(set_to_none=True)
                work = [s for s in mb if id(s) in computed]
                self._backward(mb, work, prep, self._denominators(batch, mb), sums, coef, epoch == 0)
                updates += self._update(log)
        return updates

    def _denominators(self, batch: Batch, mb: list[Sample]) -> tuple[float, float]:
        """The loss denominators (tokens, sequences): the batch's with one minibatch, else the global minibatch's
        (the sum of the ranks' local counts)."""
        if self.algo.update.minibatches == 1:
            return batch.num_tokens, batch.num_seqs
        nt, ns = self._global([sum(s.num_tokens for s in mb), sum(1 for s in mb if s.num_tokens > 0)])
        return nt, ns

    def _backward(
        self,
        mb: list[Sample],
        work: list[Sample],
        prep: dict[str, dict[int, torch.Tensor]] | None,
        denom: tuple[float, float],
        sums: Sums,
        coef: float,
        first_epoch: bool,
    ) -> None:
        """The minibatch's gradients: its computed samples ``work`` in micro-batches (accumulated exactly)."""
        micros = self._micro_batches(work) if work else []
        n_micro = self.lock.count(len(micros))  # sharded: every rank runs as many (dummies pad)
        for micro in micros:
            self._accumulate(micro, prep, denom, sums, coef, first_epoch=first_epoch)
        for _ in range(n_micro - len(micros)):
            self._pad_micro(prep)
        if not n_micro and self.lock.count(int(bool(mb))):
            # only skipped (zero-advantage) samples: their exact gradient, 0, as if computed
            for p in self._trainable():
                p.grad = torch.zeros_like(p)

    def prepare(self, batch: Batch) -> dict[str, list[list[float]]]:
        """``step``'s prepare pass on ``batch``, without any update (for inspection and tests).

        Per sample of ``batch.samples``, lists over its masked tokens: ``old`` (policy
        log-probs), and where they apply ``ref`` (reference log-probs), ``values`` (critic),
        ``adv`` and ``returns`` (learner-side advantages and value targets).
        """
        prep = self._prepare(batch, Sums(), self.kl_ctl.value)
        return {k: [v[id(s)].tolist() for s in batch.samples] for k, v in prep.items() if v}

    def _global(self, values: list[float]) -> list[float]:
        """``values`` summed over the data-parallel ranks (as is with one learner)."""
        if self._reduce is None:
            return [float(v) for v in values]
        return self._reduce(torch.tensor(values, dtype=torch.float64, device=self.device)).tolist()

    def _minibatches(self, members: list[Sample]) -> list[list[Sample]]:
        """One epoch's minibatches: ``algo.minibatches`` parts of a random permutation (in batch order for one update)."""
        a = self.algo
        if a.update.epochs * a.update.minibatches == 1:
            return [members]
        perm = torch.randperm(len(members), generator=self.gen)
        return [[members[i] for i in part.tolist()] for part in torch.tensor_split(perm, a.update.minibatches)]

    @staticmethod
    def _cat(store: dict[int, torch.Tensor], mb: list[Sample]) -> torch.Tensor:
        """Per-sample flat tensors of ``mb`` concatenated: row-major (sample, masked position) order."""
        return torch.cat([store[id(s)] for s in mb])

    @staticmethod
    def _split(flat: torch.Tensor, mb: list[Sample], store: dict[int, torch.Tensor]) -> None:
        for s, piece in zip(mb, torch.split(flat.detach(), [s.num_tokens for s in mb])):
            store[id(s)] = piece

    @torch.no_grad()
    def _prepare(self, batch: Batch, sums: Sums, coef: float) -> dict[str, dict[int, torch.Tensor]]:
        """No-grad pass before the first update: old log-probs, reference log-probs and values
        per sample (flat over its masked tokens); then the learner-side advantages and returns."""
        prep: dict[str, dict[int, torch.Tensor]] = {"old": {}, "ref": {}, "values": {}, "adv": {}, "returns": {}}
        micros = self._micro_batches(batch.samples) if batch.samples else []
        for _ in range(self.lock.count(len(micros)) - len(micros)):  # a sharded rank with fewer: dummy calls
            with self._autocast():
                self._forward(self.model, [])
                if self.has_ref:
                    with self._reference() as ref:
                        self._forward(ref, [])
        for micro in micros:
            with self._autocast():
                (hidden, old, _, _, _), _ = self._forward(self.model, micro)
            self._split(old, micro, prep["old"])
            if self.value_head is not None:
                self._split(self.fwd.values(self.value_head, hidden), micro, prep["values"])
            del hidden
            if self.has_ref:
                with self._autocast(), self._reference() as ref:
                    ref_lp, _ = self.fwd.logprobs(ref, micro)
                self._split(ref_lp, micro, prep["ref"])
            if self.critic is not None:
                with self._autocast():
                    ch, _, _ = self.fwd.hidden(self.critic.trunk, micro)
                self._split(self.fwd.values(self.critic.head, ch), micro, prep["values"])
            self._logprob_diff(old, micro, sums)
        if self.est.learner_advantages(self.algo):
            self._advantages(batch.samples, prep, coef)
        return prep

    def _engine_logprobs(self, mb: list[Sample]) -> torch.Tensor:
        """The engine's log-probs of the policy tokens, flat row-major over (sample, masked position)."""
        return torch.tensor(
            [lp for s in mb for lp, m in zip(s.rollout_logprobs, s.loss_mask) if m],
            dtype=torch.float32,
            device=self.device,
        )

    def _logprob_diff(self, logp_flat: torch.Tensor, mb: list[Sample], sums: Sums) -> None:
        engine = self._engine_logprobs(mb)
        # logp_flat is row-major over (sample, masked position), the same order as this flattening.
        sums.logprob_diff += float((logp_flat.detach() - engine).abs().sum())
        sums.logprob_diff_tokens += float(engine.numel())

    def _advantages(self, samples: list[Sample], prep: dict[str, dict[int, torch.Tensor]], coef: float) -> None:
        """Learner-side advantages (and PPO returns) into ``prep["adv"]``/``prep["returns"]``; see the module docstring."""
        a, dev = self.algo, self.device
        B, T = len(samples), max((len(s.loss_mask) for s in samples), default=0)
        mask = torch.zeros(B, T, dtype=torch.bool, device=dev)
        for i, s in enumerate(samples):
            mask[i, : len(s.loss_mask)] = torch.tensor(s.loss_mask, dtype=torch.bool, device=dev)

        def grid(store: dict[int, torch.Tensor]) -> torch.Tensor:
            g = torch.zeros(B, T, dtype=torch.float32, device=dev)
            for i, s in enumerate(samples):
                g[i, mask[i]] = store[id(s)].float()
            return g

        scores = torch.tensor([s.reward for s in samples], dtype=torch.float32, device=dev)
        pen = None
        if a.kl.in_reward:
            pen = -coef * torch.where(mask, kl(grid(prep["old"]), grid(prep["ref"]), a.kl.kind), 0.0)
        gids = torch.tensor([s.group_id for s in samples], dtype=torch.long, device=dev)
        values = grid(prep["values"]) if self.est.needs_critic else None
        adv, returns = self.est.token_advantages(scores, gids, mask, pen, values, reduce_sum=self._reduce)
        for i, s in enumerate(samples):
            prep["adv"][id(s)] = adv[i][mask[i]].float()
            if returns is not None:
                prep["returns"][id(s)] = returns[i][mask[i]].float()

    def _accumulate(
        self,
        mb: list[Sample],
        prep: dict[str, dict[int, torch.Tensor]] | None,
        denom: tuple[float, float],
        sums: Sums,
        coef: float,
        first_epoch: bool,
    ) -> None:
        """Forward + backward of one micro-batch; gradients accumulate (the loss is its part of the minibatch's)."""
        a = self.algo
        with self._autocast():
            ent_mode: Entropy = "grad" if a.loss.entropy_coef > 0 or "entropy" in self.loss_fn.needs else "value"
            (hidden, logp_flat, ent_flat, _, index), pad = self._forward(self.model, mb, ent_mode)
        values_flat = self.fwd.values(self.value_head, hidden) if self.value_head is not None else None
        del hidden
        B, T = len(mb), max(len(s.loss_mask) for s in mb)
        g = _Grid(index, B, T, torch.zeros(0), float(logp_flat.numel()), denom, self.norm_tokens)
        # a sample excluded from the loss (Sample.excluded: a harness failure) has no policy token in it
        g.sample_mask = torch.tensor([not s.excluded for s in mb], dtype=torch.bool, device=logp_flat.device)
        g.mask = g(torch.ones_like(logp_flat)).bool() & g.sample_mask[:, None]
        x = self._objective_inputs(mb, prep, g, g(logp_flat), ent_flat, values_flat, coef)
        total, st = objective(x, self.loss_fn)
        (total if pad is None else total + pad).backward()
        if prep is None and first_epoch:
            self._logprob_diff(logp_flat, mb, sums)
        sums.add(st, g.ntok, float(ent_flat.detach().sum()), first_epoch)

    def _objective_inputs(
        self,
        mb: list[Sample],
        prep: dict[str, dict[int, torch.Tensor]] | None,
        g: _Grid,
        logp: torch.Tensor,
        ent_flat: torch.Tensor,
        values_flat: torch.Tensor | None,
        coef: float,
    ) -> ObjectiveInputs:
        """The objective's typed inputs (``rl.algos.objective``) on the micro-batch's grid: only what its terms
        and the policy loss need (the engine's log-probs, the reference's, the critic's values)."""
        a, need = self.algo, self.loss_fn.needs
        old = g(self._cat(prep["old"], mb)) if prep is not None else logp.detach()
        if prep is not None and self.est.learner_advantages(a):
            adv = g(self._cat(prep["adv"], mb))
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
            sample_mask=g.sample_mask,
            agg=self.agg,
            num_tokens=nt,
            num_seqs=ns,
            norm_tokens=self.norm_tokens,
            engine_logp=g(self._engine_logprobs(mb)) if "engine_logprobs" in need else None,
            entropy=g(ent_flat) if "entropy" in need else None,
            ref_logp=ref if "ref_logprobs" in need else None,
        )
        values = self._critic_values(mb, values_flat)
        return ObjectiveInputs(
            policy=policy,
            terms=dataclasses.replace(self.terms, kl_coef=coef),
            ref_logp=ref,
            entropy=g(ent_flat) if a.loss.entropy_coef > 0 else None,
            values=g(values) if values is not None else None,
            old_values=g(self._cat(prep["values"], mb)) if values is not None and prep is not None else None,
            returns=g(self._cat(prep["returns"], mb)) if values is not None and prep is not None else None,
        )

    def _reference_logprobs(self, mb: list[Sample], prep: dict[str, dict[int, torch.Tensor]] | None) -> torch.Tensor:
        """The reference's log-probs of the micro-batch's policy tokens (flat): cached by the prepare pass, or now."""
        if prep is not None:
            return self._cat(prep["ref"], mb)
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

    def _pad_micro(self, prep: dict[str, dict[int, torch.Tensor]] | None) -> None:
        """A micro-batch with no samples on a sharded rank that has fewer than the others: the same
        module calls as ``_accumulate`` (policy, then the reference when it runs there), all dummies."""
        with self._autocast():
            _, pad = self._forward(self.model, [])
            if self.has_ref and prep is None:
                with torch.no_grad(), self._reference() as ref:
                    self._forward(ref, [])
        if pad is not None:
            pad.backward()

    def _update(self, log: UpdateLog) -> int:
        """Apply the accumulated gradients (``rl.trainer.optim.apply``): the policy's (and value head's), then a
        separate critic's, each clipped on its own norm; 1 if the policy stepped."""
        max_norm = self.algo.optim.max_grad_norm
        log.lr = self.opt.param_groups[0]["lr"]
        norm, stepped = optim.apply(self._trainable(), self.opt, self.sched, max_norm)
        log.norms.append(norm)
        if stepped:
            self.updates_done += 1
        else:
            log.skipped += 1
        if self.critic is not None:
            cnorm, _ = optim.apply(list(self.critic.parameters()), self.critic_opt, self.critic_sched, max_norm)
            log.critic_norms.append(cnorm)
        return int(stepped)

    # ---- weights & checkpoints ----------------------------------------------------------
    # ---- weights out (rl.trainer.weights) and checkpoints (rl.trainer.checkpoint): the actor's API ----------
    def export_weights(self, dtype: str = "bfloat16") -> str:
        """``WeightExport.file``: the policy as one safetensors file in shared memory (every rank calls it)."""
        return self.weights.file(dtype)

    def export_ipc(self, dtype: str = "bfloat16") -> dict[str, Any]:
        """``WeightExport.ipc``: the policy in one CUDA IPC buffer on this GPU."""
        return self.weights.ipc(dtype)

    def export_adapter(self) -> str:
        """``WeightExport.adapter``: with LoRA, the adapters as a ``peft`` folder."""
        return self.weights.adapter()

    def read_weights(self, path: str) -> bytes | dict[str, bytes]:
        """``WeightExport.read``: what an export wrote, for engines on other nodes."""
        return WeightExport.read(path)

    def save_checkpoint(self, path: str) -> None:
        """``rl.trainer.checkpoint.save``: weights, optimizers, schedules, RNG states into folder ``path``."""
        checkpoint.save(self, path)

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
        shutil.rmtree(self.shm_dir, ignore_errors=True)
        if self.sharded:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
