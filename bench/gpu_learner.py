"""The learner's GPU paths without vLLM: bf16 steps, FSDP2 over NCCL, LoRA, export into an engine, DCP resume.

``bench/gpu_smoke.py`` checks the GPU step with a CUDA vLLM engine; this script checks what the learner
does on a GPU without vLLM (the lent device machine has none; ``bench/gpu_vllm_bundle.py`` carries one
there), with a stand-in engine, on a random model of a real shape (Qwen2.5-1.5B's config by
default; nothing is downloaded). Every stage prints PASS/FAIL with its figures; a failing stage does not
hide the others'. Stages, each on a fresh ``rl.trainer.learner.Learner`` (GRPO + k3 KL, AdamW):

1. **autocast**: one worker, fp32 master weights, bf16 autocast (the default GPU learner): s/step,
   tokens/s, peak memory and model FLOP utilisation against a bf16 square matmul timed in the same run.
2. **weight sync** (after 1): ``export_weights("bfloat16")`` loaded into a stand-in engine (an HF model in
   bf16 on the same GPU, as vLLM holds it): its log-probs of a sampled continuation must follow the
   learner's (gap after the sync < max(0.05, 1/4 of the gap before)).
3. **fsdp**: ``learner.fsdp: always``: FSDP2 over an NCCL process group of one, FSDP's bf16-compute policy
   instead of autocast; the first step's losses equal stage 1's to bf16 tolerance; export as in 2 (the
   DTensor gather); a ``torch.distributed.checkpoint`` round trip gives the same next step.
   (2+ ranks need 2+ GPUs: NCCL refuses two ranks on one device.)
4. **lora**: rank 16 on every projection: only adapters change, AdamW state bytes against stage 1's,
   merged export followed by the stand-in engine.
5. **activation checkpointing** (stage 1's learner with ``learner.activation_checkpointing``): peak
   memory and step time against stage 1.

    python3 bench/gpu_learner.py                          # on a GPU machine; ~3-5 min on one H200
    python3 bench/gpu_learner.py --tiny --steps 2         # the same stages on CPU with the tiny model (a dry run)
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.learner_memory import optim_bytes  # noqa: E402

RESULTS: list[tuple[str, str, str]] = []  # (stage, PASS/FAIL, detail)
FIGURES: dict[str, float] = {}

# Qwen2.5-1.5B-Instruct's config.json (architecture fields only; the weights are random)
QWEN25_1_5B = dict(
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)


class stage:
    """``with stage("x") as st: ...; st.detail = "..."``: records PASS/FAIL and the time; never raises."""

    def __init__(self, name: str) -> None:
        self.name, self.detail = name, ""

    def __enter__(self) -> "stage":
        self.t0 = time.perf_counter()
        print(f"== {self.name}", flush=True)
        return self

    def __exit__(self, et, e, tb) -> bool:
        dt = time.perf_counter() - self.t0
        if e is None:
            RESULTS.append((self.name, "PASS", f"{dt:.1f}s {self.detail}"))
        else:
            traceback.print_exception(et, e, tb)
            first = str(e).splitlines()[0][:300] if str(e) else ""
            RESULTS.append((self.name, "FAIL", f"{dt:.1f}s {type(e).__name__}: {first}"))
        print(f"   {RESULTS[-1][1]} {RESULTS[-1][2]}", flush=True)
        return True


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def build_model(folder: Path, tiny: bool) -> Path:
    """A local HF folder: the tiny test model, or a random model of Qwen2.5-1.5B's shape (bf16 weights)
    with the tiny model's tokenizer (the learner reads only its pad id; the batch's ids are random)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from rl.trainer.hub import resolve_model

    tiny_path = Path(resolve_model("embedded:tiny"))
    if tiny:
        return tiny_path
    folder.mkdir(parents=True, exist_ok=True)
    for f in tiny_path.iterdir():
        if f.is_file() and not f.name.endswith((".safetensors", ".bin")) and f.name != "config.json":
            shutil.copy(f, folder / f.name)
    cfg = Qwen2Config(**QWEN25_1_5B, torch_dtype="bfloat16")
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    del model
    return folder


