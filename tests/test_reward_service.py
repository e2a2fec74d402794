"""rewards.service: RewardScorer in-process, and RewardService on Ray actors (timeouts, worker replacement).

Reward classes live in a module written to a temp folder and put on sys.path (and, for Ray,
on the workers' PYTHONPATH), the way a user's own reward code is found.
"""

from __future__ import annotations

import os
import textwrap

import pytest

from envs.types import Message, Task, Trajectory
from rewards.service import RewardFnSpec, RewardScorer

MOD = "jointrl_test_reward_fns"  # a module name nothing else uses

REWARD_MODULE = textwrap.dedent(
    '''
    import time


    class Const:
        """Returns a fixed value (any object: used for NaN, inf, strings, bools)."""

        name = "const"
        domains = ("d1",)

        def __init__(self, value=1.0):
            self.value = value

        def __call__(self, traj):
            return self.value


    class FromMeta:
        """Returns task.meta["v"] (None when absent)."""

        name = "meta"
        domains = ("d1", "d2")

        def __call__(self, traj):
            return traj.task.meta.get("v")


    class NoneFn:
        name = "none"
        domains = ("d1", "d2")

        def __call__(self, traj):
            return None


    class Boom:
        name = "boom"
        domains = ("d1",)

        def __call__(self, traj):
            raise ValueError("kaputt " + traj.task.id)


    class AlsoConst2:
        name = "const_2"
        domains = ("d1",)

        def __call__(self, traj):
            return 0.0625


    class Unnamed:
        domains = ("d1",)

        def __call__(self, traj):
            return 0.125


    class FirstHang:
        """Hangs the first time it is called (marker file absent), then returns 1.0."""

        name = "first_hang"
        domains = ("d1",)

        def __init__(self, marker):
            self.marker = marker

        def __call__(self, traj):
            import os

            if not os.path.exists(self.marker):
                open(self.marker, "w").close()
                time.sleep(30)
            return 1.0


    class Crashy:
        """Kills its own process on tasks whose meta has "crash"; 1.0 otherwise."""

        name = "crashy"
        domains = ("d1",)

        def __call__(self, traj):
            import os

            if traj.task.meta.get("crash"):
                os._exit(3)
            return 1.0


    class Nap:
        """Sleeps meta["nap"] seconds (default 0), then returns 1.0."""

        name = "nap"
        domains = ("d1",)

        def __call__(self, traj):
            time.sleep(traj.task.meta.get("nap", 0))
            return 1.0


    class Batched:
        """score_batch only (its __call__ must not be used): meta["v"] per trajectory; ``mode`` breaks it."""

        name = "batched"
        domains = ("d1", "d2")

        def __init__(self, mode="ok"):
            self.mode = mode
            self.batches = []

        def __call__(self, traj):
            raise AssertionError("__call__ used although score_batch exists")

        def score_batch(self, trajs):
            self.batches.append([t.task.id for t in trajs])
            if self.mode == "short":
                return [1.0] * (len(trajs) - 1)
            if self.mode == "raise":
                raise RuntimeError("batch down")
            if self.mode == "hang":
                time.sleep(3)
            if self.mode == "not_a_list":
                return 5
            return [t.task.meta.get("v") for t in trajs]


    class Async:
        """acall only: meta["v"] (default 1.0) after ``delay`` s; meta "hang" / "block" / "boom" misbehave."""

        name = "async"
        domains = ("d1",)
        concurrency = 4

        def __init__(self, delay=0.0):
            self.delay = delay
            self.in_flight = 0
            self.max_in_flight = 0

        def __call__(self, traj):
            raise AssertionError("__call__ used although acall exists")

        async def acall(self, traj):
            import asyncio

            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                if traj.task.meta.get("hang"):
                    await asyncio.sleep(30)
                if traj.task.meta.get("block"):
                    time.sleep(3)  # blocks the event loop: wait_for cannot fire
                if traj.task.meta.get("boom"):
                    raise ValueError("async kaputt")
                await asyncio.sleep(self.delay)
                return traj.task.meta.get("v", 1.0)
            finally:
                self.in_flight -= 1


    class Penalty:
        """A shaping term for every domain."""

        name = "penalty"
        domains = ("*",)
        shaping = True

        def __call__(self, traj):
            return -0.25


    class GilHog:
        """On meta "hog": a regex with exponential backtracking that holds the GIL for hours."""

        name = "gil_hog"
        domains = ("d1",)

        def __call__(self, traj):
            import re

            if traj.task.meta.get("hog"):
                re.match(r"(a+)+$", "a" * 40 + "b")
            return 1.0


    class Sleepy:
        """Hangs on tasks whose meta has "hang"; 1.0 otherwise."""

        name = "sleepy"
        domains = ("d1",)

        def __call__(self, traj):
            if traj.task.meta.get("hang"):
                time.sleep(30)
            return 1.0
    '''
)


