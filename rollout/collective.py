"""The ``collective`` weight transport: learner rank 0 broadcasts the policy's weights, in buckets of bounded size,
to every engine worker through a process group of its own.

The group is stateless (``torch.distributed``'s ``TCPStore`` and a gloo or NCCL backend object, never
``init_process_group``): vLLM's workers already own the default group, and the learners own theirs. Member 0 is
learner rank 0 (it hosts the rendezvous), members 1.. the engines' workers (``rollout.weights.CollectiveJoin``).

One stream (``rollout.weights.CollectiveWeights``):

1. a header: its length, then JSON ``{"version", "dtype", "bucket", "layout": [[name, shape, alias]]}``;
2. the tensors' bytes in layout order (in ``dtype``), cut into buckets of ``bucket`` bytes (a multiple of 8: no
   element is cut), the last one short: a tensor may straddle buckets, and one larger than a bucket spans several
   (split, never refused);
3. a blake2b digest of every byte sent (16 bytes).

The sender (:class:`BucketSender`, a ``rl.trainer.weights.WeightSender``) holds one bucket; the receiver
(:func:`receive_stream`) one bucket plus the tensor being assembled, and hands each tensor to the engine's
in-place reload once its last bucket arrived. An alias (a tied ``lm_head``) carries no bytes: the receiver gives
the tensor it names again. A header of another version is drained and refused (:class:`StaleStream`), a digest
that differs refuses the stream (:class:`TornStream`) after the engine loaded it: the engine must not serve
until a complete stream arrives (``rollout.pool.RolloutWorker`` keeps that flag).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from rollout.weights import CollectiveJoin, CollectiveWeights

__all__ = [
    "bucket_bytes",
    "WeightGroup",
    "join",
    "failure_text",
    "BucketSender",
    "StreamHeader",
    "receive_header",
    "receive_stream",
    "drain",
    "take",
    "StaleStream",
    "TornStream",
    "DTYPES",
]

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_NAMES = {v: k for k, v in DTYPES.items()}
_DIGEST = 16


def bucket_bytes(mb: float) -> int:
    """``learner.weight_bucket_mb`` in bytes, rounded down to a multiple of 8 (at least 8)."""
    return max(8, int(mb * (1 << 20)) // 8 * 8)


STALE = "stale weight stream"  # how a StaleStream's message starts (vLLM's RPC re-raises it by message)


class StaleStream(RuntimeError):
    """The learner's stream carries another version than the one this engine was told to take."""


class TornStream(RuntimeError):
    """The bytes an engine received do not hash to the learner's digest: the engine's weights are not the learner's."""


class WeightGroup:
    """One member of the weight-transfer group: ``broadcast`` from member 0, in place, on ``device``."""

    def __init__(self, store: Any, backend: Any, rank: int, world: int, device: torch.device) -> None:
        self.store, self.backend, self.rank, self.world, self.device = store, backend, rank, world, device

    def broadcast(self, t: torch.Tensor) -> None:
        """Member 0's ``t`` into every member's ``t`` (same shape and dtype everywhere). A failure (a member died,
        or ``faults.collective_s`` passed) closes this membership: gloo's other members would otherwise wait
        out their timeout for bytes that never come; with its sockets closed they fail at once."""
        if self.backend is None:
            raise RuntimeError("weight group closed after a failed broadcast: it must be formed again")
        try:
            self.backend.broadcast(t, 0).wait()
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        """Drop this member's backend and store (their sockets close as they are freed)."""
        self.backend = self.store = None


def failure_text(e: BaseException) -> str:
    """A failed collective operation in one line (its type and the first line of its message, at most 300
    characters): what a broken stream (``BucketSender.broken``) or formation (``JoinFailed``) reports."""
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"


def join(spec: CollectiveJoin, device: torch.device | None = None) -> WeightGroup:
    """Join the group ``spec`` describes (blocks until all ``spec.world`` members joined or ``spec.timeout_s``).

    gloo: tensors on the CPU; nccl: on this process's current CUDA device (written for GPUs, not exercised on
    a CPU-only host)."""
    from torch.distributed import PrefixStore, TCPStore

    timeout = datetime.timedelta(seconds=spec.timeout_s)
    if not 0 <= spec.rank < spec.world:
        raise ValueError(f"weight group member {spec.rank} is not in [0, {spec.world})")
    store = TCPStore(spec.address, spec.port, spec.world, is_master=spec.rank == 0, timeout=timeout)
    prefixed = PrefixStore(f"jointrl-weights/{spec.tag}", store)
    if spec.backend == "gloo":
        from torch.distributed.distributed_c10d import ProcessGroupGloo

        backend = ProcessGroupGloo(prefixed, spec.rank, spec.world, timeout)
        dev = torch.device("cpu")
    elif spec.backend == "nccl":
        from torch.distributed.distributed_c10d import ProcessGroupNCCL

        opts = ProcessGroupNCCL.Options()
        opts._timeout = timeout
        backend = ProcessGroupNCCL(prefixed, spec.rank, spec.world, opts)
        dev = device or torch.device("cuda", torch.cuda.current_device())
    else:
        raise ValueError(f"weight group backend must be gloo or nccl, got {spec.backend!r}")
    group = WeightGroup(store, backend, spec.rank, spec.world, dev)
    group.broadcast(torch.zeros(1, dtype=torch.uint8, device=dev))  # every member is connected before any stream
    return group


