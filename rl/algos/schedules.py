"""Schedules of the learner: the learning-rate multiplier and the KL coefficient controllers.

What this module does: small, pure, checkpointable objects.

* :class:`LRSchedule`: linear warmup, then constant or cosine decay to ``min_ratio``; a
  multiplier of the base learning rate per optimizer step, used through
  ``torch.optim.lr_scheduler.LambdaLR`` (whose ``state_dict`` then holds it).
* :class:`FixedKLController` and :class:`AdaptiveKLController` (Ziegler et al. 2019,
  "Fine-Tuning Language Models from Human Preferences"): the coefficient of the KL penalty
  (in the loss or in the reward), updated once per learner step from the measured KL.

What it does not do: no I/O, no torch.distributed (a data-parallel caller passes the
globally reduced KL, so every rank computes the same coefficient), no optimizer stepping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["LRSchedule", "FixedKLController", "AdaptiveKLController", "kl_controller"]

LR_SCHEDULES = ("constant", "cosine")


@dataclass
class LRSchedule:
    """Multiplier of the base learning rate for optimizer step ``s`` (0-based)::

        s <  warmup:  (s + 1) / warmup                      (linear warmup, reaches 1 at s = warmup - 1)
        s >= warmup:  constant: 1
                      cosine:   min_ratio + (1 - min_ratio) * 0.5 * (1 + cos(pi * p)),
                                p = min(1, (s - warmup) / max(1, total - warmup))

    ``total`` is the number of optimizer steps of the run (only cosine needs it; past it the
    multiplier stays at ``min_ratio``). A callable object (not a lambda) so that
    ``LambdaLR.state_dict()`` saves its fields with the scheduler.
    """

    warmup: int = 0
    kind: str = "constant"
    total: int = 0
    min_ratio: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in LR_SCHEDULES:
            raise ValueError(f"unknown lr schedule {self.kind!r}; choose one of {', '.join(LR_SCHEDULES)}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        if not 0.0 <= self.min_ratio <= 1.0:
            raise ValueError(f"min_ratio must be in [0, 1], got {self.min_ratio}")
        if self.kind == "cosine" and self.total <= 0:
            raise ValueError("a cosine schedule needs the run's total number of optimizer steps (total > 0)")

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        if self.kind == "constant":
            return 1.0
        p = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.min_ratio + (1.0 - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))


class FixedKLController:
    """A constant KL coefficient; ``update`` does nothing."""

    def __init__(self, coef: float) -> None:
        self.value = float(coef)

    def update(self, current_kl: float, n_steps: int) -> float:
        return self.value

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Ziegler et al.'s proportional controller, steering the measured KL toward ``target``.

    After each learner step with measured KL ``kl`` over ``n_steps`` samples::

        error = clip(kl / target - 1, -0.2, 0.2)
        value = value * (1 + error * n_steps / horizon)

    so the coefficient grows while the KL is above the target and shrinks below it, by at
    most a factor ``1 +- 0.2 * n_steps / horizon`` per step. A non-finite ``kl`` leaves the
    value unchanged.
    """

    def __init__(self, init_coef: float, target: float, horizon: int) -> None:
        if target <= 0:
            raise ValueError(f"target must be > 0, got {target}")
        if horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        self.value, self.target, self.horizon = float(init_coef), float(target), int(horizon)

    def update(self, current_kl: float, n_steps: int) -> float:
        if math.isfinite(current_kl):
            error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
            self.value *= 1.0 + error * n_steps / self.horizon
        return self.value

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value, self.target, self.horizon = float(state["value"]), float(state["target"]), int(state["horizon"])


def kl_controller(coef: float, target: float, horizon: int) -> FixedKLController | AdaptiveKLController:
    """``AdaptiveKLController`` when ``target > 0``, else a fixed coefficient."""
    return AdaptiveKLController(coef, target, horizon) if target > 0 else FixedKLController(coef)
