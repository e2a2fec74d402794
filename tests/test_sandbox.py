"""envs.sandbox: the bubblewrap sandbox, its attack suite, and ShellSession."""

from __future__ import annotations

import json
import logging
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

import envs.sandbox.base as sbbase
import envs.sandbox.probe as sbmod
import envs.sandbox.shell as sbshell
from envs.sandbox import (
    Limits,
    Sandbox,
    SandboxUnavailable,
    ShellSession,
    ShellSessionError,
    check_sandbox,
)

try:
    check_sandbox()
except SandboxUnavailable as exc:  # pragma: no cover - CI installs bubblewrap
    pytest.skip(f"bubblewrap sandbox unavailable here: {exc}", allow_module_level=True)

REPO = Path(__file__).resolve().parents[1]
IS_ROOT = os.geteuid() == 0


def procs_with(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker``."""
    found = []
    needle = marker.encode()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if needle in f.read():
                    found.append(int(name))
        except OSError:
            pass
    return found


def zombie_children() -> list[int]:
    """Zombie children of this process that a sandbox left (launchers or sandbox PID 1s).

    Other code's orphans are reparented here too once this process is a subreaper; they
    are not the sandbox's to reap, so only sandbox process names count.
    """
    me, out = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        comm = raw[raw.find(b"(") + 1 : raw.rfind(b")")]
        fields = raw[raw.rfind(b")") + 2 :].split()
        if fields[0] == b"Z" and int(fields[1]) == me and comm in (b"bwrap", b"setpriv", b"prlimit"):
            out.append(int(name))
    return out


def wait_gone(marker: str, timeout: float = 2.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := procs_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@pytest.fixture(scope="module")
def sb():
    with Sandbox() as box:
        yield box


# --------------------------------------------------------------------------------------
# Basics
# --------------------------------------------------------------------------------------


def test_run_exit_codes_and_streams(sb):
    r = sb.run(["/bin/sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (r.exit_code, r.stdout, r.stderr) == (3, "out\n", "err\n")
    assert not r.timed_out and not r.output_truncated and r.signal is None
    assert sb.run(["/bin/true"]).exit_code == 0
    r = sb.run(["/bin/sh", "-c", "kill -SEGV $$"])
    assert r.exit_code is None and r.signal == 11


def test_run_python_pass_and_fail(sb):
    ok = sb.run_python("assert sum([1, 2]) == 3\nprint('passed')")
    assert ok.ok and ok.stdout == "passed\n"
    bad = sb.run_python("def f(x):\n    return x + 1\nassert f(1) == 3, 'wrong'")
    assert bad.exit_code == 1 and "AssertionError: wrong" in bad.stderr
    assert sb.python.startswith("/")


def test_stdin(sb):
    r = sb.run_python("import sys; print(sys.stdin.read().upper(), end='')", stdin="hello\nworld")
    assert r.stdout == "HELLO\nWORLD"
    big = sb.run(["/bin/true"], stdin="x" * 2_000_000)  # never read: must not deadlock
    assert big.exit_code == 0 and big.duration_s < 5


def test_env_is_minimal_and_extendable(sb, monkeypatch):
    monkeypatch.setenv("JRL_HOST_SECRET_TOKEN", "s3cret")
    r = sb.run(["/bin/sh", "-c", "env"], env={"FOO": "bar"})
    assert "FOO=bar" in r.stdout and f"HOME={sb.inner_work_dir}" in r.stdout
    assert "JRL_HOST_SECRET_TOKEN" not in r.stdout


def test_files_in_and_out(sb):
    code = (
        "import json\ndata = open('data/in.txt').read()\n"
        "open('out/result.json', 'w').write(json.dumps({'n': len(data)}))"
    )
    r = sb.run_python("import os; os.makedirs('out', exist_ok=True)\n" + code, files={"data/in.txt": "abcde"})
    assert r.ok, r.stderr
    assert json.loads(sb.read_file("out/result.json")) == {"n": 5}
    sb.write_files({"bin.dat": b"\x00\x01", "a/b/c.txt": "deep"})
    assert sb.run(["/bin/cat", "a/b/c.txt"]).stdout == "deep"
    for bad in ("../escape.txt", "/etc/passwd", "a/../../x", ""):
        with pytest.raises(ValueError):
            sb.write_files({bad: "x"})
    with pytest.raises(FileNotFoundError):
        sb.read_file("missing.txt")


def test_host_side_file_access_never_follows_symlinks(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("original")
    with Sandbox() as box:
        r = box.run(["/bin/sh", "-c", f"ln -s /etc/passwd leak.txt; ln -s {victim} sol.py; ln -s /etc dir"])
        assert r.ok, r.stderr
        with pytest.raises(OSError):
            box.read_file("leak.txt")
        box.write_files({"sol.py": "print('hi')"})  # replaces the planted symlink
        assert victim.read_text() == "original"
        assert box.read_file("sol.py") == "print('hi')"
        with pytest.raises(OSError):
            box.write_files({"dir/jrl_pwned": "x"})
        assert not Path("/etc/jrl_pwned").exists()


def test_close_removes_private_dir_keeps_given_dir(tmp_path):
    box = Sandbox()
    box.run(["/bin/sh", "-c", "mkdir -p d && chmod 000 d; echo x > f"])
    work = box.work_dir
    box.close()
    box.close()
    assert not os.path.exists(work)
    parent = tempfile.mkdtemp()
    try:
        os.chmod(parent, 0o711)
        given = Path(parent) / "given"
        with Sandbox(work_dir=str(given)) as box2:
            assert box2.run(["/bin/sh", "-c", "echo hi > f.txt"]).ok
        assert (given / "f.txt").read_text() == "hi\n"
    finally:
        shutil.rmtree(parent)
    if IS_ROOT:  # pytest's tmp_path sits under a 0700 directory: the sandbox's host uid cannot reach it
        with pytest.raises(ValueError, match="not reachable by uid"):
            Sandbox(work_dir=str(tmp_path / "unreachable"))
    with pytest.raises(RuntimeError):
        box.run(["/bin/true"])


# --------------------------------------------------------------------------------------
# Attack suite: every attack must fail
# --------------------------------------------------------------------------------------


def test_attack_network(sb):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        code = f"""
import socket
res = {{}}
def attempt(name, fn):
    try:
        fn()
        res[name] = "CONNECTED"
    except Exception as e:
        res[name] = type(e).__name__
attempt("host_port", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=2))
attempt("dns", lambda: socket.getaddrinfo("pypi.org", 443))
attempt("outbound", lambda: socket.create_connection(("1.1.1.1", 53), timeout=2))
attempt("outbound6", lambda: socket.create_connection(("2606:4700:4700::1111", 53), timeout=2))
print(res)
"""
        r = sb.run_python(code)
        assert r.ok, r.stderr
        assert "CONNECTED" not in r.stdout, r.stdout
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing reached the host port
    finally:
        listener.close()


def test_attack_write_outside_work_dir(sb):
    tag = "jrl_" + secrets.token_hex(6)
    targets = [
        f"/etc/{tag}",
        f"/usr/{tag}",
        f"/var/tmp/{tag}",
        f"/root/{tag}",
        f"/home/{tag}",
        f"{REPO}/{tag}",
        f"/tmp/{tag}",
        f"/dev/shm/{tag}",
        f"/{tag}",
    ]
    code = f"""
