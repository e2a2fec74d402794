"""``jointrl export RUN_DIR`` (rl/cli/export.py): a run's checkpoint as an HF folder that transformers and vLLM load.

A learner takes an SGD step (so the weights are not the base's), writes its checkpoint the way a
run does (``checkpoints/step_N`` + ``step.json``, ``recipe.resolved.yaml``), and the exported
folder's log-probs equal the learner's: full fine-tuning, LoRA (merged), 2 FSDP ranks (slow), and
in a vLLM engine (slow).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from rl.cli.main import main
from rl.config.recipe import AlgoConfig, KLConfig, LearnerConfig, LoraConfig, OptimConfig
from test_learner import PROMPT_A, enc, make_batch, make_learner, use_sgd  # noqa: F401 (fixture)
from conftest import gloo_ranks

ALGO = AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-2), kl=KLConfig(coef=0.1))
LORA = LoraConfig(rank=4, alpha=8.0)


def _write_run(run: Path, save, step: int, lora: LoraConfig | None = None) -> Path:
    """A run dir as rl.driver.checkpoints writes it: the recipe, and checkpoints/step_N with step.json."""
    run.mkdir(parents=True, exist_ok=True)
    learner = {"lora": {"rank": lora.rank, "alpha": lora.alpha}} if lora else {}
    (run / "recipe.resolved.yaml").write_text(yaml.safe_dump({"model": {"path": "embedded:tiny"}, "learner": learner}))
    ck = run / "checkpoints" / f"step_{step:06d}"
    save(str(ck))
    (ck / "step.json").write_text(json.dumps({"step": step}))
    return ck


def _hf_logprobs(folder: Path, prompt: list[int], cont: list[int]) -> list[float]:
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = m(input_ids=torch.tensor([prompt + cont])).logits[0, len(prompt) - 1 : -1].float()
    return logits.log_softmax(-1).gather(-1, torch.tensor(cont)[:, None]).squeeze(-1).tolist()


def _trained(make_learner, tok, lora: LoraConfig | None = None):
    lrn = make_learner(ALGO, learner=LearnerConfig(lora=lora) if lora else None)
    use_sgd(lrn, lr=0.5)
    lrn.step(make_batch(tok))
    return lrn


def _tokens(tok) -> tuple[list[int], list[int]]:
    return enc(tok, PROMPT_A), enc(tok, "get weather Paris in celsius") + [tok.eos_token_id]


def test_export_full_equals_learner(make_learner, tiny_tokenizer, tiny_model_path, tmp_path, capsys):
    lrn = _trained(make_learner, tiny_tokenizer)
    _write_run(tmp_path / "run", lrn.save_checkpoint, 1)
    _write_run(tmp_path / "run", lrn.save_checkpoint, 2)
    out = tmp_path / "hf"
    assert main(["export", str(tmp_path / "run"), "--out", str(out), "--dtype", "float32"]) == 0
    assert f"exported: {out}" in capsys.readouterr().out
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    prompt, cont = _tokens(tiny_tokenizer)
    want = lrn.logprobs(prompt, cont)
    assert _hf_logprobs(out, prompt, cont) == pytest.approx(want, abs=1e-5)
    assert _hf_logprobs(Path(tiny_model_path), prompt, cont) != pytest.approx(want, abs=1e-3)  # not the base
    # default: the newest checkpoint into RUN_DIR/export/step_N, in bfloat16
    assert main(["export", str(tmp_path / "run")]) == 0
    bf16 = tmp_path / "run" / "export" / "step_000002"
    cfg = json.loads((bf16 / "config.json").read_text())
    assert cfg.get("dtype", cfg.get("torch_dtype")) == "bfloat16"
    from safetensors.torch import load_file

    assert {t.dtype for t in load_file(bf16 / "model.safetensors").values()} == {torch.bfloat16}
    # the checkpoint has no model/ (not the run's last one): the bf16 export of its sharded state follows the
    # learner to bf16 rounding of the weights, and is still not the base
    assert not (tmp_path / "run" / "checkpoints" / "step_000002" / "model").exists()
    got = _hf_logprobs(bf16, prompt, cont)
    assert got == pytest.approx(want, abs=0.05) and got != pytest.approx(
        _hf_logprobs(Path(tiny_model_path), prompt, cont), abs=1e-3
    )


def test_export_lora_merged_equals_learner(make_learner, tiny_tokenizer, tiny_model_path, tmp_path):
    lrn = _trained(make_learner, tiny_tokenizer, LORA)
    _write_run(tmp_path / "run", lrn.save_checkpoint, 3, LORA)
    out = tmp_path / "hf"
    assert main(["export", str(tmp_path / "run"), "--out", str(out), "--dtype", "float32", "--step", "3"]) == 0
    assert not any("adapter" in p.name for p in out.iterdir())  # merged: a plain HF model
    prompt, cont = _tokens(tiny_tokenizer)
    want = lrn.logprobs(prompt, cont)
    assert _hf_logprobs(out, prompt, cont) == pytest.approx(want, abs=1e-5)
    assert _hf_logprobs(Path(tiny_model_path), prompt, cont) != pytest.approx(want, abs=1e-4)


def test_export_errors_name_the_file(make_learner, tiny_tokenizer, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    assert main(["export", str(run)]) == 2
    assert f"jointrl: error: {run / 'checkpoints'}: no checkpoint" in capsys.readouterr().err
    lrn = make_learner(ALGO)
    _write_run(run, lrn.save_checkpoint, 4)
    assert main(["export", str(run), "--step", "7"]) == 2
    assert f"{run / 'checkpoints' / 'step_000007'}: no complete checkpoint of step 7 (steps with one: 4)" in (
        capsys.readouterr().err
    )
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("")
    assert main(["export", str(run), "--out", str(busy)]) == 2
    assert f"{busy}: exists and is not empty" in capsys.readouterr().err
    import shutil

    shutil.rmtree(run / "checkpoints" / "step_000004" / "dcp")
    assert main(["export", str(run)]) == 2
    assert f"{run / 'checkpoints' / 'step_000004' / 'dcp' / '.metadata'}: not found" in capsys.readouterr().err
    assert not (run / "export" / "step_000004").exists()


def _sharded_rank(rank: int, port: int, path: str, out: str) -> None:
    """One of 2 FSDP learners: one SGD step, a sharded checkpoint (every rank), rank 0's gathered weights."""
    from transformers import AutoTokenizer

    from rl.trainer.sharding import shard_batch
    from rl.trainer.learner import Learner
    from test_dp import _state, _use_sgd, dp_batch
    from test_learner import MODEL_CFG

    tok = AutoTokenizer.from_pretrained(path)
    lrn = Learner(path, MODEL_CFG, ALGO, threads=1, rank=rank, world_size=2, dist_port=port, shm_dir=f"{out}/shm{rank}")
    _use_sgd(lrn)
    lrn.step(shard_batch(dp_batch(tok, False), 2)[rank])
    ck = Path(out) / "run" / "checkpoints" / "step_000001"
    lrn.save_checkpoint(str(ck))
    state = _state(lrn)
    if rank == 0:
        (ck / "step.json").write_text(json.dumps({"step": 1}))
        torch.save({k: v for k, v in state.items() if not k.startswith("grad.")}, f"{out}/rank0.pt")
    lrn.shutdown()


