"""The ``collective`` weight transport's stream (``rollout.collective``) over a real 2-member gloo group: the
learner side (``BucketSender``) in this process, an engine side in a forked one.

Bucket boundaries (a tensor larger than a bucket, many small ones straddling buckets, a tied alias), bytes and
dtype exactly as sent, a stale version drained and refused, a corrupted digest refused.
"""

from __future__ import annotations

import multiprocessing as mp
import uuid

import pytest
import torch

from rl.trainer.collectives import free_port
from rollout import collective
from rollout.weights import CollectiveJoin, CollectiveWeights


def _spec(port: int, rank: int, tag: str) -> CollectiveJoin:
    return CollectiveJoin("127.0.0.1", port, rank, 2, "gloo", 30.0, tag)


def _engine(port: int, tag: str, version: int, q: mp.Queue) -> None:
    """The receiving member: every stream's tensors (or the error's type and message) onto ``q``."""
    try:
        group = collective.join(_spec(port, 1, tag))
        got = list(collective.take(group, CollectiveWeights(version, tag)))
        # numpy bits, not tensors: a queued tensor would be shared through a socket this process closes on exit
        q.put(("ok", [(k, str(v.dtype), v.view(torch.int16).numpy().copy()) for k, v in got]))
    except Exception as e:  # noqa: BLE001 - reported to the test
        q.put(("error", f"{type(e).__name__}: {e}"))


def _stream(tensors, bucket_bytes, *, version=1, engine_version=None, aliases=None, corrupt=False):
    """Send ``tensors`` (name -> tensor) through a fresh group to a forked engine; what it received, and the
    number of buckets sent."""
    port, tag = free_port(), uuid.uuid4().hex[:8]
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    proc = ctx.Process(target=_engine, args=(port, tag, version if engine_version is None else engine_version, q))
    proc.start()
    try:
        group = collective.join(_spec(port, 0, tag))
        sender = collective.BucketSender(group, torch.bfloat16, bucket_bytes, version)
        sender.begin([(k, tuple(v.shape)) for k, v in tensors.items()], aliases)
        if corrupt:
            sender._hash.update(b"x")
        for k, v in tensors.items():
            (sender.alias(k, aliases[k]) if aliases and k in aliases else sender.send(k, v))
        sender.finish()
        status, got = q.get(timeout=60)
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    if status == "ok":
        assert all(dt == "torch.bfloat16" for _, dt, _ in got)
        got = [(k, torch.from_numpy(bits).view(torch.bfloat16)) for k, _, bits in got]
    return (status, got), sender.buckets


def test_tensor_larger_than_a_bucket_is_split_and_arrives_whole() -> None:
    g = torch.Generator().manual_seed(0)
    big = torch.randn(33, 17, generator=g)  # 1122 bf16 bytes: over 8 buckets of 128
    small = torch.randn(3, generator=g)
    (status, got), buckets = _stream({"big": big, "small": small}, 128)
    assert status == "ok", got
    assert [k for k, _ in got] == ["big", "small"]
    assert buckets == -(-(big.numel() + small.numel()) * 2 // 128) == 9  # 1128 bytes
    assert torch.equal(got[0][1], big.to(torch.bfloat16)) and got[0][1].shape == (33, 17)
    assert got[1][1].dtype == torch.bfloat16 and torch.equal(got[1][1], small.to(torch.bfloat16))


def test_many_small_tensors_share_and_straddle_buckets_and_aliases_carry_no_bytes() -> None:
    g = torch.Generator().manual_seed(1)
    tensors = {f"t{i}": torch.randn(i % 7 + 1, 3, generator=g) for i in range(40)}
    tensors["head"] = tensors["t0"]
    (status, got), buckets = _stream(tensors, 50, aliases={"head": "t0"})  # 50 bytes: odd, so tensors straddle
    assert status == "ok", got
    assert [k for k, _ in got] == list(tensors)
    for (k, v), ref in zip(got, tensors.values()):
        assert torch.equal(v, ref.to(torch.bfloat16)), k
    payload = sum(v.numel() * 2 for k, v in tensors.items() if k != "head")
    assert buckets == -(-payload // 50)


def test_stale_version_is_drained_and_refused() -> None:
    (status, msg), _ = _stream({"w": torch.ones(300)}, 64, version=5, engine_version=4)
    assert status == "error" and msg.startswith("StaleStream") and "5" in msg and "4" in msg


def test_a_digest_that_differs_refuses_the_stream() -> None:
    (status, msg), _ = _stream({"w": torch.ones(300)}, 64, corrupt=True)
    assert status == "error" and msg.startswith("TornStream")


def test_bad_bucket_size_and_backend_are_refused() -> None:
    with pytest.raises(ValueError, match="bucket_bytes"):
        collective.BucketSender(None, torch.bfloat16, 0, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gloo or nccl"):
        collective.join(CollectiveJoin("127.0.0.1", free_port(), 0, 1, "mpi", 5.0, "x"))
