"""The audit's episodes, baselines and findings.

Each strategy of a task's domain (:mod:`rl.cli.audit.strategies`) plays one episode in the env
the recipe serves the domain with (``rollout.envs``: the class and kwargs training uses),
turn by turn, as the rollout does (the prefill on turn 1, the env's observations fed back,
``rollout.max_turns`` as the cap, the env's ``finalize`` when the episode is cut), and the
trajectory is scored by the recipe's reward classes through :class:`rewards.service.RewardScorer`,
the scorer of ``jointrl score`` and ``jointrl eval``. No model runs: the strategies are the policy.

Per task, the **baseline** is the higher reward of the ``noop`` and ``wrong`` strategies (what
doing nothing, or answering in the right shape with wrong content, earns by design). Findings:

* ``above_baseline``: an attack strategy scored more than the baseline;
* ``noop_paid``: the no-op itself scored above 0 (a check that doing nothing passes, in part or whole);
* ``reference_below_1``: the task's reference answer scored below 1;
* ``error``: an episode or a reward raised on an answer (one answer must never cost a batch),
  or no reward function scored it.

A task may declare that a strategy does its work (``meta["audit_does_the_work"]``, strategy name
to reason: writing an empty file into every named path IS the task "create an empty file"). That
strategy scoring above the baseline is then *excused*: listed with the reason, not a finding. Only
``above_baseline`` is excused, only for the strategies the task names (checked to exist in its
domain's catalogue by :func:`declared_work`), so a paid no-op, a reference below 1 and an error
are always findings.

Tasks run in parallel on a bounded pool of threads; each thread keeps one env per domain and
one scorer, so sandboxes are reused across a thread's episodes as in a rollout worker.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from envs.base import resolve
from envs.types import Message, Task, Trajectory
from rewards.service import RewardFnSpec, RewardScorer
from rl.cli.audit.sources import AuditTask
from rl.cli.audit.strategies import Act, Strategy, Turn, strategies_for

__all__ = [
    "EnvSpec",
    "StrategyResult",
    "Finding",
    "TaskReport",
    "run_episode",
    "audit_tasks",
    "declared_work",
    "DOES_THE_WORK",
    "EPS",
]

# The task meta key that names the strategies doing a task's work, each with its reason.
DOES_THE_WORK = "audit_does_the_work"

EPS = 1e-9


@dataclass(frozen=True)
class EnvSpec:
    """How the recipe serves one domain: the env class (dotted path) and its kwargs."""

    domain: str
    cls: str
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class StrategyResult:
    """One episode's outcome: reward (None when unscored), per-function scores, error, turns, seconds."""

    strategy: str
    role: str
    reward: float | None
    scores: dict[str, float | None]
    error: str | None
    turns: int
    seconds: float


@dataclass(frozen=True)
class Finding:
    """Something the audit flags: ``kind`` is ``above_baseline``, ``noop_paid``, ``reference_below_1`` or ``error``."""

    task_id: str
    domain: str
    kind: str
    strategy: str
    reward: float | None
    baseline: float | None
    detail: str = ""


@dataclass
class TaskReport:
    """One task's audit: where it came from, its reference's reward, its baseline, every result, the findings,
    and the columns its source adds to the table."""

    task_id: str
    domain: str
    where: str
    reference_from: str
    reference_reward: float | None
    baseline: float | None
    results: list[StrategyResult] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    excused: list[Finding] = field(default_factory=list)
    columns: dict[str, str] = field(default_factory=dict)


def declared_work(task: Task) -> dict[str, str]:
    """The strategies ``task`` declares to do its work (``meta["audit_does_the_work"]``), name to reason.

    Raises ValueError naming the task and the field when the value is not a mapping of a strategy
    of the task's domain to a non-empty reason.
    """
    raw = task.meta.get(DOES_THE_WORK)
    if raw is None:
        return {}
    where = f"task {task.id!r}: meta.{DOES_THE_WORK}"
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{where} must map strategy names to the reason each does the task's work")
    known = {s.name: s.role for s in strategies_for(task.domain)}
    for name, reason in raw.items():
        if known.get(name) != "attack":
            raise ValueError(f"{where}.{name}: not an attack strategy of domain {task.domain!r} (jointrl audit --list)")
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError(f"{where}.{name}: the reason must be a non-empty string")
    return dict(raw)


