"""rl.algos.schedules: the LR multiplier and the KL controllers, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from rl.algos.schedules import AdaptiveKLController, FixedKLController, LRSchedule, kl_controller


def test_warmup_then_constant():
    s = LRSchedule(warmup=4, kind="constant")
    # (s + 1) / 4 for s < 4, then 1
    assert [s(i) for i in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert LRSchedule()(0) == 1.0  # no warmup: full lr from the first step


def test_warmup_then_cosine_to_min_ratio():
    s = LRSchedule(warmup=2, kind="cosine", total=6, min_ratio=0.1)
    # warmup: 0.5, 1.0; then p = (s - 2) / (6 - 2) = 0, 0.25, 0.5, 0.75 and
    # 0.1 + 0.9 * 0.5 * (1 + cos(pi p)): p=0 -> 1.0; p=0.25 -> 0.1 + 0.45 * 1.7071068 = 0.8681981;
    # p=0.5 -> 0.1 + 0.45 = 0.55; p=0.75 -> 0.1 + 0.45 * 0.2928932 = 0.2318019; past the end: 0.1
    want = [0.5, 1.0, 1.0, 0.8681981, 0.55, 0.2318019, 0.1, 0.1]
    assert [s(i) for i in range(8)] == pytest.approx(want, abs=1e-7)


def test_schedule_errors():
    with pytest.raises(ValueError, match="total"):
        LRSchedule(kind="cosine", total=0)
    with pytest.raises(ValueError, match="unknown lr schedule"):
        LRSchedule(kind="linear")
    with pytest.raises(ValueError, match="min_ratio"):
        LRSchedule(min_ratio=1.5)


def test_schedule_in_lambda_lr_state_round_trip():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=2.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, LRSchedule(warmup=2, kind="cosine", total=4, min_ratio=0.0))
    lrs = []
    for _ in range(4):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # 2 * [0.5, 1.0, p=0: 1.0, p=1/2: 0.5 * (1 + cos(pi / 2)) = 0.5]
    assert lrs == pytest.approx([1.0, 2.0, 2.0, 1.0])
    opt2 = torch.optim.SGD([p], lr=2.0)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, LRSchedule(kind="constant"))
    sched2.load_state_dict(sched.state_dict())  # the schedule's fields travel with the state
    opt2.load_state_dict(opt.state_dict())
    sched2.step()
    # step 5 of the restored cosine schedule: p = min(1, (5 - 2) / 2) = 1 -> 0
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)


def test_adaptive_kl_controller_ziegler():
    c = AdaptiveKLController(init_coef=0.1, target=0.05, horizon=100)
    # kl 0.06: error = 0.06 / 0.05 - 1 = 0.2 -> value = 0.1 * (1 + 0.2 * 10 / 100) = 0.102
    assert c.update(0.06, n_steps=10) == pytest.approx(0.102)
    # kl 1.0: error 19 clipped to 0.2 -> 0.102 * 1.02 = 0.10404
    assert c.update(1.0, n_steps=10) == pytest.approx(0.10404)
    # kl 0.04: error = 0.04 / 0.05 - 1 = -0.2 -> 0.10404 * (1 - 0.2 * 50 / 100) = 0.10404 * 0.9 = 0.093636
    assert c.update(0.04, n_steps=50) == pytest.approx(0.093636)
    # kl 0.0: error -1 clipped to -0.2 -> 0.093636 * (1 - 0.2 * 100 / 100) = 0.0749088
    assert c.update(0.0, n_steps=100) == pytest.approx(0.0749088)
    # a non-finite KL leaves the coefficient alone
    assert c.update(math.nan, n_steps=10) == pytest.approx(0.0749088)
    d = AdaptiveKLController(1.0, 1.0, 1)
    d.load_state_dict(c.state_dict())
    assert (d.value, d.target, d.horizon) == (c.value, 0.05, 100)


def test_fixed_kl_controller_and_factory():
    f = FixedKLController(0.02)
    assert f.update(5.0, 100) == 0.02 and f.value == 0.02
    assert isinstance(kl_controller(0.02, 0.0, 10), FixedKLController)
    assert isinstance(kl_controller(0.02, 0.1, 10), AdaptiveKLController)
    with pytest.raises(ValueError, match="target"):
        AdaptiveKLController(0.1, 0.0, 10)
