"""The ``collective`` weight transport's stream (``rollout.collective``) over a real 2-member gloo group: the
learner side (``BucketSender``) in this process, an engine side in a forked one.

Bucket boundaries (a tensor larger than a bucket, many small ones straddling buckets, a tied alias), bytes and
dtype exactly as sent, a stale version drained and refused, a corrupted digest refused.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path
import signal
import time
import uuid

import pytest
import torch

from rl.trainer.collectives import free_port
from test_lora import make, make_learner  # noqa: F401 - fixtures: a LoRA learner on the tiny model
from rollout import collective
from rollout.weights import CollectiveJoin, CollectiveWeights, JoinFailed


def _spec(port: int, rank: int, tag: str) -> CollectiveJoin:
    return CollectiveJoin("127.0.0.1", port, rank, 2, "gloo", 30.0, tag)


def _engine(port: int, tag: str, version: int, q: mp.Queue) -> None:
    """The receiving member: every stream's tensors (or the error's type and message) onto ``q``."""
    torch.set_num_threads(1)  # forked: the parent's OpenMP thread pool is not usable here
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
    (status, got), buckets = _stream(tensors, 56, aliases={"head": "t0"})  # 56 bytes: tensors straddle buckets
    assert status == "ok", got
    assert [k for k, _ in got] == list(tensors)
    for (k, v), ref in zip(got, tensors.values()):
        assert torch.equal(v, ref.to(torch.bfloat16)), k
    payload = sum(v.numel() * 2 for k, v in tensors.items() if k != "head")
    assert buckets == -(-payload // 56)


def test_stale_version_is_drained_and_refused() -> None:
    (status, msg), _ = _stream({"w": torch.ones(300)}, 64, version=5, engine_version=4)
    assert status == "error" and msg.startswith("StaleStream") and "5" in msg and "4" in msg


def test_a_digest_that_differs_refuses_the_stream() -> None:
    (status, msg), _ = _stream({"w": torch.ones(300)}, 64, corrupt=True)
    assert status == "error" and msg.startswith("TornStream")


def test_bad_bucket_size_and_backend_are_refused() -> None:
    for bad in (0, 50):
        with pytest.raises(ValueError, match="bucket_bytes must be a positive multiple of 8"):
            collective.BucketSender(None, torch.bfloat16, bad, 1)  # type: ignore[arg-type]
    assert [collective.bucket_bytes(mb) for mb in (1e-9, 0.0625, 1)] == [8, 65536, 1 << 20]
    with pytest.raises(ValueError, match="gloo or nccl"):
        collective.join(CollectiveJoin("127.0.0.1", free_port(), 0, 1, "mpi", 5.0, "x"))


def _export_receiver(port: int, tag: str, q: mp.Queue) -> None:
    torch.set_num_threads(1)  # forked after the parent ran OpenMP kernels: its thread pool is not usable here
    try:
        group = collective.join(_spec(port, 1, tag))
        got = list(collective.take(group, CollectiveWeights(3, tag)))
        q.put(("ok", [(k, v.view(torch.int16).numpy().copy()) for k, v in got]))
    except Exception as e:  # noqa: BLE001 - reported to the test
        q.put(("error", f"{type(e).__name__}: {e}"))


def _stream_export(exp) -> tuple[dict, list]:
    """``exp``'s ``file`` export, and what its ``collective`` export (stream 3, 1 MiB buckets) delivered to a
    forked member as ``(name, int16 bits)``."""
    from safetensors.torch import load_file

    ref = load_file(exp.file("bfloat16"))
    port, tag = free_port(), uuid.uuid4().hex[:8]
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    proc = ctx.Process(target=_export_receiver, args=(port, tag, q))
    proc.start()
    try:
        exp.join_group(_spec(port, 0, tag))
        sent = exp.collective("bfloat16", 3, 1 << 20)
        status, got = q.get(timeout=60)
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    assert status == "ok", got
    assert sent == CollectiveWeights(3, "")
    return ref, got


def _same_as_file(ref: dict, got: list) -> None:
    assert sorted(k for k, _ in got) == sorted(ref)
    for k, bits in got:
        assert torch.equal(torch.from_numpy(bits).view(torch.bfloat16).reshape(ref[k].shape), ref[k]), k


def test_learner_export_streams_what_the_file_export_writes(tiny_model_path, tmp_path) -> None:
    """``WeightExport.collective`` of a real model: the same names, shapes and bf16 bits as its ``file`` export
    (a tied ``lm_head`` included, sent as an alias), over several buckets."""
    from transformers import AutoModelForCausalLM

    from rl.trainer.weights import WeightExport

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    _same_as_file(*_stream_export(WeightExport(model, None, 0, torch.device("cpu"), tmp_path / "learner")))


def test_lora_learner_streams_its_merged_weights(make, tiny_tokenizer) -> None:  # noqa: F811
    """With LoRA (``lora.transfer: merged``) the stream carries base + B A, as the file export does: after two
    steps (B no longer zero) every merged tensor arrives bit for bit."""
    from test_learner import make_batch

    lrn = make()
    for _ in range(2):
        lrn.step(make_batch(tiny_tokenizer))
    _same_as_file(*_stream_export(lrn.weights))


class _StreamEngine:
    """A stand-in engine whose weight streams fail as told (``rollout.pool.RolloutWorker``'s torn-stream flag)."""

    def __init__(self) -> None:
        self.fail: Exception | None = None
        self.loaded: list[int] = []

    def load_weights_stream(self, update: CollectiveWeights) -> None:
        if self.fail is not None:
            raise self.fail
        self.loaded.append(update.version)

    def score(self, prompt, continuation):
        return [0.0] * len(continuation)


def test_an_engine_whose_stream_broke_refuses_to_serve_until_a_complete_one(tiny_model_path) -> None:
    from rollout.pool import RolloutWorker

    engine = _StreamEngine()
    worker = RolloutWorker(tiny_model_path, [], engine=engine)
    assert worker.receive(CollectiveWeights(1, "t")) and engine.loaded == [1]
    assert worker.score([1, 2], [3]) == [0.0]
    engine.fail = collective.TornStream("weight stream 2: the bytes received do not match")
    with pytest.raises(collective.TornStream):
        worker.receive(CollectiveWeights(2, "t"))
    with pytest.raises(RuntimeError, match="torn .*weight stream 2 did not complete"):
        worker.score([1, 2], [3])
    engine.fail = RuntimeError(f"Worker failed with error '{collective.STALE}: stream 3 arrived where 4 was expected'")
    with pytest.raises(RuntimeError, match=collective.STALE):  # as vLLM re-raises it; refused from its header:
        # nothing loaded, the engine is still torn from stream 2
        worker.receive(CollectiveWeights(4, "t"))
    with pytest.raises(RuntimeError, match="torn"):
        worker.generate([], [], [], None)  # type: ignore[arg-type]
    engine.fail = None
    assert worker.receive(CollectiveWeights(5, "t")) and engine.loaded == [1, 5]
    assert worker.score([1, 2], [3]) == [0.0]
    engine.fail = RuntimeError(f"Worker failed with error '{collective.STALE}: stream 6 arrived where 7 was expected'")
    with pytest.raises(RuntimeError, match=collective.STALE):
        worker.receive(CollectiveWeights(7, "t"))
    assert worker.score([1, 2], [3]) == [0.0]  # a stale stream loads nothing: the engine still holds stream 5
    engine.fail = RuntimeError("Worker failed with error 'Connection closed by peer'")  # broke midway
    with pytest.raises(RuntimeError, match="closed by peer"):
        worker.receive(CollectiveWeights(8, "t"))
    with pytest.raises(RuntimeError, match="torn .*weight stream 8"):
        worker.score([1, 2], [3])


class _Pool:
    """A stand-in rollout pool: records each ``stream_weights`` call (records, and what the learner side did)."""

    def __init__(self, n: int) -> None:
        self.workers, self.replaced, self.calls = [object()] * n, 0, []

    def stream_weights(self, updates, learner_side, fallback) -> None:
        self.calls.append((list(updates), learner_side(), fallback))


class _Learners:
    def __init__(self) -> None:
        self.joined: list[CollectiveJoin] = []
        self.sent: list[tuple[str, int, int]] = []

    def weight_group_address(self):
        return "10.0.0.1", 4321

    def join_weight_group(self, spec: CollectiveJoin) -> str:
        self.joined.append(spec)
        return "joined"

    def export_collective(self, dtype: str, version: int, bucket: int) -> str:
        self.sent.append((dtype, version, bucket))
        return "sent"


def test_runtime_forms_the_weight_group_once_and_again_after_an_engine_was_replaced(recipe_copy) -> None:
    """``RayRuntime``'s collective sync: the group (learner rank 0 = member 0, engine i = member i + 1, gloo on
    CPU) is formed before the first stream, kept while its members live, formed anew (a new tag) after an engine
    replacement or a learner restart; every stream has the next version and the recipe's bucket in bytes."""
    from rl.config.recipe import load_recipe
    from rl.driver.ray_runtime import RayRuntime

    cfg = load_recipe(recipe_copy("tiny.yaml"), ["learner.weight_sync=collective", "learner.weight_bucket_mb=0.5"])
    rt = RayRuntime(cfg, "unused", Path("/nonexistent"), verbose=False)
    rt.pool, rt.learners = _Pool(2), _Learners()
    rt.sync_weights()
    rt.sync_weights()
    joins, stream1, stream2 = rt.pool.calls
    assert [u.rank for u in joins[0]] == [1, 2] and joins[1] == "joined" and joins[2] is None
    assert {(u.address, u.port, u.world, u.backend) for u in joins[0]} == {("10.0.0.1", 4321, 3, "gloo")}
    assert rt.learners.joined[0].rank == 0 and rt.learners.joined[0].tag == joins[0][0].tag
    assert stream1[0] == [CollectiveWeights(1, joins[0][0].tag)] * 2 and stream1[1] == "sent"
    assert stream2[0] == [CollectiveWeights(2, joins[0][0].tag)] * 2
    assert rt.learners.sent == [(cfg.model.engine_dtype, 1, 1 << 19), (cfg.model.engine_dtype, 2, 1 << 19)]
    rt.pool.replaced = 1  # an engine was replaced: it is no member
    rt.sync_weights()
    rejoin, stream3 = rt.pool.calls[3:]
    assert rejoin[0][0].tag != joins[0][0].tag and stream3[0][0] == CollectiveWeights(3, rejoin[0][0].tag)
    rt._group = None  # what restart_learners does: the new rank 0 is no member
    rt.sync_weights()
    assert len(rt.pool.calls) == 7 and len(rt.learners.joined) == 3


def _member(port: int, tag: str, rank: int, world: int, q: mp.Queue) -> None:
    """An engine member of a ``world``-member group: its pid, then how its take of stream 1 ended and when."""
    torch.set_num_threads(1)
    group = collective.join(CollectiveJoin("127.0.0.1", port, rank, world, "gloo", 120.0, tag))
    q.put((rank, os.getpid()))
    t0 = time.monotonic()
    try:
        n = sum(1 for _ in collective.take(group, CollectiveWeights(1, tag)))
        q.put((rank, f"ok {n}", time.monotonic() - t0))
    except Exception as e:  # noqa: BLE001 - reported to the test
        q.put((rank, f"{type(e).__name__}: {e}", time.monotonic() - t0))


def test_a_member_killed_mid_stream_breaks_the_stream_at_once_for_everyone() -> None:
    """Engine member 1 is SIGKILLed after a few buckets: the learner's sender walks the export to its end
    (sharded ranks stay in step) and reports the failure instead of raising; its membership closes, so member
    2 fails at once rather than after the group's 120 s timeout."""
    port, tag = free_port(), uuid.uuid4().hex[:8]
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_member, args=(port, tag, r, 3, q)) for r in (1, 2)]
    for p in procs:
        p.start()
    try:
        group = collective.join(CollectiveJoin("127.0.0.1", port, 0, 3, "gloo", 120.0, tag))
        pids = dict(q.get(timeout=60) for _ in procs)
        tensors = {f"w{i}": torch.randn(64, 64) for i in range(200)}
        sender = collective.BucketSender(group, torch.bfloat16, 8192, 1)
        sender.begin([(k, tuple(v.shape)) for k, v in tensors.items()])
        for i, (k, v) in enumerate(tensors.items()):
            if i == 20:
                os.kill(pids[1], signal.SIGKILL)
            sender.send(k, v)
        t0 = time.monotonic()
        sent = sender.finish()
        assert time.monotonic() - t0 < 30
        assert sent.version == 1 and sent.broken, "the failure is reported, not raised"
        assert group.backend is None, "the membership is closed"
        rank, how, waited = q.get(timeout=60)
        assert rank == 2 and not how.startswith("ok") and waited < 60, (how, waited)
        with pytest.raises(RuntimeError, match="formed again"):
            group.broadcast(torch.zeros(1, dtype=torch.uint8))
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()


