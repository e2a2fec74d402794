"""Stack dumps of a run's processes (``envs.stacks``, ``rl.driver.actors.stacks.dump_run_stacks``), with local
subprocesses standing in for actors: only registered, live processes of this host are signalled, each one's
stacks land in its own file under the dump's reason, and nobody else is killed by ``SIGUSR1``."""

from __future__ import annotations

from types import SimpleNamespace

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envs import stacks
from rl.driver.actors.stacks import dump_run_stacks

ROOT = Path(__file__).resolve().parents[1]

_ACTOR = """
import sys, threading, time
from envs.stacks import register
started = threading.Event()
def stuck_in_a_helper_thread():
    started.set()
    threading.Event().wait()
def stuck_in_the_main_thread():
    print(register(sys.argv[2], sys.argv[1]), flush=True)
    time.sleep(3600)
threading.Thread(target=stuck_in_a_helper_thread, daemon=True).start()
started.wait()
stuck_in_the_main_thread()
"""


def _spawn(args: list[str]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, *args], env=env, stdout=subprocess.PIPE, text=True)


@pytest.fixture
def actor(tmp_path: Path):
    """A registered stand-in actor (``reward_worker3``), stuck in two threads; its registered file's path."""
    proc = _spawn(["-c", _ACTOR, str(tmp_path / "stacks"), "reward_worker3"])
    try:
        path = Path(proc.stdout.readline().strip())
        yield proc, path
    finally:
        proc.kill()
        proc.wait()


def test_a_registered_process_dumps_every_thread_into_its_own_file_and_lives(actor, tmp_path: Path) -> None:
    proc, path = actor
    d = tmp_path / "stacks"
    assert path == d / f"reward_worker3_pid{proc.pid}.txt"
    bystander = _spawn(["-c", "import time; time.sleep(3600)"])  # alive, not registered: SIGUSR1 would kill it
    try:
        # A forged registration of the bystander with a wrong start time (a reused pid) and a stale one.
        (d / f"other_pid{bystander.pid}.txt").write_text(
            f"# jointrl stacks: host {os.uname().nodename} pid {bystander.pid} start 1\n"
        )
        (d / "gone_pid999999.txt").write_text(f"# jointrl stacks: host {os.uname().nodename} pid 999999 start 5\n")
        (d / f"half_pid{bystander.pid}.txt.tmp").write_text("# not registered yet\n")
        got = stacks.dump_registered(str(d), "learner rank 1 gave no answer")
        time.sleep(0.2)
        assert bystander.poll() is None and proc.poll() is None, "nobody killed by SIGUSR1"
    finally:
        bystander.kill()
        bystander.wait()
    assert list(got.files) == [path.name] and got.silent == []
    text = path.read_text()
    assert "learner rank 1 gave no answer" in text
    assert text.lower().count("thread 0x") == 2 and 'File "<string>"' in text
    assert "stuck_in_the_main_thread" in text and "stuck_in_a_helper_thread" in text
    assert got.files[path.name] == text, "the text shipped back (a remote node's) is the file's"


def test_the_driver_dump_writes_its_own_stacks_and_signals_the_registered(actor, tmp_path: Path) -> None:
    proc, path = actor
    d = tmp_path / "stacks"
    assert dump_run_stacks(str(d), "engine sleep: no answer") == str(d)
    own = (d / f"driver_pid{os.getpid()}.txt").read_text()
    assert "engine sleep: no answer" in own and "test_the_driver_dump_writes_its_own_stacks" in own
    assert "stuck_in_the_main_thread" in path.read_text()
    dump_run_stacks(str(d), "second miss")  # each dump appends under its own reason
    assert path.read_text().count("stuck_in_the_main_thread") == 2 and "second miss" in path.read_text()


_SPAWNS = """
import multiprocessing, sys, time
from envs.stacks import child_stacks, register
if __name__ == "__main__":
    register("rollout_worker", sys.argv[1])
    with child_stacks("engine_proc"):  # as vLLM starts its engine core: a fresh interpreter (spawn)
        core = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(3600,))
        core.start()
    later = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(3600,))
    later.start()  # started after: not registered
    print(core.pid, later.pid, flush=True)
    time.sleep(3600)
"""


