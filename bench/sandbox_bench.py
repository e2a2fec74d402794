"""Throughput and latency of envs.sandbox.

Prints a table with:
* sandboxed unit-test-like runs per second (``Sandbox.run_python`` of a tiny assert
  program, one fresh process tree per run) next to the same program run as a plain
  subprocess with the same interpreter (interleaved, so background load hits both), and
  the per-run overhead;
* terminal round-trip latency: ``ShellSession.run("echo hi")`` median and p95 in ms.

Usage: .venv/bin/python bench/sandbox_bench.py [--n 200] [--shell-n 500] [--mode bwrap]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envs.sandbox import Sandbox, ShellSession, check_sandbox  # noqa: E402

PROGRAM = """\
def add(a, b):
    return a + b

assert add(2, 3) == 5
assert add(-1, 1) == 0
print("ok")
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[k]


def bench_python(box: Sandbox, warm_box: Sandbox, n: int, rounds: int = 10) -> dict[str, list[float]]:
    """Per-run wall times in ms, plain, sandboxed (cold start) and sandboxed with the next
    sandbox pre-started (``Sandbox(warm=True)``), interleaved in rounds so that load from
    other processes on the machine hits all three alike."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "main.py")
        with open(path, "w") as f:
            f.write(PROGRAM)

        def plain_once() -> None:
            r = subprocess.run([box.python, path], capture_output=True, cwd=d)
            assert r.returncode == 0 and r.stdout == b"ok\n", r

        def sandboxed_once() -> None:
            r = box.run_python(PROGRAM)
            assert r.exit_code == 0 and r.stdout == "ok\n", r

        def warm_once() -> None:
            r = warm_box.run_python(PROGRAM)
            assert r.exit_code == 0 and r.stdout == "ok\n", r

        plain_once()  # warm-up
        sandboxed_once()
        warm_once()
        per_round = max(1, n // rounds)
        times: dict[str, list[float]] = {"plain": [], "sandboxed": [], "warm": []}
        for _ in range(rounds):
            for name, fn in (("plain", plain_once), ("sandboxed", sandboxed_once), ("warm", warm_once)):
                for _ in range(per_round):
                    t0 = time.perf_counter()
                    fn()
                    times[name].append((time.perf_counter() - t0) * 1000)
        return times


def bench_shell(mode: str, n: int) -> tuple[float, float, float]:
    t0 = time.perf_counter()
    with ShellSession(mode=mode) as shell:
        start_ms = (time.perf_counter() - t0) * 1000
        for _ in range(20):
            shell.run("echo hi")
        lat = []
        for _ in range(n):
            t = time.perf_counter()
            r = shell.run("echo hi")
            lat.append((time.perf_counter() - t) * 1000)
            assert r.output == "hi\n" and r.exit_code == 0, r
    return start_ms, statistics.median(lat), percentile(lat, 0.95)


def bench_git_vet(n: int) -> tuple[float, float]:
    """Median ms of a terminal check of a git repo, and of the git-metadata vetting before it
    (``TerminalEnv._vet_git``), measured side by side on the same committed repo."""
    from envs.sandbox import Limits
    from envs.terminal import TerminalEnv
    from envs.types import Message, Task, TerminalSpec

    spec = TerminalSpec(
        setup="git init -q repo && git -C repo config user.email a@b && git -C repo config user.name a && "
        "echo v1 > repo/a.txt && git -C repo add a.txt && git -C repo commit -qm v1",
        check='[ -z "$(git -C repo status --porcelain --ignored --untracked-files=all)" ]',
        solution="",
        time_limit_s=30,
    )
    lim = Limits(cpu_seconds=10, wall_seconds=10.0, output_bytes=65536)
    vet, check = [], []
    with TerminalEnv(check_timeout_s=10.0) as env:
        env.reset(Task(id="bench-git", domain="terminal", terminal=spec, messages=(Message("user", "x"),)))
        for _ in range(n):
            t = time.perf_counter()
            assert env._vet_git(lim) is None
            vet.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            assert env._box.run(["bash", "-c", spec.check], limits=lim).ok
            check.append((time.perf_counter() - t) * 1000)
    return statistics.median(check), statistics.median(vet)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="python runs per variant (default 200)")
    ap.add_argument("--shell-n", type=int, default=500, help="shell round trips (default 500)")
    ap.add_argument("--git-n", type=int, default=30, help="terminal git checks (and vettings) timed (default 30)")
    ap.add_argument("--mode", choices=("bwrap", "none"), default="bwrap")
    ap.add_argument("--no-write", action="store_true", help="do not write the section of bench/RESULTS.md")
    args = ap.parse_args()
    if args.mode == "bwrap":
        check_sandbox()

    with Sandbox(mode=args.mode) as box, Sandbox(mode=args.mode, warm=True) as warm_box:
        python = box.python
        times = bench_python(box, warm_box, args.n)
    shell_start, median, p95 = bench_shell(args.mode, args.shell_n)
    git_check, git_vet = bench_git_vet(args.git_n) if args.mode == "bwrap" else (float("nan"), float("nan"))
    plain, sandboxed, warm = (1000 * len(times[k]) / sum(times[k]) for k in ("plain", "sandboxed", "warm"))
    plain_med, sandboxed_med, warm_med = (statistics.median(times[k]) for k in ("plain", "sandboxed", "warm"))

    rows = [
        ("interpreter", python, ""),
        ("plain subprocess python", f"{plain:.1f}", "runs/s"),
        (f"sandboxed run_python ({args.mode})", f"{sandboxed:.1f}", "runs/s"),
        (f"sandboxed run_python ({args.mode}, warm=True)", f"{warm:.1f}", "runs/s"),
        ("sandboxed / plain", f"{sandboxed / plain:.2f}", "x"),
        ("sandboxed warm / plain", f"{warm / plain:.2f}", "x"),
        ("plain subprocess python, median", f"{plain_med:.1f}", "ms/run"),
        (f"sandboxed run_python ({args.mode}), median", f"{sandboxed_med:.1f}", "ms/run"),
        (f"sandboxed run_python ({args.mode}, warm=True), median", f"{warm_med:.1f}", "ms/run"),
        ("sandbox overhead per run, median", f"{sandboxed_med - plain_med:.1f}", "ms"),
        ("ShellSession start", f"{shell_start:.1f}", "ms"),
        ('ShellSession.run("echo hi") median', f"{median:.2f}", "ms"),
        ('ShellSession.run("echo hi") p95', f"{p95:.2f}", "ms"),
        ("terminal check of a git repo (`git status`), median", f"{git_check:.1f}", "ms"),
        ("git metadata vetting before such a check, median", f"{git_vet:.1f}", "ms"),
    ]
    width = max(len(r[0]) for r in rows)
    vwidth = max(len(r[1]) for r in rows)
    print(f"{'metric':<{width}}  {'value':>{vwidth}}  unit")
    print(f"{'-' * width}  {'-' * vwidth}  ------")
    for name, value, unit in rows:
        print(f"{name:<{width}}  {value:>{vwidth}}  {unit}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"(n={args.n} python runs per variant, {args.shell_n} shell round trips, {args.git_n} git checks, "
        f"{os.cpu_count()} CPUs, load average {load:.1f})"
    )
    if not args.no_write:
        from bench._results import table, write_section

        body = (
            f"{args.n} runs per variant of a tiny assert program, plain / sandboxed / sandboxed with "
            "`warm=True` interleaved in 10 rounds. Sandboxed = setpriv + prlimit + bwrap (user, PID, mount, "
            "net, IPC, UTS namespaces; seccomp filter; capped tmpfs storage) per run. `warm=True` pre-starts "
            "the next run's sandbox during the current run (a bash stub waits for the command, then execs it; "
            "each sandbox is still used once). Goal from the issue: sandboxed >= 0.5x plain. "
            f"The last two rows: {args.git_n} terminal checks of a one-commit repo and, side by side, the "
            "vetting of its git metadata that runs before every check of a work dir holding git metadata "
            "(`envs.terminal_git`, one more sandbox launch).\n\n"
            + table(["metric", "value", "unit"], [[a, b, c] for a, b, c in rows])
        )
        write_section("sandbox", "Sandbox throughput (`bench/sandbox_bench.py`)", body)


if __name__ == "__main__":
    main()
