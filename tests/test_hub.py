"""Hub models through huggingface_hub, offline, from a Hub cache this test builds (no network).

The cache has the layout huggingface_hub reads: ``models--org--name/{blobs/<sha256>,
snapshots/<commit>/<file> -> ../../blobs/<sha256>, refs/main}``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rl.trainer.hub import hub_snapshot, is_hub_id, resolve_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def build_hub_cache(home: Path, repo_id: str, src: Path, commit: str = COMMIT) -> Path:
    """Put the files of model folder ``src`` into ``home/hub`` as the Hub cache holds repo ``repo_id`` at
    ``commit`` (also ``refs/main``); return the snapshot folder."""
    repo = home / "hub" / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.iterdir()):
        if not f.is_file():
            continue
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snap


@pytest.fixture
def offline_hub(tmp_path, monkeypatch, tiny_model_path):
    home = tmp_path / "hf"
    snap = build_hub_cache(home, "jointrl-test/tiny", Path(tiny_model_path))
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home, snap


def test_hub_id_resolves_offline_from_the_cache(offline_hub, tiny_model_path):
    from transformers import AutoConfig, AutoTokenizer

    _, snap = offline_hub
    got = resolve_model("jointrl-test/tiny")
    assert Path(got) == snap
    assert resolve_model("jointrl-test/tiny", revision="main") == got
    assert resolve_model("jointrl-test/tiny", revision=COMMIT) == got  # a commit hash
    assert AutoConfig.from_pretrained(got).model_type == "qwen2"
    assert len(AutoTokenizer.from_pretrained(got)) == len(AutoTokenizer.from_pretrained(tiny_model_path))


def test_not_cached_while_offline_is_a_clear_error(offline_hub):
    with pytest.raises(
        FileNotFoundError,
        match=r"model\.path: Hub model 'jointrl-test/other' .*not in the Hub "
        r"cache .*HF_HUB_OFFLINE is set",
    ):
        resolve_model("jointrl-test/other")
    with pytest.raises(FileNotFoundError, match=r"model\.revision 'v2'"):
        hub_snapshot("jointrl-test/tiny", "v2")


def test_local_folders_win_over_hub_ids(tmp_path, monkeypatch, tiny_model_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org").mkdir()
    os.symlink(tiny_model_path, tmp_path / "org" / "tiny")
    assert resolve_model("org/tiny") == "org/tiny"  # an existing local folder, not the Hub
    assert is_hub_id("Qwen/Qwen2.5-7B-Instruct") and not is_hub_id("./a/b") and not is_hub_id("a/b/c")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        resolve_model("/nonexistent/folder")


def test_cli_exits_2_before_actors_for_an_uncached_hub_id(tmp_path, recipe_copy):
    recipe = recipe_copy("tiny.yaml")
    env = {**os.environ, "HF_HOME": str(tmp_path / "empty-hf"), "HF_HUB_OFFLINE": "1", "RAY_ADDRESS": ""}
    exe = Path(sys.executable).with_name("jointrl")
    r = subprocess.run(
        [str(exe), "train", str(recipe), "model.path=jointrl-test/missing"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert "model.path: Hub model 'jointrl-test/missing'" in r.stderr and "not in the Hub cache" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out" / "placement.json").exists()
