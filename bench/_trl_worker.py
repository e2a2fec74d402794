"""TRL's side of ``bench/vs_trl.py``; runs in TRL's own venv (``bench/setup_trl.sh``), not in .venv.

    bench/.venv-trl/bin/python bench/_trl_worker.py PLAN.json RESULT.json

``PLAN.json`` (written by ``vs_trl.py``) fixes the workload: the model folder, the task ids of
every step in order (the ones jointrl's mixer draws for the same recipe), the group size,
sampling, learning rate, KL coefficient, clip range, seed and device. This script trains
``trl.GRPOTrainer`` on exactly those prompts (the same chat-template text + ``<tool_call>``
prefill jointrl's rollout builds) and scores each completion with jointrl's own episode code
and reward classes (``rollout.episode.run_episodes`` replaying TRL's tokens through the
task's env, then ``rewards.service.RewardScorer``), so reward means the same on both sides.

With ``save_dir`` in the plan, the final model and tokenizer are saved there (outside the
timings). ``RESULT.json``: per optimizer step its wall time (``on_step_begin`` -> ``on_step_end``:
generation, reward, reference and policy forward/backward, optimizer step), mean reward,
generated tokens; TRL's own logs; versions; the total wall time.
"""

from __future__ import annotations

import json
import os
import sys
import time

T_START = time.perf_counter()


