"""Attacks between sandboxes and on the kernel surface: nothing crosses, storage is capped.

* Two sandboxes running at the same time cannot exchange data, whatever ``TMPDIR`` is
  (work dirs, /tmp, /dev/shm, /proc, kernel keyrings, abstract sockets).
* The seccomp filter kills keyring, ptrace, perf, bpf, userfaultfd and mount/namespace
  calls (SIGSYS, counted as a ``seccomp`` event) and makes io_uring look absent (ENOSYS).
* Every writable place of a sandbox is one size- and inode-capped tmpfs: a flood gets
  ENOSPC at the cap, is recorded as a ``storage`` event, and never reaches the host disk.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import threading

import pytest

from envs.sandbox import Limits, Sandbox, SandboxUnavailable, ShellSession, check_sandbox

try:
    check_sandbox()
except SandboxUnavailable as exc:  # pragma: no cover - CI installs bubblewrap
    pytest.skip(f"bubblewrap sandbox unavailable here: {exc}", allow_module_level=True)

IS_ROOT = os.geteuid() == 0

SYSCALL = (
    "import ctypes, os, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "r = libc.syscall(int(sys.argv[1]), 0, 0, 0, 0, 0)\nprint(r, ctypes.get_errno())\n"
)
# x86-64 numbers
NR = {
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "ptrace": 101,
    "perf_event_open": 298,
    "bpf": 321,
    "userfaultfd": 323,
    "unshare": 272,
    "mount": 165,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
}

SNOOP = r"""
import os, sys
secret = sys.stdin.readline().strip()  # not in argv: its own /proc/self/cmdline would match
hits = []
def look(path):
    try:
        with open(path, 'rb') as f:
            if secret.encode() in f.read(1 << 20):
                hits.append(path)
    except OSError:
        pass
snoop = os.environ.get('SNOOP_DIR', '/nonexistent')
roots = ['/tmp', '/dev/shm', '/work', '/var/tmp', snoop, os.path.dirname(snoop)]
for top in roots:
    for root, dirs, files in os.walk(top):
        for f in files:
            look(os.path.join(root, f))
for pid in os.listdir('/proc'):
    if pid.isdigit():
        for part in ('cmdline', 'environ'):
            look('/proc/%s/%s' % (pid, part))
