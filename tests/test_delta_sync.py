"""Weight-change measurement at export (``rl.trainer.weights.ChangeCount``): ``weights/changed_fraction``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rl.trainer.weights import ChangeCount, ShmFileSender


def _export(sender: ShmFileSender, tensors: dict[str, torch.Tensor], tied: dict[str, str] | None = None) -> str:
    tied = tied or {}
    sender.begin(
        [(k, tuple(v.shape)) for k, v in tensors.items()] + [(k, tuple(tensors[f].shape)) for k, f in tied.items()]
    )
    for k, v in tensors.items():
        sender.send(k, v)
    for k, f in tied.items():
        sender.alias(k, f)
    return sender.finish().path


def test_changed_fraction_counts_bf16_bits_against_the_previous_export(tmp_path):
    torch.manual_seed(0)
    w = {"a": torch.randn(10, 10), "b": torch.randn(50)}
    s = ShmFileSender(tmp_path, torch.bfloat16)
    _export(s, w)
    assert s.changes.take() == {}  # nothing to compare the first export with
    w2 = {"a": w["a"].clone(), "b": w["b"].clone()}
    w2["a"][0, :7] += 1.0  # 7 elements change in bf16
    w2["b"][3] += 1e-6  # below bf16's resolution at |x|~1: the engine's weight does not change
    _export(s, w2)
    assert s.changes.take() == {"weights/changed_fraction": pytest.approx(7 / 150)}
    assert s.changes.take() == {}  # once per export
    w3 = {"a": w2["a"].clone(), "b": w2["b"].clone()}
    w3["b"][:] = 0.0
    _export(s, w3)  # compared with the last export (the other slot), not the one before it
    got = s.changes.take()["weights/changed_fraction"]
    assert got == pytest.approx(int((w2["b"].to(torch.bfloat16) != 0).sum()) / 150)
    s.close()


def test_changed_fraction_sees_nan_and_tied_copies(tmp_path):
    w = {"e": torch.ones(4, 4)}
    s = ShmFileSender(tmp_path, torch.bfloat16)
    _export(s, w, tied={"lm_head.weight": "e"})
    w["e"][0, 0] = float("nan")
    _export(s, w, tied={"lm_head.weight": "e"})
    assert s.changes.take()["weights/changed_fraction"] == pytest.approx(2 / 32)
    _export(s, w, tied={"lm_head.weight": "e"})  # NaN bits unchanged: nothing changed
    assert s.changes.take()["weights/changed_fraction"] == 0.0
    s.close()


def test_a_new_layout_is_not_compared(tmp_path):
    s = ShmFileSender(tmp_path, torch.bfloat16)
    _export(s, {"a": torch.zeros(3)})
    _export(s, {"a": torch.zeros(4)})
    assert s.changes.take() == {}
    c = ChangeCount()
    c.begin(measured=True)
    c.finish()
    assert c.take() == {}  # an empty export has no fraction


# ---- delta sync: rl.trainer.weights (learner) -> rollout.weights.DeltaWeights -> rollout.pool (engine) ----------


class _Policy(torch.nn.Module):
    """A stand-in policy: a few parameters, no output embeddings (WeightExport exports its state dict)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Parameter(torch.randn(64, 32) * 0.02)
        self.b = torch.nn.Parameter(torch.randn(300))

    def get_output_embeddings(self):
        return None


class _Engine:
    def __init__(self) -> None:
        self.loaded: list[bytes] = []

    def load_weights(self, path: str) -> None:
        self.loaded.append(Path(path).read_bytes())

    def shutdown(self) -> None:
        pass


def _worker(tiny_model_path, blob: Path):
    from rollout.pool import RolloutWorker

    w = RolloutWorker(tiny_model_path, [], engine=_Engine())
    w._blob = str(blob)  # two workers in one process: each its own held file
    return w


def _train(policy: _Policy, step: int) -> None:
    """An optimizer step's worth of change: a few entries move visibly in bf16, the rest by far less than its ulp."""
    with torch.no_grad():
        policy.a.add_(1e-7)
        policy.a.view(-1)[step * 7 : step * 7 + 5] += 0.5
        policy.b[step % 300] -= 1.0


def _sync(exp, path: str, worker, delta: bool) -> str:
    """The driver's object-store route: the delta when asked and available; a refused delta is repaired by a full sync."""
    update = exp.read_update(path, delta=delta)
    if worker.receive(update):
        return type(update).__name__
    assert worker.receive(exp.read_update(path))
    return "repaired"