@pytest.fixture(scope="module")
def reward_module_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("reward_fns")
    (d / f"{MOD}.py").write_text(REWARD_MODULE)
    return d


@pytest.fixture
def on_path(reward_module_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(reward_module_dir))
    return reward_module_dir


def spec(cls: str, weight: float = 1.0, domains: tuple[str, ...] = (), **kwargs) -> RewardFnSpec:
    return RewardFnSpec(cls=f"{MOD}.{cls}", weight=weight, domains=domains, kwargs=kwargs)


def traj(tid: str = "t", domain: str = "d1", group: int = 0, **meta) -> Trajectory:
    task = Task(id=tid, domain=domain, messages=(Message("user", "q"),), meta=dict(meta))
    return Trajectory(
        task=task,
        group_id=group,
        prompt_ids=[1, 2],
        response_ids=[3, 4],
        loss_mask=[1, 1],
        logprobs=[-0.5, -0.5],
        messages=[*task.messages, Message("assistant", "a")],
        terminated=True,
        truncated=False,
        finish_reason="stop",
    )


# ------------------------------------------------------------------------- in-process


def test_weighted_sum(on_path):
    scorer = RewardScorer([spec("Const", weight=0.5, value=0.8), spec("FromMeta", weight=2.0)])
    assert scorer.names == ["const", "meta"]
    (out,) = scorer.score([traj(v=0.3)])
    # 0.5 * 0.8 + 2.0 * 0.3 = 0.4 + 0.6 = 1.0
    assert out.reward == pytest.approx(1.0)
    assert out.reward_error is None
    assert out.scores == {"const": pytest.approx(0.8), "meta": pytest.approx(0.3)}  # unweighted


def test_score_does_not_mutate_and_keeps_order(on_path):
    scorer = RewardScorer([spec("FromMeta")])
    ins = [traj("a", v=0.1), traj("b", v=0.2), traj("c", v=0.3)]
    outs = scorer.score(ins)
    assert [t.task.id for t in outs] == ["a", "b", "c"]
    assert [t.reward for t in outs] == [pytest.approx(0.1), pytest.approx(0.2), pytest.approx(0.3)]
    assert all(t.reward is None and t.scores == {} for t in ins)


def test_none_is_ignored(on_path):
    scorer = RewardScorer([spec("NoneFn"), spec("Const", weight=3.0, value=0.5)])
    (out,) = scorer.score([traj()])
    assert out.reward == pytest.approx(1.5)  # 3.0 * 0.5; NoneFn contributes nothing
    assert out.reward_error is None
    assert out.scores == {"none": None, "const": pytest.approx(0.5)}


def test_all_none_is_an_error(on_path):
    scorer = RewardScorer([spec("NoneFn"), spec("FromMeta")])  # FromMeta: no "v" -> None
    (out,) = scorer.score([traj(domain="d2")])
    assert out.reward is None
    assert out.reward_error and "d2" in out.reward_error


