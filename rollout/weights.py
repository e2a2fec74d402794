"""The records that carry the policy's weights from a learner to an engine, one per transport.

The learner side writes them (``rl.trainer.weights``), the driver routes them (``rl.driver.actors.rollout``), and
``rollout.pool.RolloutWorker.receive`` loads each into its engine. They are small and picklable: what crosses an
actor call is the record, never the weights themselves (except ``BlobWeights``, whose bytes travel through Ray's
object store to an engine on another node).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Union

__all__ = [
    "FileWeights",
    "BlobWeights",
    "IpcWeights",
    "DeltaWeights",
    "CollectiveJoin",
    "CollectiveWeights",
    "WeightUpdate",
    "WeightReceiver",
]


@dataclass(frozen=True)
class FileWeights:
    """``file``: a safetensors file in shared memory on the engine's node (``adapter``: a ``peft`` adapter folder)."""

    path: str
    adapter: bool = False


@dataclass(frozen=True)
class BlobWeights:
    """``object_store``: what a ``FileWeights`` holds, as bytes (an adapter folder: ``{file name: bytes}``), for an
    engine on another node than the learner; the engine writes it to its own shared memory and loads it."""

    data: bytes | dict[str, bytes]
    adapter: bool = False
    digest: str = ""  # the export's ``DeltaWeights`` identity when the learner keeps deltas ("" otherwise)


@dataclass(frozen=True)
class IpcWeights:
    """``ipc``: one packed buffer on a learner's GPU, shared through a CUDA IPC handle (``torch``'s
    ``reduce_tensor``: ``rebuild(*args)`` maps it in another process), and where each tensor lies in it
    (``(name, shape, offset in elements)``). Only an engine on the same GPU can map it."""

    rebuild: Any
    args: tuple[Any, ...]
    tensors: tuple[tuple[str, tuple[int, ...], int], ...]


@dataclass(frozen=True)
class DeltaWeights:
    """``object_store`` with ``learner.delta_sync_full_every``: only what changed since the previous export, for an
    engine on another node that holds that export (the bytes of the last ``BlobWeights`` it got, patched since).

    ``changes``: per changed tensor ``(name, flat indices (int64 tensor), values (tensor in the file's dtype))``;
    ``checksums``: per tensor of the new export, ``(name, blake2b hex of its bytes)``; ``base``/``digest``: the
    previous and the new export's identity (a hash of their checksums). The engine applies the changes only onto
    ``base`` and then checks every tensor against ``checksums``; otherwise it asks for a full sync, so an engine
    never serves weights that drifted from the learner's."""

    base: str
    digest: str
    changes: tuple[tuple[str, Any, Any], ...]
    checksums: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class CollectiveJoin:
    """``collective``: join the weight-transfer process group (``rollout.collective``), a stateless group of its
    own beside the engine's (vLLM's workers own their default group): ``world`` members, learner rank 0 as
    member 0 (it hosts the rendezvous at ``address:port``), this engine's worker as member ``rank``; ``backend``:
    gloo (CPU) or nccl (GPU); ``timeout_s``: how long a broadcast waits for its peers (``faults.collective_s``);
    ``tag``: names this formation of the group (a re-formed group never meets an old one's members)."""

    address: str
    port: int
    rank: int
    world: int
    backend: str
    timeout_s: float
    tag: str


@dataclass(frozen=True)
class CollectiveWeights:
    """``collective``: take part in weight stream ``version`` of the joined group: learner rank 0 broadcasts a
    header (version, layout, bucket size), the weights in buckets, then a checksum of every byte; the engine
    loads each tensor into its in-place reload as its last bucket arrives. A header of another version is
    drained and refused (a stale stream), a checksum that differs refuses the stream (a torn one)."""

    version: int
    tag: str
    broken: str = ""  # the learner's answer only: why its broadcast failed midway ("" = every byte was sent)


@dataclass(frozen=True)
class JoinFailed:
    """Learner rank 0's answer to a weight-group formation that did not complete (a member died before it joined,
    or the rendezvous passed ``faults.collective_s``): the learner itself is fine; the driver syncs by file."""

    why: str


WeightUpdate = Union[FileWeights, BlobWeights, IpcWeights, DeltaWeights, CollectiveJoin, CollectiveWeights]


class WeightReceiver(Protocol):
    """The engine side of the weight transports (``rl.trainer.weights.WeightSender`` is the learner side): load
    what one sync delivered. The streaming transport (``CollectiveWeights``) joins a broadcast instead: its
    ``receive`` takes the header, then each tensor into the engine's in-place reload, then the checksum."""

    def receive(self, update: WeightUpdate) -> bool | None: ...
