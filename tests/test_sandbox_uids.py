"""envs.sandbox.uids: every sandbox leases its own host uid, so sandboxes never share a process count.

As root: two open sandboxes run (and own their files) as different host uids while seeing
65534 inside; a lease goes back on close (and when its holder dies) and is reused; a uid
locked by another process, or still running processes, is skipped; an exhausted pool says
so. The attack: a sandbox that forks up to its RLIMIT_NPROC budget no longer makes a
sibling sandbox (another episode of its GRPO group) fail to fork. Pools other than the
default one are private to each test (a random base), so concurrent test runs do not meet.
"""

from __future__ import annotations

import gc
import os
import secrets
import shutil
import subprocess
import sys
import time

import pytest

from envs.code import code_sandboxes
from envs.sandbox import Limits, Sandbox, SandboxUnavailable, ShellSession, check_sandbox
from envs.sandbox.config import SandboxConfig
from envs.sandbox.reap import _count_procs
import envs.sandbox.uids as uids
from envs.sandbox.uids import UidPoolExhausted, _lock_dir, lease_uid

try:
    check_sandbox()
except SandboxUnavailable as exc:  # pragma: no cover - CI installs bubblewrap
    pytest.skip(f"bubblewrap sandboxes unavailable: {exc}", allow_module_level=True)

IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="uid leases exist only when the harness is root")


def _private_pool(count: int = 3) -> SandboxConfig:
    """A small pool of uids no other test (or test run) uses."""
    return SandboxConfig(uid_base=2_050_000_000 + secrets.randbelow(10_000_000) * 8, uid_count=count)