def main(plan_path: str, out_path: str) -> None:
    with open(plan_path) as f:
        plan = json.load(f)
    if plan["device"] == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    sys.path.insert(0, plan["repo"])
    import torch

    torch.set_num_threads(plan["threads"] or os.cpu_count() or 1)
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from envs.base import resolve
    from envs.io import load_tasks
    from envs.types import Generation, Sampling
    from rewards.service import RewardFnSpec, RewardScorer
    from rollout.episode import encode, render, run_episodes

    transformers.logging.set_verbosity_error()
    tasks = {t.id: t for f in plan["train_files"] for t in load_tasks(f)}
    envs = {e["domain"]: (resolve(e["cls"]), dict(e["kwargs"])) for e in plan["envs"]}

    def make_env(domain: str):
        cls, kw = envs[domain]
        return cls(**kw)

    tok = AutoTokenizer.from_pretrained(plan["model_path"])

    def prompt_text(task) -> str:  # what rollout.episode.run_episodes sends for turn 0
        env = make_env(task.domain)
        try:
            return render(tok, list(env.reset(task)), add_generation_prompt=True) + task.prefill
        finally:
            env.close()

    order = [tid for step_ids in plan["task_ids"] for tid in step_ids]
    rows = [{"prompt": prompt_text(tasks[t]), "task_id": t} for t in order]
    # TRL tokenizes a plain-text prompt with the tokenizer's defaults; check it equals jointrl's ids.
    prompt_mismatch = sum(tok(r["prompt"])["input_ids"] != encode(tok, r["prompt"]) for r in rows)
    sampling = Sampling(
        max_new_tokens=plan["max_new_tokens"],
        temperature=plan["temperature"],
        top_p=plan["top_p"],
        max_turns=1,
        max_model_len=plan["max_model_len"],
    )
    scorer = RewardScorer(
        [RewardFnSpec(r["cls"], r["weight"], tuple(r["domains"]), dict(r["kwargs"])) for r in plan["rewards"]],
        timeout_s=None,
    )
    record: dict[str, list] = {"reward_mean": [], "tokens": [], "task_ids": [], "samples": []}

    class Replay:
        """Hands run_episodes the tokens TRL generated (one turn per task)."""

        def __init__(self, gens):
            self.gens = gens

        def generate(self, prompts, sampling, seeds=None, stops=None):
            return self.gens

    eos = {tok.eos_token_id}

    def toolcall_reward(prompts, completions, completion_ids, task_id, **kwargs):
        ts = [tasks[t] for t in task_id]
        gens = []
        for ids in completion_ids:
            ids = [int(i) for i in ids]
            stop = bool(ids) and ids[-1] in eos or len(ids) < plan["max_new_tokens"]
            gens.append(
                Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop" if stop else "length")
            )
        trajs = run_episodes(Replay(gens), tok, make_env, ts, list(range(len(ts))), [0] * len(ts), sampling)
        scored = scorer.score(trajs)
        rewards = [float(t.reward) if t.reward is not None else 0.0 for t in scored]
        record["reward_mean"].append(sum(rewards) / max(len(rewards), 1))
        record["tokens"].append(sum(len(ids) for ids in completion_ids))
        record["samples"].append(len(rewards))
        record["task_ids"].append(list(task_id))
        return rewards

    cuda = plan["device"] == "cuda"
    steps: list[float] = []
    record_logs: list[dict] = []

    class Timer(TrainerCallback):
        t0 = 0.0

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
            steps.append(time.perf_counter() - self.t0)
            print(
                f"trl step {len(steps)}/{plan['steps']}: {steps[-1]:.1f}s, reward {record['reward_mean'][-1]:.3f}",
                flush=True,
            )

    class Logs(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if logs:
                record_logs.append({k: v for k, v in logs.items() if isinstance(v, (int, float))})

    n_prompts, group = plan["prompts_per_step"], plan["group_size"]
    accum = plan["grad_accum"]
    if (n_prompts * group) % accum:
        raise SystemExit(f"prompts x group ({n_prompts * group}) must divide by grad_accum {accum}")
    kw: dict = {}
    if cuda:
        # TRL's best mode on a GPU: vLLM generation colocated with training (one process).
        kw.update(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=plan["vllm_gpu_memory_utilization"])
        for k, v in {
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(plan["master_port"]),
        }.items():
            os.environ.setdefault(k, v)
    else:
        kw.update(use_cpu=True)
    cfg = GRPOConfig(
        output_dir=os.path.join(plan["work_dir"], "trl_out"),
        per_device_train_batch_size=n_prompts * group // accum,  # completions per micro-batch
        gradient_accumulation_steps=accum,  # one generation batch of prompts x group per optimizer step
        num_generations=group,
        max_completion_length=plan["max_new_tokens"],
        temperature=plan["temperature"],
        top_p=plan["top_p"],
        learning_rate=plan["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=plan["weight_decay"],
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        max_grad_norm=plan["max_grad_norm"],
        beta=plan["beta"],
        epsilon=plan["clip"],
        loss_type="dapo",
        scale_rewards="group",
        num_iterations=1,
        max_steps=plan["steps"],
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=plan["seed"],
        shuffle_dataset=False,
        remove_unused_columns=False,
        bf16=plan["bf16"],
        gradient_checkpointing=False,
        disable_dropout=True,
        dataloader_num_workers=0,
        log_completions=False,
        model_init_kwargs={"dtype": plan["learner_dtype"]},
        **kw,
    )
    trainer = GRPOTrainer(
        model=plan["model_path"],
        reward_funcs=toolcall_reward,
        args=cfg,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        callbacks=[Timer(), Logs()],
    )
    t_train = time.perf_counter()
    trainer.train()
    t_end = time.perf_counter()
    if plan.get("save_dir"):  # the final weights, scored afterwards by the same `jointrl eval` as jointrl's
        trainer.save_model(plan["save_dir"])
        tok.save_pretrained(plan["save_dir"])
    result = {
        "step_s": steps,
        "reward_mean": record["reward_mean"],
        "tokens": record["tokens"],
        "samples": record["samples"],
        "task_ids": record["task_ids"],
        "logs": record_logs,
        "prompt_token_mismatch": prompt_mismatch,
        "train_wall_s": t_end - t_train,
        "wall_s": t_end - T_START,
        "versions": {"trl": trl.__version__, "torch": torch.__version__, "transformers": transformers.__version__},
        "config": {
            "per_device_train_batch_size": cfg.per_device_train_batch_size,
            "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
            "bf16": cfg.bf16,
            "gradient_checkpointing": cfg.gradient_checkpointing,
            "loss_type": cfg.loss_type,
            "use_vllm": cfg.use_vllm,
            "beta": cfg.beta,
            "epsilon": cfg.epsilon,
        },
    }
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__.split("\n\n")[1])
    main(sys.argv[1], sys.argv[2])
