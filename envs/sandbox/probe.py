"""Probing whether bubblewrap sandboxes work here (once per process, cached)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading

from envs.sandbox.base import SANDBOX_PATH, Limits, RunResult, SandboxUnavailable, _Tools, retry_setup_race, setup_race
from envs.sandbox.launch import _bwrap_command, _inner_work_dir, _prepare_work_dir, _temp_parent
from envs.sandbox.pump import _execute
from envs.sandbox.reap import _ensure_subreaper
from envs.sandbox.seccomp import filter_bpf
from envs.sandbox.config import SandboxConfig
from envs.sandbox.uids import lease_uid

# --------------------------------------------------------------------------------------
# Probing
# --------------------------------------------------------------------------------------


_check_lock = threading.Lock()
_check_result: _Tools | SandboxUnavailable | None = None


def check_sandbox() -> None:
    """Raise :class:`SandboxUnavailable` unless bwrap sandboxes work here.

    Probes once (runs ``true`` in a real sandbox) and caches the answer, good or bad.
    """
    _tools()


def _tools() -> _Tools:
    global _check_result
    with _check_lock:
        if _check_result is None:
            try:
                _check_result = _probe()
            except SandboxUnavailable as exc:
                _check_result = exc
        result = _check_result
    if isinstance(result, SandboxUnavailable):
        raise SandboxUnavailable(str(result))
    return result


def _probe() -> _Tools:
    """The tools a sandbox needs, after proving that one sandbox starts here."""
    tools = _find_tools()
    _check_seccomp()
    _try_one_sandbox(tools)
    return tools


def _find_tools() -> _Tools:
    """bwrap (and setpriv when root) on PATH, and which options this bwrap has."""
    if not sys.platform.startswith("linux"):
        raise SandboxUnavailable("bubblewrap sandboxes need Linux (namespaces); use mode='none' for trusted code")
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(
            "bubblewrap is not installed (no `bwrap` on PATH): install it with "
            "`apt-get install bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap` (Fedora/RHEL)"
        )
    setpriv = shutil.which("setpriv")
    if os.geteuid() == 0 and setpriv is None:
        raise SandboxUnavailable(
            "running as root needs `setpriv` to drop to the sandbox's own host uid before bwrap starts: "
            "install it with `apt-get install util-linux`"
        )
    try:
        help_text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxUnavailable(f"cannot run {bwrap} --help: {exc}") from exc
    return _Tools(
        bwrap=bwrap,
        setpriv=setpriv,
        prlimit=shutil.which("prlimit"),
        has_size="--size" in help_text,
        has_disable_userns="--disable-userns" in help_text,
    )


def _check_seccomp() -> None:
    """The seccomp filter can be built (pyseccomp and the system libseccomp are there)."""
    try:
        filter_bpf()
    except ImportError as exc:
        raise SandboxUnavailable(
            "the seccomp filter needs `pyseccomp` (pip install pyseccomp) and the system "
            f"libseccomp (apt-get install libseccomp2): {exc}"
        ) from exc
    except (OSError, RuntimeError, ValueError) as exc:
        raise SandboxUnavailable(f"cannot build the seccomp filter with libseccomp: {exc}") from exc


def _try_one_sandbox(tools: _Tools) -> None:
    """Run `true` in a sandbox; SandboxUnavailable says what the host refused, and how to fix it."""
    lease = lease_uid(SandboxConfig())  # the probe runs as a leased host uid too, as sandboxes do
    try:
        work = tempfile.mkdtemp(prefix="jointrl-sandbox-probe-", dir=_temp_parent())
    except BaseException:
        lease.release()
        raise
    try:
        host_ids = (lease.uid, lease.gid)
        _prepare_work_dir(work, host_ids)
        _ensure_subreaper()

        def attempt() -> RunResult:
            info_r, info_w = os.pipe()
            cmd = _bwrap_command(
                tools,
                ["true"],
                work_dir=work,
                inner=_inner_work_dir(),
                env={},
                limits=Limits(),
                info_fd=info_w,
                new_session=True,
                ro_binds=(),
                host_ids=host_ids,
            )
            return _execute(
                cmd, {"PATH": SANDBOX_PATH}, "/", None, None, Limits(wall_seconds=30), info_r, info_w, bwrap=True
            )

        try:
            # A sandbox being mounted or unmounted beside the probe can make bwrap fail its own mounts: retried as
            # every launcher retries it, since the answer is cached for the process, and a lost race is not "no".
            res = retry_setup_race(attempt, setup_race)
        except OSError as exc:
            raise SandboxUnavailable(f"cannot start bwrap: {exc}") from exc
        if res.exit_code != 0:
            said = (res.stderr or res.stdout).strip() or f"exit status {res.exit_code}, signal {res.signal}"
            raise SandboxUnavailable(
                f"bubblewrap is installed but cannot create a sandbox (bwrap said: {said}). " + _userns_hint(said)
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
        lease.release()


def _read_sysctl(proc_sys: str, name: str) -> str | None:
    try:
        with open(os.path.join(proc_sys, name)) as f:
            return f.read().strip()
    except OSError:
        return None


def _userns_hint(bwrap_said: str, proc_sys: str = "/proc/sys") -> str:
    """What to change so bwrap may create user namespaces, from the sysctls that refuse them."""
    hints = []
    if _read_sysctl(proc_sys, "kernel/unprivileged_userns_clone") == "0":
        hints.append(
            "unprivileged user namespaces are disabled by sysctl kernel.unprivileged_userns_clone=0: "
            "run `sysctl -w kernel.unprivileged_userns_clone=1`"
        )
    if _read_sysctl(proc_sys, "user/max_user_namespaces") == "0":
        hints.append(
            "user namespaces are disabled by sysctl user.max_user_namespaces=0: "
            "run `sysctl -w user.max_user_namespaces=15000`"
        )
    if _read_sysctl(proc_sys, "kernel/apparmor_restrict_unprivileged_userns") == "1":
        hints.append(
            "AppArmor restricts unprivileged user namespaces "
            "(sysctl kernel.apparmor_restrict_unprivileged_userns=1): run "
            "`sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` or give bwrap an AppArmor profile "
            "that allows userns"
        )
    if hints:
        return "Fix: " + "; ".join(hints) + "."
    if any(s in bwrap_said for s in ("namespace", "uid map", "Operation not permitted", "Permission denied")):
        return (
            "User namespaces were refused, but no sysctl forbids them: a container runtime's seccomp or "
            "AppArmor profile probably blocks them (Docker: run with `--security-opt seccomp=unconfined "
            "--security-opt apparmor=unconfined`, or `--privileged`)."
        )
    return "See the bwrap message above."
