"""Scoring trajectories with user reward classes: ``RewardScorer``, a plain class run in-process or as a Ray actor.

A reward function is any object with ``name`` (str), ``domains`` (the domains it scores;
``"*"`` = all) and ``__call__(trajectory) -> float | None`` (None: "does not apply to
this sample"), optionally ``score_batch(trajs)`` or ``async acall(traj)``; see
:mod:`rewards.protocol`. No base class. Classes are named by dotted path and constructed
in the process that scores (``RewardScorer``), so user code is imported where it runs.

The final score is the weighted sum of the applicable functions. A function that raises,
times out, or returns NaN, inf or a non-number gives the sample a recorded
``reward_error`` and no reward (never a silent 0); the trainer excludes such samples.
A sample that no non-shaping, non-zero-weight function scored also gets an error.
A trajectory that arrives with a ``reward_error`` already set (the rollout's record of a
harness failure: an env call of its episode raised, see :mod:`rollout.episode`) is not
scored: it keeps that error and gets no reward, so no reward class sees a half-run episode.

Per-call timeout (``timeout_s``): each ``__call__`` / ``acall`` of one sample, and each
``score_batch`` call, may take at most ``timeout_s`` seconds; past it the sample (the
batch) gets a "timed out" error. ``RewardScorer`` runs calls in a helper thread to
enforce this and abandons a thread stuck in a call (Python cannot kill threads).

``rl.driver.actors.rewards.RewardService`` spreads trajectories over N ``RewardScorer`` Ray
actors, whole groups (the samples of one task) to one worker. A worker whose
reward call timed out (its stuck thread lives on) is replaced after the call and the
timed-out samples are retried once on the fresh worker. A worker that crashed, or that
stopped making progress altogether (a call that holds the GIL, e.g. a runaway regex,
cannot be timed out from inside the process), is killed and replaced, and its share is
retried once on the fresh worker; if that fails too, the share gets a recorded error.

Metrics: ``metrics()`` (on both classes) returns and resets, since its last call,
``reward/<fn>/latency_s`` (mean seconds per sample), ``reward/<fn>/errors`` (samples
the function errored on, timeouts included) and, on the service,
``reward/service/restarts`` and ``reward/service/worker_errors`` (samples errored
because their worker died or hung).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import math
import numbers
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from envs.base import resolve
from envs.stacks import register as register_stacks
from envs.types import Trajectory
from rewards.protocol import DEFAULT_CONCURRENCY, applies_to, build_reward, call_mode

__all__ = [
    "RewardFnSpec",
    "RewardScorer",
    "FnOutcome",
    "FnStats",
    "ScoreResult",
    "add_stats",
    "fn_metrics",
    "reward_specs",
]


@dataclass(frozen=True)
class RewardFnSpec:
    """One reward function of a recipe: dotted class path, weight, domains ([] = the class's own), kwargs."""

    cls: str
    weight: float = 1.0
    domains: tuple[str, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


def reward_specs(entries: Any) -> list[RewardFnSpec]:
    """A recipe's ``rewards`` entries (each with ``cls``, ``weight``, ``domains``, ``kwargs``) as specs."""
    return [RewardFnSpec(e.cls, e.weight, tuple(e.domains), dict(e.kwargs)) for e in entries]


@dataclass(frozen=True)
class FnStats:
    """One reward function's counts on one domain: samples it ran on, errors (timeouts included), timeouts, and
    the seconds its calls took in all. Summed with ``+`` (:func:`add_stats` merges whole tables)."""

    samples: int = 0
    errors: int = 0
    timeouts: int = 0
    latency_s: float = 0.0

    def __add__(self, other: FnStats) -> FnStats:
        return FnStats(
            self.samples + other.samples,
            self.errors + other.errors,
            self.timeouts + other.timeouts,
            self.latency_s + other.latency_s,
        )


StatsTable = dict[tuple[str, str], FnStats]  # (domain, fn name) -> its counts


def add_stats(into: dict[Any, FnStats], stats: dict[Any, FnStats]) -> dict[Any, FnStats]:
    """Add each entry of ``stats`` into ``into`` (in place, missing keys start at zero); returns ``into``."""
    for k, s in stats.items():
        into[k] = into.get(k, FnStats()) + s
    return into


@dataclass(frozen=True)
class ScoreResult:
    """What one scoring call returns (also across a reward worker's actor call): the scored trajectories (same
    order), this call's per-(domain, fn) counts, the positions of the samples with a timed-out call (the reward
    service retries them), and how many helper threads are stuck in a call that timed out (the worker is then
    replaced)."""

    trajs: list[Trajectory]
    fn: StatsTable
    timed_out: tuple[int, ...] = ()
    stuck: int = 0


@dataclass
class FnOutcome:
    """One function's result on one sample: a value (or None), or an error."""

    value: Any = None
    error: str | None = None
    timed_out: bool = False
    latency_s: float = 0.0


@dataclass
class _Fn:
    name: str
    obj: Any
    weight: float
    domains: frozenset[str]
    shaping: bool
    mode: str  # "batch" | "async" | "call"


def _check_value(name: str, value: Any) -> str | None:
    """An error message when ``value`` is neither None nor a finite real number."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return f"{name} returned {value!r:.200}, not a finite number"
    try:
        ok = math.isfinite(float(value))
    except (TypeError, ValueError, OverflowError):
        ok = False
    return None if ok else f"{name} returned {value!r:.200}, not a finite number"


def _invoke(call: Callable[[Any], Any], item: Any) -> FnOutcome:
    t0 = time.perf_counter()
    try:
        value = call(item)
    except BaseException as e:  # noqa: BLE001 - a user's reward bug is recorded, not fatal
        if isinstance(e, KeyboardInterrupt) and threading.current_thread() is threading.main_thread():
            raise
        return FnOutcome(error=f"raised {type(e).__name__}: {e}", latency_s=time.perf_counter() - t0)
    return FnOutcome(value=value, latency_s=time.perf_counter() - t0)


class RewardScorer:
    """Constructs the reward classes of ``specs`` and scores trajectories with them.

    ``timeout_s``: per-call limit (None: calls run in the caller's thread, unlimited).
    """

    def __init__(self, specs: list[RewardFnSpec], timeout_s: float | None = None) -> None:
        if timeout_s is not None and not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise ValueError(f"timeout_s must be a positive number of seconds or None, got {timeout_s!r}")
        register_stacks("reward_worker")  # in a run's actor: SIGUSR1 -> its stacks in stacks/; in-process: nothing
        self.timeout_s = None if timeout_s is None else float(timeout_s)
        self._fns: list[_Fn] = []
        seen: set[str] = set()
        for spec in specs:
            obj = build_reward(resolve(spec.cls), spec.kwargs)
            name = str(getattr(obj, "name", "") or spec.cls.rsplit(".", 1)[-1])
            base, k = name, 1
            while name in seen:  # the same class twice (e.g. different kwargs): keep metric names apart
                k += 1
                name = f"{base}_{k}"
            seen.add(name)
            domains = frozenset(spec.domains or getattr(obj, "domains", ()) or ())
            self._fns.append(
                _Fn(name, obj, float(spec.weight), domains, bool(getattr(obj, "shaping", False)), call_mode(obj))
            )
        self._lock = threading.Lock()
        self._abandoned: list[threading.Thread] = []  # helper threads stuck in a call that timed out
        self._progress_t: float | None = None  # monotonic time of the last call start/finish while scoring
        self._stats: StatsTable = {}  # since the last take_stats

    # ------------------------------------------------------------------ public

    @property
    def names(self) -> list[str]:
        return [f.name for f in self._fns]

    @property
    def fns(self) -> list[tuple[str, Any, float, frozenset[str]]]:
        """(name, object, weight, domains) of each function, in recipe order."""
        return [(f.name, f.obj, f.weight, f.domains) for f in self._fns]

    def score(self, trajs: list[Trajectory]) -> list[Trajectory]:
        """The trajectories with ``scores``, ``reward`` and ``reward_error`` set (new objects, same order)."""
        return self.score_with_stats(trajs).trajs

    def score_with_stats(self, trajs: list[Trajectory]) -> ScoreResult:
        """``score`` plus this call's statistics (:class:`ScoreResult`)."""
        trajs = list(trajs)
        results: list[dict[str, FnOutcome]] = [{} for _ in trajs]
        failed = {i for i, t in enumerate(trajs) if t.reward_error is not None}  # the rollout's harness failures
        self._progress_t = time.monotonic()
        try:
            for fn in self._fns:
                idx = [i for i, t in enumerate(trajs) if i not in failed and applies_to(fn.domains, t.task.domain)]
                if not idx:
                    continue
                outs = self._run_fn(fn, [trajs[i] for i in idx])
                for i, o in zip(idx, outs):
                    results[i][fn.name] = o
        finally:
            self._progress_t = None
        stats: StatsTable = {}
        out, timed_out = [], []
        for i, (t, res) in enumerate(zip(trajs, results)):
            out.append(
                dataclasses.replace(t, scores={}, reward=None, reward_shaping=0.0)
                if i in failed
                else self._combine(t, res)
            )
            for name, o in res.items():
                bad = o.error is not None or _check_value(name, o.value) is not None
                add_stats(stats, {(t.task.domain, name): FnStats(1, int(bad), int(o.timed_out), o.latency_s)})
            if any(o.timed_out for o in res.values()):
                timed_out.append(i)
        with self._lock:
            add_stats(self._stats, stats)
        return ScoreResult(out, stats, tuple(timed_out), self.stuck_threads())

    def take_stats(self) -> StatsTable:
        """Per (domain, fn): the counts since the last take (then reset)."""
        with self._lock:
            stats, self._stats = self._stats, {}
        return stats

    def metrics(self) -> dict[str, float]:
        """``reward/<fn>/latency_s`` and ``reward/<fn>/errors`` since the last call (then reset)."""
        return fn_metrics(self.take_stats())

    def stuck_threads(self) -> int:
        """Helper threads still stuck in a call that timed out."""
        self._abandoned = [t for t in self._abandoned if t.is_alive()]
        return len(self._abandoned)

    def stalled_s(self) -> float:
        """Seconds since the scorer last started or finished a reward call; 0.0 when not scoring."""
        t = self._progress_t
        return 0.0 if t is None else max(0.0, time.monotonic() - t)

    # ------------------------------------------------------------------ internals

    def _combine(self, traj: Trajectory, res: dict[str, FnOutcome]) -> Trajectory:
        scores: dict[str, float | None] = {}
        errors: list[str] = []
        total, shaping, scored = 0.0, 0.0, False
        for fn in self._fns:
            if fn.name not in res:
                continue
            o = res[fn.name]
            if o.error is not None:
                errors.append(f"{fn.name} {o.error}")
                continue
            bad = _check_value(fn.name, o.value)
            if bad is not None:
                errors.append(bad)
                continue
            if o.value is None:
                scores[fn.name] = None
                continue
            v = float(o.value)
            scores[fn.name] = v
            total += fn.weight * v
            shaping += fn.weight * v if fn.shaping else 0.0
            scored = scored or (fn.weight != 0.0 and not fn.shaping)
        error = "; ".join(errors) if errors else None
        if error is None and not scored:
            error = f"no reward function scored this {traj.task.domain!r} sample: {self._why_unscored(scores)}"
        return dataclasses.replace(
            traj,
            scores=scores,
            reward=None if error else total,
            reward_shaping=0.0 if error else shaping,
            reward_error=error,
        )

    def _why_unscored(self, scores: dict[str, float | None]) -> str:
        """What each function that ran did instead of scoring (returned None, a shaping term, weight 0)."""
        why = []
        for fn in self._fns:
            if fn.name not in scores:
                continue
            if scores[fn.name] is None:
                why.append(f"{fn.name} returned None (does not apply)")
            elif fn.shaping:
                why.append(f"{fn.name} is a shaping term (it adds to a score, it is not one)")
            else:
                why.append(f"{fn.name} has weight 0")
        return "; ".join(why) if why else "no reward function is declared for this domain"

    def _run_fn(self, fn: _Fn, trajs: list[Trajectory]) -> list[FnOutcome]:
        if fn.mode == "batch":
            (o,) = self._run_each(fn.obj.score_batch, [trajs])
            n = len(trajs)
            if o.error is not None:
                return [
                    FnOutcome(error=f"score_batch {o.error}", timed_out=o.timed_out, latency_s=o.latency_s / n)
                    for _ in trajs
                ]
            values = o.value
            try:
                values = list(values)
            except TypeError:
                values = None
            if values is None or len(values) != n:
                got = f"{len(values)} values" if values is not None else f"{type(o.value).__name__}"
                return [
                    FnOutcome(
                        error=f"score_batch returned {got} for {n} trajectories (want a list of {n})",
                        latency_s=o.latency_s / n,
                    )
                    for _ in trajs
                ]
            return [FnOutcome(value=v, latency_s=o.latency_s / n) for v in values]
        if fn.mode == "async":
            return self._run_async(fn, trajs)
        return self._run_each(fn.obj, trajs)

    def _run_each(self, call: Callable[[Any], Any], items: list[Any]) -> list[FnOutcome]:
        """``call(item)`` for each item, in order; each call limited to ``timeout_s`` (in a helper thread)."""
        n, timeout = len(items), self.timeout_s
        if timeout is None:
            out = []
            for x in items:
                self._progress_t = time.monotonic()
                out.append(_invoke(call, x))
            return out
        results: list[FnOutcome | None] = [None] * n
        cond = threading.Condition()
        start = 0
        while start < n:
            state = {"cur": start, "t0": time.monotonic(), "live": True}

            def work(state: dict[str, Any] = state, first: int = start) -> None:
                for i in range(first, n):
                    o = _invoke(call, items[i])
                    with cond:
                        if not state["live"]:
                            return  # abandoned after a timeout: the result is dropped
                        results[i] = o
                        state["cur"], state["t0"] = i + 1, time.monotonic()
                        self._progress_t = state["t0"]
                        cond.notify_all()

            th = threading.Thread(target=work, daemon=True, name="reward-call")
            self._progress_t = state["t0"]
            th.start()
            with cond:
                while state["cur"] < n:
                    remaining = state["t0"] + timeout - time.monotonic()
                    if remaining <= 0:
                        i = state["cur"]
                        results[i] = FnOutcome(error=f"timed out after {timeout:g}s", timed_out=True, latency_s=timeout)
                        state["live"] = False
                        self._abandoned.append(th)
                        start = i + 1
                        break
                    cond.wait(remaining)
                else:
                    start = n
        return results  # type: ignore[return-value]

    def _run_async(self, fn: _Fn, trajs: list[Trajectory]) -> list[FnOutcome]:
        """``await fn.acall(t)`` for every t concurrently, in an event loop on a helper thread."""
        n, timeout = len(trajs), self.timeout_s
        conc = getattr(fn.obj, "concurrency", DEFAULT_CONCURRENCY)
        conc = conc if isinstance(conc, int) and not isinstance(conc, bool) and conc > 0 else DEFAULT_CONCURRENCY
        results: list[FnOutcome | None] = [None] * n
        cond = threading.Condition()
        state = {"t": time.monotonic(), "done": False, "live": True}

        def progress() -> None:
            with cond:
                state["t"] = time.monotonic()
                if state["live"]:
                    self._progress_t = state["t"]
                cond.notify_all()

        async def one(i: int, sem: asyncio.Semaphore) -> None:
            async with sem:
                progress()
                o = await _acall(fn.obj, trajs[i], timeout)
                with cond:
                    if state["live"]:
                        results[i] = o
                progress()

        async def gather() -> None:
            sem = asyncio.Semaphore(conc)
            await asyncio.gather(*(one(i, sem) for i in range(n)))

        def run() -> None:
            try:
                asyncio.run(gather())
            except BaseException as e:  # noqa: BLE001 - recorded below as errors of the unfinished samples
                with cond:
                    state["crash"] = f"raised {type(e).__name__}: {e}"
            with cond:
                state["done"] = True
                cond.notify_all()

        th = threading.Thread(target=run, daemon=True, name="reward-acall")
        th.start()
        crash = self._await_event_loop(th, cond, state, timeout)
        return [
            r
            if r is not None
            else FnOutcome(
                error=crash or f"timed out after {timeout:g}s (the event loop was blocked)",
                timed_out=crash is None,
                latency_s=0.0 if crash else float(timeout or 0.0),
            )
            for r in results
        ]

    def _await_event_loop(
        self, th: threading.Thread, cond: threading.Condition, state: dict[str, Any], timeout: float | None
    ) -> str | None:
        """Wait until the event loop on ``th`` is done, or until no call started or finished for ``timeout``
        (+ 1 s grace): the loop is blocked, ``th`` is abandoned. Returns the loop's own crash, if any."""
        grace = 1.0
        with cond:
            while not state["done"]:
                if timeout is None:
                    cond.wait()
                    continue
                remaining = state["t"] + timeout + grace - time.monotonic()
                if remaining <= 0:
                    state["live"] = False
                    self._abandoned.append(th)
                    break
                cond.wait(remaining)
            return state.get("crash")


async def _acall(obj: Any, traj: Trajectory, timeout: float | None) -> FnOutcome:
    """One ``await obj.acall(traj)`` under ``timeout``: its value, or the error (a timeout told apart from the
    reward's own ``TimeoutError``, e.g. a socket timeout), with its latency."""
    t0 = time.perf_counter()
    try:
        aw = obj.acall(traj)
        if not inspect.isawaitable(aw):
            o = FnOutcome(value=aw)  # a plain function named acall: take its value
        else:
            o = FnOutcome(value=await (aw if timeout is None else asyncio.wait_for(aw, timeout)))
    except TimeoutError as e:
        if timeout is not None and time.perf_counter() - t0 >= 0.999 * timeout:
            o = FnOutcome(error=f"timed out after {timeout:g}s", timed_out=True)
        else:
            o = FnOutcome(error=f"raised {type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001 - recorded
        o = FnOutcome(error=f"raised {type(e).__name__}: {e}")
    o.latency_s = time.perf_counter() - t0
    return o


def fn_metrics(stats: StatsTable) -> dict[str, float]:
    """``reward/<fn>/latency_s`` (mean per sample) and ``reward/<fn>/errors`` from per-(domain, fn) stats."""
    by_fn: dict[str, FnStats] = {}
    for (_, name), s in stats.items():
        add_stats(by_fn, {name: s})
    m: dict[str, float] = {}
    for name, s in sorted(by_fn.items()):
        m[f"reward/{name}/latency_s"] = s.latency_s / s.samples if s.samples else 0.0
        m[f"reward/{name}/errors"] = float(s.errors)
    return m
