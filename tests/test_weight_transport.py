"""The weight-transport interface without a GPU or Ray: the learner side (``rl.trainer.weights.WeightSender``:
begin, one tensor at a time, finish) and the engine side (``rollout.pool.RolloutWorker.receive``), and the one
balancer every group of workers shares (``rollout.balance.longest_first``)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from rl.trainer.weights import CudaIpcSender, ShmFileSender
from rollout.balance import longest_first
from rollout.weights import BlobWeights, FileWeights, IpcWeights


def test_file_sender_streams_into_alternate_slots_and_publishes(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    emb = torch.randn(8, 4)
    sender = ShmFileSender(tmp_path, torch.bfloat16)
    layout = [("embed.weight", (8, 4)), ("norm.weight", (4,)), ("lm_head.weight", (8, 4))]

    def export(scale: float) -> FileWeights:
        sender.begin(layout)
        sender.send("embed.weight", emb * scale)
        sender.send("norm.weight", torch.full((4,), scale))
        sender.alias("lm_head.weight", "embed.weight")  # a tied head: copied from what was sent
        return sender.finish()

    first = export(1.0)
    assert first == FileWeights(str(tmp_path / "policy.safetensors"))
    reader = open(first.path, "rb")  # an engine still reading export 1
    before = reader.read()
    second = export(2.0)
    got = load_file(second.path)
    assert got["embed.weight"].dtype == torch.bfloat16
    assert torch.equal(got["embed.weight"], (emb * 2.0).to(torch.bfloat16))
    assert torch.equal(got["lm_head.weight"], got["embed.weight"])
    assert torch.equal(got["norm.weight"], torch.full((4,), 2.0, dtype=torch.bfloat16))
    reader.seek(0)
    assert reader.read() == before, "the second export wrote the other slot"
    reader.close()
    sender.close()


def test_ipc_sender_packs_each_tensor_aligned_and_copies_aliases() -> None:
    """The packing of the CUDA IPC buffer (on a CPU tensor: ``finish``, the CUDA handle, needs a GPU)."""
    sender = CudaIpcSender(torch.device("cpu"), torch.float32)
    sender.begin([("a", (3,)), ("b", (2, 5)), ("c", (3,))])
    assert [off for _, off in sender._place.values()] == [0, 64, 128], "each tensor starts 128-byte aligned"
    sender.send("a", torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))  # converted on the way
    sender.send("b", torch.ones(2, 5))
    sender.alias("c", "a")
    assert torch.equal(sender._view("c"), torch.tensor([1.0, 2.0, 3.0]))
    assert torch.equal(sender._view("b"), torch.ones(2, 5))


class _Engine:
    """Records what the worker asked its engine to load."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def load_weights(self, path: str) -> None:
        self.calls.append(("file", Path(path).read_bytes() if Path(path).is_file() else path))

    def load_adapter(self, path: str) -> None:
        self.calls.append(("adapter", sorted(p.name for p in Path(path).iterdir()) if Path(path).is_dir() else path))

    def load_weights_ipc(self, update: IpcWeights) -> None:
        self.calls.append(("ipc", update))

    def shutdown(self) -> None:
        pass


def test_worker_receives_each_transport_through_its_loader(tiny_model_path) -> None:
    from rollout.pool import RolloutWorker

    engine = _Engine()
    w = RolloutWorker(tiny_model_path, [], engine=engine)
    try:
        ipc = IpcWeights(rebuild=None, args=(), tensors=(("w", (2,), 0),))
        w.receive(FileWeights("/dev/shm/x/policy.safetensors"))
        w.receive(FileWeights("/dev/shm/x/adapter-000001", adapter=True))
        w.receive(BlobWeights(b"weights bytes"))
        w.receive(BlobWeights({"adapter_config.json": b"{}"}, adapter=True))
        w.receive(ipc)
        assert engine.calls == [
            ("file", "/dev/shm/x/policy.safetensors"),
            ("adapter", "/dev/shm/x/adapter-000001"),
            ("file", b"weights bytes"),  # written to this node's shared memory, then loaded as a file
            ("adapter", ["adapter_config.json"]),
            ("ipc", ipc),
        ]
        with pytest.raises(TypeError, match="arrives as bytes"):
            w.receive(BlobWeights({"a": b""}))
        with pytest.raises(TypeError, match="no weight transport delivers a str"):
            w.receive("/dev/shm/x/policy.safetensors")  # type: ignore[arg-type]
    finally:
        w.shutdown()


def _old_reward_balancing(sizes: list[int], n: int) -> list[list[int]]:
    """The reward service's former balancing: largest group first (stable), each to the shard with fewest samples."""
    shards: list[list[int]] = [[] for _ in range(n)]
    load = [0] * n
    for g in sorted(range(len(sizes)), key=lambda g: sizes[g], reverse=True):
        k = min(range(n), key=lambda i: load[i])
        shards[k].append(g)
        load[k] += sizes[g]
    return [sorted(s) for s in shards]


def test_longest_first_is_the_reward_services_former_balancing() -> None:
    rng = random.Random(0)
    for _ in range(200):
        sizes = [rng.randint(1, 6) for _ in range(rng.randint(0, 12))]
        n = rng.randint(1, 4)
        assert longest_first(sizes, n) == _old_reward_balancing(sizes, n), (sizes, n)


def test_longest_first_balances_and_rejects_no_workers() -> None:
    # 5 -> w0, 4 -> w1, 3 -> w1 (4 < 5), 2 -> w0 (5 < 7), 1 -> w0 (7 = 7: the lower index): loads 8 and 7
    assert longest_first([5, 1, 4, 2, 3], 2) == [[0, 1, 3], [2, 4]]
    assert longest_first([], 3) == [[], [], []]
    with pytest.raises(ValueError, match="n must be >= 1"):
        longest_first([1.0], 0)
