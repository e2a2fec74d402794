"""Weight-sync cost against its floor, in one process (no Ray).

For each model: (a) the floor, the time ``safetensors.torch.save_file`` takes to write the
model's state dict (bfloat16, ``lm_head.weight`` included, tensors already converted) to a
file in /dev/shm; (b) jointrl's sync, ``Learner.export_weights("bfloat16")`` (fp32 -> bf16
``copy_`` straight into one of two preallocated, memory-mapped safetensors files in /dev/shm,
then an atomic rename) followed by ``VLLMEngine.load_weights``
(the engine reloads the file in place) on a vLLM engine of the same model (bf16,
max_model_len 1024); (c) the ``collective`` transport on the same learner and engine, in the same run: the
learner (member 0) broadcasts ``Learner.export_collective`` in buckets of ``--bucket-mb`` over a gloo group
(NCCL with ``--device cuda``) while the engine's worker takes them into its in-place reload
(``VLLMEngine.load_weights_stream``); the learner's weights are scaled first, so the log-prob check after it shows
the stream, not the file, brought them. Medians of ``--n`` timed repetitions after one untimed warm-up. The
issue's goal: sync <= 2x the floor. The Ray actor hop of a real run is not included.

Appends/replaces its section of ``bench/RESULTS.md``. ``--device cuda``: the learner's weights
on the GPU (the export copies them device -> shared memory), a GPU vLLM engine (the ``vllm``
package) beside it; not run: no GPU was available to this work (see bench/README.md).

    JOINTRL_CACHE=/tmp/jcache .venv/bin/python bench/weight_sync.py --models tiny,smollm2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # the reload runs our function in vLLM's worker

from bench import _device  # noqa: E402

MODELS = {"tiny": "embedded:tiny", "smollm2": "embedded:smollm2-135m-instruct"}


def floor_state_dict(model):
    """What export_weights writes: every state-dict tensor in bf16, plus lm_head."""
    import torch

    sd = {k: v.detach().to("cpu", torch.bfloat16, copy=True).contiguous() for k, v in model.state_dict().items()}
    head = model.get_output_embeddings()
    if head is not None:
        sd["lm_head.weight"] = head.weight.detach().to("cpu", torch.bfloat16, copy=True).contiguous()
    return sd


def _max_diff(learner, engine) -> float:
    """Largest per-token gap between the engine's and the learner's log-probs of one sentence."""
    ids = learner.tokenizer("The quick brown fox jumps over the lazy dog.", add_special_tokens=False)["input_ids"]
    e_lp = engine.score(ids[:3], ids[3:])
    l_lp = learner.logprobs(ids[:3], ids[3:])
    return max(abs(a - b) for a, b in zip(e_lp, l_lp))


def bench_collective(learner, engine, n: int, bucket_mb: float, device: str) -> dict:
    """The collective transport between ``learner`` (member 0, this process) and ``engine``'s worker (member 1):
    join once, then ``n`` + 1 streams (the first untimed), each timed from the learner's first broadcast to the
    engine's reload returning. The learner's weights are scaled before, so the check shows the stream's work."""
    import threading

    import torch

    from rl.trainer.collectives import free_port
    from rollout.collective import bucket_bytes
    from rollout.weights import CollectiveJoin, CollectiveWeights

    spec = CollectiveJoin("127.0.0.1", free_port(), 0, 2, "nccl" if device == "cuda" else "gloo", 600.0, "bench")
    joined = threading.Thread(target=engine.join_weight_group, args=(CollectiveJoin(**{**spec.__dict__, "rank": 1}),))
    joined.start()
    learner.weights.join_group(spec)
    joined.join()
    with torch.no_grad():
        for p in learner.model.parameters():
            p.mul_(0.9)
    stale = _max_diff(learner, engine)  # the gap the streams must close
    times, errors = [], []
    bucket = bucket_bytes(bucket_mb)
    for i in range(n + 1):

        def take(version: int = i + 1) -> None:
            try:
                engine.load_weights_stream(CollectiveWeights(version, "bench"))
            except Exception as e:  # noqa: BLE001 - raised below, in the main thread
                errors.append(e)

        t0 = time.perf_counter()
        th = threading.Thread(target=take)
        th.start()
        learner.export_collective("bfloat16", i + 1, bucket)
        th.join()
        if errors:
            raise errors[0]
        if i:
            times.append(time.perf_counter() - t0)
    return dict(sync=statistics.median(times), all=times, max_diff=_max_diff(learner, engine), stale=stale)


