"""Learner memory you can predict: per-rank state bytes and peak resident memory against a floor.

For one model (default SmolLM2-135M, ``embedded:smollm2-135m-instruct``) and one quickstart-shaped
batch (``--prompts`` groups of ``--group`` completions, a ``--prompt-len``-token prompt each and
responses of up to ``--resp-len`` tokens; random token ids), in one run and side by side:

* per-rank bytes of parameters + gradients + AdamW state after one learner step, for 1 worker,
  for 2 FSDP workers (gloo, each holding its shards) and with LoRA (rank ``--lora-rank``), and
  the reference model's bytes where a KL term keeps one;
* each configuration's peak resident memory (of its own fresh process, over loading and every
  step: the maximum of the ``VmHWM`` intervals below, as resetting those resets ``ru_maxrss``) and the
  part above the process's resident memory before the model was loaded (Python, torch, HF);
* an analytic floor: the state bytes plus the largest micro-batch's activations, estimated as
  ``4 B x tokens x layers x (8 H + 2 H_kv + 4 I)`` (tokens: those the micro-batch needs, a
  shared prompt once, no padding; the tensors a decoder layer saves for its backward, counted
  at 4 bytes each) plus ``3 x 4 B x response tokens x V`` for the logits, their log-softmax and
  softmax (with ``learner.logits_chunk_tokens`` C: C tokens' worth, at most); sharded (FSDP),
  plus what FSDP must hold unsharded: the root's parameters (embeddings, final norm, lm_head),
  gathered for the whole forward and backward, and one decoder layer's, each with a full-size
  gradient before its reduce-scatter (less the shards already counted as state).
  It is an estimate, not a measurement: the ratio tells how far the learner is from what its state
  and one micro-batch need;
* with ``--steps N``, after each of N learner steps on the same-shaped batch (fresh random
  tokens each step): the resident memory, the allocator's bytes in live blocks and in freed blocks it
  still holds (``rl.trainer.memory.stats``: glibc's ``mallinfo2`` or jemalloc's ``stats.*``), and the bytes of the tensors the
  learner keeps (parameters, gradients, AdamW state): whether resident memory stays flat over a
  run, and when it does not, whether live tensors or the allocator's free pages grow;
* inside the last step, at each micro-batch's forward and backward and around the optimizer step:
  the peak resident memory since the point before (``VmHWM``, reset through
  ``/proc/self/clear_refs``), the resident memory and the allocator's live / free-held bytes: where in a
  step the peak is reached and how much of it is live blocks.

Start-up: each configuration's peak resident memory over building the learner (loading, sharding; ``VmHWM``
right after the ``Learner`` is made), beside the peak over the whole run. ``fsdp`` builds on the meta device and
each rank reads its shard (``learner.meta_init``, the default); ``fsdp-full-load`` is today's former path, every
rank loading the whole model before keeping its shard, for the side-by-side comparison. ``fsdp1`` is one worker
sharded as a process group of one (``learner.fsdp: always``), so that meta start applies at one rank too; the
``lora-*`` configurations are the same with LoRA (``lora`` itself: one unsharded worker, which always loads whole).

``--configs`` picks the configurations (default: ``full,fsdp,lora``; ``full-chunked`` is one
worker with ``--logits-chunk-tokens``; ``full-trim`` is one worker that hands its freed memory back
after each step (``learner.hold_memory: false``: ``malloc_trim``, or jemalloc's purge under
``--allocator jemalloc``) where the default keeps it for the next step; ``full-padded`` is one worker with
the padded shared-prompt layout, ``bench/padded_layout.py``), so that they run side by side.

Each configuration runs in its own spawned processes (FSDP: 2 ranks). Results print as a table
and, with ``--results``, go to bench/RESULTS.md. Run it under the shared heavy-job lock.
"""

from __future__ import annotations

import os as _os

# What a learner actor gets (learner.huge_pages, the default: rl.trainer.memory.learner_env); torch
# reads it at its first allocation, so it is set before torch is imported. THP_MEM_ALLOC_ENABLE=0 in the
# environment measures 4 KB pages instead.
_os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

