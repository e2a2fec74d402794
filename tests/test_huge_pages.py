"""``learner.huge_pages``: learner actors get THP_MEM_ALLOC_ENABLE=1, and torch then backs large tensors with huge pages."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rl.config.recipe import LearnerConfig
from rl.driver.actors import learners as distributed
from rl.driver.actors.learners import LearnerGroup
from rl.trainer.memory import learner_env


def test_learner_env_follows_the_recipe_key():
    assert learner_env(LearnerConfig(allocator="system")) == {"THP_MEM_ALLOC_ENABLE": "1"}  # the default
    assert learner_env(LearnerConfig(allocator="system", huge_pages=False)) == {}
    assert learner_env(LearnerConfig())["THP_MEM_ALLOC_ENABLE"] == "1"  # beside the malloc's (tests/test_allocator.py)


@pytest.mark.parametrize("n", [1, 2])
def test_every_learner_actor_gets_the_variable_beside_its_own(monkeypatch, n):
    seen = {}

    class Group:
        def __init__(self, n, factory, metric, options, what):
            seen["options"] = options

    def placed(self, n, actor_options):  # as LearnerGroup._placed: 2+ ranks carry the rendezvous address
        if n == 1:
            return [{}], 0
        return [{"runtime_env": {"env_vars": {"JOINTRL_DIST_ADDR": "127.0.0.1"}}} for _ in range(n)], 4321

    monkeypatch.setattr(distributed, "ActorGroup", Group)
    monkeypatch.setattr(distributed, "ray_factory", lambda *a, **k: None)
    monkeypatch.setattr(LearnerGroup, "_placed", placed)
    LearnerGroup(n, "m", None, None, learner=LearnerConfig())
    for o in seen["options"]:
        env = o["runtime_env"]["env_vars"]
        assert env["THP_MEM_ALLOC_ENABLE"] == "1"
        assert (env.get("JOINTRL_DIST_ADDR") == "127.0.0.1") == (n > 1)
    LearnerGroup(n, "m", None, None, learner=LearnerConfig(huge_pages=False))
    assert all("THP_MEM_ALLOC_ENABLE" not in o["runtime_env"]["env_vars"] for o in seen["options"])


def _thp_mode() -> str:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "missing"
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else "missing"


@pytest.mark.skipif(_thp_mode() not in ("madvise", "always"), reason="the kernel gives no transparent huge pages")
@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="no /proc/self/smaps_rollup")
def test_torch_backs_a_large_tensor_with_huge_pages_only_when_asked():
    code = (
        "import torch\n"
        "x = torch.ones(64 << 18)\n"  # 64 MB, touched
        "print([l.split()[1] for l in open('/proc/self/smaps_rollup') if l.startswith('AnonHugePages')][0])\n"
    )

    def huge_kb(value: str) -> int:
        env = {**os.environ, "THP_MEM_ALLOC_ENABLE": value}
        return int(
            subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
        )

    assert huge_kb("1") >= 32 * 1024  # most of the 64 MB on 2 MB pages
    if _thp_mode() == "madvise":  # with 'always' the kernel may use huge pages unasked
        assert huge_kb("0") == 0
