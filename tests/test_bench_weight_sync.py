"""The weight export bench/weight_sync.py measures: ``Learner.export_weights`` writes into two
preallocated, memory-mapped safetensors files and publishes one by an atomic rename.

Fast (tiny model, no engine): what the engines read must be right after every export, a file a
reader opened must not change under it at the next export, and a dtype switch or a wiped
shared-memory folder must not break the next export.
"""

from __future__ import annotations

import os
import shutil

import torch

from rl.config.recipe import AlgoConfig, ModelConfig
from rl.trainer.learner import Learner


def _expected(lrn: Learner, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    sd = {k: v.detach().to(dtype) for k, v in lrn.model.state_dict().items()}
    sd["lm_head.weight"] = lrn.model.get_output_embeddings().weight.detach().to(dtype)
    return sd


def _check(path: str, want: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import load_file

    got = load_file(path)
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k


def test_export_double_buffered(tiny_model_path, tmp_path) -> None:
    shm = tmp_path / "shm"
    lrn = Learner(tiny_model_path, ModelConfig(), AlgoConfig(), seed=0, threads=1, shm_dir=str(shm))
    try:
        p1 = lrn.export_weights()
        _check(p1, _expected(lrn, torch.bfloat16))
        first = open(p1, "rb")  # a reader holding the file published by export 1
        before = first.read()
        first.seek(0)

        with torch.no_grad():
            lrn.model.get_input_embeddings().weight.add_(0.5)  # the tied head moves with it
            lrn.model.model.norm.weight.mul_(2.0)
        p2 = lrn.export_weights()
        assert p2 == p1
        _check(p2, _expected(lrn, torch.bfloat16))
        assert first.read() == before  # export 2 wrote the other file: the reader's bytes are intact
        first.close()

        _check(lrn.export_weights("float32"), _expected(lrn, torch.float32))  # new layout
        _check(lrn.export_weights(), _expected(lrn, torch.bfloat16))
        names = sorted(os.listdir(shm))
        assert names == [".policy.safetensors.slot0", ".policy.safetensors.slot1", "policy.safetensors"], names

        shutil.rmtree(shm)  # the folder wiped under a live learner: the next export recreates its files
        with torch.no_grad():
            lrn.model.model.norm.weight.add_(1.0)
        _check(lrn.export_weights(), _expected(lrn, torch.bfloat16))
        _check(lrn.export_weights(), _expected(lrn, torch.bfloat16))
    finally:
        lrn.shutdown()