if __name__ == "__main__":  # the learner actor's malloc (learner.allocator; --allocator): read at exec
    from _actor_env import reexec_with_allocator

    reexec_with_allocator(autocast_default="off")  # fp32 unless --autocast

import argparse
import multiprocessing as mp
import os
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _rss() -> int:
    from rl.trainer.memory import rss_bytes

    return rss_bytes()


def _kept_bytes(lrn) -> int:
    """Bytes of the tensors the learner keeps between steps: parameters, gradients, optimizer state."""
    ps = list(lrn.model.parameters())
    return sum(_nbytes(p) for p in ps) + sum(_nbytes(p.grad) for p in ps if p.grad is not None) + optim_bytes(lrn)


def _batch(tok_vocab: int, args: argparse.Namespace, seed: int = 0):
    import torch

    from rl.algos.batch import Batch, Sample

    g = torch.Generator().manual_seed(seed)
    samples, uid = [], 0
    for gid in range(args.prompts):
        prompt = torch.randint(10, tok_vocab, (args.prompt_len,), generator=g).tolist()
        for j in range(args.group):
            n = int(torch.randint(args.resp_len // 2, args.resp_len + 1, (1,), generator=g))
            resp = torch.randint(10, tok_vocab, (n,), generator=g).tolist()
            adv = 1.0 if j % 2 else -1.0
            samples.append(
                Sample(
                    prompt + resp, len(prompt), [1] * n, [-1.0] * n, adv, "tool_call", reward=adv, group_id=gid, uid=uid
                )
            )
            uid += 1
    return Batch(samples, sum(s.num_tokens for s in samples), len(samples))


def _tokens_run(mb: list, share_prompt: bool) -> int:
    """Tokens a micro-batch runs through the decoder: with a shared prompt, each prompt once."""
    if not share_prompt:
        return sum(len(s.input_ids) for s in mb)
    prompts = {tuple(s.input_ids[: s.prompt_len]) for s in mb}
    return sum(len(p) for p in prompts) + sum(len(s.input_ids) - s.prompt_len for s in mb)


def _nbytes(t) -> int:
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def optim_bytes(lrn) -> int:
    """Bytes of the learner's optimizer state on this rank (its shard when sharded)."""
    import torch

    return sum(_nbytes(v) for st in lrn.opt.state.values() for v in st.values() if torch.is_tensor(v))


class _Phases:
    """Resident memory at points inside each learner step, and the peak between consecutive points.

    Wraps the learner's own methods (``_forward``: after a micro-batch's forward; ``_accumulate``: after its
    backward; ``_update``: before and after the optimizer step). At each point it reads the resident size,
    the peak since the point before (``VmHWM``, reset by writing 5 to ``/proc/self/clear_refs``) and the allocator's
    live / free-held bytes (``rl.trainer.memory.stats``). Kept for the last step only.
    """

    def __init__(self, lrn) -> None:
        self.points: list[tuple[str, int, int, dict | None]] = []
        for name, before, after in (
            ("_forward", None, "forward"),
            ("_accumulate", None, "backward"),
            ("_update", "grads reduced", "optimizer step"),
        ):
            setattr(lrn, name, self._wrap(getattr(lrn, name), before, after))
        # Resetting VmHWM resets ru_maxrss too (both are the kernel's hiwater_rss): the process's peak is
        # kept here, as the maximum over every interval, the loading before this included.
        self.peak = self.hwm()
        self.reset()

    @staticmethod
    def hwm() -> int:
        with open("/proc/self/status") as f:
            return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmHWM:"))

    @staticmethod
    def reset() -> None:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")

    def mark(self, label: str) -> None:
        from rl.trainer import memory

        hwm = self.hwm()
        self.peak = max(self.peak, hwm)
        self.points.append((label, _rss(), hwm, memory.stats()))
        self.reset()

    def _wrap(self, fn, before, after):
        def wrapped(*a, **k):
            if before:
                self.mark(before)
            out = fn(*a, **k)
            self.mark(after)
            return out

        return wrapped


def _worker(kind: str, rank: int, world: int, port: int, model_path: str, args: argparse.Namespace, q) -> None:
    import torch

    from rl.config.recipe import AlgoConfig, KLConfig, LearnerConfig, LoraConfig, ModelConfig, OptimConfig
    from rl.trainer import memory
    from rl.trainer.sharding import shard_batch
    from rl.trainer.learner import Learner

    torch.set_num_threads(max(1, args.threads // world))
    before = _rss()
    lora = LoraConfig(rank=args.lora_rank) if kind.startswith("lora") else LoraConfig()
    cfg = ModelConfig(path=model_path, learner_dtype="float32", autocast=args.autocast)
    algo = AlgoConfig(name="grpo", optim=OptimConfig(lr=1e-5), kl=KLConfig(coef=args.kl_coef))
    chunk = args.logits_chunk_tokens if kind == "full-chunked" else 0
    learner = LearnerConfig(
        workers=world,
        micro_batch_tokens=args.micro_batch_tokens,
        lora=lora,
        logits_chunk_tokens=chunk,
        hold_memory=kind != "full-trim",
        meta_init=not kind.endswith("-load"),
        fsdp="always" if kind.endswith(("-fsdp1", "-fsdp1-load")) else "auto",
    )
    lrn = Learner(
        model_path,
        cfg,
        algo,
        threads=max(1, args.threads // world),
        rank=rank,
        world_size=world,
        dist_port=port,
        learner=learner,
    )
    startup = _Phases.hwm()  # the peak over start-up (model building, sharding), before _Phases resets it
    from bench import padded_layout

    padded_layout.use(lrn, kind == "full-padded")
    loaded = _rss()
    phases = _Phases(lrn)
    rss_steps, heap_steps, kept_steps = [], [], []
    for step in range(args.steps):  # a fresh batch of the same shape each step, as in a run
        batch = _batch(len(lrn.tokenizer), args, seed=step)
        if world > 1:
            batch = shard_batch(batch, world)[rank]
        phases.points.clear()
        phases.mark("step start")
        m = lrn.step(batch)
        phases.mark("step end (after the trim)" if lrn.trim_after_step else "step end")
        rss_steps.append(_rss())
        heap_steps.append(memory.stats())
        kept_steps.append(_kept_bytes(lrn))
    params = [p for p in lrn.model.parameters()]
    out = {
        "kind": kind,
        "rank": rank,
        "params": sum(_nbytes(p) for p in params),
        "grads": sum(_nbytes(p.grad) for p in params if p.grad is not None),
        "optim": optim_bytes(lrn),
        "reference": sum(_nbytes(p) for p in lrn.ref.parameters()) if lrn.ref is not None else 0,
        "peak_rss": max(phases.peak, phases.hwm()),  # not ru_maxrss: _Phases resets it
        "startup_rss": startup,
        "rss_before": before,
        "step_s": m["timing/learner_compute_s"],
        "config": lrn.model.config.to_dict(),
        "micros": [
            (_tokens_run(mb, lrn.lcfg.share_prompt), sum(s.num_tokens for s in mb))
            for mb in lrn.micro_batches(batch.samples)
        ],
        "world": world,
        "rss_loaded": loaded,
        "phases": phases.points,
        "chunk": chunk,
        "rss_steps": rss_steps,
        "heap_steps": heap_steps,
        "kept_steps": kept_steps,
    }
    q.put(out)
    lrn.shutdown()


def _run(kind: str, world: int, model_path: str, args: argparse.Namespace) -> list[dict]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = 0
    if world > 1:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    procs = [ctx.Process(target=_worker, args=(kind, r, world, port, model_path, args, q)) for r in range(world)]
    for p in procs:
        p.start()
    res = [q.get(timeout=3600) for _ in procs]
    for p in procs:
        p.join()
    return sorted(res, key=lambda r: r["rank"])


def _floor(r: dict) -> int:
    """State + the largest micro-batch's activations and logits (+ FSDP's gathered units); see the docstring."""
    c = r["config"]
    h, i, layers, v = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    kv = h * c.get("num_key_value_heads", c["num_attention_heads"]) // c["num_attention_heads"]

    def micro(run: int, resp: int) -> int:
        act = 4 * run * layers * (8 * h + 2 * kv + 4 * i)
        return act + 3 * 4 * (min(resp, r["chunk"]) if r.get("chunk") else resp) * v

    gathered = 0
    if r["world"] > 1:  # the root's parameters stay gathered through forward and backward, with one layer's;
        # both get a full-size gradient before the reduce-scatter
        root = v * h * (1 if c.get("tie_word_embeddings") else 2) + h
        layer = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h
        gathered = 2 * 4 * (root + layer) * (r["world"] - 1) // r["world"]  # less the shards counted as state
    act = max(micro(run, resp) for run, resp in r["micros"])
    return r["params"] + r["grads"] + r["optim"] + r["reference"] + act + gathered


def _steps_table(rows: dict[str, list[dict]]) -> list[str]:
    """Per step: resident memory, the allocator's live and free-held bytes, the learner's kept tensors; and the
    largest change of resident memory after step 1 (once AdamW's state exists) relative to step 1's."""
    mb = 2**20

    def col(vals) -> str:
        return ", ".join("-" if v is None else f"{v / mb:.0f}" for v in vals)

    lines = [
        "",
        "after each learner step (MB): RSS; malloc in live blocks; malloc freed but held; "
        "parameters + gradients + AdamW state",
        "",
        "| config | rank | RSS | malloc live | malloc free held | kept tensors | largest RSS change after step 1 (of step 1) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, rs in rows.items():
        for r in rs:
            rss, heap = r["rss_steps"], r["heap_steps"]
            drift = max((abs(b - rss[0]) for b in rss[1:]), default=0) / rss[0]
            lines.append(
                f"| {name} | {r['rank']} | {col(rss)} | {col(h and h['in_use'] for h in heap)} | "
                f"{col(h and h['free_held'] for h in heap)} | {col(r['kept_steps'])} | {100 * drift:.1f}% |"
            )
    return lines


def _phases_table(rows: dict[str, list[dict]]) -> list[str]:
    """The last step's points (``_Phases``): peak since the point before, resident, malloc live / free held."""
    mb = 2**20
    lines = [
        "",
        "inside the last step (MB): peak resident since the point before (VmHWM), resident at the point, "
        "malloc in live blocks, malloc freed but held; 'forward'/'backward' are each micro-batch's",
        "",
        "| config | rank | point | peak since previous | RSS | malloc live | malloc free held |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, rs in rows.items():
        for r in rs:
            lines.append(
                f"| {name} | {r['rank']} | model loaded (after the trim) | - | {r['rss_loaded'] / mb:.0f} | - | - |"
            )
            for label, rss, hwm, heap in r["phases"]:
                live = f"{heap['in_use'] / mb:.0f}" if heap else "-"
                held = f"{heap['free_held'] / mb:.0f}" if heap else "-"
                lines.append(f"| {name} | {r['rank']} | {label} | {hwm / mb:.0f} | {rss / mb:.0f} | {live} | {held} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="embedded:smollm2-135m-instruct")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=254)
    ap.add_argument("--resp-len", type=int, default=64)
    ap.add_argument("--micro-batch-tokens", type=int, default=4096)
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--kl-coef", type=float, default=0.0)
    ap.add_argument("--autocast", action="store_true", help="bf16 autocast (default: fp32)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--logits-chunk-tokens", type=int, default=512, help="learner.logits_chunk_tokens of full-chunked")
    ap.add_argument("--steps", type=int, default=1, help="learner steps per configuration (RSS after each)")
    ap.add_argument(
        "--configs",
        default="full,fsdp,lora",
        help="comma-separated: full, full-chunked, full-trim, full-padded, fsdp, fsdp-full-load, fsdp1, "
        "fsdp1-full-load, lora, lora-fsdp, lora-fsdp-full-load, lora-fsdp1, lora-fsdp1-full-load",
    )
    ap.add_argument(
        "--allocator",
        choices=["auto", "jemalloc", "system"],
        default="auto",
        help="malloc of every configuration's processes, as learner.allocator (auto: jemalloc where installed)",
    )
    ap.add_argument("--results", action="store_true", help="append the table to bench/RESULTS.md")
    args = ap.parse_args(argv)
    from rl.trainer import memory
    from rl.trainer.hub import resolve_model

    path = resolve_model(args.model)
    configs = {
        "full": ("1 worker", "full", 1),
        "full-chunked": (f"1 worker, logits in chunks of {args.logits_chunk_tokens}", "full-chunked", 1),
        "full-trim": ("1 worker, memory handed back after each step", "full-trim", 1),
        "full-padded": ("1 worker, padded shared-prompt layout", "full-padded", 1),
        "fsdp": ("2 FSDP workers", "full", 2),
        "fsdp-full-load": ("2 FSDP workers, whole model loaded per rank", "full-load", 2),
        "fsdp1": ("1 FSDP worker (fsdp always)", "full-fsdp1", 1),
        "fsdp1-full-load": ("1 FSDP worker, whole model loaded", "full-fsdp1-load", 1),
        "lora": (f"LoRA r={args.lora_rank}", "lora", 1),
        "lora-fsdp": (f"LoRA r={args.lora_rank}, 2 FSDP workers", "lora", 2),
        "lora-fsdp-full-load": (
            f"LoRA r={args.lora_rank}, 2 FSDP workers, whole model loaded per rank",
            "lora-load",
            2,
        ),
        "lora-fsdp1": (f"LoRA r={args.lora_rank}, 1 FSDP worker", "lora-fsdp1", 1),
        "lora-fsdp1-full-load": (f"LoRA r={args.lora_rank}, 1 FSDP worker, whole model loaded", "lora-fsdp1-load", 1),
    }
    wanted = [c.strip() for c in args.configs.split(",") if c.strip()]
    bad = [c for c in wanted if c not in configs]
    if bad or "full" not in wanted:
        ap.error(
            f"--configs: {', '.join(bad) or 'full is needed (the reference row)'}; choose from {', '.join(configs)}"
        )
    rows = {configs[c][0]: _run(configs[c][1], configs[c][2], path, args) for c in wanted}
    full = rows["1 worker"][0]
    state_full = full["params"] + full["grads"] + full["optim"]
    lines = [
        f"learner_memory: {args.model}, batch {args.prompts}x{args.group}, prompt {args.prompt_len}, "
        f"responses <= {args.resp_len} tokens, micro_batch_tokens {args.micro_batch_tokens}, "
        f"{'bf16 autocast' if args.autocast else 'fp32'}, kl_coef {args.kl_coef}, {args.steps} step(s) each, "
        f"malloc {memory.allocator()} (--allocator {args.allocator})",
        "",
        "| config | rank | params MB | grads MB | AdamW MB | state / 1-worker state | AdamW / full AdamW | "
        "start-up peak RSS MB | start-up peak - pre-load RSS MB | "
        "peak RSS MB | peak - pre-load RSS MB | floor MB | (peak - pre-load) / floor | step s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    mb = 2**20
    for name, rs in rows.items():
        for r in rs:
            state = r["params"] + r["grads"] + r["optim"]
            fl = _floor(r)
            lines.append(
                f"| {name} | {r['rank']} | {r['params'] / mb:.1f} | {r['grads'] / mb:.1f} | {r['optim'] / mb:.1f} | "
                f"{state / state_full:.3f} | {r['optim'] / full['optim']:.4f} | {r['startup_rss'] / mb:.0f} | "
                f"{(r['startup_rss'] - r['rss_before']) / mb:.0f} | {r['peak_rss'] / mb:.0f} | "
                f"{(r['peak_rss'] - r['rss_before']) / mb:.0f} | {fl / mb:.0f} | "
                f"{(r['peak_rss'] - r['rss_before']) / fl:.2f} | {r['step_s']:.1f} |"
            )
    n = full["params"] // 4
    lines += ["", f"bytes per parameter (1 worker, fp32 AdamW): {state_full / n:.1f}"]
    if args.steps > 1:
        lines += _steps_table(rows)
    lines += _phases_table(rows)
    text = "\n".join(lines)
    print(text)
    if args.results:
        import platform
        import subprocess

        cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next(
            (ln.split(":", 1)[1].strip() for ln in cpu.splitlines() if ln.startswith("Model name")),
            platform.processor(),
        )
        with open(ROOT / "bench" / "RESULTS.md", "a") as f:
            f.write(
                f"\n## learner_memory ({model}, {os.cpu_count()} cores)\n\n"
                f"`python bench/learner_memory.py {' '.join(argv if argv is not None else sys.argv[1:])}`\n\n"
                + text
                + "\n"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