def bench_model(name: str, n: int, device: str = "cpu", bucket_mb: float = 256.0) -> dict:
    import shutil

    from safetensors.torch import save_file

    from rl.config.recipe import AlgoConfig, ModelConfig
    from rl.trainer.learner import Learner
    from rl.trainer.hub import resolve_model
    from rollout.engine import VLLMEngine

    path = resolve_model(MODELS[name])
    shm = tempfile.mkdtemp(prefix="jointrl-bench-", dir="/dev/shm")
    learner = Learner(path, ModelConfig(), AlgoConfig(), seed=0, threads=0, shm_dir=shm)
    engine = None
    try:
        params = sum(p.numel() for p in learner.model.parameters())
        sd = floor_state_dict(learner.model)
        nbytes = sum(t.numel() * t.element_size() for t in sd.values())
        floor_path = os.path.join(shm, "floor.safetensors")
        floor = []
        for i in range(n + 1):
            t0 = time.perf_counter()
            save_file(sd, floor_path)
            dt = time.perf_counter() - t0
            os.remove(floor_path)
            if i:
                floor.append(dt)
        del sd
        # On a GPU the engine and the learner share it: vLLM takes 30% of its memory.
        engine = VLLMEngine(path, dtype="bfloat16", seed=0, max_model_len=1024, gpu_memory_utilization=0.3)
        export, reload, sync = [], [], []
        for i in range(n + 1):
            t0 = time.perf_counter()
            p = learner.export_weights("bfloat16")
            t1 = time.perf_counter()
            engine.load_weights(p)
            t2 = time.perf_counter()
            if i:
                export.append(t1 - t0)
                reload.append(t2 - t1)
                sync.append(t2 - t0)
        # Sanity: the engine now holds the learner's weights (same logprobs up to bf16 noise).
        max_diff = _max_diff(learner, engine)
        coll = bench_collective(learner, engine, n, bucket_mb, device)
    finally:
        if engine is not None:
            engine.shutdown()
        learner.shutdown()
        shutil.rmtree(shm, ignore_errors=True)
    med = statistics.median
    return dict(
        model=name,
        params=params,
        mbytes=nbytes / 1e6,
        floor=med(floor),
        export=med(export),
        reload=med(reload),
        sync=med(sync),
        ratio=med(sync) / med(floor),
        max_diff=max_diff,
        floor_all=floor,
        export_all=export,
        sync_all=sync,
        coll=coll["sync"],
        coll_all=coll["all"],
        coll_ratio=coll["sync"] / med(sync),
        coll_diff=coll["max_diff"],
        coll_stale=coll["stale"],
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tiny,smollm2", help="comma-separated: " + ", ".join(MODELS))
    ap.add_argument("--n", type=int, default=5, help="timed repetitions per measurement (median reported)")
    ap.add_argument("--no-write", action="store_true", help="print only, leave bench/RESULTS.md alone")
    ap.add_argument(
        "--bucket-mb", type=float, default=256.0, help="collective: MiB per bucket (learner.weight_bucket_mb)"
    )
    _device.add_argument(ap)
    args = ap.parse_args(argv)
    device = _device.select(args.device)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in names:
        if m not in MODELS:
            ap.error(f"unknown model {m!r}; choose from {', '.join(MODELS)}")
    from bench._results import machine, table, write_section

    rows, runs = [], []
    for m in names:
        r = bench_model(m, args.n, device, args.bucket_mb)
        runs.append(
            f"- {m}: floor runs {', '.join(f'{x:.3f}' for x in r['floor_all'])}; export runs "
            f"{', '.join(f'{x:.3f}' for x in r['export_all'])}; sync runs "
            f"{', '.join(f'{x:.3f}' for x in r['sync_all'])}; collective runs "
            f"{', '.join(f'{x:.3f}' for x in r['coll_all'])} (s)"
        )
        rows.append(
            [
                r["model"],
                f"{r['params'] / 1e6:.2f}M",
                f"{r['mbytes']:.1f}",
                f"{r['floor']:.3f}",
                f"{r['export']:.3f}",
                f"{r['reload']:.3f}",
                f"{r['sync']:.3f}",
                f"{r['ratio']:.2f}x",
                "yes" if r["ratio"] <= 2.0 else "NO",
                f"{r['max_diff']:.3f}",
                f"{r['coll']:.3f}",
                f"{r['coll_ratio']:.2f}x",
                f"{r['coll_diff']:.3f} (before: {r['coll_stale']:.3f})",
            ]
        )
        print(
            f"{m}: floor runs {[round(x, 3) for x in r['floor_all']]}, sync runs {[round(x, 3) for x in r['sync_all']]}, "
            f"collective runs {[round(x, 3) for x in r['coll_all']]}",
            flush=True,
        )
    headers = [
        "model",
        "parameters",
        "file MB (bf16)",
        "floor s (save_file)",
        "export s",
        "engine reload s",
        "sync s (export+reload)",
        "sync/floor",
        "<= 2x",
        "max logprob diff, engine vs learner",
        "collective sync s",
        "collective/file sync",
        "max logprob diff after collective (before it)",
    ]
    body = (
        f"Device: {device}. In one process, no Ray (the actor hop of a real run is not included). Medians of {args.n} timed runs "
        "after one warm-up. floor = `safetensors.torch.save_file` of the bf16 state dict (lm_head included, "
        'tensors pre-converted) into /dev/shm; export = `Learner.export_weights("bfloat16")` (fp32->bf16 '
        "`copy_` into one of two preallocated memory-mapped safetensors files in /dev/shm + rename; the first use "
        "of each of the two files also pays its page faults, so one timed run is slower, see the runs below); reload = `VLLMEngine.load_weights(path)` (in-place reload + prefix-cache reset). "
        "Goal from the issue: sync/floor <= 2. Last column: a check that the reloaded engine scores a sentence "
        f"like the learner does. collective = the learner broadcasting `export_collective` in {args.bucket_mb:g} MiB "
        "buckets over a gloo group into the same engine's in-place reload (`VLLMEngine.load_weights_stream`), "
        "after the learner's weights were scaled by 0.9 (its check shows the stream brought them).\n\n"
        + table(headers, rows)
        + "\n\nEvery timed run, in order:\n\n"
        + "\n".join(runs)
    )
    print()
    print(machine())
    print(table(headers, rows))
    if not args.no_write:
        write_section("weight_sync", "Weight sync vs. its floor (`bench/weight_sync.py`)", body)
        print("\nwrote bench/RESULTS.md (section weight_sync)")


if __name__ == "__main__":
    main()
