"""The forward pass: the policy's (or the reference's, or a critic trunk's) hidden states and log-probs at the
positions that predict response tokens, and nowhere else.

``Forward(model, samples)`` returns an ``Outputs`` record: hidden states, log-probs, entropy (when asked) for the
N masked response tokens of a list of samples, in row-major (sample, position) order, with their place in the
``[B, T]`` response grid, and, when asked, the model's auxiliary loss from its outputs (an MoE's router
load-balancing loss, ``rl.algos.router``: the trunk then returns its router logits). Only these positions go
through ``lm_head`` (``rl.trainer.logits.head_logprobs``: chunked with ``learner.logits_chunk_tokens``, at the
sampling temperature). Layouts of the trunk's calls:

* full (``learner.share_prompt: false``): every sample's whole sequence, padded to the longest, in one call;
* packed (``share_prompt``, the default layout): a group's prompt once with its responses packed after it,
  one call per group (``rl.trainer.packing``, ``rl.trainer.packed_attention``);
* ``Forward.layout`` runs the shared-prompt groups: ``PackedLayout`` here; the benches' padded layout
  (``bench/padded_layout.py``: the prompt into a key/value cache, then the responses padded) takes its place
  where they and the tests compare it with packed, and lives there only.

On an MoE model a call can force each token's experts (routing replay, ``learner.routing_replay``) and record
the experts its routers selected, per sample (``Forward.rows`` maps the routers' rows to samples and
positions; ``rl.trainer.moe``, ``rollout.routing``).

Sharded models run inside their root (``rl.trainer.fsdp.Lockstep``) with dummy calls that keep the ranks in
step. No loss, no optimizer: the learner computes what the objective needs from these outputs.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import torch

from rl.algos.batch import Sample
from rl.algos.router import RouterCall, load_balancing_loss, router_spec
from rl.trainer import moe, packing
from rl.trainer.logits import Entropy, head_logprobs
from rollout.routing import capture_routing, replay_routing, routers


@dataclass
class Outputs:
    """What one forward computed for the N masked response tokens of its samples, in row-major (sample, position)
    order: ``hidden`` [N, H], ``logp`` [N] float32, ``entropy`` [N] (None unless asked), ``targets`` [N],
    ``index`` [N] (their place in the ``[B, T]`` response grid), ``aux_loss`` (a scalar: the routers'
    load-balancing loss, None unless asked), ``pad`` (a sharded model's zero scalar to add to a loss, else None).
    All but ``pad`` None for no samples (``Outputs.none``)."""

    hidden: torch.Tensor | None
    logp: torch.Tensor | None
    entropy: torch.Tensor | None
    targets: torch.Tensor | None
    index: torch.Tensor | None
    aux_loss: torch.Tensor | None
    pad: torch.Tensor | None
    routing: list[torch.Tensor] | None = None

    @classmethod
    def none(cls) -> "Outputs":
        """What a call on no samples computed: nothing (a sharded rank's dummy calls set ``pad``)."""
        return cls(None, None, None, None, None, None, None)


class Forward:
    """The forward pass under the recipe's ``learner`` section ``cfg``, on ``device``; ``lock``: the sharded
    ranks' lockstep; ``pad_id``: the padding token; ``temperature``: the sampling temperature (> 0)."""

    def __init__(self, cfg: Any, lock: Any, device: torch.device, pad_id: int, temperature: float) -> None:
        self.cfg, self.lock, self.device, self.pad_id, self.temperature = cfg, lock, device, pad_id, temperature
        # With share_prompt: how a micro-batch's groups run (PackedLayout; the benches swap in bench/padded_layout.py)
        self.layout: Any = PackedLayout()
        self._router: list[RouterCall] | None = None  # while a call records router logits (``aux``)

    def logprobs(
        self, model: Any, samples: list[Sample], temperature: float | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs at response positions only: (logp [N] float32, targets [N]); see ``hidden``.
        For passes without a backward (reference, inspection): a sharded model's padding is dropped."""
        out = self(model, samples, temperature=temperature)
        return out.logp, out.targets

    def __call__(
        self,
        model: Any,
        samples: list[Sample],
        entropy: Entropy = "none",
        temperature: float | None = None,
        aux: bool = False,
        routing: list[torch.Tensor] | None = None,
        record: bool = False,
    ) -> Outputs:
        """What ``model`` computes on ``samples`` (an ``Outputs``; its tensors None when ``samples`` is empty).

        The vocabulary-sized logits are computed through ``lm_head`` and dropped inside
        (``rl.trainer.logits.head_logprobs``: in chunks of ``learner.logits_chunk_tokens``, each
        recomputed in the backward). Runs inside the root of a sharded model
        (``rl.trainer.fsdp.Lockstep.root``); ``pad`` (None unless sharded) is the zero scalar of the
        dummy calls that keep the ranks in step, to add to a loss before its backward. ``samples``
        may be empty (a rank with fewer micro-batches). Log-probs and entropy are of the logits divided by
        ``temperature`` (default: the sampling temperature, ``temperature`` given at construction).
        ``aux``: also the routers' load-balancing loss over every token the trunk ran (``rl.algos.router``;
        the model must be an MoE, ``router_spec``). ``routing``: per sample, the experts to force (routing
        replay, ``learner.routing_replay``); ``record``: return the experts the routers selected (after any
        forcing) per sample in ``Outputs.routing``.
        """
        temp = self.temperature if temperature is None else temperature

        def run() -> Outputs:
            if not samples:
                return Outputs.none()
            self._router = [] if aux else None
            try:
                (hidden, targets, index), taken = self._routed(model, samples, routing, record)
                calls = self._router
            finally:
                self._router = None
            head = model.get_output_embeddings()
            logp, ent = head_logprobs(head, hidden, targets, self.cfg.logits_chunk_tokens, entropy, temp)
            return Outputs(hidden, logp, ent, targets, index, self._aux_loss(model, calls), None, taken)

        out, pad = self.lock.root(model, run, self.trunk_calls(samples))
        out.pad = pad
        return out

    def _routed(
        self, model: Any, samples: list[Sample], routing: list[torch.Tensor] | None, record: bool
    ) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], list[torch.Tensor] | None]:
        """``hidden`` on ``samples``, with ``routing`` forced and, with ``record``, the routing taken per sample."""
        if routing is None and not record:
            return self.hidden(trunk(model), samples), None
        rows = self.rows(samples)
        with ExitStack() as stack:
            if routing is not None:
                rs = routers(model)
                if not rs:
                    raise ValueError(f"routing replay needs an MoE model; {type(model).__name__} has no router")
                stack.enter_context(replay_routing(model, moe.gather(routing, rows, (len(rs), rs[0].top_k))))
            cap = stack.enter_context(capture_routing(model)) if record else None
            out = self.hidden(trunk(model), samples)
        taken = moe.scatter(cap.routing(), rows, [len(s.input_ids) for s in samples]) if cap is not None else None
        return out, taken

    def rows(self, samples: list[Sample]) -> moe.Rows:
        """Per row the routers see in ``hidden``'s trunk calls (their flattened tokens, in call order), the
        (sample index, position) pairs it holds: full layout, every sample padded to the longest ([] for
        padding); packed, per group its prompt once (standing for every member's) then each response but its
        last token."""
        if not self.cfg.share_prompt:
            L = max(len(s.input_ids) for s in samples)
            return [[(g, p)] if p < len(s.input_ids) else [] for g, s in enumerate(samples) for p in range(L)]
        if not isinstance(self.layout, PackedLayout):
            raise ValueError(f"routing capture and replay know the packed layout, not {type(self.layout).__name__}")
        out: moe.Rows = []
        for g in packing.prompt_groups(samples):
            p = samples[g[0]].prompt_len
            out += [[(b, q) for b in g] for q in range(p)]
            for b in g:
                out += [[(b, q)] for q in range(p, len(samples[b].input_ids) - 1)]
        return out

    @staticmethod
    def _aux_loss(model: Any, calls: list[RouterCall] | None) -> torch.Tensor | None:
        """The load-balancing loss of the recorded router logits (None when not asked for)."""
        if calls is None:
            return None
        spec = router_spec(model.config)
        if spec is None or not calls:
            raise ValueError(
                f"the auxiliary loss needs an MoE model's router logits; {type(model).__name__} has no routers "
                "(or its layout's trunk calls record none)"
            )
        return load_balancing_loss(calls, *spec)

    def trunk(self, base: Any, rows: torch.Tensor | None = None, **kwargs: Any) -> Any:
        """One trunk call (``Lockstep.trunk``); while ``__call__`` records router logits, asked for and kept with
        ``rows`` (which of the call's flattened rows are real tokens; None: all)."""
        if self._router is None:
            return self.lock.trunk(base, **kwargs)
        out = self.lock.trunk(base, output_router_logits=True, **kwargs)
        if getattr(out, "router_logits", None) is None:
            raise ValueError(f"{type(base).__name__} returned no router logits: not an MoE model")
        self._router.append((out.router_logits, rows))
        return out

    def trunk_calls(self, samples: list[Sample]) -> int:
        """How many trunk forwards ``hidden`` makes on ``samples`` (a sharded model checks it)."""
        if not samples:
            return 0
        if not self.cfg.share_prompt:
            return 1
        groups = packing.prompt_groups(samples)
        return self.layout.trunk_calls([max(len(samples[b].loss_mask) for b in g) for g in groups])

    def unit_cost(self, group: list[Sample]) -> int:
        """Tokens the trunk computes for ``group`` (samples of one prompt, or any with ``share_prompt`` off: each
        its full sequence, padded to the longest)."""
        if not self.cfg.share_prompt:
            return len(group) * max(len(s.input_ids) for s in group)
        return self.layout.unit_cost(group)

    def hidden(self, base: Any, samples: list[Sample]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Final hidden states of the transformer ``base`` at the positions predicting response tokens.

        Returns (hidden [N, H], targets [N], index [N] into a [B, T] response grid) where N
        counts masked response tokens, in row-major (sample, position) order, and T is the
        longest response in ``samples``. With ``learner.share_prompt``, samples with the same
        prompt (a GRPO group) run the prompt once, as ``layout`` runs them (packed: in one call with their
        responses after it, ``rl.trainer.packing``). Gradients still flow through the prompt. Otherwise every
        sample runs its full sequence.
        """
        T = max(len(s.loss_mask) for s in samples)
        if not self.cfg.share_prompt:
            return self._full(base, samples, list(range(len(samples))), T)
        groups = [([samples[b] for b in g], g) for g in packing.prompt_groups(samples)]
        hs, tg, ix = zip(*self.layout.hidden(self, base, groups, T))
        hidden, targets, index = torch.cat(hs), torch.cat(tg), torch.cat(ix)
        order = torch.argsort(index)  # row-major (sample, position) order, whatever the grouping
        return hidden[order], targets[order], index[order]

    @staticmethod
    def values(head: torch.nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
        """Scalar values [N] (float32) from hidden states [N, H], in the head's dtype, outside autocast."""
        with torch.autocast(hidden.device.type, enabled=False):
            return head(hidden.to(head.weight.dtype)).squeeze(-1).float()

    def select(
        self, members: list[Sample], rows_b: list[int], T: int
    ) -> tuple[list[int], list[int], torch.Tensor, torch.Tensor]:
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
        return (
            g_idx,
            j_idx,
            torch.tensor(tgt, dtype=torch.long, device=dev),
            torch.tensor(ix, dtype=torch.long, device=dev),
        )

    def _full(self, base: Any, members: list[Sample], rows_b: list[int], T: int):
        L = max(len(s.input_ids) for s in members)
        ids = torch.full((len(members), L), self.pad_id, dtype=torch.long)
        att = torch.zeros((len(members), L), dtype=torch.long)
        for g, s in enumerate(members):
            ids[g, : len(s.input_ids)] = torch.tensor(s.input_ids)
            att[g, : len(s.input_ids)] = 1
        att = att.to(self.device)
        hidden = self.trunk(
            base, att.reshape(-1).bool(), input_ids=ids.to(self.device), attention_mask=att
        ).last_hidden_state
        g_idx, j_idx, tgt, ix = self.select(members, rows_b, T)
        # The hidden state at absolute position prompt_len + j - 1 predicts response token j.
        pos = [members[g].prompt_len + j - 1 for g, j in zip(g_idx, j_idx)]
        return (
            hidden[
                torch.tensor(g_idx, dtype=torch.long, device=self.device),
                torch.tensor(pos, dtype=torch.long, device=self.device),
            ],
            tgt,
            ix,
        )


class PackedLayout:
    """The shared-prompt layout the learner runs (``Forward.layout``): each group (samples of one prompt) in one
    trunk call, its prompt once and its responses packed after it without padding (``rl.trainer.packing``).
    Another layout with the same three methods can take its place (``bench/padded_layout.py``, for the benches
    and tests that compare the two)."""

    @staticmethod
    def trunk_calls(longest: list[int]) -> int:
        """Trunk calls for groups whose longest responses are ``longest``: one per group."""
        return len(longest)

    @staticmethod
    def unit_cost(group: list[Sample]) -> int:
        """Tokens one group computes: its prompt once, its responses but their last tokens."""
        return packing.packed_length(group)

    def hidden(
        self, fwd: Forward, base: Any, groups: list[tuple[list[Sample], list[int]]], T: int
    ) -> list[tuple[Any, ...]]:
        """Each group in one trunk call: its prompt once, its responses packed after it (``rl.trainer.packing``).

        The token embeddings of all the groups are looked up in one call: the embedding's backward then
        builds its vocabulary-sized gradient once per micro-batch, not once per group (on a CPU each fresh
        [V, H] zero tensor also pays its page faults; bench/RESULTS.md, "The learner step on jemalloc").
        """
        # An additive mask in the trunk's parameter dtype (autocast casts it with q, k, v), made once for every layer.
        dtype = next(base.parameters()).dtype
        packs = [packing.pack(members, rows_b, T, fwd.device, mask_dtype=dtype) for members, rows_b in groups]
        embeds = base.get_input_embeddings()(torch.cat([pk.input_ids for pk in packs], dim=1))
        out = []
        for pk, emb in zip(packs, embeds.split([pk.input_ids.shape[1] for pk in packs], dim=1)):
            # The mask stays for a model without the mask-free attention (rl.trainer.packed_attention) and CUDA.
            hidden = fwd.trunk(
                base,
                inputs_embeds=emb,
                attention_mask=pk.mask,
                position_ids=pk.position_ids,
                packed_segments=pk.segments,
            ).last_hidden_state
            out.append((hidden[0, pk.cols], pk.targets, pk.index))
        return out


def trunk(model: Any) -> Any:
    """The transformer of a causal LM (``model.model`` for Llama/Qwen2), or ``model`` itself if it is one."""
    return getattr(model, model.base_model_prefix, model)
