"""The Hugging Face Hub cache as ``huggingface_hub`` reads it, for models (``rl.trainer.hub``) and datasets
(``rl.data.hub_data``) alike: where it is, whether the Hub is off limits, the token, and a snapshot from it.

The standard variables are read when each function runs (not when ``huggingface_hub`` was imported), so a
test or a command that sets them afterwards is obeyed: ``HF_HUB_CACHE``, else ``HF_HOME/hub``;
``HF_HUB_OFFLINE``; ``HF_TOKEN``.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["hub_cache", "hub_offline", "hub_token", "snapshot"]


def hub_cache() -> Path:
    """The Hub cache: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    return Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface") / "hub"


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` forbids requests (``1``, ``true``, ``yes``, ``on``)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_token() -> str | None:
    """``$HF_TOKEN`` (gated and private repos), or None."""
    return os.environ.get("HF_TOKEN") or None


def snapshot(
    repo_id: str,
    *,
    repo_type: str = "model",
    revision: str = "",
    local_only: bool,
    allow_patterns: list[str] | None = None,
) -> str:
    """The local folder of ``repo_id`` at ``revision`` (default ``main``) in :func:`hub_cache`: from the cache only
    (``local_only``: no request), else downloaded into it. ``huggingface_hub``'s errors propagate (the caller
    names its recipe key)."""
    from huggingface_hub import snapshot_download

    return str(
        snapshot_download(
            repo_id,
            repo_type=repo_type,
            revision=revision or "main",
            cache_dir=hub_cache(),
            local_files_only=local_only,
            token=hub_token(),
            allow_patterns=allow_patterns,
        )
    )
