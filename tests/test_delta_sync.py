"""Weight-change measurement at export (``rl.trainer.weights.ChangeCount``): ``weights/changed_fraction``."""

from __future__ import annotations

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
