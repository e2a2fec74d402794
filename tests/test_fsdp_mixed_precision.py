"""FSDP2's mixed-precision policy (``rl.trainer.fsdp.shard(bf16_compute=True)``), run for real on CPU.

The learner uses the policy on CUDA (bf16 parameters in compute, fp32 gradient reduction, fp32
master weights) instead of autocast. No GPU is lent to this project, so these tests run the same
``fully_shard`` policy over gloo on two CPU processes (torch.multiprocessing, no Ray) on the tiny
Qwen2: the compute really is bf16 (logits come out bf16), what is kept and stepped is fp32, and the
gradients are within bf16 rounding (5%) of both an unsharded fp32 and an unsharded bf16 model's, yet
differ from the fp32 model's by more than 10x what the sharded fp32 run does (so the test would
notice a policy that silently computed in fp32). NCCL and CUDA are not exercised here.
"""

from __future__ import annotations

import pytest
import torch
from conftest import gloo_ranks

pytestmark = pytest.mark.slow

TOKENS = [[5, 17, 42, 99, 3, 250, 7, 11, 64, 128, 31, 2], [8, 77, 15, 200, 6, 19, 44, 90, 13, 5, 120, 9]]


def _loss(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, torch.dtype]:
    logits = model(input_ids=ids).logits
    lp = torch.log_softmax(logits.float()[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return -lp.mean(), logits.dtype


def _model(path: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="eager")


def _rank(rank: int, port: int, path: str, out: str, bf16: bool) -> None:
    import os

    import torch.distributed as dist

    from rl.trainer import fsdp

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    try:
        model = fsdp.shard(_model(path), bf16_compute=bf16)
        ids = torch.tensor(TOKENS)[rank : rank + 1]  # each rank its own row: the SUM reduction adds them
        loss, logits_dtype = _loss(model, ids)
        loss.backward()
        kept = {n: (p.dtype, p.grad.dtype) for n, p in model.named_parameters()}
        grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
        before = {n: p.full_tensor().clone() for n, p in model.named_parameters()}
        torch.optim.SGD(model.parameters(), lr=0.1).step()
        after = {n: p.full_tensor() for n, p in model.named_parameters()}
        if rank == 0:
            torch.save(
                {"logits_dtype": logits_dtype, "kept": kept, "grads": grads, "before": before, "after": after},
                f"{out}/rank0.pt",
            )
    finally:
        dist.destroy_process_group()


def _run(tmp_path, path: str, bf16: bool) -> dict:
    import torch.multiprocessing as mp

    from rl.trainer.collectives import free_port

    d = tmp_path / ("bf16" if bf16 else "fp32")
    d.mkdir()
    mp.spawn(_rank, args=(free_port(), path, str(d), bf16), nprocs=2)
    return torch.load(d / "rank0.pt", weights_only=False)


def _reference_grads(path: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """One unsharded model computing in ``dtype``: the sum over both rows' losses (as the ranks' SUM)."""
    model = _model(path).to(dtype)
    total = sum(_loss(model, torch.tensor(TOKENS)[i : i + 1])[0] for i in range(2))
    total.backward()
    return {n: p.grad.float() for n, p in model.named_parameters()}


def _rel(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    num = sum(float((a[k] - b[k]).norm() ** 2) for k in a) ** 0.5
    return num / sum(float(b[k].norm() ** 2) for k in b) ** 0.5


@gloo_ranks
def test_fsdp_bf16_policy_computes_in_bf16_and_keeps_fp32_master_weights(tiny_model_path, tmp_path):
    torch.set_num_threads(1)
    mixed = _run(tmp_path, tiny_model_path, bf16=True)
    plain = _run(tmp_path, tiny_model_path, bf16=False)
    assert mixed["logits_dtype"] == torch.bfloat16, "the policy's bf16 parameters reach the compute"
    assert plain["logits_dtype"] == torch.float32
    # Kept (sharded) parameters and their reduced gradients are fp32: the master copy.
    assert mixed["kept"] and all(v == (torch.float32, torch.float32) for v in mixed["kept"].values())
    ref32 = _reference_grads(tiny_model_path, torch.float32)
    ref16 = _reference_grads(tiny_model_path, torch.bfloat16)
    assert mixed["grads"].keys() == ref32.keys()
    err_plain = _rel(plain["grads"], ref32)  # sharding alone: fp32 rounding
    err_mixed32 = _rel(mixed["grads"], ref32)  # bf16 compute against fp32
    err_mixed16 = _rel(mixed["grads"], ref16)  # bf16 compute against bf16 compute
    assert err_plain < 1e-5, err_plain
    assert err_mixed32 > 10 * err_plain, (err_mixed32, err_plain)  # the compute really was bf16
    assert err_mixed16 < 0.05 and err_mixed32 < 0.05, (err_mixed16, err_mixed32)
    # The optimizer stepped the fp32 master weights by lr x the fp32 gradient (not a bf16-rounded step).
    for n, g in mixed["grads"].items():
        torch.testing.assert_close(mixed["after"][n], mixed["before"][n] - 0.1 * g, rtol=0, atol=1e-6)
    assert all(v.dtype == torch.float32 for v in mixed["after"].values())
