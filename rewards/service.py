"""Scoring trajectories with user reward classes, in-process or on a pool of Ray actors.

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

``RewardService`` spreads trajectories over N ``RewardScorer`` actors, whole groups (the
samples of one task) to one worker. A worker whose
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

from envs.actors import ActorGroup, GroupOwner, ray_factory
from envs.base import resolve
from envs.stacks import register as register_stacks
from envs.types import Trajectory
from rewards.protocol import DEFAULT_CONCURRENCY, applies_to, build_reward, call_mode

__all__ = ["RewardFnSpec", "RewardScorer", "RewardService", "FnOutcome"]


@dataclass(frozen=True)
class RewardFnSpec:
    """One reward function of a recipe: dotted class path, weight, domains ([] = the class's own), kwargs."""

    cls: str
    weight: float = 1.0
    domains: tuple[str, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


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
        self._stats: dict[tuple[str, str], list[float]] = {}  # (domain, fn) -> [samples, errors, timeouts, latency]

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
        return self.score_with_stats(trajs)[0]

    def score_with_stats(self, trajs: list[Trajectory]) -> tuple[list[Trajectory], dict[str, Any]]:
        """``score`` plus this call's statistics: ``{"fn": {(domain, fn): [samples, errors, timeouts,
        latency_s]}, "timed_out": [indices of samples with a timed-out call], "stuck": threads stuck}``."""
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
        stats: dict[tuple[str, str], list[float]] = {}
        out, timed_out = [], []
        for i, (t, res) in enumerate(zip(trajs, results)):
            out.append(dataclasses.replace(t, scores={}, reward=None) if i in failed else self._combine(t, res))
            for name, o in res.items():
                s = stats.setdefault((t.task.domain, name), [0, 0, 0, 0.0])
                s[0] += 1
                s[1] += o.error is not None or _check_value(name, o.value) is not None
                s[2] += o.timed_out
                s[3] += o.latency_s
            if any(o.timed_out for o in res.values()):
                timed_out.append(i)
        with self._lock:
            for k, s in stats.items():
                acc = self._stats.setdefault(k, [0, 0, 0, 0.0])
                for j in range(4):
                    acc[j] += s[j]
        return out, {"fn": stats, "timed_out": timed_out, "stuck": self.stuck_threads()}

    def take_stats(self) -> dict[tuple[str, str], list[float]]:
        """Per (domain, fn): [samples, errors, timeouts, latency_s summed] since the last take (then reset)."""
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
        total, scored = 0.0, False
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
            scored = scored or (fn.weight != 0.0 and not fn.shaping)
        error = "; ".join(errors) if errors else None
        if error is None and not scored:
            error = f"no reward function scored this {traj.task.domain!r} sample: {self._why_unscored(scores)}"
        return dataclasses.replace(traj, scores=scores, reward=None if error else total, reward_error=error)

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


def fn_metrics(stats: dict[tuple[str, str], list[float]]) -> dict[str, float]:
    """``reward/<fn>/latency_s`` (mean per sample) and ``reward/<fn>/errors`` from per-(domain, fn) stats."""
    by_fn: dict[str, list[float]] = {}
    for (_, name), s in stats.items():
        acc = by_fn.setdefault(name, [0, 0, 0, 0.0])
        for j in range(4):
            acc[j] += s[j]
    m: dict[str, float] = {}
    for name, (samples, errors, _timeouts, latency) in sorted(by_fn.items()):
        m[f"reward/{name}/latency_s"] = latency / samples if samples else 0.0
        m[f"reward/{name}/errors"] = float(errors)
    return m


_STUCK = "a reward call timed out and its thread could not be stopped"


class RewardService(GroupOwner):
    """A pool of ``RewardScorer`` Ray actors. Requires ``ray.init`` to have run.

    ``timeout_s`` is the per-call limit (see the module docstring); ``workers`` actors,
    ``num_cpus`` Ray CPUs each, or ``actor_options`` (one dict of Ray actor options per
    worker, e.g. a placement-group bundle from ``rl.driver.placement``; a replaced worker gets its
    predecessor's). Spawning, replacing and counting restarts are ``envs.actors.ActorGroup``'s.
    """

    def __init__(
        self,
        specs: list[RewardFnSpec],
        workers: int = 1,
        timeout_s: float = 60.0,
        num_cpus: float = 0.1,
        actor_options: list[dict[str, Any]] | None = None,
    ) -> None:
        import ray

        self.specs, self.timeout_s = list(specs), float(timeout_s)
        # Two concurrent methods: a scoring call, and the liveness probe (stalled_s) beside it.
        factory = ray_factory(
            RewardScorer,
            {"num_cpus": num_cpus, "max_restarts": 0, "max_concurrency": 2},
            (self.specs,),
            lambda i: {"timeout_s": self.timeout_s},
        )
        self.group = ActorGroup(
            workers, factory, metric="reward/service/restarts", options=actor_options, what="reward workers"
        )
        ray.get([w.__ray_ready__.remote() for w in self.workers])  # constructor errors surface here
        self._fresh: set[int] = set()  # replaced workers not yet known to be up
        self._worker_errors = 0
        self._stats: dict[tuple[str, str], list[float]] = {}
        # A worker is hung when it made no progress for timeout_s + grace (its own timeouts did not fire).
        self.grace_s = max(2.0, 0.25 * self.timeout_s)

    def score(self, trajs: list[Trajectory]) -> list[Trajectory]:
        """Score ``trajs`` (same order out). Each group (same ``group_id``: the samples of one task)
        goes whole to one worker, so a ``score_batch`` call always sees complete groups."""
        trajs = list(trajs)
        groups: dict[int, list[int]] = {}
        for j, t in enumerate(trajs):
            groups.setdefault(t.group_id, []).append(j)
        shards: list[list[int]] = [[] for _ in self.workers]
        for idx in sorted(groups.values(), key=len, reverse=True):  # largest first, each to the least loaded
            min(shards, key=len).extend(idx)
        shards = [sorted(s) for s in shards]
        out: list[Trajectory] = list(trajs)
        jobs = {i: [trajs[j] for j in shard] for i, shard in enumerate(shards) if shard}
        for i, part in self._run(jobs).items():
            for j, t in zip(shards[i], part):
                out[j] = t
        return out

    def take_stats(self) -> dict[tuple[str, str], list[float]]:
        """Per (domain, fn): [samples, errors, timeouts, latency_s summed] since the last take (then reset)."""
        stats, self._stats = self._stats, {}
        return stats

    def metrics(self) -> dict[str, float]:
        """Per-function latency and errors, restarts and worker errors since the last call (then reset)."""
        m = fn_metrics(self.take_stats()) | self.group.metrics()
        m["reward/service/worker_errors"] = float(self._worker_errors)
        self._worker_errors = 0
        return m

    # ------------------------------------------------------------------ internals

    def _run(self, jobs: dict[int, list[Trajectory]]) -> dict[int, list[Trajectory]]:
        """Score each worker's chunk; retry once (on a fresh worker) what a crash, hang or timeout cost."""
        self._await_fresh()  # a replacement's start-up must not count as "no progress"
        first = self._wait_all({i: (self.workers[i].score_with_stats.remote(c), c) for i, c in jobs.items()})
        results: dict[int, list[Trajectory]] = {}
        retry: dict[int, list[int]] = {}  # worker -> positions in its chunk to score again
        for i, (res, stats, fail) in first.items():
            if fail is not None:
                self._replace(i, fail)
                retry[i] = list(range(len(jobs[i])))
                results[i] = list(jobs[i])
                continue
            self._merge(stats)
            results[i] = res
            if stats["stuck"]:
                self._replace(i, _STUCK)  # frees the thread stuck in the timed-out call
            retry[i] = list(stats["timed_out"])  # timed-out samples get a second try
        retry = {i: pos for i, pos in retry.items() if pos}
        if not retry:
            return results
        self._await_fresh()
        second = self._wait_all(
            {
                i: (self.workers[i].score_with_stats.remote([jobs[i][p] for p in pos]), [jobs[i][p] for p in pos])
                for i, pos in retry.items()
            }
        )
        for i, (res, stats, fail) in second.items():
            if fail is not None:
                self._replace(i, fail)
                self._worker_errors += len(retry[i])
                res = [dataclasses.replace(jobs[i][p], scores={}, reward=None, reward_error=fail) for p in retry[i]]
            else:
                self._merge(stats)
                if stats["stuck"]:
                    self._replace(i, _STUCK)
            for p, t in zip(retry[i], res):
                results[i][p] = t
        return results

    def _wait_all(self, calls: dict[int, tuple[Any, list[Trajectory]]]) -> dict[int, tuple[Any, Any, str | None]]:
        """Wait for each worker's call; (trajs, stats, None) on success, (None, None, why) when the worker
        died or stopped making progress."""
        import ray

        pending = {ref: i for i, (ref, _) in calls.items()}
        done: dict[int, tuple[Any, Any, str | None]] = {}
        last_ok = {i: time.monotonic() for i in calls}
        probes: dict[Any, int] = {}  # liveness probe ref -> worker
        limit = self.timeout_s + self.grace_s
        poll = min(1.0, max(0.05, self.timeout_s / 4))
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=poll)
            for ref in ready:
                i = pending.pop(ref)
                try:
                    res, stats = ray.get(ref)
                    done[i] = (res, stats, None)
                except ray.exceptions.RayActorError as e:
                    done[i] = (None, None, f"reward worker died ({type(e).__name__})")
            if not pending:
                break
            # Liveness probes, all at once: a worker answers unless a call holds its GIL (or it died).
            # One outstanding probe per worker: an unanswered one is waited for again, not stacked.
            now = time.monotonic()
            for i in pending.values():
                if i not in probes.values():
                    probes[self.workers[i].stalled_s.remote()] = i
            answered, _ = ray.wait(list(probes), num_returns=len(probes), timeout=poll)
            for p in answered:
                i = probes.pop(p)
                try:
                    if ray.get(p) <= limit:
                        last_ok[i] = now
                except ray.exceptions.RayActorError:
                    last_ok[i] = now  # dead, not hung: the scoring ref reports the death
            for ref, i in list(pending.items()):
                if time.monotonic() - last_ok[i] > limit:
                    pending.pop(ref)
                    done[i] = (
                        None,
                        None,
                        f"reward worker timed out after {self.timeout_s:g}s (no progress; "
                        f"a reward call could not be interrupted)",
                    )
        return done

    def _merge(self, stats: dict[str, Any]) -> None:
        for k, s in stats["fn"].items():
            acc = self._stats.setdefault(k, [0, 0, 0, 0.0])
            for j in range(4):
                acc[j] += s[j]

    def _replace(self, i: int, why: str) -> None:
        self.group.replace(i, why)
        self._fresh.add(i)

    def _await_fresh(self) -> None:
        import ray

        if self._fresh:
            ray.get([self.workers[i].__ray_ready__.remote() for i in sorted(self._fresh)])
            self._fresh.clear()

    def shutdown(self) -> None:
        self.group.kill_all()
