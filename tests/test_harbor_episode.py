"""Harbor episodes: the copy-on-write view, the limits from task.toml, and the verifier out of the agent's reach.

The fast tests cover the pieces that need no image (reward files, the verifier's root composition over
a fake tree, the storage measure, the image's users). The slow ones run real episodes over a Debian
root built once per machine with mmdebstrap (``tests/harbor_fixtures.py``); every attack there is an
agent that must NOT earn the reward, next to a control showing the attack did change the agent's view.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from envs.harbor.episode import EpisodeCeilings, HarborEpisode, image_user
from envs.harbor.storage import usage
from envs.harbor.verifier import compose_mounts, read_reward
from harbor_fixtures import DATA, build_image, load_task
from harbor_fixtures import image as stub_image

needs_mmdebstrap = pytest.mark.skipif(shutil.which("mmdebstrap") is None, reason="mmdebstrap is not installed")


# -- reward files ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "files, reward, why",
    [
        ({"reward.txt": "1\n"}, 1.0, "ok"),
        ({"reward.txt": " 0.25 "}, 0.25, "ok"),
        ({"reward.json": json.dumps({"reward": 0.5, "style": 0.1})}, 0.5, "ok"),
        ({"reward.json": json.dumps({"accuracy": 0.75})}, 0.75, "ok"),
        ({"reward.txt": "0", "reward.json": json.dumps({"reward": 1})}, 0.0, "ok"),  # reward.txt first
        ({"reward.txt": "PASSED"}, 0.0, "not a number"),
        ({"reward.txt": "nan"}, 0.0, "not a finite number"),
        ({"reward.txt": "7"}, 0.0, "not a finite number in [0, 1]"),
        ({"reward.json": "{not json"}, 0.0, "invalid JSON"),
        ({"reward.json": json.dumps({"a": 1, "b": 1})}, 0.0, "several rewards"),
        ({"reward.json": json.dumps({"reward": True})}, 0.0, "not a number"),
        ({}, 0.0, "wrote no reward"),
    ],
)
def test_reward_files_of_both_kinds_and_garbage(tmp_path: Path, files, reward, why) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    got, reason = read_reward(str(tmp_path))
    assert got == reward and why in reason


def test_a_reward_file_that_is_a_symlink_or_a_fifo_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "host-file"
    secret.write_text("1")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "reward.txt").symlink_to(secret)
    assert read_reward(str(logs)) == (
        0.0,
        "reward.txt: cannot be read (Too many levels of symbolic links; a symlink is refused)",
    )
    (logs / "reward.txt").unlink()
    os.mkfifo(logs / "reward.txt")
    assert read_reward(str(logs))[1] == "reward.txt: is not a regular file"


# -- the verifier's root ---------------------------------------------------------------------------


def _tree(root: Path, spec: dict) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for name, v in spec.items():
        p = root / name
        if isinstance(v, dict):
            p.mkdir(parents=True, exist_ok=True)
            _tree(p, v)
        elif isinstance(v, tuple):  # ("link", target)
            p.symlink_to(v[1])
        else:
            p.write_text(v)


def _pairs(args: list[str]) -> dict[str, tuple[str, str]]:
    out, i = {}, 0
    while i < len(args):
        if args[i] == "--dir":
            out[args[i + 1]] = ("--dir", "")
            i += 2
        else:
            out[args[i + 2]] = (args[i], args[i + 1])
            i += 3
    return out


def test_the_verifier_root_takes_programs_from_the_image_and_state_from_the_agent(tmp_path: Path) -> None:
    image, view = tmp_path / "image", tmp_path / "view"
    base = {
        "usr": {"bin": {"python3": "image"}},
        "bin": ("link", "usr/bin"),
        "etc": {"ld.so.preload": "", "passwd": "root", "alternatives": {}, "python3.11": {}},
        "app": {},
        "vmlinuz": ("link", "boot/vmlinuz"),
    }
    _tree(image, base)
    _tree(view, base)
    # The agent's changes: a new python3, an /etc preload and user entry, a /bin pointing elsewhere,
    # files at the root beside /tests, its own /tests and /logs, and a workdir result.
    (view / "usr" / "bin" / "python3").write_text("agent")
    (view / "bin").unlink()
    (view / "bin").symlink_to("/tmp/evil")
    (view / "etc" / "ld.so.preload").write_text("/tmp/evil.so")
    (view / "etc" / "myconf").write_text("agent")
    _tree(view, {"conftest.py": "x", "pytest.ini": "x", "tests": {"test.sh": "fake"}, "logs": {"verifier": {}}})
    (view / "app" / "out.txt").write_text("result")
    args, refusal = compose_mounts(view=str(view), merged="/M", image=str(image), image_inner="/I")
    m = _pairs(args)
    assert refusal is None
    assert m["/usr"] == ("--ro-bind", "/I/usr") and m["/bin"] == ("--symlink", "usr/bin")  # the image's
    assert m["/etc/ld.so.preload"] == ("--ro-bind", "/I/etc/ld.so.preload")
    assert (
        m["/etc/alternatives"] == ("--ro-bind", "/I/etc/alternatives")
        and m["/etc/python3.11"][1] == "/I/etc/python3.11"
    )
    assert m["/etc/myconf"] == ("--bind", "/M/etc/myconf") and m["/etc/passwd"] == ("--bind", "/M/etc/passwd")
    assert m["/app"] == ("--bind", "/M/app") and m["/vmlinuz"] == ("--symlink", "boot/vmlinuz")
    for gone in ("/conftest.py", "/pytest.ini", "/tests", "/logs"):
        assert gone not in m


def test_an_etc_replaced_by_a_link_keeps_only_the_images_part(tmp_path: Path) -> None:
    image, view = tmp_path / "image", tmp_path / "view"
    _tree(image, {"etc": {"ld.so.cache": "c", "hosts": "h"}})
    _tree(view, {"etc": ("link", "/tmp/etc"), "tmp": {"etc": {"ld.so.cache": "agent", "hosts": "agent"}}})
    m = _pairs(compose_mounts(view=str(view), merged="/M", image=str(image), image_inner="/I")[0])
    assert m["/etc/ld.so.cache"] == ("--ro-bind", "/I/etc/ld.so.cache") and "/etc/hosts" not in m


def test_task_verifier_paths_come_from_the_image_or_the_verifier_is_refused(tmp_path: Path) -> None:
    image, view = tmp_path / "image", tmp_path / "view"
    _tree(image, {"root": {".local": {"bin": {"uv": "image"}}}})
    _tree(view, {"root": {".local": {"bin": {"uv": "agent"}}}})
    args, refusal = compose_mounts(
        view=str(view), merged="/M", image=str(image), image_inner="/I", image_paths=("/root/.local/bin",)
    )
    assert refusal is None and _pairs(args)["/root/.local/bin"] == ("--ro-bind", "/I/root/.local/bin")
    shutil.rmtree(view / "root" / ".local")
    (view / "root" / ".local").symlink_to("/tmp/mine")
    _, refusal = compose_mounts(
        view=str(view), merged="/M", image=str(image), image_inner="/I", image_paths=("/root/.local/bin",)
    )
    assert refusal is not None and "/root/.local" in refusal


# -- small pieces ----------------------------------------------------------------------------------


def test_storage_usage_counts_blocks_and_entries_and_stops_past_a_cap(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"x" * (1 << 20))
    nbytes, n = usage(str(tmp_path))
    assert n == 2 and nbytes >= 1 << 20
    for i in range(50):
        (tmp_path / f"e{i}").touch()
    assert usage(str(tmp_path), entry_cap=10)[1] == 11


def test_image_user_reads_the_images_passwd_and_group(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "etc": {
                "passwd": "root:x:0:0::/root:/bin/bash\napp:x:1000:1001::/home/app:/bin/sh\n",
                "group": "staff:x:50:\n",
            }
        },
    )
    assert image_user(str(tmp_path), None) == (0, 0, "/root")
    assert image_user(str(tmp_path), "app") == (1000, 1001, "/home/app")
    assert image_user(str(tmp_path), "app:staff") == (1000, 50, "/home/app")
    assert image_user(str(tmp_path), "1234") == (1234, 1234, "/")
    with pytest.raises(ValueError, match="no such user"):
        image_user(str(tmp_path), "nobody-here")


# -- real episodes (slow) --------------------------------------------------------------------------


def _episode(name: str = "hello-file", ceilings: EpisodeCeilings | None = None, **task_fields) -> HarborEpisode:
    task = load_task(DATA / name, **task_fields)
    return HarborEpisode(task, build_image(task), ceilings or EpisodeCeilings()).start()


def _sh(ep: HarborEpisode, cmd: str, timeout: float = 20.0):
    res = ep.run(cmd, timeout)
    return res.exit_code, res.output.replace("\r\n", "\n").strip()


@pytest.mark.slow
@needs_mmdebstrap
def test_an_oracle_passes_and_a_no_op_fails() -> None:
    with _episode() as ep:
        assert _sh(ep, "bash -c 'echo hello harbor > /app/greeting.txt'")[0] == 0
        v = ep.verify()
        assert (v.reward, v.reason) == (1.0, "ok"), v
    with _episode() as ep:
        assert ep.verify().reward == 0.0


@pytest.mark.slow
@needs_mmdebstrap
def test_the_agent_runs_in_the_workdir_as_the_tasks_user_with_the_images_programs() -> None:
    with _episode("json-count") as ep:
        code, out = _sh(ep, "pwd; id -u; ls -1; python3 -c 'import sys; print(sys.version_info[:2])'")
        assert code == 0 and out.split("\n") == ["/data", "0", "one.txt", "skip.md", "two.txt", "(3, 11)"]
        assert _sh(ep, "cat *.txt | wc -l > count")[0] == 0
        assert ep.verify().reward == 1.0
    with _episode("json-count") as ep:
        _sh(ep, "echo 4 > count")
        v = ep.verify()
        assert (v.reward, v.reason) == (0.5, "ok")  # reward.json, partial credit


@pytest.mark.slow
@needs_mmdebstrap
def test_two_episodes_of_one_image_are_isolated_and_the_image_is_untouched() -> None:
    with _episode() as a, _episode() as b:
        assert a.image.root == b.image.root
        assert _sh(a, "echo mine > /app/secret; echo x > /usr/bin/new-tool; rm /etc/debian_version; echo ok")[0] == 0
        assert (
            _sh(b, "cat /app/secret; ls /usr/bin/new-tool; ls /etc/debian_version")[1].splitlines()[-1]
            == "/etc/debian_version"
        )
        assert "No such file" in _sh(b, "cat /app/secret")[1]
        assert os.path.exists(Path(a.overlay.upper) / "app" / "secret")  # the write landed in a's layer
        root = Path(a.image.root)
        assert not (root / "app" / "secret").exists() and not (root / "usr/bin/new-tool").exists()
        assert (root / "etc" / "debian_version").exists()
        # Processes of one episode are invisible to the other.
        _sh(a, "sleep 300 &")
        assert "sleep" not in _sh(b, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")[1]
        dirs, holders = (a.dir, b.dir), (a.overlay.pid, b.overlay.pid)
    # Closed: the layers are gone from disk, the holders (and with them the mounts) have exited.
    assert not any(os.path.exists(d) for d in dirs) and not any(os.path.exists(f"/proc/{p}/root") for p in holders)


@pytest.mark.slow
@needs_mmdebstrap
def test_allow_internet_false_is_enforced() -> None:
    host_ifaces = {ln.split(":")[0].strip() for ln in open("/proc/net/dev").read().splitlines()[2:]}
    cmd = "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"
    with _episode(allow_internet=False) as ep:
        assert _sh(ep, cmd)[1].split() == ["lo"]
        assert (
            "Network is unreachable"
            in _sh(ep, "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), 2)\"")[1]
        )
    if host_ifaces - {"lo"}:
        with _episode(allow_internet=True) as ep:
            assert set(_sh(ep, cmd)[1].split()) == host_ifaces  # the control: the host's interfaces


@pytest.mark.slow
@needs_mmdebstrap
def test_the_tests_are_invisible_during_the_agents_turns() -> None:
    with _episode() as ep:
        # The control: a file of the agent's own named like the tests is found.
        out = _sh(ep, "touch /tmp/mine-test.sh; find / -xdev -name '*test.sh' 2>/dev/null; ls /tests 2>&1")[1]
        assert out.splitlines()[0] == "/tmp/mine-test.sh" and "No such file" in out.splitlines()[1]
        assert ep.verify().reward == 0.0


@pytest.mark.slow
@needs_mmdebstrap
def test_a_prewritten_reward_file_does_not_fake_a_pass() -> None:
    with _episode() as ep:
        assert _sh(
            ep, "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt && cat /logs/verifier/reward.txt"
        ) == (0, "1")
        v = ep.verify()
        assert v.reward == 0.0 and v.reason == "ok"  # the verifier's own 0, in the harness's fresh dir


@pytest.mark.slow
@needs_mmdebstrap
def test_a_replaced_python3_does_not_fake_a_pass() -> None:
    fake = "printf '#!/bin/sh\\nexit 0\\n' > /usr/bin/python3.11 && chmod +x /usr/bin/python3.11"
    with _episode() as ep:
        assert _sh(ep, fake)[0] == 0
        assert _sh(ep, "python3 -c 'import sys; sys.exit(3)'; echo $?")[1] == "0"  # the control: replaced for the agent
        assert ep.verify().reward == 0.0


@pytest.mark.slow
@needs_mmdebstrap
def test_planted_pth_files_and_shell_rc_do_not_fake_a_pass() -> None:
    payload = "import os; open('/app/greeting.txt', 'w').write('hello harbor\\n')"
    plant = (
        f"for d in /usr/lib/python3/dist-packages /usr/local/lib/python3.11/dist-packages "
        f'/root/.local/lib/python3.11/site-packages; do mkdir -p $d && echo "{payload}" > $d/zz.pth; done; '
        f"echo 'echo hello harbor > /app/greeting.txt' | tee -a /root/.bashrc /etc/bash.bashrc /etc/profile >/dev/null; "
        f'mkdir -p /etc/python3.11 && echo "{payload}" > /etc/python3.11/sitecustomize.py'
    )
    with _episode() as ep:
        assert _sh(ep, plant)[0] == 0
        assert _sh(ep, "python3 -c pass; cat /app/greeting.txt; rm /app/greeting.txt")[1] == "hello harbor"  # control
        v = ep.verify()
        assert v.reward == 0.0, v


@pytest.mark.slow
@needs_mmdebstrap
def test_a_verifier_that_times_out_or_crashes_scores_zero(tmp_path: Path) -> None:
    task_dir = tmp_path / "slow-verifier"
    shutil.copytree(DATA / "hello-file", task_dir)
    (task_dir / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt.tmp\nsleep 60\n")
    task = load_task(task_dir, verifier_timeout_s=2.0)
    with HarborEpisode(task, build_image(task)).start() as ep:
        t0 = time.monotonic()
        v = ep.verify()
        assert v.timed_out and v.reward == 0.0 and time.monotonic() - t0 < 15
    (task_dir / "tests" / "test.sh").write_text("#!/bin/bash\necho about to crash\nkill -SEGV $$\n")
    with HarborEpisode(task, build_image(task)).start() as ep:
        v = ep.verify()
        assert v.reward == 0.0 and "wrote no reward" in v.reason and "about to crash" in v.output


@pytest.mark.slow
@needs_mmdebstrap
def test_the_writable_layer_is_capped_on_disk_and_the_episode_ends() -> None:
    with _episode(ceilings=EpisodeCeilings(storage_mb=64), storage_mb=16) as ep:
        assert ep.storage_mb == 16
        # 10 MB/s, so that the watch (every 0.5 s) sees the cap passed long before the loop ends.
        res = ep.run("for i in $(seq 1 40); do head -c 1M /dev/zero > /app/f$i; sleep 0.1; done; echo finished", 30)
        assert ep.storage_full and "storage" in ep.events and "finished" not in res.output
        assert usage(ep.overlay.upper)[0] < 32 << 20  # killed within an interval or two of the cap
        assert ep.verify().reason.startswith("storage limit hit")


@pytest.mark.slow
@needs_mmdebstrap
def test_the_writable_layer_is_capped_in_entries_too() -> None:
    with _episode(ceilings=EpisodeCeilings(max_entries=200)) as ep:
        res = ep.run(
            "mkdir /app/many && cd /app/many && for i in $(seq 1 2000); do : > f$i; sleep 0.01; done; echo finished", 60
        )
        assert ep.storage_full and "finished" not in res.output and usage(ep.overlay.upper)[1] < 2000
        assert ep.verify().reward == 0.0


@pytest.mark.slow
@needs_mmdebstrap
def test_memory_and_cpu_limits_come_from_the_task() -> None:
    with _episode(memory_mb=256, cpus=1.0) as ep:
        out = _sh(ep, "python3 -c 'bytearray(600 << 20)' 2>&1 | tail -1; nproc")[1].splitlines()
        assert out[0] == "MemoryError"
        assert out[1] == "1" or os.cpu_count() == 1
        assert _sh(ep, "python3 -c 'bytearray(50 << 20); print(1)'")[1] == "1"


@pytest.mark.slow
@needs_mmdebstrap
def test_the_agent_timeout_budgets_the_commands() -> None:
    with _episode(agent_timeout_s=2.0) as ep:
        res = ep.run("sleep 30", 60)
        assert res.timed_out and ep.time_left_s == 0.0


def test_episode_fields_are_clamped_to_the_ceilings(tmp_path: Path) -> None:
    task = load_task(DATA / "hello-file", storage_mb=999999, memory_mb=999999, cpus=64.0)
    image = stub_image("stub", tmp_path, "/app", {}, None)
    ep = HarborEpisode(task, image, EpisodeCeilings(storage_mb=100, memory_mb=2000, cpus=2.0))
    assert (ep.storage_mb, ep.memory_mb, ep.cpus, ep.workdir) == (100, 2000, 2.0, "/app")


@pytest.mark.slow
@needs_mmdebstrap
def test_the_sandboxs_seccomp_filter_and_host_uid_hold_in_an_episode() -> None:
    """The threat model's kernel-surface rule for this env: mount, unshare, ptrace and keyctl calls kill the
    calling process (SIGSYS: bash reports 159); as root the agent's processes run as the episode's leased uid."""
    call = "python3 -c 'import ctypes; ctypes.CDLL(None).syscall({}, 0, 0, 0, 0, 0)'; echo $?"
    with _episode() as ep:
        for nr in (165, 272, 101, 250):  # mount, unshare, ptrace, keyctl (x86-64)
            assert _sh(ep, call.format(nr))[1].splitlines()[-1] == "159", nr
        assert _sh(ep, "python3 -c 'print(1)'; echo $?")[1].splitlines() == ["1", "0"]  # the control
        if os.geteuid() == 0:
            pid = int(_sh(ep, "sleep 100 & echo $!")[1].splitlines()[-1])
            deadline = time.monotonic() + 5  # the child may not have exec'd sleep yet (a busy host)
            while not (
                host := [p for p in os.listdir("/proc") if p.isdigit() and _nspid(p) == pid and _cmd(p) == "sleep"]
            ):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert host and all(os.stat(f"/proc/{p}").st_uid == ep.host_ids[0] != 0 for p in host)


def _nspid(p: str) -> int | None:
    try:
        with open(f"/proc/{p}/status") as f:
            return int(next(ln for ln in f if ln.startswith("NSpid:")).split()[-1])
    except (OSError, StopIteration, ValueError):
        return None


def _cmd(p: str) -> str:
    try:
        with open(f"/proc/{p}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


_AS_NOBODY = """
import json, os, sys
sys.path.insert(0, os.path.join(os.environ["REPO"], "tests"))
from pathlib import Path
from envs.harbor.episode import HarborEpisode
from harbor_fixtures import image, load_task
root = Path(os.environ["MINI_ROOT"])
task = load_task(Path(os.environ["TASK_DIR"]))
out = {"uid": os.geteuid()}
with HarborEpisode(task, image("mini", root, "/app", {}, None)).start() as ep:
    out["agent"] = ep.run("id -u; pwd; echo hello harbor > greeting.txt; echo x > /usr/bin/planted; echo ok", 10).output
    out["reward"] = ep.verify().reward
