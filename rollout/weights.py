"""The records that carry the policy's weights from a learner to an engine, one per transport.

The learner side writes them (``rl.trainer.weights``), the driver routes them (``rl.driver.actors.rollout``), and
``rollout.pool.RolloutWorker.receive`` loads each into its engine. They are small and picklable: what crosses an
actor call is the record, never the weights themselves (except ``BlobWeights``, whose bytes travel through Ray's
object store to an engine on another node).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Union

__all__ = ["FileWeights", "BlobWeights", "IpcWeights", "WeightUpdate", "WeightReceiver"]


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


@dataclass(frozen=True)
class IpcWeights:
    """``ipc``: one packed buffer on a learner's GPU, shared through a CUDA IPC handle (``torch``'s
    ``reduce_tensor``: ``rebuild(*args)`` maps it in another process), and where each tensor lies in it
    (``(name, shape, offset in elements)``). Only an engine on the same GPU can map it."""

    rebuild: Any
    args: tuple[Any, ...]
    tensors: tuple[tuple[str, tuple[int, ...], int], ...]


WeightUpdate = Union[FileWeights, BlobWeights, IpcWeights]


class WeightReceiver(Protocol):
    """The engine side of the weight transports (``rl.trainer.weights.WeightSender`` is the learner side): load
    what one sync delivered. A streaming transport (a collective broadcast) adds its own record, whose
    ``receive`` joins the stream (begin with the layout, take each tensor into the engine's in-place reload,
    finish); the driver's routing does not change."""

    def receive(self, update: WeightUpdate) -> None: ...
