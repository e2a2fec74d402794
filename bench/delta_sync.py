"""Delta sync against full sync, side by side, in one process (no Ray, no vLLM reload).

A real policy (``--model``, fp32) takes real AdamW steps (``--lr``, the quickstart's by default) on random
token batches; after each step ``WeightExport.file("bfloat16")`` exports it, and two engine-side receivers
(``rollout.pool.RolloutWorker`` with a stand-in engine that does not reload, since that reload is the same on both
paths) take the step's update: one always the full weights (``BlobWeights``, what an engine on another node gets
through Ray's object store today), the other the ``DeltaWeights`` of ``learner.delta_sync_full_every`` (a full
sync every ``--full-every`` syncs; a refused delta repaired by a full one). Per step: the bf16 changed fraction,
the bytes each path puts through the object store (the pickled record), and the time each takes from the
learner's read to the engine's verified file (pickle, unpickle, write or patch and checksum), and the learner's
export time (which, once deltas are kept, also gathers the changed entries and hashes every tensor). The two
receivers' files are checked equal to the learner's export after every step.

    PYTHONPATH=$PWD .venv/bin/python bench/delta_sync.py --steps 12
"""

from __future__ import annotations

import argparse
import pickle
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class _NoReload:
    """The engine stand-in: the vLLM reload is the same on both paths, so it is left out of the comparison."""

    def load_weights(self, path: str) -> None:
        pass

    def shutdown(self) -> None:
        pass


def _timed_receive(worker, exp, out: str, delta: bool) -> tuple[int, float, str]:
    """(bytes through the object store, seconds from the learner's read to the engine's file, record kind)."""
    t0 = time.perf_counter()
    update = exp.read_update(out, delta=delta)
    blob = pickle.dumps(update, protocol=5)
    ok = worker.receive(pickle.loads(blob))
    kind = type(update).__name__
    if not ok:  # refused delta: the full weights follow
        full = pickle.dumps(exp.read_update(out), protocol=5)
        worker.receive(pickle.loads(full))
        blob, kind = blob + full, "repaired"
    return len(blob), time.perf_counter() - t0, kind


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from rl.trainer.hub import resolve_model
    from rl.trainer.weights import WeightExport
    from rollout.pool import RolloutWorker

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="embedded:smollm2-135m-instruct")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--full-every", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2.0e-5)
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args()
    torch.manual_seed(0)
    path = resolve_model(args.model)
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    tmp = Path(tempfile.mkdtemp(prefix="jointrl-delta-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    exp = WeightExport(model, None, 0, torch.device("cpu"), tmp / "learner")
    full_w, delta_w = (RolloutWorker(path, [], engine=_NoReload()) for _ in range(2))
    full_w._blob, delta_w._blob = str(tmp / "full.safetensors"), str(tmp / "delta.safetensors")
    rows = []
    try:
        for step in range(args.steps):
            ids = torch.randint(0, model.config.vocab_size, (2, args.tokens))
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            out = exp.file("bfloat16")  # with deltas kept (from step 2 on): the changed entries and checksums too
            t_export = time.perf_counter() - t0
            frac = exp.metrics().get("weights/changed_fraction", float("nan"))
            nbytes_f, t_f, _ = _timed_receive(full_w, exp, out, delta=False)
            nbytes_d, t_d, kind = _timed_receive(delta_w, exp, out, delta=step % args.full_every != 0)
            published = Path(out).read_bytes()
            assert Path(full_w._blob).read_bytes() == published == Path(delta_w._blob).read_bytes(), step
            rows.append((step + 1, frac, nbytes_f, t_f, nbytes_d, t_d, kind))
            print(
                f"step {step + 1:3d}  export {t_export:6.3f} s  changed {frac:8.4%}  full {nbytes_f / 1e6:8.1f} MB {t_f:6.3f} s  "
                f"delta-path {nbytes_d / 1e6:8.2f} MB {t_d:6.3f} s  ({kind})",
                flush=True,
            )
    finally:
        full_w.shutdown()
        delta_w.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    deltas = [r for r in rows if r[6] == "DeltaWeights"]
    if deltas:
        print(
            f"median over {len(deltas)} delta syncs: changed {statistics.median(r[1] for r in deltas):.4%}, "
            f"bytes {statistics.median(r[4] for r in deltas) / 1e6:.2f} MB vs full "
            f"{statistics.median(r[2] for r in deltas) / 1e6:.1f} MB, time {statistics.median(r[5] for r in deltas):.3f} s "
            f"vs full {statistics.median(r[3] for r in deltas):.3f} s"
        )


if __name__ == "__main__":
    main()