import os, json
res = {{}}
for path in {targets!r}:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("pwned")
        res[path] = "written"
    except OSError as e:
        res[path] = type(e).__name__
print(json.dumps(res))
"""
    r = sb.run_python(code)
    assert r.ok, r.stderr
    res = json.loads(r.stdout)
    for path in targets:
        assert not os.path.exists(path), f"sandbox wrote {path} on the host"
        # /tmp and /dev/shm are private tmpfs mounts and the work dir is mounted over /work
        # (hiding a repo checked out there): writes may land there, never on the host.
        if not path.startswith(("/tmp/", "/dev/shm/", sb.inner_work_dir + "/")):
            assert res[path] != "written", (path, res)


def test_attack_read_secrets(sb, tmp_path):
    tag = secrets.token_hex(6)
    planted = []
    if IS_ROOT:
        root_secret = Path(f"/root/jrl_secret_{tag}")  # world-readable, but /root is hidden
        root_secret.write_text("TOPSECRET")
        root_secret.chmod(0o644)
        vartmp = Path(f"/var/tmp/jrl_secret_{tag}")  # visible path, but 0600 root
        vartmp.write_text("TOPSECRET")
        vartmp.chmod(0o600)
        planted = [root_secret, vartmp]
    else:  # pragma: no cover - CI runs as root
        home = Path.home()
        if str(home).startswith("/home/"):
            s = home / f"jrl_secret_{tag}"
            s.write_text("TOPSECRET")
            planted = [s]
    try:
        code = f"""
