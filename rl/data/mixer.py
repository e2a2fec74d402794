"""The task mixer: which tasks each step trains on. (Putting the rewards of different domains on
one scale is a reward-shaping stage before the estimator: ``rl.algos.shaping``.)

Drawing (``TaskMixer.sample``), per step:

1. **Domains.** ``per_step`` prompts are split over domains by their weights with
   largest-remainder rounding of what the cumulative targets still owe, so every step
   holds exact per-domain counts within one of the exact share (weights 0.4/0.3/0.3 and
   8 prompts give 3/3/2, 4/2/2, 3/2/3..., never 8/0/0) and the totals over many steps
   follow the weights exactly. Ties are broken by the seeded RNG. With a floor
   (``min_groups_per_domain``, ``mixer.min_groups_per_domain``) every domain of positive weight
   first gets that many prompts, and the rest of the step is split by the weights the same
   way: a group-baseline update learns only from groups whose rewards vary, and a domain
   drawn once or twice a step at a low pass rate has steps with no such group at all
   (``bench/seed_divergence.py`` counts them), so its learning rests on a handful of groups
   that differ from seed to seed.
2. **Datasets.** Within a domain, the domain's count is split over its datasets (several
   files may serve one domain, each with a weight) the same way.
3. **Length strata.** Every task carries an estimated trajectory length in tokens: a prior
   (``meta["est_len"]``, else the dataset's mean prompt-free default for its domain) that
   is replaced by an EMA of the lengths its rollouts actually had. Each dataset's tasks
   fall into K strata by estimated length (equal-count quantiles, recomputed as estimates
   move); a dataset's count is split over strata by the configured proportions (default:
   proportional to stratum sizes), so long terminal episodes do not crowd out short tool
   calls, and every stratum is represented over time.
4. **Curriculum.** Within a stratum, tasks are drawn from a seeded shuffled queue, each
   once per pass. A task whose last ``curriculum_window`` visits were all solved or all
   failed (no learning signal) sits out a pass with probability ``1 - curriculum_weight``.
5. **Spread** (``mixer.spread_by``, e.g. ``template``). With a task ``meta`` key set, each
   draw takes the first queued task whose value of that key the dataset has drawn least
   often (across its strata; a task without the key is a value of its own), so every value
   is drawn once before any is drawn twice. A short run draws a domain a few dozen times
   from dozens of templates: a plain shuffle leaves a different quarter of them undrawn in
   each seed, and what a run learns, and carries to held-out templates, differs with them.

Adaptive domain weights (``mixer.mode: adaptive``, :class:`AdaptiveTaskMixer`; fixed weights
are the default): each domain's weight follows its learning signal online, the fraction of
its groups with reward variance plus the size of its recent reward trend, within a floor
and a ceiling per domain, smoothed (:class:`AdaptiveDomainWeights`). The curriculum and the
adaptive signal both start from a task set's measured difficulty (``meta["base_pass_rate"]``,
written by ``jointrl difficulty``) when the tasks carry it.

The whole state (RNG, length estimates, visit history) is in
``state_dict()``: a resumed run draws exactly what the uninterrupted run would have.
This module does not run rollouts or touch models.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any


from envs.types import Task, Trajectory
from rl.config.adaptive import MIXER_MODES, AdaptiveConfig  # noqa: F401 - re-exported: the mixer's settings

DEFAULT_LENGTH = {"tool_call": 64, "code": 256, "terminal": 512}


def largest_remainder(total: int, weights: list[float], rng: random.Random | None = None) -> list[int]:
    """Split ``total`` into integer counts proportional to ``weights`` (sum exactly ``total``).

    Each gets ``floor(total * w / sum(w))``; the leftover units go to the largest
    remainders (ties broken by ``rng`` when given, else by position). Zero weights get 0.
    """
    if total < 0 or any(w < 0 for w in weights) or not weights:
        raise ValueError(f"need total >= 0 and non-negative weights, got {total}, {weights}")
    s = sum(weights)
    if s <= 0:
        raise ValueError("weights sum to 0")
    exact = [total * w / s for w in weights]
    counts = [math.floor(x) for x in exact]
    rest = total - sum(counts)
    tiebreak = [rng.random() if rng else -i for i in range(len(weights))]
    order = sorted(range(len(weights)), key=lambda i: (exact[i] - counts[i], tiebreak[i]), reverse=True)
    for i in order[:rest]:
        counts[i] += 1
    return counts


@dataclass
class Source:
    """One task file's tasks, its domain and its weight within the domain."""

    name: str
    domain: str
    tasks: list[Task]
    weight: float = 1.0