def _hold_lock(uid: int) -> subprocess.Popen:
    """Another process holding ``uid``'s lease lock (until it is killed)."""
    directory = _lock_dir()  # the lock directory exists before any sandbox has leased
    code = (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({os.path.join(directory, str(uid))!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
        "print('locked', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "locked\n"
    return proc


@needs_root
def test_two_open_sandboxes_run_as_different_host_uids_and_own_their_files():
    with Sandbox() as a, Sandbox() as b:
        assert a.host_uid != b.host_uid
        for box in (a, b):
            cfg = box.config
            assert cfg.uid_base <= box.host_uid < cfg.uid_base + cfg.uid_count and box.host_gid == box.host_uid
            r = box.run(["/bin/sh", "-c", "id -u; id -g; echo x > made.txt; mkdir d"])
            assert r.ok and r.stdout.split() == ["65534", "65534"], r  # inside: nobody, as before
            for name in ("made.txt", "d", "."):
                st = os.stat(os.path.join(box.work_dir, name))
                assert (st.st_uid, st.st_gid) == (box.host_uid, box.host_gid), name
        # The harness's own writes belong to the sandbox too.
        a.write_files({"sub/given.txt": "g"})
        assert os.stat(os.path.join(a.work_dir, "sub", "given.txt")).st_uid == a.host_uid
        assert os.stat(os.path.join(a.work_dir, "sub")).st_uid == a.host_uid


@needs_root
def test_a_shell_session_over_a_sandboxes_storage_shares_its_uid_and_the_code_pair_leases_two():
    with Sandbox() as box, ShellSession(box.work_dir) as session:
        assert session.sandbox.host_uid == box.host_uid
        assert session.run("echo hi > f; id -u").output.strip() == "65534"
        assert os.stat(os.path.join(box.work_dir, "f")).st_uid == box.host_uid
    cand, judge = code_sandboxes()
    try:
        assert cand.host_uid != judge.host_uid
    finally:
        cand.close()
        judge.close()


@needs_root
def test_a_lease_is_released_on_close_and_reused():
    cfg = _private_pool()
    box = Sandbox(config=cfg)
    assert box.host_uid == cfg.uid_base
    with Sandbox(config=cfg) as other:
        assert other.host_uid == cfg.uid_base + 1
    box.close()
    with Sandbox(config=cfg) as again:
        assert again.host_uid == cfg.uid_base  # the lowest free uid: the one just released
        assert again.run(["/bin/true"]).ok
    lease = lease_uid(cfg)
    assert lease.held and lease.uid == cfg.uid_base
    del lease  # collected without release(): the lock goes with it
    gc.collect()
    lease = lease_uid(cfg)
    assert lease.uid == cfg.uid_base
    lease.release()
    assert not lease.held


@needs_root
def test_a_uid_locked_by_another_process_is_skipped_until_that_process_dies():
    cfg = _private_pool()
    holder = _hold_lock(cfg.uid_base)
    try:
        lease = lease_uid(cfg)
        assert lease.uid == cfg.uid_base + 1
        lease.release()
    finally:
        holder.kill()
        holder.wait()
    lease = lease_uid(cfg)  # the dead holder's lock died with it
    try:
        assert lease.uid == cfg.uid_base
    finally:
        lease.release()


@needs_root
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv")
def test_a_uid_that_still_runs_processes_is_not_leased():
    cfg = _private_pool()
    orphan = subprocess.Popen(
        ["setpriv", f"--reuid={cfg.uid_base}", f"--regid={cfg.uid_base}", "--clear-groups", "sleep", "60"]
    )
    try:
        deadline = time.monotonic() + 5
        while _count_procs(cfg.uid_base) == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _count_procs(cfg.uid_base) == 1
        lease = lease_uid(cfg)  # the uid's lock is free, but its previous holder left a process
        assert lease.uid == cfg.uid_base + 1
        lease.release()
    finally:
        orphan.kill()
        orphan.wait()


@needs_root
def test_an_exhausted_pool_raises_a_clear_error():
    cfg = _private_pool(count=2)
    with Sandbox(config=cfg), Sandbox(config=cfg):
        with pytest.raises(UidPoolExhausted, match=r"no free sandbox uid .*uid_base/uid_count.*all 2 are leased"):
            Sandbox(config=cfg)
        with pytest.raises(UidPoolExhausted):
            lease_uid(cfg)
    with Sandbox(config=cfg) as box:  # and a failed construction leaked nothing
        assert box.host_uid == cfg.uid_base


def test_without_root_the_callers_own_uid_is_used_and_nothing_is_held(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 12345)
    lease = lease_uid(SandboxConfig())
    assert (lease.uid, lease.gid, lease.held) == (os.getuid(), os.getgid(), False)
    lease.release()


@pytest.mark.parametrize(
    "bad",
    [
        {"uid_base": 1000},
        {"uid_base": 1 << 31},
        {"uid_count": 0},
        {"uid_base": (1 << 31) - 1, "uid_count": 2},
        {"uid_count": True},
    ],
)
def test_the_uid_pool_is_validated(bad):
    with pytest.raises(ValueError, match="sandbox_config.uid_"):
        SandboxConfig.coerce(bad)


@needs_root
def test_attack_a_process_flood_does_not_starve_a_sibling_sandbox():
    """GRPO: an episode that forks up to its limit must not make its group's other episodes fail.

    The sibling's shell starts before the flood (its RLIMIT_NPROC budget is fixed then);
    with one host uid for all sandboxes the flooder's processes counted against it and its
    next fork failed. A sandbox started during the flood must run too.
    """
    lim = Limits(processes=64, wall_seconds=10)
    with ShellSession(limits=lim) as sibling, ShellSession(limits=lim) as flooder:
        assert sibling.run("echo ready").output.strip() == "ready"
        r = flooder.run("for i in $(seq 60); do sleep 30 & done; echo spawned", timeout=10)
        assert r.exit_code == 0 and "spawned" in r.output, r
        deadline = time.monotonic() + 10
        while _count_procs(flooder.sandbox.host_uid) < 60 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _count_procs(flooder.sandbox.host_uid) >= 60  # the flooder is at its budget
        res = sibling.run("sh -c 'echo ok | cat'", timeout=10)
        assert res.exit_code == 0 and res.output.strip() == "ok", res
        with Sandbox(limits=lim) as late:
            run = late.run(["/bin/sh", "-c", "echo ok | cat"])
            assert run.ok and run.stdout == "ok\n", run


@needs_root
def test_the_lock_dir_falls_back_when_run_cannot_be_written(tmp_path, monkeypatch):
    monkeypatch.setattr(uids, "LOCK_DIR", "/proc/jointrl-uids")  # mkdir fails there, as on a read-only /run
    monkeypatch.setattr(uids, "FALLBACK_LOCK_DIR", str(tmp_path / "locks"))
    assert _lock_dir() == str(tmp_path / "locks")
    lease = lease_uid(_private_pool(1))
    try:
        assert lease.held and (tmp_path / "locks" / str(lease.uid)).exists()
    finally:
        lease.release()
    (tmp_path / "locks").chmod(0o777)  # anyone could plant or delete locks: refused
    with pytest.raises(RuntimeError, match="owned by root and writable by root only"):
        _lock_dir()