def make_batch(vocab: int, prompts: int, group: int, prompt_len: int, resp_len: int, seed: int = 0):
    """The synthetic quickstart-shaped batch of bench/learner_memory.py (groups sharing a prompt, +-1 advantages)."""
    from bench.learner_memory import _batch

    ns = argparse.Namespace(prompts=prompts, group=group, prompt_len=prompt_len, resp_len=resp_len)
    return _batch(vocab, ns, seed=seed)


def new_learner(model_path: Path, shm: Path, name: str, lr: float, **learner_kw):
    from rl.config.recipe import AlgoConfig, KLConfig, LearnerConfig, ModelConfig, OptimConfig
    from rl.trainer.learner import Learner

    return Learner(
        str(model_path),
        ModelConfig(path=str(model_path), learner_dtype="float32", autocast=True, reference_dtype="bfloat16"),
        AlgoConfig(name="grpo", optim=OptimConfig(lr=lr), kl=KLConfig(coef=0.02)),
        shm_dir=str(shm / name),
        learner=LearnerConfig(**learner_kw),
    )


def timed_steps(lrn, batch, steps: int) -> tuple[list[float], list[dict]]:
    times, metrics = [], []
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        metrics.append(lrn.step(batch))
        sync()
        times.append(time.perf_counter() - t0)
    return times, metrics


class StandInEngine:
    """What an engine holds: the model in bf16 on the GPU, its weights replaced from an export file."""

    def __init__(self, model_path: Path, device: torch.device) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.bfloat16).to(device).eval()
        self.device = device
        self.initial = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def reset(self) -> None:
        """Back to the initial weights (before the next stage's learner)."""
        self.model.load_state_dict(self.initial)

    def load(self, path: str) -> None:
        from safetensors.torch import load_file

        sd = load_file(path, device=str(self.device))
        missing, unexpected = self.model.load_state_dict(sd, strict=False)
        if missing or unexpected:
            raise AssertionError(f"export does not cover the engine's weights: missing {missing}, extra {unexpected}")

    @torch.no_grad()
    def logprobs(self, prompt: list[int], cont: list[int]) -> list[float]:
        ids = torch.tensor([prompt + cont], device=self.device)
        logp = torch.log_softmax(self.model(input_ids=ids).logits[0].float(), dim=-1)
        pos = torch.arange(len(prompt) - 1, len(prompt) + len(cont) - 1, device=self.device)
        return logp[pos, ids[0, len(prompt) :]].tolist()


def gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b))


def check_sync(lrn, engine: StandInEngine, prompt: list[int], cont: list[int], label: str) -> str:
    """Export the learner's weights into ``engine``; its log-probs must follow the learner's."""
    want = lrn.logprobs(prompt, cont)
    before = gap(engine.logprobs(prompt, cont), want)
    sync()
    t0 = time.perf_counter()
    path = lrn.export_weights("bfloat16")
    sync()
    t1 = time.perf_counter()
    engine.load(path)
    after = gap(engine.logprobs(prompt, cont), want)
    followed(label, before, after)
    FIGURES[f"{label}_export_s"] = t1 - t0
    return f"export {t1 - t0:.2f}s; max |engine - learner| {before:.4f} before the sync, {after:.4f} after"


def followed(label: str, before: float, after: float) -> None:
    """Record an engine/learner log-prob gap before and after a sync; the engine must have followed the learner
    (the gap after < max(0.05, 1/4 of the gap before)), and the steps must have moved it (or it proves nothing)."""
    FIGURES[f"{label}_gap_before"], FIGURES[f"{label}_gap_after"] = before, after
    assert after < max(0.05, 0.25 * before), f"engine log-probs did not follow the learner: {before:.4f} -> {after:.4f}"
    assert before > 2 * after, f"the steps hardly moved the log-probs ({before:.4f}): the check would prove nothing"


def matmul_tflops(device: torch.device) -> float:
    """bf16 square matmul rate on ``device`` (n=8192 on GPU: the ceiling the step's MFU is read against)."""
    n, reps = (8192, 10) if device.type == "cuda" else (1024, 3)
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync()
    return 2 * n**3 * reps / (time.perf_counter() - t0) / 1e12


def free(*objs) -> None:
    for o in objs:
        if o is not None and hasattr(o, "shutdown"):
            o.shutdown()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


BASELINE = [0]  # bytes allocated before a stage's learner (the stand-in engine's weights)