@dataclass
class _TaskStats:
    est_len: float
    visits: deque = field(default_factory=lambda: deque(maxlen=64))  # 1 solved / 0 not, per visit


class TaskMixer:
    """Seeded, resumable task drawing across domains, datasets and length strata."""

    def __init__(
        self,
        sources: list[Source],
        per_step: int,
        seed: int = 0,
        *,
        domain_weights: dict[str, float] | None = None,
        strata: int = 1,
        strata_proportions: list[float] | None = None,
        length_ema: float = 0.5,
        curriculum_window: int = 0,
        curriculum_weight: float = 1.0,
        solved_threshold: float = 1.0,
        min_groups_per_domain: int = 0,
        spread_by: str = "",
    ) -> None:
        if not sources or not any(s.tasks for s in sources):
            raise ValueError("no training tasks")
        if spread_by and not any(spread_by in t.meta for s in sources for t in s.tasks):
            raise ValueError(f"mixer.spread_by: no training task has {spread_by!r} in its meta")
        if strata < 1:
            raise ValueError(f"strata must be >= 1, got {strata}")
        if strata_proportions and len(strata_proportions) != strata:
            raise ValueError(f"strata_proportions has {len(strata_proportions)} entries for {strata} strata")
        self.sources = [s for s in sources if s.tasks]
        self.per_step, self.strata = per_step, strata
        self.strata_proportions = list(strata_proportions or [])
        self.length_ema = length_ema
        self.curriculum_window, self.curriculum_weight = curriculum_window, curriculum_weight
        self.solved_threshold = solved_threshold
        domains = sorted({s.domain for s in self.sources})
        weights = dict(domain_weights or {})
        unknown = sorted(set(weights) - set(domains))
        if unknown:
            raise ValueError(f"domain weights name domains without tasks: {unknown} (tasks have {domains})")
        self.domain_weights = {d: float(weights.get(d, 0.0 if weights else 1.0)) for d in domains}
        if sum(self.domain_weights.values()) <= 0:
            raise ValueError("every domain weight is 0")
        self.min_groups_per_domain = int(min_groups_per_domain)
        n_floored = self._floored_domains()
        if self.min_groups_per_domain < 0 or n_floored * self.min_groups_per_domain > per_step:
            raise ValueError(
                f"min_groups_per_domain {self.min_groups_per_domain} for {n_floored} domains needs "
                f"{n_floored * self.min_groups_per_domain} prompts per step; per_step is {per_step}"
            )
        self.spread_by = spread_by
        self._spread: dict[int, dict[str, int]] = {}  # per source index: draws per value of meta[spread_by]
        self.rng = random.Random(seed)
        self.stats: dict[str, _TaskStats] = {}
        for s in self.sources:
            for t in s.tasks:
                prior = t.meta.get("est_len") if isinstance(t.meta.get("est_len"), (int, float)) else None
                self.stats.setdefault(t.id, _TaskStats(float(prior or DEFAULT_LENGTH.get(t.domain, 128))))
                self._seed_visits(t)
        # Per (source, stratum): a shuffled queue of task indices, refilled when empty.
        self._queues: dict[tuple[int, int], list[int]] = {}
        self._drawn: dict[str, list[int]] = {}  # cumulative counts per quota key
        self._drawn_total: dict[str, int] = {}
        self.last_counts: dict[str, float] = {}

    def _seed_visits(self, task: Task) -> None:
        """Start the curriculum from the task's measured base pass rate (``meta["base_pass_rate"]``,
        written by ``jointrl difficulty``) instead of from nothing: a rate of 0 or 1 counts as a
        full window of failed or solved visits (no signal yet), one strictly between as a window
        holding both (so it is drawn as a task with signal). Tasks without the key start with no
        visits; with the curriculum off this does nothing."""
        p = task.meta.get("base_pass_rate")
        st = self.stats[task.id]
        if self.curriculum_window <= 0 or st.visits or isinstance(p, bool) or not isinstance(p, (int, float)):
            return
        w = self.curriculum_window
        if p <= 0 or p >= 1:
            st.visits.extend([int(p >= 1)] * w)
        elif w >= 2:  # a window of 1 cannot hold both outcomes: leave it empty (= has signal)
            st.visits.extend([1] + [0] * (w - 1))

    # -- drawing -----------------------------------------------------------------------
    def _strata_of(self, si: int) -> list[list[int]]:
        """Task indices of source ``si`` split into equal-count strata by estimated length."""
        tasks = self.sources[si].tasks
        order = sorted(range(len(tasks)), key=lambda i: (self.stats[tasks[i].id].est_len, i))
        k = min(self.strata, len(order))
        bounds = [round(j * len(order) / k) for j in range(k + 1)]
        out = [order[bounds[j] : bounds[j + 1]] for j in range(k)]
        return out + [[] for _ in range(self.strata - k)]

    def _draw(self, stratum: list[int], key: tuple[int, int], n: int, tasks: list[Task]) -> list[int]:
        """``n`` task indices from ``stratum``: a seeded shuffled queue (each task once per pass)."""
        members = set(stratum)
        q = [i for i in self._queues.get(key, []) if i in members]
        drawn = self._spread.setdefault(key[0], {})
        picked: list[int] = []
        while len(picked) < n:
            if not q:
                q = [i for i in stratum if i not in picked] or list(stratum)
                self.rng.shuffle(q)
            i = self._pop(q, tasks, drawn)
            # Curriculum: a task with no recent learning signal sits out this pass over the
            # stratum with probability 1 - weight (while other tasks are left to draw).
            while q and self._no_signal(tasks[i].id) and self.rng.random() >= self.curriculum_weight:
                i = self._pop(q, tasks, drawn)
            picked.append(i)
            if self.spread_by:
                value = self._spread_value(tasks[i])
                drawn[value] = drawn.get(value, 0) + 1
        self._queues[key] = q
        return picked

    def _pop(self, q: list[int], tasks: list[Task], drawn: dict[str, int]) -> int:
        """The queue's head; with ``spread_by``, the first queued task of the least-drawn value."""
        if not self.spread_by:
            return q.pop(0)
        j = min(range(len(q)), key=lambda j: (drawn.get(self._spread_value(tasks[q[j]]), 0), j))
        return q.pop(j)

    def _spread_value(self, task: Task) -> str:
        """The task's value of ``meta[spread_by]``; a task without it is a value of its own."""
        v = task.meta.get(self.spread_by)
        return f"value:{v}" if v is not None else f"task:{task.id}"

    def _no_signal(self, task_id: str) -> bool:
        if self.curriculum_window <= 0:
            return False
        v = list(self.stats[task_id].visits)[-self.curriculum_window :]
        return len(v) == self.curriculum_window and (all(v) or not any(v))

    def sample(self, step: int) -> list[Task]:
        """The tasks of one step (call once per step, in order; ``step`` is for the record)."""
        domains = sorted(self.domain_weights)
        counts = self._domain_counts(domains)
        out: list[Task] = []
        self.last_counts = {}
        for d, n_d in zip(domains, counts):
            self.last_counts[f"mixer/{d}/count"] = float(n_d)
            srcs = [i for i, s in enumerate(self.sources) if s.domain == d]
            per_src = self._quota(f"sources/{d}", n_d, [self.sources[i].weight for i in srcs])
            for si, n_s in zip(srcs, per_src):
                if not n_s:
                    continue
                strata = self._strata_of(si)
                props = self.strata_proportions or [len(s) for s in strata]
                props = [p if strata[k] else 0.0 for k, p in enumerate(props)]
                for k, n_k in enumerate(largest_remainder(n_s, props, self.rng)):
                    if not n_k:
                        continue
                    key = f"mixer/{d}/stratum_{k}/count"
                    self.last_counts[key] = self.last_counts.get(key, 0.0) + n_k
                    tasks = self.sources[si].tasks
                    out += [tasks[i] for i in self._draw(strata[k], (si, k), n_k, tasks)]
        return out

    def _floored_domains(self) -> int:
        """How many domains the floor can apply to at once: those of positive weight."""
        return sum(w > 0 for w in self.domain_weights.values())

    def _domain_counts(self, domains: list[str]) -> list[int]:
        """This step's prompts per domain: the floor for each domain of positive weight, then the rest of
        ``per_step`` by the weights (:meth:`_quota`, whose cumulative targets count only that rest)."""
        weights = [self.domain_weights[d] for d in domains]
        floor = [self.min_groups_per_domain if w > 0 else 0 for w in weights]
        rest = self._quota("domains", self.per_step - sum(floor), weights)
        return [f + n for f, n in zip(floor, rest)]

    def _quota(self, key: str, total: int, weights: list[float]) -> list[int]:
        """This step's counts: largest remainder on what the cumulative targets still owe.

        Every step is within one of its exact share, and over many steps the totals follow
        the weights exactly (a per-step rounding would always round 3.2 down and 2.4 up).
        """
        drawn = self._drawn.setdefault(key, [0] * len(weights))
        self._drawn_total[key] = self._drawn_total.get(key, 0) + total
        w = sum(weights)
        owed = [max(self._drawn_total[key] * x / w - d, 0.0) for x, d in zip(weights, drawn)]
        counts = largest_remainder(total, owed, self.rng) if total and sum(owed) > 0 else [0] * len(weights)
        self._drawn[key] = [d + c for d, c in zip(drawn, counts)]
        return counts

    # -- feedback ----------------------------------------------------------------------
    def update(self, trajs: list[Trajectory]) -> None:
        """Fold a step's rollouts into the length estimates and the curriculum history."""
        lengths: dict[str, list[int]] = defaultdict(list)
        solved: dict[str, list[bool]] = defaultdict(list)
        for t in trajs:
            lengths[t.task.id].append(len(t.response_ids))
            if t.reward is not None:
                solved[t.task.id].append(t.reward >= self.solved_threshold)
        for tid, ls in lengths.items():
            st = self.stats.get(tid)
            if st is None:
                continue
            st.est_len = (1 - self.length_ema) * st.est_len + self.length_ema * (sum(ls) / len(ls))
            if solved.get(tid):
                st.visits.append(int(sum(solved[tid]) * 2 >= len(solved[tid])))

    # -- resume ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "rng": self.rng.getstate(),
            "stats": {k: (v.est_len, list(v.visits)) for k, v in self.stats.items()},
            "queues": {f"{a}:{b}": list(q) for (a, b), q in self._queues.items()},
            "drawn": {k: list(v) for k, v in self._drawn.items()},
            "drawn_total": dict(self._drawn_total),
            "spread": {str(si): dict(c) for si, c in self._spread.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "adaptive" in state and not hasattr(self, "adaptive"):
            raise ValueError("the checkpoint's mixer was adaptive (mixer.mode changed since it was written)")
        self.rng.setstate(_as_rng_state(state["rng"]))
        for k, (est, visits) in state["stats"].items():
            if k in self.stats:
                self.stats[k].est_len = float(est)
                self.stats[k].visits = deque(visits, maxlen=64)
        self._queues = {tuple(int(x) for x in k.split(":")): list(v) for k, v in state["queues"].items()}  # type: ignore[misc]
        self._drawn = {k: list(v) for k, v in state["drawn"].items()}
        self._drawn_total = dict(state["drawn_total"])
        self._spread = {int(si): {k: int(n) for k, n in c.items()} for si, c in state.get("spread", {}).items()}


def _as_rng_state(s: Any) -> tuple:
    """``random`` state back from JSON-ish lists."""
    return (s[0], tuple(s[1]), s[2])


def sources_by_domain(tasks: list[Task], name: str, weight: float = 1.0) -> list[Source]:
    """One ``Source`` per domain present in ``tasks`` (a file may mix domains)."""
    by: dict[str, list[Task]] = defaultdict(list)
    for t in tasks:
        by[t.domain].append(t)
    return [Source(f"{name}[{d}]", d, ts, weight) for d, ts in sorted(by.items())]


# ---------------------------------------------------------------------------- adaptive domain weights


def domain_signal(trajs: list[Trajectory], eps: float = 1e-9) -> dict[str, tuple[float, float]]:
    """Per domain: (fraction of its groups whose rewards vary, mean reward) over scored samples.

    A group is one task's samples in a step (same ``group_id``); one with fewer than two scored
    samples counts as without variance (it teaches a group-baseline algorithm nothing either).
    Domains without a scored sample are left out.
    """
    groups: dict[tuple[str, int], list[float]] = defaultdict(list)
    for t in trajs:
        if t.reward is not None:
            groups[(t.task.domain, t.group_id)].append(float(t.reward))
    varied: dict[str, list[bool]] = defaultdict(list)
    rewards: dict[str, list[float]] = defaultdict(list)
    for (d, _), rs in groups.items():
        varied[d].append(len(rs) >= 2 and max(rs) - min(rs) > eps)
        rewards[d] += rs
    return {d: (sum(v) / len(v), sum(rewards[d]) / len(rewards[d])) for d, v in varied.items()}


def project_weights(
    raw: dict[str, float], floor: dict[str, float], ceiling: dict[str, float], mass: float = 1.0
) -> dict[str, float]:
    """The weights proportional to ``raw`` (>= 0), summing to ``mass``, each within [floor, ceiling].

    That is ``clip(lam * raw, floor, ceiling)`` with the ``lam`` that makes them sum to
    ``mass`` (found by bisection; the sum grows with ``lam``): domains whose share would fall
    below their floor get the floor, those above their ceiling the ceiling, the others keep
    their proportions. Domains with ``raw == 0`` get their floor, unless the others' ceilings
    cannot absorb the mass; then they share the rest equally. All ``raw`` 0: equal shares.
    Raises ``ValueError`` unless ``sum(floor) <= mass <= sum(ceiling)``.
    """
    if sum(floor.values()) > mass + 1e-9 or sum(ceiling.values()) < mass - 1e-9:
        raise ValueError(
            f"infeasible bounds: floors sum to {sum(floor.values()):.3f} (must be <= {mass:g}), ceilings "
            f"to {sum(ceiling.values()):.3f} (must be >= {mass:g})"
        )
    pos = [d for d in raw if raw[d] > 0]
    if not pos:
        raw, pos = {d: 1.0 for d in raw}, list(raw)
    zero = [d for d in raw if d not in pos]
    if zero and sum(ceiling[d] for d in pos) + sum(floor[d] for d in zero) < mass:
        out = {d: ceiling[d] for d in pos}
        rest = project_weights(
            {d: 1.0 for d in zero}, {d: floor[d] for d in zero}, {d: ceiling[d] for d in zero}, mass - sum(out.values())
        )
        return out | rest

    def at(lam: float) -> dict[str, float]:
        return {d: min(max(lam * raw[d], floor[d]), ceiling[d]) for d in raw}

    lo, hi = 0.0, max(ceiling[d] / raw[d] for d in pos)
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(at(mid).values()) < mass else (lo, mid)
    return at(hi)


class AdaptiveDomainWeights:
    """Domain weights that follow each domain's learning signal, online.

    Per domain and step (:meth:`update`, fed by :func:`domain_signal`):

    - ``signal``: EMA of the fraction of its groups with reward variance (the share of its
      compute that a group-baseline update can learn from);
    - ``trend``: fast EMA minus slow EMA of its mean reward (a domain that is improving, or
      getting worse because another domain's training pulls it away, moves; a flat one does not);
    - score = ``signal + trend_coef * |trend|``; target = configured base weight x score,
      projected onto the floors and ceilings (:func:`project_weights`; all scores 0 -> the base
      weights); weight <- ``(1 - rate) * weight + rate * target`` (a convex combination of
      points inside the bounds stays inside them).

    A domain with no scored sample in a step keeps its signal and trend. The initial signal of
    a domain is the fraction of its tasks whose measured base pass rate
    (``meta["base_pass_rate"]``, written by ``jointrl difficulty``) is strictly between 0 and
    1, when its tasks carry one, else ``initial_signal``. The initial weights are the base
    weights projected onto the bounds. Deterministic (no RNG); :meth:`state_dict` holds it all.
    """

    def __init__(self, base: dict[str, float], config: AdaptiveConfig, priors: dict[str, float] | None = None):
        self.domains = sorted(base)
        s = sum(base.values())
        if s <= 0:
            raise ValueError("every domain weight is 0")
        self.base = {d: base[d] / s for d in self.domains}
        self.config = config
        self.floor, self.ceiling = config.bounds(self.domains)
        priors = priors or {}
        self.signal = {d: float(priors.get(d, config.initial_signal)) for d in self.domains}
        self.fast: dict[str, float | None] = {d: None for d in self.domains}
        self.slow: dict[str, float | None] = {d: None for d in self.domains}
        self.weights = project_weights(self.base, self.floor, self.ceiling)

    def trend(self, d: str) -> float:
        f, s = self.fast[d], self.slow[d]
        return 0.0 if f is None or s is None else f - s

    def score(self, d: str) -> float:
        return self.signal[d] + self.config.trend_coef * abs(self.trend(d))

    def update(self, observed: dict[str, tuple[float, float]]) -> dict[str, float]:
        """Fold one step's ``{domain: (variance fraction, mean reward)}`` in; return the new weights."""
        c = self.config
        for d, (varied, reward) in observed.items():
            if d not in self.signal:
                continue
            self.signal[d] = (1 - c.signal_ema) * self.signal[d] + c.signal_ema * varied
            f, s = self.fast[d], self.slow[d]
            self.fast[d] = reward if f is None else (1 - c.trend_fast) * f + c.trend_fast * reward
            self.slow[d] = reward if s is None else (1 - c.trend_slow) * s + c.trend_slow * reward
        raw = {d: self.base[d] * self.score(d) for d in self.domains}
        target = project_weights(raw if sum(raw.values()) > 0 else self.base, self.floor, self.ceiling)
        self.weights = {d: (1 - c.rate) * self.weights[d] + c.rate * target[d] for d in self.domains}
        return dict(self.weights)

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for d in self.domains:
            out[f"mixer/{d}/weight"] = self.weights[d]
            out[f"mixer/{d}/signal"] = self.signal[d]
            out[f"mixer/{d}/trend"] = self.trend(d)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "signal": dict(self.signal),
            "fast": dict(self.fast),
            "slow": dict(self.slow),
            "weights": dict(self.weights),
        }

    def load_state_dict(self, s: dict[str, Any]) -> None:
        missing = sorted(set(self.domains) - set(s["weights"]))
        if missing:
            raise ValueError(f"the checkpoint's adaptive mixer has no state for domains {missing}")
        for key in ("signal", "fast", "slow", "weights"):
            setattr(self, key, {d: s[key][d] for d in self.domains})


