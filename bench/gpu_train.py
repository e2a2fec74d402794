"""``jointrl train`` on one GPU: Ray actors, a CUDA vLLM engine and the learner sharing the GPU (colocated),
weights synced by CUDA IPC or by file, checked from the run's own metrics.

``bench/gpu_smoke.py`` checks the parts in one process; this runs the product's whole loop (``jointrl train``,
Ray placement, the engine asleep during the learner step, ``learner.weight_sync``) and reads what the run
logged. The recipe is ``recipes/tiny.yaml`` with a reward that a random model can learn (``LowerHalfReward``:
the share of the policy's tokens from the lower half of the vocabulary; the tool-call reward gives a random
model no variance, so no update), no held-out evaluation, and per run:

* ``--model tiny``: ``embedded:tiny`` (1M parameters); ``mid``: Qwen2.5-0.5B's decoder shape (24 layers,
  hidden 896, ~0.36 B parameters) over the tiny tokenizer, random weights (nothing is downloaded);
* ``--run SYNC[,key=value...]`` (repeatable): one run per ``--run``, with that ``learner.weight_sync``
  (``ipc`` only on a GPU) and those recipe overrides (e.g. ``--run ipc,learner.lora.rank=16``); default
  ``--run ipc --run file`` on a GPU, ``--run file`` on the CPU.

Checks, per run (PASS/FAIL each, the figures beside them):

1. the run exits 0 and logs every step, on the device asked for (``placement.json``);
2. the engine follows the learner: ``rollout/logprob_diff`` (mean |learner - engine| log-prob of the step's
   sampled tokens, before its update) stays <= 0.05 at every step (bf16 rounding: 0.004-0.028 on an H200),
   while the policy moves away from the weights the engine started with: sqrt(2 x ``kl/mean``) at the last
   step (about the mean |log-prob change| a stale engine would show) is >= 4x that step's ``logprob_diff``.
   Not "stays at step 1's level": at step 1 the engine holds the learner's bf16 checkpoint exactly, and after
   the first update its bf16 copy of the fp32 master weights differs by rounding (2.4x step 1's on the H200,
   by file and by IPC alike);
3. the reward rises (the last three steps' mean > the first three's).

A run still going at ``--timeout`` has every process's Python stacks dumped and its Ray logs packed beside its
log (``train``), then is killed: a stall names its place.

    python3 bench/gpu_train.py --gpu --json out.json    # a GPU machine with vLLM and Ray (bench/gpu_vllm_bundle.py)
    python bench/gpu_train.py                           # a CPU dry run: tiny model, weight_sync file
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MID = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2)


class LowerHalfReward:
    """The share of the policy's tokens whose id is in the lower half of the vocabulary (``vocab`` ids)."""

    name = "lower_half"
    domains = ("*",)

    def __init__(self, vocab: int):
        self.vocab = vocab

    def __call__(self, traj) -> float | None:
        ids = [t for t, m in zip(traj.response_ids, traj.loss_mask) if m]
        return sum(t < self.vocab // 2 for t in ids) / len(ids) if ids else None


def build_mid(out: Path) -> Path:
    """Qwen2.5-0.5B's decoder shape over ``embedded:tiny``'s tokenizer, random bf16 weights, in ``out``."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from rl.trainer.hub import resolve_model

    tiny = resolve_model("embedded:tiny")
    d = {k: v for k, v in AutoConfig.from_pretrained(tiny).to_dict().items() if k not in ("layer_types", "head_dim")}
    cfg = Qwen2Config(**{**d, **MID})  # layer_types and head_dim follow the new shape
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)  # saved as bf16: config.dtype follows the weights
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(out)
    return out


def write_recipe(work: Path, model: str, vocab: int, args: argparse.Namespace, sync: str, i: int) -> Path:
    from rl.config.recipe import load_recipe, recipe_to_dict

    d = {k: v for k, v in recipe_to_dict(load_recipe(ROOT / "recipes" / "tiny.yaml")).items() if k != "source"}
    d["data"]["train_files"] = [str(ROOT / "recipes" / f) for f in d["data"]["train_files"]]
    d["data"]["eval_files"] = []
    d["model"]["path"] = model
    d["run"]["output_dir"] = str(work / f"out_{i}")
    d["rewards"] = [{"cls": "bench.gpu_train.LowerHalfReward", "domains": ["tool_call"], "kwargs": {"vocab": vocab}}]
    d["rollout"].update(prompts_per_step=args.prompts, group_size=args.group, max_new_tokens=args.max_tokens)
    d["algo"]["optim"]["lr"] = args.lr
    d["train"]["steps"] = args.steps
    d["learner"]["weight_sync"] = sync
    if args.gpu:
        d["cluster"].update(device="gpu", placement="colocated", engine_gpus=0.5, learner_gpus=0.5)
        d["rollout"]["gpu_memory_utilization"] = args.gpu_memory_utilization
        if args.attention:
            d["rollout"]["engine_kwargs"] = {"attention_config": {"backend": args.attention}}
    path = work / f"recipe_{i}.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path


STACKS = """import faulthandler, signal
faulthandler.register(signal.SIGUSR1, all_threads=True)  # bench/gpu_train.py: stacks of a run that timed out
"""


def train(recipe: Path, overrides: list[str], timeout: float, log: Path) -> tuple[int, float, str]:
    """``jointrl train recipe overrides --verbose --debug``, its output into ``log``: (exit code, seconds, tail).

    Every Python process of the run (the driver, Ray's actors, vLLM's engine core) imports a
    ``sitecustomize`` that dumps its threads' stacks on SIGUSR1; a run still going at ``timeout`` gets
    SIGUSR1 in each, then its Ray session's logs (where the actors' stacks land) are packed beside ``log``
    (``<log>.ray.tgz``) before the run is killed."""
    import psutil

    diag = log.parent / f"{log.stem}.site"
    diag.mkdir(exist_ok=True)
    (diag / "sitecustomize.py").write_text(STACKS)
    env = {
        **os.environ,
        "WANDB_MODE": "disabled",
        "PYTHONPATH": os.pathsep.join([str(diag), str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "rl.cli.main", "train", str(recipe), *overrides, "--verbose", "--debug"]
    t = time.monotonic()
    with log.open("w") as f:
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = 124
            procs = [p.pid, *(c.pid for c in psutil.Process(p.pid).children(recursive=True))]
            for pid in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGUSR1)
            time.sleep(5)  # the dumps reach the actors' log files
            subprocess.run(["tar", "czf", f"{log}.ray.tgz", "-C", "/tmp/ray/session_latest", "logs"], check=False)
            for pid in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            p.wait()
    shutil.rmtree(diag, ignore_errors=True)
    return rc, time.monotonic() - t, log.read_text(errors="replace")[-4000:]


def check(out: Path, rc: int, log: str, args: argparse.Namespace) -> tuple[list[str], dict]:
    """PASS/FAIL lines for one run's output folder, and its figures."""
    rows = (
        [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        if (out / "metrics.jsonl").is_file()
        else []
    )
    steps = [r for r in rows if "rollout/logprob_diff" in r]
    place = json.loads((out / "placement.json").read_text()) if (out / "placement.json").is_file() else {}
    want = "gpu" if args.gpu else "cpu"
    ok1 = rc == 0 and len(steps) == args.steps and place.get("device") == want
    lines = [
        f"{'PASS' if ok1 else 'FAIL'} run: exit {rc}, {len(steps)}/{args.steps} steps, device {place.get('device')}"
    ]
    if not ok1:
        lines.append(log)
    fig: dict = {"exit": rc, "steps": len(steps), "device": place.get("device")}
    if len(steps) < 2:
        return lines, fig
    diff = [r["rollout/logprob_diff"] for r in steps]
    kl = [r.get("kl/mean", 0.0) for r in steps]
    rew = [next((v for k, v in r.items() if k.startswith("reward/") and k.endswith("/mean")), math.nan) for r in steps]
    moved = math.sqrt(2 * max(kl[-1], 0.0))
    ok2 = max(diff) <= 0.05 and moved >= 4 * diff[-1]
    lines.append(
        f"{'PASS' if ok2 else 'FAIL'} follows: logprob_diff by step {', '.join(f'{x:.4f}' for x in diff)}; "
        f"sqrt(2 kl/mean) at the last step {moved:.4f} (kl/mean {', '.join(f'{x:.4f}' for x in kl)})"
    )
    ok3 = sum(rew[-3:]) > sum(rew[:3])
    lines.append(f"{'PASS' if ok3 else 'FAIL'} learns: reward by step {', '.join(f'{x:.3f}' for x in rew)}")
    timing = {
        k: [round(r.get(f"timing/{k}_s", math.nan), 3) for r in steps] for k in ("step", "generate", "learner", "sync")
    }
    lines.append("timing (s, by step): " + "; ".join(f"{k} {v}" for k, v in timing.items()))
    fig.update(logprob_diff=diff, kl=kl, reward=rew, timing=timing, checks=[ok1, ok2, ok3])
    return lines, fig


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", action="store_true", help="cluster.device gpu, colocated, one GPU shared 0.5/0.5")
    ap.add_argument("--model", choices=("tiny", "mid"), default="tiny")
    ap.add_argument("--run", action="append", default=[], help="SYNC[,key=value...]: one run (repeatable)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    ap.add_argument("--attention", default="", help="vLLM attention backend on CUDA (e.g. TRITON_ATTN)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per run")
    ap.add_argument("--json", default="", help="write the figures here")
    ap.add_argument("--logs", default="", help="folder for each run's full output (default: dropped with the run)")
    args = ap.parse_args()
    if args.steps < 6:
        ap.error("--steps must be >= 6 (the reward check compares the first three steps with the last three)")
    runs = args.run or (["ipc", "file"] if args.gpu else ["file"])
    work = Path(tempfile.mkdtemp(prefix="jointrl-gpu-train-"))
    logs = Path(args.logs or work)
    logs.mkdir(parents=True, exist_ok=True)
    report: dict = {"args": vars(args), "runs": {}}
    failed = False
    try:
        from transformers import AutoTokenizer

        from rl.trainer.hub import resolve_model

        t = time.monotonic()
        model = str(build_mid(work / "mid")) if args.model == "mid" else "embedded:tiny"
        vocab = len(AutoTokenizer.from_pretrained(resolve_model(model)))
        print(f"model {model} (vocab {vocab}) ready in {time.monotonic() - t:.1f} s", flush=True)
        for i, spec in enumerate(runs):
            sync, *overrides = spec.split(",")
            recipe = write_recipe(work, model, vocab, args, sync, i)
            rc, wall, log = train(recipe, overrides, args.timeout, logs / f"train_{i}.log")
            lines, fig = check(work / f"out_{i}", rc, log, args)
            fig["wall_s"] = round(wall, 1)
            report["runs"][spec] = fig
            print(f"== learner.weight_sync {sync} {' '.join(overrides)}: {wall:.1f} s", *lines, sep="\n", flush=True)
            failed |= any(x.startswith("FAIL") for x in lines)
    finally:
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1))
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
