"""envs.sandbox.storage without root: the capped tmpfs held in an unprivileged user + mount namespace.

The root path (the harness mounts the tmpfs itself) is covered by test_attacks_isolation.py.
Here: the namespace holder in process; the whole harness run as an unprivileged user
(uid 65534, through ``setpriv``) getting capped storage for real; and the fallback (no user
namespaces) that logs a warning and leaves storage uncapped.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import envs.sandbox.storage as storage_mod
from envs.sandbox import SandboxUnavailable, check_sandbox
from envs.sandbox.config import SandboxConfig
from envs.sandbox.storage import Storage, _NamespaceHolder

REPO = Path(__file__).resolve().parents[1]


def _userns_ok() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None or shutil.which("nsenter") is None:
        return False
    res = subprocess.run([unshare, "--user", "--map-root-user", "--mount", "true"], capture_output=True, timeout=10)
    return res.returncode == 0


needs_userns = pytest.mark.skipif(not _userns_ok(), reason="unprivileged user namespaces are refused here")


@needs_userns
def test_namespace_holder_caps_bytes_and_inodes_and_the_host_never_sees_the_files(tmp_path):
    root = tmp_path / "sb"
    root.mkdir()
    holder = _NamespaceHolder(str(root), 1 << 20, 64)
    try:
        view = Path(holder.view + str(root))
        with pytest.raises(OSError) as exc:
            (view / "big").write_bytes(b"x" * (2 << 20))
        assert exc.value.errno == 28  # ENOSPC at the 1 MiB cap
        (view / "big").unlink()
        with pytest.raises(OSError) as exc:
            for i in range(100):
                (view / f"f{i}").touch()
        assert exc.value.errno == 28 and i < 64  # the inode cap
        assert os.listdir(root) == []  # on the host the mount point stays an empty directory
        pid = holder.pid
    finally:
        holder.close()
    assert not os.path.exists(f"/proc/{pid}")  # the namespace, and its files, are gone


def test_without_root_or_user_namespaces_storage_is_uncapped_and_says_why(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(storage_mod.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(storage_mod.shutil, "which", lambda name: None)
    monkeypatch.setattr(storage_mod, "_warned", False)
    with caplog.at_level(logging.WARNING, logger="envs.sandbox"):
        st = Storage(str(tmp_path), SandboxConfig(), owner=None)
    try:
        assert not st.capped and st.holder is None and not st.full()
        assert st.work == os.path.join(st.root, "work") and st.inside(st.work) == st.work and st.enter() == []
        warning = " ".join(r.getMessage() for r in caplog.records)
        assert "NOT capped" in warning and "unshare" in warning and "RLIMIT_FSIZE" in warning
    finally:
        st.close()
    assert not os.path.exists(st.root)


def _unprivileged_python() -> list[str] | None:
    """An interpreter uid 65534 can run that imports the sandbox's dependencies, or None."""
    deps = "import pexpect, pyseccomp, psutil"
    paths = os.pathsep.join([str(REPO), *site.getsitepackages()])
    for exe in (sys.executable, "/usr/bin/python3"):
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "env", f"PYTHONPATH={paths}", exe]
        try:
            ok = subprocess.run([*cmd, "-c", deps], capture_output=True, timeout=30).returncode == 0
        except OSError:
            ok = False
        same = subprocess.run([*cmd, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True)
        if ok and same.stdout.strip() == str(sys.version_info[:2]):
            return cmd
    return None


_AS_NOBODY = textwrap.dedent(
    """
    import json, os
    from envs.sandbox import Sandbox, ShellSession
    from envs.sandbox.config import SandboxConfig
    out = {"uid": os.geteuid()}
    box = Sandbox(config=SandboxConfig(storage_mb=4, storage_inodes=200))
    out["capped"] = box.storage.capped
    box.write_files({"h.txt": "from host"})
    r = box.run(["sh", "-c", "cat h.txt; head -c 6000000 /dev/zero > big; echo rc=$?; df -k /work | tail -1"])
    out["run"], out["events"] = r.stdout, list(r.events)
    out["host_dir"] = os.listdir(box.storage.root)
    os.unlink(os.path.join(box.work_dir, "big"))
    with ShellSession(box.work_dir) as s:
        out["shell"] = s.run("echo made > m.txt; cat h.txt").output
    out["read"] = box.read_file("m.txt")
    pid = box.storage.holder.pid
    box.close()
    out["holder_gone"] = not os.path.exists(f"/proc/{pid}")
    print(json.dumps(out))
    """
)


@needs_userns
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root to become uid 65534")
def test_an_unprivileged_harness_gets_capped_storage_for_real():
    try:
        check_sandbox()
    except SandboxUnavailable as exc:
        pytest.skip(f"bubblewrap sandbox unavailable here: {exc}")
    cmd = _unprivileged_python()
    if cmd is None:
        pytest.skip("no Python that uid 65534 can run imports the sandbox's dependencies")
    res = subprocess.run(
        [*cmd[:-2], "TMPDIR=/tmp", "HOME=/tmp", *cmd[-2:], "-c", _AS_NOBODY],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/tmp",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["uid"] == 65534 and out["capped"] is True, out
    assert out["run"].startswith("from host") and "rc=1" in out["run"], out  # ENOSPC at 4 MiB
    assert out["run"].split()[-5] == "4096", out  # df: a 4096 KiB tmpfs is /work
    assert out["events"] == ["storage"] and out["host_dir"] == [], out
    assert out["shell"] == "from host" and out["read"] == "made\n" and out["holder_gone"], out
