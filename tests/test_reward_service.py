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


def traj(tid: str = "t", domain: str = "d1", **meta) -> Trajectory:
    task = Task(id=tid, domain=domain, messages=(Message("user", "q"),), meta=dict(meta))
    return Trajectory(task=task, group_id=0, prompt_ids=[1, 2], response_ids=[3, 4], loss_mask=[1, 1],
                      logprobs=[-0.5, -0.5], messages=[*task.messages, Message("assistant", "a")],
                      terminated=True, truncated=False, finish_reason="stop")


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


# ------------------------------------------------------------------------- Ray service


@pytest.fixture(scope="module")
def ray_session(reward_module_dir):
    ray = pytest.importorskip("ray")
    mp = pytest.MonkeyPatch()
    mp.setenv("RAY_AUTH_MODE", "disabled")
    pythonpath = os.pathsep.join(p for p in (str(reward_module_dir), os.environ.get("PYTHONPATH", "")) if p)
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": pythonpath}})
    try:
        yield ray
    finally:
        ray.shutdown()
        mp.undo()


def test_service_matches_in_process(ray_session, on_path):
    from rewards.service import RewardService

    specs = [spec("Const", weight=0.5, value=0.8), spec("FromMeta", weight=2.0), spec("Boom")]
    trajs = [traj("a", v=0.1), traj("b", domain="d2", v=0.2), traj("c", v=0.3), traj("d", domain="d2")]
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
    from rewards.service import RewardService

    service = RewardService([spec("Sleepy")], workers=2, timeout_s=2)
    try:
        # Round-robin shards: worker 0 gets samples 0 and 2 (0 hangs), worker 1 gets sample 1.
        trajs = [traj("hang", hang=True), traj("ok1"), traj("ok2")]
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
    from rewards.service import RewardService

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
    from rewards.service import RewardService

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
