"""The learner: an HF causal LM trained with the clipped policy-gradient loss + KL to a reference.

``Learner`` is a plain class (the Ray actor wraps it; tests run it in-process). One
``step(batch)`` is one optimizer step over the whole batch, in micro-batches bounded by a
token budget with exact gradient accumulation (the loss denominators are the full
batch's). Only response positions go through ``lm_head`` (the prompt's logits are never
materialised), and log-probs are computed in float32 under bf16 autocast.

With one optimizer step per batch the sampling policy equals the current one, so the
ratio's "old" log-probs are the learner's own detached log-probs (the engine's log-probs
differ by bf16/kernel noise and are reported as ``rollout/logprob_diff``, not used).

``export_weights`` writes the policy as one safetensors file into shared memory for the
engines (``lm_head.weight`` always included: with tied embeddings an engine otherwise
keeps a stale head). This module does not generate text or score rewards.
"""

from __future__ import annotations

import math
import os
import random
import tempfile
import shutil
import time
import weakref
from pathlib import Path
from typing import Any

import torch

from rl.batch import Batch, Sample
from rl.config import AlgoConfig, ModelConfig
from rl.losses import aggregate, entropy_from_logits, kl, policy_loss, token_logprobs

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Learner:
    def __init__(self, model_path: str, model_cfg: ModelConfig, algo: AlgoConfig, *, seed: int = 0,
                 threads: int = 0, shm_dir: str | None = None) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(threads or os.cpu_count() or 1)
        torch.manual_seed(seed)
        random.seed(seed)
        self.algo, self.model_cfg = algo, model_cfg
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=DTYPES[model_cfg.learner_dtype]).to(self.device)
        self.model.train()
        self.model.config.use_cache = False
        self.ref = None
        if algo.kl_coef > 0:
            self.ref = AutoModelForCausalLM.from_pretrained(model_path, dtype=DTYPES[model_cfg.reference_dtype]).to(self.device)
            self.ref.eval().requires_grad_(False)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=algo.lr, weight_decay=algo.weight_decay,
                                     betas=(0.9, 0.999), eps=1e-8)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        if shm_dir:
            self.shm_dir = Path(shm_dir)  # owned (and removed) by the caller
            self.shm_dir.mkdir(parents=True, exist_ok=True)
        else:
            self.shm_dir = Path(tempfile.mkdtemp(prefix="jointrl-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
            weakref.finalize(self, shutil.rmtree, str(self.shm_dir), True)
        self.steps_done = 0

    # ---- forward --------------------------------------------------------------------------
    def _autocast(self):
        enabled = self.model_cfg.autocast and self.device.type in ("cpu", "cuda")
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=enabled)

    def _response_logits(self, model: Any, samples: list[Sample]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logits at response positions only.

        Returns (logits [N, V], targets [N], index [N] into a [B, T] response grid) where
        N counts masked response tokens and T is the longest response in ``samples``.
        With ``algo.share_prompt``, samples with the same prompt (a GRPO group) run the
        prompt once and attend to its key/value cache, repeated per member; gradients still
        flow through the prompt. Otherwise every sample runs its full sequence.
        """
        T = max(len(s.loss_mask) for s in samples)
        if not self.algo.share_prompt:
            hidden, targets, index = self._full_hidden(model, samples, list(range(len(samples))), T)
            return model.get_output_embeddings()(hidden), targets, index
        by_prompt: dict[tuple[int, ...], list[int]] = {}
        for b, s in enumerate(samples):
            by_prompt.setdefault(tuple(s.input_ids[: s.prompt_len]), []).append(b)
        hs, tg, ix = [], [], []
        for members in by_prompt.values():
            h, t, i = self._shared_prompt_hidden(model, [samples[b] for b in members], members, T)
            hs.append(h)
            tg.append(t)
            ix.append(i)
        hidden, targets, index = torch.cat(hs), torch.cat(tg), torch.cat(ix)
        order = torch.argsort(index)  # row-major (sample, position) order, whatever the grouping
        return model.get_output_embeddings()(hidden[order]), targets[order], index[order]

    def _select(self, members: list[Sample], rows_b: list[int], T: int) -> tuple[list[int], list[int], torch.Tensor, torch.Tensor]:
        """(row in chunk, response position) of every masked token, their targets and grid index."""
        g_idx, j_idx, tgt, ix = [], [], [], []
        for g, (s, b) in enumerate(zip(members, rows_b)):
            for j, m in enumerate(s.loss_mask):
                if m:
                    g_idx.append(g)
                    j_idx.append(j)
                    tgt.append(s.input_ids[s.prompt_len + j])
                    ix.append(b * T + j)
        dev = self.device
        return g_idx, j_idx, torch.tensor(tgt, dtype=torch.long, device=dev), torch.tensor(ix, dtype=torch.long, device=dev)

    def _full_hidden(self, model: Any, members: list[Sample], rows_b: list[int], T: int):
        L = max(len(s.input_ids) for s in members)
        ids = torch.full((len(members), L), self.pad_id, dtype=torch.long)
        att = torch.zeros((len(members), L), dtype=torch.long)
        for g, s in enumerate(members):
            ids[g, : len(s.input_ids)] = torch.tensor(s.input_ids)
            att[g, : len(s.input_ids)] = 1
        base = getattr(model, model.base_model_prefix)
        hidden = base(input_ids=ids.to(self.device), attention_mask=att.to(self.device)).last_hidden_state
        g_idx, j_idx, tgt, ix = self._select(members, rows_b, T)
        # The hidden state at absolute position prompt_len + j - 1 predicts response token j.
        pos = [members[g].prompt_len + j - 1 for g, j in zip(g_idx, j_idx)]
        return hidden[torch.tensor(g_idx, dtype=torch.long, device=self.device),
                      torch.tensor(pos, dtype=torch.long, device=self.device)], tgt, ix

    def _shared_prompt_hidden(self, model: Any, members: list[Sample], rows_b: list[int], T: int):
        p = members[0].prompt_len
        G = len(members)
        R = max(len(s.input_ids) - p for s in members)
        base = getattr(model, model.base_model_prefix)
        prompt = torch.tensor([members[0].input_ids[:p]], device=self.device)
        out = base(input_ids=prompt, use_cache=True)
        last = out.last_hidden_state[:, -1:].expand(G, 1, -1)  # predicts response token 0
        if R > 1:
            cache = out.past_key_values
            cache.batch_repeat_interleave(G)
            ids = torch.full((G, R - 1), self.pad_id, dtype=torch.long)
            att = torch.zeros((G, p + R - 1), dtype=torch.long)
            att[:, :p] = 1
            for g, s in enumerate(members):
                resp = s.input_ids[p:][: R - 1]
                ids[g, : len(resp)] = torch.tensor(resp)
                att[g, p : p + len(resp)] = 1
            pos = torch.arange(p, p + R - 1).expand(G, -1)
            h2 = base(input_ids=ids.to(self.device), attention_mask=att.to(self.device), past_key_values=cache,
                      position_ids=pos.to(self.device), use_cache=True).last_hidden_state
            hidden = torch.cat([last, h2], dim=1)  # [G, R, H]: position j predicts response token j
        else:
            hidden = last
        g_idx, j_idx, tgt, ix = self._select(members, rows_b, T)
        return hidden[torch.tensor(g_idx, dtype=torch.long, device=self.device),
                      torch.tensor(j_idx, dtype=torch.long, device=self.device)], tgt, ix

    @staticmethod
    def _to_grid(values: torch.Tensor, index: torch.Tensor, B: int, T: int) -> torch.Tensor:
        grid = torch.zeros(B * T, dtype=values.dtype, device=values.device)
        return grid.index_put((index,), values).view(B, T)

    def _micro_batches(self, samples: list[Sample]) -> list[list[Sample]]:
        """Split into micro-batches of at most ``algo.micro_batch_tokens`` padded tokens.

        Samples sharing a prompt stay together (their prompt is computed once and costs
        its length once); a group too large for the budget is split.
        """
        budget = self.algo.micro_batch_tokens
        groups: dict[tuple[int, ...], list[Sample]] = {}
        for s in sorted(samples, key=lambda s: len(s.input_ids)):
            groups.setdefault(tuple(s.input_ids[: s.prompt_len]) if self.algo.share_prompt else (id(s),), []).append(s)

        def cost(group: list[Sample]) -> int:
            longest = max(len(s.input_ids) for s in group)
            if not self.algo.share_prompt:
                return len(group) * longest
            return group[0].prompt_len + len(group) * (longest - group[0].prompt_len)

        units: list[list[Sample]] = []
        for group in groups.values():
            chunk: list[Sample] = []
            for s in group:  # an oversized group is split (each part runs the prompt once)
                if chunk and cost(chunk + [s]) > budget:
                    units.append(chunk)
                    chunk = []
                chunk.append(s)
            units.append(chunk)
        out: list[list[Sample]] = []
        cur: list[Sample] = []
        cur_cost = 0
        for unit in units:
            c = cost(unit)
            if cur and cur_cost + c > budget:
                out.append(cur)
                cur, cur_cost = [], 0
            cur.extend(unit)
            cur_cost += c
        if cur:
            out.append(cur)
        return out

    # ---- training -------------------------------------------------------------------------
    def step(self, batch: Batch) -> dict[str, float]:
        """One optimizer step over ``batch``; returns metrics (``loss/policy``, ``kl/mean``, ...)."""
        t0 = time.perf_counter()
        a = self.algo
        sums: dict[str, float] = {"loss/policy": 0.0, "loss/kl": 0.0, "kl/sum": 0.0, "entropy/sum": 0.0,
                                  "clip/count": 0.0, "logprob_diff/sum": 0.0, "tokens": 0.0}
        self.opt.zero_grad(set_to_none=True)
        if batch.samples:
            for mb in self._micro_batches(batch.samples):
                self._accumulate(mb, batch, sums)
        grad_norm = self._grad_norm()
        finite = math.isfinite(grad_norm)
        if batch.samples and finite:
            if a.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), a.max_grad_norm)
            self.opt.step()
            self.steps_done += 1
        n = max(sums["tokens"], 1.0)
        m = {
            "loss/policy": sums["loss/policy"],
            "entropy/mean": sums["entropy/sum"] / n,
            "clip/fraction": sums["clip/count"] / n,
            "grad/norm": grad_norm,
            "lr": self.opt.param_groups[0]["lr"],
            "learner/tokens": sums["tokens"],
            "learner/skipped_update": float(bool(batch.samples) and not finite),
            "rollout/logprob_diff": sums["logprob_diff/sum"] / n,
            "timing/learner_compute_s": time.perf_counter() - t0,
        }
        if self.ref is not None:
            m["loss/kl"] = sums["loss/kl"]
            m["kl/mean"] = sums["kl/sum"] / n
        return m

    def _accumulate(self, mb: list[Sample], batch: Batch, sums: dict[str, float]) -> None:
        a = self.algo
        B, T = len(mb), max(len(s.loss_mask) for s in mb)
        with self._autocast():
            logits, targets, index = self._response_logits(self.model, mb)
        logp_flat = token_logprobs(logits, targets)
        with torch.no_grad():
            ent_flat = entropy_from_logits(logits.detach())
        del logits
        logp = self._to_grid(logp_flat, index, B, T)
        mask = self._to_grid(torch.ones_like(logp_flat), index, B, T)
        adv = torch.tensor([s.advantage for s in mb], dtype=torch.float32, device=self.device)
        loss, st = policy_loss(logp, logp.detach(), adv, mask, clip_low=a.clip_low, clip_high=a.clip_high,
                               agg=a.loss_agg, num_tokens=batch.num_tokens, num_seqs=batch.num_seqs)
        total = loss
        if self.ref is not None:
            with torch.no_grad(), self._autocast():
                ref_logits, _, _ = self._response_logits(self.ref, mb)
                ref_flat = token_logprobs(ref_logits, targets)
                del ref_logits
            ref = self._to_grid(ref_flat, index, B, T)
            kl_tok = kl(logp, ref, a.kl_kind)
            kl_loss = aggregate(kl_tok, mask, a.loss_agg, num_tokens=batch.num_tokens, num_seqs=batch.num_seqs)
            total = total + a.kl_coef * kl_loss
            sums["loss/kl"] += float(kl_loss.detach())
            sums["kl/sum"] += float((kl_tok.detach() * mask).sum())
        total.backward()
        ntok = float(mask.sum())
        engine = torch.tensor([lp for s in mb for lp, m in zip(s.rollout_logprobs, s.loss_mask) if m],
                              dtype=torch.float32, device=self.device)
        # index order is row-major over (sample, position), the same order as this flattening.
        sums["logprob_diff/sum"] += float((logp_flat.detach() - engine).abs().sum())
        sums["loss/policy"] += float(loss.detach())
        sums["entropy/sum"] += float(ent_flat.sum())
        sums["clip/count"] += st["clip/fraction"] * ntok
        sums["tokens"] += ntok

    def _grad_norm(self) -> float:
        norms = [p.grad.detach().float().norm() for p in self.model.parameters() if p.grad is not None]
        return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0

    # ---- weights & checkpoints ----------------------------------------------------------
    def export_weights(self, dtype: str = "bfloat16") -> str:
        """Write the policy's weights to one safetensors file in shared memory; return its path."""
        from safetensors.torch import save_file

        dt = DTYPES[dtype]
        sd = {k: v.detach().to("cpu", dt, copy=True).contiguous() for k, v in self.model.state_dict().items()}
        head = self.model.get_output_embeddings()
        if head is not None:  # always send lm_head: a tied head is otherwise left stale in vLLM
            sd["lm_head.weight"] = head.weight.detach().to("cpu", dt, copy=True).contiguous()
        path = self.shm_dir / "policy.safetensors"
        tmp = self.shm_dir / f".policy.{os.getpid()}.tmp"
        save_file(sd, str(tmp))
        os.replace(tmp, path)
        return str(path)

    def logprobs(self, prompt: list[int], continuation: list[int]) -> list[float]:
        """The policy's logprobs of ``continuation`` after ``prompt`` (no grad, same precision as training)."""
        if not continuation:
            return []
        s = Sample(list(prompt) + list(continuation), len(prompt), [1] * len(continuation), [0.0] * len(continuation), 0.0, "")
        with torch.no_grad(), self._autocast():
            logits, targets, _ = self._response_logits(self.model, [s])
            return token_logprobs(logits, targets).tolist()

    def save_checkpoint(self, path: str) -> None:
        """Model (HF folder), tokenizer, optimizer and RNG states into folder ``path``."""
        p = Path(path)
        p.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(p / "model")
        self.tokenizer.save_pretrained(p / "model")
        torch.save({"optimizer": self.opt.state_dict(), "steps_done": self.steps_done,
                    "torch_rng": torch.get_rng_state(), "python_rng": random.getstate()}, p / "learner_state.pt")

    def load_checkpoint(self, path: str) -> None:
        from safetensors.torch import load_file

        p = Path(path)
        sd = load_file(str(p / "model" / "model.safetensors"))
        self.model.load_state_dict(sd, strict=False)
        st = torch.load(p / "learner_state.pt", weights_only=False)
        self.opt.load_state_dict(st["optimizer"])
        self.steps_done = st["steps_done"]
        torch.set_rng_state(st["torch_rng"])
        random.setstate(st["python_rng"])

    def shutdown(self) -> None:
        shutil.rmtree(self.shm_dir, ignore_errors=True)