print('HITS', hits)
"""


@pytest.fixture()
def custom_tmpdir(monkeypatch):
    """A TMPDIR that is not /tmp (as on shared clusters): every sandbox's storage goes under it."""
    d = tempfile.mkdtemp(prefix="jrl-tmpdir-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
    os.chmod(d, 0o755)
    monkeypatch.setenv("TMPDIR", d)
    monkeypatch.setattr(tempfile, "tempdir", None)
    yield d
    tempfile.tempdir = None
    shutil.rmtree(d, ignore_errors=True)


def _hold_secret(box: Sandbox, secret: str, ready: threading.Event, stop: threading.Event) -> None:
    """Sandbox A: put the secret in its work dir, /tmp and /dev/shm, keep running until told."""
    box.write_files({"answer.txt": secret})

    def runner():
        box.run(
            [
                "/bin/sh",
                "-c",
                f"echo {secret} > /tmp/s; echo {secret} > /dev/shm/s; "
                "echo ready > ready.flag; while [ ! -e stop.flag ]; do sleep 0.05; done",
            ],
            limits=Limits(wall_seconds=25),
        )

    t = threading.Thread(target=runner, daemon=True)
    t.start()
    for _ in range(400):
        if os.path.exists(os.path.join(box.work_dir, "ready.flag")):
            break
        stop.wait(0.05)
    ready.set()
    return t


def test_concurrent_sandboxes_cannot_read_each_other_with_a_custom_tmpdir(custom_tmpdir):
    secret = "jrlsecret" + secrets.token_hex(8)
    with Sandbox() as a, Sandbox() as b:
        assert a.work_dir.startswith(custom_tmpdir) and b.work_dir.startswith(custom_tmpdir)
        ready, stop = threading.Event(), threading.Event()
        t = _hold_secret(a, secret, ready, stop)
        assert ready.wait(30)
        r = b.run_python(SNOOP, stdin=secret + "\n", env={"SNOOP_DIR": custom_tmpdir}, limits=Limits(wall_seconds=20))
        assert r.exit_code == 0, r
        assert "HITS []" in r.stdout, r.stdout
        # Nor can a shell session: it sees its own work dir only.
        with ShellSession() as s:
            out = s.run(
                f"grep -rl {secret} /tmp /dev/shm /work /var/tmp {custom_tmpdir} 2>/dev/null | head -3; "
                f"ls {custom_tmpdir} 2>&1 | head -3",
                timeout=20,
            ).output
        assert secret not in out.replace(f"grep -rl {secret}", "")
        assert "jointrl-sb-" not in out
        a_pid_ns_listing = b.run(["/bin/sh", "-c", "ls /proc | grep -c '^[0-9]'"]).stdout.strip()
        assert int(a_pid_ns_listing) <= 4  # its own PID namespace: bwrap's init, sh, ls, grep
        stop.set()
        a.write_files({"stop.flag": ""})
        t.join(timeout=30)


def test_keyrings_cannot_carry_data_between_sandboxes():
    with Sandbox() as a, Sandbox() as b:
        for name in ("add_key", "keyctl", "request_key"):
            r = a.run_python(SYSCALL, args=[str(NR[name])])
            assert r.signal == 31 and "seccomp" in r.events, (name, r)
        r = b.run_python(SYSCALL, args=[str(NR["keyctl"])])
        assert r.signal == 31


@pytest.mark.parametrize("name", ["ptrace", "perf_event_open", "bpf", "userfaultfd", "unshare", "mount"])
def test_seccomp_kills_kernel_surface_calls(name):
    with Sandbox() as box:
        r = box.run_python(SYSCALL, args=[str(NR[name])])
        assert r.signal == 31 and r.exit_code is None and "seccomp" in r.events, r


def test_io_uring_looks_absent():
    with Sandbox() as box:
        for name in ("io_uring_setup", "io_uring_enter"):
            r = box.run_python(SYSCALL, args=[str(NR[name])])
            assert r.exit_code == 0 and r.stdout.split() == ["-1", "38"], r  # ENOSYS


def test_seccomp_applies_in_shell_sessions_too():
    with ShellSession() as s:
        code = SYSCALL.replace("\n", "; ").replace("sys.argv[1]", "'250'")
        res = s.run(f'python3 -c "{code}"; echo status=$?')
        assert "status=159" in res.output  # 128 + SIGSYS


@pytest.mark.skipif(not IS_ROOT, reason="capped tmpfs storage needs root (mount)")
def test_storage_is_capped_in_bytes_and_inodes_and_never_reaches_the_host_disk():
    with Sandbox(config={"storage_mb": 32, "storage_inodes": 2000}) as box:
        assert box.storage is not None and box.storage.capped
        with open("/proc/self/mounts") as f:
            assert any(line.split()[1] == box.storage.root and line.split()[2] == "tmpfs" for line in f)
        # Bytes: 1 GiB requested across the work dir, /tmp and /dev/shm; the cap is 32 MiB in total.
        r = box.run(
            [
                "/bin/sh",
                "-c",
                "for d in . /tmp /dev/shm; do for i in 1 2 3 4 5 6; do "
                "head -c 60000000 /dev/zero > $d/f$i || true; done; done; "
                "du -sk . /tmp /dev/shm",
            ]
        )
        used = sum(int(line.split()[0]) for line in r.stdout.split("\n") if line.strip())
        assert used <= 32 * 1024 + 64, r.stdout
        assert "No space left" in r.stderr and "storage" in r.events
        # Inodes: 100k files asked for; the cap stops them at about 2000.
        r = box.run(
            [
                "/bin/bash",
                "-c",
                "rm -f f*; i=0; while [ $i -lt 100000 ]; do : > n$i || break; i=$((i+1)); done; echo made=$i",
            ],
            limits=Limits(wall_seconds=30),
        )
        made = int(r.stdout.split("made=")[1].split()[0])
        assert made < 2000 and "storage" in r.events, r.stdout
    assert not os.path.exists(box.storage.root)  # unmounted and removed on close


def test_no_state_crosses_runs_of_one_sandbox():
    """Each run starts with empty /tmp and /dev/shm, a fresh PID namespace and no processes left."""
    with Sandbox() as box:
        r = box.run(["/bin/sh", "-c", "echo x > /tmp/t; echo y > /dev/shm/s; (sleep 30 &) ; echo $$"])
        assert r.exit_code == 0
        r = box.run(["/bin/sh", "-c", "ls -A /tmp /dev/shm; ps -e -o comm= | grep -c sleep || true"])
        assert r.stdout.split() == ["/dev/shm:", "/tmp:", "0"], r.stdout


@pytest.mark.parametrize("warm", [False, True])
def test_no_state_crosses_runs_with_a_prestarted_sandbox(warm):
    """``Sandbox(warm=True)`` pre-starts the next run's sandbox; each run still starts clean:
    its own PID namespace, empty /tmp and /dev/shm, only its own environment, nothing running."""
    with Sandbox(warm=warm) as box:
        for i in range(3):
            r = box.run(
                [
                    "/bin/sh",
                    "-c",
                    "echo $$; ls -A /tmp /dev/shm | tr '\\n' ' '; echo; "
                    'echo "${LEAK:-none}"; ps -e -o comm= | grep -c sleep; '
                    "echo x > /tmp/t; echo y > /dev/shm/s; (sleep 30 &); true",
                ],
                env={"LEAK": f"run{i}"} if i == 0 else None,
            )
            assert r.exit_code == 0, r
            pid, listing, leak, sleeping = r.stdout.strip().split("\n")
            # A fresh PID namespace per run: the shell is pid 2 (bwrap's init is 1), however many
            # processes earlier runs started. (Namespace inode numbers are recycled, so not those.)
            assert int(pid) <= 3, r.stdout
            assert listing.split() == ["/dev/shm:", "/tmp:"] and sleeping == "0", r.stdout
            assert leak == ("run0" if i == 0 else "none")
        # The filter, the timeout and the limits hold in a pre-started sandbox too.
        r = box.run_python(SYSCALL, args=[str(NR["keyctl"])])
        assert r.signal == 31 and "seccomp" in r.events
        r = box.run(["/bin/sh", "-c", "sleep 10"], limits=Limits(wall_seconds=0.5))
        assert r.timed_out
        assert box.run(["/bin/true"]).exit_code == 0
    with Sandbox(warm=warm, limits=Limits(wall_seconds=0.5)) as box:  # the default limits: the warm path
        r = box.run(["/bin/sh", "-c", "sleep 10"])
        assert r.timed_out and "timeout" in r.events
        assert box.run(["/bin/true"]).exit_code == 0


# ------------------------------------------------------------------ the same rules in Harbor episodes


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("mmdebstrap") is None, reason="mmdebstrap is not installed")
def test_harbor_episodes_keep_the_kernel_surface_rules_and_cannot_snoop_each_other():
    """Two concurrent episodes of one Harbor image (the harbor env's sandbox: overlay view, bwrap, seccomp):
    the seccomp rules above hold (SIGSYS: bash reports 159; io_uring absent) and the second episode finds
    nothing of the first's secret in /tmp, /dev/shm, its work dir or any process's cmdline or environ."""
    from envs.harbor.episode import HarborEpisode
    from harbor_fixtures import DATA, build_image, load_task

    task = load_task(DATA / "hello-file")
    image = build_image(task)
    secret = secrets.token_hex(16)
    with HarborEpisode(task, image).start() as a, HarborEpisode(task, image).start() as b:
        planted = a.run(
            f"echo {secret} > /tmp/s1; echo {secret} > /app/s2; echo {secret} > /dev/shm/s3; "
            f"SECRET={secret} nohup sleep 60 >/dev/null 2>&1 & echo planted",
            20,
        )
        assert "planted" in planted.output, planted.output
        b.run(f"cat > /tmp/snoop.py <<'PYEOF'\n{SNOOP}\nPYEOF", 20)
        seen = b.run(f"printf '%s\\n' {secret} | SNOOP_DIR=/app/x python3 /tmp/snoop.py", 30).output
        assert "HITS []" in seen, seen
        for name in ("ptrace", "perf_event_open", "bpf", "userfaultfd", "unshare", "mount", "keyctl"):
            code = SYSCALL.replace("\n", "; ").replace("sys.argv[1]", f"'{NR[name]}'")
            assert "status=159" in b.run(f'python3 -c "{code}"; echo status=$?', 20).output, name
        code = SYSCALL.replace("\n", "; ").replace("sys.argv[1]", f"'{NR['io_uring_setup']}'")
        assert b.run(f'python3 -c "{code}"', 20).output.split() == ["-1", "38"]  # ENOSYS
