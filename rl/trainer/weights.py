"""Weight export: the learner side of every way the policy's weights reach the engines.

One interface, :class:`WeightSender` (begin with the layout, one tensor at a time, finish with a
``rollout.weights`` record for the engines), and its implementations, driven by ``WeightExport``:

* ``file(dtype)``: :class:`ShmFileSender`, one safetensors file in shared memory (``policy.safetensors`` in the
  learner's ``shm_dir``), rewritten in place in one of two memory-mapped slots (``_ShmWeights``) and published
  by an atomic rename;
* ``object_store``: the same file, its bytes read by ``read(path)`` and sent through Ray's object store to
  engines on other nodes (routed by ``rl.driver.actors.rollout.RolloutPool``);
* ``ipc(dtype)``: :class:`CudaIpcSender`, CUDA, one packed buffer on the learner's GPU shared through a CUDA
  IPC handle;
* ``adapter()``: with LoRA, only the adapters as a ``peft`` folder (``rl.trainer.lora.AdapterExports``);
* ``collective(dtype, version, bucket_bytes)``: ``rollout.collective.BucketSender``, rank 0 broadcasts the
  tensors in buckets to the engines' workers through the weight group it joined (``join_group``).

The engine side of each is ``rollout.pool.RolloutWorker.receive``.

Sharded (several learner ranks): every rank calls each export (tensors are gathered one at a time,
``full_tensor``), so no rank holds a full copy of the model; rank 0 writes. ``lm_head.weight`` is always
included (with tied embeddings an engine otherwise keeps a stale head); with LoRA the exported weights are
merged (base + B A) one tensor at a time. This module does not train, and does not load weights into engines
(``rollout.engine`` does).
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from rl.trainer import fsdp, lora
from rl.trainer.models import DTYPES
from rollout.weight_delta import BITS, checksum
from rollout.weights import (
    BlobWeights,
    CollectiveWeights,
    DeltaWeights,
    FileWeights,
    IpcWeights,
    JoinFailed,
    WeightUpdate,
)

if TYPE_CHECKING:
    from rollout.weights import CollectiveJoin


class WeightExport:
    """The exports of one learner rank's policy ``model`` (``peft``: its LoRA wrapper, or None) into ``shm_dir``."""

    def __init__(self, model: Any, peft: Any, rank: int, device: torch.device, shm_dir: Path) -> None:
        self.model, self.peft, self.rank, self.device, self.shm_dir = model, peft, rank, device, Path(shm_dir)
        self._adapter_exports = lora.AdapterExports(self.shm_dir)  # adapter()'s folders (no I/O until then)
        self._file_sender: ShmFileSender | None = None
        self._ipc_sender: CudaIpcSender | None = None
        self._group: Any = None  # rollout.collective.WeightGroup: rank 0's membership of the weight group

    def file(self, dtype: str = "bfloat16") -> str:
        """Write the policy's weights to one safetensors file in shared memory; return its path.

        The file is ``policy.safetensors`` in ``shm_dir``: every state-dict tensor in ``dtype``,
        plus ``lm_head.weight`` (always: with tied embeddings an engine otherwise keeps a stale
        head), sent through :class:`ShmFileSender` (the ``file`` transport: one ``copy_`` per tensor
        into a memory-mapped slot of a double buffer, published by an atomic rename). A reader never
        sees a partial file, and the file it opened stays unchanged until the export after next.

        Sharded (several learners): every rank must call it. Tensors are gathered one at a time
        (``rl.trainer.fsdp.full_tensors``) and only rank 0 writes them, so no rank ever holds a
        full copy of the model; the other ranks return ``""``.
        """
        if self._file_sender is None or self._file_sender.dtype != DTYPES[dtype]:
            if self._file_sender is not None:
                self._file_sender.close()
            self._file_sender = ShmFileSender(self.shm_dir, DTYPES[dtype])
        sent = self._send(self._file_sender if self.rank == 0 else None)
        return sent.path if isinstance(sent, FileWeights) else ""

    def ipc(self, dtype: str = "bfloat16") -> IpcWeights:
        """CUDA: the policy's weights packed into one ``dtype`` buffer on this GPU, shared through a CUDA IPC
        handle (:class:`CudaIpcSender`, the ``ipc`` transport); returns what ``rollout.engine.VLLMEngine.load_weights_ipc``
        takes (small and picklable).

        For an engine on this learner's GPU (``learner.weight_sync: ipc``, the colocated placement): no
        file and no copy through host memory, the engine's worker maps the buffer and loads from it. The
        buffer is kept (and reused) until the next export, so an engine may read it until then. The same
        tensors as ``file`` (``lm_head.weight`` included). Sharded: every rank must call it
        (tensors are gathered one at a time) and every rank packs its own copy on its own GPU, for the
        engine it shares that GPU with (a bf16 copy of the model per GPU).
        """
        if self.device.type != "cuda":
            raise RuntimeError("export_ipc needs a learner on a CUDA device; CPU engines load export_weights' file")
        if self._ipc_sender is None or self._ipc_sender.dtype != DTYPES[dtype]:
            self._ipc_sender = CudaIpcSender(self.device, DTYPES[dtype])
        sent = self._send(self._ipc_sender)
        assert isinstance(sent, IpcWeights)
        return sent

    def join_group(self, spec: CollectiveJoin) -> JoinFailed | None:
        """Rank 0: join the ``collective`` transport's weight group as member 0 (it hosts the rendezvous; blocks
        until every engine worker joined). A previous formation's membership is dropped first. A formation that
        fails (a member died first, or ``spec.timeout_s`` passed) is answered with :class:`JoinFailed`, not
        raised: this learner is intact."""
        from rollout import collective

        self._group = None
        try:
            self._group = collective.join(spec, self.device)
        except Exception as e:  # noqa: BLE001 - a member that never joined: the driver syncs by file instead
            return JoinFailed(collective.failure_text(e))
        return None

    def collective(self, dtype: str, version: int, bucket_bytes: int) -> CollectiveWeights | None:
        """Broadcast the policy's weights as stream ``version`` to the weight group's engines, in ``dtype`` and
        buckets of ``bucket_bytes`` (``rollout.collective.BucketSender``: rank 0 holds one bucket beside the
        tensor being packed). Sharded: every rank must call it (tensors are gathered one at a time); rank 0
        sends, the others return None."""
        from rollout.collective import BucketSender

        if self.rank > 0:
            self._send(None)
            return None
        if self._group is None:
            raise RuntimeError("a collective weight export before this learner joined the weight group")
        sent = self._send(BucketSender(self._group, DTYPES[dtype], bucket_bytes, version))
        assert isinstance(sent, CollectiveWeights)
        if sent.broken:  # the membership is closed: the driver forms the group again
            self._group = None
        return sent

    def _send(self, sender: WeightSender | None) -> WeightUpdate | None:
        """Stream the export tensors through ``sender``: begin (the layout, and which keys repeat another's
        tensor), each tensor in turn (or the key of a tensor it already got), finish. ``None``: this rank only
        joins the gathers (sharded, not rank 0)."""
        tensors = self._tensors()
        if sender is not None:
            first: dict[int, str] = {}
            aliases: dict[str, str] = {}
            for k, v in tensors.items():
                if first.setdefault(id(v), k) != k:
                    aliases[k] = first[id(v)]
            sender.begin([(k, tuple(v.shape)) for k, v in tensors.items()], aliases)
        for key, full, alias in self._stream(tensors):
            if sender is None:
                continue
            if full is None:
                sender.alias(key, alias)
            else:
                sender.send(key, full)
        return sender.finish() if sender is not None else None

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

    def metrics(self) -> dict[str, float]:
        """``weights/changed_fraction`` of the last export since the last call (``ChangeCount``; only the writing
        rank measures), or nothing."""
        out: dict[str, float] = {}
        for sender in (self._file_sender, self._ipc_sender):
            if sender is not None:
                out |= sender.changes.take()
        return out

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

    def read_update(self, path: str, delta: bool = False) -> BlobWeights | DeltaWeights:
        """What the last export sent engines on other nodes: its ``DeltaWeights`` from the export before
        (``delta``, when there is one), else ``read(path)`` with the export's identity when deltas are kept.
        The first call with ``delta`` turns delta keeping on for the following exports (rank 0, ``file``)."""
        sender = self._file_sender
        if sender is None or Path(path).is_dir() or str(self.shm_dir / sender.name) != str(path):
            return self.read(path)
        if delta:
            sender.keep_delta = True
            if sender.last_delta is not None:
                return sender.last_delta
        return BlobWeights(self.read(path).data, digest=sender.digest)

    @staticmethod
    def read(path: str) -> BlobWeights:
        """What an export wrote, for engines on other nodes (through Ray's object store): a weights file's
        bytes, or an adapter folder's files as ``{file name: bytes}``, in the record the engine receives."""
        p = Path(path)
        if p.is_dir():
            return BlobWeights({f.name: f.read_bytes() for f in sorted(p.iterdir()) if f.is_file()}, adapter=True)
        return BlobWeights(p.read_bytes())


