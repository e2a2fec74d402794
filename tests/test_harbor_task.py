"""The Harbor task loader: every task.toml field and schema version, unknown fields kept, refusals named."""

from __future__ import annotations

from pathlib import Path

import pytest

from envs.harbor.task import HarborTaskError, load_task, load_tasks, parse_size_mb

TB2_TOML = """\
version = "1.0"

[metadata]
author_name = "someone"
difficulty = "medium"
category = "system-administration"
tags = ["git", "shell"]

[verifier]
timeout_sec = 180.0

[agent]
timeout_sec = 900.0

[environment]
build_timeout_sec = 300.0
docker_image = "example.org/tasks/fix-git:2.0"
cpus = 2
memory = "4G"
storage = "10G"
"""

NEW_TOML = """\
schema_version = "1.1"

[task]
name = "jointrl/fix-git"
description = "Repair a repository"
keywords = ["git"]

[metadata]
difficulty = "easy"

[verifier]
timeout_sec = 60
env = { PYTHONHASHSEED = "0", MODE = "strict" }
user = "root"

[agent]
timeout_sec = 120
user = 1000

[solution]
env = { SOLVE = "1" }

[environment]
cpus = 0.5
memory_mb = 1024
storage_mb = 2048
network_mode = "no-network"
workdir = "/app"
env = { TOKEN = "${HOST_TOKEN:-none}" }
"""


def make_task(root: Path, name: str = "fix-git", toml: str = TB2_TOML, **files: str | None) -> Path:
    """A task directory with every required file; ``files`` (relative path -> text, None: absent) override."""
    d = root / name
    content = {
        "task.toml": toml,
        "instruction.md": "Fix the repository in /app.\n",
        "environment/Dockerfile": "FROM debian:bookworm-slim\nWORKDIR /app\n",
        "tests/test.sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
        "solution/solve.sh": "#!/bin/bash\ntrue\n",
        **{k.replace("__", "/"): v for k, v in files.items()},
    }
    for rel, text in content.items():
        if text is None:
            continue
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
    return d


def test_terminal_bench_2_schema_with_old_size_strings(tmp_path: Path) -> None:
    t = load_task(make_task(tmp_path))
    assert t.name == "fix-git" and t.path == (tmp_path / "fix-git").resolve()
    assert t.schema == "1.0"
    assert t.instruction == "Fix the repository in /app.\n"
    assert (t.agent_timeout_s, t.verifier_timeout_s, t.build_timeout_s) == (900.0, 180.0, 300.0)
    assert (t.cpus, t.memory_mb, t.storage_mb) == (2.0, 4096, 10240)
    assert t.allow_internet is True  # the schema's default
    assert t.docker_image == "example.org/tasks/fix-git:2.0"
    assert t.metadata == {
        "author_name": "someone",
        "difficulty": "medium",
        "category": "system-administration",
        "tags": ["git", "shell"],
    }
    assert t.extra == {} and t.verifier_env == {} and t.verifier_user is None and t.workdir is None
    assert t.dockerfile == t.path / "environment" / "Dockerfile" and t.context == t.path / "environment"
    assert t.tests_dir == t.path / "tests" and t.solution == t.path / "solution" / "solve.sh"


def test_newer_schema_task_section_verifier_env_user_and_network_mode(tmp_path: Path) -> None:
    t = load_task(make_task(tmp_path, toml=NEW_TOML))
    assert t.schema == "1.1"
    assert t.package == {"name": "jointrl/fix-git", "description": "Repair a repository", "keywords": ["git"]}
    assert t.verifier_env == {"PYTHONHASHSEED": "0", "MODE": "strict"} and t.verifier_user == "root"
    assert t.agent_user == "1000" and t.solution_env == {"SOLVE": "1"}
    assert (t.cpus, t.memory_mb, t.storage_mb) == (0.5, 1024, 2048)
    assert t.allow_internet is False and t.workdir == "/app"
    assert t.task_env == {"TOKEN": "${HOST_TOKEN:-none}"}  # kept as written: never resolved from the host here
    assert (t.agent_timeout_s, t.verifier_timeout_s) == (120.0, 60.0)