def test_raising_function_is_recorded(on_path):
    scorer = RewardScorer([spec("Const", value=1.0), spec("Boom")])
    (out,) = scorer.score([traj("task-7")])
    assert out.reward is None  # never a silent 0 or a partial sum
    assert "boom" in out.reward_error
    assert "ValueError" in out.reward_error
    assert "kaputt task-7" in out.reward_error


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), "1.0", True, False, [1.0]])
def test_non_finite_or_non_number_is_an_error(on_path, value):
    scorer = RewardScorer([spec("FromMeta"), spec("Const", value=value)])
    (out,) = scorer.score([traj(v=0.5)])
    assert out.reward is None
    assert out.reward_error is not None and "const" in out.reward_error


@pytest.mark.parametrize("value", [0, 2, -1.5])
def test_ints_and_negative_numbers_are_fine(on_path, value):
    (out,) = RewardScorer([spec("Const", value=value)]).score([traj()])
    assert out.reward == float(value) and out.reward_error is None


def test_class_domains_restrict(on_path):
    # Const declares domains ("d1",): not applied to a d2 sample.
    scorer = RewardScorer([spec("Const", weight=1.0, value=100.0), spec("FromMeta")])
    d1, d2 = scorer.score([traj(domain="d1", v=0.25), traj(domain="d2", v=0.25)])
    assert d1.reward == pytest.approx(100.25)  # 100 + 0.25
    assert d2.reward == pytest.approx(0.25)
    assert d2.scores == {"meta": pytest.approx(0.25)}


def test_spec_domains_override_class_domains(on_path):
    # The spec's domains replace the class's ("d1",): applied to d2 only.
    scorer = RewardScorer([spec("Const", domains=("d2",), value=7.0), spec("FromMeta")])
    d1, d2 = scorer.score([traj(domain="d1", v=0.5), traj(domain="d2", v=0.5)])
    assert d1.reward == pytest.approx(0.5)
    assert d2.reward == pytest.approx(7.5)  # 7 + 0.5


def test_domain_no_function_applies(on_path):
    (out,) = RewardScorer([spec("Const")]).score([traj(domain="d9")])
    assert out.reward is None and "d9" in out.reward_error


def test_duplicate_names_are_kept_apart(on_path):
    scorer = RewardScorer([spec("Const", value=0.25), spec("Const", value=0.5), spec("Unnamed")])
    assert scorer.names == ["const", "const_2", "Unnamed"]
    (out,) = scorer.score([traj()])
    assert out.scores == {"const": 0.25, "const_2": 0.5, "Unnamed": 0.125}
    assert out.reward == pytest.approx(0.875)  # 0.25 + 0.5 + 0.125


def test_renamed_duplicate_does_not_collide_with_an_existing_name(on_path):
    scorer = RewardScorer([spec("Const", value=0.25), spec("Const", value=0.5), spec("AlsoConst2")])
    assert len(set(scorer.names)) == 3
    (out,) = scorer.score([traj()])
    assert len(out.scores) == 3
    assert sorted(out.scores.values()) == [0.0625, 0.25, 0.5]


def test_constructor_kwargs_errors_surface(on_path):
    with pytest.raises(TypeError):
        RewardScorer([spec("Const", nope=1)])


def test_builtins_satisfy_the_protocol():
    from rewards.code import CodeFormatReward, CodeTestsReward
    from rewards.format import OverlongPenalty
    from rewards.judge import LLMJudge
    from rewards.protocol import AsyncRewardFn, BatchedRewardFn, RewardFn, call_mode
    from rewards.terminal import TerminalCheckReward
    from rewards.toolcall import ToolAnswerReward, ToolCallFormatReward, ToolCallReward

    objs = [
        ToolCallReward(),
        ToolAnswerReward(),
        ToolCallFormatReward(),
        CodeTestsReward(),
        CodeFormatReward(),
        TerminalCheckReward(),
        OverlongPenalty(64, 16),
    ]
    for o in objs:
        assert isinstance(o, RewardFn), o
        assert call_mode(o) == "call"
    judge = LLMJudge("http://127.0.0.1:9/v1", "m", "{completion}")
    assert isinstance(judge, AsyncRewardFn) and call_mode(judge) == "async"
    assert not isinstance(ToolCallReward(), BatchedRewardFn)