class WeightSender(Protocol):
    """The learner side of one weight transport: how one rank hands the policy's tensors to the engines.

    One export is ``begin(layout, aliases)`` (every tensor's name and shape, in order; the keys that share
    another key's storage, ``{key: first key}``), then each tensor in turn, full
    (``send``: any device and dtype, converted on the way) or as the name of one already sent that it shares
    storage with (``alias``: a tied ``lm_head``), then ``finish``, which returns what the engines are given
    (a ``rollout.weights`` record). The engine side is ``rollout.pool.RolloutWorker.receive``. Tensors arrive
    one at a time (gathered when sharded), so a sender never needs the whole model at once: the collective
    transport (``rollout.collective.BucketSender``) announces the layout in ``begin``, broadcasts full buckets
    in ``send`` and the last one and a checksum in ``finish``.
    """

    def begin(self, layout: list[tuple[str, tuple[int, ...]]], aliases: dict[str, str] | None = None) -> None: ...

    def send(self, key: str, tensor: torch.Tensor) -> None: ...

    def alias(self, key: str, first: str) -> None: ...

    def finish(self) -> WeightUpdate: ...


class ShmFileSender:
    """The ``file`` transport's learner side: a safetensors file in ``folder`` (shared memory), rewritten in place
    in one of two memory-mapped slots (:class:`_ShmWeights`) and published by an atomic rename. The file's bytes
    are also what the ``object_store`` transport sends to engines on other nodes (:meth:`WeightExport.read`)."""

    def __init__(self, folder: Path, dtype: torch.dtype, name: str = "policy.safetensors") -> None:
        self.folder, self.dtype, self.name = Path(folder), dtype, name
        self._file: _ShmWeights | None = None
        self._views: dict[str, torch.Tensor] = {}
        self._prev: dict[str, torch.Tensor] | None = None
        self.changes = ChangeCount()
        # Delta sync (WeightExport.read_update(delta=True) turns it on): the changed entries of the last export.
        self.keep_delta = False
        self.digest = ""  # the last export's identity ("" before deltas were kept)
        self.last_delta: DeltaWeights | None = None
        self._delta: list[tuple[str, torch.Tensor, torch.Tensor]] | None = None
        self._delta_bytes = 0

    def begin(self, layout: list[tuple[str, tuple[int, ...]]], aliases: dict[str, str] | None = None) -> None:
        typed = [(k, self.dtype, shape) for k, shape in layout]
        if self._file is None or not self._file.fits(self.folder, typed):
            if self._file is not None:
                self._file.close()
            self._file = _ShmWeights(self.folder, self.name, typed)
        self._prev = self._file.previous()  # the other slot: the last export, when it had this layout
        self._views = self._file.begin()
        self.changes.begin(measured=self._prev is not None)
        self._delta = [] if self.keep_delta and self._prev is not None else None
        self._delta_bytes = 0
        if self._prev is None:
            self.digest = ""  # a new layout: no engine holds anything a delta could apply to

    def send(self, key: str, tensor: torch.Tensor) -> None:
        self._views[key].copy_(tensor)
        self._compare(key)

    def alias(self, key: str, first: str) -> None:
        self._views[key].copy_(self._views[first])
        self._compare(key)

    def _compare(self, key: str) -> None:
        """Count ``key``'s changed elements against the previous export and, keeping deltas, keep them (until the
        delta would be over a third of the file: indices and values then cost more than the full sync)."""
        if self._prev is None:
            return
        new = self._views[key]
        changed = self.changes.add(new, self._prev[key])
        if self._delta is None:
            return
        idx = changed.nonzero().flatten()
        if idx.numel():
            values = new.reshape(-1)[idx]
            idx = idx.to(torch.int32 if new.numel() < 2**31 else torch.int64)  # what crosses: 4 bytes an entry
            self._delta.append((key, idx, values))
            self._delta_bytes += idx.numel() * (idx.element_size() + values.element_size())
            if self._file is not None and 3 * self._delta_bytes > self._file.size:
                self._delta = None

    def finish(self) -> FileWeights:
        assert self._file is not None, "finish before begin"
        if self.keep_delta:
            self._seal()
        self._views, self._prev, self._delta = {}, None, None
        self.changes.finish()
        return FileWeights(self._file.publish())

    def _seal(self) -> None:
        """Keeping deltas: this export's per-tensor checksums and identity, and its ``DeltaWeights`` from the
        previous export (None: the first, a new layout, or too many changes)."""
        checksums = tuple((k, checksum(v)) for k, v in self._views.items())
        digest = hashlib.blake2b(repr(checksums).encode(), digest_size=16).hexdigest()
        base, self.digest = self.digest, digest
        ok = self._delta is not None and base != ""
        self.last_delta = DeltaWeights(base, digest, tuple(self._delta or ()), checksums) if ok else None

    def close(self) -> None:
        """Unmap both slots (the published file stays for readers that opened it)."""
        self._views = {}
        if self._file is not None:
            self._file.close()
            self._file = None