import os
out = []
for p in {[str(p) for p in planted]!r} + ["/etc/shadow"]:
    try:
        out.append(open(p).read())
    except OSError as e:
        out.append(type(e).__name__)
out.append(repr(os.listdir("/root")) if os.path.isdir("/root") else "no-root")
print(out)
"""
        r = sb.run_python(code)
        assert r.ok, r.stderr
        assert "TOPSECRET" not in r.stdout and "root:" not in r.stdout, r.stdout
        if os.path.isdir("/root"):
            assert "[]" in r.stdout  # /root is an empty tmpfs inside
    finally:
        for p in planted:
            p.unlink()


def test_attack_host_processes_invisible(sb):
    code = f"""
import os
pids = [p for p in os.listdir('/proc') if p.isdigit()]
try:
    os.kill({os.getpid()}, 0)
    seen = 'visible'
except ProcessLookupError:
    seen = 'invisible'
print(len(pids), seen)
"""
    r = sb.run_python(code)
    n, seen = r.stdout.split()
    assert int(n) <= 3 and seen == "invisible"


def test_attack_privileges_and_remount(sb):
    """As root this is the case that matters: the sandbox must hold no capability."""
    script = (
        "grep -E '^(CapEff|CapPrm|NoNewPrivs)' /proc/self/status; "
        "mount -o remount,rw / 2>/dev/null && echo REMOUNT_OK; "
        "mount -o remount,rw,bind /usr 2>/dev/null && echo REMOUNT_OK; "
        "mount --bind /work /usr 2>/dev/null && echo BIND_OK; "
        "unshare -r true 2>/dev/null && echo USERNS_OK; "
        "echo pwned > /usr/jrl_remount_test 2>/dev/null && echo WRITE_OK; "
        "echo done"
    )
    r = sb.run(["/bin/sh", "-c", script])
    assert r.stdout.rstrip().endswith("done"), r
    for bad in ("REMOUNT_OK", "BIND_OK", "USERNS_OK", "WRITE_OK"):
        assert bad not in r.stdout
    assert "CapEff:\t0000000000000000" in r.stdout and "NoNewPrivs:\t1" in r.stdout
    assert not os.path.exists("/usr/jrl_remount_test")


def test_attack_uid_not_root_on_host(sb):
    r = sb.run_python("import os; open('owned.txt', 'w').write('x'); print(os.getuid(), os.getgid())")
    assert r.stdout.split() == ["65534", "65534"]
    # On the host: the sandbox's leased uid as root (envs.sandbox.uids), the caller's own otherwise.
    assert os.stat(os.path.join(sb.work_dir, "owned.txt")).st_uid == sb.host_uid
    if IS_ROOT:
        assert sb.config.uid_base <= sb.host_uid < sb.config.uid_base + sb.config.uid_count
    else:
        assert sb.host_uid == os.getuid()


def test_attack_fork_bomb(sb):
    marker = "jrlforkbomb" + secrets.token_hex(4)
    code = "import os, sys\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    t0 = time.monotonic()
    r = sb.run_python(code, limits=Limits(processes=32, wall_seconds=3), args=[marker])
    assert r.timed_out and r.exit_code is None
    assert time.monotonic() - t0 < 3 + 2
    assert wait_gone(marker) == []
    assert subprocess.run(["true"]).returncode == 0  # host still forks
    assert sb.run(["/bin/true"]).exit_code == 0  # and so does the next sandbox


def test_attack_memory_bomb():
    with Sandbox(limits=Limits(memory_mb=256), config={"storage_mb": 256}) as box:
        r = box.run_python("x = bytearray(4 * 1024**3)\nprint('allocated')")
        assert r.exit_code != 0 and "allocated" not in r.stdout and "MemoryError" in r.stderr
        r = box.run_python("chunks = []\nwhile True:\n    chunks.append(b'x' * (64 << 20))")
        assert r.exit_code != 0 and "MemoryError" in r.stderr
        # tmpfs mounts are memory too: capped by the sandbox's storage (files below the 64 MB file-size cap)
        for mount in ("/dev/shm", "/tmp"):
            fill = f"for i in 1 2 3 4 5 6 7 8; do head -c 60000000 /dev/zero > {mount}/f$i || exit 9; done"
            r = box.run(["/bin/sh", "-c", fill])
            assert r.exit_code == 9 and "No space left" in r.stderr, r
            if box.storage is not None and box.storage.capped:
                assert "storage" in r.events, r


def test_attack_infinite_loop_timeout(sb):
    marker = "jrlloop" + secrets.token_hex(4)
    t0 = time.monotonic()
    r = sb.run_python("while True:\n    pass", limits=Limits(wall_seconds=1.5), args=[marker])
    elapsed = time.monotonic() - t0
    assert r.timed_out and r.exit_code is None and r.signal == 9
    assert elapsed < 1.5 + 2
    assert wait_gone(marker) == []


def test_attack_cpu_limit(sb):
    r = sb.run_python("while True:\n    pass", limits=Limits(cpu_seconds=1, wall_seconds=8))
    assert not r.timed_out and r.exit_code is None and r.signal in (24, 9)  # SIGXCPU, then SIGKILL
    assert r.duration_s < 5


def test_attack_daemon_dies_with_run(sb):
    marker = "jrldaemon" + secrets.token_hex(4)
    script = (
        f"setsid nohup sh -c 'sleep 1000; :' {marker}a >/dev/null 2>&1 </dev/null & "
        f"(sh -c 'sleep 1000; :' {marker}b &); "  # this one keeps stdout open
        "echo started"
    )
    t0 = time.monotonic()
    r = sb.run(["/bin/sh", "-c", script])
    assert r.stdout == "started\n" and time.monotonic() - t0 < 3
    assert wait_gone(marker) == []


def test_attack_output_flood(sb):
    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    code = (
        "import sys\nchunk = b'x' * (1 << 20)\n"
        "for _ in range(25):\n    sys.stdout.buffer.write(chunk)\n    sys.stderr.buffer.write(chunk)\n"
    )
    t0 = time.monotonic()
    r = sb.run_python(code)
    assert time.monotonic() - t0 < 10
    assert r.exit_code == 0 and r.output_truncated
    cap = sb.limits.output_bytes
    assert cap <= len(r.stdout) < cap + 200 and cap <= len(r.stderr) < cap + 200
    assert "output truncated" in r.stdout and str(25 << 20) in r.stdout
    assert proc.memory_info().rss - rss0 < 40 << 20


def test_many_sequential_runs_reap_zombies():
    with Sandbox(limits=Limits(processes=8)) as box:
        for _ in range(200):
            r = box.run(["/bin/true"])
            assert r.exit_code == 0, r.stderr
    assert zombie_children() == []


def test_concurrent_runs_from_threads():
    results = []

    wrong = []

    def work():
        with Sandbox() as box:
            for i in range(5):
                r = box.run(["/bin/sh", "-c", f"exit {i}"])
                results.append(r.exit_code)
                if r.exit_code != i:
                    wrong.append((i, r.exit_code, r.signal, r.stderr[:300]))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == sorted(list(range(5)) * 4), wrong
    assert zombie_children() == []


# --------------------------------------------------------------------------------------
# ShellSession
# --------------------------------------------------------------------------------------


@pytest.fixture()
def shell():
    with ShellSession() as s:
        yield s


def test_shell_state_persists(shell):
    assert shell.run("cd /tmp && export FOO=bar && greet() { echo hi $1; }").exit_code == 0
    assert shell.run("pwd; echo $FOO; greet you").output == "/tmp\nbar\nhi you\n"


def test_shell_exit_codes_and_output_shapes(shell):
    assert shell.run("false").exit_code == 1
    assert shell.run("(exit 7)").exit_code == 7
    assert shell.run("printf abc").output == "abc"  # no trailing newline
    assert shell.run("true").output == ""
    assert shell.run("for i in 1 2 3\ndo\n  echo $i\ndone").output == "1\n2\n3\n"
    assert shell.run("cat <<'EOF'\nq'uote \"dq\" \\ $HOME !bang\nEOF").output == 'q\'uote "dq" \\ $HOME !bang\n'
    assert shell.run("echo 'héllo ✓'").output == "héllo ✓\n"
    assert shell.run("echo " + "a" * 10000 + " | wc -c").output.strip() == "10001"
    assert shell.run("echo 'unterminated").exit_code != 0  # a syntax error, not a hang
    shell.write_files({"f.txt": "from host"})
    assert shell.run("cat f.txt; echo made > g.txt").output == "from host"
    assert shell.read_file("g.txt") == "made\n"


def test_shell_timeout_and_recovery(shell):
    t0 = time.monotonic()
    r = shell.run("sleep 100", timeout=1)
    assert r.timed_out and r.exit_code is None and time.monotonic() - t0 < 3
    assert shell.run("echo alive").output == "alive\n"
    r = shell.run("while :; do :; done", timeout=1)  # a builtin loop in bash itself
    assert r.timed_out
    # a job that ignores Ctrl-C is SIGKILLed as the terminal's foreground job
    r = shell.run(
        "python3 -c 'import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(100)'", timeout=1
    )
    assert r.timed_out
    assert shell.run("echo still alive; pwd").output == f"still alive\n{shell.sandbox.inner_work_dir}\n"


def test_shell_output_cap():
    with ShellSession(limits=Limits(output_bytes=1000)) as s:
        r = s.run("head -c 3000000 /dev/zero | tr '\\0' x")
        assert r.output_truncated and r.exit_code == 0
        assert len(r.output) < 1200 and "output truncated" in r.output
        assert s.run("echo ok").output == "ok\n"


def test_shell_close_kills_daemons():
    marker = "jrlshd" + secrets.token_hex(4)
    s = ShellSession()
    s.run(f"setsid nohup sh -c 'sleep 1000; :' {marker}a >/dev/null 2>&1 </dev/null &")
    s.run(f"sh -c 'sleep 1000; :' {marker}b &")
    # Each daemon is waited for by its own marker: a count of processes carrying the common one
    # would also see the two halves of setsid's fork (setsid forks when it leads a process group, as
    # a background job of an interactive bash does) while the second daemon had not exec'd yet.
    # Deadlines, not expectations: a loaded machine (the test suite on 3 workers of 2 cores) once
    # took longer than 2 s here; the checks are the same.
    deadline = time.monotonic() + 10
    while not all(procs_with(marker + x) for x in "ab") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert procs_with(marker + "a") and procs_with(marker + "b")
    s.close()
    s.close()
    assert wait_gone(marker, timeout=10.0) == []
    assert zombie_children() == []
    with pytest.raises(ShellSessionError):
        s.run("echo hi")


def test_shell_exit_marks_session_dead(shell):
    r = shell.run("exit 3")
    assert r.exit_code == 3
    with pytest.raises(ShellSessionError, match="dead"):
        shell.run("echo hi")


def test_shell_created_in_short_lived_thread_survives():
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("s", ShellSession()))
    t.start()
    t.join()
    time.sleep(0.2)
    with box["s"] as s:
        assert s.run("echo ok").output == "ok\n"


def _racing_launch(monkeypatch, failures: int, message: str) -> list[int]:
    """Make the first ``failures`` launches of a sandbox print ``message`` and exit 1, as bwrap
    does when a concurrent tmpfs mount or unmount races its recursive root bind."""
    real, calls = Sandbox._launch, []

    def launch(self, argv, *args, **kwargs):
        cmd, env, cwd, preexec = real(self, argv, *args, **kwargs)
        calls.append(1)
        if len(calls) <= failures:
            cmd = ["/bin/sh", "-c", f"printf '%s\\n' {shlex.quote(message)} >&2; exit 1"]
        return cmd, env, cwd, preexec

    monkeypatch.setattr(Sandbox, "_launch", launch)
    return calls


RACE = "bwrap: Can't bind mount /oldroot/tmp/jointrl-sb-x on /newroot/tmp/jointrl-sb-x: No such file or directory"


def test_shell_start_retries_a_bwrap_mount_race(monkeypatch):
    calls = _racing_launch(monkeypatch, 2, RACE)
    with ShellSession() as s:
        assert s.run("echo up; pwd").output == f"up\n{s.sandbox.inner_work_dir}\n"
    # Two faked races, then the real launch; a real race with a sandbox another test process mounts at the same
    # moment adds an attempt, within the retry budget.
    assert 3 <= len(calls) <= sbbase.SETUP_RACE_RETRIES and zombie_children() == []


def test_shell_start_gives_up_after_three_races_and_never_retries_other_failures(monkeypatch):
    calls = _racing_launch(monkeypatch, 99, RACE)
    with pytest.raises(ShellSessionError, match="Can't bind mount"):
        ShellSession()
    assert len(calls) == sbbase.SETUP_RACE_RETRIES == 5
    monkeypatch.undo()
    calls = _racing_launch(monkeypatch, 99, "bwrap: execvp /bin/bash: No such file or directory")
    with pytest.raises(ShellSessionError, match="execvp"):
        ShellSession()
    assert len(calls) == 1 and zombie_children() == []


def _racing_probe(monkeypatch, failures: int, message: str) -> list[int]:
    """The probe's first ``failures`` bwrap launches print ``message`` and exit 1 (a lost mount race)."""
    real, calls = sbmod._bwrap_command, []

    def command(*args, **kwargs):
        calls.append(1)
        if len(calls) <= failures:
            return ["/bin/sh", "-c", f"printf '%s\\n' {shlex.quote(message)} >&2; exit 1"]
        return real(*args, **kwargs)

    monkeypatch.setattr(sbmod, "_bwrap_command", command)
    return calls