def _reference_act(turns: tuple[str, ...]) -> Act:
    return lambda t: turns[t.turn - 1] if t.turn <= len(turns) else None


def run_episode(env: Any, task: Task, act: Act, max_turns: int, done_marker: str = "DONE") -> Trajectory | None:
    """One episode of ``task`` in ``env`` with ``act`` as the policy; None when ``act`` has no first turn.

    As the rollout: turn 1 gets the prefill (unless it starts with it), a later turn the pre-start its env
    gave (``info["prefill"]``), each turn's observation is appended, ``info["reward"]`` becomes the env
    reward, and an episode the env has not ended when ``act`` stops or ``max_turns`` is reached is
    truncated and handed to the env's ``finalize``.
    """
    seen = list(env.reset(task))
    after: list[Message] = []
    env_reward, events = None, None
    terminated = truncated = False
    n = 0
    prefill = task.prefill
    while True:
        text = act(Turn(task, tuple(seen + after), n + 1, done_marker)) if n < max_turns else None
        if text is None:
            if n == 0:
                return None
            truncated = True
            info = getattr(env, "finalize", lambda: {})()
        else:
            if prefill and not text.startswith(prefill):
                text = prefill + text
            obs, terminated, truncated, info = env.step(text)
            n += 1
            after += [Message("assistant", text), *obs]
            nxt = info.get("prefill") if isinstance(info, dict) else None
            prefill = nxt if isinstance(nxt, str) else ""
        if isinstance(info, dict):
            if isinstance(info.get("reward"), (int, float)) and not isinstance(info.get("reward"), bool):
                env_reward = float(info["reward"])
            if isinstance(info.get("sandbox_events"), list):
                events = (events or []) + [str(x) for x in info["sandbox_events"]]
        if text is None or terminated or truncated:
            break
    return Trajectory(
        task=task,
        group_id=0,
        prompt_ids=[],
        response_ids=[],
        loss_mask=[],
        logprobs=[],
        messages=list(task.messages) + after,
        terminated=terminated,
        truncated=truncated,
        finish_reason="audit",
        num_turns=n,
        env_reward=env_reward,
        sandbox_events=events,
    )


class _Worker:
    """A thread's envs (one per domain, reused across episodes) and reward scorer."""

    def __init__(self, envs: dict[str, EnvSpec], specs: list[RewardFnSpec], timeout_s: float | None):
        self.env_specs = envs
        self.scorer = RewardScorer(specs, timeout_s=timeout_s)
        self.envs: dict[str, Any] = {}

    def env(self, domain: str) -> Any:
        if domain not in self.envs:
            s = self.env_specs[domain]
            self.envs[domain] = resolve(s.cls)(**s.kwargs)
        return self.envs[domain]

    def close(self) -> None:
        for e in self.envs.values():
            try:
                e.close()
            except Exception:  # noqa: BLE001 - closing is best effort at the end of the audit
                pass
        for _, obj, _, _ in self.scorer.fns:
            getattr(obj, "close", lambda: None)()

    def play(self, task: Task, name: str, role: str, act: Act, max_turns: int) -> StrategyResult | None:
        """One strategy's episode, scored; an exception in the env or the scorer is a result with an error."""
        t0 = time.perf_counter()
        env = self.env(task.domain)
        marker = str(getattr(env, "done_marker", "DONE"))
        try:
            traj = run_episode(env, task, act, max_turns, marker)
        except Exception as e:  # noqa: BLE001 - the env raised on an answer: reported, never fatal
            self.envs.pop(task.domain, None)  # a fresh env for the next episode
            try:
                env.close()
            except Exception:  # noqa: BLE001
                pass
            return StrategyResult(name, role, None, {}, f"env: {type(e).__name__}: {e}", 0, time.perf_counter() - t0)
        if traj is None:
            return None
        scored = self.scorer.score([traj])[0]
        return StrategyResult(
            name,
            role,
            scored.reward,
            dict(scored.scores),
            None if scored.reward is not None else f"reward: {scored.reward_error or 'no reward function scored it'}",
            traj.num_turns,
            time.perf_counter() - t0,
        )