class CudaIpcSender:
    """The ``ipc`` transport's learner side: the tensors packed into one buffer on ``device`` (each 128-byte
    aligned), kept and reused until the next export, shared through a CUDA IPC handle (``reduce_tensor``)."""

    def __init__(self, device: torch.device, dtype: torch.dtype) -> None:
        self.device, self.dtype = device, dtype
        self._buf: torch.Tensor | None = None
        self._place: dict[str, tuple[tuple[int, ...], int]] = {}
        self.changes = ChangeCount()

    def begin(self, layout: list[tuple[str, tuple[int, ...]]], aliases: dict[str, str] | None = None) -> None:
        place, total = {}, 0
        for key, shape in layout:
            place[key] = (shape, total)
            total += -(-math.prod(shape) // 64) * 64  # each tensor 128-byte aligned in the buffer
        same = self._buf is not None and self._place == place and self._buf.dtype == self.dtype
        self._place = place
        if self._buf is None or self._buf.numel() != total or self._buf.dtype != self.dtype:
            self._buf = None  # the old one freed before the new one is made
            self._buf = torch.empty(total, dtype=self.dtype, device=self.device)
        self.changes.begin(measured=same)

    def _view(self, key: str) -> torch.Tensor:
        assert self._buf is not None, "send before begin"
        shape, off = self._place[key]
        return self._buf[off : off + math.prod(shape)].view(shape)

    def send(self, key: str, tensor: torch.Tensor) -> None:
        view = self._view(key)
        if self.changes.measured:  # the buffer still holds the last export: compare before overwriting it
            tensor = tensor.to(self.dtype)
            self.changes.add(tensor, view)
        view.copy_(tensor)

    def alias(self, key: str, first: str) -> None:
        if self.changes.measured:  # counted like the file sender counts it: as the elements the engines load
            self.changes.add(self._view(first), self._view(key))
        self._view(key).copy_(self._view(first))

    def finish(self) -> IpcWeights:
        from torch.multiprocessing.reductions import reduce_tensor

        torch.cuda.synchronize(self.device)  # the engines read it from other processes, outside this stream
        self.changes.finish()
        rebuild, args = reduce_tensor(self._buf)
        return IpcWeights(rebuild, tuple(args), tuple((k, shape, off) for k, (shape, off) in self._place.items()))


class ChangeCount:
    """How many of one export's elements differ, bit for bit, from the previous export's (in the engines' dtype):
    ``weights/changed_fraction``, what decides whether sending only the changed entries is worth it.

    Counted where a sender writes its buffer, which still holds (or, double-buffered, keeps beside it) the
    previous export, so measuring costs one elementwise compare per tensor and no copy. Bits, not values, are
    compared: an engine that reloads only the changed entries must end up bit-identical (NaN != NaN as values).
    ``fraction`` is None until two exports with the same layout were compared.
    """

    def __init__(self) -> None:
        self.measured, self.changed, self.total = False, 0, 0
        self.fraction: float | None = None

    def begin(self, measured: bool) -> None:
        """A new export: compared against the last one if ``measured`` (same layout and dtype), else not."""
        self.measured, self.changed, self.total = measured, 0, 0

    def add(self, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
        """Count where ``new`` differs from ``old`` (same shape and dtype); return that mask, flat."""
        bits = BITS[new.element_size()]
        changed = torch.ne(new.reshape(-1).view(bits), old.reshape(-1).view(bits))
        self.changed += int(changed.sum())
        self.total += new.numel()
        return changed

    def finish(self) -> None:
        """Close the export: ``fraction`` becomes its changed share (None when it was not compared)."""
        self.fraction = self.changed / self.total if self.measured and self.total else None

    def take(self) -> dict[str, float]:
        """``{"weights/changed_fraction": f}`` for the last compared export, once (empty when none since)."""
        f, self.fraction = self.fraction, None
        return {} if f is None else {"weights/changed_fraction": f}


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
        self._published = False  # whether the slot before ``_next`` holds a published export

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

    def previous(self) -> dict[str, torch.Tensor] | None:
        """The last published export's tensor views (the other slot, read-only by convention), or None when there
        is none in this layout yet; valid until the next ``publish``."""
        slot = self._slots[1 - self._next]
        return slot[3] if self._published and slot is not None else None

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
        self._published = True
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
