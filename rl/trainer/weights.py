"""Weight export: every way the policy's weights reach the engines, behind one interface, ``WeightExport``.

* ``file(dtype)``: one safetensors file in shared memory (``policy.safetensors`` in the learner's ``shm_dir``),
  rewritten in place in one of two memory-mapped slots (``_ShmWeights``) and published by an atomic rename;
* ``ipc(dtype)``: CUDA, one packed buffer on the learner's GPU shared through a CUDA IPC handle;
* ``adapter()``: with LoRA, only the adapters as a ``peft`` folder (``rl.trainer.lora.AdapterExports``);
* ``read(path)``: what an export wrote, as bytes, for engines on other nodes.

Sharded (several learner ranks): every rank calls each export (tensors are gathered one at a time,
``full_tensor``), so no rank holds a full copy of the model; rank 0 writes. ``lm_head.weight`` is always
included (with tied embeddings an engine otherwise keeps a stale head); with LoRA the exported weights are
merged (base + B A) one tensor at a time. This module does not train, and does not load weights into engines
(``rollout.engine`` does).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch

from rl.trainer import fsdp, lora
from rl.trainer.models import DTYPES


class WeightExport:
    """The exports of one learner rank's policy ``model`` (``peft``: its LoRA wrapper, or None) into ``shm_dir``."""

    def __init__(self, model: Any, peft: Any, rank: int, device: torch.device, shm_dir: Path) -> None:
        self.model, self.peft, self.rank, self.device, self.shm_dir = model, peft, rank, device, Path(shm_dir)
        self._adapter_exports = lora.AdapterExports(self.shm_dir)  # adapter()'s folders (no I/O until then)
        self._shm_weights: _ShmWeights | None = None
        self._ipc_buffer: torch.Tensor | None = None

    def file(self, dtype: str = "bfloat16") -> str:
        """Write the policy's weights to one safetensors file in shared memory; return its path.

        The file is ``policy.safetensors`` in ``shm_dir``: every state-dict tensor in ``dtype``,
        plus ``lm_head.weight`` (always: with tied embeddings an engine otherwise keeps a stale
        head). It is written in place into one of two preallocated, memory-mapped files (see
        ``_ShmWeights``): one ``copy_`` per tensor, dtype conversion included, straight into the
        pages the engines read, then published by an atomic rename. A reader never sees a
        partial file, and the file it opened stays unchanged until the export after next.

        Sharded (several learners): every rank must call it. Tensors are gathered one at a time
        (``rl.trainer.fsdp.full_tensors``) and only rank 0 writes them, so no rank ever holds a
        full copy of the model; the other ranks return ``""``.
        """
        tensors = self._tensors()
        dt = DTYPES[dtype]
        out = None
        if self.rank == 0:
            layout = [(k, dt, tuple(v.shape)) for k, v in tensors.items()]
            out = self._shm_weights
            if out is None or not out.fits(self.shm_dir, layout):
                if out is not None:
                    out.close()
                out = self._shm_weights = _ShmWeights(self.shm_dir, "policy.safetensors", layout)
            views = out.begin()
        for key, full, alias in self._stream(tensors):
            if out is not None:
                views[key].copy_(views[alias] if full is None else full)
        return out.publish() if out is not None else ""

    def ipc(self, dtype: str = "bfloat16") -> dict[str, Any]:
        """CUDA: the policy's weights packed into one ``dtype`` buffer on this GPU, shared through a CUDA IPC
        handle; returns what ``rollout.engine.VLLMEngine.load_weights_ipc`` takes (small and picklable).

        For an engine on this learner's GPU (``learner.weight_sync: ipc``, the colocated placement): no
        file and no copy through host memory, the engine's worker maps the buffer and loads from it. The
        buffer is kept (and reused) until the next export, so an engine may read it until then. The same
        tensors as ``file`` (``lm_head.weight`` included). Sharded: every rank must call it
        (tensors are gathered one at a time) and every rank packs its own copy on its own GPU, for the
        engine it shares that GPU with (a bf16 copy of the model per GPU).
        """
        if self.device.type != "cuda":
            raise RuntimeError("export_ipc needs a learner on a CUDA device; CPU engines load export_weights' file")
        tensors = self._tensors()
        dt, place, total = DTYPES[dtype], {}, 0
        for key, t in tensors.items():
            shape = tuple(t.shape)
            place[key] = (shape, total)
            total += -(-math.prod(shape) // 64) * 64  # each tensor 128-byte aligned in the buffer
        buf = self._ipc_buffer
        if buf is None or buf.numel() != total or buf.dtype != dt:
            buf = self._ipc_buffer = None  # the old one freed before the new one is made
            buf = self._ipc_buffer = torch.empty(total, dtype=dt, device=self.device)

        def view(key: str) -> torch.Tensor:
            shape, off = place[key]
            return buf[off : off + math.prod(shape)].view(shape)

        for key, full, alias in self._stream(tensors):
            view(key).copy_(view(alias) if full is None else full)
        torch.cuda.synchronize(self.device)  # the engines read it from other processes, outside this stream
        from torch.multiprocessing.reductions import reduce_tensor

        rebuild, args = reduce_tensor(buf)
        return {"rebuild": rebuild, "args": args, "tensors": [(k, shape, off) for k, (shape, off) in place.items()]}

    def _stream(self, tensors: dict[str, Any]):
        """``(key, tensor, None)`` for each export tensor in turn, full (gathered when sharded, a collective
        every rank must join; a LoRA-merged weight computed only now, one at a time), or ``(key, None, first)``
        for a tensor already given under the key ``first`` (a tied head)."""
        first: dict[int, str] = {}  # id(tensor) -> the key it was first given under
        with torch.no_grad():
            for key, t in tensors.items():
                if id(t) in first:
                    yield key, None, first[id(t)]
                    continue
                first[id(t)] = key
                full = t.full_tensor() if fsdp.is_dtensor(t) else t
                if callable(full):
                    full = full()
                yield key, full.detach(), None
                del full

    def adapter(self) -> str:
        """With LoRA, write only the adapters as a new ``peft`` folder in shared memory; return its path.

        What ``learner.lora.transfer: adapter`` sends the engines instead of ``file``' file
        (``rl.trainer.lora.AdapterExports``: a new folder per call, the last two kept). Sharded: every
        rank must call it (A and B are gathered); rank 0 writes, the others return ``""``.
        """
        if self.peft is None:
            raise RuntimeError("WeightExport.adapter needs LoRA (learner.lora.rank > 0)")
        state = lora.adapter_state(self.peft)  # a collective when sharded
        if self.rank > 0:
            return ""
        return self._adapter_exports.write(self.peft, state)

    def _tensors(self) -> dict[str, Any]:
        """What the engines load, by HF name: the parameters themselves (so that ties stay visible) plus
        ``lm_head.weight``; with LoRA, adapted weights as a zero-argument function computing base + B A
        (``rl.trainer.lora.merged_tensors``), adapters left out."""
        if self.peft is None:
            tensors: dict[str, Any] = dict(self.model.state_dict(keep_vars=True))
        else:
            tensors = dict(lora.merged_tensors(self.model, lazy=True))
        head = self.model.get_output_embeddings()
        if head is not None:
            base = getattr(head, "base_layer", head)  # an adapted lm_head keeps its base weight there
            tensors.setdefault("lm_head.weight", base.weight)
        return tensors

    @staticmethod
    def read(path: str) -> bytes | dict[str, bytes]:
        """What an export wrote, for engines on other nodes (through Ray's object store): a weights file's
        bytes, or an adapter folder's files as ``{file name: bytes}``."""
        p = Path(path)
        if p.is_dir():
            return {f.name: f.read_bytes() for f in sorted(p.iterdir()) if f.is_file()}
        return p.read_bytes()


_ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


class _ShmWeights:
    """A safetensors file in shared memory that is rewritten in place, double-buffered.

    Two slot files (``.<name>.slot0/1``) have a fixed layout (names, dtypes, shapes); each is
    memory-mapped once and its tensors are views into the mapping, so ``write`` is one
    ``copy_`` per tensor: no allocation, no page faults after the first use of a slot, no
    second copy through a serializer. The slot just written is published as ``<name>`` by a
    hard link and an atomic rename; the other slot is written next time, so a file a reader
    opened stays intact until the write after next. Tensors that share storage with one
    already written (a tied ``lm_head``) are copied from its converted bytes.
    """

    def __init__(self, folder: Path, name: str, layout: list[tuple[str, torch.dtype, tuple[int, ...]]]) -> None:
        import json

        self.folder, self.name, self.layout = Path(folder), name, list(layout)
        # safetensors' own order (widest dtype first) keeps every tensor aligned in the file.
        entries = sorted(self.layout, key=lambda e: (-torch.empty((), dtype=e[1]).element_size(), e[0]))
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        self._spans: dict[str, tuple[int, int, torch.dtype, tuple[int, ...]]] = {}
        end = 0
        for key, dt, shape in entries:
            n = math.prod(shape)
            nbytes = n * torch.empty((), dtype=dt).element_size()
            header[key] = {"dtype": _ST_DTYPES[dt], "shape": list(shape), "data_offsets": [end, end + nbytes]}
            self._spans[key] = (end, n, dt, shape)
            end += nbytes
        head = json.dumps(header, separators=(",", ":")).encode()
        head += b" " * (-len(head) % 8)
        self._prefix = len(head).to_bytes(8, "little") + head
        self.size = len(self._prefix) + end
        self._slots: list[tuple[Path, int, Any, dict[str, torch.Tensor]] | None] = [None, None]
        self._next = 0

    def fits(self, folder: Path, layout: list[tuple[str, torch.dtype, tuple[int, ...]]]) -> bool:
        return Path(folder) == self.folder and list(layout) == self.layout

    def _open(self, i: int) -> tuple[Path, int, Any, dict[str, torch.Tensor]]:
        """Slot ``i``'s mapping and tensor views, (re)created when its file is gone or replaced."""
        import mmap

        path = self.folder / f".{self.name}.slot{i}"
        slot = self._slots[i]
        if slot is not None:
            try:
                if os.stat(path).st_ino == slot[1]:
                    return slot
            except FileNotFoundError:
                pass
            self._close_slot(i)
        self.folder.mkdir(parents=True, exist_ok=True)
        try:  # a new inode: a reader of the old file (maybe still published) keeps its bytes
            os.unlink(path)
        except FileNotFoundError:
            pass
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.ftruncate(fd, self.size)
            os.pwrite(fd, self._prefix, 0)
            mm = mmap.mmap(fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            ino = os.fstat(fd).st_ino
        finally:
            os.close(fd)
        base = len(self._prefix)
        views = {}
        for key, (start, n, dt, shape) in self._spans.items():
            t = torch.frombuffer(mm, dtype=dt, count=n, offset=base + start) if n else torch.empty(0, dtype=dt)
            views[key] = t.view(shape)
        slot = self._slots[i] = (path, ino, mm, views)
        return slot

    def write(self, tensors: dict[str, torch.Tensor]) -> str:
        """Copy ``tensors`` (the layout's names; any device/dtype) into the next slot and publish it; return the path."""
        views = self.begin()
        done: dict[tuple[Any, ...], torch.Tensor] = {}
        with torch.no_grad():
            for key, dst in views.items():
                src = tensors[key].detach()
                alias = (
                    src.device,
                    src.untyped_storage().data_ptr(),
                    src.storage_offset(),
                    tuple(src.stride()),
                    tuple(src.shape),
                    src.dtype,
                )
                dst.copy_(done.get(alias, src))
                done.setdefault(alias, dst)
        return self.publish()

    def begin(self) -> dict[str, torch.Tensor]:
        """The next slot's tensor views, to ``copy_`` into one at a time; then ``publish``."""
        return self._open(self._next)[3]

    def publish(self) -> str:
        """Publish the slot ``begin`` handed out (atomic rename); return the published path."""
        i = self._next
        path = self._open(i)[0]
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        tmp = self.folder / f".{self.name}.{os.getpid()}.tmp"
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        os.link(path, tmp)
        os.replace(tmp, self.folder / self.name)
        self._next = 1 - i
        return str(self.folder / self.name)

    def _close_slot(self, i: int) -> None:
        slot = self._slots[i]
        self._slots[i] = None
        if slot is not None:
            slot[3].clear()  # drop the views before the mapping (they export its buffer)
            try:
                slot[2].close()
            except BufferError:  # a view is still referenced elsewhere; the mapping goes with it
                pass

    def close(self) -> None:
        for i in (0, 1):
            self._close_slot(i)