class _BrokenStreamPool(_Pool):
    """A pool whose streams break: the learner side reports ``broken``, or an engine's receive raises ``error``."""

    def __init__(self, n: int, error: BaseException | None = None) -> None:
        super().__init__(n)
        self.error, self.file_syncs = error, []

    def stream_weights(self, updates, learner_side, fallback) -> None:
        super().stream_weights(updates, learner_side, fallback)
        if self.error is not None and isinstance(updates[0], CollectiveWeights):
            raise self.error

    def sync_weights(self, path, source_node=None, fetch=None, *, adapter=False, delta=None) -> None:
        self.file_syncs.append((path, source_node, adapter, delta))


class _BrokenLearners(_Learners):
    def __init__(self, broken: str = "") -> None:
        super().__init__()
        self.broken, self.exports = broken, 0

    def export_collective(self, dtype: str, version: int, bucket: int) -> CollectiveWeights:
        super().export_collective(dtype, version, bucket)
        return CollectiveWeights(version, "", self.broken)

    def export_weights(self, dtype: str) -> str:
        self.exports += 1
        return "/dev/shm/x/weights.safetensors"

    def read_weights_ref(self, path: str, delta: bool = False) -> str:
        return f"ref:{path}"


@pytest.mark.parametrize("broken, error", [("RuntimeError: Connection reset by peer", None), ("", RuntimeError("x"))])
def test_a_broken_stream_is_redone_by_file_and_the_group_formed_again(recipe_copy, broken, error) -> None:
    """The learner's broadcast failed (an engine died mid-stream) or a surviving engine's receive raised: this
    sync goes to every engine by file, counted in ``faults/weight_stream_fallbacks``; the next sync forms the
    group again and streams."""
    from rl.config.recipe import load_recipe
    from rl.driver.ray_runtime import RayRuntime

    cfg = load_recipe(recipe_copy("tiny.yaml"), ["learner.weight_sync=collective"])
    rt = RayRuntime(cfg, "unused", Path("/nonexistent"), verbose=False)
    rt.pool, rt.learners, rt.learner_node = _BrokenStreamPool(2, error), _BrokenLearners(broken), "node-a"
    rt.rewards = type("R", (), {"metrics": lambda self: {}})()
    rt.pool.metrics = lambda: {}
    rt.sync_weights()
    assert len(rt.learners.joined) == 1 and rt.learners.exports == 1 and rt._group is None
    assert rt.pool.file_syncs == [("/dev/shm/x/weights.safetensors", "node-a", False, None)]
    assert rt.metrics() == {"faults/weight_stream_fallbacks": 1.0}
    assert rt.metrics() == {}, "counted once"
    rt.pool.error, rt.learners.broken = None, ""
    rt.sync_weights()
    assert len(rt.learners.joined) == 2, "formed again"
    assert len(rt.pool.file_syncs) == 1 and rt._group is not None, "streamed, no fallback"


