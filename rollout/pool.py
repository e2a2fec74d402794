"""A rollout worker (one vLLM engine + envs), and freeing what a dead worker's engine left on its node.

``RolloutWorker`` is a plain class: tests run it in-process, the in-process runtime runs one in the driver,
and ``rl.driver.actors.rollout.RolloutPool`` runs N of them as Ray actors. It generates episodes, loads the
weights each transport delivers (a safetensors file, its bytes, a LoRA adapter folder or its files, a CUDA IPC
export, a collective weight stream), and reports what it holds outside its process (``leftovers``). Engines are shut down explicitly in
``shutdown()``; otherwise each leaves its shared-memory segments in /dev/shm.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
from typing import Any

from envs.base import resolve
from envs.stacks import child_stacks
from envs.stacks import register as register_stacks
from envs.types import Sampling, Task, Trajectory
from rollout.engine import VLLMEngine
from rollout.reaper import descendants, reap, stamped
from rollout.shm import unlink_unmapped
from rollout.episode import run_episodes
from rollout.tools_prompt import check_mode
from rollout.weights import (
    BlobWeights,
    CollectiveJoin,
    CollectiveWeights,
    DeltaWeights,
    FileWeights,
    IpcWeights,
    WeightUpdate,
)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


class RolloutWorker:
    """One engine plus the env classes of each domain. Not thread-safe."""

    def __init__(
        self,
        model_path: str,
        env_specs: list[tuple[str, str, dict[str, Any]]],
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
        engine: Any = None,
        stops: dict[str, list[str]] | None = None,
        env_workers: int = 0,
        tools_in_prompt: str = "auto",
        partial_rollouts: bool = False,
    ) -> None:
        """``engine``: an engine object to use instead of starting a ``VLLMEngine`` (the in-process runtime
        passes a ``rollout.hf_engine.HFEngine``); the engine keyword arguments are then unused.
        ``lora_rank`` > 0: the engine serves the learner's LoRA adapter (``load_adapter``).
        ``stops[domain]``: strings that end a policy turn of that domain (``rollout.envs[].stop``).
        ``env_workers``: env calls run on up to this many threads at once (``rollout.env_workers``;
        0 = one per CPU this process may run on). ``tools_in_prompt``: how tool schemas reach the prompt
        (``rollout.tools_in_prompt``, :mod:`rollout.tools_prompt`); ``template`` with a chat template that
        does not render tools raises ``ValueError`` here, before any rollout. ``partial_rollouts``
        (``rollout.partial_rollouts``): an engine that cannot pause (no ``gate``) raises ``ValueError`` here."""
        from transformers import AutoTokenizer

        register_stacks("rollout_worker")  # SIGUSR1 -> this process's stacks in the run's stacks/ (a hung call)
        self.envs = {domain: (resolve(cls), dict(kwargs)) for domain, cls, kwargs in env_specs}
        self.stops = dict(stops or {})
        self.env_workers = env_workers or usable_cpus()
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        check_mode(self.tokenizer, tools_in_prompt)
        self.tools_in_prompt = tools_in_prompt
        # vLLM's engine core and the other Python processes started with the engine register their stack dumps too
        with child_stacks("engine_proc"):
            self.engine = (
                engine
                if engine is not None
                else VLLMEngine(
                    model_path,
                    dtype=dtype,
                    seed=seed,
                    max_model_len=max_model_len,
                    kv_cache_gib=kv_cache_gib,
                    gpu_memory_utilization=gpu_memory_utilization,
                    tensor_parallel_size=tensor_parallel_size,
                    enable_sleep_mode=enable_sleep_mode,
                    engine_kwargs=engine_kwargs,
                    lora_rank=lora_rank,
                )
            )
        if partial_rollouts:
            self._gate()  # an engine that cannot pause is refused now, before any rollout
        # Where weights that arrive through the object store (learner on another node) are put.
        self._blob = (
            f"/dev/shm/jointrl-weights-{os.getpid()}.safetensors"
            if os.path.isdir("/dev/shm")
            else os.path.join(tempfile.gettempdir(), f"jointrl-weights-{os.getpid()}.safetensors")
        )
        # The engine core's IPC segments in /dev/shm (``VLLMEngine.shm_held``: never a model file it mapped from
        # there) and that file, and the engine's processes: if this process is killed nobody unlinks them, so the
        # pool does it on this node after the death (``free_dead_engine``), killing whatever of the engine
        # outlived it first.
        self._shm = (list(self.engine.shm_held) if engine is None else []) + [self._blob]
        self._procs = stamped(descendants(os.getpid())) if engine is None else []
        self._adapter_seq = 0  # adapter folders received from another node (load_adapter_blob)
        self._held = ""  # the identity (DeltaWeights.digest) of the export in self._blob, "" when unknown
        self._torn = ""  # why this engine's weights are not a complete export (a weight stream that failed)

    def _make_env(self, domain: str) -> Any:
        if domain not in self.envs:
            raise KeyError(f"no env configured for domain {domain!r} (rollout.envs has {sorted(self.envs)})")
        cls, kwargs = self.envs[domain]
        return cls(**kwargs)

    def _check_whole(self) -> None:
        if self._torn:
            raise RuntimeError(f"this engine's weights are torn ({self._torn}); it serves again after a full sync")

    def generate(
        self, tasks: list[Task], group_ids: list[int], seeds: list[int], sampling: Sampling
    ) -> list[Trajectory]:
        self._check_whole()
        return run_episodes(
            self.engine,
            self.tokenizer,
            self._make_env,
            tasks,
            group_ids,
            seeds,
            sampling,
            self.stops,
            env_workers=self.env_workers,
            tools_in_prompt=self.tools_in_prompt,
        )

    # -- partial rollouts (rollout.partial): new weights while episodes are generating --

    def interrupt(self, timeout_s: float | None = None) -> None:
        """Stop this worker's generation in flight at its next token and return once its engine is free for a
        weight load (``receive``), then ``resume``. ``generate`` (running on another thread) is not ended: its
        unfinished turns keep their tokens and wait to continue on the new weights, and its env calls keep
        running. ``TimeoutError`` when the engine has not stopped within ``timeout_s`` (nothing is paused then)."""
        self._gate().interrupt(timeout_s)

    def resume(self, version: int | None = None) -> None:
        """Let the interrupted turns continue, on the weights loaded since ``interrupt``; ``version``: their policy
        version, which every token sampled from now on records (None: the engine's count of weight loads).
        Without an interrupt it only sets the version (a run resumed at that step)."""
        self._gate().resume(version)

    def policy_version(self) -> int:
        """The policy version the engine's tokens are recorded with now."""
        return self._gate().version

    def _gate(self) -> Any:
        """The engine's ``rollout.partial.PauseGate``; ``ValueError`` naming the key for an engine without one."""
        gate = getattr(self.engine, "gate", None)
        if gate is None:
            raise ValueError(
                f"rollout.partial_rollouts: the engine {type(self.engine).__name__} cannot pause (it has no "
                "rollout.partial.PauseGate); use the vLLM or HF engine, or partial_rollouts false"
            )
        return gate

    def receive(self, update: WeightUpdate) -> bool:
        """Load what one weight transport delivered (``rollout.weights.WeightReceiver``): a weights file or adapter
        folder on this node, their bytes from a learner on another node, only what changed since the previous
        export (``DeltaWeights``), a CUDA IPC export of the learner on this engine's GPU, or the collective
        transport's group to join (``CollectiveJoin``) or stream to take (``CollectiveWeights``). False: a delta
        that could not be applied exactly (nothing was loaded; the caller sends the full weights)."""
        if isinstance(update, DeltaWeights):
            return self.load_weights_delta(update)
        if isinstance(update, CollectiveJoin):
            self.engine.join_weight_group(update)
            return True
        if isinstance(update, CollectiveWeights):
            self.load_weights_stream(update)
        elif isinstance(update, FileWeights):
            (self.load_adapter if update.adapter else self.load_weights)(update.path)
        elif isinstance(update, BlobWeights):
            if update.adapter:
                if not isinstance(update.data, dict):
                    raise TypeError("an adapter from another node arrives as {file name: bytes}")
                self.load_adapter_blob(update.data)
            else:
                if not isinstance(update.data, bytes):
                    raise TypeError("a weights file from another node arrives as bytes")
                self.load_weights_blob(update.data, update.digest)
        elif isinstance(update, IpcWeights):
            self.load_weights_ipc(update)
        else:
            raise TypeError(f"no weight transport delivers a {type(update).__name__}")
        self._torn = ""  # complete weights again
        return True

    def load_weights(self, path: str) -> None:
        self.engine.load_weights(path)

    def load_weights_stream(self, update: CollectiveWeights) -> None:
        """Weight stream ``update`` of the joined group (``rollout.collective``), loaded as it arrives. Until it
        ended with the learner's checksum this engine refuses to generate or score: a stream that broke midway
        (a peer died, a checksum differed) leaves weights that are neither the old export nor the new one."""
        from rollout.collective import STALE, StaleStream

        before, self._torn = self._torn, f"weight stream {update.version} did not complete"
        try:
            self.engine.load_weights_stream(update)
        except Exception as e:
            if isinstance(e, StaleStream) or STALE in str(e):
                self._torn = before  # refused from its header: nothing was loaded
            raise

    def load_weights_ipc(self, update: IpcWeights) -> None:
        """Weights from a learner rank on this engine's GPU (``Learner.export_ipc``), mapped, not copied."""
        self.engine.load_weights_ipc(update)

    def load_weights_blob(self, blob: bytes, digest: str = "") -> None:
        """Weights as the bytes of a safetensors file (sent through Ray's object store from a learner on
        another node): written to this node's shared memory, then loaded like a local file. ``digest``: the
        export's identity, which a later ``DeltaWeights`` names as its base."""
        self._held = ""
        tmp = self._blob + ".tmp"
        with open(tmp, "wb") as f:
            f.write(blob)
        os.replace(tmp, self._blob)
        self.engine.load_weights(self._blob)
        self._held = digest

    def load_weights_delta(self, update: DeltaWeights) -> bool:
        """Apply only the changed entries onto the export this engine holds (``self._blob``), check every tensor
        against the learner's checksums, then load the file. False, with nothing loaded and the held export
        forgotten, when the engine does not hold ``update.base`` or a checksum differs (a drift): the caller
        then sends the full weights."""
        from rollout.weight_delta import apply_delta

        if not update.base or update.base != self._held or not os.path.exists(self._blob):
            return False
        self._held = ""  # until the patched file is verified: a failure below leaves nothing to build on
        if not apply_delta(self._blob, update):
            return False
        self.engine.load_weights(self._blob)
        self._held = update.digest
        return True

    def load_adapter(self, path: str) -> None:
        """Serve the LoRA adapter folder ``path`` (the learner's ``export_adapter``) over the base weights."""
        self.engine.load_adapter(path)

    def load_adapter_blob(self, files: dict[str, bytes]) -> None:
        """An adapter folder as ``{file name: bytes}`` (from a learner on another node): written to a new
        folder on this node (the previous one removed), then loaded like a local folder."""
        self._adapter_seq += 1
        folder = f"{self._blob}.adapter-{self._adapter_seq}"
        os.makedirs(folder, exist_ok=True)
        for name, data in files.items():
            with open(os.path.join(folder, os.path.basename(name)), "wb") as f:
                f.write(data)
        self.engine.load_adapter(folder)
        shutil.rmtree(f"{self._blob}.adapter-{self._adapter_seq - 1}", ignore_errors=True)

    def score(self, prompt: list[int], continuation: list[int]) -> list[float]:
        self._check_whole()
        return self.engine.score(prompt, continuation)

    def sleep(self, level: int = 1) -> None:
        self.engine.sleep(level)

    def wake_up(self) -> None:
        self.engine.wake_up()

    def pid(self) -> int:
        return os.getpid()

    def health(self) -> str | None:
        """None while this worker's engine can serve, else why not. The pool calls it in the ``health``
        concurrency group (its own thread) while ``generate`` runs: the death check of a call in flight."""
        alive = getattr(self.engine, "alive", None)
        return alive() if alive is not None else None

    def engine_pids(self) -> list[int]:
        """Process ids of this worker's engine core processes (tests kill them to inject faults)."""
        return [p.pid for p in getattr(self.engine, "_core_procs", [])]

    def leftovers(self) -> tuple[list[str], list[tuple[int, int]]]:
        """The /dev/shm segments this worker's engine maps, and its engine's processes as ``(pid, start time)``:
        what ``free_dead_engine`` needs, on this worker's node, once this process is dead."""
        return self._shm, self._procs

    def shutdown(self) -> None:
        try:
            self.engine.shutdown()
        finally:
            if os.path.exists(self._blob):
                os.unlink(self._blob)
            for folder in glob.glob(self._blob + ".adapter-*"):  # adapters received from another node
                shutil.rmtree(folder, ignore_errors=True)


class EngineFailure(RuntimeError):
    """A rollout worker kept dying: more than ``max_restarts`` replacements within one call, or an engine that did
    not answer a sleep or wake-up within ``faults.engine_sleep_s``."""


def free_dead_engine(paths: list[str], procs: list[tuple[int, int]], wait_s: float = 0.0) -> list[str]:
    """What a dead rollout worker's engine left on this node: SIGKILL each of ``procs`` (``(pid, start
    time)``, recorded at its start) still running with that start time, with its descendants, then unlink
    ``paths`` once nothing maps them (waiting up to ``wait_s``). Returns the paths still left ([]: freed).

    The worker's reaper (``rollout.reaper``) kills the engine core too, but only its descendants as they are
    when it acts: a core that exits first leaves its own worker process orphaned, holding the segments."""
    reap(procs)
    unlink_unmapped(paths, wait_s)
    return [p for p in paths if os.path.exists(p)]
