"""The task mixer: which tasks each step trains on. (Putting the rewards of different domains on
one scale is a reward-shaping stage before the estimator: ``rl.algos.shaping``.)

Drawing (``TaskMixer.sample``), per step:

1. **Domains.** ``per_step`` prompts are split over domains by their weights with
   largest-remainder rounding of what the cumulative targets still owe, so every step
   holds exact per-domain counts within one of the exact share (weights 0.4/0.3/0.3 and
   8 prompts give 3/3/2, 4/2/2, 3/2/3..., never 8/0/0) and the totals over many steps
   follow the weights exactly. Ties are broken by the seeded RNG.
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

    def __init__(self, sources: list[Source], per_step: int, seed: int = 0, *,
                 domain_weights: dict[str, float] | None = None, strata: int = 1,
                 strata_proportions: list[float] | None = None, length_ema: float = 0.5,
                 curriculum_window: int = 0, curriculum_weight: float = 1.0,
                 solved_threshold: float = 1.0) -> None:
        if not sources or not any(s.tasks for s in sources):
            raise ValueError("no training tasks")
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
        self.rng = random.Random(seed)
        self.stats: dict[str, _TaskStats] = {}
        for s in self.sources:
            for t in s.tasks:
                prior = t.meta.get("est_len") if isinstance(t.meta.get("est_len"), (int, float)) else None
                self.stats.setdefault(t.id, _TaskStats(float(prior or DEFAULT_LENGTH.get(t.domain, 128))))
        # Per (source, stratum): a shuffled queue of task indices, refilled when empty.
        self._queues: dict[tuple[int, int], list[int]] = {}
        self._drawn: dict[str, list[int]] = {}  # cumulative counts per quota key
        self._drawn_total: dict[str, int] = {}
        self.last_counts: dict[str, float] = {}

    # -- drawing -----------------------------------------------------------------------
    def _strata_of(self, si: int) -> list[list[int]]:
        """Task indices of source ``si`` split into equal-count strata by estimated length."""
        tasks = self.sources[si].tasks
        order = sorted(range(len(tasks)), key=lambda i: (self.stats[tasks[i].id].est_len, i))
        k = min(self.strata, len(order))
        bounds = [round(j * len(order) / k) for j in range(k + 1)]
        out = [order[bounds[j]:bounds[j + 1]] for j in range(k)]
        return out + [[] for _ in range(self.strata - k)]

    def _draw(self, stratum: list[int], key: tuple[int, int], n: int, task_ids: list[str]) -> list[int]:
        """``n`` task indices from ``stratum``: a seeded shuffled queue (each task once per pass)."""
        members = set(stratum)
        q = [i for i in self._queues.get(key, []) if i in members]
        picked: list[int] = []
        while len(picked) < n:
            if not q:
                q = [i for i in stratum if i not in picked] or list(stratum)
                self.rng.shuffle(q)
            i = q.pop(0)
            # Curriculum: a task with no recent learning signal sits out this pass over the
            # stratum with probability 1 - weight (while other tasks are left to draw).
            while q and self._no_signal(task_ids[i]) and self.rng.random() >= self.curriculum_weight:
                i = q.pop(0)
            picked.append(i)
        self._queues[key] = q
        return picked

    def _no_signal(self, task_id: str) -> bool:
        if self.curriculum_window <= 0:
            return False
        v = list(self.stats[task_id].visits)[-self.curriculum_window:]
        return len(v) == self.curriculum_window and (all(v) or not any(v))

    def sample(self, step: int) -> list[Task]:
        """The tasks of one step (call once per step, in order; ``step`` is for the record)."""
        domains = sorted(self.domain_weights)
        counts = self._quota("domains", self.per_step, [self.domain_weights[d] for d in domains])
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
                    ids = [t.id for t in self.sources[si].tasks]
                    out += [self.sources[si].tasks[i] for i in self._draw(strata[k], (si, k), n_k, ids)]
        return out

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
        return {"rng": self.rng.getstate(),
                "stats": {k: (v.est_len, list(v.visits)) for k, v in self.stats.items()},
                "queues": {f"{a}:{b}": list(q) for (a, b), q in self._queues.items()},
                "drawn": {k: list(v) for k, v in self._drawn.items()}, "drawn_total": dict(self._drawn_total)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.setstate(_as_rng_state(state["rng"]))
        for k, (est, visits) in state["stats"].items():
            if k in self.stats:
                self.stats[k].est_len = float(est)
                self.stats[k].visits = deque(visits, maxlen=64)
        self._queues = {tuple(int(x) for x in k.split(":")): list(v) for k, v in state["queues"].items()}  # type: ignore[misc]
        self._drawn = {k: list(v) for k, v in state["drawn"].items()}
        self._drawn_total = dict(state["drawn_total"])


def _as_rng_state(s: Any) -> tuple:
    """``random`` state back from JSON-ish lists."""
    return (s[0], tuple(s[1]), s[2])


def sources_by_domain(tasks: list[Task], name: str, weight: float = 1.0) -> list[Source]:
    """One ``Source`` per domain present in ``tasks`` (a file may mix domains)."""
    by: dict[str, list[Task]] = defaultdict(list)
    for t in tasks:
        by[t.domain].append(t)
    return [Source(f"{name}[{d}]", d, ts, weight) for d, ts in sorted(by.items())]