def test_defaults_when_sections_are_absent(tmp_path: Path) -> None:
    t = load_task(make_task(tmp_path, toml='version = "1.0"\n', **{"solution/solve.sh": None}))
    assert (t.agent_timeout_s, t.verifier_timeout_s, t.cpus, t.memory_mb, t.storage_mb) == (
        600.0,
        600.0,
        1.0,
        2048,
        10240,
    )
    assert t.allow_internet is True and t.solution is None


@pytest.mark.parametrize(
    ("env", "allowed"),
    [
        ("allow_internet = false", False),
        ("allow_internet = true", True),
        ('network_mode = "public"', True),
        ('network_mode = "no-network"', False),
        ('network_mode = "no-network"\nallow_internet = false', False),
    ],
)
def test_internet_setting_in_both_spellings(tmp_path: Path, env: str, allowed: bool) -> None:
    t = load_task(make_task(tmp_path, toml=f'version = "1.0"\n[environment]\n{env}\n'))
    assert t.allow_internet is allowed


@pytest.mark.parametrize(
    ("value", "mb"), [("4G", 4096), ("512M", 512), ("1.5G", 1536), ("2048", 2048), ("1T", 1048576), ("8Gi", 8192)]
)
def test_size_strings(value: str, mb: int) -> None:
    assert parse_size_mb(value) == mb


def test_unknown_fields_are_kept_by_dotted_name_and_never_read(tmp_path: Path) -> None:
    toml = (
        'version = "1.0"\nfuture_top = 3\n[agent]\ntimeout_sec = 10\nturn_budget = 7\n'
        '[environment]\ncpus = 1\ngpu_vendor = "x"\nskills_dir = "/s"\n[verifier]\nreward_kind = "json"\n'
        "[brand_new]\nx = 1\n"
    )
    t = load_task(make_task(tmp_path, toml=toml))
    assert t.extra == {
        "future_top": 3,
        "brand_new": {"x": 1},
        "agent.turn_budget": 7,
        "environment.gpu_vendor": "x",
        "environment.skills_dir": "/s",
        "verifier.reward_kind": "json",
    }
    assert t.agent_timeout_s == 10.0 and t.cpus == 1.0


REFUSALS = [
    # (toml body after version, the words the message must hold)
    ('[environment]\nmemory_mb = 1024\nmemory = "1G"', ["environment.memory", "line 4", "deprecated"]),
    ('[environment]\nmemory = "lots"', ["environment.memory", "line 3", "'4G'"]),
    ("[agent]\ntimeout_sec = -5", ["agent.timeout_sec", "line 3", "positive"]),
    ('[environment]\ncpus = "two"', ["environment.cpus", "line 3"]),
    ("[environment]\nmemory_mb = 10.5", ["environment.memory_mb", "whole number"]),
    ('[environment]\nworkdir = "app"', ["environment.workdir", "line 3", "absolute"]),
    ("[verifier]\nenv = { A = 1 }", ["verifier.env", "line 3", "table of strings"]),
    ('[environment]\nallow_internet = "no"', ["environment.allow_internet", "true or false"]),
    ('[environment]\nnetwork_mode = "allowlist"', ["environment.network_mode", "not supported"]),
    ('[environment]\nnetwork_mode = "public"\nallow_internet = false', ["environment.allow_internet", "contradicts"]),
    ("[environment]\ngpus = 1", ["environment.gpus", "GPU"]),
    ('[environment]\nmcp_servers = [{ name = "x", url = "http://x" }]', ["environment.mcp_servers"]),
    ('[environment]\nhealthcheck = { command = "true" }', ["environment.healthcheck"]),
    ('[[steps]]\nname = "one"\n[[steps]]\nname = "two"', ["steps", "line 2", "multi-step"]),
    ('[task]\nname = "no-slash"', ["task.name", "org/name"]),
    ('[verifier]\nenvironment_mode = "separate"', ["verifier.environment_mode", "line 3", "separate"]),
    ("metadata = 3", ["metadata", "table"]),
]


