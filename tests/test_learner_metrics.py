"""rl.trainer.metrics: the learner's statistics as typed records, named as the driver logs them."""

from __future__ import annotations

import pytest

from rl.algos.objective import ObjectiveStats
from rl.trainer.metrics import Present, StepMetrics, Sums, UpdateLog


def test_sums_round_trip_and_step_metrics_names():
    s = Sums()
    s.add(ObjectiveStats(policy_loss=0.5, kl_loss=0.1, kl_sum=2.0, policy={"clip/fraction": 0.25}), 8.0, 4.0, True)
    s.add(ObjectiveStats(policy_loss=0.3, kl_loss=0.2, kl_sum=1.0, policy={"clip/fraction": 0.5}), 4.0, 2.0, False)
    names = ("clip/fraction",)
    again = Sums.of(s.values(names), names)
    assert again == s
    log = UpdateLog(lr=1e-3, norms=[1.0, 3.0], skipped=1)
    m = StepMetrics.of(again, log, n_up=2, updates=1, computed=True, terms=Present(kl=True))
    d = m.to_dict()
    assert d["loss/policy"] == pytest.approx(0.4) and d["loss/kl"] == pytest.approx(0.15)
    assert d["kl/mean"] == pytest.approx(3.0 / 12) and d["entropy/mean"] == pytest.approx(6.0 / 12)
    assert d["clip/fraction"] == pytest.approx((0.25 * 8 + 0.5 * 4) / 12)
    assert d["grad/norm"] == 2.0 and d["learner/skipped_update"] == 0.5 and d["learner/tokens"] == 8.0
    assert not {"loss/value", "loss/entropy", "critic/grad_norm", "memory/trimmed", "kl/coef"} & set(d)
