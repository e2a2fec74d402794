"""The HF export off the save path (``rl.trainer.checkpoint``, ``rl.cli.export.checkpoint_model``).

A run's checkpoints hold the sharded state only; the last one also holds ``model/``, the policy as an HF folder
in the engines' dtype (bf16 here, over an fp32 learner), bit for bit what ``jointrl export`` writes from the same
checkpoint's ``dcp/``. ``jointrl eval`` on an intermediate checkpoint exports it once into
``RUN_DIR/export/step_N`` (said on stderr) and evaluates that; ``jointrl score --tokenizer`` takes the
checkpoint too (the run's base tokenizer, nothing exported).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from test_learner import make_batch, make_learner, use_sgd  # noqa: F401 (fixture)
from test_loop_inprocess import _cfg, local, user_rewards  # noqa: F401 (fixture)

from rl.cli.eval import resolve_model_arg
from rl.cli.main import main
from rl.config.recipe import AlgoConfig, OptimConfig
from rl.driver.loop import train


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out |= load_file(f)
    return out


def test_a_save_writes_model_only_when_asked_in_that_dtype(make_learner, tiny_tokenizer, tmp_path):
    """A plain save has no ``model/``; with ``export_dtype`` it holds the learner's weights cast to that dtype
    (config.json says so), and the sharded state is the same either way."""
    lrn = make_learner(AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-2)))
    use_sgd(lrn, lr=0.5)
    lrn.step(make_batch(tiny_tokenizer))
    lrn.save_checkpoint(str(tmp_path / "a"))
    lrn.save_checkpoint(str(tmp_path / "b"), export_dtype="bfloat16")
    assert not (tmp_path / "a" / "model").exists()
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == sorted(
        [p.name for p in (tmp_path / "a").iterdir()] + ["model"]
    )
    cfg = json.loads((tmp_path / "b" / "model" / "config.json").read_text())
    assert cfg["dtype"] == "bfloat16"
    got = _tensors(tmp_path / "b" / "model")
    want = {k: v.detach() for k, v in lrn.model.state_dict().items()}
    assert got and set(got) <= set(want)
    for k, v in got.items():
        assert v.dtype == torch.bfloat16 and torch.equal(v, want[k].to(torch.bfloat16)), k
    assert (tmp_path / "b" / "model" / "tokenizer_config.json").is_file()


def test_run_exports_only_its_last_checkpoint_and_eval_exports_the_others(
    tmp_path: Path,
    recipe_copy,
    user_rewards,
    capsys,  # noqa: F811
) -> None:
    cfg = _cfg(
        recipe_copy,
        run={"save_every": 1, "keep_checkpoints": 2},
        train={"steps": 2},
        model={"engine_dtype": "bfloat16"},
    )
    out = train(cfg, progress=False, runtime=local)
    ck1, ck2 = out / "checkpoints" / "step_000001", out / "checkpoints" / "step_000002"
    assert not (ck1 / "model").exists() and (ck1 / "dcp" / ".complete").is_file()
    assert json.loads((ck2 / "model" / "config.json").read_text())["dtype"] == "bfloat16"  # the engines' dtype
    # the learner's export is what `jointrl export` makes of the same checkpoint's sharded state
    assert main(["export", str(out), "--step", "2", "--out", str(tmp_path / "x2")]) == 0
    a, b = _tensors(ck2 / "model"), _tensors(tmp_path / "x2")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == torch.bfloat16 for k in a)
    capsys.readouterr()

    # eval's --model on the intermediate checkpoint: exported once into RUN_DIR/export/step_N, then reused
    dest = out / "export" / "step_000001"
    assert resolve_model_arg(str(ck1)) == (str(dest), out)
    assert f"{ck1} has no model/" in capsys.readouterr().err and (dest / "config.json").is_file()
    assert resolve_model_arg(str(ck1 / "model")) == (str(dest), out)  # the documented path, reused
    assert capsys.readouterr().err == ""
    assert resolve_model_arg(str(out)) == (str(ck2 / "model"), out)  # the run dir: its newest checkpoint
    recipe = yaml.safe_load((out / "recipe.resolved.yaml").read_text())["source"]  # the recipe the run read
    rc = main(["eval", str(recipe), "--model", str(ck1), "--engine", "hf", "--limit", "2", "--k", "1"])
    got, err = capsys.readouterr()
    assert rc == 0, err
    assert json.loads(got)["model"] == str(dest)

    # score's --tokenizer on the intermediate checkpoint: the run's tokenizer, nothing exported
    from rl.cli.export import tokenizer_folder
    from rl.trainer.hub import resolve_model

    assert tokenizer_folder(ck1) == resolve_model(cfg.model.path) == tokenizer_folder(ck1 / "model")
    assert tokenizer_folder(ck2) == str(ck2 / "model") and tokenizer_folder(tmp_path) is None


def test_a_checkpoint_outside_a_run_names_the_command(tmp_path, capsys):
    ck = tmp_path / "somewhere" / "step_000003"
    (ck / "dcp").mkdir(parents=True)
    (ck / "step.json").write_text('{"step": 3}')
    from rl.cli.common import CommandError

    with pytest.raises(CommandError, match="no model/ .* not a complete checkpoint of a run dir"):
        resolve_model_arg(str(ck))