def test_the_sandbox_probe_retries_a_lost_mount_race_and_gives_up_on_anything_else(monkeypatch):
    """The probe's answer is cached for the process: a probe that lost a mount race to a sandbox mounted beside it
    (a run stopped with SandboxUnavailable in the suite) is retried like every launch, not taken as "no"."""
    tools = sbmod._tools()
    calls = _racing_probe(monkeypatch, 2, RACE)
    sbmod._try_one_sandbox(tools)
    assert 3 <= len(calls) <= sbbase.SETUP_RACE_RETRIES
    monkeypatch.undo()
    calls = _racing_probe(monkeypatch, 99, RACE)
    with pytest.raises(SandboxUnavailable, match="Can't bind mount"):
        sbmod._try_one_sandbox(tools)
    assert len(calls) == sbbase.SETUP_RACE_RETRIES
    monkeypatch.undo()
    calls = _racing_probe(monkeypatch, 99, "bwrap: No permissions to creating new namespace")
    with pytest.raises(SandboxUnavailable, match="No permissions"):
        sbmod._try_one_sandbox(tools)
    assert len(calls) == 1 and zombie_children() == []


def test_a_pre_started_sandbox_that_loses_a_mount_race_runs_the_command_cold(monkeypatch):
    """A warm (pre-started) sandbox whose bwrap is still setting up when the command is handed over, and then
    loses a mount race, never ran the program: the run starts cold instead of reporting bwrap's exit status 1."""
    from envs.sandbox.warm import STUB

    real, stubs = Sandbox._launch, []

    def launch(self, argv, *args, **kwargs):
        cmd, env, cwd, preexec = real(self, argv, *args, **kwargs)
        if STUB in argv:
            stubs.append(1)
            if len(stubs) == 2:  # the sandbox pre-started for the second run: alive at hand-over, then fails
                cmd = ["/bin/sh", "-c", f"sleep 0.5; printf '%s\\n' {shlex.quote(RACE)} >&2; exit 1"]
        return cmd, env, cwd, preexec

    monkeypatch.setattr(Sandbox, "_launch", launch)
    with Sandbox(warm=True) as box:
        assert box._warm is not None
        codes = [box.run(["/bin/sh", "-c", f"echo run{i}; exit {i}"]) for i in range(4)]
    assert [r.exit_code for r in codes] == [0, 1, 2, 3], [r.stderr for r in codes]
    assert [r.stdout for r in codes] == [f"run{i}\n" for i in range(4)]
    assert len(stubs) >= 3 and zombie_children() == []