def test_score_batch_is_one_call_per_function(on_path):
    scorer = RewardScorer([spec("Batched")])
    trajs = [traj("a", v=0.25), traj("b", domain="d2", v=0.5), traj("c", domain="d9", v=1.0), traj("d", v=None)]
    out = scorer.score(trajs)
    (fn,) = [o for _, o, _, _ in scorer.fns]
    assert fn.batches == [["a", "b", "d"]]  # only the domains it scores, in order, in one call
    assert [t.reward for t in out] == [0.25, 0.5, None, None]
    assert "d9" in out[2].reward_error and "d1" in out[3].reward_error  # nothing scored them


@pytest.mark.parametrize(
    "mode, message",
    [
        ("short", "batched score_batch returned 1 values for 2 trajectories"),
        ("not_a_list", "batched score_batch returned int for 2 trajectories"),
        ("raise", "batched score_batch raised RuntimeError: batch down"),
    ],
)
def test_score_batch_failures_error_every_sample(on_path, mode, message):
    out = RewardScorer([spec("Batched", mode=mode), spec("FromMeta")]).score([traj("a", v=1.0), traj("b", v=1.0)])
    for t in out:
        assert t.reward is None and t.reward_error.startswith(message), t.reward_error
        assert t.scores == {"meta": 1.0}  # the other function still ran and is reported


def test_score_batch_timeout(on_path):
    out = RewardScorer([spec("Batched", mode="hang")], timeout_s=0.5).score([traj("a", v=1.0), traj("b", v=1.0)])
    assert [t.reward_error for t in out] == ["batched score_batch timed out after 0.5s"] * 2


def test_async_calls_run_concurrently_up_to_the_class_limit(on_path):
    import time

    scorer = RewardScorer([spec("Async", delay=0.4)], timeout_s=10)
    t0 = time.perf_counter()
    out = scorer.score([traj(str(i), v=i / 10) for i in range(8)])
    elapsed = time.perf_counter() - t0
    assert [t.reward for t in out] == [pytest.approx(i / 10) for i in range(8)]
    (fn,) = [o for _, o, _, _ in scorer.fns]
    assert fn.max_in_flight == 4  # concurrency = 4
    assert elapsed < 8 * 0.4 * 0.75, elapsed  # two waves of 4, not 8 calls in a row


def test_async_failures_are_per_sample(on_path):
    scorer = RewardScorer([spec("Async")], timeout_s=0.5)
    ok, hang, boom, nan = scorer.score(
        [traj("ok"), traj("hang", hang=True), traj("boom", boom=True), traj("nan", v=float("nan"))]
    )
    assert ok.reward == 1.0 and ok.reward_error is None
    assert hang.reward is None and hang.reward_error == "async timed out after 0.5s"
    assert boom.reward is None and boom.reward_error == "async raised ValueError: async kaputt"
    assert nan.reward is None and "not a finite number" in nan.reward_error


def test_async_blocked_event_loop_times_out(on_path):
    import time

    scorer = RewardScorer([spec("Async")], timeout_s=0.3)
    t0 = time.perf_counter()
    out = scorer.score([traj("blocker", block=True), traj("ok")])
    assert time.perf_counter() - t0 < 2.9  # gave up before the 3 s block ended
    assert all(t.reward is None and "timed out" in t.reward_error for t in out if t.task.id == "blocker")
    assert scorer.stuck_threads() == 1