@pytest.mark.parametrize(("body", "words"), REFUSALS, ids=[r[1][0] + str(i) for i, r in enumerate(REFUSALS)])
def test_bad_fields_are_refused_naming_task_file_field_and_line(tmp_path: Path, body: str, words: list[str]) -> None:
    d = make_task(tmp_path, toml=f'version = "1.0"\n{body}\n')
    with pytest.raises(HarborTaskError) as e:
        load_task(d)
    msg = str(e.value)
    assert str(d) in msg and "task.toml" in msg
    for w in words:
        assert w in msg, (w, msg)


@pytest.mark.parametrize(
    ("toml", "words"),
    [
        ('version = "2.0"\n', ["version", "2.0", "1.x"]),
        ('schema_version = "1.2"\nversion = "1.0"\n', ["schema_version", "disagrees"]),
        ('version = "1.0"\n[agent\ntimeout_sec = 3\n', ["malformed TOML", "line 2"]),
    ],
)
def test_schema_versions_and_malformed_toml(tmp_path: Path, toml: str, words: list[str]) -> None:
    with pytest.raises(HarborTaskError) as e:
        load_task(make_task(tmp_path, toml=toml))
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_later_1x_schemas_are_read(tmp_path: Path) -> None:
    assert load_task(make_task(tmp_path, toml='schema_version = "1.4"\n')).schema == "1.4"


@pytest.mark.parametrize(
    ("files", "words"),
    [
        ({"instruction.md": None}, ["instruction.md", "missing"]),
        ({"instruction.md": "  \n"}, ["instruction.md", "empty"]),
        ({"tests__test.sh": None}, ["tests/test.sh", "missing"]),
        ({"environment__Dockerfile": None}, ["environment/Dockerfile", "missing", "never pulled"]),
        ({"environment__docker-compose.yaml": "services: {}\n"}, ["docker-compose.yaml", "compose"]),
        ({"environment__compose.yml": "services: {}\n"}, ["compose.yml", "compose"]),
        ({"task.toml": None}, ["task.toml", "missing"]),
        ({"task.toml": None, "task.yaml": "instruction: x\n"}, ["task.toml", "Terminal-Bench 1"]),
    ],
)
def test_missing_files_and_compose_environments(tmp_path: Path, files: dict, words: list[str]) -> None:
    d = make_task(tmp_path, **files)
    with pytest.raises(HarborTaskError) as e:
        load_task(d)
    assert str(d) in str(e.value)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_load_tasks_from_a_directory_one_task_or_a_glob(tmp_path: Path) -> None:
    sets = tmp_path / "set"
    for name in ("b-task", "a-task"):
        make_task(sets, name)
    (sets / "notes").mkdir()  # not a task dir: skipped
    assert [t.name for t in load_tasks(sets)] == ["a-task", "b-task"]
    assert [t.name for t in load_tasks(sets / "b-task")] == ["b-task"]
    assert [t.name for t in load_tasks(str(sets / "a-*"))] == ["a-task"]
    with pytest.raises(HarborTaskError, match="no task directory"):
        load_tasks(tmp_path / "set" / "notes")
    with pytest.raises(HarborTaskError, match="no such directory"):
        load_tasks(tmp_path / "absent")


def test_a_bad_task_in_a_set_is_named_and_duplicates_refused(tmp_path: Path) -> None:
    make_task(tmp_path / "s1", "good")
    make_task(tmp_path / "s1", "broken", **{"instruction.md": None})
    with pytest.raises(HarborTaskError, match=r"broken: instruction\.md: missing"):
        load_tasks(tmp_path / "s1")
    make_task(tmp_path / "s2", "good")
    make_task(tmp_path / "s3", "good")
    with pytest.raises(HarborTaskError, match="two tasks named 'good'"):
        load_tasks(str(tmp_path / "s[23]" / "*"))