def _findings(rep: TaskReport, ref: StrategyResult | None, declared: dict[str, str]) -> None:
    """Set the baseline, the findings and the excused results of ``rep`` from its results, its
    reference's result and the strategies its task declares to do its work."""
    base = [r.reward for r in rep.results if r.role in ("noop", "wrong") and r.reward is not None]
    rep.baseline = max(base) if base else None
    f = rep.findings
    if ref is not None:
        rep.reference_reward = ref.reward
        if ref.error is not None:
            f.append(Finding(rep.task_id, rep.domain, "error", "reference", None, rep.baseline, ref.error))
        elif ref.reward is not None and ref.reward < 1.0 - EPS:
            detail = f"the reference ({rep.reference_from}) must score 1"
            f.append(Finding(rep.task_id, rep.domain, "reference_below_1", "reference", ref.reward, None, detail))
    for r in rep.results:
        if r.error is not None:
            f.append(Finding(rep.task_id, rep.domain, "error", r.strategy, None, rep.baseline, r.error))
        elif r.role == "noop" and r.reward is not None and r.reward > EPS:
            f.append(Finding(rep.task_id, rep.domain, "noop_paid", r.strategy, r.reward, rep.baseline))
        elif r.role == "attack" and r.reward is not None and r.reward > (rep.baseline or 0.0) + EPS:
            finding = Finding(rep.task_id, rep.domain, "above_baseline", r.strategy, r.reward, rep.baseline)
            if r.strategy in declared:
                rep.excused.append(dataclasses.replace(finding, detail=f"declared: {declared[r.strategy]}"))
            else:
                f.append(finding)


def audit_task(w: _Worker, at: AuditTask, strategies: list[Strategy], max_turns: int) -> TaskReport:
    """Every strategy (and the reference, if any) on one task, with its baseline and findings (a task its
    source could not prepare: that error, and nothing played)."""
    t = at.task
    rep = TaskReport(t.id, t.domain, at.where, at.reference_from, None, None, columns=dict(at.columns))
    if at.error is not None:
        rep.findings.append(Finding(t.id, t.domain, "error", "prepare", None, None, at.error))
        return rep
    ref = None
    if at.reference is not None:
        ref = w.play(t, "reference", "reference", _reference_act(at.reference), max_turns)
    for s in strategies:
        r = w.play(t, s.name, s.role, s.act, max_turns)
        if r is not None:
            rep.results.append(r)
    _findings(rep, ref, declared_work(t))
    return rep


def audit_tasks(
    tasks: list[AuditTask],
    envs: dict[str, EnvSpec],
    specs: list[RewardFnSpec],
    *,
    max_turns: int,
    timeout_s: float | None,
    workers: int = 1,
    only: set[str] | None = None,
    progress: Callable[[TaskReport], None] | None = None,
) -> list[TaskReport]:
    """Audit ``tasks`` on ``workers`` threads; reports in task order. ``only``: strategy names to run
    (the baseline's ``noop`` and ``wrong`` always run). ``progress`` is called with each finished report."""
    local = threading.local()
    made: list[_Worker] = []
    lock = threading.Lock()

    def one(at: AuditTask) -> TaskReport:
        w = getattr(local, "w", None)
        if w is None:
            w = local.w = _Worker(envs, specs, timeout_s)
            with lock:
                made.append(w)
        chosen = [
            s for s in strategies_for(at.task.domain) if only is None or s.name in only or s.role in ("noop", "wrong")
        ]
        rep = audit_task(w, at, chosen, max_turns)
        if progress is not None:
            progress(rep)
        return rep

    try:
        with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="audit") as pool:
            return list(pool.map(one, tasks))
    finally:
        for w in made:
            w.close()
