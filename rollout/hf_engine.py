"""An in-process Transformers engine with ``VLLMEngine``'s interface: generate token ids, reload weights, score.

It samples one request at a time with its own ``torch.Generator`` seeded by the request's
seed, so a request's sample depends on its seed and the weights only, never on the rest of
the batch. Meant for the tiny test models and the in-process runtime
(``rl.driver.local_runtime``): it is not fast, has no batching and no prefix cache; real
runs use vLLM. Log-probs are the sampled tokens' under the distribution they were drawn from
(the logits divided by the temperature, truncated to the top-p nucleus and renormalised; the raw
logits' when greedy), like ``VLLMEngine`` with vLLM's ``processed_logprobs``. ``score`` gives raw
log-probs (temperature 1). On a mixture-of-experts model every ``Generation`` carries the experts each
token was routed to (``Generation.routing``, captured through hooks on the routers: ``rollout.routing``),
the engine side of routing replay R3 (docs/moe.md). This module does not know about tasks, envs or rewards.

It can pause (partial rollouts, ``rollout.partial``): ``generate`` checks its ``gate`` between tokens and, once
an interrupt is requested, returns each unfinished completion's tokens so far (``finish_reason`` "interrupted").
A request resumed after ``offsets[i]`` kept tokens (prompt + kept tokens, the remaining budget) samples exactly
what the uninterrupted request would have on the same weights, up to the floating-point difference between
running the kept tokens in one pass and one at a time: its generator skips the draws the kept tokens used
(``torch.multinomial`` of one sample draws one exponential per vocabulary entry, whatever the probabilities), and
its stop strings are matched on the kept tokens' text and the new text together.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from envs.types import Generation, Sampling
from rollout.partial import INTERRUPTED, PauseGate
from rollout.routing import capture_routing, is_moe

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFEngine:
    """A causal LM from ``model_path`` on CPU (or CUDA when present). Not thread-safe."""

    def __init__(self, model_path: str, *, dtype: str = "float32", seed: int = 0, max_model_len: int = 2048) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r}: expected one of {sorted(DTYPES)}")
        self.model_path, self.seed, self.max_model_len = model_path, seed, max_model_len
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=DTYPES[dtype]).to(self.device).eval()
        self._adapters = 0  # LoRA adapters loaded so far (load_adapter names each by its number)
        self.tokenizer = tok = AutoTokenizer.from_pretrained(model_path)
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if tok.eos_token_id is not None:
            eos.add(tok.eos_token_id)
        self.eos = eos
        self.moe = is_moe(self.model)  # generations carry their routing
        self.gate = PauseGate()  # partial rollouts: interrupted between tokens, resumed on new weights

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        sampling: Sampling,
        seeds: list[int] | None = None,
        stops: list[list[str]] | None = None,
        offsets: list[int] | None = None,
    ) -> list[Generation]:
        """One completion per prompt, in order; ``seeds[i]`` (default ``seed + i``) seeds prompt i's sampling.
        ``stops[i]``: prompt i's completion ends with the token after which its text holds one of
        these strings (as vLLM's ``stop`` with ``include_stop_str_in_output``). ``offsets[i]`` > 0: prompt i ends
        with that many tokens of an interrupted completion, which this one continues (module docstring).
        Waits while the gate is closed; an interrupt stops it between tokens (completions "interrupted")."""
        with self.gate.use():
            return self._generate(prompts, sampling, seeds, stops, offsets)

    def _generate(
        self,
        prompts: list[list[int]],
        sampling: Sampling,
        seeds: list[int] | None,
        stops: list[list[str]] | None,
        offsets: list[int] | None,
    ) -> list[Generation]:
        out = []
        for i, p in enumerate(prompts):
            room = sampling.max_model_len - len(p)
            if room < 1:
                raise ValueError(
                    f"prompt {i} has {len(p)} tokens, no room under max_model_len={sampling.max_model_len}"
                )
            seed = int(seeds[i]) if seeds is not None else self.seed + i
            stop = list(stops[i]) if stops else []
            offset = int(offsets[i]) if offsets else 0
            args = (p, min(sampling.max_new_tokens, room), sampling, seed % (2**31), stop, offset)
            out.append(self._sample_routed(*args) if self.moe else self._sample(*args))
        return out

    def _sample_routed(self, prompt: list[int], *args: Any) -> Generation:
        """``_sample`` with the routing of every token run through the model (a compact numpy array)."""
        with capture_routing(self.model) as cap:
            g = self._sample(prompt, *args)
        if g.finish_reason == INTERRUPTED:
            return g  # its continuation runs these tokens again and reports their routing
        routing = cap.routing().numpy()
        if routing.shape[0] != len(prompt) + len(g.token_ids) - 1:
            raise RuntimeError(f"routing of {routing.shape[0]} tokens for {len(prompt)} + {len(g.token_ids)} - 1")
        return replace(g, routing=routing)

    def _sample(
        self, prompt: list[int], max_tokens: int, sampling: Sampling, seed: int, stop: list[str], offset: int = 0
    ) -> Generation:
        """One completion; ``offset``: the last ``offset`` prompt tokens are an interrupted completion's, whose
        draws the generator skips and whose text the stop strings are matched with."""
        gen = torch.Generator().manual_seed(seed)
        kept = list(prompt[len(prompt) - offset :]) if offset else []
        if kept and sampling.temperature > 0:
            vocab = self.model.get_output_embeddings().weight.shape[0]
            for _ in kept:  # the draws of the kept tokens (see the module docstring)
                torch.empty(vocab, dtype=torch.float32).exponential_(1, generator=gen)
        ids: list[int] = []
        lps: list[float] = []

        def done(reason: str) -> Generation:
            return Generation(ids, lps, reason, versions=[self.gate.version] * len(ids))

        if self.gate.requested:
            return done(INTERRUPTED)
        res = self.model(torch.tensor([prompt], device=self.device), use_cache=True)
        for _ in range(max_tokens):
            logits = res.logits[0, -1].float().cpu()
            tok, logp = _pick(logits, sampling, gen)
            ids.append(tok)
            lps.append(logp)
            if tok in self.eos or (stop and any(s in self.tokenizer.decode(kept + ids) for s in stop)):
                return done("stop")
            if len(ids) == max_tokens:
                break  # the last token is not run through the model: nothing reads its logits
            if self.gate.requested:
                return done(INTERRUPTED)
            res = self.model(
                torch.tensor([[tok]], device=self.device), past_key_values=res.past_key_values, use_cache=True
            )
        return done("length")

    @torch.no_grad()
    def score(self, prompt: list[int], continuation: list[int]) -> list[float]:
        """Log-probs the current weights give to ``continuation`` after ``prompt``."""
        ids = list(prompt) + list(continuation)
        logp = torch.log_softmax(self.model(torch.tensor([ids], device=self.device)).logits[0].float(), -1)
        return [float(logp[i - 1, ids[i]]) for i in range(len(prompt), len(ids))]

    def load_weights(self, path: str) -> None:
        """Load every weight of the safetensors file at ``path`` (the learner's export) in place."""
        from safetensors.torch import load_file

        sd = load_file(path)
        own = self.model.state_dict()
        unknown = sorted(set(sd) - set(own))
        if unknown:
            raise KeyError(f"{path}: tensors {unknown[:5]} are not in the model {self.model_path}")
        missing = sorted(set(own) - set(sd))
        if missing:
            raise KeyError(f"{path}: the model's tensors {missing[:5]} are missing from the file")
        with torch.no_grad():
            for k, v in sd.items():
                own[k].copy_(v)
        self.gate.loaded()

    def load_adapter(self, path: str) -> None:
        """Serve the LoRA adapter in the ``peft`` folder ``path`` over the base weights (``VLLMEngine.load_adapter``'s
        counterpart): the first call wraps the model in a ``PeftModel``, later ones replace the adapter."""
        from peft import PeftModel

        self._adapters += 1
        name = f"policy-{self._adapters}"
        if isinstance(self.model, PeftModel):
            old = self.model.active_adapter
            self.model.load_adapter(path, adapter_name=name, is_trainable=False)
            self.model.set_adapter(name)
            self.model.delete_adapter(old)  # its own modules only: the base stays
        else:
            self.model = PeftModel.from_pretrained(self.model, path, adapter_name=name, is_trainable=False).eval()
        self.gate.loaded()

    def shutdown(self) -> None:
        self.model = None  # type: ignore[assignment]


def _pick(logits: torch.Tensor, sampling: Sampling, gen: torch.Generator) -> tuple[int, float]:
    """(token, its log-prob under the distribution it was drawn from): greedy at temperature 0 (the raw
    log-prob); else a sample from the tempered, top-p-truncated distribution, renormalised over the nucleus."""
    if sampling.temperature <= 0:
        tok = int(torch.argmax(logits))
        return tok, float(torch.log_softmax(logits, -1)[tok])
    logp = torch.log_softmax(logits / sampling.temperature, -1)
    probs = logp.exp()
    if sampling.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, 0) - sorted_p < sampling.top_p  # the smallest prefix reaching top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
        logp = logp - torch.log(probs.sum())  # renormalised over the nucleus (the sampled token is in it)
    tok = int(torch.multinomial(probs, 1, generator=gen))
    return tok, float(logp[tok])


ENGINES = ("hf", "vllm")


def make_engine(kind: str, model_path: str, **kwargs: Any) -> Any:
    """``hf``: :class:`HFEngine` (dtype, seed, max_model_len); ``vllm``: ``rollout.engine.VLLMEngine`` (all its kwargs)."""
    if kind == "hf":
        keep = {k: kwargs[k] for k in ("dtype", "seed", "max_model_len") if k in kwargs}
        return HFEngine(model_path, **keep)
    if kind == "vllm":
        from rollout.engine import VLLMEngine

        return VLLMEngine(model_path, **kwargs)
    raise ValueError(f"engine {kind!r}: expected one of {ENGINES}")
