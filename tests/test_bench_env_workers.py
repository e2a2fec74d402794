"""bench/env_workers.py runs real sandboxed episodes under each setting and checks their verdicts agree."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.env_workers import main  # noqa: E402


def test_bench_times_each_setting_and_compares_verdicts(capsys):
    assert main(["--tasks", "1", "--workers", "1,2", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "env_workers=1:" in out and "env_workers=2:" in out and "identical across settings" in out
