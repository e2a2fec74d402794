"""Settings of the adaptive domain-mixing mode (``mixer.adaptive``), checked where declared.

They live in ``rl/config`` (not beside the mixer in ``rl/data/mixer.py``) so that the recipe can check
them at validate time while imports keep pointing down (``rl.data`` -> ``rl.config``). What the
weights do with them is ``rl.data.mixer.AdaptiveDomainWeights``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MIXER_MODES = ("fixed", "adaptive")


@dataclass
class AdaptiveConfig:
    """Settings of the adaptive mode (``mixer.adaptive`` in a recipe; every key optional).

    ``floor`` / ``ceiling``: a domain's weight bounds, one number for every domain or a
    ``{domain: number}`` map (missing domains get ``0.05`` / ``1.0``). ``rate``: how far the
    weights move toward their target per step (smoothing; 1 = jump). ``signal_ema``: EMA
    weight of a step's fraction of groups with reward variance. ``trend_fast`` /
    ``trend_slow``: EMA weights of the two reward averages whose difference is the trend.
    ``trend_coef``: how much one unit of |trend| adds to the signal. ``initial_signal``: a
    domain's signal before any step when its tasks carry no measured difficulty.
    """

    floor: float | dict[str, float] = 0.05
    ceiling: float | dict[str, float] = 1.0
    rate: float = 0.3
    signal_ema: float = 0.5
    trend_fast: float = 0.5
    trend_slow: float = 0.1
    trend_coef: float = 2.0
    initial_signal: float = 0.5

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "mixer.adaptive") -> "AdaptiveConfig":
        from dataclasses import fields

        names = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(names))
        if unknown:
            raise ValueError(f"{where}.{unknown[0]}: unknown key (allowed: {', '.join(names)})")
        cfg = cls(**d)
        for key in ("rate", "signal_ema", "trend_fast", "trend_slow"):
            v = getattr(cfg, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
                raise ValueError(f"{where}.{key}: must be a number in (0, 1], got {v!r}")
        for key in ("trend_coef", "initial_signal"):
            v = getattr(cfg, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"{where}.{key}: must be a number >= 0, got {v!r}")
        for key in ("floor", "ceiling"):
            v = getattr(cfg, key)
            vals = v.values() if isinstance(v, dict) else [v]
            if any(isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 <= x <= 1 for x in vals):
                raise ValueError(f"{where}.{key}: must be a number in [0, 1] or a {{domain: number}} map, got {v!r}")
        return cfg

    def bounds(self, domains: list[str]) -> tuple[dict[str, float], dict[str, float]]:
        def per(v: float | dict[str, float], default: float) -> dict[str, float]:
            return (
                {d: float(v.get(d, default)) for d in domains}
                if isinstance(v, dict)
                else {d: float(v) for d in domains}
            )

        floor, ceiling = per(self.floor, 0.05), per(self.ceiling, 1.0)
        for key, v in (("floor", self.floor), ("ceiling", self.ceiling)):
            if isinstance(v, dict) and set(v) - set(domains):
                raise ValueError(f"mixer.adaptive.{key}: names domains without tasks: {sorted(set(v) - set(domains))}")
        bad = [d for d in domains if floor[d] > ceiling[d]]
        if bad:
            raise ValueError(f"mixer.adaptive: floor above ceiling for {bad}")
        if sum(floor.values()) > 1 + 1e-9 or sum(ceiling.values()) < 1 - 1e-9:
            raise ValueError(
                f"mixer.adaptive: infeasible bounds for {len(domains)} domains: floors sum to "
                f"{sum(floor.values()):.3f} (must be <= 1), ceilings to {sum(ceiling.values()):.3f} "
                f"(must be >= 1)"
            )
        return floor, ceiling
