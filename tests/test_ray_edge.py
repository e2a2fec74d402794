"""What the driver asks of the Ray edge (``rl.driver.actors``), checked without Ray: the shared-memory sweep of a
killed run goes through the edge's node callback for nodes that are alive, and runs on this machine otherwise."""

from __future__ import annotations

import json
import os
from pathlib import Path

from rl.driver.recovery import free_dead_run


def test_free_dead_run_sweeps_alive_nodes_through_the_edge_and_this_machine_otherwise(tmp_path: Path) -> None:
    here, there = tmp_path / "seg-here", tmp_path / "seg-there"
    here.write_bytes(b"x")
    there.write_bytes(b"x")
    live = tmp_path / ".live.json"
    engines = [["alive-node", [str(there)]], ["gone-node", [str(here)]]]
    live.write_text(json.dumps({"pid": os.getpid(), "shm_dir": "", "engines": engines}))
    asked = []

    def sweep(node: str, segments: list[str], wait_s: float) -> list[str] | None:
        asked.append((node, segments))
        return [f"{node}:{s}" for s in segments] if node == "alive-node" else None  # None: not a live node

    removed = free_dead_run(live, sweep)
    assert asked == [("alive-node", [str(there)]), ("gone-node", [str(here)])]
    assert removed == [f"alive-node:{there}", str(here)]
    assert not here.exists(), "a gone node's segments are this machine's: unlinked here"
    assert there.exists(), "an alive node's segments are left to the task pinned there"
    assert not live.exists()


def test_free_dead_run_without_the_edge_frees_everything_here(tmp_path: Path) -> None:
    seg = tmp_path / "seg"
    seg.write_bytes(b"x")
    live = tmp_path / ".live.json"
    live.write_text(json.dumps({"pid": os.getpid(), "shm_dir": "", "engines": [["some-node", [str(seg)]]]}))
    assert free_dead_run(live) == [str(seg)] and not seg.exists()
