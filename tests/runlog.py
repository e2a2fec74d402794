"""A run's ``metrics.jsonl`` as tests compare two runs: per step, every metric that must not differ."""

from __future__ import annotations

import json
from pathlib import Path


def comparable_steps(path: Path) -> dict[int, dict]:
    """``{step: metrics}`` from the metrics file at ``path``, less what differs between any two runs of the
    same recipe: wall-clock times (``timing/``, ``*latency_s``), resident memory (``memory/``) and
    ``weights/changed_fraction`` (absent at the first sync of a new learner: a resumed or restarted run's
    export has no previous one to compare with)."""
    out = {}
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        out[rec["step"]] = {
            k: v
            for k, v in rec.items()
            if not k.startswith(("timing/", "memory/", "weights/")) and not k.endswith("latency_s")
        }
    return out