def test_sync_call_timeout_only_costs_that_sample(on_path):
    import time

    scorer = RewardScorer([spec("Nap"), spec("FromMeta", weight=0.0)], timeout_s=0.3)
    t0 = time.perf_counter()
    out = scorer.score([traj("a", v=0.5), traj("slow", nap=2, v=0.5), traj("c", v=0.5)])
    assert time.perf_counter() - t0 < 1.5
    assert [t.reward for t in out] == [1.0, None, 1.0]
    assert out[1].reward_error == "nap timed out after 0.3s"
    assert out[1].scores == {"meta": 0.5}
    assert scorer.stuck_threads() == 1
    m = scorer.metrics()
    assert m["reward/nap/errors"] == 1.0 and m["reward/meta/errors"] == 0.0
    assert 0.1 < m["reward/nap/latency_s"] < 0.5  # (0 + 0.3 + 0) / 3 plus overhead
    assert scorer.metrics() == {}  # drained


def test_no_timeout_runs_in_the_calling_thread(on_path):
    import threading

    seen = []

    class Probe:
        name = "probe"
        domains = ("d1",)

        def __call__(self, traj):
            seen.append(threading.current_thread())
            return 1.0

    import sys

    mod = sys.modules.setdefault("jointrl_test_probe", type(sys)("jointrl_test_probe"))
    mod.Probe = Probe
    RewardScorer([RewardFnSpec("jointrl_test_probe.Probe")]).score([traj()])
    assert seen == [threading.current_thread()]
    RewardScorer([RewardFnSpec("jointrl_test_probe.Probe")], timeout_s=5).score([traj()])
    assert seen[1] is not threading.current_thread()


def test_all_errors_are_reported_together(on_path):
    (out,) = RewardScorer([spec("Boom"), spec("Const", value=float("inf")), spec("FromMeta")]).score([traj("x", v=1)])
    assert out.reward is None
    assert out.reward_error == "boom raised ValueError: kaputt x; const returned inf, not a finite number"
    assert out.scores == {"meta": 1.0}


def test_wildcard_domain_and_shaping(on_path):
    scorer = RewardScorer([spec("Penalty"), spec("FromMeta")])
    d1, d2, d9 = scorer.score([traj(domain="d1", v=1.0), traj(domain="d2"), traj(domain="d9", v=1.0)])
    assert d1.reward == pytest.approx(0.75) and d1.scores == {"penalty": -0.25, "meta": 1.0}
    # d2: FromMeta returned None; the shaping penalty alone does not make the sample scored.
    assert d2.reward is None and "no reward function scored this 'd2' sample" in d2.reward_error
    assert "penalty" in d2.reward_error
    # each function's part named: the one that returned None is not blamed on the shaping term
    assert d2.reward_error.endswith(
        "penalty is a shaping term (it adds to a score, it is not one); meta returned None (does not apply)"
    ), d2.reward_error
    assert d9.reward is None  # "*" reached it, but only the shaping term did


def test_zero_weight_functions_are_reported_but_do_not_score(on_path):
    scorer = RewardScorer([spec("Const", weight=0.0, value=0.5), spec("FromMeta")])
    scored, unscored = scorer.score([traj(v=0.25), traj()])
    assert scored.reward == pytest.approx(0.25) and scored.scores == {"const": 0.5, "meta": 0.25}
    assert unscored.reward is None and "no reward function scored" in unscored.reward_error
    assert "const has weight 0" in unscored.reward_error and "meta returned None" in unscored.reward_error


def test_spec_wildcard_domains(on_path):
    (out,) = RewardScorer([spec("Const", domains=("*",), value=2.0)]).score([traj(domain="anything")])
    assert out.reward == 2.0


# ------------------------------------------------------------------------- Ray service


