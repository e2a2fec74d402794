"""The shipped Harbor tasks (``recipes/harbor/``): their layout, their schemas, the shared image prefix,
verifiers that download nothing and write their reward where the harness reads it, and (slow) each
task verified by hand over one shared Debian root: the oracle scores 1, the no-op and the deletion of
the work dir score 0 (``tests/harbor_handcheck.sh``, no image builder involved).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HARBOR = ROOT / "recipes" / "harbor"
HANDCHECK = ROOT / "tests" / "harbor_handcheck.sh"
TASKS = sorted(p for p in HARBOR.iterdir() if p.is_dir())
SHARED_PREFIX = [
    "FROM debian:bookworm-slim",
    "RUN apt-get update && apt-get install -y --no-install-recommends gawk gcc git jq libc6-dev make procps "
    "python3 sqlite3 && rm -rf /var/lib/apt/lists/*",
]
OLD_SCHEMA = {"jq-active-admins", "log-top-error-ips"}


def _ids(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


def test_about_fifteen_tasks_each_with_every_part():
    assert 14 <= len(TASKS) <= 20, _ids(TASKS)
    for t in TASKS:
        for rel in ("task.toml", "instruction.md", "environment/Dockerfile", "tests/test.sh", "solution/solve.sh"):
            assert (t / rel).is_file(), f"{t.name}: {rel} missing"
        assert (t / "instruction.md").read_text().strip(), t.name
        assert len([p for p in (t / "tests").iterdir()]) >= 2, f"{t.name}: test.sh and the files it checks with"


@pytest.mark.parametrize("task", TASKS, ids=_ids(TASKS))
def test_task_toml_declares_its_schema_limits_and_no_network(task):
    data = tomllib.loads((task / "task.toml").read_text())
    env = data["environment"]
    assert data["agent"]["timeout_sec"] > 0 and data["verifier"]["timeout_sec"] > 0
    if task.name in OLD_SCHEMA:  # the older schema: `version`, size strings, allow_internet
        assert data["version"] == "1.0" and "schema_version" not in data
        assert re.fullmatch(r"\d+[MG]", env["memory"]) and re.fullmatch(r"\d+[MG]", env["storage"])
        assert env["allow_internet"] is False
    else:
        assert data["schema_version"] == "1.1" and data["task"]["name"] == f"jointrl/{task.name}"
        assert env["memory_mb"] > 0 and env["storage_mb"] > 0 and env["network_mode"] == "no-network"


@pytest.mark.parametrize("task", TASKS, ids=_ids(TASKS))
def test_dockerfile_starts_with_the_shared_prefix(task):
    """Every image starts with the same FROM and apt-get line, so the builder's prefix cache builds it once."""
    lines = [ln for ln in (task / "environment" / "Dockerfile").read_text().splitlines() if ln.strip()]
    assert lines[:2] == SHARED_PREFIX
    assert not any(ln.startswith("FROM") or "apt-get" in ln for ln in lines[2:]), "one base, one package line"
    for ln in lines[2:]:
        if ln.startswith("COPY "):
            for src in ln.split()[1:-1]:
                assert (task / "environment" / src).exists(), f"{task.name}: COPY {src}: not in the context"


@pytest.mark.parametrize("task", TASKS, ids=_ids(TASKS))
def test_verifier_downloads_nothing_and_writes_its_reward(task):
    text = "\n".join(p.read_text(errors="replace") for p in (task / "tests").rglob("*") if p.is_file())
    for pattern in (r"\b(curl|wget)\s", r"\bpip3? install", r"\buvx?\s", r"\bapt(-get)?\s", r"https?://"):
        m = re.search(pattern, text)
        assert m is None, f"{task.name}: the verifier fetches at run time ({m and m.group(0)!r})"
    test_sh = (task / "tests" / "test.sh").read_text()
    assert "/logs/verifier/reward.txt" in test_sh
    # 1 on success, 0 otherwise, on every path: the reward is written whatever the check does.
    assert re.search(r"then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi", test_sh)


@pytest.mark.parametrize("task", TASKS, ids=_ids(TASKS))
def test_instruction_does_not_reveal_the_verifier(task):
    text = (task / "instruction.md").read_text()
    assert "/tests" not in text and "reward" not in text.lower() and "solve.sh" not in text


def test_the_loader_reads_every_shipped_task():
    task_mod = pytest.importorskip(
        "envs.harbor.task", reason="envs.harbor.task (the loader, branch h45img) not present"
    )
    loaded = task_mod.load_tasks(HARBOR)
    assert [t.name for t in loaded] == _ids(TASKS)
    for t in loaded:
        assert t.allow_internet is False, t.name
        assert t.memory_mb == 1024 and t.storage_mb == 512 and t.cpus == 1.0, t.name
        assert t.solution is not None and t.solution.name == "solve.sh"
        assert not t.extra, f"{t.name}: fields the loader does not know: {t.extra}"
    schemas = {t.name: t.schema for t in loaded}
    assert {n for n, s in schemas.items() if s == "1.0"} == OLD_SCHEMA


def _handcheck_base() -> Path:
    return Path(
        os.environ.get("JOINTRL_HARBOR_HANDCHECK_BASE", Path.home() / ".cache" / "jointrl" / "harbor_handcheck_base")
    )


@pytest.mark.slow
def test_every_task_verified_by_hand_oracle_1_noop_0_delete_0():
    """The hand check over one shared root (built once with mmdebstrap, then reused): per task, the oracle
    scores 1, and the no-op and the deletion of everything in the work dir score 0."""
    missing = [tool for tool in ("mmdebstrap", "bwrap", "unshare") if shutil.which(tool) is None]
    if missing or os.geteuid() != 0:
        pytest.skip(f"the hand check needs root and {', '.join(missing) or 'its tools'}")
    base = _handcheck_base()
    base.parent.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        ["bash", str(HANDCHECK), str(base), *map(str, TASKS)], capture_output=True, text=True, timeout=3000
    )
    rows = {ln.split()[0]: ln.split() for ln in r.stdout.splitlines() if ln.split() and ln.split()[0] in _ids(TASKS)}
    assert set(rows) == set(_ids(TASKS)), r.stdout + r.stderr
    bad = {name: row[2:5] for name, row in rows.items() if row[2:5] != ["1", "0", "0"]}
    assert not bad and r.returncode == 0, f"{bad}\n{r.stdout}\n{r.stderr[-2000:]}"