def test_delta_sync_equals_full_sync_bit_for_bit(tiny_model_path, tmp_path):
    from rl.trainer.weights import WeightExport
    from rollout.weights import DeltaWeights

    policy = _Policy()
    exp = WeightExport(policy, None, 0, torch.device("cpu"), tmp_path / "learner")
    by_delta, by_full = (
        _worker(tiny_model_path, tmp_path / "d.safetensors"),
        _worker(tiny_model_path, tmp_path / "f.safetensors"),
    )
    kinds, full_every, before = [], 4, {}
    for step in range(10):
        path = exp.file("bfloat16")
        kinds.append(_sync(exp, path, by_delta, delta=step % full_every != 0))
        by_full.receive(WeightExport.read(path))
        published = Path(path).read_bytes()
        assert Path(by_delta._blob).read_bytes() == published == Path(by_full._blob).read_bytes()
        assert by_delta.engine.loaded[-1] == published
        update = exp.read_update(path, delta=True)
        now = {k: v.detach().to(torch.bfloat16).view(torch.int16) for k, v in policy.state_dict().items()}
        if isinstance(update, DeltaWeights):  # what crossed: exactly the entries whose bf16 bits changed
            changed = sum(int((now[k] != before[k]).sum()) for k in now)
            assert 5 <= sum(i.numel() for _, i, _ in update.changes) == changed < 40
        before = now
        _train(policy, step)
    # the first delta request turns keeping on, so step 1 is still full; then deltas between the full syncs
    b, d = "BlobWeights", "DeltaWeights"
    assert kinds == [b, b, d, d, b, d, d, d, b, d]


def test_drift_is_detected_and_repaired_by_a_full_sync(tiny_model_path, tmp_path):
    from rl.trainer.weights import WeightExport

    policy = _Policy()
    exp = WeightExport(policy, None, 0, torch.device("cpu"), tmp_path / "learner")
    w = _worker(tiny_model_path, tmp_path / "e.safetensors")
    for step in range(3):
        _sync(exp, exp.file("bfloat16"), w, delta=True)
        _train(policy, step)
    path = exp.file("bfloat16")
    raw = bytearray(Path(w._blob).read_bytes())
    raw[-3] ^= 0x40  # the engine's held weights drift (one bit of one element that the next delta does not touch)
    Path(w._blob).write_bytes(bytes(raw))
    loads = len(w.engine.loaded)
    assert _sync(exp, path, w, delta=True) == "repaired"
    assert len(w.engine.loaded) == loads + 1  # the drifted file was never loaded, only the repaired one
    assert Path(w._blob).read_bytes() == Path(path).read_bytes()
    _train(policy, 3)
    assert _sync(exp, exp.file("bfloat16"), w, delta=True) == "DeltaWeights"  # deltas resume on the repaired file
    # an engine that missed an export (a restart, a lost sync) holds another base: refused, then repaired
    _train(policy, 4)
    exp.file("bfloat16")  # never sent to this engine
    _train(policy, 5)
    path = exp.file("bfloat16")
    assert _sync(exp, path, w, delta=True) == "repaired"
    assert Path(w._blob).read_bytes() == Path(path).read_bytes()


def test_a_delta_larger_than_a_third_of_the_file_is_sent_full(tmp_path):
    from rl.trainer.weights import WeightExport
    from rollout.weights import BlobWeights, DeltaWeights

    policy = _Policy()
    exp = WeightExport(policy, None, 0, torch.device("cpu"), tmp_path / "learner")
    exp.read_update(exp.file("bfloat16"), delta=True)
    _train(policy, 0)
    assert isinstance(exp.read_update(exp.file("bfloat16"), delta=True), BlobWeights)  # no base digest yet
    _train(policy, 1)
    assert isinstance(exp.read_update(exp.file("bfloat16"), delta=True), DeltaWeights)
    with torch.no_grad():
        policy.a.mul_(1.5)  # every entry of the larger tensor changes
    update = exp.read_update(exp.file("bfloat16"), delta=True)
    assert isinstance(update, BlobWeights) and update.digest  # full, with its identity for the next delta


