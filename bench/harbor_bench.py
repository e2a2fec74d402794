"""Episode start of a Harbor task over a cached image, next to today's terminal sandbox start.

Measures, interleaved in rounds (so that load from other processes hits both alike), the wall
time from nothing to a shell that has answered its first command:

* ``terminal``: what ``TerminalEnv.reset`` does for a task without setup: a ``Sandbox`` over a
  fresh capped storage, a ``ShellSession`` on it, then ``true``;
* ``harbor``: ``HarborEpisode(task, image).start()`` over an image already built (the cached
  case: the image's build is counted once per node, not per episode): the episode's directory,
  the leased uid, the overlay's holder and mount, the shell session in the image, then ``true``.

Closing is timed separately (not part of the start). Prints both medians and p90s, the ratio
(the issue's goal: harbor within 2x of terminal) and the host. The image comes from the Harbor
builder (``envs.harbor.image.build_image``) when it is installed, else from the test stand-in
(``tests/harbor_fixtures.py``: a Debian bookworm root built once with mmdebstrap).

With ``--builds DIR`` it measures image builds instead: every task dir under ``DIR`` (the shipped set:
``recipes/harbor``) built in name order into a fresh, empty cache (``--cache``, else a temporary directory),
each build's wall time (the first pays for the shared base: mmdebstrap and the shared ``RUN`` lines; the
others build on the cached prefix), then the same builds again as cache hits.

Usage: .venv/bin/python bench/harbor_bench.py [--n 20] [--task tests/data/harbor/hello-file]
       .venv/bin/python bench/harbor_bench.py --builds recipes/harbor [--cache DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _load(task_dir: Path):
    """(task, built image): the real loader and builder when present, else the tests' stand-ins."""
    try:
        from envs.harbor.image import build_image
        from envs.harbor.task import load_task
    except ImportError:
        sys.path.insert(0, str(ROOT / "tests"))
        from harbor_fixtures import build_image, load_task
    task = load_task(task_dir)
    t0 = time.perf_counter()
    image = build_image(task)
    return task, image, time.perf_counter() - t0


def _terminal_start() -> tuple[float, float]:
    from envs.sandbox import Limits, Sandbox, ShellSession

    t0 = time.perf_counter()
    box = Sandbox(None, Limits())
    session = ShellSession(box.work_dir, Limits())
    session.run("true", timeout=10)
    started = time.perf_counter() - t0
    t1 = time.perf_counter()
    session.close()
    box.close()
    return started, time.perf_counter() - t1


def _harbor_start(task, image) -> tuple[float, float]:
    from envs.harbor.episode import HarborEpisode

    t0 = time.perf_counter()
    ep = HarborEpisode(task, image).start()
    ep.run("true", 10)
    started = time.perf_counter() - t0
    t1 = time.perf_counter()
    ep.close()
    return started, time.perf_counter() - t1


def _host() -> str:
    try:
        cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next((ln.split(":", 1)[1].strip() for ln in cpu.splitlines() if ln.startswith("Model name")), "?")
    except OSError:
        model = "?"
    return f"{model}, {os.cpu_count()} CPUs, kernel {platform.release()}, load {os.getloadavg()[0]:.2f}"


def _p(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def _builds(tasks_dir: Path, cache: Path | None) -> int:
    """Build every task of ``tasks_dir`` into an empty cache, then again (cache hits); print each build's time."""
    import tempfile

    from envs.harbor.image import build_image
    from envs.harbor.task import load_tasks

    tasks = sorted(load_tasks(tasks_dir), key=lambda t: t.name)
    with tempfile.TemporaryDirectory(prefix="harbor-bench-") as tmp:
        where = cache or Path(tmp)
        if where.exists() and any(where.iterdir()):
            raise SystemExit(f"--cache {where}: not empty (the cold builds need an empty cache)")
        print(f"host: {_host()}; {len(tasks)} tasks from {tasks_dir}; cache {where}")
        rows = []
        for t in tasks:
            t0 = time.perf_counter()
            cold = build_image(t, where)
            cold_s = time.perf_counter() - t0
            rows.append((t.name, cold_s, cold.cached))
            print(f"{t.name:28} built in {cold_s:7.1f} s", flush=True)
        t0 = time.perf_counter()
        hits = [build_image(t, where).cached for t in tasks]
        print(f"total {sum(r[1] for r in rows):.1f} s cold; every image again: {time.perf_counter() - t0:.2f} s, "
              f"{sum(hits)} of {len(tasks)} cache hits; host load now {os.getloadavg()[0]:.2f}")  # fmt: skip
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20, help="rounds (one start of each kind per round)")
    ap.add_argument("--task", type=Path, default=ROOT / "tests" / "data" / "harbor" / "hello-file")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--builds", type=Path, help="time every image build of the task dirs under this directory")
    ap.add_argument("--cache", type=Path, help="with --builds: an empty cache directory to build into")
    args = ap.parse_args()
    if args.builds:
        return _builds(args.builds, args.cache)
    task, image, build_s = _load(args.task)
    _terminal_start(), _harbor_start(task, image)  # warm-up: imports, the probe, page cache
    times: dict[str, list[tuple[float, float]]] = {"terminal": [], "harbor": []}
    for i in range(args.n):
        order = ("terminal", "harbor") if i % 2 == 0 else ("harbor", "terminal")
        for kind in order:
            times[kind].append(_terminal_start() if kind == "terminal" else _harbor_start(task, image))
    res = {
        kind: {
            "start_median_ms": 1000 * statistics.median(s for s, _ in v),
            "start_p90_ms": 1000 * _p([s for s, _ in v], 0.9),
            "close_median_ms": 1000 * statistics.median(c for _, c in v),
        }
        for kind, v in times.items()
    }
    res["ratio_harbor_over_terminal"] = res["harbor"]["start_median_ms"] / res["terminal"]["start_median_ms"]
    res["image_lookup_s"] = build_s
    res["host"] = _host()
    res["rounds"] = args.n
    if args.json:
        print(json.dumps(res))
        return 0
    print(
        f"host: {res['host']}; {args.n} rounds; image ready in {build_s:.2f} s (cached: {getattr(image, 'cached', '?')})"
    )
    print(f"{'':10} {'start median':>13} {'start p90':>10} {'close median':>13}")
    for kind in ("terminal", "harbor"):
        r = res[kind]
        print(f"{kind:10} {r['start_median_ms']:10.1f} ms {r['start_p90_ms']:7.1f} ms {r['close_median_ms']:10.1f} ms")
    print(f"harbor / terminal start: {res['ratio_harbor_over_terminal']:.2f}x (goal: within 2x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
