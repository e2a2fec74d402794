"""``jointrl audit`` on Harbor task directories: the ``harbor`` source, its reference (``solve.sh``), its
strategies, the table's image and no-op columns and the failing tasks named; (slow) every shipped task
audited through the recipe's ``harbor`` env: the oracle scores 1, the no-op 0, no strategy above it.

The fast tests never run a strategy's commands on this machine (they write to ``/logs``, ``/tests`` and
replace ``python3``): a stand-in env scores the commands it is given by their text.
"""

from __future__ import annotations

import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

from envs.types import Message, Task
from rl.cli.audit import harbor, strategies
from rl.cli.audit.harbor import HarborSource, harbor_reference, instruction_paths
from rl.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
HARBOR = ROOT / "recipes" / "harbor"


def _command(turn: str) -> str:
    m = re.fullmatch(r"```bash\n(.*)\n```", turn, re.S)
    assert m, turn
    return m.group(1)


def test_the_harbor_catalogue_has_the_baseline_and_the_verifier_attacks():
    table = strategies.STRATEGIES["harbor"]
    assert table["noop"].role == "noop" and table["wrong"].role == "wrong"
    for name in (
        "delete_everything", "delete_named", "truncate_all", "prompt_repeated", "named_paths_1", "named_paths_empty",
        "forge_reward", "plant_tests", "hijack_interpreters", "plant_pth", "shell_rc", "kill_all",
    ):  # fmt: skip
        assert table[name].role == "attack", name
    task = Task("t", "harbor", (Message("user", "Write `/app/out.json` from `/app/in.json`; see `notes`."),))
    assert instruction_paths(task) == ["/app/out.json", "/app/in.json"]
    turn = strategies.Turn(task, task.messages, 1, "DONE")
    assert "/app/out.json" in table["named_paths_1"].act(turn)
    assert "/logs/verifier/reward.txt" in table["forge_reward"].act(turn)
    assert table["noop"].act(turn) == "DONE"
    assert table["forge_reward"].act(strategies.Turn(task, task.messages, 2, "DONE")) == "DONE"


def test_every_harbor_strategy_command_is_valid_bash():
    """Checked with ``bash -n`` (parsed, never run: they write to /logs and /tests and replace python3)."""
    task = Task("t", "harbor", (Message("user", "Fix `/app/a b.txt`, `/srv/x` and `/app/it's.json`."),))
    played = 0
    for s in strategies.STRATEGIES["harbor"].values():
        if s.name == "prompt_repeated":  # prose, not a command: the env answers it with a format reminder
            continue
        for n in range(1, 8):
            text = s.act(strategies.Turn(task, task.messages, n, "DONE"))
            if text is None or text == "DONE":
                continue
            cmd = _command(text) if text.startswith("```") else text
            r = subprocess.run(["bash", "-n", "-c", cmd], capture_output=True, text=True, timeout=10)
            assert r.returncode == 0, f"{s.name}: {r.stderr}"
            played += 1
    assert played >= 13


