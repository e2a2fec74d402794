"""Weight folders in /dev/shm carry their process's pid; a new one removes those of dead processes."""

import os
import subprocess
import sys
import time

from rl.trainer.shm import _pid_ns, make_shm_dir, pid_alive, sweep_dead

NS = _pid_ns()


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_new_folder_removes_what_killed_processes_left_and_nothing_else(tmp_path):
    dead = _dead_pid()
    left = tmp_path / f"jointrl-local-{NS}-{dead}-abc"
    (left / "model").mkdir(parents=True)
    (left / "model" / "weights.safetensors").write_bytes(b"x" * 1024)
    live = tmp_path / f"jointrl-local-{NS}-{os.getpid()}-def"  # this process: alive
    live.mkdir()
    other_prefix = tmp_path / f"jointrl-run-{NS}-{dead}-ghi"  # another prefix is not this sweep's
    other_prefix.mkdir()
    old_style = tmp_path / "jointrl-local-1h78t573"  # no pid in the name: never touched
    old_style.mkdir()
    pid1 = tmp_path / f"jointrl-local-{NS}-1-jkl"  # init: alive (or another user's), kept
    pid1.mkdir()
    other_ns = tmp_path / f"jointrl-local-1{NS}-{dead}-mno"  # another PID namespace's pids are not ours to judge
    other_ns.mkdir()

    made = make_shm_dir("jointrl-local-", str(tmp_path))

    assert os.path.basename(made).startswith(f"jointrl-local-{NS}-{os.getpid()}-") and os.path.isdir(made)
    assert not left.exists()
    assert live.is_dir() and other_prefix.is_dir() and old_style.is_dir() and pid1.is_dir() and other_ns.is_dir()


def test_a_file_or_link_with_a_dead_pid_name_is_left_alone(tmp_path):
    dead = _dead_pid()
    target = tmp_path / "keep"
    target.mkdir()
    (target / "f").write_text("x")
    (tmp_path / f"jointrl-local-{NS}-{dead}-link").symlink_to(target)
    (tmp_path / f"jointrl-local-{NS}-{dead}-file").write_text("x")
    assert sweep_dead("jointrl-local-", str(tmp_path)) == []
    assert (target / "f").exists() and (tmp_path / f"jointrl-local-{NS}-{dead}-file").exists()


def test_a_zombie_counts_as_dead_and_a_live_process_as_alive(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        for _ in range(500):  # exited, not yet reaped: a zombie
            with open(f"/proc/{p.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)
        assert not pid_alive(p.pid)
        left = tmp_path / f"jointrl-local-{NS}-{p.pid}-zzz"
        left.mkdir()
        assert sweep_dead("jointrl-local-", str(tmp_path)) == [str(left)]
    finally:
        p.wait()
    assert pid_alive(os.getpid()) and not pid_alive(0)
