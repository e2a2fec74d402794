"""The engine side of delta sync: patch a held safetensors weights file with a ``rollout.weights.DeltaWeights``.

The file is the last export this engine received in full (``RolloutWorker.load_weights_blob``) and patched since;
its tensors are memory-mapped and only the changed entries are written. Every tensor is then hashed and compared
with the learner's checksum of the same export, so a file that drifted (a lost or misapplied delta, a corrupted
byte) is caught before the engine loads it.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from typing import Any

import torch

from rollout.weights import DeltaWeights

_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def checksum(t: torch.Tensor) -> str:
    """blake2b (hex) of a contiguous CPU tensor's bytes; computed by the learner (``rl.trainer.weights``) and here."""
    flat = t.reshape(-1).view(BITS[t.element_size()])
    return hashlib.blake2b(memoryview(flat.numpy()).cast("B"), digest_size=16).hexdigest()


def _views(mm: Any) -> dict[str, torch.Tensor]:
    """The safetensors file mapped in ``mm``: each tensor as a flat view into the mapping."""
    n = int.from_bytes(mm[:8], "little")
    header = json.loads(bytes(mm[8 : 8 + n]))
    out = {}
    for key, e in header.items():
        if key == "__metadata__":
            continue
        dt, (start, end) = _DTYPES[e["dtype"]], e["data_offsets"]
        size = torch.empty((), dtype=dt).element_size()
        count = (end - start) // size
        out[key] = (
            torch.frombuffer(mm, dtype=dt, count=count, offset=8 + n + start) if count else torch.empty(0, dtype=dt)
        )
    return out


def apply_delta(path: str, update: DeltaWeights) -> bool:
    """Write ``update.changes`` into the weights file ``path`` in place; True when every tensor then matches
    ``update.checksums`` (and the file has exactly those tensors), False otherwise (the file is then stale)."""
    fd = os.open(path, os.O_RDWR)
    try:
        mm = mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    try:
        views = _views(mm)
        ok = _patch(views, update)
        views.clear()  # the views export the mapping's buffer: dropped before it is closed
        mm.flush()
        return ok
    finally:
        try:
            mm.close()
        except BufferError:  # a view is still referenced; the mapping goes with it
            pass


def _patch(views: dict[str, torch.Tensor], update: DeltaWeights) -> bool:
    expected = dict(update.checksums)
    if set(expected) != set(views):
        return False
    for key, idx, values in update.changes:
        flat = views.get(key)
        if flat is None or values.dtype != flat.dtype or (idx.numel() and int(idx.max()) >= flat.numel()):
            return False
        flat[idx.long()] = values
    return all(checksum(views[k]) == expected[k] for k in views)