def test_a_pre_started_sandbox_closed_unused_has_its_pid_1_reaped_without_an_orphan_sweep(monkeypatch):
    """Closing a warm sandbox kills the sandbox it pre-started for the next run. That one's PID 1 dies after its
    bwrap (``--die-with-parent``), so an orphan sweep run at once can miss it and leave it a zombie; it is reaped
    through bwrap's info report instead, whether or not a sweep runs."""
    import envs.sandbox.reap as reap

    monkeypatch.setattr(reap, "_sweep_orphans", lambda: None)
    with Sandbox(warm=True) as box:
        assert box.run(["/bin/true"]).exit_code == 0
        assert box._warm is not None and box._warm._next is not None  # the next run's sandbox, waiting
    deadline = time.monotonic() + 1.0
    while not zombie_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert zombie_children() == []


# --------------------------------------------------------------------------------------
# mode="none" and diagnostics
# --------------------------------------------------------------------------------------


def test_mode_none_warns_and_still_limits(caplog):
    with caplog.at_level(logging.WARNING, logger="envs.sandbox"):
        box = Sandbox(mode="none")
    try:
        assert any("NO ISOLATION" in rec.getMessage() for rec in caplog.records)
        r = box.run_python("import resource; print(resource.getrlimit(resource.RLIMIT_AS)[0])")
        assert r.stdout.strip() == str(box.limits.memory_mb << 20)
        r = box.run_python("while True: pass", limits=Limits(wall_seconds=1))
        assert r.timed_out and r.duration_s < 3
    finally:
        box.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="envs.sandbox"):
        with ShellSession(mode="none") as s:
            assert s.run("echo $((6*7))").output == "42\n"
    assert any("NO ISOLATION" in rec.getMessage() for rec in caplog.records)
    with pytest.raises(ValueError):
        Sandbox(mode="docker")