def test_a_formation_that_breaks_is_a_file_sync_and_formed_again_next_time(recipe_copy) -> None:
    """An engine died before it joined: learner rank 0 answers ``JoinFailed`` (its rendezvous timed out) instead
    of raising; this sync goes by file, nothing is streamed, and the next sync forms the group and streams."""
    from rl.config.recipe import load_recipe
    from rl.driver.ray_runtime import RayRuntime

    class _NoJoin(_BrokenLearners):
        def join_weight_group(self, spec: CollectiveJoin):
            super().join_weight_group(spec)
            return JoinFailed("RuntimeError: Timed out") if len(self.joined) == 1 else None

    cfg = load_recipe(recipe_copy("tiny.yaml"), ["learner.weight_sync=collective"])
    rt = RayRuntime(cfg, "unused", Path("/nonexistent"), verbose=False)
    rt.pool, rt.learners, rt.learner_node = _BrokenStreamPool(2), _NoJoin(), "node-a"
    rt.sync_weights()
    assert rt._group is None and rt.learners.sent == [] and len(rt.pool.file_syncs) == 1
    assert rt._fallbacks == 1
    rt.sync_weights()
    assert rt._group is not None and len(rt.learners.sent) == 1 and len(rt.pool.file_syncs) == 1


def test_engine_and_learner_failures_in_a_stream_are_not_swallowed(recipe_copy) -> None:
    """No engine left to replace (``EngineFailure``) or a learner rank lost (``LearnerFailure``): raised as
    the file path raises them (the run's own fault paths), no fallback."""
    from rl.config.recipe import load_recipe
    from rl.driver.ray_runtime import RayRuntime
    from rl.driver.runtime import LearnerFailure
    from rollout.pool import EngineFailure

    cfg = load_recipe(recipe_copy("tiny.yaml"), ["learner.weight_sync=collective"])
    for error in (EngineFailure("rollout worker 0 died 3 times"), LearnerFailure(0, "export_collective", "died")):
        rt = RayRuntime(cfg, "unused", Path("/nonexistent"), verbose=False)
        rt.pool, rt.learners = _BrokenStreamPool(2, error), _BrokenLearners()
        with pytest.raises(type(error)):
            rt.sync_weights()
        assert rt.pool.file_syncs == []


def test_learner_join_whose_members_never_come_answers_join_failed(tmp_path) -> None:
    """Learner rank 0 forms a 2-member group whose engine never joins: after the group's timeout the export
    answers ``JoinFailed`` (the learner process is intact) and holds no membership."""
    from rl.trainer.weights import WeightExport

    export = WeightExport(None, None, 0, torch.device("cpu"), tmp_path)
    got = export.join_group(CollectiveJoin("127.0.0.1", free_port(), 0, 2, "gloo", 1.0, uuid.uuid4().hex[:8]))
    assert isinstance(got, JoinFailed) and got.why, got
    assert export._group is None
