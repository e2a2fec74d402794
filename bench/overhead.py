"""jointrl's per-step overhead over its parts, on one quickstart-like batch, in one process.

Everything runs in this process: a ``VLLMEngine`` (its engine core is vLLM's own
subprocess), an in-process ``Learner``, an in-process ``RewardScorer``. There is no Ray:
the Ray actor hop of a real ``jointrl train`` run (pickling trajectories/batches between
actors, ``ray.get`` round trips) is NOT included in any number here.

Setup: SmolLM2-135M-Instruct, recipes/quickstart.yaml (its model and algo config: GRPO,
kl_coef 0.02, zero_variance drop; the rest pinned by ``bench._workload.SCHEMA_TOOLCALL``), 8 tasks
of recipes/data/toolcall_quickstart.train.jsonl x group 8 = 64 samples, max_new_tokens 64,
temperature 1, fixed seeds (``rl.driver.loop.expand``).

Parts, each timed alone on tasks 0-7:
  (i)   pure generate: ``engine.generate`` of the 64 prompts' token ids (built as
        ``rollout.episode`` does: chat template + prefill, encoded without special tokens);
  (ii)  pure learner step: ``Learner.step`` on the batch built from those generations
        (trajectories assembled by ``run_episodes`` replaying the generations, scored by
        ``RewardScorer`` with ``rewards.toolcall.ToolCallReward``, ``build_batch``; untimed);
  (iii) pure weight sync: ``export_weights`` + ``engine.load_weights``.
Whole (iv), on the NEXT 8 tasks (8-15), same sizes: ``run_episodes`` (engine + ToolCallEnv)
  + ``RewardScorer.score`` + ``build_batch`` + ``Learner.step`` + export/reload, as
  ``rl.driver.loop.train`` composes a synchronous step.
Reports (iv) / ((i)+(ii)+(iii)); the issue's goal is <= 1.10 in synchronous mode. Two
repetitions (pure first, then whole first, to balance warm-up effects), medians reported.
The two task sets differ, so their token counts are printed next to the times.

Appends/replaces its section of ``bench/RESULTS.md``.

    JOINTRL_CACHE=/tmp/jcache .venv/bin/python bench/overhead.py

``--device cuda``: the engine (``vllm``, bf16, ``rollout.gpu_memory_utilization`` of the GPU)
and the learner (fp32 + bf16 autocast) share one GPU in this process. Not run: no GPU was
available to this work (see bench/README.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # the reload runs our function in vLLM's worker

from bench import _device  # noqa: E402
from bench._workload import SCHEMA_TOOLCALL  # noqa: E402


class ReplayEngine:
    """Hands ``run_episodes`` generations computed earlier (same prompts, same order)."""

    def __init__(self, prompts, gens) -> None:
        self.prompts, self.gens = prompts, gens

    def generate(self, prompts, sampling, seeds=None, stops=None):
        if [list(p) for p in prompts] != self.prompts:
            raise RuntimeError("replayed prompts differ from the generated ones")
        return self.gens


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default=str(ROOT / "recipes" / "quickstart.yaml"))
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--no-write", action="store_true", help="print only, leave bench/RESULTS.md alone")
    _device.add_argument(ap)
    args = ap.parse_args(argv)
    device = _device.select(args.device)

    import shutil

    from transformers import AutoTokenizer

    from bench._results import machine, table, write_section
    from envs.base import resolve
    from envs.io import load_tasks
    from envs.types import Sampling
    from rewards.service import RewardScorer, reward_specs
    from rl.algos.batch import build_batch
    from rl.config.recipe import load_recipe, resolve_path
    from rl.trainer.learner import Learner
    from rl.driver.loop import expand
    from rl.trainer.hub import resolve_model
    from rollout.engine import VLLMEngine
    from rollout.episode import encode, render, run_episodes

    from rl.trainer.precision import resolve_logged

    # `auto` precisions made concrete, as a run does; the measured workload pinned (bench/_workload.py)
    cfg = resolve_logged(load_recipe(args.recipe, SCHEMA_TOOLCALL), "cpu")
    r = cfg.rollout
    path = resolve_model(cfg.model.path)
    tasks = load_tasks(resolve_path(cfg, cfg.data.train_files[0]))
    n = r.prompts_per_step
    set_a, set_b = tasks[:n], tasks[n : 2 * n]
    sampling = Sampling(
        max_new_tokens=r.max_new_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        max_turns=r.max_turns,
        max_model_len=r.max_model_len,
    )
    env_cls = {e.domain: (resolve(e.cls), dict(e.kwargs)) for e in r.envs}

    def make_env(domain: str):
        cls, kw = env_cls[domain]
        return cls(**kw)

    tok = AutoTokenizer.from_pretrained(path)
    scorer = RewardScorer(
        reward_specs(cfg.rewards),
        timeout_s=cfg.reward_service.timeout_s,
    )
    ta, ga, sa = expand(set_a, r.group_size, cfg.run.seed, 1)
    tb, gb, sb = expand(set_b, r.group_size, cfg.run.seed, 2)

    def prompt_ids(task):
        env = make_env(task.domain)
        try:
            return encode(tok, render(tok, list(env.reset(task)), add_generation_prompt=True) + task.prefill)
        finally:
            env.close()

    prompts_a = [prompt_ids(t) for t in ta]
    shm = tempfile.mkdtemp(prefix="jointrl-bench-", dir="/dev/shm")
    learner = Learner(
        path, cfg.model, cfg.algo, seed=cfg.run.seed, threads=cfg.run.threads, shm_dir=shm, total_steps=2 * args.reps
    )
    engine = None
    rec: dict[str, list[float]] = {
        k: [] for k in ("gen", "learn", "sync", "whole", "w_roll", "w_reward", "w_learn", "w_sync")
    }
    info: dict[str, list[float]] = {k: [] for k in ("a_tokens", "a_samples", "b_tokens", "b_samples")}
    try:
        engine = VLLMEngine(
            path,
            dtype=cfg.model.engine_dtype,
            seed=cfg.run.seed,
            max_model_len=r.max_model_len,
            kv_cache_gib=r.kv_cache_gib,
            gpu_memory_utilization=r.gpu_memory_utilization,
        )
        engine.generate(prompts_a[:2], sampling, seeds=[1, 2])  # untimed: first-call set-up

        def pure() -> None:
            engine.llm.reset_prefix_cache()  # a real step starts right after a sync, which clears it
            t0 = time.perf_counter()
            gens = engine.generate(prompts_a, sampling, seeds=[s * 7919 for s in sa])  # as run_episodes seeds turn 0
            rec["gen"].append(time.perf_counter() - t0)
            trajs = run_episodes(ReplayEngine(prompts_a, gens), tok, make_env, ta, ga, sa, sampling)
            batch, _ = build_batch(scorer.score(trajs), cfg.algo)
            info["a_tokens"].append(sum(len(g.token_ids) for g in gens))
            info["a_samples"].append(len(batch.samples))
            t0 = time.perf_counter()
            learner.step(batch)
            rec["learn"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            engine.load_weights(learner.export_weights(cfg.model.engine_dtype))
            rec["sync"].append(time.perf_counter() - t0)

        def whole() -> None:
            engine.llm.reset_prefix_cache()
            t0 = time.perf_counter()
            trajs = run_episodes(engine, tok, make_env, tb, gb, sb, sampling)
            t1 = time.perf_counter()
            trajs = scorer.score(trajs)
            t2 = time.perf_counter()
            batch, _ = build_batch(trajs, cfg.algo)
            learner.step(batch)
            t3 = time.perf_counter()
            engine.load_weights(learner.export_weights(cfg.model.engine_dtype))
            t4 = time.perf_counter()
            for k, v in (
                ("whole", t4 - t0),
                ("w_roll", t1 - t0),
                ("w_reward", t2 - t1),
                ("w_learn", t3 - t2),
                ("w_sync", t4 - t3),
            ):
                rec[k].append(v)
            info["b_tokens"].append(sum(t.num_policy_tokens for t in trajs))
            info["b_samples"].append(len(batch.samples))

        for rep in range(args.reps):
            for fn in (pure, whole) if rep % 2 == 0 else (whole, pure):
                fn()
            print(f"rep {rep + 1}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in rec.items()), flush=True)
    finally:
        if engine is not None:
            engine.shutdown()
        learner.shutdown()
        shutil.rmtree(shm, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in rec.items()}
    parts = med["gen"] + med["learn"] + med["sync"]
    ratio = med["whole"] / parts
    f = lambda x: f"{x:.2f}"  # noqa: E731
    toks = lambda k: "/".join(str(int(x)) for x in info[k])  # noqa: E731
    rows = [
        ["(i) pure generate (tasks 0-7)", f(med["gen"]), f"{toks('a_tokens')} tokens generated"],
        ["(ii) pure learner step", f(med["learn"]), f"{toks('a_samples')} samples in the batch"],
        ["(iii) pure weight sync", f(med["sync"]), "export + reload"],
        ["(i)+(ii)+(iii)", f(parts), ""],
        [
            "(iv) whole step (tasks 8-15)",
            f(med["whole"]),
            f"{toks('b_tokens')} tokens generated, {toks('b_samples')} samples in the batch",
        ],
        ["  of which run_episodes", f(med["w_roll"]), ""],
        ["  of which reward scoring", f(med["w_reward"]), ""],
        ["  of which build_batch + learner step", f(med["w_learn"]), ""],
        ["  of which export + reload", f(med["w_sync"]), ""],
        ["**(iv) / ((i)+(ii)+(iii))**", f"**{ratio:.3f}**", "goal <= 1.10: " + ("met" if ratio <= 1.10 else "NOT met")],
    ]
    headers = ["phase", f"median s ({args.reps} reps)", "notes (per rep)"]
    body = (
        f"Device: {device}. One process, no Ray: the Ray actor hop of a real `jointrl train` run is NOT included. "
        f"SmolLM2-135M-Instruct, {args.recipe and Path(args.recipe).name} (GRPO, kl_coef {cfg.algo.kl.coef}, "
        f"zero_variance {cfg.algo.update.zero_variance}), {n} tasks x group {r.group_size}, max_new_tokens "
        f"{r.max_new_tokens}, temperature {r.temperature}, fixed seeds. (i)-(iii) on tasks 0-{n - 1}, (iv) on tasks "
        f"{n}-{2 * n - 1}, so the generated lengths differ (see notes). Prefix cache cleared before each "
        "generation, as after a real sync. Reps alternate order (pure first, then whole first).\n\n"
        + table(headers, rows)
    )
    print()
    print(machine())
    print(table(headers, rows))
    if not args.no_write:
        write_section("overhead", "Step overhead over its parts (`bench/overhead.py`)", body)
        print("\nwrote bench/RESULTS.md (section overhead)")


if __name__ == "__main__":
    main()