def test_check_sandbox_says_what_is_missing(monkeypatch):
    monkeypatch.setattr(sbmod, "_check_result", None)
    real_which = sbmod.shutil.which
    monkeypatch.setattr(sbmod.shutil, "which", lambda name, *a, **k: None if name == "bwrap" else real_which(name))
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        check_sandbox()
    with pytest.raises(SandboxUnavailable):  # cached
        Sandbox()


def test_userns_hint_names_the_sysctl(tmp_path):
    (tmp_path / "kernel").mkdir()
    (tmp_path / "user").mkdir()
    (tmp_path / "kernel" / "unprivileged_userns_clone").write_text("0\n")
    (tmp_path / "user" / "max_user_namespaces").write_text("0\n")
    hint = sbmod._userns_hint("No permissions to creating new namespace", proc_sys=str(tmp_path))
    assert "kernel.unprivileged_userns_clone" in hint and "user.max_user_namespaces" in hint
    (tmp_path / "kernel" / "unprivileged_userns_clone").write_text("1\n")
    (tmp_path / "user" / "max_user_namespaces").write_text("100\n")
    (tmp_path / "kernel" / "apparmor_restrict_unprivileged_userns").write_text("1\n")
    assert "apparmor_restrict_unprivileged_userns" in sbmod._userns_hint("", proc_sys=str(tmp_path))


