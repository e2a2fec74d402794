"""Settings of the adaptive domain-mixing mode: the ``mixer.adaptive`` section of a recipe.

``AdaptiveConfig`` is a recipe section like ``algo.optim``: each setting a ``knob`` with its type,
bounds and doc line, so that the builder checks it (naming ``mixer.adaptive.<key>`` and its YAML
line), ``jointrl validate --print`` shows it and ``rl.config.docgen`` lists it. ``floor`` and
``ceiling`` take one number or a ``{domain: number}`` map. ``bounds(domains)`` checks what needs the
run's domains (a map naming a domain without tasks, floors that cannot sum to 1) at validate time.

They live in ``rl/config`` (not beside the mixer in ``rl/data/mixer.py``) so that the recipe can check
them at validate time while imports keep pointing down (``rl.data`` -> ``rl.config``). What the
weights do with them is ``rl.data.mixer.AdaptiveDomainWeights``.
"""

from __future__ import annotations

from dataclasses import dataclass
import typing
from typing import Any, Literal

from rl.config.fields import FieldError, Section, build, knob

MixerMode = Literal["fixed", "adaptive"]  # mixer.mode
MIXER_MODES: tuple[str, ...] = typing.get_args(MixerMode)


def _weight_bound(v: Any) -> str | None:
    """A number in [0, 1] (its range is checked by the field's bounds) or a ``{domain: number in [0, 1]}`` map."""
    if not isinstance(v, dict):
        return None if isinstance(v, (int, float)) and not isinstance(v, bool) else f"expected a number, got {v!r}"
    for domain, x in v.items():
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 <= x <= 1:
            raise FieldError(str(domain), f"must be a number in [0, 1], got {x!r}")
    return None


@dataclass(frozen=True)
class AdaptiveConfig(Section):
    """Settings of the adaptive mode (``mixer.adaptive``; read only with ``mixer.mode: adaptive``)."""

    floor: float | dict[str, float] = knob(
        0.05,
        "a domain's lowest weight: one number for every domain, or a {domain: number} map (missing domains: 0.05)",
        ge=0,
        le=1,
        check=_weight_bound,
    )
    ceiling: float | dict[str, float] = knob(
        1.0,
        "a domain's highest weight: one number for every domain, or a {domain: number} map (missing domains: 1.0)",
        ge=0,
        le=1,
        check=_weight_bound,
    )
    rate: float = knob(0.3, "how far the weights move toward their target per step (1 = jump)", gt=0, le=1)
    signal_ema: float = knob(0.5, "EMA weight of a step's fraction of groups with reward variance", gt=0, le=1)
    trend_fast: float = knob(0.5, "EMA weight of the fast reward average (trend = fast - slow)", gt=0, le=1)
    trend_slow: float = knob(0.1, "EMA weight of the slow reward average", gt=0, le=1)
    trend_coef: float = knob(2.0, "how much one unit of |trend| adds to a domain's signal", ge=0)
    initial_signal: float = knob(
        0.5, "a domain's signal before its first step when its tasks carry no measured difficulty", ge=0
    )

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "mixer.adaptive") -> AdaptiveConfig:
        """Settings from plain data (types, bounds and unknown keys checked); errors name ``<where>.<key>``."""
        return build(cls, dict(d), where)

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
