"""``docs/recipe-reference.md`` is generated from rl/config/recipe.py and must not go stale."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import yaml

from rl.config import recipe as config
from rl.config.docgen import field_docs, main, recipe_reference, reference_path
from rl.config.fields import Section, hints, knob

ROOT = Path(__file__).resolve().parents[1]


def test_recipe_reference_is_up_to_date() -> None:
    path = reference_path()
    assert path == ROOT / "docs" / "recipe-reference.md"
    assert path.is_file(), "docs/recipe-reference.md is missing: run `.venv/bin/python -m rl.config.docgen`"
    assert path.read_text() == recipe_reference(), (
        "docs/recipe-reference.md is stale (rl/config/recipe.py changed): run `.venv/bin/python -m rl.config.docgen`"
    )


def _keys(cls: type, prefix: str) -> list[str]:
    out = []
    for f in dataclasses.fields(cls):
        if f.name == "source":
            continue
        t = hints(cls)[f.name]
        if dataclasses.is_dataclass(t):
            out += _keys(t, f"{prefix}{f.name}.")
        else:
            args = getattr(t, "__args__", ())
            if not (prefix == "" and args):  # a top-level list (rewards) is a section, not a row
                out.append(prefix + f.name)
            if args and dataclasses.is_dataclass(args[0]):
                out += _keys(args[0], f"{prefix}{f.name}.<i>.")
    return out


def test_every_key_is_listed_with_type_default_and_doc() -> None:
    text = recipe_reference()
    cells = [
        [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in text.splitlines() if line.startswith("| `")
    ]
    rows = {c[0].strip("`"): c[1:] for c in cells}
    keys = _keys(config.Recipe, "")
    assert "rewards.<i>.cls" in keys and "rollout.envs.<i>.domain" in keys
    assert set(keys) <= set(rows), set(keys) - set(rows)
    assert rows["run.seed"] == ["`int`", "`0`", "", "seeds task order, sampling and torch"]
    assert rows["run.threads"][2] == ">= 0" and rows["algo.loss.clip_low"][2] == "in [0, 1)"
    assert rows["algo.optim.lr"][:2] == ["`float`", "`1.0e-05`"]
    assert rows["run.ray_address"][1] == '`""`'
    assert rows["algo.loss.agg"][0] == (
        "`auto \\| token-mean \\| seq-mean-token-mean \\| seq-mean-token-sum \\| seq-mean-token-sum-norm`"
    )  # Literal choices, pipes escaped
    assert rows["rollout.envs"][1] == "`[{domain: tool_call, cls: envs.toolcall.ToolCallEnv, kwargs: {}, stop: []}]`"

    # Every key of the shipped recipes is documented.
    def walk(node, prefix):
        if isinstance(node, dict):
            for k, v in node.items():
                key = f"{prefix}{k}"
                if key.endswith((".kwargs", ".domain_weights", ".engine_kwargs")):  # free-form mappings
                    yield key
                elif isinstance(v, dict) or (isinstance(v, list) and v and isinstance(v[0], dict)):
                    yield from walk(v, key + ".")
                else:
                    yield key
        elif isinstance(node, list):
            for item in node:
                yield from walk(item, prefix + "<i>.")

    for recipe in sorted((ROOT / "recipes").glob("*.yaml")):
        for key in walk(yaml.safe_load(recipe.read_text()), ""):
            assert key in rows, f"{recipe.name}: {key} is not in the reference"


@dataclasses.dataclass(frozen=True)
class _Inner(Section):
    y: str = knob("a", "about y")


@dataclasses.dataclass(frozen=True)
class _Outer(Section):
    x: int = knob(1, "the x | with a pipe", ge=0)
    z: float = 0.5
    inner: _Inner = knob(doc="a section", factory=_Inner)


def test_doc_lines_come_from_the_field_declarations() -> None:
    assert field_docs(_Outer) == {
        ("_Outer", "x"): "the x | with a pipe",
        ("_Outer", "z"): "",
        ("_Outer", "inner"): "a section",
        ("_Inner", "y"): "about y",
    }


def test_every_field_of_the_recipe_has_a_doc() -> None:
    missing = [k for k, d in field_docs().items() if not d]
    assert not missing, missing


def test_check_mode(tmp_path: Path, monkeypatch, capsys) -> None:
    target = tmp_path / "docs" / "recipe-reference.md"
    monkeypatch.setattr("rl.config.docgen.reference_path", lambda: target)
    assert main(["--check"]) == 1 and "run `.venv/bin/python -m rl.config.docgen`" in capsys.readouterr().err
    assert main([]) == 0 and target.read_text() == recipe_reference()
    assert main(["--check"]) == 0


def _blocks(md: str, lang: str) -> list[str]:
    return re.findall(r"```" + lang + r"\n(.*?)```", md, flags=re.S)


def test_envs_doc_example_works(tmp_path: Path, monkeypatch) -> None:
    """The arith example of docs/envs.md: the env honours the contract, the reward scores, the recipe validates."""
    from envs.base import check_env
    from envs.io import load_tasks
    from envs.types import Message, Trajectory
    from rl.config.recipe import load_recipe, validate_recipe

    md = (ROOT / "docs" / "envs.md").read_text()
    code = next(b for b in _blocks(md, "python") if "class ArithEnv" in b)
    tasks = next(b for b in _blocks(md, "json") if '"domain": "arith"' in b)
    recipe = next(b for b in _blocks(md, "yaml") if "my_domain.arith.ArithEnv" in b)
    pkg = tmp_path / "my_domain"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "arith.py").write_text(code)
    for name in ("arith.train.jsonl", "arith.eval.jsonl"):
        (tmp_path / name).write_text(tasks)
    (tmp_path / "arith.yaml").write_text(recipe)
    monkeypatch.syspath_prepend(str(tmp_path))
    from my_domain.arith import ArithEnv, ArithReward

    ts = load_tasks(tmp_path / "arith.train.jsonl")
    check_env(ArithEnv(), ts[0], action="42")

    def answer(text: str) -> Trajectory:
        return Trajectory(
            task=ts[0],
            group_id=0,
            prompt_ids=[],
            response_ids=[],
            loss_mask=[],
            logprobs=[],
            messages=[*ts[0].messages, Message("assistant", text)],
            terminated=True,
            truncated=False,
            finish_reason="stop",
        )

    assert ArithReward()(answer("17 + 25 = 42")) == 1.0 and ArithReward()(answer("It is 41")) == 0.0
    cfg = load_recipe(tmp_path / "arith.yaml", [f"run.output_dir={tmp_path / 'out'}"])
    validate_recipe(cfg)