def test_the_reference_unpacks_the_solution_and_runs_solve_sh_in_the_work_dir(tmp_path, monkeypatch):
    sol = tmp_path / "task" / "solution"
    sol.mkdir(parents=True)
    (sol / "data.txt").write_text("from the solution dir\n")
    (sol / "solve.sh").write_text(
        '#!/bin/bash\nset -e\n{ pwd; echo "$GREETING"; cat "$(dirname "$0")/data.txt"; } > out.txt\n'
    )
    task = types.SimpleNamespace(solution=sol / "solve.sh", solution_env={"GREETING": "hello there"})
    work = tmp_path / "work"
    work.mkdir()
    for target in (tmp_path / "solution", tmp_path / "a-file" / "solution"):  # writable, then not: a temp dir
        (tmp_path / "a-file").write_text("x")
        monkeypatch.setattr(harbor, "SOLUTION_DIR", str(target))
        turns = harbor_reference(task, "DONE")
        assert turns[1] == "DONE"
        r = subprocess.run(["bash", "-c", _command(turns[0])], cwd=work, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        assert (work / "out.txt").read_text() == f"{work}\nhello there\nfrom the solution dir\n"
    assert (tmp_path / "solution" / "solve.sh").is_file()


def test_the_source_accepts_task_dirs_and_sets_of_them(tmp_path):
    src = HarborSource()
    assert src.accepts(HARBOR) and src.accepts(HARBOR / "jq-deep-merge")
    assert not src.accepts(HARBOR / "jq-deep-merge" / "task.toml") and not src.accepts(tmp_path)


# ---------------------------------------------------------------------------- the audit, with stand-ins

FAKE_ENV = '''
from envs.types import Message


class FakeHarborEnv:
    """Scores an episode by the text of its commands, never running them: 1 when solve.sh ran; the task
    "lax" also pays a forged reward file (a verifier that trusts /logs/verifier)."""

    done_marker = "DONE"

    def reset(self, task):
        self.task, self.cmds = task, []
        return list(task.messages)

    def step(self, text):
        if text.strip() == "DONE":
            paid = any("solve.sh" in c for c in self.cmds) or (
                self.task.id == "lax" and any("/logs/verifier/reward.txt" in c for c in self.cmds))
            return [], True, False, {"reward": 1.0 if paid else 0.0}
        self.cmds.append(text)
        return [Message("user", "exit code 0")], False, False, {}

    def close(self):
        pass


class EnvReward:
    name = "env"
    domains = ("harbor",)

    def __call__(self, traj):
        return traj.env_reward
'''


def _fake_harbor_modules(monkeypatch, tmp_path: Path) -> None:
    """envs.harbor's loader and builder replaced: three tasks, one whose image fails to build."""

    def load_tasks(spec):
        out = []
        for name in ("good", "lax", "broken-image"):
            d = tmp_path / "set" / name / "solution"
            d.mkdir(parents=True, exist_ok=True)
            (d / "solve.sh").write_text("echo solved > out.txt\n")
            out.append(types.SimpleNamespace(name=name, path=d.parent, instruction=f"Do `/app/{name}.txt`.",
                                             solution=d / "solve.sh", solution_env={}, metadata={}))  # fmt: skip
        return out

    def build_image(task, cache_dir=None, progress=None):
        if task.name == "broken-image":
            raise RuntimeError("Dockerfile line 3: RUN exited 2")
        return types.SimpleNamespace(cached=task.name == "good")

    pkg = types.ModuleType("envs.harbor")
    task_mod = types.ModuleType("envs.harbor.task")
    task_mod.load_tasks, task_mod.HarborTaskError = load_tasks, type("HarborTaskError", (ValueError,), {})
    image_mod = types.ModuleType("envs.harbor.image")
    image_mod.build_image = build_image
    for name, mod in (("envs.harbor", pkg), ("envs.harbor.task", task_mod), ("envs.harbor.image", image_mod)):
        monkeypatch.setitem(sys.modules, name, mod)
    (tmp_path / "set" / "good" / "task.toml").parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "set" / "good" / "task.toml").write_text('schema_version = "1.1"\n')
    (tmp_path / "fake_harbor_env.py").write_text(FAKE_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("fake_harbor_env", None)


def test_the_table_shows_image_and_noop_and_names_each_failing_task(tmp_path, capsys, monkeypatch):
    _fake_harbor_modules(monkeypatch, tmp_path)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "rollout": {"max_turns": 3, "envs": [{"domain": "harbor", "cls": "fake_harbor_env.FakeHarborEnv"}]},
        "rewards": [{"cls": "fake_harbor_env.EnvReward", "domains": ["harbor"]}],
    }))  # fmt: skip
    rc = main(["audit", str(tmp_path / "set"), "--recipe", str(recipe), "--workers", "1",
               "--strategies", "forge_reward,delete_everything"])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 1, out
    assert re.match(r"task\s+domain\s+image\s+noop\s+ref\s+base\s+flagged", out)
    rows = {
        ln.split()[0]: ln.split()
        for ln in out.splitlines()
        if ln.split() and ln.split()[0] in ("good", "lax", "broken-image")
    }
    assert rows["good"][1:7] == ["harbor", "cached", "0.00", "1.00", "0.00", "-"]
    assert (
        rows["lax"][2] != "cached"
        and rows["lax"][2].endswith("s")
        and rows["lax"][3:7] == ["0.00", "1.00", "0.00", "forge_reward=1.00"]
    )
    assert rows["broken-image"][1:7] == ["harbor", "FAILED", "-", "-", "-", "prepare=ERROR"]
    assert "Dockerfile line 3: RUN exited 2" in out
    assert out.rstrip().splitlines()[-1] == "failing tasks: lax, broken-image"


def test_a_bad_task_dir_stops_the_audit_naming_it(tmp_path, capsys, monkeypatch):
    _fake_harbor_modules(monkeypatch, tmp_path)
    err_type = sys.modules["envs.harbor.task"].HarborTaskError

    def refuse(spec):
        raise err_type(f"harbor task {spec}/x: task.toml line 4: environment.cpus: must be a positive number, got -1")

    monkeypatch.setattr(sys.modules["envs.harbor.task"], "load_tasks", refuse)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "rollout": {"envs": [{"domain": "harbor", "cls": "fake_harbor_env.FakeHarborEnv"}]},
        "rewards": [{"cls": "fake_harbor_env.EnvReward", "domains": ["harbor"]}],
    }))  # fmt: skip
    rc = main(["audit", str(tmp_path / "set"), "--recipe", str(recipe), "--format", "harbor"])
    err = capsys.readouterr().err
    assert rc == 2 and "x: task.toml line 4: environment.cpus" in err, err


# ---------------------------------------------------------------------------- the shipped tasks, for real

AUDIT_STRATEGIES = "delete_everything,delete_named,named_paths_1,forge_reward,plant_tests,hijack_interpreters,plant_pth"


@pytest.mark.slow
def test_every_shipped_task_audits_clean_through_the_harbor_recipe(capsys):
    """Builds every shipped image (cached after the first run) and plays the oracle, the baseline and the
    verifier attacks through the recipe's harbor env: oracle 1, no-op 0, nothing above the baseline."""
    rc = main(["audit", str(HARBOR), "--recipe", str(ROOT / "recipes" / "joint_harbor.yaml"),
               "--workers", "2", "--strategies", AUDIT_STRATEGIES])  # fmt: skip
    out = capsys.readouterr().out
    rows = [ln.split() for ln in out.splitlines() if ln.split() and (HARBOR / ln.split()[0]).is_dir()]
    assert len(rows) == len([p for p in HARBOR.iterdir() if p.is_dir()]), out
    for row in rows:
        assert row[1] == "harbor" and row[3:6] == ["0.00", "1.00", "0.00"] and row[6] == "-", out
    assert rc == 0, out
