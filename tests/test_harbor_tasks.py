"""The shipped Harbor tasks (``recipes/harbor/``): their layout, their schemas, the shared image prefix,
verifiers that download nothing and write their reward where the harness reads it. Each task's oracle,
no-op and attacks are played in its built image by the audit (``tests/test_audit_harbor.py``).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from envs.harbor.task import load_tasks

ROOT = Path(__file__).resolve().parents[1]
HARBOR = ROOT / "recipes" / "harbor"
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


def test_the_test_suites_base_image_is_the_shared_prefix():
    """``tests/data/harbor_base`` (the episode tests' base) is this prefix: the suite builds one base."""
    base = ROOT / "tests" / "data" / "harbor_base" / "environment" / "Dockerfile"
    assert [ln for ln in base.read_text().splitlines() if ln.strip()] == SHARED_PREFIX


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
    loaded = load_tasks(HARBOR)
    assert [t.name for t in loaded] == _ids(TASKS)
    for t in loaded:
        assert t.allow_internet is False, t.name
        assert t.memory_mb == 1024 and t.storage_mb == 512 and t.cpus == 1.0, t.name
        assert t.solution is not None and t.solution.name == "solve.sh"
        assert not t.extra, f"{t.name}: fields the loader does not know: {t.extra}"
    schemas = {t.name: t.schema for t in loaded}
    assert {n for n, s in schemas.items() if s == "1.0"} == OLD_SCHEMA