@pytest.fixture(scope="module")
def ray_session(reward_module_dir):
    ray = pytest.importorskip("ray")
    mp = pytest.MonkeyPatch()
    mp.setenv("RAY_AUTH_MODE", "disabled")
    pythonpath = os.pathsep.join(p for p in (str(reward_module_dir), os.environ.get("PYTHONPATH", "")) if p)
    if ray.is_initialized():
        ray.shutdown()
    ray.init(
        num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": pythonpath}}
    )
    try:
        yield ray
    finally:
        ray.shutdown()
        mp.undo()


def test_service_matches_in_process(ray_session, on_path):
    from rl.driver.actors.rewards import RewardService

    specs = [spec("Const", weight=0.5, value=0.8), spec("FromMeta", weight=2.0), spec("Boom")]
    trajs = [
        traj("a", v=0.1),
        traj("b", domain="d2", group=1, v=0.2),
        traj("c", group=2, v=0.3),
        traj("d", domain="d2", group=1),
    ]
    expected = RewardScorer(specs).score(trajs)
    service = RewardService(specs, workers=2, timeout_s=60)
    try:
        got = service.score(trajs)
    finally:
        service.shutdown()
    assert got == expected
    # Spot-check the expected values themselves: d1 samples hit Boom, d2 ones are 2 * v.
    assert [t.reward for t in got] == [None, pytest.approx(0.4), None, None]  # 2.0 * 0.2 = 0.4
    assert "kaputt a" in got[0].reward_error and "kaputt c" in got[2].reward_error
    assert "d2" in got[3].reward_error  # FromMeta -> None: nothing scored it
    assert service.restarts == 0


def test_service_hung_worker_is_replaced(ray_session, on_path):
    ray = ray_session
    from rl.driver.actors.rewards import RewardService

    service = RewardService([spec("Sleepy")], workers=2, timeout_s=2)
    try:
        # Groups 0 and 1 go to worker 0 (samples 0 and 2; 0 hangs), group 2 to worker 1.
        trajs = [traj("hang", group=0, hang=True), traj("ok1", group=2), traj("ok2", group=1)]
        out = service.score(trajs)
        assert [t.task.id for t in out] == ["hang", "ok1", "ok2"]
        # Per-call timeout: only the hung sample errors (on the first try and on its retry);
        # its worker-mates are scored.
        assert out[0].reward is None and out[0].reward_error == "sleepy timed out after 2s"
        assert [t.reward for t in out[1:]] == [1.0, 1.0] and all(t.reward_error is None for t in out[1:])
        # The worker left with a stuck thread is replaced after each of the two tries.
        assert service.restarts == 2
        m = service.metrics()
        assert m["reward/sleepy/errors"] == 2.0  # the first try and the retry
        assert m["reward/service/restarts"] == 2.0 and m["reward/service/worker_errors"] == 0.0
        assert service.metrics()["reward/service/restarts"] == 0.0  # drained
        # The replacement workers serve the next call. Wait until they are up first, so that
        # actor start-up on a loaded machine does not eat into the 2 s scoring timeout.
        ray.get([w.__ray_ready__.remote() for w in service.workers], timeout=60)
        restarts = service.restarts
        again = service.score([traj("x"), traj("y"), traj("z")])
        assert [t.reward for t in again] == [1.0, 1.0, 1.0]
        assert all(t.reward_error is None for t in again)
        assert service.restarts == restarts
    finally:
        service.shutdown()


def test_service_retries_once_on_a_fresh_worker(ray_session, on_path, tmp_path):
    # The first call hangs past the timeout; the share is retried on a replacement worker, which succeeds.
    # (timeout_s is 5 rather than 2: the retry's time limit also covers the new actor's start-up.)
    from rl.driver.actors.rewards import RewardService

    service = RewardService([spec("FirstHang", marker=str(tmp_path / "hung-once"))], workers=1, timeout_s=5)
    try:
        out = service.score([traj("a"), traj("b")])
        assert [t.reward for t in out] == [1.0, 1.0]
        assert all(t.reward_error is None for t in out)
        assert service.restarts == 1
    finally:
        service.shutdown()