def test_a_child_spawned_under_child_stacks_registers_itself_and_dumps(tmp_path: Path) -> None:
    d = tmp_path / "stacks"
    script = tmp_path / "worker.py"
    script.write_text(_SPAWNS)
    proc = _spawn([str(script), str(d)])
    try:
        core, later = map(int, proc.stdout.readline().split())
        name = f"engine_proc.rollout_worker_pid{proc.pid}_pid{core}.txt"
        deadline = time.monotonic() + 30
        while not (d / name).is_file() and time.monotonic() < deadline:  # registered as the child starts
            time.sleep(0.1)
        got = stacks.dump_registered(str(d), "engine call past faults.engine_call_s")
        assert {name, f"rollout_worker_pid{proc.pid}.txt"} <= set(got.files), sorted(os.listdir(d))
        # Also multiprocessing's resource tracker, started with the first spawn: a Python child too.
        assert all(n.startswith("engine_proc.") for n in got.files if not n.startswith("rollout_worker"))
        assert not any(f"_pid{later}." in n for n in os.listdir(d)), "a child started after the block: no hook"
        assert "engine call past" in got.files[name]
        text = got.files[name]  # its start-up (the hook in site) or its target (in multiprocessing)
        assert 'File "' in text and ("multiprocessing" in text or "site" in text), text
        assert proc.poll() is None and os.path.exists(f"/proc/{core}"), "both alive after the dump"
    finally:
        subprocess.run(["pkill", "-KILL", "-P", str(proc.pid)], check=False)  # its two children, by parent id
        proc.kill()
        proc.wait()


def test_register_without_a_stacks_dir_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(stacks.STACKS_ENV, raising=False)
    assert stacks.register("reward_worker") is None


def test_a_dump_into_a_missing_or_unwritable_place_never_raises(tmp_path: Path) -> None:
    assert stacks.dump_registered(str(tmp_path / "absent"), "why") == stacks.StackDumps()
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert dump_run_stacks(str(blocked / "stacks"), "why") == str(blocked / "stacks")  # noted, not raised


def test_the_pool_dumps_every_process_before_it_replaces_an_unresponsive_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``RolloutPool._call`` without Ray: worker 1 is past its deadline at the first probe; ``dump_stacks`` runs
    (naming the worker and why) before ``_replace`` kills it, and the re-issued call's answer comes back."""
    import ray

    from rl.driver.actors.rollout import EngineUnresponsive, RolloutPool

    events: list[str] = []
    pool = RolloutPool.__new__(RolloutPool)
    pool.probe_every_s, pool.max_restarts, pool._closing = 0.01, 2, False
    pool.group = SimpleNamespace(actors=["worker0", "worker1"])  # two workers (only their count is read)
    pool.dump_stacks = lambda why: events.append(f"dump: {why}")
    issued = {0: 0, 1: 0}

    def issue(i, job):
        issued[i] += 1
        return (f"ref{i}.{issued[i]}", 0.0, f"worker{i}")

    probes = iter([{1: EngineUnresponsive("call ran past rollout call_timeout_s=4")}])
    pool._issue = issue
    pool._probe = lambda pending: next(probes, {})
    pool._replace = lambda i, e, dead: events.append(f"replace {i} ({dead})") is None
    answers = {"ref0.1": "a", "ref1.2": "b"}  # ref1.1 never answers: only its re-issue does
    seen = []

    def wait(refs, num_returns, timeout):
        ready = [r for r in refs if r in answers and r not in seen][:1]
        seen.extend(ready)
        return ready, [r for r in refs if r not in ready]

    monkeypatch.setattr(ray, "wait", wait)
    monkeypatch.setattr(ray, "get", lambda ref: answers[ref])
    assert pool._call({0: ("generate", ()), 1: ("generate", ())}) == {0: "a", 1: "b"}
    assert events == ["dump: rollout worker 1: call ran past rollout call_timeout_s=4", "replace 1 (worker1)"]