def difficulty_priors(sources: list[Source]) -> dict[str, float]:
    """Per domain: the fraction of its tasks with a measured base pass rate strictly in (0, 1),
    over the tasks that carry one (``meta["base_pass_rate"]``); domains with none are left out."""
    rates: dict[str, list[float]] = defaultdict(list)
    for s in sources:
        for t in s.tasks:
            p = t.meta.get("base_pass_rate")
            if isinstance(p, (int, float)) and not isinstance(p, bool):
                rates[s.domain].append(float(p))
    return {d: sum(0 < p < 1 for p in ps) / len(ps) for d, ps in rates.items() if ps}


class AdaptiveTaskMixer(TaskMixer):
    """:class:`TaskMixer` whose domain weights follow :class:`AdaptiveDomainWeights` (``mixer.mode: adaptive``).

    Drawing is the base mixer's, except the per-step domain counts: they follow cumulative
    targets that add up each step's share under that step's weights (largest remainder on
    what is still owed), so every step is within one of its share and the totals follow the
    weights as they moved. Each :meth:`sample` adds ``mixer/<domain>/weight`` (and ``signal``,
    ``trend``) to ``last_counts``, which the trainer logs. Checkpointed with the mixer.
    """

    def __init__(
        self,
        sources: list[Source],
        per_step: int,
        seed: int = 0,
        *,
        adaptive: AdaptiveConfig | dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(sources, per_step, seed, **kwargs)
        cfg = adaptive if isinstance(adaptive, AdaptiveConfig) else AdaptiveConfig.from_dict(dict(adaptive or {}))
        self.adaptive = AdaptiveDomainWeights(dict(self.domain_weights), cfg, difficulty_priors(self.sources))
        self.domain_weights = dict(self.adaptive.weights)
        self._targets: dict[str, float] = {d: 0.0 for d in self.domain_weights}

    def _floored_domains(self) -> int:
        """Every domain: an adaptive weight of 0 can become positive (the adaptive floor)."""
        return len(self.domain_weights)

    def _quota(self, key: str, total: int, weights: list[float]) -> list[int]:
        if key != "domains":
            return super()._quota(key, total, weights)
        domains = sorted(self.domain_weights)
        drawn = self._drawn.setdefault(key, [0] * len(domains))
        w = sum(weights)
        for d, x in zip(domains, weights):
            self._targets[d] += total * x / w
        owed = [max(self._targets[d] - n, 0.0) for d, n in zip(domains, drawn)]
        counts = largest_remainder(total, owed, self.rng) if total and sum(owed) > 0 else [0] * len(domains)
        self._drawn[key] = [n + c for n, c in zip(drawn, counts)]
        return counts

    def sample(self, step: int) -> list[Task]:
        out = super().sample(step)
        self.last_counts |= self.adaptive.metrics()
        return out

    def update(self, trajs: list[Trajectory]) -> None:
        super().update(trajs)
        self.domain_weights = self.adaptive.update(domain_signal(trajs))

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"adaptive": self.adaptive.state_dict(), "targets": dict(self._targets)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "adaptive" not in state:
            raise ValueError("the checkpoint's mixer was not adaptive (mixer.mode changed since it was written)")
        self.adaptive.load_state_dict(state["adaptive"])
        self.domain_weights = dict(self.adaptive.weights)
        self._targets = {d: float(state["targets"][d]) for d in self.domain_weights}