@pytest.mark.slow
@gloo_ranks
def test_export_sharded_checkpoint(tiny_model_path, tmp_path):
    """A checkpoint written by 2 FSDP ranks (each its shard, through torch.distributed.checkpoint) exports
    the weights the ranks held, gathered."""
    import torch.multiprocessing as mp
    from safetensors.torch import load_file

    from rl.trainer.collectives import free_port

    run = tmp_path / "run"
    run.mkdir()
    (run / "recipe.resolved.yaml").write_text(yaml.safe_dump({"model": {"path": "embedded:tiny"}}))
    mp.spawn(_sharded_rank, args=(free_port(), tiny_model_path, str(tmp_path)), nprocs=2)
    assert len(list((run / "checkpoints" / "step_000001" / "dcp").glob("*.distcp"))) == 2  # one file per rank
    assert main(["export", str(run), "--out", str(tmp_path / "hf"), "--dtype", "float32"]) == 0
    want = torch.load(tmp_path / "rank0.pt")
    got = load_file(tmp_path / "hf" / "model.safetensors")
    assert got.keys() <= want.keys() and "model.norm.weight" in got
    for k, v in got.items():
        torch.testing.assert_close(v, want[k], rtol=0, atol=0, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.slow
def test_export_loads_in_vllm(make_learner, tiny_tokenizer, tmp_path):
    """The exported folder serves in vLLM (CPU, float32): its prompt log-probs equal the learner's."""
    from rollout.engine import VLLMEngine

    lrn = _trained(make_learner, tiny_tokenizer, LORA)
    _write_run(tmp_path / "run", lrn.save_checkpoint, 1, LORA)
    out = tmp_path / "hf"
    assert main(["export", str(tmp_path / "run"), "--out", str(out), "--dtype", "float32"]) == 0
    prompt, cont = _tokens(tiny_tokenizer)
    engine = VLLMEngine(str(out), dtype="float32", max_model_len=512, kv_cache_gib=0.25)
    try:
        got = engine.score(prompt, cont)
    finally:
        engine.shutdown()
    assert got == pytest.approx(lrn.logprobs(prompt, cont), abs=1e-4)