def peak_gib() -> float:
    """The stage's peak GPU memory above the baseline: what the learner took."""
    if not torch.cuda.is_available():
        return float("nan")
    return (torch.cuda.max_memory_allocated() - BASELINE[0]) / 2**30


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="the tiny test model (a CPU dry run of the stages)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--resp-len", type=int, default=512)
    ap.add_argument("--json", default="", help="write the figures here")
    ap.add_argument(
        "--sweep",
        default="",
        help="instead of the stages: stage 1's step at each of these learner.micro_batch_tokens (comma-separated), "
        "then one CUDA-profiled step at the last",
    )
    args = ap.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and not args.tiny:
        print("no CUDA device: run on a GPU machine, or --tiny for a CPU dry run")
        return 2
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    import transformers

    print(f"device {name}; torch {torch.__version__}; transformers {transformers.__version__}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="jointrl-gpu-"))
    try:
        return sweep(args, device, work) if args.sweep else run_stages(args, device, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        _report(args.json)


@dataclass
class Setup:
    """What every stage shares: the model folder, its config, the batch and its FLOPs, the bf16 matmul rate."""

    args: argparse.Namespace
    work: Path
    model_path: Path
    cfg: dict
    batch: Any
    flops: float
    rate: float  # TFLOP/s

    @property
    def tokens(self) -> int:
        return sum(len(s.input_ids) for s in self.batch.samples)

    def learner(self, name: str, lr: float | None = None, **learner_kw):
        return new_learner(self.model_path, self.work / "shm", name, lr or self.args.lr, **learner_kw)

    def mfu(self, seconds: float) -> float:
        return self.flops / seconds / (self.rate * 1e12)


def setup(args: argparse.Namespace, device: torch.device, work: Path) -> Setup:
    from bench.learner_floor import step_flops

    model_path = build_model(work / "model", args.tiny)
    cfg = json.loads((model_path / "config.json").read_text())
    vocab = min(cfg["vocab_size"], 49152)  # the tokenizer's ids
    batch = make_batch(vocab, args.prompts, args.group, args.prompt_len, args.resp_len)
    # FLOPs of one step: the policy's forward + backward, and the reference's forward (KL term)
    flops = step_flops(cfg, batch.samples, share_prompt=True)
    flops += step_flops(cfg, batch.samples, share_prompt=True, backward=False)
    su = Setup(args, work, model_path, cfg, batch, flops, matmul_tflops(device))
    FIGURES.update(matmul_tflops=su.rate, step_tflop=flops / 1e12, batch_tokens=su.tokens)
    print(
        f"model {cfg['num_hidden_layers']} layers x {cfg['hidden_size']}, vocab {cfg['vocab_size']}; batch "
        f"{len(batch.samples)} samples, {su.tokens} tokens, {flops / 1e12:.2f} TFLOP/step; bf16 matmul "
        f"{su.rate:.0f} TFLOP/s",
        flush=True,
    )
    return su


def run_stages(args: argparse.Namespace, device: torch.device, work: Path) -> int:
    su = setup(args, device, work)
    first = su.batch.samples[1]  # advantage +1: the steps raise its log-probs
    probe = (first.input_ids[: first.prompt_len], first.input_ids[first.prompt_len :][:64])
    engine = StandInEngine(su.model_path, device)
    free()
    BASELINE[0] = torch.cuda.memory_allocated() if torch.cuda.is_available() else 0
    for run in (stage_autocast, stage_fsdp, stage_lora, stage_checkpointing):
        engine.reset()
        lrn = None
        try:
            lrn = run(su, engine, probe)
        finally:
            free(lrn)
    return 0 if all(s == "PASS" for _, s, _ in RESULTS) else 1


def _best(times: list[float]) -> float:
    return min(times[1:] or times)  # the first step pays CUDA's warm-up


def stage_autocast(su: Setup, engine: StandInEngine, probe: tuple[list[int], list[int]]):
    """Stages 1 and 2: the default GPU learner's steps, then its export followed by the engine."""
    lrn = None
    with stage("1. learner, 1 worker, fp32 master + bf16 autocast") as st:
        lrn = su.learner("autocast")
        times, ms = timed_steps(lrn, su.batch, su.args.steps)
        best = _best(times)
        FIGURES.update(autocast_step_s=best, autocast_first_s=times[0], autocast_peak_gib=peak_gib())
        FIGURES.update(autocast_mfu=su.mfu(best), full_adam_bytes=optim_bytes(lrn))
        FIGURES.update(autocast_grad_norm_1=ms[0]["grad/norm"], autocast_loss_policy_1=ms[0]["loss/policy"])
        st.detail = (
            f"{best:.3f}s/step (first {times[0]:.2f}s), {su.tokens / best:.0f} tok/s, "
            f"MFU {su.mfu(best):.1%} of the measured bf16 rate, peak {peak_gib():.1f} GiB"
        )
    if lrn is not None:
        with stage("2. weight sync: export_weights -> stand-in bf16 engine, log-probs follow") as st:
            st.detail = check_sync(lrn, engine, *probe, "autocast")
    return lrn


def stage_fsdp(su: Setup, engine: StandInEngine, probe: tuple[list[int], list[int]]):
    """Stage 3: FSDP2 at one rank (bf16-compute policy on GPU): steps equal to stage 1's, export, DCP resume."""
    lrn = None
    with stage("3. FSDP2 (learner.fsdp: always), a process group of one, bf16-compute policy on GPU") as st:
        import torch.distributed as dist

        lrn = su.learner("fsdp", fsdp="always")
        assert all(hasattr(p, "full_tensor") for p in lrn.model.parameters()), "parameters are not DTensors"
        times, ms = timed_steps(lrn, su.batch, su.args.steps)
        best = _best(times)
        FIGURES.update(fsdp_step_s=best, fsdp_peak_gib=peak_gib(), fsdp_mfu=su.mfu(best))
        g0, pol0 = ms[0]["grad/norm"], ms[0]["loss/policy"]
        g_ac, pol_ac = FIGURES.get("autocast_grad_norm_1", g0), FIGURES.get("autocast_loss_policy_1", pol0)
        # the same weights and batch in two bf16 schemes: the first step's gradient norm and loss agree
        assert abs(g0 - g_ac) <= 0.05 * g_ac and abs(pol0 - pol_ac) <= 0.02, (
            f"first step differs from the autocast learner's: grad/norm {g0:.5g} vs {g_ac:.5g}, "
            f"loss/policy {pol0:.5f} vs {pol_ac:.5f}"
        )
        st.detail = (
            f"backend {dist.get_backend()}; {best:.3f}s/step "
            f"({FIGURES.get('autocast_step_s', float('nan')) / best:.2f}x the autocast step's speed), peak "
            f"{peak_gib():.1f} GiB; step-1 loss/policy {pol0:.5f} (autocast {pol_ac:.5f}), grad/norm {g0:.5g} ({g_ac:.5g})"
        )
    if lrn is None:
        return None
    with stage("3. FSDP2 export (DTensor gather) -> stand-in engine") as st:
        st.detail = check_sync(lrn, engine, *probe, "fsdp")
    with stage("3. FSDP2 checkpoint (torch.distributed.checkpoint) round trip") as st:
        lrn.save_checkpoint(str(su.work / "ckpt"))
        ref = lrn.step(su.batch)
        lrn.load_checkpoint(str(su.work / "ckpt"))
        again = lrn.step(su.batch)
        d = abs(again["grad/norm"] - ref["grad/norm"]) / ref["grad/norm"]
        assert d < 1e-3, f"resumed step differs: grad/norm {again['grad/norm']} vs {ref['grad/norm']}"
        st.detail = f"grad/norm after resume {again['grad/norm']:.6g} vs {ref['grad/norm']:.6g} (rel {d:.1e})"
    return lrn


def stage_lora(su: Setup, engine: StandInEngine, probe: tuple[list[int], list[int]]):
    """Stage 4: LoRA rank 16: only adapters change, AdamW state against full, merged export followed."""
    from rl.config.recipe import LoraConfig

    lrn = None
    with stage("4. LoRA rank 16 (all projections), adapters only; merged export -> engine") as st:
        lrn = su.learner("lora", su.args.lr * 10, lora=LoraConfig(rank=16, alpha=32.0))
        layer0 = {k: v.detach().clone() for k, v in lrn.model.named_parameters() if "layers.0." in k}
        times, _ = timed_steps(lrn, su.batch, su.args.steps)
        best = _best(times)
        now = dict(lrn.model.named_parameters())
        assert all(torch.equal(now[k], v) for k, v in layer0.items() if "lora_" not in k), "a base weight changed"
        assert all(not torch.equal(now[k], v) for k, v in layer0.items() if "lora_B" in k), "an adapter did not change"
        share = optim_bytes(lrn) / FIGURES["full_adam_bytes"] if FIGURES.get("full_adam_bytes") else float("nan")
        FIGURES.update(lora_step_s=best, lora_peak_gib=peak_gib(), lora_adam_share=share)
        sync_detail = check_sync(lrn, engine, *probe, "lora")
        st.detail = f"{best:.3f}s/step, peak {peak_gib():.1f} GiB, AdamW state {share:.2%} of full; {sync_detail}"
    return lrn


def stage_checkpointing(su: Setup, engine: StandInEngine, probe: tuple[list[int], list[int]]):
    """Stage 5: activation checkpointing: peak memory and step time against stage 1."""
    lrn = None
    with stage("5. activation checkpointing (per decoder layer)") as st:
        lrn = su.learner("ckpt", activation_checkpointing=True)
        times, _ = timed_steps(lrn, su.batch, su.args.steps)
        best = _best(times)
        FIGURES.update(ac_step_s=best, ac_peak_gib=peak_gib())
        st.detail = (
            f"{best:.3f}s/step ({best / FIGURES.get('autocast_step_s', float('nan')):.2f}x stage 1), "
            f"peak {peak_gib():.1f} GiB (stage 1: {FIGURES.get('autocast_peak_gib', float('nan')):.1f})"
        )
    return lrn


def sweep(args: argparse.Namespace, device: torch.device, work: Path) -> int:
    """Stage 1's learner at several micro-batch sizes (s/step, MFU, peak), then where one step's time goes."""
    su = setup(args, device, work)
    sizes = [int(x) for x in args.sweep.split(",")]
    lrn = None
    for mbt in sizes:
        with stage(f"step at learner.micro_batch_tokens={mbt}") as st:
            free(lrn)
            lrn = su.learner(f"mbt{mbt}", micro_batch_tokens=mbt)
            best = _best(timed_steps(lrn, su.batch, args.steps)[0])
            FIGURES.update({f"mbt{mbt}_step_s": best, f"mbt{mbt}_mfu": su.mfu(best), f"mbt{mbt}_peak_gib": peak_gib()})
            st.detail = f"{best:.3f}s/step, MFU {su.mfu(best):.1%}, peak {peak_gib():.1f} GiB"
    if lrn is not None:
        with stage(f"profile of one step at learner.micro_batch_tokens={sizes[-1]}") as st:
            st.detail = profile_step(lrn, su.batch, device)
    free(lrn)
    return 0 if all(s == "PASS" for _, s, _ in RESULTS) else 1


def profile_step(lrn, batch, device: torch.device) -> str:
    """One step under ``torch.profiler``: GPU kernel time against the wall, the top kernels and host ops."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync()
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        lrn.step(batch)
        sync()
    wall = time.perf_counter() - t0
    ev = prof.key_averages()
    dev = lambda e: getattr(e, "self_device_time_total", 0.0)  # noqa: E731
    kernels = [e for e in ev if "CUDA" in str(getattr(e, "device_type", ""))]  # the kernels themselves, not ops
    busy = sum(dev(e) for e in kernels) / 1e6
    print(f"profiled step {wall:.2f} s wall; kernels {busy:.2f} s (GPU busy {busy / wall:.0%})")
    for e in sorted(kernels, key=lambda e: -dev(e))[:12]:
        print(f"  {e.key[:70]:70s} calls {e.count:6d}  device {dev(e) / 1e6:7.3f} s")
    for e in sorted(ev, key=lambda e: -e.self_cpu_time_total)[:8]:
        print(f"  cpu {e.key[:66]:66s} calls {e.count:6d}  self cpu {e.self_cpu_time_total / 1e6:7.3f} s")
    FIGURES.update(profile_wall_s=wall, profile_kernel_s=busy)
    return f"{wall:.2f} s under the profiler, GPU kernels {busy:.2f} s ({busy / wall:.0%} busy)"


def _report(path: str) -> None:
    print(f"\nsummary (bench/{Path(sys.argv[0]).name}):")
    for name, status, detail in RESULTS:
        print(f"  {status:4s}  {name}: {detail}")
    print("figures: " + json.dumps({k: round(v, 6) for k, v in FIGURES.items()}))
    if path:
        Path(path).write_text(json.dumps({"results": RESULTS, "figures": FIGURES}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
