"""Stack dumps of every process of a run, on every node: the driver's own, the processes registered on this
node (``envs.stacks``), and those of every other alive node through a task pinned there that ships the files back."""

from __future__ import annotations

from rl.driver.actors.cluster import alive_nodes, node_id, on_node

__all__ = ["dump_run_stacks"]


def dump_run_stacks(stacks_dir: str, why: str, timeout_s: float = 15.0) -> str:
    """Every live process of the run dumps its Python stacks into ``stacks_dir``, each dump headed by ``why``;
    returns ``stacks_dir``. The driver's own go to ``driver_pid<pid>.txt``; every process registered there
    (``envs.stacks.register``: rollout and reward workers, learners) on this node is sent ``SIGUSR1``; on every
    other alive Ray node a zero-CPU task pinned there (``NodeAffinitySchedulingStrategy``) does the same
    and ships the files back. Each remote step waits at most ``timeout_s`` in all, and every failure is noted
    in the driver's file, never raised: a dump never hangs or ends a recovery."""
    import os

    from envs.stacks import dump_registered, dump_self

    own = os.path.join(stacks_dir, f"driver_pid{os.getpid()}.txt")
    notes: list[str] = []
    try:
        dump_self(own, why)
        local = dump_registered(stacks_dir, why)
        notes += [f"{n}: wrote no stack within 3 s" for n in local.silent]
        notes += _dump_remote_nodes(stacks_dir, why, timeout_s)
    except Exception as e:  # noqa: BLE001 - a post-mortem aid: its failure must not mask the failure it documents
        notes.append(f"stack dump failed: {type(e).__name__}: {e}")
    if notes:
        try:
            with open(own, "a") as f:
                f.write("".join(f"# {n}\n" for n in notes))
        except OSError:
            pass
    return stacks_dir


def _dump_remote_nodes(stacks_dir: str, why: str, timeout_s: float) -> list[str]:
    """``envs.stacks.dump_registered`` on every alive Ray node but this one (a task pinned there); the files it
    returns are written into ``stacks_dir`` here. Notes on the nodes that did not answer within ``timeout_s``."""
    import os

    import ray

    if not ray.is_initialized():
        return []
    from envs.stacks import dump_registered

    here = node_id()
    nodes = [n["NodeID"] for n in alive_nodes() if n["NodeID"] != here]
    refs = {on_node(dump_registered, n, max_retries=0).remote(stacks_dir, why): n for n in nodes}
    ready, late = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
    notes = [f"node {refs[r]}: no answer to the stack dump within {timeout_s:g} s" for r in late]
    for r in late:
        try:
            ray.cancel(r, force=True)
        except Exception:  # noqa: BLE001, S110 - the task ends with its node or its process anyway
            pass
    for r in ready:
        try:
            got = ray.get(r, timeout=1.0)
        except Exception as e:  # noqa: BLE001 - noted, never raised
            notes.append(f"node {refs[r]}: {type(e).__name__}: {e}")
            continue
        for name, text in got.files.items():
            _write_remote(stacks_dir, refs[r], os.path.basename(name), text)
        notes += [f"node {refs[r]}: {n}: wrote no stack within 3 s" for n in got.silent]
    return notes


def _write_remote(stacks_dir: str, node: str, name: str, text: str) -> None:
    """A remote node's stacks file ``name`` into ``stacks_dir`` here: under its own name, unless a different file
    of this node has it (same pid on two hosts), then prefixed by the node id; nothing when the folder is shared
    and already holds it."""
    import os

    path = os.path.join(stacks_dir, name)
    if os.path.exists(path):
        with open(path, errors="replace") as f:
            if f.read() == text:
                return
        path = os.path.join(stacks_dir, f"node{node[:12]}.{name}")
    with open(path, "w") as f:
        f.write(text)