def _hash(h: Any, chunk: torch.Tensor) -> None:
    """Add ``chunk`` (uint8, any device) to the digest (a GPU bucket is hashed through one host copy)."""
    h.update(memoryview(chunk.cpu().numpy()).cast("B"))


class BucketSender:
    """The learner side of one stream (member 0; ``rl.trainer.weights.WeightSender``): ``begin`` broadcasts the
    header, ``send`` packs each tensor into the bucket and broadcasts every full one, ``finish`` the short last
    bucket and the digest. Extra memory: one bucket."""

    def __init__(self, group: WeightGroup, dtype: torch.dtype, bucket_bytes: int, version: int) -> None:
        if bucket_bytes < 8 or bucket_bytes % 8:
            raise ValueError(f"bucket_bytes must be a positive multiple of 8 (whole elements), got {bucket_bytes}")
        self.group, self.dtype, self.bucket_bytes, self.version = group, dtype, bucket_bytes, version
        self._size = torch.empty((), dtype=dtype).element_size()
        self._bucket = torch.empty(0, dtype=torch.uint8)
        self._fill = 0
        self._hash = hashlib.blake2b(digest_size=_DIGEST)
        self._aliases: dict[str, str] = {}
        self.buckets = 0  # broadcast so far (tests and the bench read it)
        self.broken = ""  # why a broadcast failed: the rest of the stream is not sent, but still walked

    def _broadcast(self, t: torch.Tensor) -> None:
        """``group.broadcast``, or nothing once one failed: the export goes on to its end, so that sharded
        learner ranks (gathering each tensor together) stay in step; ``finish`` reports the failure."""
        if self.broken:
            return
        try:
            self.group.broadcast(t)
        except Exception as e:  # noqa: BLE001 - a member died or timed out: reported by finish, not raised
            self.broken = failure_text(e)

    def begin(self, layout: list[tuple[str, tuple[int, ...]]], aliases: dict[str, str] | None = None) -> None:
        """Broadcast the header: ``layout`` in order; ``aliases`` (key -> the key it repeats) carry no bytes."""
        self._aliases = dict(aliases or {})
        head = {
            "version": self.version,
            "dtype": _NAMES[self.dtype],
            "bucket": self.bucket_bytes,
            "layout": [[k, list(shape), self._aliases.get(k)] for k, shape in layout],
        }
        data = json.dumps(head).encode()
        self._broadcast(torch.tensor([len(data)], dtype=torch.int64, device=self.group.device))
        self._broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.group.device))
        self._bucket = torch.empty(self.bucket_bytes, dtype=torch.uint8, device=self.group.device)
        self._fill, self.buckets = 0, 0
        self._hash = hashlib.blake2b(digest_size=_DIGEST)

    def send(self, key: str, tensor: torch.Tensor) -> None:
        """Pack ``tensor`` into the bucket, converted (dtype, device) slice by slice straight into it: no
        converted copy of the whole tensor. Every full bucket is broadcast."""
        if key in self._aliases:
            return
        flat, size, pos = tensor.detach().reshape(-1), self._size, 0
        while pos < flat.numel():
            n = min((self.bucket_bytes - self._fill) // size, flat.numel() - pos)
            self._bucket[self._fill : self._fill + n * size].view(self.dtype).copy_(flat[pos : pos + n])
            self._fill, pos = self._fill + n * size, pos + n
            if self._fill == self.bucket_bytes:
                self._flush()

    def alias(self, key: str, first: str) -> None:
        """``key`` repeats ``first``: nothing crosses (the header named it)."""
        if self._aliases.get(key) != first:
            raise ValueError(f"{key} aliases {first}, but the stream's header did not say so")

    def _flush(self) -> None:
        chunk = self._bucket[: self._fill]
        _hash(self._hash, chunk)
        self._broadcast(chunk)
        self._fill = 0
        self.buckets += 1

    def finish(self) -> CollectiveWeights:
        if self._fill:
            self._flush()
        digest = torch.frombuffer(bytearray(self._hash.digest()), dtype=torch.uint8).to(self.group.device)
        self._broadcast(digest)
        self._bucket = torch.empty(0, dtype=torch.uint8)
        return CollectiveWeights(self.version, "", self.broken)


def _recv_bytes(group: WeightGroup) -> bytes:
    size = torch.zeros(1, dtype=torch.int64, device=group.device)
    group.broadcast(size)
    buf = torch.empty(int(size.item()), dtype=torch.uint8, device=group.device)
    group.broadcast(buf)
    return bytes(buf.cpu().numpy())


@dataclass(frozen=True)
class StreamHeader:
    """What a stream's header announced: ``layout`` as ``(name, shape, alias or None)``."""

    version: int
    dtype: torch.dtype
    bucket: int
    layout: tuple[tuple[str, tuple[int, ...], str | None], ...]

    def total(self) -> int:
        """Bytes the stream carries (aliases carry none)."""
        size = torch.empty((), dtype=self.dtype).element_size()
        return sum(math.prod(s) * size for _, s, a in self.layout if a is None)


def receive_header(group: WeightGroup) -> StreamHeader:
    head = json.loads(_recv_bytes(group))
    layout = tuple((k, tuple(int(d) for d in shape), alias) for k, shape, alias in head["layout"])
    return StreamHeader(int(head["version"]), DTYPES[head["dtype"]], int(head["bucket"]), layout)


def _buckets(group: WeightGroup, head: StreamHeader, h: Any) -> Iterator[torch.Tensor]:
    """Each bucket in turn, received into one reused buffer (valid until the next is received) and hashed."""
    total = head.total()
    buf = torch.empty(min(head.bucket, total), dtype=torch.uint8, device=group.device)
    for start in range(0, total, head.bucket):
        chunk = buf[: min(head.bucket, total - start)]
        group.broadcast(chunk)
        _hash(h, chunk)
        yield chunk


def _check_digest(group: WeightGroup, h: Any, version: int) -> None:
    theirs = torch.zeros(_DIGEST, dtype=torch.uint8, device=group.device)
    group.broadcast(theirs)
    if bytes(theirs.cpu().numpy()) != h.digest():
        raise TornStream(f"weight stream {version}: the bytes received do not match the learner's checksum")


def receive_stream(group: WeightGroup, head: StreamHeader) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of stream ``head`` in layout order, each a tensor of its own (vLLM's in-place reload may
    keep it until its layer is complete), yielded as its last bucket arrives; then the digest is checked
    (:class:`TornStream`). Extra memory: one bucket, the tensor being assembled, and the targets of aliases."""
    h = hashlib.blake2b(digest_size=_DIGEST)
    size = torch.empty((), dtype=head.dtype).element_size()
    keep = {a for _, _, a in head.layout if a is not None}
    kept: dict[str, torch.Tensor] = {}
    buckets = _buckets(group, head, h)
    chunk, at = torch.empty(0, dtype=torch.uint8), 0
    for name, shape, alias in head.layout:
        if alias is not None:
            yield name, kept[alias]
            continue
        out = torch.empty(shape, dtype=head.dtype, device=group.device)
        raw, pos = out.reshape(-1).view(torch.uint8), 0
        while pos < math.prod(shape) * size:
            if at == chunk.numel():
                chunk, at = next(buckets), 0
            n = min(chunk.numel() - at, raw.numel() - pos)
            raw[pos : pos + n].copy_(chunk[at : at + n])
            pos, at = pos + n, at + n
        if name in keep:
            kept[name] = out
        yield name, out
        del out, raw
    for _ in buckets:  # none left when the layout matches the bytes; drained otherwise
        pass
    _check_digest(group, h, head.version)


def drain(group: WeightGroup, head: StreamHeader) -> None:
    """Take part in the rest of stream ``head`` without keeping anything (a stale stream: the learner's
    broadcasts must not wait on this member)."""
    h = hashlib.blake2b(digest_size=_DIGEST)
    for _ in _buckets(group, head, h):
        pass
    theirs = torch.zeros(_DIGEST, dtype=torch.uint8, device=group.device)
    group.broadcast(theirs)


def take(group: WeightGroup, update: CollectiveWeights) -> Iterator[tuple[str, torch.Tensor]]:
    """The header, then (if it is ``update``'s version) the stream's tensors; a stale stream is drained and
    refused with :class:`StaleStream` before any tensor is given."""
    head = receive_header(group)
    if head.version != update.version:
        drain(group, head)
        raise StaleStream(f"{STALE}: stream {head.version} arrived where {update.version} was expected")
    return receive_stream(group, head)