def test_delta_sync_refused_where_it_cannot_run():
    from rl.config.cluster_checks import check_cluster
    from rl.config.recipe import RecipeError, load_recipe

    path = Path(__file__).resolve().parents[1] / "recipes" / "quickstart.yaml"
    check_cluster(load_recipe(path, ["learner.delta_sync_full_every=8"]))  # file sync: accepted
    bad = load_recipe(path, ["learner.delta_sync_full_every=8", "learner.lora.rank=8", "learner.lora.transfer=adapter"])
    with pytest.raises(RecipeError, match="learner.delta_sync_full_every"):
        check_cluster(bad)


def test_pool_sends_deltas_off_node_and_repairs_refusals_with_a_full_sync(tiny_model_path, tmp_path):
    """``RolloutPool.sync_weights`` with ``delta``: engines on the learner's node read the file, the others get the
    delta; one that refuses it (it missed a sync) gets the full weights, counted in ``weights/delta_repairs``."""
    from rl.driver.actors.rollout import RolloutPool
    from rl.trainer.weights import WeightExport

    policy = _Policy()
    exp = WeightExport(policy, None, 0, torch.device("cpu"), tmp_path / "learner")
    workers = [_worker(tiny_model_path, tmp_path / f"w{i}.safetensors") for i in range(3)]
    pool = RolloutPool.__new__(RolloutPool)  # the routing alone: workers called in-process instead of through Ray
    pool._repairs, pool._weights = 0, None
    pool._placement = [("learner-node", [], []), ("other", [], []), ("other", [], [])]
    pool.group = type("G", (), {"metrics": lambda self: {}, "actors": workers})()
    sent: list[str] = []

    def call(jobs):
        out = {}
        for i, (method, (update,)) in jobs.items():
            sent.append(f"{i}:{type(update).__name__}")
            out[i] = getattr(workers[i], method)(update)
        return out

    pool._call = call

    def sync(delta: bool) -> None:
        path = exp.file("bfloat16")
        full, dlt = (lambda: exp.read_update(path)), (lambda: exp.read_update(path, delta=True))
        pool.sync_weights(path, "learner-node", full, delta=dlt if delta else None)

    for step in range(3):
        sync(delta=step > 0)
        _train(policy, step)
    sent.clear()
    workers[2]._held = "lost"  # engine 2 missed a sync
    sync(delta=True)
    assert sent == ["0:FileWeights", "1:DeltaWeights", "2:DeltaWeights", "2:BlobWeights"]
    assert pool.metrics() == {"weights/delta_repairs": 1.0}
    assert pool.metrics() == {}
    for w in workers[1:]:
        assert Path(w._blob).read_bytes() == Path(exp.shm_dir / "policy.safetensors").read_bytes()


def test_changed_fraction_of_the_ipc_buffer_compares_before_overwriting():
    from rl.trainer.weights import CudaIpcSender

    s = CudaIpcSender(torch.device("cpu"), torch.bfloat16)  # the packing alone runs on any device
    for i, new in enumerate([torch.zeros(10), torch.zeros(10), torch.arange(10.0)]):
        s.begin([("w", (10,)), ("u", (10,)), ("tied", (10,))])
        s.send("w", new)
        s.send("u", torch.ones(10))  # never changes
        s.alias("tied", "w")
        s.changes.finish()  # what finish does after its CUDA synchronize
        # the third export: 9 of w's 10 entries change, and so do the tied copy's: 18 of 30
        assert s.changes.take() == ({} if i == 0 else {"weights/changed_fraction": [0.0, 0.6][i - 1]})
        assert torch.equal(s._view("tied"), new.to(torch.bfloat16))


def test_the_delta_threshold_counts_the_indices_as_sent(tmp_path):
    """A delta of int32 indices and bf16 values (6 bytes an entry) is kept up to a third of the file's bytes."""
    from rl.trainer.weights import WeightExport
    from rollout.weights import DeltaWeights

    policy = _Policy()
    exp = WeightExport(policy, None, 0, torch.device("cpu"), tmp_path / "learner")
    for _ in range(2):
        exp.read_update(exp.file("bfloat16"), delta=True)
    with torch.no_grad():
        policy.a.view(-1)[:200] += 1.0  # 200 of 2348 entries: 1200 bytes sent, under a third of ~4.7 kB
    update = exp.read_update(exp.file("bfloat16"), delta=True)
    assert isinstance(update, DeltaWeights) and update.changes[0][1].dtype == torch.int32
