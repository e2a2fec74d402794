"""Shared test setup: a per-machine cache for the embedded tiny model, and fixtures for it."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

# Build the embedded tiny model once per machine (not per test or per session): a fixed
# folder under the temp dir, unless the caller chose a cache already.
os.environ.setdefault("JOINTRL_CACHE", str(Path(tempfile.gettempdir()) / "jointrl-test-cache"))
# Tests never log to a W&B server, even where an API key is configured.
os.environ["WANDB_MODE"] = "offline"
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# vLLM's engine core in the process that starts the engine (vLLM's own switch; on CPU it also drops the separate
# worker process): two fewer processes importing vLLM per engine start, a tiny-recipe run 52 -> 31 s (2 cores,
# AMD EPYC). Runs, rewards and samples are the same (same seeds, same kernels); the tests that look at the engine
# core process or kill a run (test_faults' pool tests, test_reaper, test_resume, test_integration's CLI run: an
# in-process core's segments are not recorded for freeing after a SIGKILL) set it back to 1, the layout
# `jointrl train` uses. `VLLM_ENABLE_V1_MULTIPROCESSING=1 pytest ...` runs every engine that way.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


@pytest.fixture(autouse=True)
def _keep_ld_preload():
    """vLLM's CPU platform puts its OpenMP library into this process's LD_PRELOAD when a test builds an engine
    config here (vllm/platforms/cpu.py); put it back after each test, so the next test's subprocesses and
    preload arithmetic see the environment the session started with."""
    before = os.environ.get("LD_PRELOAD")
    yield
    if before is None:
        os.environ.pop("LD_PRELOAD", None)
    else:
        os.environ["LD_PRELOAD"] = before


def shm_files() -> set[str]:
    """The files in /dev/shm now (what ``shm_left_bytes`` compares against)."""
    return {str(p) for p in Path("/dev/shm").iterdir() if p.is_file()} if os.path.isdir("/dev/shm") else set()


def shm_left(before: set[str]) -> set[str]:
    """The /dev/shm files created since ``before`` that no live process maps or holds open: what a finished run
    left behind. A run going on beside this one (the other xdist worker) uses its files, so they do not count."""
    from rollout.shm import _in_use

    new = shm_files() - before
    return new - _in_use(new)


def shm_left_bytes(before: set[str]) -> int:
    """Bytes of :func:`shm_left`."""
    return sum(os.path.getsize(p) for p in shm_left(before) if os.path.exists(p))


# Where slow tests note the /dev/shm files they left (``_note_shm_left``): one file per session, made by the
# controller (or the only process) before xdist starts its workers, which inherit its name; the session's summary
# names those still there at its end. Two sessions on one machine keep their notes apart.
SHM_NOTES_ENV = "JOINTRL_TEST_SHM_NOTES"


def pytest_configure(config):
    if not hasattr(config, "workerinput"):
        fd, path = tempfile.mkstemp(prefix="jointrl-test-shm-left-", suffix=".tsv")
        os.close(fd)
        os.environ[SHM_NOTES_ENV] = path


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput") and (path := os.environ.pop(SHM_NOTES_ENV, None)):
        Path(path).unlink(missing_ok=True)


@pytest.fixture(autouse=True)
def _note_shm_left(request):
    """After each slow test (they start engines and kill processes), note the /dev/shm files created while it ran
    that no live process maps or holds open, for the session summary (``pytest_terminal_summary``), which names the
    ones still there at the end: a leak shows which test was running when it was made. Under xdist a file left by
    the test beside it is noted too, so the summary names both. It reports and fails nothing: the tests that kill
    processes assert their own cleanup."""
    if request.node.get_closest_marker("slow") is None or not os.path.isdir("/dev/shm"):
        yield
        return
    before = shm_files()
    yield
    try:
        lines = [
            f"{request.node.nodeid}\t{f}\t{os.path.getsize(f)}\n" for f in sorted(shm_left(before)) if os.path.exists(f)
        ]
        if lines and (notes := os.environ.get(SHM_NOTES_ENV)):
            with open(notes, "a") as out:
                out.writelines(lines)
    except OSError:
        pass


def pytest_terminal_summary(terminalreporter, config):
    notes = Path(os.environ.get(SHM_NOTES_ENV, ""))
    if hasattr(config, "workerinput") or not notes.is_file():
        return
    rows = [row.split("\t") for row in notes.read_text(errors="replace").splitlines()]
    left = [
        (test, f, size) for test, f, size in (r for r in rows if len(r) == 3) if size.isdigit() and os.path.exists(f)
    ]
    if left:
        terminalreporter.section("/dev/shm files left, by the slow test that was running when they were made")
        for test, f, size in left:
            terminalreporter.write_line(f"{f} ({int(size) >> 20} MiB): {test}")


@pytest.fixture(scope="session")
def tiny_model_path() -> str:
    """Local HF folder of ``embedded:tiny`` (a ~1M-param Qwen2 with a ChatML tokenizer)."""
    from rl.trainer.hub import resolve_model

    return resolve_model("embedded:tiny")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def recipe_copier(tmp_path: Path):
    """A function that writes a copy of a shipped recipe into ``tmp_path``: every key of the resolved
    recipe (shipped recipes list only what they change), task-file paths made absolute,
    ``run.output_dir`` set to ``tmp_path / out``, then ``edit(d)`` applied to that dict; returns the
    file's path (``tmp_path / filename``, default the recipe's own name)."""

    def make(name: str = "tiny.yaml", *, out: str = "out", filename: str | None = None, edit=None) -> Path:
        from rl.config.recipe import load_recipe, recipe_to_dict

        d = {k: v for k, v in recipe_to_dict(load_recipe(RECIPES / name)).items() if k != "source"}
        for key in ("train_files", "eval_files"):
            d["data"][key] = [str(RECIPES / f) for f in d["data"][key]]
        d["run"]["output_dir"] = str(tmp_path / out)
        if edit is not None:
            edit(d)
        path = tmp_path / (filename or name)
        path.write_text(yaml.safe_dump(d, sort_keys=False))
        return path

    return make


def train_until_step_1(recipe: Path, out: Path, env: dict | None = None) -> subprocess.Popen:
    """``jointrl train recipe`` in its own session (environment ``env``, default this one with W&B
    disabled), returned once step 1 is logged."""
    exe = Path(sys.executable).with_name("jointrl")
    proc = subprocess.Popen(
        [str(exe), "train", str(recipe)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env if env is not None else {**os.environ, "WANDB_MODE": "disabled"},
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while not (out / "metrics.jsonl").is_file() or len((out / "metrics.jsonl").read_text().splitlines()) < 2:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"no step 1 logged: {proc.stderr.read().decode()[-3000:]}")
        time.sleep(0.2)
    return proc


@pytest.fixture
def recipe_copy(tmp_path):
    """``recipe_copier`` for this test's ``tmp_path``."""
    return recipe_copier(tmp_path)


# Tests that spawn 2 learner ranks in one process tree: each rank's learner takes the GPU when there is one,
# and NCCL refuses two ranks on one device ("Duplicate GPU detected", seen on an H200); they run over gloo on CPU.
def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


gloo_ranks = pytest.mark.skipif(
    _cuda(), reason="2 learner ranks on this process tree's one device: NCCL needs a GPU per rank (CPU/gloo test)"
)

# Fixtures that start a Ray cluster: a test that uses one is in the slow tier whatever its own
# marks say (starting Ray costs 5-10 s before the test does anything; the fast tier is the
# developer's loop and has a 3-minute budget). The full suite runs them.
RAY_FIXTURES = frozenset({"ray_session", "ray2"})


def pytest_collection_modifyitems(config, items):
    for item in items:
        if RAY_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    # Files with slow tests first, in their order, then the rest: with the README's `-n 2 --dist loadscope`
    # (a file's tests on one worker, so its shared runs start once) the end-to-end files start early and
    # the many short tests fill both workers at the end, instead of one long run ending the suite alone.
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)