out["image_untouched"] = not (root / "app").exists() and not (root / "usr/bin/planted").exists()
out["left"] = os.listdir(os.path.join(os.environ["TMPDIR"], "jointrl-harbor-65534"))
print(json.dumps(out))
"""


def _mini_root(dest: Path, uid: int) -> None:
    """A root with bash, cat and id (the host's, with their libraries), owned by ``uid``: an image as an
    unprivileged build leaves it."""
    for d in ("usr/bin", "usr/lib/x86_64-linux-gnu", "usr/lib64", "tmp", "proc", "dev", "etc"):
        (dest / d).mkdir(parents=True, exist_ok=True)
    for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
        (dest / link).symlink_to(target)
    progs = ["/usr/bin/bash", "/usr/bin/cat", "/usr/bin/id"]
    libs = subprocess.run(["ldd", *progs], capture_output=True, text=True, check=True).stdout
    for f in {*progs, *(w for w in libs.split() if w.startswith("/") and not w.endswith(":"))}:
        shutil.copy2(os.path.realpath(f), dest / os.path.realpath(f).lstrip("/"))
        name = dest / f.lstrip("/")
        if not name.exists():
            name.symlink_to(os.path.realpath(f))
    (dest / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/bash\n")
    for p in [dest, *dest.rglob("*")]:
        os.lchown(p, uid, uid)
    dest.chmod(0o755)


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="switches to uid 65534 to play an unprivileged harness")
def test_an_unprivileged_harness_runs_an_episode_in_a_user_namespace() -> None:
    """Without root: the view is mounted in an unprivileged user namespace (userxattr), the image belongs to
    the harness's uid and looks root-owned inside, the verifier still runs from the image."""
    import tempfile

    tmp_path = Path(tempfile.mkdtemp(prefix="jointrl-harbor-nobody-"))  # pytest's own tmp is root-only
    try:
        tmp_path.chmod(0o755)
        _as_nobody(tmp_path)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _as_nobody(tmp_path: Path) -> None:
    import site
    import sys

    task_dir = tmp_path / "task"
    shutil.copytree(DATA / "hello-file", task_dir)
    (task_dir / "tests" / "test.sh").write_text(
        '#!/bin/bash\n[ "$(cat /app/greeting.txt)" = "hello harbor" ] && r=1 || r=0\necho $r > /logs/verifier/reward.txt\n'
    )
    for p in [task_dir, *task_dir.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    _mini_root(tmp_path / "mini", 65534)
    (tmp_path / "scratch").mkdir()
    os.chown(tmp_path / "scratch", 65534, 65534)
    repo = str(Path(__file__).resolve().parents[1])
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": os.pathsep.join([repo, *site.getsitepackages()]),
        "REPO": repo,
        "MINI_ROOT": str(tmp_path / "mini"),
        "TASK_DIR": str(task_dir),
        "TMPDIR": str(tmp_path / "scratch"),
        "HOME": str(tmp_path / "scratch"),
    }
    cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", _AS_NOBODY]
    if subprocess.run([*cmd[:-2], "-c", "import pexpect, pyseccomp"], env=env, capture_output=True).returncode != 0:
        pytest.skip("uid 65534 cannot run this Python with the sandbox's dependencies")
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["uid"] == 65534 and out["agent"].replace("\r\n", "\n").split() == ["0", "/app", "ok"], out
    assert out["reward"] == 1.0 and out["image_untouched"] and out["left"] == [], out


@pytest.mark.slow
@needs_mmdebstrap
def test_a_dockerfile_user_runs_the_agent_and_the_verifier_as_that_user(tmp_path: Path) -> None:
    """With the real builder: ``USER app`` after a ``useradd``: the agent is uid 1000 in its
    home, owns what it makes, cannot write the image's root-owned files; the verifier runs as app too."""
    from envs.harbor import image as image_mod
    from envs.harbor import task as task_mod

    task_dir = tmp_path / "user-task"
    shutil.copytree(DATA / "hello-file", task_dir)
    (task_dir / "environment" / "Dockerfile").write_text(
        "FROM debian:bookworm-slim\nRUN useradd -m -u 1000 app && mkdir /work && chown app:app /work\nUSER app\nWORKDIR /work\n"
    )
    (task_dir / "tests" / "test.sh").write_text(
        '#!/bin/bash\n[ "$(stat -c %u /work/out.txt)" = 1000 ] && [ "$(id -u)" = 1000 ] && r=1 || r=0\n'
        "echo $r > /logs/verifier/reward.txt\n"
    )
    task = task_mod.load_task(task_dir)
    with HarborEpisode(task, image_mod.build_image(task)).start() as ep:
        out = _sh(ep, "id -u; pwd; echo $HOME; touch out.txt; touch /etc/x 2>&1")[1].splitlines()
        assert out[:3] == ["1000", "/work", "/home/app"] and "Permission denied" in out[3]
        assert ep.verify().reward == 1.0