def test_service_crashed_worker_is_replaced(ray_session, on_path):
    ray = ray_session
    from rl.driver.actors.rewards import RewardService

    service = RewardService([spec("Crashy")], workers=1, timeout_s=30)
    try:
        out = service.score([traj("ok"), traj("boom", crash=True)])
        # The crash takes the whole share down, on the first try and on the retry.
        assert [t.reward for t in out] == [None, None]
        assert all("reward worker died" in t.reward_error and "Actor" in t.reward_error for t in out)
        assert service.restarts == 2
        ray.get([w.__ray_ready__.remote() for w in service.workers], timeout=60)
        assert [t.reward for t in service.score([traj("ok")])] == [1.0]
    finally:
        service.shutdown()


def test_service_batched_and_async_classes_match_in_process(ray_session, on_path):
    from rl.driver.actors.rewards import RewardService

    specs = [spec("Batched", weight=0.5), spec("Async", weight=2.0), spec("Penalty")]
    trajs = [traj(str(i), domain="d1" if i % 3 else "d2", v=i / 8) for i in range(8)] + [traj("boom", boom=True, v=1)]
    expected = RewardScorer(specs, timeout_s=30).score(trajs)
    service = RewardService(specs, workers=2, timeout_s=30)
    try:
        got = service.score(trajs)
        m = service.metrics()
    finally:
        service.shutdown()
    assert got == expected
    assert got[-1].reward is None and "async raised ValueError" in got[-1].reward_error
    assert m["reward/async/errors"] == 1.0 and m["reward/batched/errors"] == 0.0
    assert m["reward/service/restarts"] == 0.0
    assert set(m) >= {"reward/batched/latency_s", "reward/async/latency_s", "reward/penalty/latency_s"}


def test_service_worker_holding_the_gil_is_killed(ray_session, on_path):
    """A call that never releases the GIL cannot be timed out inside its process: the service
    sees that the worker makes no progress, kills it, retries once, then records the error."""
    import time

    ray = ray_session
    from rl.driver.actors.rewards import RewardService

    service = RewardService([spec("GilHog")], workers=2, timeout_s=2)
    try:
        t0 = time.perf_counter()
        out = service.score([traj("hog", group=0, hog=True), traj("ok1", group=2), traj("ok2", group=1)])
        assert time.perf_counter() - t0 < 40
        assert out[1].reward == 1.0  # the other worker's share
        for t in (out[0], out[2]):  # the hung worker's share (on the first try and on the retry)
            assert t.reward is None and t.reward_error.startswith("reward worker timed out after 2s"), t.reward_error
        assert service.restarts == 2
        assert service.metrics()["reward/service/worker_errors"] == 2.0
        ray.get([w.__ray_ready__.remote() for w in service.workers], timeout=60)
        assert [t.reward for t in service.score([traj("a"), traj("b")])] == [1.0, 1.0]
    finally:
        service.shutdown()


def test_service_keeps_groups_on_one_worker(ray_session, on_path):
    """score_batch sees whole groups: 3 groups of 3 over 2 workers, never split."""
    from rl.driver.actors.rewards import RewardService

    class_path = spec("Batched")
    service = RewardService([class_path], workers=2, timeout_s=30)
    try:
        trajs = [traj(f"g{g}s{k}", group=g, v=1.0) for k in range(3) for g in range(3)]  # interleaved groups
        out = service.score(trajs)
        assert [t.task.id for t in out] == [t.task.id for t in trajs] and all(t.reward == 1.0 for t in out)
        import ray

        batches = [
            b for w in service.workers for b in ray.get(w.__ray_call__.remote(lambda self: self.fns[0][1].batches))
        ]
    finally:
        service.shutdown()
    assert sorted(len(b) for b in batches) == [3, 6]
    for b in batches:
        groups = {i.split("s")[0] for i in b}
        assert all(sum(i.startswith(g + "s") for i in b) == 3 for g in groups)