def test_rlimit_fallback_without_prlimit(monkeypatch):
    tools = sbmod._tools()
    monkeypatch.setattr(sbmod, "_check_result", sbbase._Tools(**{**tools.__dict__, "prlimit": None}))
    with Sandbox(limits=Limits(memory_mb=256, open_files=64)) as box:
        r = box.run_python("import resource\nprint(resource.getrlimit(resource.RLIMIT_NOFILE))\nbytearray(1 << 30)")
        assert "(64, 64)" in r.stdout and "MemoryError" in r.stderr


def test_shell_encoding_keeps_lines_short():
    line = sbshell._shell_encode("echo " + "é\n" * 3000)
    assert max(len(part) for part in line.split(b"\n")) < 1100


def test_orphans_are_swept_every_few_bwrap_runs_and_at_once_without_a_pid1(monkeypatch):
    """Each finished bwrap run is counted: a sweep for orphaned sandbox PID 1s every ``_SWEEP_EVERY``
    runs, and one at once after a run whose PID 1 was never opened (only a sweep can reap that one)."""
    import envs.sandbox.reap as reap

    sweeps = []
    monkeypatch.setattr(reap, "_sweep_orphans", lambda: sweeps.append(1))
    monkeypatch.setattr(reap, "_runs_since_sweep", 0)
    for _ in range(reap._SWEEP_EVERY - 1):
        reap._note_bwrap_run(sweep_now=False)
    assert sweeps == []
    reap._note_bwrap_run(sweep_now=False)
    assert sweeps == [1] and reap._runs_since_sweep == 0
    reap._note_bwrap_run(sweep_now=False)
    reap._note_bwrap_run(sweep_now=True)
    assert sweeps == [1, 1] and reap._runs_since_sweep == 0
