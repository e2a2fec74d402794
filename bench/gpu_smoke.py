"""GPU smoke test: the three GPU paths of a jointrl step, in one process, with timings.

NEVER RUN YET: the one GPU machine lent so far had no vLLM (its learner stages ran there through
``bench/gpu_learner.py``, which needs no engine). Expect to fix things on the first run with vLLM;
every stage prints PASS/FAIL and its time, and a failing stage does not hide the others' results.

Stages (``--model`` default ``embedded:tiny``, any local HF folder works, e.g. Qwen2.5-1.5B):

1. **generate**: a CUDA vLLM engine (bf16, ``enable_sleep_mode``, a ``weight_transfer_config``)
   samples ``--prompts`` x ``--max-tokens`` tokens; prints tokens/s.
2. **learner step**: jointrl's ``rl.trainer.learner.Learner`` (fp32 master weights, bf16 autocast,
   AdamW, GRPO loss with a k3 KL to the bf16 reference) takes ``--steps`` steps on those
   samples (random advantages, ``--lr``, large enough to move the logprobs); prints s/step.
3. **weight sync round trip**: the updated learner weights go into the running engine, and
   the engine's logprobs of a sampled continuation are compared with the learner's before
   and after (the gap must shrink to bf16 noise). Transports (``--transport``):
   ``nccl`` (vLLM's ``NCCLTrainerWeightTransferEngine``: a torch/NCCL broadcast from this
   process, learner on ``cuda:1``, into the engine worker on ``cuda:0``; needs 2 GPUs
   because NCCL refuses two ranks on one device, "Duplicate GPU detected"), ``ipc``
   (vLLM's CUDA-IPC engine: same GPU, the worker maps the learner's tensors), ``file``
   (what jointrl does today: ``Learner.export_weights`` into /dev/shm, then the engine reloads
   the file). ``auto`` = nccl with 2+ GPUs, else ipc; ``file`` always runs too, for comparison.
4. **sleep/wake** (the colocated placement's cycle): ``llm.sleep(level=1)``, the GPU memory
   freed, ``llm.wake_up()``, and a generate after it.

    JOINTRL_DEVICE=gpu bash .ci/install.sh
    .venv/bin/python bench/gpu_smoke.py                                 # tiny model, 1 GPU: ipc + file
    .venv/bin/python bench/gpu_smoke.py --model /models/Qwen2.5-1.5B-Instruct --transport nccl   # 2 GPUs
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault(
    "VLLM_ALLOW_INSECURE_SERIALIZATION", "1"
)  # file reload runs our function in the worker; IPC handles pickle
os.environ.setdefault("NCCL_CUMEM_ENABLE", "0")  # vLLM's own setting: both NCCL ends must agree
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RESULTS: list[tuple[str, str, str]] = []  # (stage, PASS/FAIL/SKIP, detail)


def stage(name: str):
    """Decorator-free helper: ``with stage("x") as st: ...; st.detail = "..."``; records PASS/FAIL and time."""

    class _S:
        detail = ""

        def __enter__(self):
            self.t0 = time.perf_counter()
            print(f"== {name}", flush=True)
            return self

        def __exit__(self, et, e, tb):
            dt = time.perf_counter() - self.t0
            if e is None:
                RESULTS.append((name, "PASS", f"{dt:.2f}s {self.detail}"))
            else:
                traceback.print_exception(et, e, tb)
                RESULTS.append(
                    (name, "FAIL", f"{dt:.2f}s {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
                )
            print(f"   {RESULTS[-1][1]} {RESULTS[-1][2]}", flush=True)
            return True  # keep going: later stages still report

    return _S()


class LLMClient:
    """vLLM's ``VLLMWeightSyncClient`` protocol over an in-process ``vllm.LLM`` (its RL methods take requests)."""

    def __init__(self, llm) -> None:
        self.llm = llm

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.llm.init_weight_transfer_engine({"init_info": init_info})

    def shutdown_weight_transfer_engine(self) -> None:
        self.llm.shutdown_weight_transfer_engine()

    def start_weight_update(self) -> None:
        self.llm.start_weight_update()

    def update_weights(self, update_info) -> None:
        self.llm.update_weights({"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.llm.finish_weight_update(weight_version)


def bf16_source(model):
    """A vLLM ``WeightSource`` over the learner's parameters, sent as bf16 (the engine's dtype), with
    ``lm_head.weight`` added when tied (as ``export_weights`` does)."""
    import torch
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class Bf16(WeightSource):
        def _named(self):
            named = dict(model.named_parameters())
            head = model.get_output_embeddings()
            if head is not None and "lm_head.weight" not in named:
                named["lm_head.weight"] = head.weight
            return named

        def metadata(self):
            return [ParamMeta(k, torch.bfloat16, tuple(v.shape)) for k, v in self._named().items()]

        def __iter__(self):
            for k, v in self._named().items():
                yield k, v.detach().to(torch.bfloat16).contiguous()

    return Bf16()


def engine_logprobs(llm, prompt: list[int], cont: list[int]) -> list[float]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    out = llm.generate(
        [TokensPrompt(prompt_token_ids=prompt + cont)],
        SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0),
        use_tqdm=False,
    )[0]
    ids = prompt + cont
    return [float(out.prompt_logprobs[i][ids[i]].logprob) for i in range(len(prompt), len(ids))]


def gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded:tiny")
    ap.add_argument("--transport", choices=["auto", "nccl", "ipc", "file"], default="auto")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: this script is for a GPU machine (JOINTRL_DEVICE=gpu bash .ci/install.sh)")
        return 2
    n_gpu = torch.cuda.device_count()
    transport = args.transport if args.transport != "auto" else ("nccl" if n_gpu >= 2 else "ipc")
    if transport == "nccl" and n_gpu < 2:
        print(
            "--transport nccl needs 2 GPUs: NCCL refuses two ranks on one device ('Duplicate GPU detected'); "
            "use ipc (same GPU) or file"
        )
        return 2
    from rl.trainer.hub import resolve_model

    model_path = resolve_model(args.model)
    print(
        f"model {model_path}; {n_gpu} GPU(s): {torch.cuda.get_device_name(0)}; torch {torch.__version__}; "
        f"transport {transport} (+ file)"
    )

    from vllm import LLM, SamplingParams, __version__ as vllm_version
    from vllm.inputs import TokensPrompt

    print(f"vllm {vllm_version}")
    llm = None
    with stage("1. vLLM CUDA engine start") as st:
        llm = LLM(
            model=model_path,
            dtype="bfloat16",
            seed=0,
            max_model_len=2048,
            enforce_eager=True,
            enable_prefix_caching=True,
            gpu_memory_utilization=args.gpu_memory_utilization,
            enable_sleep_mode=True,
            **({} if transport == "file" else {"weight_transfer_config": {"backend": transport}}),
        )
        st.detail = f"on cuda:0 ({args.gpu_memory_utilization:.0%} of its memory)"
    if llm is None:
        return _report()
    tokenizer = llm.get_tokenizer()
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Count from {i} to {i + 20}."}], add_generation_prompt=True, tokenize=True
        )
        for i in range(args.prompts)
    ]
    gens: list[tuple[list[int], list[int], list[float]]] = []
    with stage("1. vLLM CUDA generate") as st:
        t0 = time.perf_counter()
        outs = llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts],
            SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=0, logprobs=0),
            use_tqdm=False,
        )
        dt = time.perf_counter() - t0
        for p, o in zip(prompts, outs):
            c = o.outputs[0]
            gens.append((list(p), list(c.token_ids), [float(s[t].logprob) for t, s in zip(c.token_ids, c.logprobs)]))
        n = sum(len(g[1]) for g in gens)
        st.detail = f"{n} tokens in {dt:.2f}s = {n / dt:.0f} tok/s"

    from rl.algos.batch import Batch, Sample
    from rl.config.recipe import AlgoConfig, KLConfig, ModelConfig, OptimConfig
    from rl.trainer.learner import Learner

    learner = None
    with stage("2. learner start (jointrl Learner, fp32 master, bf16 autocast)") as st:
        if transport == "nccl":
            torch.cuda.set_device(1)  # the learner on its own GPU: NCCL needs distinct devices
        shm = tempfile.mkdtemp(prefix="jointrl-smoke-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        learner = Learner(
            model_path,
            ModelConfig(path=model_path, learner_dtype="float32", autocast=True),
            AlgoConfig(name="grpo", optim=OptimConfig(lr=args.lr), kl=KLConfig(coef=0.01)),
            shm_dir=shm,
        )
        st.detail = f"on {next(learner.model.parameters()).device}"
    if learner is None or not gens:
        return _report()
    rng = random.Random(0)
    with stage(f"2. learner steps x{args.steps} (GRPO + k3 KL, AdamW)") as st:
        times = []
        for _ in range(args.steps):
            samples = [
                Sample(p + r, len(p), [1] * len(r), lp, rng.uniform(-1, 1), "smoke", group_id=i // 4, uid=i)
                for i, (p, r, lp) in enumerate(gens)
                if r
            ]
            batch = Batch(samples, sum(len(s.loss_mask) for s in samples), len(samples))
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            m = learner.step(batch)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        toks = sum(len(s.input_ids) for s in samples)
        st.detail = (
            f"{times[-1]:.3f}s/step (first {times[0]:.3f}s), {toks / times[-1]:.0f} tok/s, "
            f"loss {m.get('loss/policy', float('nan')):.4f}, peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
        )

    prompt, cont = gens[0][0], gens[0][1][:32]
    want, before = [0.0], [0.0]
    with stage("3. logprobs gap before any sync (engine: initial weights, learner: updated)") as st:
        want = learner.logprobs(prompt, cont)
        before = engine_logprobs(llm, prompt, cont)
        st.detail = f"max |engine - learner| {gap(before, want):.4f} over {len(cont)} tokens"

    if transport in ("nccl", "ipc"):
        with stage(f"3. weight sync round trip via vLLM {transport} weight transfer") as st:
            from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

            if transport == "nccl":
                from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    port = s.getsockname()[1]
                info = NCCLTrainerInitInfo(master_address="127.0.0.1", master_port=port, world_size=2, rank=0)
            else:
                from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

                info = IPCTrainerInitInfo(rank=0)
            t0 = time.perf_counter()
            sender = WeightTransferTrainerFactory.trainer_init(
                info, client=LLMClient(llm), source=bf16_source(learner.model)
            )
            t_init = time.perf_counter() - t0
            times = []
            for _ in range(2):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                sender.send_weights()
                times.append(time.perf_counter() - t0)
            llm.reset_prefix_cache()
            after = engine_logprobs(llm, prompt, cont)
            g = gap(after, want)
            st.detail = f"init {t_init:.2f}s, send {times[-1]:.3f}s (first {times[0]:.3f}s); gap after {g:.4f}"
            assert g < max(0.05, 0.25 * gap(before, want)), f"engine logprobs did not follow the learner (gap {g:.4f})"
            sender.shutdown()

    with stage("3. weight sync via /dev/shm file (jointrl today: export_weights + in-place reload)") as st:
        from rollout.engine import _reload_from_file

        learner.step(batch)  # move the weights again, so the file path is checked on new values
        want = learner.logprobs(prompt, cont)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        path = learner.export_weights("bfloat16")
        t1 = time.perf_counter()
        llm.collective_rpc(_reload_from_file, args=(path,))
        llm.reset_prefix_cache()
        t2 = time.perf_counter()
        g = gap(engine_logprobs(llm, prompt, cont), want)
        st.detail = f"export {t1 - t0:.3f}s + reload {t2 - t1:.3f}s; gap after {g:.4f}"
        assert g < 0.05, f"engine logprobs did not follow the learner (gap {g:.4f})"

    with stage("4. sleep(level=1) / wake_up (colocated placement)") as st:
        free0 = torch.cuda.mem_get_info(0)[0]
        t0 = time.perf_counter()
        llm.sleep(level=1)
        t1 = time.perf_counter()
        free1 = torch.cuda.mem_get_info(0)[0]
        llm.wake_up()
        t2 = time.perf_counter()
        out = llm.generate(
            [TokensPrompt(prompt_token_ids=prompts[0])], SamplingParams(max_tokens=16, temperature=0.0), use_tqdm=False
        )[0]
        st.detail = (
            f"sleep {t1 - t0:.2f}s (freed {(free1 - free0) / 2**30:.1f} GiB on cuda:0), wake {t2 - t1:.2f}s, "
            f"then {len(out.outputs[0].token_ids)} tokens generated"
        )
        assert free1 > free0, "sleep freed no GPU memory"
    return _report()


def _report() -> int:
    print("\nsummary (bench/gpu_smoke.py):")
    for name, status, detail in RESULTS:
        print(f"  {status:4s}  {name}: {detail}")
    return 0 if all(s == "PASS" for _, s, _ in RESULTS) else 1


if __name__ == "__main__":
    sys.exit(main())
